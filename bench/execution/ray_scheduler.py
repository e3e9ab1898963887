"""The Ray scheduler (``scheduler.name: ray``): the runner's plan, stage order and --resume, with each run's worker
started by a Ray task on the node Ray picks (:mod:`bench.execution.ray_node`) instead of on this machine.

This module is the driver's side. It starts a Ray instance here (``scheduler.address: null``; shut down at the end,
however the suite ends) or joins a cluster (``auto``, ``ray://HOST:PORT``); asks Ray, for each run, for its threads'
CPUs and, on a GPU, its processes' GPUs (:func:`run_request`); sends each task the stage outputs its run reads as
tars, through the object store or a folder every node mounts (``scheduler.storage``; each stage output sent once and
shared by every run that reads it: :mod:`bench.execution.ray_channel`); shows the
progress the task relays through the runner's own progress lines; and unpacks the run folder the task sends back
into ``SUITE_DIR/runs/<run_id>``, atomically (:mod:`bench.execution.ray_transfer`). A task that Ray loses (its node
died, its worker process crashed) is a failed cell naming the node, which ``--resume`` re-runs; with
``scheduler.max_retries`` N > 0 Ray starts it again up to N times first (never after the run itself failed:
``retry_exceptions=False``), and a run that took more than one attempt says so in its placement. A stop request
cancels every pending and running task (the task stops its worker as the local scheduler would) before Ray is shut
down. A run across machines (``launcher.num_machines`` > 1) is started by :mod:`bench.execution.ray_machines`: its
nodes reserved together, one task per machine.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TextIO

from bench.config.launcher import machines_for, processes_for
from bench.errors import UserError
from bench.execution.plan import PlannedRun
from bench.execution.processes import Progress, Started, Stopper, wait_or_cancel
from bench.execution.ray_channel import make_transfer
from bench.execution.ray_session import RaySession, first_sentence, lost_run
from bench.execution.worker import RUN_FILE
from bench.results import RESULT_FILE, write_json_atomic
from bench.telemetry.trackers import SETTINGS_ENV

RAY_FIX = "./run_all.sh --with-ray sets .venv up with it (or pip install -e '.[ray]')"
"""How a user installs Ray for the suite: the optional extra."""
PROBE_TIMEOUT_S = 5.0
"""Seconds a TCP connection to scheduler.address may take before it counts as answering nothing."""
CONNECT_TIMEOUT_S = 45.0
"""Seconds the check that Ray can join scheduler.address may take (a child process: ray.init, then the cluster's
resources), so a `bench run` against a dead address ends within a minute."""
FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
                 *SETTINGS_ENV)
"""Variables of the driver's environment every worker gets on its node, when set here: the hub's offline switches
(a suite told to stay offline stays offline on every node), an explicit OpenMP thread count, and where the trackers
log (bench.telemetry.trackers.SETTINGS_ENV; not their credentials)."""
MAX_WAITING_THREADS = 256
"""Most method runs submitted to Ray at once (one driver thread each waits for its task); the rest queue here."""
# -- before any work: is Ray here, does the address answer -------------------------------------------------
def ray_problem(address: str | None) -> str | None:
    """None when the suite can run under Ray with ``address``, else the one line saying why not and the fix:
    Ray not importable here, an address whose port answers nothing (TCP, PROBE_TIMEOUT_S), or a cluster Ray
    cannot join (a child process, CONNECT_TIMEOUT_S)."""
    try:
        importlib.import_module("ray")
    except ImportError:
        return f"'scheduler.name' is 'ray' but Ray is not installed here; {RAY_FIX}, or set scheduler.name=local"
    except Exception as exc:  # noqa: BLE001 - a broken install: its last line is the reason
        return (f"'scheduler.name' is 'ray' but Ray does not import here ({type(exc).__name__}: "
                f"{first_sentence(exc)}); reinstall it: {RAY_FIX}")
    if address is None:
        return None
    where = f"'scheduler.address' {address!r}"
    fix = ("start Ray on this machine (ray start --head) or give the cluster's address, e.g. "
           "scheduler.address=ray://HEAD:10001" if address == "auto" else
           "start the cluster (ray start --head on its head node) or fix the address")
    host_port = address.removeprefix("ray://")
    if address != "auto":
        host, _, port = host_port.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            return f"{where} answers nothing ({type(exc).__name__}: {exc.strerror or exc}); {fix}"
    return _join_problem(address, where, fix)


def _join_problem(address: str, where: str, fix: str) -> str | None:
    """Whether ray.init can join ``address`` (in a child process, so this one stays unconnected until the runner
    connects)."""
    code = ("import json, logging, ray; ray.init(address=%r, logging_level=logging.ERROR); "
            "print(json.dumps(ray.cluster_resources()))" % address)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=CONNECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{where} did not let Ray join within {CONNECT_TIMEOUT_S:g} s; {fix}"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return f"{where}: Ray could not join it ({lines[-1][:300] if lines else f'exit status {proc.returncode}'}); {fix}"


# -- what a run asks of a node -------------------------------------------------------------------------------
def run_request(spec: Any, run: PlannedRun, device: str) -> tuple[float, float]:
    """(CPUs, GPUs) a run's task asks Ray for (each of its tasks, for a run across machines): its torch threads
    (``threads``, 1 when 0) and, on ``device`` cuda, one GPU per process on its machine (``launcher.num_processes``
    / ``launcher.num_machines`` for a launched method run, else 1); no GPU on a cpu device."""
    cpus = float(spec.threads if spec.threads > 0 else 1)
    if device != "cuda":
        return cpus, 0.0
    if run.kind == "stage":
        return cpus, 1.0
    return cpus, float(processes_for(spec, run.name) // machines_for(spec, run.name))


def run_machines(spec: Any, run: PlannedRun) -> int:
    """How many nodes a run's tasks take at once: launcher.num_machines for a launched method run, else 1."""
    return 1 if run.kind == "stage" else machines_for(spec, run.name)


