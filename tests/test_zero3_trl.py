"""TRL methods under DeepSpeed ZeRO-3, without DeepSpeed: a partitioned parameter is accounted by
its full shape (ds_numel), and the trained policy is gathered on every rank before rank 0 evaluates it (a stub of
deepspeed.zero.GatheredParameters stands in for the collective).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bench.telemetry import account_networks
from test_rollout_engine import _context, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)


def _partitioned(shape: tuple[int, ...], dtype=torch.bfloat16) -> nn.Parameter:
    """A parameter as ZeRO-3 leaves it on a rank: an empty local tensor, the full size in ds_numel."""
    param = nn.Parameter(torch.empty(0, dtype=dtype))
    param.ds_id, param.ds_shape, param.ds_numel = 0, torch.Size(shape), int(torch.Size(shape).numel())
    return param


def test_partitioned_parameters_are_counted_by_their_full_shape() -> None:
    module = nn.Module()
    module.weight = _partitioned((64, 32))
    module.bias = _partitioned((64,))
    frozen = nn.Module()
    frozen.weight = _partitioned((64, 32))
    frozen.weight.requires_grad_(False)
    accounts = account_networks({"actor": module, "reference": frozen})
    actor, reference = accounts["actor"], accounts["reference"]
    assert actor["params"] == actor["trainable_params"] == actor["partitioned_params"] == 64 * 32 + 64
    assert actor["weight_bytes"] == 2 * (64 * 32 + 64)  # bf16
    assert actor["grad_bytes"] == 2 * (64 * 32 + 64)  # projected from the full shape (no .grad on a partition)
    # two empty partitions are not one tensor: the reference is not "shared" with the actor
    assert reference["params"] == 64 * 32 and reference["shared_params"] == 0 and reference["grad_bytes"] == 0
    whole = account_networks({"actor": nn.Linear(32, 64)})["actor"]
    assert whole["partitioned_params"] == 0 and whole["params"] == 64 * 32 + 64


class _Gather:
    """deepspeed.zero.GatheredParameters stand-in: records who entered; inside, the module's state is whole."""

    entered: list[int] = []

    def __init__(self, params, modifier_rank=None) -> None:
        assert modifier_rank is None  # read-only: nothing is broadcast back
        self.params = params

    def __enter__(self):
        _Gather.entered.append(len(self.params))
        return self

    def __exit__(self, *exc) -> None:
        return None


@pytest.mark.parametrize("main", [True, False])
def test_zero3_policy_is_gathered_on_every_rank_and_copied_on_rank_0(tmp_path, model_dirs, monkeypatch,
                                                                     main):  # noqa: F811
    """Every rank enters the gather (a collective: rank 0 alone would hang); rank 0 gets a whole policy with the
    trained weights, built as the recipe builds it; the other ranks get None (they do not evaluate)."""
    from transformers import AutoModelForCausalLM

    from baselines import common, grpo
    from bench.execution import launch

    _Gather.entered = []
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(zero=types.SimpleNamespace(
        GatheredParameters=_Gather)))
    monkeypatch.setattr(launch, "is_main", lambda: main)
    ctx = _context(tmp_path, model_dirs, "grpo", grpo.Config())
    trained = AutoModelForCausalLM.from_pretrained(model_dirs[0])
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.5)  # "trained": differs from the checkpoint the copy is built from
            p.ds_id = 0  # as ZeRO-3 marks its parameters (the stub keeps the data whole)
    policy = common.evaluable_policy(ctx, SimpleNamespace(model=trained))
    assert _Gather.entered == [len(list(trained.parameters()))]
    if not main:
        assert policy is None
        return
    assert policy is not trained and not common.zero3_partitioned(policy)
    want = trained.state_dict()
    for name, value in policy.state_dict().items():
        assert torch.equal(value, want[name]), name


def test_without_zero3_the_trainers_model_is_evaluated_as_is(tmp_path, model_dirs):  # noqa: F811
    from baselines import common, grpo

    ctx = _context(tmp_path, model_dirs, "grpo", grpo.Config())
    model = nn.Linear(2, 2)
    assert common.evaluable_policy(ctx, SimpleNamespace(model=model)) is model
