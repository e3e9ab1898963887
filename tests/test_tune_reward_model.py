"""`bench tune` tunes the reward model on its own validation pairs, first, and the chosen point is quoted.

The reward-model stage's grid (a grid entry's ``reward_model``) runs as stage runs, every point at every seed,
scored by ``metrics.heldout_pair_accuracy`` (one pair per held-out question of the sample pool, questions the stage
never trains on); its best mean over seeds among points where every seed finished is chosen and written into the
tuned preset (values and ``tuning.methods.reward_model``); the methods that read it (PPO with reward: model) are then
tuned at that point. The pick and the preset are tested on hand-made result files; the planted test at the end goes
through the real CLI, runner and workers with a stub reward-model stage whose held-out accuracy is planted by its
learning rate, one point failing at one seed, and a stub method that reads the reward model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.cli import main
from bench.config import registry
from bench.config.loading import load_spec
from bench.errors import UserError
from bench.execution.plan import make_plan, run_id
from bench.execution.tune import (STAGE_SPLIT, Grid, check_stage_resume, collect_scores, collect_stage_scores,
                                  finish_tune, grids_for, pick, read_grid_file, stage_grid_for, stage_tune,
                                  tune_spec)
from bench.results import empty_result, write_json_atomic
from bench.task.verifier import HEADLINE_MODE

from tests.report_fixtures import method_result, write_suite

REPO = Path(__file__).resolve().parents[1]
RM_GRID = Grid("reward_model", {"reward_model.learning_rate": [1.0e-3, 3.0e-4, 1.0e-4]})
"""Three points; cpu-quick's own reward model (lr 1e-3, its default) first."""
PPO_GRID = {"ppo": Grid("ppo", {"methods.ppo.learning_rate": [1.0e-4, 1.0e-3]})}


def _stage_results(suite_dir: Path, tune: Any, planted: dict[tuple[str, int], float | None], pairs: int = 40) -> None:
    """A result per (point label, seed) of the reward-model stage with the given held-out pair accuracy (None: a
    failed run)."""
    for (label, seed), value in planted.items():
        rid = tune.run_id(label, seed)
        result = empty_result(rid, "stage", "reward_model", "Reward model (TRL)", "trl", seed)
        result["status"] = "failed" if value is None else "ok"
        if value is not None:
            result["metrics"] = {"heldout_pair_accuracy": value, "heldout_pairs": pairs,
                                 "heldout_pair_accuracy_untrained": 0.5}
        write_json_atomic(suite_dir / "runs" / rid / "result.json", result)


def _method_results(suite_dir: Path, spec: Any, method: str, accuracy: dict[tuple[str, int], float]) -> None:
    for (point, seed), value in accuracy.items():
        rid = run_id(method, seed, point)
        result = empty_result(rid, "method", method, method, "suite", seed)
        result["status"] = "ok"
        result["accuracy"] = {"n_questions": 24, "before": None,
                              "after": {HEADLINE_MODE: {"accuracy": value, "low": 0.0, "high": 1.0}}}
        write_json_atomic(suite_dir / "runs" / rid / "result.json", result)


# --- the grid ------------------------------------------------------------------------------------------------
def test_the_shipped_grids_tune_the_reward_model_on_its_own_and_no_method_tunes_its_keys() -> None:
    data = read_grid_file()
    spec = load_spec("cpu-tiny")
    grid = stage_grid_for("cpu-tiny", data)
    assert grid is not None and len(grid.points()) == 2 * 3
    # The preset's own reward model first, as a method's grid starts at the method's own values.
    assert grid.points()[0] == {"reward_model.learning_rate": spec.reward_model.learning_rate,
                                "reward_model.epochs": spec.reward_model.epochs}
    for preset in ("cpu-tiny", "cpu-quick", "gsm8k-qwen0.5b"):
        assert stage_grid_for(preset, data) is not None
        for method, method_grid in grids_for(preset, data)[1].items():
            assert not [k for k in method_grid.axes if k.startswith("reward_model.")], (preset, method)


