"""Every path argument of every subcommand, fed the same bad paths and bad bytes.

Each case runs the real command line in-process (``bench.cli.main``) and checks the promise for a user mistake: exit
status 2, one line on stderr that starts ``bench: error:`` and says what the path is, no traceback, and nothing on
disk changed (the scratch folder is listed before and after, links included, and every file's bytes compared).
``bench.cli.PATH_ARGUMENTS`` is the table of path arguments; a test fails when the parser has a path argument the
table lacks, so a new option cannot skip the helper.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable

import pytest

from bench.cli import PATH_ARGUMENTS, build_parser, main

BAD_UTF8 = b'name: x\ndescription: "caf\xe9 \xff"\n'
"""A YAML preset in Latin-1, not UTF-8 (the bytes a non-UTF-8 editor writes)."""


def _scratch(root: Path) -> dict[str, str]:
    """Bad paths under ``root``, by name (each as the user would type it)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a-file").write_text("just a file\n")
    (root / "a-folder").mkdir()
    (root / "loop-a").symlink_to("loop-b")
    (root / "loop-b").symlink_to("loop-a")
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "latin1.yaml").write_bytes(BAD_UTF8)
    (root / "huge.yaml").write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    (root / "not-suite").mkdir()
    for name, text in (("empty-suite", "{}"), ("list-suite", "[]"), ("text-suite", "not json at all"),
                       ("latin1-suite", None)):
        folder = root / name
        folder.mkdir()
        if text is None:
            (folder / "suite.json").write_bytes(b'{"preset": "caf\xe9", "runs": []}')
        else:
            (folder / "suite.json").write_text(text)
    return {
        "a file": str(root / "a-file"),
        "a folder": str(root / "a-folder"),
        "/dev/null": os.devnull,
        "a symlink loop": str(root / "loop-a"),
        "a dangling symlink": str(root / "dangling"),
        "a missing path": str(root / "missing" / "deeper"),
        "a path through a file": str(root / "a-file" / "inside"),
        "a name that is not UTF-8": os.fsdecode(str(root).encode() + b"/bad-\xff-name"),
        "an empty path": "",
        "a NUL byte": str(root / "nul\0byte"),
        "a file that is not UTF-8": str(root / "latin1.yaml"),
        "a file over the size cap": str(root / "huge.yaml"),
        "a folder without suite.json": str(root / "not-suite"),
        "suite.json {}": str(root / "empty-suite"),
        "suite.json a list": str(root / "list-suite"),
        "suite.json not JSON": str(root / "text-suite"),
        "suite.json not UTF-8": str(root / "latin1-suite"),
    }


FINE: dict[str, set[str]] = {
    # What each kind accepts among the bad paths above (everything else must be refused).
    "file": set(),
    "preset": set(),
    "out-dir": {"a folder", "a missing path", "a folder without suite.json", "suite.json {}", "suite.json a list",
                "suite.json not JSON", "suite.json not UTF-8"},
    "out-file": {"a file", "a missing path", "a file that is not UTF-8", "a file over the size cap"},
    "suite-dir": set(),
    "file-or-dir": {"a folder", "a folder without suite.json", "a file over the size cap", "a file"},
    "model": set(),
}
"""A valid path for that kind is not a mistake: e.g. a missing folder is a fine --out. Some of them are still
refused by the command for another reason (``bench score`` of a folder that is no suite folder), and are left out
here because that is tested elsewhere."""
REFUSED_BY_COMMAND = {("compare", "out"): {"suite.json {}", "suite.json a list", "suite.json not JSON",
                                           "suite.json not UTF-8"}}
"""Bad paths that pass the kind's check but that the command refuses before writing (compare --out: a folder
holding a suite.json, well-formed or not, is a suite folder)."""


