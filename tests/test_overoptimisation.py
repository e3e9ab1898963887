"""The reward over-optimisation figure: PPO's reward-model score and the verifier's reward against KL to
the reference, drawn from the per-step values the run logged, with the reward model's held-out pair accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench.report import figures
from bench.report.load import load_suite
from bench.results import read_result, write_json_atomic

from tests.report_fixtures import curves, write_suite


def _step_points(ax: Any) -> list[Any]:
    """The per-step points (one series per run), not the ring that marks the last step nor the binned line."""
    return [line for line in ax.get_lines() if line.get_linestyle() == "None" and line.get_marker() == "."]


def _binned_lines(ax: Any) -> list[Any]:
    return [line for line in ax.get_lines() if line.get_linestyle() != "None"]


def test_the_kl_figure_draws_the_logged_per_step_values(tmp_path: Path, drawn: dict[str, Any]) -> None:
    suite = load_suite(write_suite(tmp_path, methods=("grpo", "ppo", "ppo_verifier")))
    info = figures.overoptimisation_kl_figure(suite, tmp_path / "figures")
    assert info is not None and info.name == "overoptimisation_kl.png"
    assert (tmp_path / "figures" / info.name).stat().st_size > 0
    logged = curves("ppo")  # rm_score rises 1.0 + 0.01 i while accuracy_reward falls 0.40 - 0.005 i; kl 0.001 step
    top, bottom = drawn[info.name].axes
    [proxy], [true] = _step_points(top), _step_points(bottom)  # only PPO (reward model) logged a reward-model score
    assert list(proxy.get_xdata()) == pytest.approx([p["kl"] for p in logged])
    assert list(proxy.get_ydata()) == pytest.approx([p["rm_score"] for p in logged])
    assert list(true.get_xdata()) == pytest.approx([p["kl"] for p in logged])
    assert list(true.get_ydata()) == pytest.approx([100 * p["accuracy_reward"] for p in logged])
    # One line per method through the means of equal-count KL bins of its logged points.
    [proxy_line], [true_line] = _binned_lines(top), _binned_lines(bottom)
    expected = figures.binned_means([(p["kl"], p["rm_score"]) for p in logged])
    assert list(proxy_line.get_xdata()) == pytest.approx([x for x, _ in expected])
    assert list(proxy_line.get_ydata()) == pytest.approx([y for _, y in expected])
    assert list(true_line.get_ydata()) == pytest.approx(
        [y for _, y in figures.binned_means([(p["kl"], 100 * p["accuracy_reward"]) for p in logged])])
    assert len(expected) == figures.KL_BINS and list(proxy_line.get_xdata()) == sorted(proxy_line.get_xdata())
    assert "KL" in bottom.get_xlabel() and "nats/token" in bottom.get_xlabel()
    # The reward model's held-out pair accuracy (104 of 200 in the fixture) beside the figure: on it and below it.
    note = "66.0% of 200 held-out pairs ranked right"
    assert note in top.get_title()
    assert note in info.caption and "KL to the reference" in info.caption


def test_binned_means_split_points_into_equal_count_bins_in_x_order() -> None:
    points = [(0.4, 4.0), (0.1, 1.0), (0.3, 3.0), (0.2, 2.0), (0.6, 6.0), (0.5, 5.0)]
    flat = lambda pairs: [v for pair in pairs for v in pair]  # noqa: E731 - approx compares flat sequences
    assert flat(figures.binned_means(points, bins=3)) == pytest.approx([0.15, 1.5, 0.35, 3.5, 0.55, 5.5])
    assert flat(figures.binned_means(points[:2], bins=8)) == pytest.approx([0.1, 1.0, 0.4, 4.0])  # one per point
    assert figures.binned_means([]) == []


def test_points_missing_a_value_are_left_out_and_steps_keep_their_order(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("ppo",))
    path = suite_dir / "runs" / "ppo-s0"
    result = read_result(path)
    result["curves"] = [{"step": 3, "kl": 0.3, "rm_score": 1.3, "accuracy_reward": 0.2},
                        {"step": 1, "kl": 0.1, "rm_score": 1.1, "accuracy_reward": 0.4},
                        {"step": 2, "kl": None, "rm_score": 1.2, "accuracy_reward": 0.3}]
    write_json_atomic(path / "result.json", result)
    [run] = load_suite(suite_dir).methods
    assert figures.overoptimisation_points(run) == [(1, 0.1, 1.1, 0.4), (3, 0.3, 1.3, 0.2)]


def test_without_a_kl_the_per_step_figure_still_shows_the_two_rewards(tmp_path: Path, drawn: dict[str, Any]) -> None:
    suite_dir = write_suite(tmp_path, methods=("ppo",))
    path = suite_dir / "runs" / "ppo-s0"
    result = read_result(path)
    for point in result["curves"]:
        point["kl"] = 0.0  # no reference network: KL is logged as 0, so there is no KL axis to draw
    write_json_atomic(path / "result.json", result)
    suite = load_suite(suite_dir)
    assert figures.overoptimisation_kl_figure(suite, tmp_path / "figures") is None
    per_step = figures.overoptimisation_figure(suite, tmp_path / "figures")
    assert per_step is not None and "66.0% of 200 held-out pairs ranked right" in per_step.caption
    names = [f.name for f in figures.build_figures(suite, tmp_path / "all")]
    assert "overoptimisation.png" in names and "overoptimisation_kl.png" not in names


def test_no_reward_model_run_no_figure(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, methods=("grpo", "ppo_verifier")))
    assert figures.overoptimisation_kl_figure(suite, tmp_path) is None
    assert figures.overoptimisation_figure(suite, tmp_path) is None