def test_a_bad_reward_model_grid_is_one_line(tmp_path: Path) -> None:
    def entry(**extra: Any) -> dict[str, Any]:
        return {"cpu-quick": {"validation_size": 24, "methods": {"ppo": {"axes": {"methods.ppo.kl_coef": [0.1]}}},
                              **extra}}

    with pytest.raises(UserError, match="axis 'methods.ppo.kl_coef' is not a reward-model setting"):
        stage_grid_for("cpu-quick", entry(reward_model={"axes": {"methods.ppo.kl_coef": [0.1]}}))
    with pytest.raises(UserError, match="'reward_model.eval_fraction' cannot be tuned: it decides which questions"):
        stage_grid_for("cpu-quick", entry(reward_model={"axes": {"reward_model.eval_fraction": [0.1, 0.3]}}))
    with pytest.raises(UserError, match="'reward_model': give 'axes'"):
        stage_grid_for("cpu-quick", entry(reward_model={"epochs": [1, 2]}))
    both = entry(reward_model={"axes": {"reward_model.epochs": [2, 1]}})
    both["cpu-quick"]["methods"]["ppo"]["axes"]["reward_model.learning_rate"] = [1.0e-3]
    with pytest.raises(UserError, match="method 'ppo': axis 'reward_model.learning_rate' is tuned by the grid's "
                                        "'reward_model' entry"):
        grids_for("cpu-quick", both)
    # --methods reward_model needs a reward-model grid.
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(entry()), encoding="utf-8")
    assert main(["tune", "--preset", "cpu-quick", "--methods", "reward_model", "--grid", str(grid), "--dry-run"]) == 2


def test_the_reward_model_grid_is_its_stage_at_every_point_and_seed_and_ppo_runs_at_the_choice() -> None:
    base = load_spec("cpu-quick")
    tune = stage_tune(base, RM_GRID, ["ppo"], [0, 1], 24)
    ids = [run.run_id for run in tune.runs]
    assert ids == ["warm_start", "sample_pool", "reward_model@rmlr0.001", "reward_model@rmlr0.0003",
                   "reward_model@rmlr0.0001", "reward_model-s1@rmlr0.001", "reward_model-s1@rmlr0.0003",
                   "reward_model-s1@rmlr0.0001"]
    by_id = {run.run_id: run for run in tune.runs}
    assert by_id["reward_model-s1@rmlr0.0003"].seed == 1 and by_id["reward_model@rmlr0.0003"].seed == 0
    assert by_id["reward_model-s1@rmlr0.0003"].needs == ("warm_start", "sample_pool")
    assert dict(by_id["reward_model-s1@rmlr0.0003"].values) == {"reward_model.learning_rate": 3.0e-4}
    # The methods' sweep at the chosen point reads that point's first-seed run (already there: not retrained),
    # every PPO point carrying the chosen values; a method that does not read the reward model is untouched.
    grids = {**PPO_GRID, "grpo_engine": Grid("grpo_engine", {"methods.grpo_engine.learning_rate": [1.0e-4]})}
    spec = tune_spec(base, grids, ["grpo_engine", "ppo"], [0, 1], 24, {"reward_model.learning_rate": 3.0e-4}, ["ppo"])
    plan = make_plan(spec)
    assert [r.run_id for r in plan if r.kind == "stage"] == ["warm_start", "sample_pool", "reward_model@rmlr0.0003"]
    ppo = [r for r in plan if r.name == "ppo"]
    assert ppo and all(r.needs[-1] == "reward_model@rmlr0.0003" for r in ppo)
    assert all(dict(r.values)["reward_model.learning_rate"] == 3.0e-4 for r in ppo)
    assert all("reward_model.learning_rate" not in dict(r.values) for r in plan if r.name == "grpo_engine")
    assert {r.point for r in ppo} == {"base-ppo", "lr0.001"}  # the ids name only what PPO's own grid varies


