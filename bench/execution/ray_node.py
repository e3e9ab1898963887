"""What one Ray task does on the node Ray picked for a run: lay out the run folder and the stage outputs it reads in
a node-local scratch folder (the suite folder's relative layout), start the same worker process as the local
scheduler (:func:`bench.execution.processes.launch_worker`, or accelerate's launcher), relay its progress to the
driver while it runs, and send the finished run folder back.

The task (:func:`run_task`) sends the driver, through a :class:`Relay` actor, ``("start", placement)``, then
``("phase", name)`` and ``("progress", step, total, metrics)`` as the worker reports them, and ``("ended",)`` last;
it returns ``(placement, status, launched, node_root, sent)``, ``sent`` the run folder as the transfer sends it
(tar bytes, or a tar file's path on the storage: :mod:`bench.execution.ray_channel`). A cancel from the driver
(Ctrl-C, SIGTERM) arrives as KeyboardInterrupt: the worker's process groups get SIGTERM, then SIGKILL after
:data:`bench.execution.processes.KILL_AFTER_S`, as under the local scheduler, and the scratch folder is removed.
"""

from __future__ import annotations

import io
import json
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

from bench.execution.processes import KILL_AFTER_S, Stopper, launch_worker, worker_env
from bench.execution.ray_channel import ObjectStoreTransfer, Transfer
from bench.execution.ray_transfer import unpack
from bench.execution.worker import RUN_FILE

SCRATCH_ENV = "BENCH_RAY_SCRATCH"
"""On a node: the folder under which each run's scratch folder is made (default: the system's temporary folder).
Point it at a local disk with room for a run's stage inputs and outputs (model weights)."""
RAY_WORKER_ENV = ("OMP_NUM_THREADS", "PYTHONBREAKPOINT", "SPT_NOENV")
"""Variables Ray sets in a task's process that a worker started by the local scheduler does not have (besides
RAY_*); an OMP_NUM_THREADS set on the driver is forwarded (bench.execution.ray_scheduler.FORWARDED_ENV)."""
SCRATCH_PREFIX = "bench-ray-"
"""How a run's scratch folder on a node is named (``tempfile.mkdtemp``'s prefix)."""
OWNER_FILE = ".bench-owner.json"
"""In a scratch folder: the task process that made it (pid and start time), so a later task can tell it is gone."""
POLL_S = 0.5
"""Seconds between the task's looks at its worker: how soon a cancel is noticed."""


