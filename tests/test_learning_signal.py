"""'Training moved the weights' must not count noise as learning. A run whose every GRPO group had equal
rewards has no learning signal (flagged), weight decay alone is a floor the movement must exceed, and with the
reference in the actor's numerics such a run no longer moves at all (before: KL ~ 0.002 noise, which AdamW turned
into lr-sized steps on 95-99.9% of the weights).
"""

from __future__ import annotations

import pytest
import torch

from bench.telemetry.param_change import assess_training_change, learning_signal, weight_decay_floor
from test_numerics import _bf16_checkpoint
from test_rollout_engine import _context, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def _change(fraction: float, ratio: float) -> dict:
    return {"params_changed_fraction": fraction, "update_to_weight_ratio": ratio, "trainable_params": 10,
            "method": "exact"}


def test_weight_decay_floor_by_hand() -> None:
    # 10 steps at lr 1e-3, wd 0.1: each step multiplies by 1 - 1e-4, so 1 - 0.9999^10 = 9.9955e-4
    assert weight_decay_floor(1e-3, 0.1, 10) == pytest.approx(9.99550e-4, rel=1e-5)
    assert weight_decay_floor(1e-3, 0.0, 10) == weight_decay_floor(0.0, 0.1, 10) == 0.0


def test_decayed_weights_sit_exactly_on_the_floor() -> None:
    """AdamW with zero gradients and weight decay: the measured ratio is the floor (not learning)."""
    from bench.telemetry import ParamSnapshot

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 16)
    snapshot = ParamSnapshot.take(layer)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3, weight_decay=0.1)
    for _ in range(10):
        for p in layer.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    change = snapshot.compare(layer)
    assert change["params_changed_fraction"] > 0.99  # every weight changed...
    assessed = assess_training_change(change, {"no_learning_signal": False}, 1e-3, 0.1, 10)
    assert change["update_to_weight_ratio"] == pytest.approx(assessed["weight_decay_floor"], rel=1e-3)
    assert assessed["moved_beyond_floor"] is False and assessed["verdict"] == "within the weight-decay floor"


@pytest.mark.parametrize("fraction, ratio, signal, lr, verdict", [
    (0.99, 1e-3, False, 1e-4, "moved"),
    (0.99, 1e-3, True, 1e-4, "no learning signal"),  # moved, but nothing told completions apart: noise
    (0.0, 0.0, False, 0.0, "unchanged (learning rate 0)"),
    (0.3, 1e-3, False, 1e-4, "mostly rounded away"),
    (0.0, 0.0, False, 1e-4, "not moved"),
    (None, None, None, 1e-4, "not measured"),
])
def test_verdicts(fraction, ratio, signal, lr, verdict) -> None:
    change = _change(fraction, ratio)
    assert assess_training_change(change, {"no_learning_signal": signal}, lr, 0.0, 5)["verdict"] == verdict


def test_learning_signal_from_engine_metrics_and_trl_curves() -> None:
    assert learning_signal([], {"zero_std_groups_mean": 1.0})["no_learning_signal"] is True
    assert learning_signal([], {"zero_std_groups_mean": 0.75})["no_learning_signal"] is False
    curves = [{"step": 1, "zero_std_groups": 1.0}, {"step": 2, "zero_std_groups": 0.5}]
    signal = learning_signal(curves, {})
    assert signal["zero_std_groups_mean"] == 0.75 and signal["no_learning_signal"] is False
    assert learning_signal([{"step": 1, "loss": 0.3}], {})["no_learning_signal"] is None  # DPO: no groups


def test_a_run_without_reward_spread_is_flagged_and_does_not_move(tmp_path, model_dirs):  # noqa: F811
    """GRPO on the engine under the GPU preset's precision policy with a reward that is 0 for every completion:
    every group has zero spread. With the reference in the actor's numerics the gradient is exactly 0, so AdamW
    (no decay) leaves every weight as it was, and the worker's assessment says 'no learning signal'."""
    from baselines import grpo_engine
    from bench.execution.worker import assess_learning
    from bench.telemetry import Telemetry

    ctx = _context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config())
    ctx.init_model_dir = _bf16_checkpoint(model_dirs[0], tmp_path / "start")
    spec = ctx.spec
    spec.model.dtype = "bfloat16"
    spec.reward.accuracy_weight = spec.reward.format_weight = spec.reward.length_penalty = 0.0
    ctx.telemetry = Telemetry("cpu", enabled=False, track_training_change=True)
    torch.manual_seed(0)
    with ctx.telemetry:
        outcome = grpo_engine.train(ctx)
    assert outcome.metrics["zero_std_groups_mean"] == 1.0
    result: dict = {}
    assess_learning(result, spec, "grpo_engine", outcome, ctx.telemetry.training_change())
    assert result["learning_signal"]["no_learning_signal"] is True
    assert result["training_change"]["params_changed_fraction"] == 0.0  # noise no longer moves the weights
    assert result["training_change"]["verdict"] == "no learning signal"
