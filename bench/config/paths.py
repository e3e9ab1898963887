"""Every path a command is given, checked by one helper before anything is read or written.

:func:`check_path` is what the command line (``bench.cli``) runs on each path argument of each subcommand, and what
the modules behind them (preset loading, ``bench report``, ``bench compare``, ``bench score``) run again on the paths
they are handed, so a bad path is one line (a :class:`~bench.errors.UserError`, exit status 2) whoever calls. It
refuses, with a message that says what the path *is*: an empty path, a NUL byte, a name that is not UTF-8, a
symbolic-link loop, a link to nothing, a path through a file, a folder where a file is wanted and the reverse,
a device, FIFO or socket (``/dev/null``) where a regular file or a folder is wanted, and a path to create whose new
names hold a control character (a newline, an escape). :func:`read_text` reads a
file the user gave as bounded, strictly decoded UTF-8 text, the error naming the line and the byte.

May import: the contracts (``bench.errors``, ``bench.results``) only; no torch.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from pathlib import Path

from bench.errors import UserError

KINDS = ("file", "dir", "file-or-dir", "out-dir", "out-file")
"""What a path must be: an existing regular ``file``; an existing folder (``dir``); either; a folder to write
(``out-dir``: an existing folder, or a new one whose nearest existing ancestor is a folder); a file to write
(``out-file``: an existing regular file, replaced, or a new one)."""

_HINTS = {
    "file": "give an existing file",
    "dir": "give an existing folder",
    "file-or-dir": "give an existing file or folder",
    "out-dir": "give a new or existing folder",
    "out-file": "give a file path to write",
}


def shown(path: object) -> str:
    """A path as one line of text: control characters, and bytes that are not UTF-8, written as escapes."""
    text = str(path)
    return "".join(ch if ch.isprintable() and not 0xDC80 <= ord(ch) <= 0xDCFF else ascii(ch)[1:-1] for ch in text)


def _what_it_is(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file or folder"


def _stat_problem(path: Path) -> tuple[os.stat_result | None, str | None]:
    """(stat, None) for a path that exists; (None, None) for one that does not; (None, why) for one that cannot be
    looked at (a link loop, a link to nothing, a path through a file, no permission, a name too long)."""
    try:
        return path.stat(), None
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "is a symbolic link loop"
        if exc.errno == errno.ENOTDIR:
            return None, "runs through a file as if it were a folder"
        if exc.errno == errno.ENAMETOOLONG:
            return None, "has a name too long for the filesystem"
        if exc.errno == errno.EACCES:
            return None, "cannot be looked at (permission denied)"
        return None, f"cannot be looked at ({exc.strerror or type(exc).__name__})"
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return None, f"is a symbolic link to '{shown(target)}', which does not exist"
    # A dangling link higher up makes the path missing too; say which part is missing only when it helps.
    return None, None


def check_path(value: str | os.PathLike[str] | None, kind: str, what: str, hint: str | None = None,
               missing: str = "does not exist") -> Path:
    """``value`` as a Path, or a UserError (one line) saying why it cannot be used as ``kind`` (:data:`KINDS`).

    ``what`` names the argument in the message (``--out``, ``RUN_DIR``); ``hint`` replaces the default advice and
    ``missing`` the reason given for an input that does not exist. Nothing is created: an ``out-dir`` that does not
    exist yet is only checked to lie under a folder.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown path kind {kind!r}; one of {KINDS}")  # developer error
    advice = hint or _HINTS[kind]
    raw = os.fspath(value) if value is not None else ""
    if not raw:
        raise UserError(f"{what}: the path is empty; {advice}")
    name = shown(raw)

    def refuse(reason: str) -> UserError:
        return UserError(f"{what} '{name}' {reason}; {advice}")

    if "\0" in raw:
        raise refuse("contains a NUL byte")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = os.fsencode(raw[exc.start:exc.end])[:1]
        raise refuse(f"is not valid UTF-8 (byte 0x{bad.hex() if bad else '??'} in its name)") from None
    path = Path(raw).expanduser()
    info, problem = _stat_problem(path)
    if problem:
        raise refuse(problem)
    if info is not None:
        mode = info.st_mode
        if kind in ("file", "out-file") and not stat.S_ISREG(mode):
            raise refuse(f"is {_what_it_is(mode)}, not a regular file")
        if kind in ("dir", "out-dir") and not stat.S_ISDIR(mode):
            raise refuse(f"is {_what_it_is(mode)}, not a folder")
        if kind == "file-or-dir" and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise refuse(f"is {_what_it_is(mode)}, not a regular file or a folder")
        if kind in ("file", "file-or-dir") and not os.access(path, os.R_OK):
            raise refuse("cannot be read (permission denied)")
        return path
    if kind in ("file", "dir", "file-or-dir"):
        raise refuse(missing)
    # A path to create: its nearest existing ancestor must be a folder (not a file, a device or a dangling link).
    parent = path.parent
    while True:
        info, problem = _stat_problem(parent)
        if problem:
            raise refuse(f"lies under '{shown(parent)}', which {problem}")
        if info is not None:
            break
        if parent == parent.parent:
            break
        parent = parent.parent
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise refuse(f"lies under '{shown(parent)}', which is {_what_it_is(info.st_mode)}, not a folder")
    if any(len(os.fsencode(part)) > 255 for part in path.parts):
        raise refuse("has a name too long for the filesystem (over 255 bytes)")
    created = path.parts[len(parent.parts):] if info is not None else path.parts
    bad = next((ch for part in created for ch in part if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:  # a folder named 'x\n' is made, then shown, resumed and removed by hand with difficulty
        raise refuse(f"would create a name holding a control character (0x{ord(bad):02x})")
    return path


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` (resolved, links followed) lies in ``folder`` (resolved) or is it."""
    try:
        path.resolve().relative_to(folder.resolve())
    except (ValueError, RuntimeError, OSError):
        return False
    return True


def read_text(path: Path, what: str, limit: int | None = None) -> str:
    """The file as UTF-8 text (a BOM accepted), at most ``limit`` bytes; a UserError naming the file, and for
    text that is not UTF-8 the line and the byte, otherwise."""
    path = check_path(path, "file", what)
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1 if limit is not None else -1)
    except OSError as exc:
        raise UserError(f"{what} '{shown(path)}' cannot be read ({exc.strerror or type(exc).__name__})") from None
    if limit is not None and len(data) > limit:
        raise UserError(f"{what} '{shown(path)}' is larger than {limit:,} bytes; this is not a file the suite "
                        f"expects there")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} '{shown(path)}' is not UTF-8 text ({_bad_byte(data, exc)}); re-save it as UTF-8"
                        ) from None


def _bad_byte(data: bytes, exc: UnicodeDecodeError, first_line: int = 1) -> str:
    line = first_line + data.count(b"\n", 0, exc.start)
    column = exc.start - data.rfind(b"\n", 0, exc.start)
    return f"byte 0x{data[exc.start]:02x} on line {line}, column {column}"


def decode_text(data: bytes, where: str, first_line: int = 1) -> str:
    """``data`` (the text of ``where`` from line ``first_line`` on) decoded as UTF-8 (a BOM accepted), or a
    UserError: '<where>:<line>: not UTF-8 text (byte 0x.. ...)'."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise UserError(f"{where}:{line}: not UTF-8 text ({_bad_byte(data, exc, first_line)}); re-save it as UTF-8"
                        ) from None


def check_suite_folder(value: str | os.PathLike[str] | None, what: str) -> Path:
    """``value`` as the Path of a suite folder, or a UserError (one line): not a folder (:func:`check_path`), no
    suite.json, or one whose shape is not what `bench run` writes (bench.results.suite_problems: ``{}``, a list,
    not JSON). ``bench report``, ``bench score`` and ``bench compare`` run it before they write anything."""
    from bench.results import read_suite_file

    hint = "give a folder written by `bench run`, e.g. reports/latest"
    path = check_path(value, "dir", what, hint=hint, missing="is not a suite run folder (it does not exist)")
    _, problems = read_suite_file(path)
    if problems:
        raise UserError(f"{what} '{shown(path)}' is not a suite run folder ({problems[0]}); {hint}")
    return path


CACHE_VARIABLES = ("BENCH_MODEL_CACHE", "BENCH_CACHE_DIR", "XDG_CACHE_HOME")
"""Environment variables naming a folder the suite writes its caches into (bench.model.fetch.model_cache,
bench.model.loading.cache_root): each gets the check the command line's --cache gets."""


def check_environment_paths(environ: dict[str, str] | None = None) -> None:
    """Every set :data:`CACHE_VARIABLES` is a folder to write (:func:`check_path`, ``out-dir``), or a UserError
    (one line naming the variable): a file there fails minutes later, inside a fetch or a warm start."""
    environ = os.environ if environ is None else environ
    for name in CACHE_VARIABLES:
        value = environ.get(name)
        if value:
            check_path(value, "out-dir", f"${name}", hint=f"set {name} to a folder (new or existing), or unset it")
