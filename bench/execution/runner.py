"""The runner: executes a plan, one worker subprocess per run, and builds the report at the end.

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
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

from bench.errors import UserError
from bench.execution.plan import PlannedRun, make_plan
from bench.results import (MESSAGE_LIMIT, RESULT_FILE, cap_text, empty_result, file_hash, incomplete_reason, is_complete,
                           read_result, write_json_atomic)
from bench.config.spec import Spec
from bench.execution.sweep import job_spec, job_sweep
from bench.execution.worker import OUT_OF_MEMORY, PARENT_ENV, PHASE_PREFIX, PROGRESS_PREFIX, RUN_FILE

SUITE_FILE = "suite.json"
LOCK_FILE = ".lock"
KILL_AFTER_S = 5.0
"""Seconds a worker gets after SIGTERM to record its interruption before its process group is SIGKILLed."""
CONSOLE_REASON_LIMIT = 300
"""Characters of a failure reason shown on the console (result.json keeps up to MESSAGE_LIMIT, the log all)."""
INTERRUPTED = "Interrupted"
"""error.type of a run stopped by an interrupt (status failed: the report shows it as a failed cell)."""
SKIPPED = "PrerequisiteFailed"
"""error.type of a run not started because a stage it reads did not finish."""
STAGE_OOM = "ran out of memory"
"""How a skip's message ends when every stage it needed ran out of memory at a sweep point (an expected skip)."""
KILLED_FROM_OUTSIDE = "SIGKILL"
"""error.exception of a run whose worker died from a SIGKILL the runner did not send: on Linux that is the OOM killer
(host memory ran out), recorded as error type OUT_OF_MEMORY (:func:`killed_from_outside`)."""


def default_out_dir(spec: Spec, reports_dir: Path) -> Path:
    """reports/<preset>-<UTC timestamp>."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return reports_dir / f"{spec.name}-{stamp}"


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


class Progress:
    """Progress lines for one run: which run of how many, step of how many, elapsed and ETA.

    With ``inplace`` (a terminal, one run at a time) the line is rewritten in place; otherwise (a log, CI,
    or several runs at once) a line is printed every 10% or 30 s. ``lock`` is shared by concurrent runs.
    """

    def __init__(self, stream: TextIO, lock: threading.Lock, inplace: bool, index: int, total: int,
                 run: PlannedRun) -> None:
        self.stream, self.lock, self.inplace = stream, lock, inplace
        self.prefix = f"[{index}/{total}] {run.run_id}"
        self.started = time.monotonic()
        self.last_print, self.last_fraction = 0.0, -1.0
        self.last_phase: str | None = None
        """The last phase the worker said it entered (bench.execution.worker.PHASE_PREFIX lines); None before any."""
        self._write(f"{self.prefix}: {run.label} ...", final=not inplace)

    def update(self, step: int, total: int, metrics: dict[str, float]) -> None:
        elapsed = time.monotonic() - self.started
        fraction = step / total if total else 0.0
        eta = f"{elapsed / fraction - elapsed:4.0f}s" if fraction > 0 else "?"
        shown = " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
        line = f"{self.prefix}: step {step}/{total} ({fraction:4.0%}) {shown} | {elapsed:5.0f}s elapsed, ETA {eta}"
        now = time.monotonic()
        if self.inplace:
            if now - self.last_print > 0.2 or step == total:
                self._write(line, final=False)
                self.last_print = now
        elif fraction - self.last_fraction >= 0.1 or now - self.last_print > 30:
            self._write(line, final=True)
            self.last_print, self.last_fraction = now, fraction

    def note(self, message: str) -> None:
        self._write(f"{self.prefix}: {message}", final=True)

    def finish(self, message: str) -> None:
        self._write(f"{self.prefix}: {message} ({time.monotonic() - self.started:.0f}s)", final=True)

    def _write(self, line: str, final: bool) -> None:
        with self.lock:
            if self.inplace:
                self.stream.write("\r\033[K" + line + ("\n" if final else ""))
            else:
                self.stream.write(line + "\n")
            self.stream.flush()


def worker_env(spec: Spec, base_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker: ``base_env`` with the worker pinned to one GPU unless device is cpu.

    TRL trainers refuse to run when they see several GPUs without a distributed launcher, and a suite
    measures one process on one device, so each worker sees exactly one: ``spec.gpus[0]``, else the first
    entry of an inherited ``CUDA_VISIBLE_DEVICES`` ("3,5" -> "3"), else "0". Indices in ``spec.gpus`` are the
    ones nvidia-smi prints, so CUDA_DEVICE_ORDER defaults to PCI_BUS_ID with them (CUDA's own default order,
    fastest first, can differ on a mixed box). A cpu run's environment is left alone.
    """
    env = dict(base_env)
    if spec.device == "cpu":
        return env
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(spec.gpus[0])
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    elif "CUDA_VISIBLE_DEVICES" in env:
        # An empty value hides every GPU on purpose; keep it empty rather than unhide device 0.
        env["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"].split(",")[0].strip()
    else:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


