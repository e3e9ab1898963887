"""The runner: schedules a plan's runs (stages before what needs them, up to ``parallel_runs`` at once, each on GPUs
of its own: :mod:`bench.execution.devices`), one worker subprocess per run, records how each ended and where it
ran, and builds the report at the end. Starting and stopping the
worker processes is :mod:`bench.execution.processes`; the suite folder, its lock and ``latest`` are
:mod:`bench.execution.suite_folder`.

Layout of a suite run folder:
```
SUITE_DIR/suite.json                 preset, resolved spec, ordered run ids, creation time
SUITE_DIR/runs/<run_id>/run.json     what the worker is asked to do
SUITE_DIR/runs/<run_id>/result.json  what it did (bench.results)
SUITE_DIR/runs/<run_id>/worker.log   everything the worker printed
SUITE_DIR/.lock                      while a `bench run` writes the folder: its PID and host
SUITE_DIR/index.html, summary.md, results.csv, figures/
```

Stopping: the first SIGINT or SIGTERM cancels the queued runs, sends SIGTERM to each running worker's process
group (SIGKILL after KILL_AFTER_S), lets them record themselves as interrupted, writes the report of what
finished and prints the `--resume` command (exit status 130); a second signal kills the workers and exits at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

from bench.execution.plan import PlannedRun, make_plan
from bench.results import (MESSAGE_LIMIT, RESULT_FILE, cap_text, empty_result, file_hash, incomplete_reason, is_complete,
                           read_result, write_json_atomic)
from bench.config.spec import Spec
from bench.execution.sweep import job_spec, job_sweep
from bench.execution.run_failure import OUT_OF_MEMORY
from bench.execution.worker import RUN_FILE
from bench.execution.processes import (KILLED_FROM_OUTSIDE, Progress, Started, Stopper, killed_from_outside,
                                       launch_worker, say_best_effort, wait_or_cancel, worker_env)
from bench.execution.devices import DevicePlan, DevicePool, Slot, placement, plan_devices
from bench.execution.suite_folder import (SUITE_FILE, SuiteLock, _point_latest, check_suite_dir, default_out_dir,
                                          prepare_suite_dir)

CONSOLE_REASON_LIMIT = 300
"""Characters of a failure reason shown on the console (result.json keeps up to MESSAGE_LIMIT, the log all)."""
INTERRUPTED = "Interrupted"
"""error.type of a run stopped by an interrupt (status failed: the report shows it as a failed cell)."""
SKIPPED = "PrerequisiteFailed"
"""error.type of a run not started because a stage it reads did not finish."""
STAGE_OOM = "ran out of memory"
"""How a skip's message ends when every stage it needed ran out of memory at a sweep point (an expected skip)."""
def run_inputs(suite_dir: Path, run: PlannedRun) -> dict[str, str | None]:
    """Paths from earlier stages that this run reads."""
    runs = suite_dir / "runs"
    # A sweep plans a stage per group of points ("warm_start@qwen2.5-7b"): find the run id that made each stage.
    made = {need.split("@", 1)[0]: need for need in run.needs}
    inputs: dict[str, str | None] = {}
    if "warm_start" in made:
        inputs["init_model_dir"] = str(runs / made["warm_start"] / "model")
        inputs["warm_start_dir"] = str(runs / made["warm_start"])
    if "sample_pool" in made:
        inputs["pool_path"] = str(runs / made["sample_pool"] / "pool.jsonl")
    if "reward_model" in made:
        inputs["reward_model_dir"] = str(runs / made["reward_model"] / "model")
    return inputs


def inputs_hash(suite_dir: Path, run: PlannedRun) -> str | None:
    """A content hash of the stage results ``run`` reads (None when it reads none).

    Recorded in the run's result; on --resume a run whose recorded hash differs was trained from a stage output
    that has since been re-run, so it is re-run too. A stage's result.json changes whenever the stage re-runs
    (its timestamps at least), so hashing it stands for hashing the stage's output folder, at no cost.
    """
    if not run.needs:
        return None
    digest = hashlib.sha256()
    for need in sorted(run.needs):
        found = file_hash(suite_dir / "runs" / need / RESULT_FILE) or "missing"
        digest.update(f"{need}={found}\n".encode())
    return digest.hexdigest()


