"""The suite folder: its lock (one writer at a time, a stale lock from a dead process taken over), the checks before
a run writes into it (a folder from another spec is refused, ``--resume`` needs the same spec), ``suite.json``'s
commands, and the ``latest`` link beside it."""

from __future__ import annotations

import json
import os
import shlex
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from bench.errors import UserError
from bench.execution.plan import PlannedRun
from bench.results import write_json_atomic
from bench.config.spec import Spec

SUITE_FILE = "suite.json"
LOCK_FILE = ".lock"
def default_out_dir(spec: Spec, reports_dir: Path) -> Path:
    """reports/<preset>-<UTC timestamp>."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return reports_dir / f"{spec.name}-{stamp}"


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