def test_dry_run_shows_the_reward_model_grid_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--preset", "cpu-quick", "--methods", "ppo", "--seeds", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    first, methods = out.split("preset cpu-quick:", 1)
    assert "reward model first" in first and "held-out pair accuracy" in first and STAGE_SPLIT in first
    assert "axis reward_model.epochs: 2, 1" in first and "points: rmep2, rmep1" in first
    assert "reward_model-s1@rmep1" in first and "then ppo tuned at the chosen point" in first
    assert "ppo: base" in methods and "reward_model@rmep2" in methods
    # --methods reward_model: the stage alone, no methods' sweep.
    assert main(["tune", "--preset", "cpu-quick", "--methods", "reward_model", "--seeds", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "reward model first" in out and "no method tuned after it" in out and "preset cpu-quick:" not in out


# --- the pick and the tuned preset ---------------------------------------------------------------------------
def test_the_best_held_out_pair_accuracy_is_chosen_a_point_with_a_failed_seed_does_not_count_and_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = load_spec("cpu-quick")
    tune = stage_tune(base, RM_GRID, ["ppo"], [0, 1], 24)
    # 1e-4 has the best seed (0.95) but its seed 1 failed; 3e-4 has the best mean of the complete points.
    _stage_results(tmp_path, tune, {("rmlr0.001", 0): 0.60, ("rmlr0.001", 1): 0.62, ("rmlr0.0003", 0): 0.70,
                                    ("rmlr0.0003", 1): 0.75, ("rmlr0.0001", 0): 0.95, ("rmlr0.0001", 1): None})
    scores = collect_stage_scores(tmp_path, tune)
    assert [s.point for s in scores] == ["rmlr0.001", "rmlr0.0003", "rmlr0.0001"]
    assert not scores[2].complete and scores[2].not_ok == {1: "failed"} and scores[2].accuracy == {0: 0.95}
    best = pick(scores)
    assert best is not None and best.point == "rmlr0.0003" and best.mean == pytest.approx(0.725)
    assert best.n_questions == 40  # n: the held-out pairs, one per held-out question

    spec = tune_spec(base, PPO_GRID, ["ppo"], [0, 1], 24, dict(best.values), ["ppo"])
    _method_results(tmp_path, spec, "ppo", {("base", 0): 0.2, ("base", 1): 0.3, ("lr0.001", 0): 0.4,
                                            ("lr0.001", 1): 0.5})
    assert [s.point for s in collect_scores(tmp_path, spec)["ppo"]] == ["base", "lr0.001"]
    args = argparse.Namespace(preset="cpu-quick", methods="ppo", seeds=2, grid=None, out=None, overrides=[])
    assert finish_tune(tmp_path, spec, base, PPO_GRID, ["ppo"], args, "bench tune --preset cpu-quick", 0, tune) == 0
    out = capsys.readouterr().out
    assert "reward_model: reward_model.learning_rate=0.0003: held-out pair accuracy 72.5% ± 3.5 (n seeds 2) over " \
           "40 held-out pairs; default 61.0%" in out
    assert "ppo: methods.ppo.learning_rate=0.001: validation" in out and "at reward model " \
           "reward_model.learning_rate=0.0003" in out

    path = tmp_path / "tuned-cpu-quick.yaml"
    tuned = load_spec(path)
    assert tuned.reward_model.learning_rate == pytest.approx(3.0e-4)  # the choice applies on load
    assert tuned.methods["ppo"].learning_rate == pytest.approx(1.0e-3)
    assert list(tuned.tuning.methods) == ["reward_model", "ppo"]  # chosen first
    record = tuned.tuning.methods["reward_model"]
    assert record["chosen"] == {"reward_model.learning_rate": 3.0e-4} and record["point"] == "rmlr0.0003"
    assert record["split"] == "validation pairs (held-out questions of the sample pool)"
    assert record["n_questions"] == record["heldout_pairs"] == 40 and record["scoring_mode"] == "heldout_pair_accuracy"
    assert record["score"] == {"mean": 0.725, "sd": pytest.approx(0.035355, abs=1e-6), "n": 2}
    assert record["default_point"] == "rmlr0.001" and record["default_score"]["mean"] == pytest.approx(0.61)
    assert record["grid"] == {"reward_model.learning_rate": [1.0e-3, 3.0e-4, 1.0e-4]} and record["points"] == 3
    assert record["seeds"] == [0, 1] and record["read_by"] == ["ppo"] and record["mode"] == "product"
    failed = record["scores"][2]
    assert failed["point"] == "rmlr0.0001" and failed["not_ok"] == {1: "failed"} and failed["accuracy"] == {0: 0.95}
    # PPO was tuned at the chosen reward model: said once, never as one of PPO's own choices.
    ppo = tuned.tuning.methods["ppo"]
    assert ppo["chosen"] == {"methods.ppo.learning_rate": 1.0e-3}
    assert ppo["tuned_at"] == {"reward_model.learning_rate": 3.0e-4} and ppo["default_point"] == "base"
    assert all(set(s["values"]) == {"methods.ppo.learning_rate"} for s in ppo["scores"])
    text = path.read_text(encoding="utf-8")
    assert "# The reward model was tuned first, by its mean held-out pair accuracy" in text
    assert "# reward_model: reward_model.learning_rate=0.0003: 72.5%" in text


def test_no_complete_reward_model_point_leaves_it_at_the_preset(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    base = load_spec("cpu-quick")
    tune = stage_tune(base, RM_GRID, ["ppo"], [0], 24)
    _stage_results(tmp_path, tune, {("rmlr0.001", 0): None, ("rmlr0.0003", 0): None})  # 1e-4: no result at all
    assert [s.not_ok for s in collect_stage_scores(tmp_path, tune)] == [{0: "failed"}, {0: "failed"}, {0: "missing"}]
    spec = tune_spec(base, PPO_GRID, ["ppo"], [0], 24, tune.base_values(base), ["ppo"])
    _method_results(tmp_path, spec, "ppo", {("base", 0): 0.2, ("lr0.001", 0): 0.4})
    args = argparse.Namespace(preset="cpu-quick", methods="ppo", seeds=1, grid=None, out=None, overrides=[])
    assert finish_tune(tmp_path, spec, base, PPO_GRID, ["ppo"], args, "bench tune", 1, tune) == 1
    assert "reward_model: no grid point finished on every seed; left at the preset's values" in capsys.readouterr().err
    tuned = load_spec(tmp_path / "tuned-cpu-quick.yaml")
    assert "reward_model" not in tuned.tuning.methods
    assert tuned.reward_model.learning_rate == base.reward_model.learning_rate
    assert tuned.tuning.methods["ppo"]["tuned_at"] == {"reward_model.learning_rate": base.reward_model.learning_rate}


def test_resume_accepts_the_folder_at_any_reward_model_choice_and_refuses_another_tune(tmp_path: Path) -> None:
    base = load_spec("cpu-quick")
    at_base = tune_spec(base, PPO_GRID, ["ppo"], [0, 1], 24, {"reward_model.learning_rate": 1.0e-3}, ["ppo"])
    chosen = tune_spec(base, PPO_GRID, ["ppo"], [0, 1], 24, {"reward_model.learning_rate": 3.0e-4}, ["ppo"])
    write_json_atomic(tmp_path / "suite.json", {"spec": chosen.to_dict(), "runs": []})
    keys = {"reward_model.learning_rate"}
    check_stage_resume(at_base, tmp_path, keys)  # the same tune, its reward model chosen last time
    other = tune_spec(load_spec("cpu-quick", ["train.steps=3"]), PPO_GRID, ["ppo"], [0, 1], 24,
                      {"reward_model.learning_rate": 1.0e-3}, ["ppo"])
    with pytest.raises(UserError, match="the tune differs from the one"):
        check_stage_resume(other, tmp_path, keys)
    with pytest.raises(UserError, match="is not a tune folder"):
        check_stage_resume(at_base, tmp_path / "nothing", keys)


# --- the report's quote ----------------------------------------------------------------------------------------
def test_the_report_quotes_the_reward_models_tune(tmp_path: Path) -> None:
    from bench.report.load import load_suite
    from bench.report.overview import tuning_note

    suite_dir = write_suite(tmp_path, methods=("ppo", "dpo"))
    stage = {"chosen": {"reward_model.learning_rate": 3.0e-4, "reward_model.epochs": 4}, "points": 6,
             "score": {"mean": 0.725, "sd": 0.01, "n": 2}, "heldout_pairs": 404, "n_questions": 404, "seeds": [0, 1],
             "split": STAGE_SPLIT, "stage": True}
    for method in ("ppo", "dpo"):
        res = method_result(method)
        res["settings"]["reward_source"] = "model" if method == "ppo" else None
        res["spec"]["reward_model"] = {"learning_rate": 3.0e-4, "epochs": 4}
        res["spec"]["tuning"] = {"methods": {"reward_model": stage, method: {
            "chosen": {f"methods.{method}.learning_rate": 1e-4}, "score": {"mean": 0.5}, "points": 3,
            "n_questions": 1000, "seeds": [0, 1], **({"tuned_at": stage["chosen"]} if method == "ppo" else {})}}}
        write_json_atomic(suite_dir / "runs" / f"{method}-s0" / "result.json", res)
    note = tuning_note(load_suite(suite_dir))
    assert note.startswith("Hyperparameters: reward model: lr 0.0003, epochs 4, held-out pair accuracy 72.5% "
                           "(6 grid points, n = 404 held-out pairs, seeds [0, 1]); "), note
    ppo = note.split("PPO (reward model): ", 1)[1].split("; DPO", 1)[0]
    assert "chosen learning_rate = 0.0001, at the reward model tuned first, validation 50.0%" in ppo, note
    assert "overridden" not in note and "tuned first" not in note.split("; DPO", 1)[1], note
    # A run at another reward model than the tuned one says so.
    res = json.loads((suite_dir / "runs" / "ppo-s0" / "result.json").read_text(encoding="utf-8"))
    res["spec"]["reward_model"]["learning_rate"] = 1.0e-3
    write_json_atomic(suite_dir / "runs" / "ppo-s0" / "result.json", res)
    note = tuning_note(load_suite(suite_dir))
    assert "seeds [0, 1]; overridden: ran reward_model.learning_rate = 0.001, not the tuned value)" in note, note


# --- planted: the real CLI, runner and workers ---------------------------------------------------------------
AUDIT_ENV = "BENCH_TEST_RM_TUNE"
PLANTED = {1.0e-3: 0.60, 3.0e-4: 0.80, 1.0e-4: 0.90}
"""Held-out pair accuracy the stub reward model reports at each learning rate (plus 0.01 x seed)."""
FAILS_AT = (1.0e-4, 1)
"""(learning rate, seed) at which the stub reward model fails: the best point, so it must not be chosen."""

STUB_STAGE = f'''"""A stub reward-model stage for tests/test_tune_reward_model.py: its held-out accuracy is planted."""

import json

import torch

from bench.execution.context import TrainOutcome

LABEL = "Reward model (planted)"
ENGINE = "suite"
PLANTED = {PLANTED!r}
FAILS_AT = {FAILS_AT!r}


def train(ctx):
    rm = ctx.spec.reward_model
    lr = min(PLANTED, key=lambda value: abs(value - rm.learning_rate))
    if (lr, ctx.seed) == FAILS_AT:
        raise RuntimeError("planted failure of the best point at one seed")
    model = torch.nn.Linear(1, 1)
    ctx.telemetry.train_begin(model)
    ctx.telemetry.train_end(model)
    save_dir = ctx.run_dir / "model"
    save_dir.mkdir(parents=True, exist_ok=True)
    (save_dir / "planted.json").write_text(json.dumps({{"learning_rate": rm.learning_rate, "seed": ctx.seed}}))
    return TrainOutcome(policy=model, tokenizer=ctx.tokenizer, networks={{"reward": model}}, steps=1,
                        metrics={{"heldout_pair_accuracy": PLANTED[lr] + 0.01 * ctx.seed, "heldout_pairs": 40,
                                 "heldout_pair_accuracy_untrained": 0.5}}, save_dir=save_dir)
'''

SITECUSTOMIZE = f'''"""Test hook of tests/test_tune_reward_model.py: the stub stage and a method reading it."""

import os

if os.environ.get("{AUDIT_ENV}"):
    from bench.config import registry

    registry.METHODS["stub"] = registry.Entry("stub_reader")
    registry.STAGES["reward_model"] = registry.Entry("stub_reward_model")
    registry.STAGE_NEEDS["reward_model"] = ()
'''


def _reader_recipe() -> str:
    """tests/test_tune_planted.py's stub method, reading the reward model and recording which one it read."""
    from tests.test_tune_planted import STUB_RECIPE

    needs = "def needs(spec, cfg):\n    return ()\n"
    metrics = 'metrics={"worker_pid": os.getpid()})'
    assert needs in STUB_RECIPE and metrics in STUB_RECIPE
    return (STUB_RECIPE.replace(needs, 'def needs(spec, cfg):\n    return ("reward_model",)\n')
            .replace(metrics, 'metrics={"worker_pid": os.getpid(), "reward_model_dir": str(ctx.reward_model_dir), '
                              '"read": __import__("json").loads((ctx.reward_model_dir / "planted.json")'
                              '.read_text())})'))


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    folder = tmp_path / "hooks"
    folder.mkdir()
    (folder / "stub_reader.py").write_text(_reader_recipe(), encoding="utf-8")
    (folder / "stub_reward_model.py").write_text(STUB_STAGE, encoding="utf-8")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setitem(registry.METHODS, "stub", registry.Entry("stub_reader"))
    monkeypatch.setitem(registry.STAGES, "reward_model", registry.Entry("stub_reward_model"))
    monkeypatch.setitem(registry.STAGE_NEEDS, "reward_model", ())
    path = os.pathsep.join(p for p in (str(folder), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, BENCH_CACHE_DIR=str(tmp_path / "cache"), **{AUDIT_ENV: "1"})


def test_a_planted_tune_chooses_the_best_complete_reward_model_and_tunes_its_reader_there(
        tmp_path: Path, hooks: dict[str, str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"cpu-quick": {
        "validation_size": 24,
        "reward_model": {"axes": {"reward_model.learning_rate": list(PLANTED)}},  # the preset's own 1e-3 first
        "methods": {"stub": {"axes": {"methods.stub.learning_rate": [1.0e-3]}}}}}), encoding="utf-8")
    out = tmp_path / "tune"
    command = [sys.executable, "-m", "bench", "tune", "--preset", "cpu-quick", "--methods", "stub", "--seeds", "2",
               "--grid", str(grid), "--out", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=hooks, capture_output=True, text=True, timeout=900)
    # Exit 1: one run failed (the planted one); the preset is still written from the complete points.
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("5 of 6 runs ok; chosen reward_model.learning_rate=0.0003 (held-out pair accuracy 80.5% over 40 "
            "held-out pairs)") in proc.stderr, proc.stderr[-3000:]

    # Every point ran at every seed as a run of the stage; the planted failure is recorded as failed.
    runs = out / "runs"
    for label in ("rmlr0.001", "rmlr0.0003", "rmlr0.0001"):
        for seed, rid in ((0, f"reward_model@{label}"), (1, f"reward_model-s1@{label}")):
            result = json.loads((runs / rid / "result.json").read_text(encoding="utf-8"))
            assert result["kind"] == "stage" and result["seed"] == seed
            assert result["status"] == ("failed" if (label, seed) == ("rmlr0.0001", 1) else "ok"), rid

    # The reader ran at the chosen reward model: its first-seed run, read as it was (not retrained).
    assert "reward_model@rmlr0.0003" in proc.stderr and "already complete, skipped (--resume)" in proc.stderr
    for seed in (0, 1):
        result = json.loads((runs / f"stub-s{seed}@base" / "result.json").read_text(encoding="utf-8"))
        assert result["status"] == "ok" and result["spec"]["reward_model"]["learning_rate"] == pytest.approx(3.0e-4)
        assert result["metrics"]["read"] == {"learning_rate": 3.0e-4, "seed": 0}
        assert Path(result["metrics"]["reward_model_dir"]).parent.name == "reward_model@rmlr0.0003"
        assert result["spec"]["eval"]["split"] == "validation"
    suite = json.loads((out / "suite.json").read_text(encoding="utf-8"))
    assert suite["spec"]["sweep"]["axes"]["stub"] == [{"methods.stub.learning_rate": 1.0e-3,
                                                       "reward_model.learning_rate": 3.0e-4}]

    # The tuned preset: the reward model's choice applied, its record with every point's score, the failed seed
    # shown and left out of the pick; the reader's record says where it was tuned.
    tuned = load_spec(out / "tuned-cpu-quick.yaml")
    assert tuned.reward_model.learning_rate == pytest.approx(3.0e-4)
    record = tuned.tuning.methods["reward_model"]
    assert record["point"] == "rmlr0.0003" and record["score"]["mean"] == pytest.approx(0.805)
    assert record["split"] == STAGE_SPLIT and record["heldout_pairs"] == 40 and record["points"] == 3
    assert [s["mean"] for s in record["scores"]] == [pytest.approx(0.605), pytest.approx(0.805), pytest.approx(0.9)]
    assert record["scores"][2]["not_ok"] == {1: "failed"}
    assert tuned.tuning.methods["stub"]["tuned_at"] == {"reward_model.learning_rate": 3.0e-4}
    assert tuned.tuning.methods["stub"]["chosen"] == {"methods.stub.learning_rate": 1.0e-3}

    # --resume continues the same folder (everything complete: kept), and picks the same.
    proc = subprocess.run([*command, "--resume"], cwd=REPO, env=hooks, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "reward_model.learning_rate=0.0003" in proc.stdout and "Traceback" not in proc.stderr
