"""A failing stage or method never takes the suite down: it becomes a failed cell with its reason, and the exit
status says so. --resume reuses only results it can trust; one `bench run` writes a folder at a time.

The first test runs real workers; the others replace the worker with a stand-in that writes a result at once, so
that what they check (exit statuses, the summary line, resume decisions, the lock) costs seconds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from bench_cli import run_bench, run_quick_suite


def test_failures_are_recorded_and_reported(tmp_path: Path) -> None:
    # One warm-start step leaves the policy unable to answer, so the pool has no (correct, incorrect) pair: the
    # reward model stage fails with the user's fix (a UserError naming sample_pool.pairs=gold), PPO (which needs it)
    # is skipped, and DPO fails on its own.
    out = tmp_path / "suite"
    proc = run_quick_suite(out, "warm_start.steps=1", "methods.grpo.enabled=false", "methods.grpo_engine.enabled=false",
                           "methods.ppo_verifier.enabled=false", cache_dir=tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr[-2000:]  # some runs failed: the report is written all the same
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("3 of 5 runs failed: reward_model (UserError: the sample pool has 0 preference pairs"), last
    assert "ppo-s0 (skipped: stage reward_model did not finish)" in last and "dpo-s0 (" in last
    assert last.endswith(f"report: {out / 'index.html'}"), last

    def result(run_id: str) -> dict:
        return json.loads((out / "runs" / run_id / "result.json").read_text())

    assert result("warm_start")["status"] == "ok"
    reward_model = result("reward_model")
    assert reward_model["status"] == "failed"
    assert reward_model["error"]["type"] == "UserError"
    assert "set sample_pool.pairs=gold" in reward_model["error"]["message"]
    assert (out / "runs" / "reward_model" / "traceback.txt").is_file()
    assert reward_model["error"]["memory_at_failure"].endswith("GiB peak (cpu-rss)")  # the reading when it failed
    ppo = result("ppo-s0")
    assert ppo["status"] == "failed" and ppo["error"]["type"] == "PrerequisiteFailed"
    assert "reward_model" in ppo["error"]["message"]
    dpo = result("dpo-s0")
    assert dpo["status"] == "failed" and "0 preference pairs" in dpo["error"]["message"]
    assert "FAILED" in proc.stderr

    with open(out / "results.csv", newline="") as handle:
        rows = {row["method"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"ppo", "dpo"}
    assert rows["ppo"]["status"] == rows["dpo"]["status"] == "failed"
    assert rows["dpo"]["accuracy_after"] == ""  # not evaluated: empty, never 0
    html = (out / "index.html").read_text()
    assert "PrerequisiteFailed" in html and "0 preference pairs" in html


def test_resume_refuses_a_changed_spec_and_skips_finished_runs(tmp_path: Path) -> None:
    from bench.errors import UserError
    from bench.execution.plan import make_plan
    from bench.results import empty_result, is_complete, write_json_atomic
    from bench.execution.suite_folder import prepare_suite_dir
    from bench.config.loading import load_spec

    spec = load_spec("cpu-quick")
    suite = tmp_path / "s"
    prepare_suite_dir(spec, suite, make_plan(spec), resume=False)
    changed = load_spec("cpu-quick", ["train.steps=9"])
    with pytest.raises(UserError, match="train.steps"):
        prepare_suite_dir(changed, suite, make_plan(changed), resume=True)
    with pytest.raises(UserError, match="--resume"):
        prepare_suite_dir(spec, suite, make_plan(spec), resume=False)
    with pytest.raises(UserError, match="not a suite run folder"):
        prepare_suite_dir(spec, tmp_path / "elsewhere", make_plan(spec), resume=True)
    prepare_suite_dir(spec, suite, make_plan(spec), resume=True)  # the same spec resumes
    write_json_atomic(suite / "runs" / "warm_start" / "result.json", ok_result("warm_start", "stage"))
    assert is_complete(suite / "runs" / "warm_start")
    assert not is_complete(suite / "runs" / "sample_pool")
    status_ok_only = empty_result("warm_start", "stage", "warm_start", "Warm start", "trl", 0)
    status_ok_only["status"] = "ok"  # the skeleton of a run that never ran, marked ok: not a finished run
    write_json_atomic(suite / "runs" / "warm_start" / "result.json", status_ok_only)
    assert not is_complete(suite / "runs" / "warm_start")


# -- results --resume can trust -------------------------------------------------------------------------------
def ok_result(run_id: str, kind: str = "method", inputs_hash: str | None = None) -> dict[str, Any]:
    """A well-formed ok result, as a worker writes one (the fields the schema check reads)."""
    from bench.results import empty_result

    result = empty_result(run_id, kind, run_id.split("-s")[0], run_id, "suite", 0)
    result.update(status="ok", started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:00:01+00:00",
                  throughput={"wall_s": 1.0, "steps": 1}, inputs_hash=inputs_hash)
    return result


def _drop(key: str) -> Callable[[dict], None]:
    return lambda r: r.pop(key)


@pytest.mark.parametrize("break_it, why", [
    (_drop("throughput"), "missing 'throughput'"),
    (_drop("memory"), "missing 'memory'"),
    (_drop("finished_at"), "missing 'finished_at'"),
    (lambda r: r.update(curves={}), "'curves' is dict"),
    (lambda r: r.update(seed="0"), "'seed' is str"),
    (lambda r: r["throughput"].update(wall_s="1.0"), "throughput.wall_s"),
    (lambda r: r["accuracy"].update(after=[]), "accuracy.after"),
    (lambda r: r.update(error={"type": "RuntimeError", "message": "x"}), "status ok with an error"),
    (lambda r: r.update(status="done"), "status 'done'"),
    (lambda r: r.update(run_id="dpo-s0"), "run_id 'dpo-s0'"),
])
def test_a_malformed_ok_result_is_not_complete(tmp_path: Path, break_it: Callable[[dict], None], why: str) -> None:
    from bench.results import incomplete_reason, is_complete, write_json_atomic

    run_dir = tmp_path / "grpo-s0"
    result = ok_result("grpo-s0")
    write_json_atomic(run_dir / "result.json", result)
    assert is_complete(run_dir)
    break_it(result)
    write_json_atomic(run_dir / "result.json", result)
    assert not is_complete(run_dir)
    reason = incomplete_reason(run_dir)
    assert reason is not None and reason.startswith("invalid result") and why in reason, reason


def test_an_unreadable_or_truncated_result_is_not_complete(tmp_path: Path) -> None:
    from bench.results import incomplete_reason

    run_dir = tmp_path / "grpo-s0"
    run_dir.mkdir()
    assert incomplete_reason(run_dir) == "no result"
    text = json.dumps(ok_result("grpo-s0"))
    (run_dir / "result.json").write_text(text[: len(text) // 2])  # a copy cut short
    assert incomplete_reason(run_dir) == "result.json unreadable"
    (run_dir / "result.json").write_text("[1, 2]")
    assert incomplete_reason(run_dir).startswith("invalid result (not a JSON object")


def test_a_result_from_other_inputs_is_not_complete(tmp_path: Path) -> None:
    from bench.results import incomplete_reason, write_json_atomic

    run_dir = tmp_path / "grpo-s0"
    write_json_atomic(run_dir / "result.json", ok_result("grpo-s0", inputs_hash="abc"))
    assert incomplete_reason(run_dir, "abc") is None
    assert incomplete_reason(run_dir, "def") == "its inputs changed (a stage it reads was re-run)"


class FakeWorkers:
    """Stands in for bench.execution.processes.launch_worker: writes the result a worker would, at once, and counts launches.

    ``fail`` maps run ids to the message of a RuntimeError the run "raises".
    """

    def __init__(self, fail: dict[str, str] | None = None) -> None:
        self.fail = fail or {}
        self.launched: list[str] = []

    def __call__(self, run_dir: Path, progress: Any, env: Any = None, stopper: Any = None) -> int:
        from bench.results import write_json_atomic
        from bench.execution.run_failure import failure_record
        from bench.execution.worker import RUN_FILE
        from bench.results import MESSAGE_LIMIT

        job = json.loads((run_dir / RUN_FILE).read_text())
        self.launched.append(job["run_id"])
        result = ok_result(job["run_id"], job["kind"], job["inputs_hash"])
        result["throughput"]["wall_s"] = time.perf_counter()  # as in a real result: no two runs write the same
        if job["run_id"] in self.fail:
            result.update(status="failed", error=failure_record(RuntimeError(self.fail[job["run_id"]]), None))
            assert len(result["error"]["message"]) <= MESSAGE_LIMIT + 30
        write_json_atomic(run_dir / "result.json", result)
        return 0 if result["status"] == "ok" else 1


@pytest.fixture()
def fake_suite(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[Any, str, FakeWorkers]]:
    """run(suite_dir, resume=False, fail=None) -> (SuiteOutcome, console text, FakeWorkers): run_suite on cpu-quick
    with stand-in workers and a stand-in report (the report has its own tests)."""
    import bench.report
    import bench.execution.runner
    import bench.execution.processes
    from bench.config.loading import load_spec

    def fake_report(suite_dir: Path) -> Path:
        (Path(suite_dir) / "index.html").write_text("report")
        return Path(suite_dir) / "index.html"

    monkeypatch.setattr(bench.report, "build_report", fake_report)
    spec = load_spec("cpu-quick")

    def run(suite_dir: Path, resume: bool = False, fail: dict[str, str] | None = None):
        workers = FakeWorkers(fail)
        monkeypatch.setattr(bench.execution.runner, "launch_worker", workers)
        stream = io.StringIO()
        outcome = bench.execution.runner.run_suite(spec, suite_dir, resume=resume, stream=stream)
        return outcome, stream.getvalue(), workers

    return run


def test_a_clean_suite_exits_0_and_resume_reruns_nothing(tmp_path: Path, fake_suite: Callable) -> None:
    outcome, console, workers = fake_suite(tmp_path / "s")
    assert outcome.exit_code == 0 and len(workers.launched) == 8
    assert console.strip().splitlines()[-1].startswith("all 8 runs ok in ")
    state = json.loads((tmp_path / "s" / "suite.json").read_text())["last_run"]
    assert state["exit_status"] == 0 and state["state"] == "complete"
    assert not (tmp_path / "s" / ".lock").exists()  # released
    outcome, console, workers = fake_suite(tmp_path / "s", resume=True)
    assert outcome.exit_code == 0 and workers.launched == []
    assert console.count("already complete, skipped (--resume)") == 8


def test_failed_and_skipped_runs_exit_1_with_capped_reasons(tmp_path: Path, fake_suite: Callable) -> None:
    long_reason = "the pool has no pairs " + "x" * 5000
    outcome, console, workers = fake_suite(tmp_path / "s", fail={"reward_model": long_reason, "dpo-s0": "boom"})
    assert outcome.exit_code == 1
    assert "ppo-s0" not in workers.launched  # skipped: it reads the reward model
    last = console.strip().splitlines()[-1]
    assert last == outcome.summary
    assert last.startswith("3 of 8 runs failed: reward_model (RuntimeError: the pool has no pairs xxx"), last
    assert "… (" in last and " more characters)" in last and len(last) < 700  # console: 300 characters a reason
    assert "ppo-s0 (skipped: stage reward_model did not finish)" in last and "dpo-s0 (RuntimeError: boom)" in last
    stored = json.loads((tmp_path / "s" / "runs" / "reward_model" / "result.json").read_text())["error"]["message"]
    assert stored.startswith("the pool has no pairs") and stored.endswith(f"… ({len(long_reason) - 2000:,} more "
                                                                          f"characters)")


def test_a_stage_rerun_makes_its_consumers_rerun(tmp_path: Path, fake_suite: Callable) -> None:
    suite = tmp_path / "s"
    fake_suite(suite)
    pool = suite / "runs" / "sample_pool" / "result.json"
    broken = json.loads(pool.read_text())
    del broken["throughput"]  # an ok result of the wrong shape: invalid, so the stage runs again
    pool.write_text(json.dumps(broken))
    outcome, console, workers = fake_suite(suite, resume=True)
    assert outcome.exit_code == 0
    assert "[2/8] sample_pool: re-running: invalid result (missing 'throughput')" in console
    # The reward model read the pool, PPO the reward model, DPO the pool: all re-run; the others did not.
    assert workers.launched == ["sample_pool", "reward_model", "ppo-s0", "dpo-s0"]
    assert "ppo-s0: re-running: its inputs changed" in console
    outcome, _, workers = fake_suite(suite, resume=True)
    assert workers.launched == []  # and now everything is consistent again


def test_a_worker_failure_message_is_one_capped_line() -> None:
    from bench.execution.run_failure import failure_record
    from bench.execution.worker_signals import Interrupted
    from bench.results import MESSAGE_LIMIT

    record = failure_record(RuntimeError("CUDA out of memory.\n  Tried to allocate 2 GiB\n" + "y" * 3000), None)
    # An out-of-memory error is classed as such, whatever its class (here the CUDA runtime's RuntimeError).
    assert record["type"] == "OutOfMemory" and record["exception"] == "RuntimeError" and "\n" not in record["message"]
    assert record["message"].startswith("CUDA out of memory. Tried to allocate 2 GiB yyy")
    assert len(record["message"]) <= MESSAGE_LIMIT + len("… (99999 more characters)")
    assert record["message"].endswith(" more characters)")
    assert failure_record(Interrupted("stopped"), None)["type"] == "Interrupted"
    assert failure_record(KeyboardInterrupt(), None)["type"] == "Interrupted"


# -- one writer per folder ------------------------------------------------------------------------------------
def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _write_lock(suite: Path, pid: int) -> None:
    (suite / ".lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started_at": "earlier"}))


def _resume_refusal(suite: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    proc = run_bench("run", "--preset", "cpu-quick", "--out", str(suite), "--resume", cache_dir=tmp_path / "cache",
                     timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: ") and "being written by another bench run" in \
        lines[0], proc.stderr
    assert not (suite / "runs").exists()  # nothing started
    return proc


def test_a_live_lock_refuses_a_second_run_with_one_line(tmp_path: Path) -> None:
    from bench.execution.plan import make_plan
    from bench.execution.suite_folder import prepare_suite_dir
    from bench.config.loading import load_spec

    spec = load_spec("cpu-quick")
    suite = tmp_path / "s"
    prepare_suite_dir(spec, suite, make_plan(spec), resume=False)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _write_lock(suite, holder.pid)  # a live PID on this host
        proc = _resume_refusal(suite, tmp_path)
        assert f"PID {holder.pid} on {socket.gethostname()}" in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    # A holder with the flock held refuses too, whatever PID the file names (here a dead one).
    _write_lock(suite, _dead_pid())
    flock_holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
                                     "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
                                     str(suite / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert flock_holder.stdout.readline().strip() == "held"
        _resume_refusal(suite, tmp_path)
    finally:
        flock_holder.kill()
        flock_holder.wait()


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path: Path, fake_suite: Callable) -> None:
    suite = tmp_path / "s"
    fake_suite(suite)
    dead = _dead_pid()
    _write_lock(suite, dead)
    outcome, console, _ = fake_suite(suite, resume=True)
    assert outcome.exit_code == 0
    assert f"note: took over a stale lock in {suite.resolve()} (PID {dead} on {socket.gethostname()} is not running)" \
        in console
    assert not (suite / ".lock").exists()


def test_a_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    from bench.errors import UserError
    from bench.execution.suite_folder import SuiteLock

    first, second = SuiteLock(tmp_path), SuiteLock(tmp_path)
    first.acquire(io.StringIO())
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    with pytest.raises(UserError, match="being written by another bench run"):
        second.acquire(io.StringIO())
    first.release()
    second.acquire(io.StringIO())  # free again
    second.release()
    assert not (tmp_path / ".lock").exists()


# -- a worker killed from outside (the Linux OOM killer) -------------------------------------------------------
SELF_KILL = ("import os, signal, sys\n"
             "print('@@phase generation', flush=True)\n"
             "print('@@phase update', flush=True)\n"
             "print('allocating', file=sys.stderr, flush=True)\n"
             "os.kill(os.getpid(), signal.SIGKILL)\n")
"""A stand-in worker that reports two phases, then dies as the OOM killer's victim does: SIGKILL, no result."""


