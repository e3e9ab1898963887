"""Running the real `bench` command in a subprocess, as a user would (shared by the end-to-end tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_bench(*args: str, cache_dir: Path | None = None, timeout: int = 600,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m bench ARGS` with its own artefact cache (so tests never share or pollute ~/.cache)."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["BENCH_CACHE_DIR"] = str(cache_dir)
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)


def run_quick_suite(out: Path, *overrides: str, cache_dir: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`bench run --preset cpu-quick --out OUT OVERRIDES...`."""
    return run_bench("run", "--preset", "cpu-quick", "--out", str(out), *overrides, cache_dir=cache_dir,
                     timeout=timeout)
