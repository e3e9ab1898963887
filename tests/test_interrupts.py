"""Stopping a real `bench run`: SIGINT / SIGTERM during a method run, and the death of the suite process.

Each test starts the real command on a shortened cpu-quick (a 5-step warm start, then GRPO runs) in its own
session, as a terminal or a job scheduler would run it, waits until a method run is under way, signals it, and
checks the promises: exit status 130, no worker left behind, the stopped run recorded as interrupted, the report
written, and the printed --resume command finishing the suite with exit status 0.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

OVERRIDES = ["warm_start.steps=5", "train.steps=12", "methods.ppo.enabled=false", "methods.dpo.enabled=false",
             "methods.ppo_verifier.enabled=false"]
"""A warm start and two GRPO runs (TRL's and the suite engine's); 12 steps keep a method run busy for seconds."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One private artefact cache for the module (the tiny model and tokenizer are built once)."""
    return dict(os.environ, BENCH_CACHE_DIR=str(tmp_path_factory.mktemp("cache")), HF_HUB_OFFLINE="1",
                HF_DATASETS_OFFLINE="1")


class Suite:
    """A `bench run` in its own session, its console (stderr) captured in a file."""

    def __init__(self, command: list[str], env: dict[str, str], console: Path) -> None:
        self.console = console
        with open(console, "w") as handle:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=handle, env=env,
                                            start_new_session=True)

    def text(self) -> str:
        return self.console.read_text(errors="replace")

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, f"bench exited ({self.process.returncode}) before {what}:\n" \
                                                f"{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} after {timeout:.0f}s:\n{self.text()[-3000:]}"
            time.sleep(0.1)

    def workers(self) -> list[int]:
        """PIDs of the worker processes (and their children) this suite has started."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [child.pid for child in children if _is_worker(child)]

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"bench still running {timeout:.0f}s after the signal:\n{self.text()[-3000:]}")


def _is_worker(process: psutil.Process) -> bool:
    try:
        return "bench.execution.worker" in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def start(out: Path, env: dict[str, str], *extra: str, console: str = "console.txt") -> Suite:
    command = [sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out), *OVERRIDES, *extra]
    return Suite(command, env, out.parent / console)


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has stopped; only its exit status waits to be collected)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_gone(pids: list[int], within: float) -> None:
    deadline = time.monotonic() + within
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in pids if running(pid)]
    assert not left, f"worker processes still running: {left}"


def result(out: Path, run_id: str) -> dict | None:
    path = out / "runs" / run_id / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def resume_command(console: str) -> list[str]:
    lines = [line for line in console.splitlines() if line.startswith("resume with: ")]
    assert lines, f"no resume command printed:\n{console[-3000:]}"
    return shlex.split(lines[-1][len("resume with: "):])


def in_training(suite: Suite, run_id: str) -> Callable[[], bool]:
    """True once the run has reported a training step (its worker is past set-up, inside the trainer)."""
    return lambda: f"{run_id}: step " in suite.text()


def test_sigint_stops_the_suite_a_dead_runner_stops_its_worker_and_resume_completes(
        tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "suite"
    # 1. Ctrl-C while GRPO (TRL) trains.
    suite = start(out, env)
    suite.wait_for(in_training(suite, "grpo-s0"), "training step of grpo-s0")
    workers = suite.workers()
    assert workers, "no worker process found while grpo-s0 was training"
    suite.process.send_signal(signal.SIGINT)
    assert suite.finish() == 130, suite.text()[-3000:]
    assert_gone(workers, within=5)
    console = suite.text()
    stopped = result(out, "grpo-s0")
    assert stopped is not None and stopped["status"] == "failed", console[-3000:]
    assert stopped["error"]["type"] == "Interrupted"
    assert "interrupted" in stopped["error"]["message"]
    assert result(out, "grpo_engine-s0") is None  # queued: cancelled, never started
    assert result(out, "warm_start")["status"] == "ok"
    assert "Interrupted: the suite was interrupted" in (out / "index.html").read_text()  # the report of what ran
    assert "grpo-s0" in (out / "results.csv").read_text()
    summary = [line for line in console.splitlines() if line.startswith("interrupted (SIGINT): ")]
    assert summary and "1 of 3 runs ok, 1 stopped (grpo-s0), 1 not started" in summary[0], console[-2000:]
    command = resume_command(console)
    assert command[command.index("--out") + 1] == str(out.resolve()) and "--resume" in command
    assert command[-len(OVERRIDES):] == OVERRIDES
    state = json.loads((out / "suite.json").read_text())["last_run"]
    assert state["exit_status"] == 130 and state["resume_command"] == shlex.join(command)
    assert not (out / ".lock").exists()

    # 2. The resumed suite's process dies (SIGKILL: no handler runs): its worker notices and stops itself.
    suite = Suite(command, env, tmp_path / "console-2.txt")
    suite.wait_for(in_training(suite, "grpo-s0"), "training step of the re-run grpo-s0")
    workers = suite.workers()
    assert workers
    suite.process.kill()
    suite.finish()
    assert_gone(workers, within=15)
    orphaned = result(out, "grpo-s0")
    assert orphaned is not None and orphaned["error"]["type"] == "Interrupted", orphaned
    assert "died" in orphaned["error"]["message"]
    assert json.loads((out / ".lock").read_text())["pid"] == suite.process.pid  # left behind: stale now

    # 3. The same resume command takes the stale lock over and finishes the suite.
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"took over a stale lock in {out.resolve()} (PID {suite.process.pid}" in proc.stderr
    assert "warm_start: already complete, skipped (--resume)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("all 3 runs ok in ")
    for run_id in ("warm_start", "grpo-s0", "grpo_engine-s0"):
        assert result(out, run_id)["status"] == "ok", run_id
    assert not (out / ".lock").exists()


def test_sigterm_with_parallel_runs_stops_both_cancels_the_queue_and_resume_completes(
        tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "suite"
    # 3 method runs, 2 at a time; 150 steps keep the engine's run going until TRL's (slower to load) has started
    extra = ["methods.ppo_verifier.enabled=true", "parallel_runs=2", "threads=1", "train.steps=150"]
    suite = start(out, env, *extra)
    suite.wait_for(lambda: "warm_start: step" in suite.text(), "warm-start step")
    # A second writer on the same folder is refused while this one is alive, with one line and nothing run.
    second = subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out),
                             "--resume", *OVERRIDES, *extra], env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "being written by another bench run" in lines[0], second.stderr
    assert f"PID {suite.process.pid}" in second.stderr
    # Signal as soon as both method workers exist (possibly still loading: either way they must stop).
    suite.wait_for(lambda: len(suite.workers()) >= 2 and "grpo_engine-s0: GRPO" in suite.text(),
                   "two method workers")
    workers = suite.workers()
    suite.process.send_signal(signal.SIGTERM)
    assert suite.finish() == 130, suite.text()[-3000:]
    assert_gone(workers, within=5)
    console = suite.text()
    for run_id in ("grpo-s0", "grpo_engine-s0"):
        stopped = result(out, run_id)
        assert stopped is not None and stopped["error"]["type"] == "Interrupted", (run_id, stopped)
    assert result(out, "ppo_verifier-s0") is None  # queued behind them: cancelled
    assert "interrupted (SIGTERM): 1 of 4 runs ok, 2 stopped" in console, console[-2000:]

    proc = subprocess.run(resume_command(console), env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("all 4 runs ok in ")
    assert all(result(out, run_id)["status"] == "ok" for run_id in ("grpo-s0", "grpo_engine-s0", "ppo_verifier-s0"))


def test_a_worker_that_ignores_sigterm_is_killed_with_its_children() -> None:
    """The runner's stop does not depend on the worker's cooperation: its whole process group is SIGKILLed
    KILL_AFTER_S after the SIGTERM, children included."""
    import io

    from bench.execution.processes import KILL_AFTER_S, Stopper

    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, subprocess, sys, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
                                 "print(child.pid, flush=True); time.sleep(120)"],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(stubborn.stdout.readline())
    console = io.StringIO()
    stopper = Stopper(console)
    stopper.register(stubborn)
    started = time.monotonic()
    stopper.handle(signal.SIGTERM, None)  # what the first signal does, without sending one to pytest
    assert stopper.requested.is_set() and "SIGTERM: stopping" in console.getvalue()
    time.sleep(1)
    assert stubborn.poll() is None  # SIGTERM ignored
    assert stubborn.wait(timeout=KILL_AFTER_S + 10) == -signal.SIGKILL
    assert KILL_AFTER_S - 0.5 <= time.monotonic() - started
    assert_gone([child], within=5)


def test_a_full_disk_during_the_run_is_one_line_with_the_resume_command(tmp_path, monkeypatch, capsys):
    """ENOSPC while the suite runs (simulated: the runner raises it) ends with one line, exit 1, and the resume
    command; nothing is deleted (result files are written atomically, so finished ones stay whole)."""
    import errno as _errno

    import bench.execution.preflight
    import bench.execution.runner
    from bench.cli import main

    def full(*args, **kwargs):
        raise OSError(_errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bench.execution.runner, "run_suite", full)
    monkeypatch.setattr(bench.execution.preflight, "preflight", lambda spec, suite_dir: None)
    out = tmp_path / "suite"
    code = main(["run", "--preset", "cpu-quick", "--out", str(out), "train.steps=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("bench: error: no space left on the disk holding")
    assert f"--out {out.resolve()} --resume train.steps=2" in err[-1]
    assert not any("Traceback" in line for line in err)