class Stopper:
    """What an interrupt does to one suite run; the handlers run in the main thread, between its bytecodes.

    First SIGINT / SIGTERM: remember it (the runner stops starting runs and cancels the queued ones) and send
    SIGTERM to every running worker's process group, then SIGKILL to those still there KILL_AFTER_S later.
    Second: SIGKILL every worker group, call ``on_exit_now`` (release the lock, say how to resume) and exit 130
    at once. The handler takes no lock (the main thread may hold it when the signal lands) and writes to the
    console only best-effort.
    """

    def __init__(self, stream: TextIO, on_exit_now: Callable[[], None] = lambda: None) -> None:
        self.stream, self.on_exit_now = stream, on_exit_now
        self.requested = threading.Event()
        self.signal_name: str | None = None
        self._workers: dict[int, subprocess.Popen] = {}
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take over SIGINT and SIGTERM (only possible from the main thread; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self.handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            self._signal_groups(list(self._workers.values()), signal.SIGKILL)
            self._say(f"\n{name} again: workers killed, exiting now\n")
            self.on_exit_now()
            os._exit(130)
        self.signal_name = name
        self.requested.set()
        self._say(f"\n{name}: stopping (queued runs cancelled, running workers told to stop); "
                  f"send it again to exit at once\n")
        self._terminate(list(self._workers.values()))

    def register(self, process: subprocess.Popen) -> None:
        """Track a started worker; one started just as a stop was requested is stopped at once."""
        self._workers[process.pid] = process
        if self.requested.is_set():
            self._terminate([process])

    def unregister(self, process: subprocess.Popen) -> None:
        self._workers.pop(process.pid, None)

    def _terminate(self, processes: list[subprocess.Popen]) -> None:
        self._signal_groups(processes, signal.SIGTERM)
        timer = threading.Timer(KILL_AFTER_S, self._kill_leftovers, args=(processes,))
        timer.daemon = True
        timer.start()

    def _kill_leftovers(self, processes: list[subprocess.Popen]) -> None:
        self._signal_groups([p for p in processes if p.pid in self._workers], signal.SIGKILL)

    @staticmethod
    def _signal_groups(processes: list[subprocess.Popen], signum: int) -> None:
        """Signal each worker's whole process group (its session, see launch_worker): its children go too, and so
        do the ranks of a launched run, each in a session of its own (:func:`_worker_groups`)."""
        for process in processes:
            for group in _worker_groups(process):
                try:
                    os.killpg(group, signum)
                except (ProcessLookupError, PermissionError):
                    continue

    def _say(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, RuntimeError, ValueError):  # reentrant write, closed console: the stop matters more
            pass


def launch_worker(run_dir: Path, progress: Progress, env: Mapping[str, str] | None = None,
                  stopper: Stopper | None = None, command: list[str] | None = None) -> int:
    """Run ``python -m bench.execution.worker RUN_DIR`` (or ``command``: ``accelerate launch ... -m bench.execution.worker RUN_DIR``,
    bench.execution.launch) in ``env`` (default: this process's environment); stream its progress; its other output goes
    to worker.log.

    The worker (or the launcher) starts in its own session (so its own process group): a Ctrl-C at the terminal
    reaches the runner only, which then stops each worker's whole group deliberately (:class:`Stopper`), with the
    groups of a launcher's ranks. The worker is told this process's PID so that it stops itself if the runner dies.
    """
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    env[PARENT_ENV] = str(os.getpid())
    argv = command or [sys.executable, "-m", "bench.execution.worker", str(run_dir)]
    with open(run_dir / "worker.log", "w", encoding="utf-8") as log:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                   start_new_session=True)
        if stopper is not None:
            stopper.register(process)
        try:
            _relay_output(process, progress, log)
            return process.wait()
        except BaseException:  # an error here must not leave the worker running
            _stop_group(process)
            raise
        finally:
            if stopper is not None:
                stopper.unregister(process)