def _suite(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.json").write_text(json.dumps({"preset": "t", "runs": [], "spec": {}}))
    return folder


def _argv(command: str, attr: str, value: str, root: Path) -> list[str]:
    """A command line that is fine except for ``value`` in argument ``attr``."""
    good_a, good_b = _suite(root / "good-a"), _suite(root / "good-b")
    completions = root / "completions.jsonl"
    completions.write_text(json.dumps({"c": "#### 4", "g": "4"}) + "\n")
    new = str(root / "new-out")
    table: dict[tuple[str, str], Callable[[str], list[str]]] = {
        ("run", "preset"): lambda v: ["run", "--preset", v, "--dry-run"],
        ("run", "out"): lambda v: ["run", "--preset", "cpu-quick", "--out", v, "--dry-run"],
        ("run", "reports_dir"): lambda v: ["run", "--preset", "cpu-quick", "--reports-dir", v, "--dry-run"],
        ("run", "accelerate_config"): lambda v: ["run", "--preset", "cpu-quick", "--accelerate-config", v,
                                                 "--dry-run"],
        ("report", "run_dir"): lambda v: ["report", v],
        ("compare", "run_dirs"): lambda v: ["compare", v, str(good_a), "--out", new],
        ("compare", "out"): lambda v: ["compare", str(good_a), str(good_b), "--out", v],
        ("score", "file"): lambda v: ["score", v, "--completion-field", "c", "--gold-field", "g"],
        ("score", "verdicts"): lambda v: ["score", str(completions), "--completion-field", "c", "--gold-field", "g",
                                          "--verdicts", v],
        ("data", "preset"): lambda v: ["data", "--preset", v],
        ("data", "export"): lambda v: ["data", "--preset", "cpu-quick", "--export", v],
        ("tune", "preset"): lambda v: ["tune", "--preset", v, "--dry-run"],
        ("tune", "grid"): lambda v: ["tune", "--preset", "cpu-quick", "--grid", v, "--dry-run"],
        ("tune", "out"): lambda v: ["tune", "--preset", "cpu-quick", "--out", v, "--dry-run"],
        ("tune", "reports_dir"): lambda v: ["tune", "--preset", "cpu-quick", "--reports-dir", v, "--dry-run"],
        ("estimate", "model"): lambda v: ["estimate", "--model", v, "--method", "grpo"],
        ("estimate", "preset"): lambda v: ["estimate", "--time", "--preset", v, "--gpu-type", "h100"],
        ("estimate", "calibrate"): lambda v: ["estimate", "--time", "--preset", "cpu-quick", "--gpu-type", "h100",
                                              "--calibrate", v],
        ("models", "cache"): lambda v: ["models", "list", "--cache", v],
    }
    return table[(command, attr)](value)


def _listing(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): its type and, for a file, its bytes; a link, its target."""
    out: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", path.read_bytes())
    return out


CASES = [(command, attr, kind) for command, entries in PATH_ARGUMENTS.items() for attr, kind, _ in entries]
NAMES = ["a file", "a folder", "/dev/null", "a symlink loop", "a dangling symlink", "a missing path",
         "a path through a file", "a name that is not UTF-8", "an empty path", "a NUL byte", "a file that is not UTF-8",
         "a file over the size cap", "a folder without suite.json", "suite.json {}", "suite.json a list",
         "suite.json not JSON", "suite.json not UTF-8"]


@pytest.mark.parametrize("command, attr, kind", CASES, ids=[f"{c}-{a}" for c, a, _ in CASES])
def test_every_path_argument_refuses_every_bad_path_in_one_line(
        command: str, attr: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BENCH_MODEL_CACHE", str(tmp_path / "model-cache"))
    paths = _scratch(tmp_path / "scratch")
    failures = []
    for name in NAMES:
        if name in FINE[kind] and name not in REFUSED_BY_COMMAND.get((command, attr), set()):
            continue
        value = paths[name]
        argv = _argv(command, attr, value, tmp_path / "work")
        before = _listing(tmp_path)
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse itself (not expected for a path)
            code = exc.code
        except BaseException as exc:  # noqa: BLE001 - a traceback is exactly the failure looked for
            failures.append(f"{name}: raised {type(exc).__name__}: {exc}")
            continue
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        if code != 2 or len(lines) != 1 or not lines[0].startswith("bench: error:") or "Traceback" in err:
            failures.append(f"{name}: exit {code}, stderr {err.strip()[-300:]!r}")
        elif _listing(tmp_path) != before:
            failures.append(f"{name}: the folder changed: {sorted(set(_listing(tmp_path)) ^ set(before))}")
    assert not failures, "\n".join([f"{command} {attr} ({kind}):"] + failures)


@pytest.mark.parametrize("name, reason", [
    ("a folder", "is a folder, not a regular file"),
    ("/dev/null", "is a device, not a regular file"),
    ("a dangling symlink", "which does not exist"),
    ("a symlink loop", "is a symbolic link loop"),
    ("a file that is not UTF-8", "is not UTF-8 text (byte 0xe9 on line 2"),
])
def test_preset_messages_say_what_the_path_is(name: str, reason: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """Item 10: a folder or /dev/null as --preset no longer reads "does not exist"."""
    paths = _scratch(tmp_path)
    assert main(["run", "--preset", paths[name], "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert reason in err and "does not exist" not in err.replace("which does not exist", ""), err


def test_a_dangling_out_says_it_is_a_link_to_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Item 10: a dangling-symlink --out read "File exists" (from mkdir); now it says what it is, before the plan."""
    paths = _scratch(tmp_path)
    assert main(["run", "--preset", "cpu-quick", "--out", paths["a dangling symlink"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a symbolic link to" in err[0] and "which does not exist" in err[0], err
    assert "File exists" not in err[0]


def test_a_bare_name_that_is_a_folder_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--preset myfolder`` (no slash) named an unknown preset; a path by that name is checked as the path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myfolder").mkdir()
    assert main(["run", "--preset", "myfolder", "--dry-run"]) == 2
    assert "'myfolder' is a folder, not a regular file" in capsys.readouterr().err


def _path_like(action: argparse.Action) -> bool:
    if action.choices:  # one of a fixed set of words (--backend vllm) is never a path, whatever its help says
        return False
    words = f"{action.dest} {action.metavar or ''} {action.help or ''}".lower()
    return any(w in words for w in ("file", "folder", "dir", "path", "preset", "cache")) and action.dest not in (
        "help", "overrides", "settings", "dry_run", "resume", "completion_field", "gold_field", "json", "name",
        "action", "launcher", "methods", "mode", "num_processes", "method", "seeds", "gpus", "offload",
        "zero_stage", "gpu_memory")


def test_every_path_argument_of_every_subcommand_is_in_the_table() -> None:
    """A new path option must go through the helper: every argument that names a file or folder is in
    PATH_ARGUMENTS (its dest, for its subcommand)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for command, subparser in sub.choices.items():
        listed = {attr for attr, _, _ in PATH_ARGUMENTS.get(command, ())}
        for action in subparser._actions:
            if _path_like(action) and action.dest not in listed:
                missing.append(f"{command} {action.dest}")
    assert not missing, f"path arguments missing from bench.cli.PATH_ARGUMENTS: {missing}"