def _run_dying_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str,
                      requested: bool = False) -> dict[str, Any]:
    """execute_run for one method run whose worker (the real launch_worker, running ``script``) dies; its result."""
    import bench.execution.runner
    from bench.execution.plan import PlannedRun
    from bench.config.loading import load_spec

    real = bench.execution.processes.launch_worker

    def launch(run_dir: Path, progress: Any, env: Any = None, stopper: Any = None) -> int:
        return real(run_dir, progress, env, stopper, command=[sys.executable, "-c", script])

    monkeypatch.setattr(bench.execution.runner, "launch_worker", launch)
    stopper = bench.execution.processes.Stopper(io.StringIO())
    if requested:
        stopper.requested.set()
        stopper.signal_name = "SIGINT"
    run = PlannedRun("grpo_engine-s0", "grpo_engine", "method", 0, "GRPO (suite engine)", "suite")
    progress = bench.execution.processes.Progress(io.StringIO(), __import__("threading").Lock(), False, 1, 1, run)
    bench.execution.runner.execute_run(load_spec("cpu-quick"), tmp_path, run, False, None, dict(os.environ), progress,
                             stopper)
    return json.loads((tmp_path / "runs" / "grpo_engine-s0" / "result.json").read_text())


def test_a_worker_killed_by_sigkill_from_outside_is_out_of_host_memory_in_its_last_phase(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.results import result_problems
    from bench.execution.runner import run_verdict

    result = _run_dying_worker(tmp_path, monkeypatch, SELF_KILL)
    error = result["error"]
    assert result["status"] == "failed" and not result_problems(result)
    assert (error["type"], error["phase"], error["exception"], error["memory"]) == ("OutOfMemory", "update",
                                                                                    "SIGKILL", "host")
    assert error["message"].startswith("host memory: the worker was killed by SIGKILL, which the runner did not "
                                       "send") and "in phase update" in error["message"]
    assert "allocating" in error["message"]  # the log's tail
    # Outside a sweep it is a failure like any other out-of-memory (a sweep point would make it 'oom').
    assert run_verdict(tmp_path / "runs" / "grpo_engine-s0")[0] == "failed"


@pytest.mark.parametrize("script, requested, kind", [
    ("import sys; sys.exit(3)", False, "WorkerDied"),  # died on its own, not from a signal
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", True, "Interrupted"),  # the runner's own kill
])
def test_other_deaths_are_not_called_out_of_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str,
                                                   requested: bool, kind: str) -> None:
    result = _run_dying_worker(tmp_path, monkeypatch, script, requested)
    assert result["error"]["type"] == kind, result["error"]