def _relay_output(process: subprocess.Popen, progress: Progress, log: TextIO) -> None:
    """Progress lines to the display, everything else to worker.log, until the worker closes its stdout."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(PHASE_PREFIX):
            progress.last_phase = line[len(PHASE_PREFIX):].strip() or None
        elif line.startswith(PROGRESS_PREFIX):
            try:
                data = json.loads(line[len(PROGRESS_PREFIX):])
                progress.update(data["step"], data["total"], data.get("metrics", {}))
            except (ValueError, KeyError, TypeError):
                log.write(line)
        else:
            log.write(line)


def _worker_groups(process: subprocess.Popen) -> list[int]:
    """The worker's process group, then the group of every descendant in another one: accelerate's launcher
    (torch.distributed's elastic agent) starts each rank in a session of its own, out of reach of the first."""
    groups = [process.pid]
    try:
        import psutil

        for child in psutil.Process(process.pid).children(recursive=True):
            try:
                group = os.getpgid(child.pid)
            except OSError:  # exited meanwhile
                continue
            if group not in groups:
                groups.append(group)
    except Exception:  # noqa: BLE001 - the worker's own group is still signalled
        pass
    return groups


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the worker's process group (and its ranks'), SIGKILL them if still there after KILL_AFTER_S."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        groups = _worker_groups(process)
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            return
        for group in groups[1:]:
            try:
                os.killpg(group, signum)
            except (ProcessLookupError, PermissionError):
                continue
        try:
            process.wait(timeout=KILL_AFTER_S)
            return
        except subprocess.TimeoutExpired:
            continue


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


def check_suite_dir(spec: Spec, suite_dir: Path, resume: bool) -> None:
    """Refuse a folder that cannot take this run: on --resume, one that is not a suite folder or was made with a
    different spec; otherwise one that already holds something (a lock file alone does not count)."""
    suite_file = suite_dir / SUITE_FILE
    if resume:
        if not suite_file.is_file():
            raise UserError(f"--resume: '{suite_dir}' is not a suite run folder (no {SUITE_FILE}); "
                            f"give --out a folder written by `bench run`, or drop --resume")
        try:
            old = json.loads(suite_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"--resume: '{suite_file}' is unreadable ({type(exc).__name__}); "
                            f"start a new --out folder") from None
        if not isinstance(old, dict) or old.get("spec") != spec.to_dict():
            old_spec = old.get("spec", {}) if isinstance(old, dict) else {}
            changed = sorted(_changed_keys(old_spec, spec.to_dict()))
            raise UserError(f"--resume: the spec differs from the one '{suite_dir}' was run with "
                            f"({', '.join(changed[:5]) or 'unknown keys'}); use the same preset and overrides, "
                            f"or a new --out folder")
    elif suite_dir.exists() and any(p.name != LOCK_FILE for p in suite_dir.iterdir()):
        raise UserError(f"output folder '{suite_dir}' already exists and is not empty; pass --resume to continue it "
                        f"or choose another --out")


def prepare_suite_dir(spec: Spec, suite_dir: Path, runs: list[PlannedRun], resume: bool,
                      resume_command: str | None = None) -> None:
    """Create the folder and suite.json; on --resume, refuse a folder made with a different spec.

    suite.json records ``commands``: ``run``, the command line that reproduces the run into a new folder, and
    ``resume``, the one that continues this folder (the report's citation block shows both).
    """
    check_suite_dir(spec, suite_dir, resume)
    suite_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(suite_dir / SUITE_FILE, {
        "preset": spec.name,
        "description": spec.description,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [r.run_id for r in runs],
        "spec": spec.to_dict(),
        "commands": run_commands(spec, suite_dir, resume_command),
    })


def run_commands(spec: Spec, suite_dir: Path, resume_command: str | None) -> dict[str, str]:
    """``{"run", "resume"}`` command lines. ``resume_command`` is bench.execution.commands.resume_command's (program, preset,
    ``--out FOLDER --resume``, overrides); the run command is the same without ``--out FOLDER --resume``."""
    resume = resume_command or shlex.join(["bench", "run", "--preset", spec.name, "--out", str(suite_dir), "--resume"])
    words, plain, skip = shlex.split(resume), [], False
    for word in words:
        if skip:
            skip = False
        elif word == "--out":
            skip = True  # and its folder: a new run writes a new folder
        elif word != "--resume" and not word.startswith("--out="):
            plain.append(word)
    return {"run": shlex.join(plain), "resume": resume}


