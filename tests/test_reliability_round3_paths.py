"""Paths the run is given, by the command line or the environment, checked before anything is made.

- a working folder that was deleted is one line (exit 2) before any import resolves a path;
- an --out whose deepest file would be too long a path for the filesystem is one line before anything is made;
- BENCH_MODEL_CACHE, BENCH_CACHE_DIR and XDG_CACHE_HOME get the check --cache gets (a file is not a folder).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
           shell_prefix: str = "") -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                **(env or {})}
    if shell_prefix:
        command = shell_prefix + " exec " + " ".join(f"'{a}'" for a in (sys.executable, "-m", "bench", *args))
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=full_env, timeout=120)
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, env=full_env,
                          timeout=120, cwd=cwd or REPO)


def _one_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args", [("run", "--preset", "cpu-quick", "--out", "/tmp/never-made"),
                                  ("presets",), ("report", "x")])
def test_a_deleted_working_folder_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = _bench(*args, shell_prefix=f"cd '{gone}' && rmdir '{gone}' &&")
    _one_line(proc, "current folder no longer exists", "cd to an existing folder")
    assert not Path("/tmp/never-made").exists()


def _long_path(root: Path, length: int) -> str:
    path = str(root / "p")
    while len(path) < length - 210:
        path += "/" + "d" * 200
    return path + "/" + "e" * max(1, length - len(path) - 1)


@pytest.mark.parametrize("length", [4094, 4059, 3990])
def test_an_out_too_long_for_the_deepest_file_is_one_line_before_anything_is_made(tmp_path: Path,
                                                                                   length: int) -> None:
    out = _long_path(tmp_path, length)
    assert len(out) == length
    proc = _bench("run", "--preset", "cpu-quick", "--out", out)
    _one_line(proc, "too long a path", "give a shorter --out")
    assert not (tmp_path / "p").exists()  # no runs/, no suite.json, no folder


def test_a_name_too_long_at_write_time_is_one_line() -> None:
    import errno

    from bench.config.outputs import write_failure

    message, status = write_failure(OSError(errno.ENAMETOOLONG, "File name too long", "/x/y"))
    assert status == 2 and "File name too long" in message and "shorter path" in message


@pytest.mark.parametrize("variable", ["BENCH_MODEL_CACHE", "BENCH_CACHE_DIR", "XDG_CACHE_HOME"])
@pytest.mark.parametrize("args", [("models", "fetch", "smollm2-135m"), ("models", "list"),
                                  ("run", "--preset", "cpu-quick", "--out", "OUT")])
def test_a_cache_folder_from_the_environment_gets_the_command_lines_check(tmp_path: Path, variable: str,
                                                                          args: tuple[str, ...]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    args = tuple(str(tmp_path / "out") if a == "OUT" else a for a in args)
    proc = _bench(*args, env={variable: str(a_file)})
    _one_line(proc, f"${variable}", "is a file, not a folder", f"set {variable} to a folder")
    assert not (tmp_path / "out").exists()


def test_preflight_checks_the_environment_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.config.loading import load_spec
    from bench.errors import UserError
    from bench.execution.preflight import preflight

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    monkeypatch.setenv("BENCH_CACHE_DIR", str(a_file))
    with pytest.raises(UserError, match=r"\$BENCH_CACHE_DIR .* is a file, not a folder"):
        preflight(load_spec("cpu-quick", []), tmp_path / "suite")
