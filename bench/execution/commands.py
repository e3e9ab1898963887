"""The command lines a user reruns: how this program was started, and the ``bench run ... --resume`` line that
continues a suite folder (printed by the runner and recorded in ``suite.json``)."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path


def resume_command(preset: str, suite_dir: Path, overrides: list[str]) -> str:
    """The command line that continues ``suite_dir`` with the same spec, runnable from any folder.

    The same preset (a preset file as an absolute path) and overrides rebuild the same spec, which --resume
    requires; the folder is absolute; the program is named the way this one was started.
    """
    preset_path = Path(preset)
    if (preset.endswith((".yaml", ".yml")) or "/" in preset) and preset_path.is_file():  # a file, as load_spec
        preset = str(preset_path.resolve())
    args = ["run", "--preset", preset, "--out", str(suite_dir.resolve()), "--resume", *overrides]
    return shlex.join([*bench_program(), *args])


def bench_program() -> list[str]:
    """`bench` when that is what runs here, the script's path when it is not on PATH, else `python -m bench`."""
    script = Path(sys.argv[0])
    if script.name != "bench":
        return [sys.executable, "-m", "bench"]
    found = shutil.which("bench")
    if found and Path(found).resolve() == script.resolve():
        return ["bench"]
    return [str(script.resolve())]
