"""A real full disk: a suite folder on a small tmpfs that fills up while the suite runs.

The simulated test (tests/test_interrupts.py) raises ENOSPC from the runner; this one lets the kernel say it. The
suite writes to a tmpfs sized so that preflight's free-space estimate passes; once the warm start has finished,
a filler file takes every free byte, and the method runs that follow cannot write. The promises: exit status 1,
the last line names the full disk and gives the --resume command, no traceback on the console, and the warm
start's finished result is still whole. Mounting needs root (CAP_SYS_ADMIN); elsewhere the test is skipped and
the simulated test still runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

TMPFS_SIZE = "160m"
"""Large enough for preflight's estimate of a short cpu-quick suite, small enough to fill in a moment."""


@pytest.fixture
def small_disk(tmp_path: Path):
    """A freshly mounted tmpfs of TMPFS_SIZE, unmounted afterwards; skips where mounting is not allowed."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the simulated full-disk test covers the code path")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def _fill(folder: Path) -> None:
    """Write into ``folder`` until the filesystem refuses (ENOSPC)."""
    chunk = b"\0" * (1 << 20)
    with open(folder / "filler.bin", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError:
            pass
    # Small writes still fit into the last partial block; take those bytes too.
    with open(folder / "filler-small.bin", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 512)
        except OSError:
            pass


def test_a_disk_that_fills_during_the_run_ends_in_one_line_and_keeps_finished_results(small_disk, tmp_path):
    out = small_disk / "suite"
    env = dict(os.environ, BENCH_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    overrides = ["warm_start.steps=5", "train.steps=4", "methods.ppo.enabled=false", "methods.dpo.enabled=false",
                 "methods.ppo_verifier.enabled=false"]
    console = tmp_path / "console.txt"
    with console.open("w") as stream:
        suite = subprocess.Popen([sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out),
                                  *overrides], stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        warm_result = out / "runs" / "warm_start" / "result.json"
        deadline = time.monotonic() + 300
        while not warm_result.is_file() and suite.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert warm_result.is_file(), console.read_text()[-2000:]
        _fill(small_disk)
        code = suite.wait(timeout=300)
    lines = console.read_text().strip().splitlines()
    assert code == 1, lines[-5:]
    assert lines[-1].startswith("bench: error: no space left on the disk holding"), lines[-5:]
    assert "--resume" in lines[-1]
    assert not any("Traceback" in line for line in lines)
    assert json.loads(warm_result.read_text())["status"] == "ok"  # written before the disk filled: still whole
