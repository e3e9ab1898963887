"""How a worker stops: SIGTERM (what the runner sends its process group on an interrupt) and PARENT_DIED (the
runner died) raise :class:`Interrupted` in the main thread, once, while the run is armed.

A worker never outlives its suite: SIGHUP reaches it when its parent dies (Linux parent-death signal, and a thread
that polls the parent PID on every platform), and one that is still running ORPHAN_GRACE_S later exits hard.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

ORPHAN_GRACE_S = 60.0
"""After its parent died, a worker that has not finished recording the interruption by then exits hard."""


class Interrupted(BaseException):
    """Raised in the worker's main thread by SIGTERM (the suite was stopped) or PARENT_DIED (the suite process
    died); its text is the signal's name.

    A BaseException, so that the ``except Exception`` of libraries does not swallow it on its way to
    :func:`bench.execution.worker.run`.
    """


_interrupts: dict[str, Any] = {"armed": False, "received": False, "parent": None}
"""armed: a stop signal raises :class:`Interrupted` (cleared while the result is written); received: one did;
parent: the runner's PID, when known."""


def disarm() -> None:
    """From here on a stop signal is ignored: the result (or the failure record) is being written."""
    _interrupts["armed"] = False


PARENT_DIED = getattr(signal, "SIGHUP", signal.SIGTERM)
"""The signal a worker gets when its runner dies (the kernel's parent-death signal, or its own watch thread):
handled like SIGTERM, but it says what happened, so the result can tell a dead suite from a stopped one."""


def install_stop_handlers(parent_pid: int | None, runner_pid: int | None = None) -> None:
    """SIGTERM records the run as interrupted; the death of ``parent_pid`` (the runner) delivers PARENT_DIED,
    which does the same with its own message.

    Two ways to notice the parent died, because either alone can miss: Linux's parent-death signal is exact but
    fires when the *thread* that started the worker ends (the runner's threads live until their runs end), and
    polling ``os.getppid()`` once a second works everywhere.

    A rank started by a launcher (bench.execution.launch) passes the launcher as ``parent_pid`` (the runner stops it) and
    the runner as ``runner_pid``, whose death the same thread notices.
    """
    _interrupts["armed"], _interrupts["parent"] = True, runner_pid or parent_pid
    signal.signal(signal.SIGTERM, _on_stop_signal)
    signal.signal(PARENT_DIED, _on_stop_signal)
    if parent_pid is None:
        return
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the signal was set up: nothing to run for
        raise SystemExit(f"bench.execution.worker: the suite process (PID {parent_pid}) is gone; not starting the run")
    threading.Thread(target=_watch_parent, args=(parent_pid, runner_pid), name="parent-watch", daemon=True).start()


def _on_stop_signal(signum: int, frame: Any) -> None:
    """The first stop signal while training raises :class:`Interrupted`; later ones (or one while the result is
    being written) are ignored: the worker is already on its way out."""
    if _interrupts["armed"] and not _interrupts["received"]:
        _interrupts["received"] = True
        raise Interrupted(signal.Signals(signum).name)


def interruption_message(exc: BaseException) -> str:
    """Why the run stopped: the runner died (PARENT_DIED), or the suite was interrupted (SIGTERM from the runner)."""
    if isinstance(exc, Interrupted) and str(exc) == PARENT_DIED.name:
        return (f"the suite process (PID {_interrupts['parent']}) died during this run and the worker stopped "
                f"itself; `bench run ... --resume` re-runs it")
    received = f" (the worker received {exc})" if isinstance(exc, Interrupted) and str(exc) else ""
    return f"the suite was interrupted during this run{received}; `bench run ... --resume` re-runs it"


def _set_parent_death_signal() -> None:
    """prctl(PR_SET_PDEATHSIG, PARENT_DIED) on Linux; elsewhere nothing (the polling thread covers it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(PARENT_DIED), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch_parent(parent_pid: int, runner_pid: int | None = None) -> None:
    """Once a second: if the runner is gone (this process was re-parented, or for a rank: the launcher or the
    runner is gone), stop like on an interrupt; if that has not ended the process within ORPHAN_GRACE_S (stuck in
    native code), exit hard."""
    while os.getppid() == parent_pid and (runner_pid is None or _alive(runner_pid)):
        time.sleep(1.0)
    os.kill(os.getpid(), PARENT_DIED)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(143)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (killed, not yet reaped by its parent) has stopped."""
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: gone
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
