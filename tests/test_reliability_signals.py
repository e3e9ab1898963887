"""The terminal closing, and the checks that must come before the plan.

- a `bench run` whose terminal goes away (SIGHUP) stops as after a SIGTERM: exit status 130, the workers
  stopped, the report of what finished written, the lock released and suite.json's ``last_run`` holding the resume
  command. The test runs the real command on a pseudo-terminal that is its controlling terminal and closes the
  terminal's master side, which is what closing a terminal window does: the kernel hangs the terminal up, sends
  SIGHUP to the session, and every later write to it fails (EIO).
- preflight runs before the plan is printed; a failed check is the only line on the console.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil
import pytest
from test_interrupts import OVERRIDES, assert_gone

from bench.cli import main
from bench.errors import UserError


def _controlling_terminal() -> None:
    """In the child, after setsid: the pty on stdin becomes its terminal, and SIGHUP is as in a terminal's session.

    A test suite started under nohup (or anything else that ignores or blocks SIGHUP) passes that on through exec,
    and bench then rightly keeps ignoring it (:func:`test_sighup_is_taken_over_unless_the_run_was_started_under_nohup`):
    closing the terminal would not stop the run this test watches."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGHUP])
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_closing_the_terminal_stops_the_suite_like_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    env = dict(os.environ, BENCH_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out),
                                *OVERRIDES, "train.steps=200"], stdin=slave, stdout=slave, stderr=slave, env=env,
                               start_new_session=True, preexec_fn=_controlling_terminal, cwd=tmp_path)
    os.close(slave)
    console: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            console.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while b"grpo-s0: step" not in b"".join(console):
        assert process.poll() is None, b"".join(console)[-3000:].decode(errors="replace")
        assert time.monotonic() < deadline, b"".join(console)[-3000:].decode(errors="replace")
        time.sleep(0.2)
    workers = [c.pid for c in psutil.Process(process.pid).children(recursive=True)]
    assert workers
    os.close(master)  # the terminal window closes
    try:
        code = process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("bench still running 120 s after its terminal closed")
    assert code == 130, f"exit status {code} (129: killed by SIGHUP)"
    assert_gone(workers, within=10)
    state = json.loads((out / "suite.json").read_text())["last_run"]
    assert state["exit_status"] == 130 and state["state"] == "interrupted"
    assert "interrupted (SIGHUP)" in state["summary"]
    assert "--resume" in state["resume_command"] and str(out.resolve()) in state["resume_command"]
    assert not (out / ".lock").exists()
    assert (out / "index.html").is_file()
    stopped = json.loads((out / "runs" / "grpo-s0" / "result.json").read_text())
    assert stopped["status"] == "failed" and stopped["error"]["type"] == "Interrupted"


def test_preflight_comes_before_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.execution.preflight
    import bench.execution.runner

    def failing(spec, suite_dir, notes=None):
        raise UserError("not enough free space for the run (a stand-in for any preflight check)")

    monkeypatch.setattr(bench.execution.preflight, "preflight", failing)
    assert main(["run", "--preset", "cpu-quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench: error: not enough free space for the run (a stand-in for any preflight check)"], err[:5]
    assert not (tmp_path / "out").exists()

    seen: list[str] = []
    monkeypatch.setattr(bench.execution.preflight, "preflight", lambda spec, suite_dir, notes=None: seen.append(
        capsys.readouterr().err))

    class Done(Exception):
        pass

    def stop(*args, **kwargs):
        raise Done

    monkeypatch.setattr(bench.execution.runner, "run_suite", stop)
    with pytest.raises(Done):
        main(["run", "--preset", "cpu-quick", "--out", str(tmp_path / "out")])
    assert seen == [""]  # nothing printed before preflight ran
    assert capsys.readouterr().err.startswith("preset cpu-quick: ")  # the plan, once preflight passed


def test_sighup_is_taken_over_unless_the_run_was_started_under_nohup() -> None:
    """`nohup bench run ...` ignores SIGHUP before the suite starts: the run must go on ignoring it, or closing the
    terminal would stop the very run nohup was asked to keep alive."""
    import io

    from bench.execution.processes import Stopper

    previous = signal.getsignal(signal.SIGHUP)
    try:
        for inherited, taken in ((signal.SIG_DFL, True), (signal.SIG_IGN, False)):
            signal.signal(signal.SIGHUP, inherited)
            stopper = Stopper(io.StringIO())
            stopper.install()
            try:
                handler = signal.getsignal(signal.SIGHUP)
                assert (handler == stopper.handle) is taken, (inherited, handler)
                assert signal.getsignal(signal.SIGTERM) == stopper.handle
            finally:
                stopper.restore()
            assert signal.getsignal(signal.SIGHUP) == inherited
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_progress_to_a_closed_terminal_does_not_stop_the_run() -> None:
    """Between the terminal closing and the SIGHUP handler running (the main thread may be waiting), a worker's
    progress line meets EIO; it is dropped, not raised into the run's thread."""
    import errno
    import threading as _threading

    from bench.execution.plan import PlannedRun
    from bench.execution.processes import Progress

    class Gone:
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

        def flush(self) -> None:
            raise OSError(errno.EIO, "Input/output error")

    run = PlannedRun("grpo-s0", "grpo", "method", 0, "GRPO (TRL)", "trl", ())
    progress = Progress(Gone(), _threading.Lock(), True, 1, 1, run)
    progress.update(1, 2, {"loss": 0.5})
    progress.note("still here")
    progress.finish("ok")


@pytest.mark.parametrize("signal_name, code, state", [(None, 0, "complete"), ("SIGHUP", 130, "interrupted")])
def test_a_console_gone_before_the_last_line_does_not_change_the_exit_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_name: str | None, code: int, state: str) -> None:
    """The terminal closed and the run went on to its end: with SIGHUP ignored (started under nohup, which closing the
    terminal must not stop), or with the SIGHUP still pending when the summary is printed. Writing the summary to the
    hung-up terminal fails (EIO); the run ends as it recorded (0, or 130 interrupted), not with exit status 1."""
    import errno

    import bench.execution.runner as runner
    import bench.report
    from bench.config.loading import load_spec
    from bench.results import RESULT_FILE, empty_result, write_json_atomic

    class Gone:
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

        def flush(self) -> None:
            raise OSError(errno.EIO, "Input/output error")

        def isatty(self) -> bool:
            return False

    def run_all(spec, suite_dir, runs, resume, repo_dir, stream, stopper, devices=None) -> None:
        for run in runs:  # every run ends ok, or (after a stop request) interrupted, as its worker records it
            result = empty_result(run.run_id, run.kind, run.name, run.label, run.engine, run.seed)
            result["status"] = "ok"
            (suite_dir / "runs" / run.run_id).mkdir(parents=True, exist_ok=True)
            write_json_atomic(suite_dir / "runs" / run.run_id / RESULT_FILE, result)
        stopper.signal_name = signal_name

    monkeypatch.setattr(runner, "_run_all", run_all)
    monkeypatch.setattr(bench.report, "build_report", lambda suite_dir: suite_dir / "index.html")
    out = tmp_path / "suite"
    outcome = runner.run_suite(load_spec("cpu-quick", OVERRIDES), out, stream=Gone())
    assert outcome.exit_code == code
    last_run = json.loads((out / "suite.json").read_text())["last_run"]
    assert (last_run["exit_status"], last_run["state"]) == (code, state)
    assert not (out / ".lock").exists()