# -- the suite under Ray ---------------------------------------------------------------------------------------
def run_all_on_ray(spec: Any, suite_dir: Path, runs: list[PlannedRun], resume: bool, repo_dir: Path | None,
                   stream: TextIO, stopper: Stopper, execute_run: Callable[..., None]) -> None:
    """The runner's ``_run_all`` under Ray: the stages one at a time, in order, then the method runs, each a Ray
    task as soon as Ray has room for it; after a stop request nothing new starts and every task is cancelled.
    Ray is started or joined first and closed last, whatever happens in between (a second signal, which exits at
    once, shuts a Ray started here down first). ``execute_run`` is the runner's (resume, skips, the record), given
    this scheduler's start."""
    session = RaySession(spec.scheduler.address, stream, make_transfer(spec.scheduler.storage, suite_dir.name),
                         spec.scheduler.max_retries)
    schedule = session.open()
    previous = stopper.on_exit_now

    def exit_now() -> None:
        session.close()
        previous()

    stopper.on_exit_now = exit_now
    try:
        session.transfer.open(schedule["nodes"])  # storage: every node shares it (the probe), before any work
        device = cluster_device(spec.device, schedule["nodes"])
        check_fits(spec, runs, device, schedule["nodes"], session.started_here, stream)
        record_schedule(suite_dir, dict(schedule, device=device))
        _run_in_order(spec, suite_dir, runs, (resume, repo_dir, execute_run), stream, stopper, session, device)
    finally:
        stopper.on_exit_now = previous
        session.close()


def cluster_device(device: str, nodes: list[dict[str, Any]]) -> str:
    """The device the runs ask Ray for: the spec's, with auto resolved to cuda when some node has a GPU."""
    if device != "auto":
        return device
    return "cuda" if any(node["gpus"] > 0 for node in nodes) else "cpu"


def check_fits(spec: Any, runs: list[PlannedRun], device: str, nodes: list[dict[str, Any]], started_here: bool,
               stream: TextIO) -> None:
    """Each run's request (:func:`run_request`) against the largest node: on a Ray started here, a run no node can
    take is one line (UserError) before any work, since Ray would queue it forever; on a joined cluster, whose
    autoscaler may still add such a node, it is a warning."""
    for run in runs:
        cpus, gpus = run_request(spec, run, device)
        machines = run_machines(spec, run)
        if sum(node["cpus"] >= cpus and node["gpus"] >= gpus for node in nodes) >= machines:
            continue
        largest = ", ".join(f"{n['node_ip']}: {n['cpus']:g} CPUs, {n['gpus']:g} GPUs" for n in nodes) or "none"
        if machines > 1:
            message = (f"run {run.run_id} spans {machines} machines and asks Ray for {machines} nodes with "
                       f"{cpus:g} CPUs and {gpus:g} GPUs each, which the cluster does not have ({largest}); lower "
                       f"launcher.num_machines, or add nodes that large")
        else:
            message = (f"run {run.run_id} asks Ray for {cpus:g} CPUs and {gpus:g} GPUs, which no node has "
                       f"({largest}); lower threads (or launcher.num_processes), or add a node that large")
        if started_here:
            raise UserError(message)
        stream.write(f"bench: warning: {message}; its task waits until the cluster has one\n")
        return