def record_failure(run_dir: Path, run: PlannedRun, spec: Spec, error_type: str, message: str,
                   inputs: str | None = None, **error: Any) -> None:
    """A failed result for a run that could not write its own (killed, interrupted, or a prerequisite failed);
    ``error`` adds fields to ``result["error"]`` (an out-of-memory's ``phase``, ``exception``, ``memory``)."""
    result = empty_result(run.run_id, run.kind, run.name, run.label, run.engine, run.seed)
    result["status"] = "failed"
    result["error"] = {"type": error_type, "message": cap_text(message, MESSAGE_LIMIT), "memory_at_failure": None,
                       **error}
    result["inputs_hash"] = inputs
    result["spec"] = job_spec(spec, run)
    if run.point is not None:
        result["sweep"] = job_sweep(spec, run)
    write_json_atomic(run_dir / RESULT_FILE, result)


def _log_tail(run_dir: Path, lines: int = 3) -> str:
    try:
        text = (run_dir / "worker.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


@dataclass
class SuiteOutcome:
    """How a suite run ended: the folder, the exit status for `bench run` and the final console line."""

    suite_dir: Path
    exit_code: int
    """0 every planned run ok (or out of memory at a sweep point: an expected outcome); 1 some failed or were
    skipped; 130 interrupted."""
    summary: str


def run_suite(spec: Spec, suite_dir: Path, resume: bool = False, repo_dir: Path | None = None,
              stream: TextIO = sys.stderr, resume_command: str | None = None,
              latest_dir: Path | None = None) -> SuiteOutcome:
    """Run every planned run and build the report.

    Stages run one at a time, in order; then the method runs, ``spec.parallel_runs`` at a time, each on GPUs of its
    own (:func:`bench.execution.devices.plan_devices`, recorded in suite.json's ``schedule``). The folder is
    locked for the whole run (:class:`SuiteLock`). ``resume_command`` is what to print after an interrupt (the
    CLI passes the command line that reproduces this spec); the default names the preset alone. ``latest_dir`` is
    REPORTS_DIR: its ``latest`` link is moved here when the suite folder lies directly in it; a folder anywhere
    else (``--out`` elsewhere, or None) gets no link, since the link would be a write outside the folder given.
    """
    suite_dir = suite_dir.resolve()  # workers get absolute paths, whatever their working directory
    runs = make_plan(spec)
    # too few GPUs for parallel_runs: one line, before anything starts; under Ray each node's GPUs are Ray's to give
    devices = plan_devices(spec, os.environ) if spec.scheduler.name == "local" else _ray_plan(spec)
    check_suite_dir(spec, suite_dir, resume)  # before anything is created or locked
    suite_dir.mkdir(parents=True, exist_ok=True)
    lock = SuiteLock(suite_dir)
    lock.acquire(stream)
    command = resume_command or f"bench run --preset {spec.name} --out {suite_dir} --resume"
    stopper = Stopper(stream, on_exit_now=lambda: _exit_now(lock, stream, command))
    try:
        prepare_suite_dir(spec, suite_dir, runs, resume, resume_command)  # again, now that no other run can write
        _write_schedule(suite_dir, devices)
        stopper.install()
        started = time.monotonic()
        _run_all(spec, suite_dir, runs, resume, repo_dir, stream, stopper, devices)
        from bench.report import build_report

        index_html = build_report(suite_dir)
        if latest_dir is not None and suite_dir.parent == Path(latest_dir).resolve():
            _point_latest(suite_dir)
        outcome = summarize(suite_dir, runs, index_html, stopper.signal_name, time.monotonic() - started)
        _write_state(suite_dir, outcome, command if outcome.exit_code == 130 else None)
        # best-effort: the outcome is on disk now, and a closed terminal must not turn it into exit status 1
        resume_line = f"resume with: {command}\n" if outcome.exit_code == 130 else ""
        say_best_effort(stream, f"{outcome.summary}\n{resume_line}")
        return outcome
    finally:
        stopper.restore()
        lock.release()


def _exit_now(lock: SuiteLock, stream: TextIO, command: str) -> None:
    """On a second signal: leave the folder unlocked and say how to continue (no report is written)."""
    lock.release()
    try:
        stream.write(f"resume with: {command}\n")
        stream.flush()
    except (OSError, RuntimeError, ValueError):
        pass


def _run_all(spec: Spec, suite_dir: Path, runs: list[PlannedRun], resume: bool, repo_dir: Path | None,
             stream: TextIO, stopper: Stopper, devices: DevicePlan | None = None) -> None:
    """The stages in order, then the method runs on a pool of ``devices.parallel_runs`` workers; after a stop
    request nothing new starts.

    Each running worker holds one slot of ``devices`` (its GPU, or its group of GPUs under a launcher) for as long
    as it runs, and gives it back however it ends, so no two runs share a device and a failed run frees its device
    for the next queued one. ``devices`` defaults to :func:`plan_devices` of this process's environment."""
    if spec.scheduler.name == "ray":  # the same plan and order; each run a Ray task on the node Ray picks
        from bench.execution.ray_scheduler import run_all_on_ray

        run_all_on_ray(spec, suite_dir, runs, resume, repo_dir, stream, stopper, execute_run)
        return
    devices = devices or plan_devices(spec, os.environ)
    lock = threading.Lock()
    inplace = stream.isatty() and devices.parallel_runs == 1
    pool_of_slots = DevicePool(devices.slots)

    def execute(index: int, run: PlannedRun) -> None:
        if stopper.requested.is_set():  # queued when the interrupt came
            return
        with pool_of_slots.hold() as (slot_index, slot):
            if stopper.requested.is_set():  # the interrupt came while it waited for a device
                return
            progress = Progress(stream, lock, inplace, index, len(runs), run)
            env = worker_env(spec, os.environ, slot)
            execute_run(spec, suite_dir, run, resume, repo_dir, env, progress, stopper,
                        gpus=slot, placed=placement(devices, slot_index, slot))

    numbered = list(enumerate(runs, 1))
    for index, run in numbered:
        if run.kind == "stage":
            execute(index, run)
    methods = [(index, run) for index, run in numbered if run.kind != "stage"]
    with ThreadPoolExecutor(max_workers=devices.parallel_runs) as pool:
        wait_or_cancel([pool.submit(execute, index, run) for index, run in methods], stopper)


def _write_schedule(suite_dir: Path, devices: DevicePlan) -> None:
    """Record in suite.json how this `bench run` uses the machine (``schedule``: device, parallel_runs resolved,
    the GPUs of each slot and where the list came from)."""
    path = suite_dir / SUITE_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    meta["schedule"] = devices.to_dict()
    write_json_atomic(path, meta)


def _ray_plan(spec: Spec) -> DevicePlan:
    """The local plan's stand-in under Ray, for suite.json until the Ray scheduler records its own: no slots here
    (Ray gives each run CPUs and GPUs of its node), ``parallel_runs`` resolved as on a CPU (it sets the workers'
    thread count, :mod:`bench.execution.cpu_threads`; how many runs go at once is Ray's to decide)."""
    n = 1 if spec.parallel_runs == "auto" else int(spec.parallel_runs)
    return DevicePlan(spec.device, n, [()] * n, "ray", spec.parallel_runs)


def _record_placement(run_dir: Path, placed: dict[str, Any] | None) -> None:
    """Add ``placement`` (which GPU ran it, :func:`bench.execution.devices.placement`) to the run's result."""
    result = read_result(run_dir)
    if placed is None or result is None:
        return
    result["placement"] = placed
    write_json_atomic(run_dir / RESULT_FILE, result)


StartWorker = Callable[[PlannedRun, Path, Progress], Started]
"""Another scheduler's way of starting a run's worker, given the run, its folder (run.json written) and its progress
line; it returns when the worker has ended (bench.execution.ray_scheduler)."""


def execute_run(spec: Spec, suite_dir: Path, run: PlannedRun, resume: bool, repo_dir: Path | None,
                env: Mapping[str, str], progress: Progress, stopper: Stopper, gpus: Slot | None = None,
                placed: dict[str, Any] | None = None, start: StartWorker | None = None) -> None:
    """One planned run: reuse it on --resume when complete and its inputs unchanged, else skip it when a stage
    it reads did not finish, else start its worker (on ``gpus``, the slot it holds: ``env`` is already pinned to
    its first GPU; a launched run gets the whole slot) and record what became of it, with ``placed`` as the
    result's ``placement``. ``start``: another scheduler starts the worker instead (its own ``env``, GPUs and
    placement: :data:`StartWorker`); None, a worker process on this machine."""
    run_dir = suite_dir / "runs" / run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    inputs = inputs_hash(suite_dir, run)
    if _reused_or_skipped(spec, suite_dir, run, run_dir, resume, inputs, progress):
        return
    write_json_atomic(run_dir / RUN_FILE, {
        "run_id": run.run_id, "kind": run.kind, "name": run.name, "label": run.label, "engine": run.engine,
        "seed": run.seed, "spec": job_spec(spec, run), "inputs": run_inputs(suite_dir, run), "inputs_hash": inputs,
        "repo_dir": str(repo_dir) if repo_dir else None, "sweep": job_sweep(spec, run),
        # how many runs share the machine (parallel_runs resolved: the worker's CPU threads) and where this one runs
        "parallel_runs": placed["parallel_runs"] if placed else None, "placement": placed,
    })
    started = (start(run, run_dir, progress) if start is not None
               else _start_here(spec, run, run_dir, env, progress, stopper, gpus, placed))
    if read_result(run_dir) is None:
        _record_no_result(spec, run, run_dir, inputs, started, progress, stopper)
    _record_placement(run_dir, started.placed)
    progress.finish(_outcome_line(read_result(run_dir)))


def _reused_or_skipped(spec: Spec, suite_dir: Path, run: PlannedRun, run_dir: Path, resume: bool,
                       inputs: str | None, progress: Progress) -> bool:
    """True when the run needs no worker: complete and kept (--resume), or skipped because a stage it reads did not
    finish (its failed result written). Otherwise its old result is removed and False returned."""
    if resume:
        reason = incomplete_reason(run_dir, inputs)
        if reason is None:
            progress.finish("already complete, skipped (--resume)")
            return True
        if reason.startswith("status ") and _finished_out_of_memory(run_dir, inputs):
            progress.finish("out of memory at this sweep point, kept (--resume does not re-run it; delete its "
                            "result.json to try again)")
            return True
        if reason != "no result" and not reason.startswith("status "):
            progress.note(f"re-running: {reason}")
    (run_dir / RESULT_FILE).unlink(missing_ok=True)
    unmet = [need for need in run.needs if not is_complete(suite_dir / "runs" / need)]
    if unmet:
        # At a sweep point, a stage that ran out of memory makes its consumers' skip as expected as the OOM itself.
        oom = run.point is not None and all(run_verdict(suite_dir / "runs" / need)[0] == "oom" for need in unmet)
        why = f"stage {', '.join(unmet)} {STAGE_OOM if oom else 'did not finish'}"
        record_failure(run_dir, run, spec, SKIPPED, why, inputs)
        progress.finish(f"skipped: {why}")
        return True
    return False


def _start_here(spec: Spec, run: PlannedRun, run_dir: Path, env: Mapping[str, str], progress: Progress,
                stopper: Stopper, gpus: Slot | None, placed: dict[str, Any] | None) -> Started:
    """The local scheduler's start: the worker process on this machine, until it exits."""
    from bench.execution.launch import merge_rank_files, worker_launch

    # accelerate launch on the slot's GPUs, or None: one process
    command, env = worker_launch(spec, run.kind, run.name, run_dir, env, gpus=gpus or None)
    # command only when launched: a one-process run calls launch_worker exactly as before (tests stand in for it)
    status = (launch_worker(run_dir, progress, env, stopper) if command is None
              else launch_worker(run_dir, progress, env, stopper, command=command))
    if command is not None:  # each rank wrote rank<k>.json; rank 0 the result: one result with every rank's memory
        merge_rank_files(run_dir)
    return Started(status, launched=command is not None, placed=placed)


def _record_no_result(spec: Spec, run: PlannedRun, run_dir: Path, inputs: str | None, started: Started,
                      progress: Progress, stopper: Stopper) -> None:
    """The failed result of a run whose worker wrote none: interrupted, lost by its scheduler, killed by the OOM
    killer, or dead for another reason (its log's last lines)."""
    status = started.status
    if stopper.requested.is_set():
        how = f"the worker stopped (exit status {status})" if status is not None else "its task was cancelled"
        record_failure(run_dir, run, spec, INTERRUPTED, f"the suite was interrupted ({stopper.signal_name}) "
                       f"and {how} before writing a result; --resume re-runs it", inputs)
    elif started.lost is not None:
        record_failure(run_dir, run, spec, started.lost_type, f"{started.lost}; --resume re-runs it", inputs)
    elif not started.launched and status is not None and killed_from_outside(status):
        phase = progress.last_phase
        record_failure(run_dir, run, spec, OUT_OF_MEMORY,
                       f"host memory: the worker was killed by SIGKILL, which the runner did not send (on Linux "
                       f"the kernel's OOM killer does that when host memory runs out), in phase "
                       f"{phase or 'unknown (it reported none)'}; log: {_log_tail(run_dir)}", inputs,
                       phase=phase, exception=KILLED_FROM_OUTSIDE, memory="host")
    else:
        record_failure(run_dir, run, spec, "WorkerDied",
                       f"the worker exited with status {status} without a result (killed, or out of memory?); "
                       f"log: {_log_tail(run_dir)}", inputs)


def _finished_out_of_memory(run_dir: Path, inputs: str | None) -> bool:
    """The well-formed failed result in ``run_dir`` is an out-of-memory at a sweep point (:func:`run_verdict`
    'oom') made from the current stage outputs: a finding of the sweep, which --resume keeps like an ok result."""
    result = read_result(run_dir)
    if result is None or (inputs is not None and result.get("inputs_hash") != inputs):
        return False
    return run_verdict(run_dir)[0] == "oom"


def _outcome_line(result: dict[str, Any] | None) -> str:
    if result is None or result["status"] != "ok":
        error = (result or {}).get("error") or {}
        if error.get("type") == INTERRUPTED:
            return "interrupted (--resume re-runs it)"
        if error.get("type") == OUT_OF_MEMORY and isinstance((result or {}).get("sweep"), dict):
            return f"out of memory in phase {error.get('phase') or 'unknown'} (a sweep point: expected, not a failure)"
        return f"FAILED {error.get('type', '')}: {cap_text(str(error.get('message', '')), CONSOLE_REASON_LIMIT)}"
    parts = ["ok"]
    after = (result.get("accuracy") or {}).get("after")
    from bench.task.verifier import HEADLINE_MODE

    # The headline mode; "strict" is its name in results written before the modes were renamed.
    mode = next((m for m in (HEADLINE_MODE, "strict") if m in (after or {})), None)
    if mode:
        score = after[mode]
        parts.append(f"accuracy {score['accuracy']:.1%} [{score['low']:.1%}, {score['high']:.1%}] ({mode})")
    memory = result.get("memory") or {}
    if memory.get("peak_bytes"):
        parts.append(f"peak {memory['peak_bytes'] / 2**20:.0f} MiB ({memory['source']})")
    return ", ".join(parts)


# -- how it ended -----------------------------------------------------------------------------------------
def run_verdict(run_dir: Path) -> tuple[str, str]:
    """(ok | oom | failed | skipped | interrupted | not started, reason) for one planned run, from its result.

    oom: a sweep point that ran out of memory (error type OUT_OF_MEMORY, bench.execution.run_failure). Where a method stops
    fitting is what a sweep measures, so it is an expected outcome and does not make the exit status 1; the same
    error outside a sweep is a failure."""
    result = read_result(run_dir)
    if result is None:
        return "not started", ""
    if result.get("status") == "ok":
        return "ok", ""
    error = result.get("error") if isinstance(result.get("error"), dict) else {}
    message = " ".join(str(error.get("message") or "").split())
    kind = {INTERRUPTED: "interrupted", SKIPPED: "skipped"}.get(str(error.get("type")), "failed")
    if error.get("type") == OUT_OF_MEMORY and isinstance(result.get("sweep"), dict):
        return "oom", f"out of memory in phase {error.get('phase') or 'unknown'}"
    if kind == "skipped" and isinstance(result.get("sweep"), dict) and message.endswith(STAGE_OOM):
        return "oom", f"skipped: {message}"
    if kind == "failed":
        return kind, f"{error.get('type') or 'Error'}: {message}"
    return kind, f"{kind}: {message}"


def summarize(suite_dir: Path, runs: list[PlannedRun], index_html: Path, signal_name: str | None,
              seconds: float) -> SuiteOutcome:
    """The exit status and the one final line: every run ok, which failed (reasons capped), or interrupted."""
    verdicts = {run.run_id: run_verdict(suite_dir / "runs" / run.run_id) for run in runs}
    bad = [(run_id, reason) for run_id, (kind, reason) in verdicts.items() if kind not in ("ok", "oom")]
    oom = [f"{run_id} ({reason})" for run_id, (kind, reason) in verdicts.items() if kind == "oom"]
    oom_note = (f"; {len(oom)} sweep run(s) out of memory (expected in a sweep, not a failure): "
                f"{cap_text(', '.join(oom), CONSOLE_REASON_LIMIT)}" if oom else "")
    total, took = len(runs), f"in {seconds:.0f}s; report: {index_html}"
    if signal_name is not None:
        ok = total - len(bad)
        stopped = [run_id for run_id, (kind, _) in verdicts.items() if kind == "interrupted"]
        unstarted = sum(1 for kind, _ in verdicts.values() if kind == "not started")
        line = (f"interrupted ({signal_name}): {ok} of {total} runs ok, "
                f"{len(stopped)} stopped ({', '.join(stopped) or 'none'}), {unstarted} not started, "
                f"{len(bad) - len(stopped) - unstarted} failed; {took}")
        return SuiteOutcome(suite_dir, 130, line)
    if not bad:
        if oom:
            return SuiteOutcome(suite_dir, 0, f"{total - len(oom)} of {total} runs ok{oom_note}; {took}")
        return SuiteOutcome(suite_dir, 0, f"all {total} runs ok {took}")
    shown = ", ".join(f"{run_id} ({cap_text(reason, CONSOLE_REASON_LIMIT) or 'no result'})" for run_id, reason in bad)
    return SuiteOutcome(suite_dir, 1, f"{len(bad)} of {total} runs failed: {shown}{oom_note}; {took}")


def _write_state(suite_dir: Path, outcome: SuiteOutcome, resume_command: str | None) -> None:
    """Record in suite.json how this `bench run` ended, so the folder says it was interrupted and how to go on."""
    path = suite_dir / SUITE_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    meta["last_run"] = {
        "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "exit_status": outcome.exit_code,
        "state": {0: "complete", 1: "finished with failures", 130: "interrupted"}[outcome.exit_code],
        "summary": outcome.summary,
        "resume_command": resume_command,
    }
    write_json_atomic(path, meta)


__all__ = ["run_suite", "default_out_dir", "SuiteOutcome", "SuiteLock", "Started", "execute_run"]