class Relay:
    """The actor that carries every running task's progress to the driver (one per suite, holding no CPU): tasks
    put messages in, the driver drains them a few times a second."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, tuple]] = []

    def put(self, run_id: str, message: tuple) -> None:
        self.messages.append((run_id, message))

    def drain(self) -> list[tuple[str, tuple]]:
        messages, self.messages = self.messages, []
        return messages


def run_task(spec: Any, job: dict[str, Any], inputs: list[tuple[str, str, Any]], cpus: float,
             forwarded: dict[str, str], suite_name: str, relay: Any, machine: Any = None,
             transfer: Transfer | None = None) -> tuple:
    """A run's Ray task: :func:`run_on_node`, its messages sent to ``relay`` (best effort: a lost relay costs the
    progress lines, never the run); returns ``(placement, status, launched, node_root, sent)``.
    ``machine``: this task's part of a run across machines (:class:`bench.execution.launch.MachineRole`); machine
    k > 0 relays under ``<run id>@machine<k>`` (:func:`relay_key`). ``transfer``: how data travels."""
    placed = None
    key = relay_key(job["run_id"], machine)
    try:
        for message in run_on_node(spec, job, inputs, cpus, forwarded, suite_name, machine, transfer):
            if message[0] == "done":
                return (placed, *message[1:])
            if message[0] == "start":
                placed = message[1]
            _tell(relay, key, message)
    finally:
        _tell(relay, key, ("ended",))
    raise RuntimeError("the run's task ended without its run folder")  # run_on_node always ends with "done"


def relay_key(run_id: str, machine: Any = None) -> str:
    """The name a task's messages travel under: the run id, or ``<run id>@machine<k>`` for machine k > 0 of a run
    across machines (machine 0 holds rank 0, whose progress is the run's)."""
    return run_id if machine is None or machine.rank == 0 else f"{run_id}@machine{machine.rank}"


def _tell(relay: Any, run_id: str, message: tuple) -> None:
    import ray

    try:
        ray.get(relay.put.remote(run_id, message), timeout=30)
    except Exception:  # noqa: BLE001 - the relay's node is gone: the run goes on without its progress lines
        pass


class NodeProgress:
    """Stands in for :class:`bench.execution.processes.Progress` on the node: what the worker reports goes into a
    queue that the task drains to the driver."""

    def __init__(self, messages: queue.Queue) -> None:
        self.messages = messages
        self._phase: str | None = None

    @property
    def last_phase(self) -> str | None:
        return self._phase

    @last_phase.setter
    def last_phase(self, phase: str | None) -> None:
        self._phase = phase
        self.messages.put(("phase", phase))

    def update(self, step: int, total: int, metrics: dict[str, float]) -> None:
        self.messages.put(("progress", step, total, metrics))


def node_placement(device: str, cpus: float, parallel_runs: int | None) -> dict[str, Any]:
    """result["placement"] under Ray: the node (Ray's node id, its IP, the host name), the GPUs Ray gave the task
    (CUDA_VISIBLE_DEVICES entries), the CPUs it holds, and the keys of the local placement."""
    import ray

    gpus = [str(g) for g in ray.get_gpu_ids()]
    return {"scheduler": "ray", "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(), "device": device,
            "gpus": gpus, "cpus": cpus, "slot": None, "parallel_runs": parallel_runs,
            "gpu_source": "ray" if gpus else None}


def share_of_node(threads: int, cpus: float, planned: int | None) -> int | None:
    """The ``parallel_runs`` a worker here computes its torch threads from (:mod:`bench.execution.cpu_threads`):
    with ``threads`` set, the plan's (so a run uses the same threads as under the local scheduler); with threads 0,
    this node's cores divided by the CPUs the task holds, so a method run takes about its share of the node and
    runs that Ray packs onto one node do not oversubscribe it."""
    if threads > 0:
        return planned
    from bench.execution.cpu_threads import available_cores

    return max(1, available_cores() // max(1, int(cpus)))


def node_env(forwarded: dict[str, str]) -> dict[str, str]:
    """The node's environment as a worker started outside Ray would see it, plus what the driver forwards: without
    what Ray sets in its own worker processes (RAY_*, its debugger hook, its per-task OMP_NUM_THREADS)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in RAY_WORKER_ENV}
    env.update(forwarded)
    return env


def lay_out(root: Path, job: dict[str, Any], inputs: list[tuple[str, str, bytes | Path]]) -> Path:
    """The run folder under ``root`` (``runs/<run id>/run.json``) with each stage output it reads unpacked at its
    path relative to the suite folder, and run.json's inputs pointed at them; returns the run folder."""
    paths = dict(job.get("inputs") or {})
    for key, relative, data in inputs:
        unpack(data, root)
        paths[key] = str(root / relative)
    job = dict(job, inputs=paths)
    run_dir = root / "runs" / job["run_id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_FILE).write_text(json.dumps(job, indent=1), encoding="utf-8")
    return run_dir


def run_on_node(spec: Any, job: dict[str, Any], inputs: list[tuple[str, str, Any]], cpus: float,
                forwarded: dict[str, str], suite_name: str, machine: Any = None,
                transfer: Transfer | None = None) -> Iterator[tuple]:
    """The body of a run's Ray task (see the module's docstring). ``inputs``: (run.json input key, path relative to
    the suite folder, what ``transfer`` fetches its tar from); ``forwarded``: environment variables the driver
    passes on (the hub's offline switches); ``suite_name``: the suite folder's name, which the scratch copy keeps
    (trackers name a run ``<suite folder>/<run id>``); ``transfer``: how data travels (default the object store)."""
    transfer = transfer or ObjectStoreTransfer()
    placed = node_placement(spec.device, cpus, share_of_node(spec.threads, cpus, job.get("parallel_runs")))
    yield ("start", placed)
    parent = Path(os.environ.get(SCRATCH_ENV) or tempfile.gettempdir())
    sweep_stale_scratch(parent)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    claim_scratch(scratch)
    root = scratch / suite_name
    try:
        fetched = [(key, relative, transfer.fetch_input(ref)) for key, relative, ref in inputs]
        run_dir = lay_out(root, dict(job, parallel_runs=placed["parallel_runs"], placement=placed), fetched)
        del fetched
        env = worker_env(spec, node_env(forwarded), tuple(placed["gpus"]) or None)
        outcome: dict[str, Any] = {}
        yield from _run_worker(spec, job, run_dir, env, tuple(placed["gpus"]), outcome, machine)
        sent = transfer.send_back(run_dir, relay_key(job["run_id"], machine))  # one tar per machine
        yield ("done", outcome["status"], outcome["launched"], str(root), sent)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def claim_scratch(scratch: Path) -> None:
    """Mark ``scratch`` with this process (its pid and start time: a pid alone may be reused after it ends)."""
    import psutil

    me = psutil.Process()
    (scratch / OWNER_FILE).write_text(json.dumps({"pid": me.pid, "started": me.create_time()}), encoding="utf-8")


def sweep_stale_scratch(parent: Path) -> list[Path]:
    """Remove the scratch folders under ``parent`` whose task process is gone: a task stopped with no chance to clean
    up (a second Ctrl-C on the driver shuts Ray down under it; a node whose raylet died and came back) leaves its
    folder, with a run's inputs and model weights, behind. A folder without a readable owner record is left alone:
    it may be one being made right now. Returns what was removed."""
    removed = []
    for folder in parent.glob(f"{SCRATCH_PREFIX}*"):
        try:
            owner = json.loads((folder / OWNER_FILE).read_text(encoding="utf-8"))
            pid, started = int(owner["pid"]), float(owner["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _running(pid, started):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _running(pid: int, started: float) -> bool:
    """Whether process ``pid`` is the one that started at ``started`` and has not ended."""
    import psutil

    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: there, and not ours to judge
        return True


def _run_worker(spec: Any, job: dict[str, Any], run_dir: Path, env: dict[str, str], gpus: tuple[str, ...],
                outcome: dict[str, Any], machine: Any = None) -> Iterator[tuple]:
    """Start the worker as the local scheduler would and yield its progress until it exits; ``outcome`` gets its
    exit status and whether accelerate launched it. The worker runs in a thread so that this generator wakes every
    POLL_S and a cancel (KeyboardInterrupt) lands here, where the worker is stopped before the task ends. On one
    machine the ranks' records are merged here; across machines the driver merges every machine's."""
    from bench.execution.launch import merge_rank_files, worker_launch

    command, env = worker_launch(spec, job["kind"], job["name"], run_dir, env, gpus=gpus or None, machine=machine)
    messages: queue.Queue = queue.Queue()
    stopper = Stopper(io.StringIO())  # never installed: the task stops the worker through it when cancelled
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["status"] = launch_worker(run_dir, NodeProgress(messages), env, stopper, command=command)
        except BaseException as exc:  # noqa: BLE001 - handed to the task, which raises it to the driver
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"worker-{job['run_id']}", daemon=True)
    thread.start()
    try:
        while thread.is_alive() or not messages.empty():
            yield from _drain(messages)
            thread.join(POLL_S)
    except BaseException:  # cancelled: the worker must not outlive its task
        stopper.handle(signal.SIGTERM, None)  # SIGTERM its groups now, SIGKILL after KILL_AFTER_S
        thread.join(KILL_AFTER_S + 5)
        raise
    if "error" in box:
        raise box["error"]
    if command is not None and machine is None:  # each rank wrote rank<k>.json, rank 0 the result: merged into one
        merge_rank_files(run_dir)
    outcome.update(status=box.get("status"), launched=command is not None)


def _drain(messages: queue.Queue) -> Iterator[tuple]:
    """The queued messages, each phase change in order and only the newest progress line (the driver shows one)."""
    latest = None
    while True:
        try:
            message = messages.get_nowait()
        except queue.Empty:
            break
        if message[0] == "progress":
            latest = message
        else:
            if latest is not None:
                yield latest
                latest = None
            yield message
    if latest is not None:
        yield latest


__all__ = ["run_task", "relay_key", "Relay", "run_on_node", "node_placement", "share_of_node", "lay_out", "node_env", "SCRATCH_ENV", "sweep_stale_scratch", "claim_scratch", "NodeProgress"]