def _changed_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return [k for key in keys for k in _changed_keys(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if a != b else []


# -- one writer per folder ------------------------------------------------------------------------------
class SuiteLock:
    """``SUITE_DIR/.lock``: the PID and host of the `bench run` writing the folder, held with flock.

    Two runs writing one folder would race on every result (a worker finishing after a --resume started would
    overwrite the new run's result). The lock is held when another process holds the flock (released by the
    kernel when that process dies, however it dies) or when the PID it names is alive on this host (a holder
    that cannot flock); a lock naming a dead PID is stale and taken over with a note. A lock from another host
    cannot be checked and is refused: the message says how to remove it.
    """

    def __init__(self, suite_dir: Path) -> None:
        self.path = suite_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, stream: TextIO) -> None:
        """Take the lock or raise UserError naming the holder; may note a stale lock taken over on ``stream``."""
        for _ in range(3):  # the file can be replaced between open and flock by a releasing holder: try again
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_flock(fd):
                holder = _read_holder(self.path)
                os.close(fd)
                raise UserError(self._held_message(holder))
            if _same_file(fd, self.path):
                break
            os.close(fd)
        else:
            raise UserError(f"could not take the lock '{self.path}' (it keeps changing); is another bench run "
                            f"starting on this folder?")
        holder = _read_holder(self.path)
        if holder and holder.get("pid") != os.getpid():
            if holder.get("host") != socket.gethostname() or _pid_alive(holder.get("pid")):
                os.close(fd)
                raise UserError(self._held_message(holder))
            stream.write(f"note: took over a stale lock in {self.path.parent} (PID {holder.get('pid')} on "
                         f"{holder.get('host')} is not running)\n")
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}).encode())
        os.fsync(fd)
        self._fd = fd

    def refuse_if_held(self) -> None:
        """Raise the UserError :meth:`acquire` would when another live run holds the lock; take nothing.

        For the CLI, so that a second `bench run` on a busy folder says one line before printing anything.
        """
        if not self.path.is_file():
            return
        holder = _read_holder(self.path)
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError:
            return
        try:
            held = not _try_flock(fd) or bool(holder and holder.get("pid") != os.getpid() and (
                holder.get("host") != socket.gethostname() or _pid_alive(holder.get("pid"))))
        finally:
            os.close(fd)  # closing drops a flock this probe may have taken
        if held:
            raise UserError(self._held_message(holder))

    def release(self) -> None:
        """Remove the lock file (ours) and drop the flock. Safe to call twice, and from a signal handler."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)

    def _held_message(self, holder: dict[str, Any] | None) -> str:
        who = (f"PID {holder.get('pid')} on {holder.get('host')}, since {holder.get('started_at')}" if holder
               else "another process")
        return (f"'{self.path.parent}' is being written by another bench run ({who}); wait for it to finish or "
                f"stop it (if it is surely gone, delete {self.path})")


def _try_flock(fd: int) -> bool:
    """An exclusive, non-blocking flock; True where flock does not exist (the PID check still applies)."""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without flock: fall back on the PID check
        return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


# -- the suite ------------------------------------------------------------------------------------------
@dataclass
class SuiteOutcome:
    """How a suite run ended: the folder, the exit status for `bench run` and the final console line."""

    suite_dir: Path
    exit_code: int
    """0 every planned run ok (or out of memory at a sweep point: an expected outcome); 1 some failed or were
    skipped; 130 interrupted."""
    summary: str


def run_suite(spec: Spec, suite_dir: Path, resume: bool = False, repo_dir: Path | None = None,
              stream: TextIO = sys.stderr, resume_command: str | None = None) -> SuiteOutcome:
    """Run every planned run and build the report.

    Stages run one at a time, in order; then the method runs, ``spec.parallel_runs`` at a time. The folder is
    locked for the whole run (:class:`SuiteLock`). ``resume_command`` is what to print after an interrupt (the
    CLI passes the command line that reproduces this spec); the default names the preset alone.
    """
    suite_dir = suite_dir.resolve()  # workers get absolute paths, whatever their working directory
    runs = make_plan(spec)
    check_suite_dir(spec, suite_dir, resume)  # before anything is created or locked
    suite_dir.mkdir(parents=True, exist_ok=True)
    lock = SuiteLock(suite_dir)
    lock.acquire(stream)
    command = resume_command or f"bench run --preset {spec.name} --out {suite_dir} --resume"
    stopper = Stopper(stream, on_exit_now=lambda: _exit_now(lock, stream, command))
    try:
        prepare_suite_dir(spec, suite_dir, runs, resume, resume_command)  # again, now that no other run can write
        stopper.install()
        started = time.monotonic()
        _run_all(spec, suite_dir, runs, resume, repo_dir, stream, stopper)
        from bench.report import build_report

        index_html = build_report(suite_dir)
        _point_latest(suite_dir)
        outcome = summarize(suite_dir, runs, index_html, stopper.signal_name, time.monotonic() - started)
        _write_state(suite_dir, outcome, command if outcome.exit_code == 130 else None)
        stream.write(outcome.summary + "\n")
        if outcome.exit_code == 130:
            stream.write(f"resume with: {command}\n")
        stream.flush()
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
             stream: TextIO, stopper: Stopper) -> None:
    """The stages in order, then the method runs on a pool; after a stop request nothing new starts."""
    lock = threading.Lock()
    inplace = stream.isatty() and spec.parallel_runs == 1
    env = worker_env(spec, os.environ)

    def execute(index: int, run: PlannedRun) -> None:
        if stopper.requested.is_set():  # queued when the interrupt came
            return
        progress = Progress(stream, lock, inplace, index, len(runs), run)
        execute_run(spec, suite_dir, run, resume, repo_dir, env, progress, stopper)

    numbered = list(enumerate(runs, 1))
    for index, run in numbered:
        if run.kind == "stage":
            execute(index, run)
    methods = [(index, run) for index, run in numbered if run.kind != "stage"]
    with ThreadPoolExecutor(max_workers=spec.parallel_runs) as pool:
        _wait_or_cancel([pool.submit(execute, index, run) for index, run in methods], stopper)


def _wait_or_cancel(futures: list[Future], stopper: Stopper) -> None:
    """Wait for every future; once a stop is requested, cancel the ones not started and wait for the running
    ones (their workers are being stopped). A runner bug in one run is raised after cancelling the rest."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=0.5)
        failed = [f for f in done if not f.cancelled() and f.exception() is not None]
        if stopper.requested.is_set() or failed:
            for future in pending:
                future.cancel()
        if failed:
            wait(pending)
            failed[0].result()


