"""Tuning on a validation split, never on test (bench.execution.tune): the split carved from the training side (disjoint,
deterministic, the test split never loaded), the grids expanded into per-method sweep points, the pick by mean
validation accuracy on hand-made result files, the tuned preset loading back, and one tiny tune end to end. The
end-to-end test (a planted score, the loader audited in every worker) is tests/test_tune_planted.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.task import data as data_module
from bench.cli import main
from bench.task.data import load_task
from bench.errors import SpecError
from bench.execution.plan import make_plan
from bench.results import empty_result, write_json_atomic
from bench.config.loading import load_spec
from bench.execution.plan import run_id
from bench.task.problems import question_overlap, working
from bench.execution.tune import Grid, collect_scores, finish_tune, grids_for, pick, read_grid_file, tune_spec
from bench.task.verifier import HEADLINE_MODE

from tests.bench_cli import run_bench

ROOT = Path(__file__).resolve().parents[1]


def _sets(problems: list[dict]) -> tuple[set[str], set[str]]:
    return {working(p["answer"]) for p in problems}, {p["question"].casefold() for p in problems}


# --- the validation split --------------------------------------------------------------------------------------
def test_validation_split_is_disjoint_from_train_and_test_and_deterministic() -> None:
    spec = load_spec("cpu-quick", ["task.validation_size=40"])
    first, again = load_task(spec), load_task(spec)
    assert len(first.validation) == 40 and len(first.train) == spec.task.train_size
    assert len(first.test) == spec.task.test_size and first.eval_split == "test"
    assert (first.train, first.validation, first.test) == (again.train, again.validation, again.test)
    train_w, train_q = _sets(first.train)
    val_w, val_q = _sets(first.validation)
    test_w, test_q = _sets(first.test)
    # Held out by working, like test: no validation problem's working occurs in the training problems left.
    assert not (val_w & train_w) and not (val_w & test_w) and not (val_q & train_q) and not (val_q & test_q)
    assert first.checks["validation_working_overlap"] == 0 and first.checks["working_overlap"] == 0
    # The test split is the one a run without validation sees (same questions, evaluated the same).
    plain = load_task(load_spec("cpu-quick"))
    assert plain.test == first.test and plain.validation == [] and plain.evaluated == plain.test


def test_a_tuning_run_evaluates_on_validation_and_never_loads_the_test_split(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_test(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the test split was generated")

    monkeypatch.setattr(data_module, "synthetic_splits", no_test)
    spec = load_spec("cpu-quick", ["task.validation_size=40", "eval.split=validation"])
    data = load_task(spec)
    assert data.test == [] and data.evaluated == data.validation and len(data.validation) == 40
    assert data.checks["eval_split"] == "validation" and data.checks["working_overlap"] == 0


def test_a_gsm8k_file_is_carved_by_question_and_its_test_file_is_not_read(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    for split, n in (("train", 60), ("test", 10)):
        rows = [{"question": f"{split} question {i}?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"} for i in range(n)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    read: list[str] = []
    real = data_module.read_gsm8k
    monkeypatch.setattr(data_module, "read_gsm8k", lambda path, split, limit=None: read.append(split) or
                        real(path, split, limit))
    base = ["model.source=path", f"model.name_or_path={tmp_path}", "task.source=gsm8k", f"task.path={folder}",
            "task.train_size=40", "task.test_size=10", "task.validation_size=12"]
    data = load_task(load_spec("cpu-quick", [*base, "eval.split=validation"]))
    assert read == ["train"] and len(data.validation) == 12 and len(data.train) == 40
    assert question_overlap(data.train, data.validation) == 0
    read.clear()
    with_test = load_task(load_spec("cpu-quick", base))
    assert read == ["train", "test"] and with_test.validation == data.validation and len(with_test.test) == 10


def test_evaluating_on_validation_needs_a_validation_split() -> None:
    with pytest.raises(SpecError, match="'eval.split' is 'validation' but 'task.validation_size' is 0"):
        load_spec("cpu-quick", ["eval.split=validation"])


# --- the grid ------------------------------------------------------------------------------------------------
def test_the_shipped_grids_expand_into_the_declared_points() -> None:
    size, grids = grids_for("cpu-tiny", read_grid_file())
    assert size == 1000
    assert len(grids["dpo"].points()) == 2 * 2 * 3  # product: learning rate x beta x loss variant
    assert {p["methods.dpo.loss_type"] for p in grids["dpo"].points()} == {"sigmoid", "ipo", "sigmoid,sft"}
    assert len(grids["ppo"].points()) == 1 + 2 + 1 + 1  # one at a time over three knobs (the reward model: its own)
    # Every axis starts at the preset's own value, so a tune can only match or beat the shipped settings.
    spec = load_spec("cpu-tiny", [])
    for method, grid in grids.items():
        for key, values in grid.axes.items():
            node: object = spec
            for part in key.split("."):
                node = node[part] if isinstance(node, dict) else getattr(node, part)
            assert values[0] == node, (method, key, values[0], node)
    assert grids["grpo"].points()[0] == {"methods.grpo.learning_rate": 1.0e-4}  # the tuned value the preset ships
    assert grids_for("gsm8k-qwen0.5b", read_grid_file())[1]["dpo"].axes["methods.dpo.learning_rate"][0] == 5.0e-7


def test_a_tune_is_a_per_method_sweep_on_validation_sharing_its_stages() -> None:
    base = load_spec("cpu-quick")
    _, grids = grids_for("cpu-quick", read_grid_file())
    spec = tune_spec(base, grids, ["grpo_engine", "ppo", "dpo"], [0, 1], 24)
    assert spec.eval.split == "validation" and spec.task.validation_size == 24 and spec.train.steps == base.train.steps
    runs = make_plan(spec)
    stages = [r.run_id for r in runs if r.kind == "stage"]
    methods = [r for r in runs if r.kind == "method"]
    # One warm start, pool and reward model for all (its grid is its own: tests/test_tune_reward_model.py).
    assert stages == ["warm_start", "sample_pool", "reward_model"]
    assert len(methods) == 2 * (2 + 2 + 2)  # seeds x (grpo_engine + ppo + dpo points)
    by_id = {r.run_id: r for r in methods}
    assert by_id["dpo-s1@ipo"].values == (("methods.dpo.loss_type", "ipo"),)
    # A point's id names what differs from its method's first point; the first method's first point is "base".
    assert by_id["ppo-s0@lr0.001-ppo"].needs == ("warm_start", "sample_pool", "reward_model")
    assert by_id["grpo_engine-s0@base"].values == (("methods.grpo_engine.learning_rate", 1.0e-4),)
    assert by_id["ppo-s0@base-ppo"].values == (("methods.ppo.learning_rate", 1.0e-4),)
    # At a reward model chosen first, every PPO point carries its values and reads that one stage.
    at = make_plan(tune_spec(base, grids, ["grpo_engine", "ppo", "dpo"], [0, 1], 24, {"reward_model.epochs": 1},
                             ["ppo"]))
    assert [r.run_id for r in at if r.kind == "stage"] == ["warm_start", "sample_pool", "reward_model@rmep1"]
    assert {r.needs[-1] for r in at if r.name == "ppo"} == {"reward_model@rmep1"}
    assert {r.name for r in methods if r.point == "ipo"} == {"dpo"}  # a method runs at its own points only
    from bench.config.rules import point_spec

    point = point_spec(spec, dict(by_id["dpo-s0@ipo"].values))
    assert point.methods["dpo"].loss_type == "ipo" and point.train.steps == base.train.steps
    assert point.eval.split == "validation"


def test_a_bad_grid_is_one_line() -> None:
    base = load_spec("cpu-quick")
    with pytest.raises(SpecError, match="a point of dpo may set only its own settings"):
        tune_spec(base, {"dpo": Grid("dpo", {"methods.ppo.kl_coef": [0.1]})}, ["dpo"], [0], 24)
    with pytest.raises(SpecError, match=r"unknown key 'methods.dpo.betta'.*did you mean 'beta'"):
        tune_spec(base, {"dpo": Grid("dpo", {"methods.dpo.betta": [0.1]})}, ["dpo"], [0], 24)
    with pytest.raises(SpecError, match="'methods.dpo.beta' must be > 0"):
        tune_spec(base, {"dpo": Grid("dpo", {"methods.dpo.beta": [0.0]})}, ["dpo"], [0], 24)
    code = main(["tune", "--preset", "cpu-quick", "--methods", "control", "--dry-run"])
    assert code == 2


# --- the pick and the tuned preset ---------------------------------------------------------------------------
def _fake_results(suite_dir: Path, spec: Any, accuracy: dict[tuple[str, int], float | None]) -> None:
    """A result file per (point, seed) of grpo_engine with the given validation accuracy (None: a failed run)."""
    for (point, seed), value in accuracy.items():
        rid = run_id("grpo_engine", seed, point)
        result = empty_result(rid, "method", "grpo_engine", "GRPO", "suite", seed)
        if value is None:
            result["status"] = "failed"
        else:
            result["status"] = "ok"
            result["accuracy"] = {"n_questions": 24, "before": None,
                                  "after": {HEADLINE_MODE: {"accuracy": value, "low": 0.0, "high": 1.0}}}
        write_json_atomic(suite_dir / "runs" / rid / "result.json", result)


def _tune_args(**kw: Any) -> argparse.Namespace:
    args = dict(preset="cpu-quick", methods="grpo_engine", seeds=2, grid=None, out=None, overrides=[])
    args.update(kw)
    return argparse.Namespace(**args)


@pytest.fixture
def three_points() -> tuple[Any, Any, dict[str, Grid]]:
    base = load_spec("cpu-quick")
    grids = {"grpo_engine": Grid("grpo_engine", {"methods.grpo_engine.learning_rate": [1.0e-4, 3.0e-4, 1.0e-3]})}
    return base, tune_spec(base, grids, ["grpo_engine"], [0, 1], 24), grids


def test_the_pick_is_the_best_mean_over_seeds_among_complete_points(tmp_path: Path, three_points: Any) -> None:
    _, spec, _ = three_points
    # 3e-4 has the best single seed but a lower mean (0.50 against 0.55); 1e-3 is best but one of its seeds failed.
    _fake_results(tmp_path, spec, {("base", 0): 0.5, ("base", 1): 0.6, ("lr0.0003", 0): 0.7,
                                   ("lr0.0003", 1): 0.3, ("lr0.001", 0): 0.9, ("lr0.001", 1): None})
    scores = collect_scores(tmp_path, spec)["grpo_engine"]
    assert [s.point for s in scores] == ["base", "lr0.0003", "lr0.001"]
    best = pick(scores)
    assert best is not None and best.point == "base" and best.mean == pytest.approx(0.55)
    assert best.sd == pytest.approx(0.0707107, abs=1e-6) and not scores[2].complete
    # A tie goes to the point first in the grid (the preset's own value comes first).
    tie = collect_scores(tmp_path, spec)["grpo_engine"]
    tie[1].accuracy = {0: 0.55, 1: 0.55}
    assert pick(tie).point == "base"


def test_the_tuned_preset_loads_back_and_applies(tmp_path: Path, three_points: Any,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    base, spec, grids = three_points
    _fake_results(tmp_path, spec, {("base", 0): 0.4, ("base", 1): 0.5, ("lr0.0003", 0): 0.6,
                                   ("lr0.0003", 1): 0.7, ("lr0.001", 0): 0.2, ("lr0.001", 1): 0.1})
    code = finish_tune(tmp_path, spec, base, grids, ["grpo_engine"], _tune_args(), "bench tune --preset cpu-quick")
    assert code == 0
    path = tmp_path / "tuned-cpu-quick.yaml"
    out = capsys.readouterr().out
    assert f"bench run --preset {path}" in out and "methods.grpo_engine.learning_rate=0.0003" in out
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Tuned settings for preset cpu-quick") and "extends: cpu-quick" in text
    tuned = load_spec(path)
    assert tuned.methods["grpo_engine"].learning_rate == pytest.approx(3.0e-4)
    assert tuned.name == base.name and tuned.train.steps == base.train.steps
    assert tuned.eval.split == "test" and tuned.task.validation_size == 0  # the tuned run trains on all, tests on test
    assert tuned.tuning.source == str(path) and tuned.tuning.command == "bench tune --preset cpu-quick"
    record = tuned.tuning.methods["grpo_engine"]
    assert record["chosen"] == {"methods.grpo_engine.learning_rate": 3.0e-4}
    assert record["score"]["mean"] == pytest.approx(0.65) and record["score"]["n"] == 2
    assert record["seeds"] == [0, 1] and record["n_questions"] == 24 and record["scoring_mode"] == HEADLINE_MODE
    assert record["grid"] == {"methods.grpo_engine.learning_rate": [1.0e-4, 3.0e-4, 1.0e-3]}
    assert [s["point"] for s in record["scores"]] == ["base", "lr0.0003", "lr0.001"]
    assert record["default_point"] == "base"  # 1e-4 is what grpo_engine inherits (train.learning_rate)
    # Results carry it in their spec (result["spec"]["tuning"]); an untuned method has no entry.
    assert "grpo" not in tuned.tuning.methods and load_spec("cpu-quick").tuning.source is None
    # Overrides still apply on top of the tuned preset.
    assert load_spec(path, ["train.steps=2"]).train.steps == 2


def _dotted(spec: Any, key: str) -> Any:
    node: Any = spec
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def test_the_shipped_cpu_tiny_runs_what_its_tuning_record_chose() -> None:
    """cpu-tiny's `tuning:` block quotes the shipped record (bench/config/presets/tuning/cpu-tiny.yaml) and runs
    every value it chose, the reward model's included, so the page never quotes a tune the preset does not run."""
    spec = load_spec("cpu-tiny")
    record_path = Path(__file__).resolve().parents[1] / spec.tuning.source
    record = yaml.safe_load(record_path.read_text(encoding="utf-8"))["tuning"]["methods"]
    assert set(spec.tuning.methods) == set(record) and "reward_model" in record
    for method, entry in spec.tuning.methods.items():
        assert entry["chosen"] == record[method]["chosen"], method
        assert entry["score"] == record[method]["score"] and entry["points"] == len(record[method]["scores"]), method
        for key, value in entry["chosen"].items():
            shipped = _dotted(spec, key)
            assert shipped == pytest.approx(value) if isinstance(value, float) else shipped == value, (method, key)


