"""One table of curve metric names (bench.results.METRIC_NAMES): every method writes only names from it, the
report draws only names from it, and every name in it is written by some method (no dead entries).

The TRL recipes are read from the registry (their CURVE_NAMES tables); the suite engine is run for one step
of PPO with a reward model and one of GRPO on the tiny models of tests/test_rollout_engine.py, and the keys it
logs are compared with the table.
"""

from __future__ import annotations

import pytest

from bench.config import registry
from bench.results import METRIC_NAMES, Metric, curve_names, unknown_metrics
from test_rollout_engine import _context, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)

NOT_A_METRIC = {"step"}
"""Curve keys that are the x-axis, not a metric."""


def _trl_recipes() -> dict[str, object]:
    """Every registered stage and method whose training loop is TRL's, by run name."""
    entries = {**registry.STAGES, **registry.METHODS}
    modules = {name: entry.load() for name, entry in entries.items()}
    return {name: module for name, module in modules.items() if module.ENGINE == "trl"}


def _engine_log_keys(tmp_path, model_dirs) -> dict[str, set[str]]:  # noqa: F811 (the fixture's value)
    """The keys the suite engine logs in one step, per method: PPO (reward model, every PPO key), GRPO and DAPO
    (GRPO's successor with every extra key: dynamic sampling's and the overlong penalty's)."""
    from baselines import grpo_engine, grpo_family, ppo
    from bench.config.registry import default_config

    runs = {"ppo": (ppo, ppo.Config(reward="model")),
            "grpo_engine": (grpo_engine, grpo_engine.Config(missing_eos_penalty=1.0)),
            "dapo": (grpo_family, default_config("dapo"))}
    keys = {}
    for name, (recipe, config) in runs.items():
        (tmp_path / name).mkdir()
        ctx = _context(tmp_path / name, model_dirs, name, config)
        ctx.spec.train.steps = 1
        outcome = recipe.train(ctx)
        assert outcome.log_history, name
        keys[name] = {key for point in outcome.log_history for key in point} - NOT_A_METRIC
    return keys


@pytest.fixture(scope="module")
def engine_keys(tmp_path_factory, model_dirs) -> dict[str, set[str]]:  # noqa: F811 (the fixture)
    return _engine_log_keys(tmp_path_factory.mktemp("metric_runs"), model_dirs)


def test_every_entry_has_a_meaning_and_a_unit() -> None:
    for name, metric in METRIC_NAMES.items():
        assert isinstance(metric, Metric), name
        assert metric.meaning.strip() and metric.unit.strip(), name
        assert name.isidentifier() and name == name.lower(), name  # stable, plain keys (CSV and JSON friendly)


def test_every_trl_recipe_maps_to_names_in_the_table() -> None:
    recipes = _trl_recipes()
    assert {"grpo", "dpo", "warm_start", "reward_model"} <= set(recipes)
    for name, module in recipes.items():
        table = getattr(module, "CURVE_NAMES", None)
        assert isinstance(table, dict) and table, f"{name}: a TRL recipe declares its CURVE_NAMES table"
        assert unknown_metrics(table.values()) == [], name


def test_the_engine_logs_only_names_in_the_table(engine_keys) -> None:
    for method, keys in engine_keys.items():
        assert unknown_metrics(sorted(keys)) == [], method
    # the degenerate-output monitors and the PPO critic's diagnostics are among them
    assert {"empty_answer_rate", "repetition_rate", "format_only_rate", "eos_rate"} <= engine_keys["grpo_engine"]
    assert {"rm_score", "value_loss", "vf_clipfrac", "explained_variance", "value_mean"} <= engine_keys["ppo"]


def _vllm_monitor_keys() -> set[str]:
    """The keys the suite engine adds under ``generation.backend=vllm``: its sampler-mismatch monitor's, read from
    the monitor itself over one token (no vLLM here; tests/test_vllm_option.py checks their values)."""
    import torch

    from baselines.engine_rollout import SamplerMismatch
    from test_vllm_option import _batch

    monitor = SamplerMismatch(2)
    monitor.add(torch.tensor([0]), torch.zeros(1, 3), _batch(torch.full((2, 3), -1.0)))
    return set(monitor.metrics())


def test_every_name_in_the_table_is_written_by_some_method(engine_keys) -> None:
    written = set().union(*engine_keys.values()) | _vllm_monitor_keys()
    for module in _trl_recipes().values():
        written |= set(module.CURVE_NAMES.values()) | set(getattr(module, "OWN_CURVES", ()))
    assert set(METRIC_NAMES) - written == set()  # a name nothing writes is a dead entry


def test_report_curves_are_names_in_the_table() -> None:
    from bench.report.figures import CURVE_METRICS
    from bench.report.labels import METRIC_LABELS

    assert CURVE_METRICS and unknown_metrics(CURVE_METRICS) == []
    assert unknown_metrics(METRIC_LABELS) == []


def test_an_unknown_name_is_rejected_with_a_suggestion() -> None:
    assert curve_names({"rewards/margins": "margin"}) == {"rewards/margins": "margin"}
    with pytest.raises(ValueError, match="'margn' \\(did you mean 'margin'\\?\\)"):
        curve_names({"rewards/margins": "margn"})
    assert unknown_metrics(["reward", "step", "rewrd"]) == ["step", "rewrd"]


def test_curves_from_log_history_renames_and_rejects_unknown_names() -> None:
    from baselines.common import curves_from_log_history

    history = [{"step": 1, "loss": 0.5, "rewards/accuracies": 0.75, "epoch": 0.1},
               {"step": 2, "epoch": 0.2},  # no mapped key: no point
               {"step": 2, "train_runtime": 3.0, "loss": 0.4}]  # TRL's final summary: not a point
    assert curves_from_log_history(history, {"loss": "loss", "rewards/accuracies": "pair_accuracy"}) == [
        {"step": 1, "loss": 0.5, "pair_accuracy": 0.75}]
    with pytest.raises(ValueError, match="pair_acc"):
        curves_from_log_history(history, {"rewards/accuracies": "pair_acc"})
