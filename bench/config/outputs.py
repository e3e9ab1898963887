"""Where a command may write, checked before any work: a folder or file it writes can be written, replacing only
what the suite made, and never lands inside a suite folder it is not.

bench.config.paths says what a path *is*; this module says whether a command may write there. ``bench report``,
``bench score``, ``bench compare`` and ``bench data --export`` run these checks on their outputs before they read a
result (so a read-only folder is one line, not a traceback after the figures were drawn), and
:func:`write_failure` turns a write that fails anyway (a disk that fills up half-way) into one line too.

May import: the contracts (``bench.errors``, ``bench.results``) and bench.config.paths only; no torch.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

from bench.config.paths import shown
from bench.errors import UserError

WRITE_ERRNOS = {errno.EROFS: 2, errno.EACCES: 2, errno.EPERM: 2, errno.ENAMETOOLONG: 2, errno.ENOSPC: 1,
                errno.EDQUOT: 1, errno.EIO: 1}
"""A failed write that is the machine's, not the suite's (a read-only or full disk, no permission, a console gone),
and the exit status it ends with: 2 for a place the user cannot write (a mistake, nothing useful written), 1 for a
disk that filled up or failed on the way (as a full disk during `bench run`)."""


def _nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing ancestor (where a new path would be created)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def write_problem(path: Path) -> str | None:
    """Why nothing can be created in or at ``path`` (None when it can): the folder that would hold the writes (the
    path, or its nearest existing ancestor for a path still to create) is on a read-only filesystem or is not
    writable by this user. ``os.access`` answers for root too on a read-only filesystem."""
    base = _nearest_existing(Path(path))
    folder = base if base.is_dir() else base.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "is on a read-only filesystem"
    except OSError:
        pass  # the folder cannot be inspected: os.access below answers
    if not os.access(folder, os.W_OK | os.X_OK):
        return "cannot be written (permission denied)" if folder == path else (
            f"cannot be created: '{shown(folder)}' cannot be written (permission denied)")
    return None


def check_writable(path: Path, what: str, hint: str) -> Path:
    """``path`` (a folder or file to write, existing or not), or a UserError (one line) from :func:`write_problem`."""
    problem = write_problem(path)
    if problem:
        raise UserError(f"{what} '{shown(path)}' {problem}; {hint}")
    return Path(path)


def enclosing_suite(path: Path) -> Path | None:
    """The suite folder ``path`` lies in or is (the nearest folder, links followed, holding suite.json); None."""
    from bench.results import SUITE_FILE

    here = Path(os.path.abspath(path))
    try:
        here = here.resolve()
    except (OSError, RuntimeError):
        pass
    for folder in [here, *here.parents]:
        if (folder / SUITE_FILE).is_file():
            return folder
    return None


def check_fresh_folder(path: Path, what: str, hint: str, ours: Callable[[Path], bool] | None = None) -> Path:
    """``path`` as a folder a command may fill: new, empty, or one it wrote before (``ours``); a UserError (one
    line) otherwise, naming what is there. Files it did not make are never replaced."""
    path = Path(path)
    if not path.is_dir():
        return path  # a new folder (bench.config.paths.check_path has refused a file, device or bad link)
    try:
        entries = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        raise UserError(f"{what} '{shown(path)}' cannot be listed ({exc.strerror}); {hint}") from None
    if not entries or (ours is not None and ours(path)):
        return path
    shown_entries = ", ".join(shown(e) for e in entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3
                                                                else "")
    raise UserError(f"{what} '{shown(path)}' already holds {shown_entries}, which this command did not write and "
                    f"would not replace; {hint}")


def write_failure(exc: OSError) -> tuple[str, int] | None:
    """(one-line message, exit status) for a write the machine refused (:data:`WRITE_ERRNOS`); None for any other
    error, which is the suite's own and keeps its traceback."""
    status = WRITE_ERRNOS.get(exc.errno or -1)
    if status is None:
        return None
    where = f"'{shown(exc.filename)}'" if exc.filename else "the output (standard output or a file)"
    advice = ("free space there, or write elsewhere" if status == 1
              else "give a shorter path (e.g. a folder under /tmp)" if exc.errno == errno.ENAMETOOLONG
              else "give a folder you can write to (e.g. under /tmp)")
    return f"cannot write {where} ({exc.strerror or os.strerror(exc.errno or 0)}); {advice}", status
