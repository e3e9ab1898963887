"""Tests of bench.telemetry.param_change: did training move the trained weights?

The bfloat16 test is the reason the module exists: at lr 1e-6 a pure-bf16 AdamW step rounds most updates
away, while the same step on fp32 weights changes them all.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bench.telemetry import ParamSnapshot


def _model(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to(dtype)


def _adamw_step(model: nn.Module, lr: float = 1e-6) -> None:
    """One AdamW step on a random regression batch (every parameter gets a non-zero gradient)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    dtype = next(model.parameters()).dtype
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    model(x).float().pow(2).mean().backward()
    optimizer.step()


def test_fp32_adamw_step_changes_nearly_every_weight() -> None:
    model = _model()
    snap = ParamSnapshot.take(model)
    _adamw_step(model)
    change = snap.compare(model)
    assert change["method"] == "exact"
    assert change["trainable_params"] == 16 * 32 + 32 + 32 * 4 + 4
    # Adam's first step moves every element with a gradient by about lr; fp32 spacing near |w| < 0.25 is
    # at most 2**-26 ~ 1.5e-8, far below 1e-6, so every such update is stored.
    assert change["params_changed_fraction"] > 0.99
    assert 0 < change["update_to_weight_ratio"] < 1e-4


def test_bf16_adamw_step_at_small_lr_is_mostly_rounded_away() -> None:
    model = _model(torch.bfloat16)
    snap = ParamSnapshot.take(model)
    _adamw_step(model)  # pure bf16: weights, gradients and AdamW states all bfloat16
    change = snap.compare(model)
    # bf16 keeps 8 significant bits: near |w| = 0.1 the spacing is 2**-11 ~ 5e-4, so a 1e-6 update rounds
    # back to the stored value; only weights within ~2e-4 of zero can move.
    assert change["params_changed_fraction"] < 0.5
    assert change["trainable_params"] == 16 * 32 + 32 + 32 * 4 + 4


def test_frozen_parameters_are_excluded() -> None:
    model = _model()
    model[0].requires_grad_(False)
    snap = ParamSnapshot.take(model)
    assert set(snap.entries) == {"2.weight", "2.bias"}
    _adamw_step(model)
    change = snap.compare(model)
    assert change["trainable_params"] == 32 * 4 + 4
    assert change["params_changed_fraction"] > 0.99  # the frozen (unchanged) layer does not dilute it


def test_update_to_weight_ratio_and_fraction_by_hand() -> None:
    model = nn.Module()
    model.a = nn.Parameter(torch.tensor([3.0, 0.0]))
    model.b = nn.Parameter(torch.tensor([4.0]))
    snap = ParamSnapshot.take(model)
    with torch.no_grad():
        model.a[1] = 1.2  # diff (0, 1.2)
        model.b[0] = 5.6  # diff 1.6
    change = snap.compare(model)
    # ||w_start|| = sqrt(9 + 0 + 16) = 5; ||diff|| = sqrt(1.44 + 2.56) = 2 -> 0.4; 2 of 3 elements changed.
    assert change["update_to_weight_ratio"] == pytest.approx(0.4)
    assert change["params_changed_fraction"] == pytest.approx(2 / 3)
    assert change["trainable_params"] == 3


def test_snapshot_is_a_copy_not_a_view() -> None:
    model = nn.Linear(3, 3)
    snap = ParamSnapshot.take(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    change = snap.compare(model)
    assert change["params_changed_fraction"] == pytest.approx(9 / 12)  # the weight moved, the bias did not


def test_sampled_mode_estimates_the_exact_figures() -> None:
    model = nn.Module()
    model.big = nn.Parameter(torch.randn(20_000, generator=torch.Generator().manual_seed(0)))
    model.small = nn.Parameter(torch.randn(2_000, generator=torch.Generator().manual_seed(1)))
    exact = ParamSnapshot.take(model)
    sampled = ParamSnapshot.take(model, exact_limit=1_000, sample_elements=4_000, seed=3)
    with torch.no_grad():
        model.big[:5_000] += 0.5  # a quarter of big changes
        model.small[:1_000] -= 0.5  # half of small changes
    truth = exact.compare(model)
    estimate = sampled.compare(model)
    # exact: (5000 + 1000) / 22000
    assert truth["params_changed_fraction"] == pytest.approx(6_000 / 22_000)
    assert estimate["method"] == "sampled (4000 elements)"
    assert estimate["trainable_params"] == 22_000
    # 4000 samples: standard error of the share ~ sqrt(0.27 * 0.73 / 4000) ~ 0.007; allow about 4 of them.
    assert estimate["params_changed_fraction"] == pytest.approx(truth["params_changed_fraction"], abs=0.03)
    assert estimate["update_to_weight_ratio"] == pytest.approx(truth["update_to_weight_ratio"], rel=0.1)
    # Sampled mode keeps only the sample on the host.
    assert sum(e.values.numel() for e in sampled.entries.values()) == 4_000


def test_sampled_positions_are_fixed_by_the_seed() -> None:
    model = nn.Linear(100, 100)
    a = ParamSnapshot.take(model, exact_limit=10, sample_elements=500, seed=7)
    b = ParamSnapshot.take(model, exact_limit=10, sample_elements=500, seed=7)
    assert all(torch.equal(a.entries[n].index, b.entries[n].index) for n in a.entries)


def test_a_parameter_gone_after_training_is_reported_not_counted() -> None:
    model = _model()
    snap = ParamSnapshot.take(model)
    del model[2]  # e.g. a LoRA merge that removed the adapter parameters
    change = snap.compare(model)
    assert change["missing_params"] == ["2.weight", "2.bias"]
    assert change["params_changed_fraction"] == 0.0
    assert math.isfinite(change["update_to_weight_ratio"])
