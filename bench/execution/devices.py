"""Which GPUs a suite run may use, how they are split between concurrent runs, and who holds which.

The runner (:mod:`bench.execution.runner`) asks :func:`plan_devices` once, before the first run: the GPUs it may use
(:func:`visible_gpus`: ``spec.gpus``, else the inherited ``CUDA_VISIBLE_DEVICES``, else every GPU NVML counts), the
*slots* they make (one GPU each, or groups of ``launcher.num_processes`` consecutive GPUs for launched runs) and how
many method runs go at once (``parallel_runs``: ``auto`` is one per slot on a GPU box, 1 on a CPU). Each running
worker holds one slot (:class:`DevicePool`) and sees only its GPUs (``CUDA_VISIBLE_DEVICES``,
:func:`bench.execution.processes.worker_env`), so no two runs share a device and each run's memory readings are its
own; a run that ends, however it ends, gives its slot back.

Nothing here imports torch: the runner and ``bench run --dry-run`` use it. NVML (nvidia-ml-py) counts the GPUs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from bench.errors import UserError

Slot = tuple[str, ...]
"""The GPUs one run holds, as ``CUDA_VISIBLE_DEVICES`` entries (indices, or UUIDs when inherited that way); ``()``
on a CPU."""


def nvml_gpu_count() -> int:
    """How many GPUs NVML sees (0 without nvidia-ml-py, a driver or a GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends: no GPU here
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return 0
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def visible_gpus(spec: Any, env: Mapping[str, str], count: Callable[[], int] | None = None
                 ) -> tuple[list[str], str]:
    """(GPUs, where the list came from) for a spec whose device is not cpu.

    ``spec.gpus`` when given (nvidia-smi's indices); else the entries of an inherited ``CUDA_VISIBLE_DEVICES``
    (an empty value hides every GPU on purpose: none); else every GPU NVML counts,
    numbered as nvidia-smi numbers them (``count`` stands in for NVML in tests; default :func:`nvml_gpu_count`, looked
    up when called). No GPU found: an empty list.
    """
    if spec.gpus:
        return [str(g) for g in spec.gpus], "gpus"
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()], "CUDA_VISIBLE_DEVICES"
    return [str(i) for i in range((count or nvml_gpu_count)())], "nvml"


def group_size(spec: Any) -> int:
    """GPUs per method run: ``launcher.num_processes`` under a launcher (one per rank), else 1."""
    from bench.config.launcher import active

    return spec.launcher.num_processes if active(spec) else 1


def make_slots(devices: list[str], group: int) -> list[Slot]:
    """Consecutive groups of ``group`` devices; fewer devices than one group: one slot holding all of them."""
    if len(devices) < group:
        return [tuple(devices)]
    return [tuple(devices[i:i + group]) for i in range(0, len(devices) - group + 1, group)]


@dataclass
class DevicePlan:
    """How a suite run uses the machine: recorded in suite.json (``schedule``) and in each run's ``placement``."""

    device: str
    """cuda (the runs get GPUs) or cpu."""
    parallel_runs: int
    """Method runs at once (``spec.parallel_runs`` with ``auto`` resolved)."""
    slots: list[Slot] = field(default_factory=list)
    """What each concurrent run holds; ``[()] * parallel_runs`` on a CPU."""
    source: str = ""
    """Where the GPU list came from: gpus (spec.gpus), CUDA_VISIBLE_DEVICES, nvml; "" on a CPU."""
    requested: Any = 1
    """``spec.parallel_runs`` as written (an integer or auto)."""

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "parallel_runs": self.parallel_runs, "requested": self.requested,
                "slots": [list(s) for s in self.slots], "source": self.source}


def plan_devices(spec: Any, env: Mapping[str, str], count: Callable[[], int] | None = None) -> DevicePlan:
    """The :class:`DevicePlan` of ``spec`` on this machine; UserError (one line) when ``parallel_runs`` asks for
    more concurrent runs than there are GPUs (or GPU groups) for.

    device cpu, or device auto without a visible GPU: the runs share the CPU, ``auto`` means 1. Otherwise each
    concurrent run gets a slot of its own: ``auto`` is the number of slots; an explicit N must not exceed it.
    device cuda with no GPU found runs one at a time with an empty slot (the worker is pinned as before: GPU 0, or an
    inherited CUDA_VISIBLE_DEVICES' first entry, kept empty when it hides every GPU) and leaves the error to the
    worker's preflight.
    """
    requested = spec.parallel_runs
    devices, source = ([], "") if spec.device == "cpu" else visible_gpus(spec, env, count)
    if not devices and spec.device == "cuda":  # none seen: one run at a time, pinned as before (worker_env)
        if requested not in (1, "auto"):
            raise UserError(f"'parallel_runs' is {requested} but no GPU is visible here (CUDA_VISIBLE_DEVICES, "
                            f"NVML); set parallel_runs=auto or 1, or run on a machine with GPUs")
        return DevicePlan("cuda", 1, [()], "none visible", requested)
    if not devices:
        n = 1 if requested == "auto" else int(requested)
        return DevicePlan("cpu", n, [()] * n, "", requested)
    group = group_size(spec)
    slots = make_slots(devices, group)
    if requested == "auto":
        n = len(slots)
    else:
        n = int(requested)
        if n > len(slots):
            per = f"{group} GPUs (launcher.num_processes)" if group > 1 else "a GPU"
            raise UserError(f"'parallel_runs' is {n} but only {len(slots)} run(s) fit at once: each needs {per} of "
                            f"its own and {len(devices)} are visible ({', '.join(devices)}; from {source}); set "
                            f"parallel_runs=auto (one run per free GPU) or {len(slots)}")
    return DevicePlan("cuda", n, slots[:n], source, requested)


class DevicePool:
    """The slots of a :class:`DevicePlan`, handed out one per running worker.

    :meth:`hold` blocks until a slot is free and gives it back when the block ends, whether the run succeeded,
    failed or raised; so no two runs hold a device at once, and a failed run frees its device for the next one.
    """

    def __init__(self, slots: list[Slot]) -> None:
        self._free = list(range(len(slots)))
        self._slots = list(slots)
        self._cond = threading.Condition()

    def acquire(self) -> tuple[int, Slot]:
        with self._cond:
            while not self._free:
                self._cond.wait()
            index = self._free.pop(0)
            return index, self._slots[index]

    def release(self, index: int) -> None:
        with self._cond:
            if index in self._free:
                raise RuntimeError(f"slot {index} released twice")  # a runner bug, not a user error
            self._free.append(index)
            self._free.sort()
            self._cond.notify()

    def hold(self) -> "_Held":
        return _Held(self)

    @property
    def free(self) -> list[int]:
        with self._cond:
            return list(self._free)


class _Held:
    """``with pool.hold() as (index, slot):`` one slot for the block."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool
        self.index = -1

    def __enter__(self) -> tuple[int, Slot]:
        self.index, slot = self.pool.acquire()
        return self.index, slot

    def __exit__(self, *exc: Any) -> None:
        self.pool.release(self.index)


def placement(plan: DevicePlan, index: int, slot: Slot) -> dict[str, Any]:
    """result["placement"]: where a run ran (its GPUs as CUDA_VISIBLE_DEVICES entries, its slot, how many ran at
    once)."""
    return {"device": plan.device, "gpus": list(slot), "slot": index, "parallel_runs": plan.parallel_runs,
            "gpu_source": plan.source or None}


__all__ = ["DevicePlan", "DevicePool", "plan_devices", "visible_gpus", "make_slots", "placement", "nvml_gpu_count"]