def test_a_phase_line_is_printed_when_a_different_phase_opens(capsys: pytest.CaptureFixture) -> None:
    from bench.telemetry import Telemetry
    from bench.execution.worker import PHASE_PREFIX, announce_phases

    telemetry = Telemetry("cpu", interval_s=0.01)
    announce_phases(telemetry)
    with telemetry:
        for name in ("generation", "generation", "reference", "update"):
            with telemetry.phase(name):
                pass
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(PHASE_PREFIX)]
    assert lines == [PHASE_PREFIX + name for name in ("generation", "reference", "update")]
    assert set(telemetry.summary()["phases"]) >= {"generation", "reference", "update"}  # the phases still count


def test_a_stop_that_lands_in_an_import_is_still_recorded_as_interrupted() -> None:
    """Seen in a whole-suite run: SIGTERM arrived while TRL was importing; Python wrapped the worker's Interrupted
    in a RuntimeError (raised in a class's __set_name__) and transformers' lazy module turned that into a
    ModuleNotFoundError, which the run recorded as its failure instead of the stop."""
    from bench.execution.run_failure import failure_record
    from bench.execution.worker_signals import Interrupted

    def import_trl() -> None:
        try:
            try:
                raise Interrupted("SIGTERM")
            except Interrupted as stop:
                raise RuntimeError("Error calling __set_name__ on 'Field' instance 'num_virtual_tokens'") from stop
        except RuntimeError:
            raise ModuleNotFoundError("Could not import module 'TrainerCallback'. Are this object's requirements "
                                      "defined correctly?")  # implicit chaining: __context__, as transformers does

    with pytest.raises(ModuleNotFoundError) as caught:
        import_trl()
    record = failure_record(caught.value, None)
    assert record["type"] == "Interrupted", record
    assert "(the worker received SIGTERM)" in record["message"] and "--resume" in record["message"]
    assert failure_record(ModuleNotFoundError("No module named 'trl'"), None)["type"] == "ModuleNotFoundError"