def record_schedule(suite_dir: Path, schedule: dict[str, Any]) -> None:
    """suite.json's ``schedule`` under Ray: the scheduler, the address, the device asked for and the nodes."""
    from bench.execution.suite_folder import SUITE_FILE

    path = suite_dir / SUITE_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    meta["schedule"] = schedule
    write_json_atomic(path, meta)


def _run_in_order(spec: Any, suite_dir: Path, runs: list[PlannedRun], runner: tuple[bool, Path | None, Callable],
                  stream: TextIO, stopper: Stopper, session: RaySession, device: str) -> None:
    """Stages one at a time, then every method run at once (Ray queues what does not fit); each waits in a driver
    thread, while this thread watches for a stop request and cancels the tasks when it comes. ``runner``: resume,
    repo_dir and the runner's execute_run."""
    resume, repo_dir, execute_run = runner
    lock = threading.Lock()
    numbered = list(enumerate(runs, 1))

    def execute(index: int, run: PlannedRun) -> None:
        if stopper.requested.is_set():  # queued when the interrupt came
            return
        progress = Progress(stream, lock, False, index, len(runs), run)

        def start(run: PlannedRun, run_dir: Path, progress: Progress) -> Started:
            return start_on_ray(spec, suite_dir, run, run_dir, progress, stopper, session, device)

        execute_run(spec, suite_dir, run, resume, repo_dir, os.environ, progress, stopper, start=start)

    methods = [(index, run) for index, run in numbered if run.kind != "stage"]
    with ThreadPoolExecutor(max_workers=max(1, min(len(methods), MAX_WAITING_THREADS))) as pool:
        for index, run in numbered:
            if run.kind == "stage":
                wait_or_cancel([pool.submit(execute, index, run)], stopper, session.cancel_all)
        wait_or_cancel([pool.submit(execute, index, run) for index, run in methods], stopper, session.cancel_all)


def start_on_ray(spec: Any, suite_dir: Path, run: PlannedRun, run_dir: Path, progress: Progress, stopper: Stopper,
                 session: RaySession, device: str) -> Started:
    """The Ray scheduler's start (:data:`bench.execution.runner.StartWorker`): submit the run's task with the
    stage outputs it reads, relay its progress while it runs, and unpack the run folder it sends back into
    ``run_dir``."""
    import ray

    job = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    inputs = [(key, relative, session.input_ref(path, arcname))
              for key, relative, path, arcname in stage_inputs(suite_dir, job.get("inputs") or {})]
    cpus, gpus = run_request(spec, run, device)
    forwarded = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    if run_machines(spec, run) > 1:
        from bench.execution.ray_machines import start_across_machines

        return start_across_machines(spec, suite_dir, run, run_dir, progress, stopper, session, (cpus, gpus),
                                     (job, inputs, forwarded))
    task = session.run_task.options(num_cpus=cpus, num_gpus=gpus, max_retries=session.max_retries,
                                    retry_exceptions=False,
                                    name=f"bench:{run.run_id}")
    session.expect(run.run_id, progress)
    ref = task.remote(spec, job, inputs, cpus, forwarded, suite_dir.name, session.relay, transfer=session.transfer)
    session.track(run.run_id, ref)
    try:
        placed, status, launched, node_root, data = ray.get(ref)
    except ray.exceptions.RayError as exc:
        if stopper.requested.is_set():  # cancelled by the stop: recorded as interrupted, as under the local one
            session.wait_until_ended(run.run_id)
            return Started(None, placed=session.untrack(run.run_id))
        return lost_run(exc, session.untrack(run.run_id))
    placed = session.untrack(run.run_id) or placed  # the relayed one: with every attempt's node when retried
    session.transfer.take_back(data, run_dir, node_root, suite_dir)
    return Started(status, launched=launched, placed=placed)


def stage_inputs(suite_dir: Path, inputs: dict[str, str | None]) -> list[tuple[str, str, Path, str]]:
    """(run.json key, its path relative to the suite folder, what to send, the name it travels under) for each
    stage output a run reads: the model folders and the pool whole; of the warm start's folder only its
    result.json (the start's scores; its model travels as init_model_dir)."""
    out = []
    for key, value in inputs.items():
        if not value:
            continue
        path = Path(value)
        sent = path / RESULT_FILE if key == "warm_start_dir" else path
        out.append((key, path.relative_to(suite_dir).as_posix(), sent, sent.relative_to(suite_dir).as_posix()))
    return out


__all__ = ["run_all_on_ray", "ray_problem", "run_request", "run_machines", "RaySession", "start_on_ray", "stage_inputs",
           "RAY_FIX", "check_fits", "cluster_device"]