def test_extends_resolves_relative_files_and_refuses_a_loop(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: cpu-quick\ntrain: {steps: 3}\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nmethods: {dpo: {beta: 0.3}}\n", encoding="utf-8")
    spec = load_spec(tmp_path / "b.yaml")
    assert spec.train.steps == 3 and spec.methods["dpo"].beta == 0.3 and spec.train.group_size == 4
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n", encoding="utf-8")
    with pytest.raises(SpecError, match="more than 8 presets deep"):
        load_spec(tmp_path / "loop.yaml")


# --- the command -----------------------------------------------------------------------------------------------
def test_dry_run_lists_each_methods_points(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--preset", "cpu-quick", "--methods", "dpo,grpo_engine", "--seeds", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep (per_method)" in out and "dpo: base-dpo, ipo" in out and "grpo_engine: base, lr0.001" in out
    assert "evaluation on the validation split" in out
    assert "dpo-s0@ipo" in out
    assert main(["tune", "--preset", "cpu-quick", "--methods", "nope", "--dry-run"]) == 2


def test_a_tiny_tune_runs_end_to_end(tmp_path: Path) -> None:
    """Two learning rates of the suite's GRPO, one seed, a few steps on cpu-quick sizes: the runs evaluate on the
    validation split and the tuned preset names the better point."""
    out = tmp_path / "tune"
    proc = run_bench("tune", "--preset", "cpu-quick", "--methods", "grpo_engine", "--seeds", "1", "--out", str(out),
                     "warm_start.steps=20", "train.steps=2", cache_dir=tmp_path / "cache", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = out / "tuned-cpu-quick.yaml"
    assert f"bench run --preset {path.resolve()}" in proc.stdout
    for point in ("base", "lr0.001"):
        result = json.loads((out / "runs" / f"grpo_engine-s0@{point}" / "result.json").read_text(encoding="utf-8"))
        assert result["spec"]["eval"]["split"] == "validation" and result["accuracy"]["n_questions"] == 48
        assert result["data_checks"]["eval_split"] == "validation" and result["data_checks"]["working_overlap"] == 0
    record = load_spec(path).tuning.methods["grpo_engine"]
    best = max(record["scores"], key=lambda s: (s["mean"], -record["scores"].index(s)))
    assert record["point"] == best["point"]
    assert yaml.safe_load(path.read_text(encoding="utf-8"))["extends"] == "cpu-quick"