def execute_run(spec: Spec, suite_dir: Path, run: PlannedRun, resume: bool, repo_dir: Path | None,
                env: Mapping[str, str], progress: Progress, stopper: Stopper) -> None:
    """One planned run: reuse it on --resume when complete and its inputs unchanged, else skip it when a stage
    it reads did not finish, else start its worker and record what became of it."""
    run_dir = suite_dir / "runs" / run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    inputs = inputs_hash(suite_dir, run)
    if resume:
        reason = incomplete_reason(run_dir, inputs)
        if reason is None:
            progress.finish("already complete, skipped (--resume)")
            return
        if reason.startswith("status ") and _finished_out_of_memory(run_dir, inputs):
            progress.finish("out of memory at this sweep point, kept (--resume does not re-run it; delete its "
                            "result.json to try again)")
            return
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
        return
    write_json_atomic(run_dir / RUN_FILE, {
        "run_id": run.run_id, "kind": run.kind, "name": run.name, "label": run.label, "engine": run.engine,
        "seed": run.seed, "spec": job_spec(spec, run), "inputs": run_inputs(suite_dir, run), "inputs_hash": inputs,
        "repo_dir": str(repo_dir) if repo_dir else None, "sweep": job_sweep(spec, run),
    })
    from bench.execution.launch import merge_rank_files, worker_launch

    command, env = worker_launch(spec, run.kind, run.name, run_dir, env)  # accelerate launch, or None: one process
    # command only when launched: a one-process run calls launch_worker exactly as before (tests stand in for it)
    status = (launch_worker(run_dir, progress, env, stopper) if command is None
              else launch_worker(run_dir, progress, env, stopper, command=command))
    if command is not None:  # each rank wrote rank<k>.json; rank 0 the result: one result with every rank's memory
        merge_rank_files(run_dir)
    if read_result(run_dir) is None:
        if stopper.requested.is_set():
            record_failure(run_dir, run, spec, INTERRUPTED, f"the suite was interrupted ({stopper.signal_name}) "
                           f"and the worker stopped (exit status {status}) before writing a result; --resume "
                           f"re-runs it", inputs)
        elif command is None and killed_from_outside(status):
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
    progress.finish(_outcome_line(read_result(run_dir)))


def killed_from_outside(status: int) -> bool:
    """A one-process worker's exit status says SIGKILL (Popen: -9). The runner sends SIGKILL only after a stop
    request (:class:`Stopper`) or while failing itself (:func:`_stop_group`), so otherwise someone else sent it:
    the Linux OOM killer, which picks the process using most memory (or a person with kill -9)."""
    return status == -signal.SIGKILL


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

    oom: a sweep point that ran out of memory (error type OUT_OF_MEMORY, bench.execution.worker). Where a method stops
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


def _point_latest(suite_dir: Path) -> None:
    """<parent>/latest -> this suite folder (a relative symlink, replaced atomically)."""
    link = suite_dir.parent / "latest"
    tmp = suite_dir.parent / f".latest.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(suite_dir.name)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


__all__ = ["run_suite", "default_out_dir", "SuiteOutcome", "SuiteLock"]
