"""The suite folder: its lock (one writer at a time, a stale lock from a dead process taken over), the checks before
a run writes into it (a folder from another spec is refused, ``--resume`` needs the same spec), ``suite.json``'s
commands, and the ``latest`` link beside it."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from bench.config.outputs import enclosing_suite
from bench.config.paths import inside, shown
from bench.errors import UserError
from bench.execution.plan import PlannedRun, make_plan
from bench.results import SUITE_FILE, is_run_id, write_json_atomic
from bench.config.spec import Spec

LOCK_FILE = ".lock"
LATEST = "latest"
"""The link beside a suite folder to the newest one (REPORTS_DIR/latest; ``bench run --resume`` without --out)."""

def default_out_dir(spec: Spec, reports_dir: Path) -> Path:
    """reports/<preset>-<UTC timestamp>: one folder directly inside ``reports_dir`` (the spec's ``name`` is one safe
    file name, bench.config.rules.validate_name; checked again here, since the folder is made from it)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = reports_dir / f"{spec.name}-{stamp}"
    if not is_run_id(folder.name) or folder.name.startswith(".") or folder.parent != reports_dir:
        raise UserError(f"the spec's name {ascii(spec.name)} does not make one folder name inside "
                        f"'{shown(reports_dir)}'; give name ASCII letters, digits and . _ + - only")
    return folder


def check_run_folders(suite_dir: Path, runs: list[PlannedRun]) -> None:
    """Every run folder the suite will create (SUITE_DIR/runs/<run id>) is one folder inside ``suite_dir``: a run
    id is one file name (bench.results.is_run_id), and ``runs/`` or a run folder that already exists does not lead
    out of the suite folder (a symbolic link). UserError (one line) before anything is created otherwise."""
    root = suite_dir / "runs"
    for path in [root] + [root / run.run_id for run in runs]:
        if path != root and not is_run_id(path.name):
            raise UserError(f"run id {ascii(path.name)[:100]} is not one folder name; it cannot be written inside "
                            f"'{shown(suite_dir)}'")
        if (path.exists() or path.is_symlink()) and not (path.is_dir() and not path.is_symlink()
                                                         and inside(path, suite_dir)):
            raise UserError(f"'{shown(path)}' is not a plain folder inside the suite folder (a link or a file); "
                            f"the suite writes only inside '{shown(suite_dir)}': move it away or choose another --out")


DEEPEST_IN_RUN = 128
"""Bytes a run folder's deepest path adds below it, kept free: its saved model (model/), trainer checkpoints and
the temporary names of atomic writes (.NAME.XXXXXXXX.tmp) are all shorter."""


