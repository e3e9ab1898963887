"""A failing stage or method never takes the suite down: it becomes a failed cell with its reason."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from bench_cli import run_quick_suite


def test_failures_are_recorded_and_reported(tmp_path: Path) -> None:
    # One warm-start step leaves the policy unable to answer, so the pool has no (correct, incorrect) pair:
    # the reward model stage fails, PPO (which needs it) is skipped, and DPO fails on its own.
    out = tmp_path / "suite"
    proc = run_quick_suite(out, "warm_start.steps=1", "methods.grpo.enabled=false", "methods.grpo_engine.enabled=false",
                           "methods.ppo_verifier.enabled=false", cache_dir=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]

    def result(run_id: str) -> dict:
        return json.loads((out / "runs" / run_id / "result.json").read_text())

    assert result("warm_start")["status"] == "ok"
    reward_model = result("reward_model")
    assert reward_model["status"] == "failed"
    assert "pairs" in reward_model["error"]["message"] and reward_model["error"]["type"] == "RuntimeError"
    assert (out / "runs" / "reward_model" / "traceback.txt").is_file()
    assert reward_model["error"]["memory_at_failure"].endswith("GiB peak (cpu-rss)")  # the reading when it failed
    ppo = result("ppo-s0")
    assert ppo["status"] == "failed" and ppo["error"]["type"] == "PrerequisiteFailed"
    assert "reward_model" in ppo["error"]["message"]
    dpo = result("dpo-s0")
    assert dpo["status"] == "failed" and "no pairs" in dpo["error"]["message"]
    assert "FAILED" in proc.stderr

    with open(out / "results.csv", newline="") as handle:
        rows = {row["method"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"ppo", "dpo"}
    assert rows["ppo"]["status"] == rows["dpo"]["status"] == "failed"
    assert rows["dpo"]["accuracy_after"] == ""  # not evaluated: empty, never 0
    html = (out / "index.html").read_text()
    assert "PrerequisiteFailed" in html and "no pairs" in html


def test_resume_refuses_a_changed_spec_and_skips_finished_runs(tmp_path: Path) -> None:
    from bench.errors import UserError
    from bench.plan import make_plan
    from bench.results import empty_result, is_complete, write_json_atomic
    from bench.runner import prepare_suite_dir
    from bench.spec import load_spec

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
    finished = empty_result("warm_start", "stage", "warm_start", "Warm start", "trl", 0)
    finished["status"] = "ok"
    write_json_atomic(suite / "runs" / "warm_start" / "result.json", finished)
    assert is_complete(suite / "runs" / "warm_start")
    assert not is_complete(suite / "runs" / "sample_pool")
