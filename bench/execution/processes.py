"""Worker processes: starting one (``python -m bench.execution.worker RUN_DIR``, or accelerate's launcher), relaying its
progress lines to the console, stopping its process groups on a signal (SIGTERM, then SIGKILL after
:data:`KILL_AFTER_S`), and telling a kill from outside from the worker's own exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

from bench.config.spec import Spec
from bench.execution.plan import PlannedRun
from bench.execution.worker import PARENT_ENV, PHASE_PREFIX, PROGRESS_PREFIX


KILL_AFTER_S = 5.0
"""Seconds a worker gets after SIGTERM to record its interruption before its process group is SIGKILLed."""
KILLED_FROM_OUTSIDE = "SIGKILL"
"""error.exception of a run whose worker died from a SIGKILL the runner did not send: on Linux that is the OOM killer
(host memory ran out), recorded as error type OUT_OF_MEMORY (:func:`killed_from_outside`)."""


@dataclass
class Started:
    """How a run's worker ended, as the scheduler that started it saw it: what the runner records
    (:func:`bench.execution.runner.execute_run`)."""

    status: int | None
    """The worker's exit status (a launcher's, for a launched run); None when it was never seen to exit."""
    launched: bool = False
    """Started by accelerate's launcher: each rank wrote its own record, merged into one result."""
    placed: dict[str, Any] | None = None
    """The result's ``placement``: where it ran."""
    lost: str | None = None
    """Why the scheduler lost the run before its worker could write a result (its node died, its task failed):
    the failed cell's message, naming the node; None otherwise."""
    lost_type: str = "RunLost"
    """error.type recorded with ``lost``."""


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
            try:
                if self.inplace:
                    self.stream.write("\r\033[K" + line + ("\n" if final else ""))
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()
            except OSError:  # the console is gone (a closed terminal: EIO until SIGHUP is handled); the run goes on
                pass


def say_best_effort(stream: TextIO, text: str) -> None:
    """Write ``text`` to the console and flush it, dropping a failure: the console's lines only report what the suite
    folder already records (results, ``suite.json``'s ``last_run``), so a console that went away must not change how
    the run ends. A closed terminal fails every write with EIO, and a run whose SIGHUP is ignored (started under
    `nohup` or `trap '' HUP`), or whose terminal closes just as it prints its last line, is still writing to it."""
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        pass


def worker_env(spec: Spec, base_env: Mapping[str, str], gpus: Sequence[str] | None = None) -> dict[str, str]:
    """The environment of a one-process worker: ``base_env`` with the worker pinned to one GPU unless device is cpu.

    TRL trainers refuse to run when they see several GPUs without a distributed launcher, and a suite
    measures one process on one device, so each worker sees exactly one: the first of ``gpus`` (the slot the
    runner gave this run, :mod:`bench.execution.devices`, as CUDA_VISIBLE_DEVICES entries); without ``gpus``,
    ``spec.gpus[0]``, else the first entry of an inherited ``CUDA_VISIBLE_DEVICES`` ("3,5" -> "3"), else "0".
    Indices in ``spec.gpus`` and the ones NVML counts are the ones nvidia-smi prints, so CUDA_DEVICE_ORDER defaults
    to PCI_BUS_ID with them (CUDA's own default order, fastest first, can differ on a mixed box); entries taken from
    an inherited CUDA_VISIBLE_DEVICES keep the inherited order. A cpu run's environment is left alone.
    """
    env = dict(base_env)
    if spec.device == "cpu":
        return env
    inherited = "CUDA_VISIBLE_DEVICES" in env and not spec.gpus
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(gpus[0])
        if not inherited:
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    elif spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(spec.gpus[0])
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    elif "CUDA_VISIBLE_DEVICES" in env:
        # An empty value hides every GPU on purpose; keep it empty rather than unhide device 0.
        env["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"].split(",")[0].strip()
    else:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that stop a suite run: Ctrl-C, a kill or a job scheduler's stop, and the terminal closing (SIGHUP,
which a terminal sends its session when it goes away). A run started under `nohup` (SIGHUP ignored) keeps ignoring
it; one started with `setsid` has no terminal to lose."""


class Stopper:
    """What an interrupt does to one suite run; the handlers run in the main thread, between its bytecodes.

    First SIGINT / SIGTERM / SIGHUP: remember it (the runner stops starting runs and cancels the queued ones) and
    send SIGTERM to every running worker's process group, then SIGKILL to those still there KILL_AFTER_S later.
    Second: SIGKILL every worker group, call ``on_exit_now`` (release the lock, say how to resume) and exit 130
    at once. The handler takes no lock (the main thread may hold it when the signal lands) and writes to the
    console only best-effort.

    SIGHUP means the terminal is gone: writing to it now fails (EIO), which would stop the runner half-way, so the
    standard output and error that were a terminal are pointed at /dev/null first. The run then ends as after a
    SIGTERM: the report of what finished, the lock released, and ``suite.json``'s ``last_run`` saying how to resume.
    """

    def __init__(self, stream: TextIO, on_exit_now: Callable[[], None] = lambda: None) -> None:
        self.stream, self.on_exit_now = stream, on_exit_now
        self.requested = threading.Event()
        self.signal_name: str | None = None
        self._workers: dict[int, subprocess.Popen] = {}
        self._previous: dict[int, Any] = {}
        self._terminal_fds: list[int] = []

    def install(self) -> None:
        """Take over SIGINT, SIGTERM and SIGHUP (only possible from the main thread; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._terminal_fds = [fd for fd in (1, 2) if _isatty(fd)]  # asked now: a hung-up terminal cannot be asked
        for signum in STOP_SIGNALS:
            if signum == getattr(signal, "SIGHUP", None) and signal.getsignal(signum) is signal.SIG_IGN:
                continue  # started under nohup: the user asked for the run to outlive the terminal
            self._previous[signum] = signal.signal(signum, self.handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if signum == getattr(signal, "SIGHUP", None):
            self._detach_terminal()
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

    def _detach_terminal(self) -> None:
        """Point the descriptors that were the (now closed) terminal at /dev/null, so later writes succeed unseen."""
        if not self._terminal_fds:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            for fd in self._terminal_fds:
                try:
                    os.dup2(null, fd)
                except OSError:
                    continue
        finally:
            os.close(null)
        self._terminal_fds = []

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


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


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


def killed_from_outside(status: int) -> bool:
    """A one-process worker's exit status says SIGKILL (Popen: -9). The runner sends SIGKILL only after a stop
    request (:class:`Stopper`) or while failing itself (:func:`_stop_group`), so otherwise someone else sent it:
    the Linux OOM killer, which picks the process using most memory (or a person with kill -9)."""
    return status == -signal.SIGKILL


def wait_or_cancel(futures: list[Future], stopper: Stopper, on_cancel: Callable[[], None] = lambda: None) -> None:
    """Wait for every future; once a stop is requested (or one run's thread raised: a runner bug), cancel the ones not
    started, call ``on_cancel`` (the Ray scheduler cancels its tasks there) and wait for the running ones, whose
    workers are being stopped. A runner bug is raised after cancelling the rest."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=0.5)
        failed = [f for f in done if not f.cancelled() and f.exception() is not None]
        if stopper.requested.is_set() or failed:
            for future in pending:
                future.cancel()
            on_cancel()
        if failed:
            wait(pending)
            failed[0].result()