def check_path_length(suite_dir: Path, runs: list[PlannedRun]) -> None:
    """The deepest file the run writes (SUITE_DIR/runs/<longest run id>/ plus :data:`DEEPEST_IN_RUN`) is a path the
    filesystem takes (PATH_MAX, 4,096 bytes on Linux); UserError (one line) with both lengths before anything is
    made, instead of a crash at the first write after runs/ and suite.json exist."""
    folder = Path(os.path.abspath(suite_dir))
    longest = max((len(run.run_id.encode("utf-8", "surrogateescape")) for run in runs), default=0)
    deepest = len(os.fsencode(folder)) + len(b"/runs/") + longest + 1 + DEEPEST_IN_RUN
    base = folder
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        limit = os.pathconf(base, "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    if deepest >= limit:
        raise UserError(f"output folder '{shown(suite_dir)}' is too long a path: the run writes files up to "
                        f"{deepest:,} bytes long under it, and the filesystem takes {limit - 1:,}; give a shorter "
                        f"--out (at most {max(limit - 1 - (deepest - len(os.fsencode(folder))), 1):,} bytes)")


def check_suite_dir(spec: Spec, suite_dir: Path, resume: bool) -> None:
    """Refuse a folder that cannot take this run: a path too long for its deepest file; one inside another suite
    folder; on --resume, one that is not a suite folder or was made with a different spec; otherwise one that
    already holds something (a lock file alone does not count)."""
    check_path_length(suite_dir, make_plan(spec))
    suite_file = suite_dir / SUITE_FILE
    outer = enclosing_suite(suite_dir.parent)
    if outer is not None:  # e.g. --out reports/a/runs/new: the other suite would carry a stranger in its folders
        raise UserError(f"output folder '{shown(suite_dir)}' lies inside the suite folder '{shown(outer)}'; a suite "
                        f"folder is written beside others, not into one: choose another --out")
    check_run_folders(suite_dir, make_plan(spec))
    if resume:
        if not suite_file.is_file():
            raise UserError(f"--resume: '{suite_dir}' is not a suite run folder (no {SUITE_FILE}); "
                            f"give --out a folder written by `bench run`, or drop --resume")
        try:
            old = json.loads(suite_file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise UserError(f"--resume: '{suite_file}' is unreadable ({type(exc).__name__}); "
                            f"start a new --out folder") from None
        old_spec = old.get("spec") if isinstance(old, dict) else None
        old_spec = backfilled(old_spec, Spec().to_dict()) if isinstance(old_spec, dict) else {}
        if old_spec != spec.to_dict():
            changed = sorted(_changed_keys(old_spec, spec.to_dict()))
            raise UserError(f"--resume: the spec differs from the one '{suite_dir}' was run with "
                            f"({', '.join(changed[:5]) or 'unknown keys'}); use the same preset and overrides, "
                            f"or a new --out folder")
    elif suite_dir.exists() and any(p.name != LOCK_FILE for p in suite_dir.iterdir()):
        raise UserError(f"output folder '{suite_dir}' already exists and is not empty; pass --resume to continue it "
                        f"or choose another --out")


def backfilled(recorded: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``recorded`` (a suite.json's spec) with every key it lacks taken from ``defaults`` (a default Spec's), at
    every depth. A folder written before a key existed ran as that key's default says (a new key defaults to the
    old behaviour: the local scheduler, GRPO's successors off), so --resume must not call the missing key a change."""
    out = dict(recorded)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = backfilled(out[key], value)
    return out


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
def suite_made_link(link: Path) -> bool:
    """Whether ``link`` is a ``latest`` link the suite made: a symbolic link whose target is one name (a sibling
    folder, as :func:`_point_latest` writes it) that is a suite folder, or that no longer exists (a deleted one)."""
    if not link.is_symlink():
        return False
    try:
        target = os.readlink(link)
    except OSError:
        return False
    if not is_run_id(target) or target.startswith("."):
        return False
    sibling = link.parent / target
    return not os.path.lexists(sibling) or (sibling.is_dir() and not sibling.is_symlink()
                                            and (sibling / SUITE_FILE).is_file())


def _point_latest(suite_dir: Path, stream: TextIO | None = None) -> bool:
    """<parent>/latest -> this suite folder (a relative symlink, replaced atomically); True when it was pointed.

    Only a ``latest`` the suite made (:func:`suite_made_link`) is replaced: a file, a folder or a link of the
    user's by that name is left as it is, and one line on ``stream`` (default stderr) says so. The temporary link
    gets a fresh name (nothing that exists is ever removed to make room for it).
    """
    link = suite_dir.parent / LATEST
    if os.path.lexists(link) and not suite_made_link(link):
        kind = ("a link the suite did not make" if link.is_symlink() else "a folder" if link.is_dir() else "a file")
        _note(stream, f"bench: note: '{shown(link)}' is {kind}, so it was left as it is and does not point to this "
                      f"suite folder; --resume needs --out {shown(suite_dir)}")
        return False
    for attempt in range(100):
        tmp = suite_dir.parent / f".latest.{os.getpid()}.{attempt}"
        try:
            tmp.symlink_to(suite_dir.name)
        except FileExistsError:
            continue  # someone's file of that name: never ours to remove
        except OSError:
            return False
        try:
            if os.path.lexists(link) and not suite_made_link(link):  # appeared meanwhile: leave it
                tmp.unlink()
                return False
            os.replace(tmp, link)
            return True
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass
            return False
    return False


def _note(stream: TextIO | None, line: str) -> None:
    try:
        out = stream or sys.stderr
        out.write(line + "\n")
        out.flush()
    except (OSError, ValueError):
        pass
