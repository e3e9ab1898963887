"""The GPU check's telemetry plumbing check: do the readers the suite measures with read what they should?

``python -m bench.systems.gpu_check_telemetry [--device cuda|cpu]`` (default: cuda when torch sees one, else cpu) runs
:class:`bench.telemetry.Telemetry` around known allocations and prints one line per check:

- ``cuda-allocated`` per-phase peak: phase ``generation`` allocates :data:`KNOWN_MIB` MiB and frees it, phase
  ``update`` then allocates a quarter of that. Each phase's peak over the allocator's reading before it must equal
  its own allocation (within :data:`TOLERANCE_MIB`): the first checks the reading, the second that the peak is reset
  at every phase boundary (else ``update`` would show the first phase's peak).
- ``nvml-process``: present (with its reading), or absent with the reason (pynvml missing, nvmlInit failed, or NVML
  lists no process of this tree, as inside a container whose PIDs it does not see).

Without CUDA both say ``no CUDA: skipped``: PyTorch's CUDA counters read 0 on a CPU machine and that is not a
measurement, so no number is printed for them. Exit status 0 when every check that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from bench.telemetry.memory import CUDA_ALLOCATED, NVML_PROCESS, SampledReaders

KNOWN_MIB = 256
"""The known allocation of the first phase (MiB)."""
TOLERANCE_MIB = 4
"""Allowed difference between a phase's peak rise and its known allocation (the allocator rounds blocks up)."""
MIB = 2**20
SKIPPED = "no CUDA: skipped"


def check_cuda_allocated(device: str) -> tuple[bool, str]:
    """(passed, line) for the per-phase cuda-allocated peaks against known allocations."""
    import torch

    from bench.telemetry import Telemetry

    telemetry = Telemetry(device, interval_s=0.01)
    expected = {"generation": KNOWN_MIB, "update": KNOWN_MIB // 4}
    rises: dict[str, float] = {}
    with telemetry:
        for phase, mib in expected.items():
            before = torch.cuda.memory_allocated(device)
            with telemetry.phase(phase):
                block = torch.ones(mib * MIB, dtype=torch.uint8, device=device)
                del block
            peak = telemetry.summary()["memory"]["phases"][phase]["by_source"].get(CUDA_ALLOCATED)
            rises[phase] = float("nan") if peak is None else (peak - before) / MIB
    ok = all(abs(rises[p] - mib) <= TOLERANCE_MIB for p, mib in expected.items())
    shown = "; ".join(f"{p}: +{rises[p]:.1f} MiB for a known {mib} MiB" for p, mib in expected.items())
    return ok, f"cuda-allocated per-phase peak: {shown} -> {'ok' if ok else 'WRONG'}"


def check_nvml_process(device: str) -> tuple[bool, str]:
    """(True, line): nvml-process present with its reading, or absent with the reason (absence is not a failure:
    the table then shows dashes and says why)."""
    import torch

    torch.zeros(1, device=device)  # make sure this process has a CUDA context NVML can list
    readers = SampledReaders(device)
    try:
        if readers.nvml_error is not None:
            return True, f"nvml-process: absent ({readers.nvml_error})"
        reading = readers.read().get(NVML_PROCESS)
        if reading is None:
            return True, ("nvml-process: absent (NVML lists no process of this process tree: a container's PID "
                          "namespace, or a driver that hides per-process memory)")
        return True, f"nvml-process: present, {reading / MIB:.0f} MiB for this process tree"
    finally:
        readers.close()


def cuda_device(requested: str | None) -> str | None:
    """'cuda' when asked for (or, unasked, when torch sees a GPU); None for a CPU check."""
    if requested == "cpu":
        return None
    try:
        import torch

        available = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch build with CUDA: a CPU check
        available = False
    return "cuda" if available else None


def run_checks(device: str | None) -> tuple[bool, list[str]]:
    """(every check passed, one line per check)."""
    if device is None:
        return True, [f"cuda-allocated per-phase peak: {SKIPPED}", f"nvml-process: {SKIPPED}"]
    results = [check_cuda_allocated(device), check_nvml_process(device)]
    return all(ok for ok, _ in results), [line for _, line in results]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.systems.gpu_check_telemetry", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    args = parser.parse_args(argv)
    ok, lines = run_checks(cuda_device(args.device))
    print("\n".join(f"telemetry check: {line}" for line in lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
