"""The reward-model stage (baselines/reward_model.py, issue 21 item 3): micro-batches of train.micro_batch_size
pairs with gradient accumulation and gradient checkpointing train the same model as one batch; a pool without
enough pairs stops the stage (and DPO) with one line naming the fixes (issue 20).

Tiny random Qwen2 models of tests/test_rollout_engine.py; no network.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from baselines import dpo, reward_model
from bench.errors import UserError
from bench.execution.sample_pool import pool_entry, required_pairs
from test_rollout_engine import _context, _rows, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def _pool(path: Path, rows: list[dict], right: bool = True, mode: str = "verifier") -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            completions = [f"<answer>{row['answer']}</answer>" if right else "<answer>0</answer>",
                           f"<think>{i}</think> <answer>{int(row['answer']) + 1}</answer>"]
            entry = pool_entry({**row, "solution": f"{row['answer']}\n#### {row['answer']}"}, completions,
                               [right, False], mode)
            handle.write(json.dumps(entry) + "\n")
    return path


def _stage_context(tmp_path: Path, model_dirs, micro: int, checkpointing: bool):  # noqa: F811
    from bench.telemetry import Telemetry

    tmp_path.mkdir(parents=True, exist_ok=True)
    ctx = _context(tmp_path, model_dirs, "reward_model", None)
    ctx.method_spec = None
    ctx.telemetry = Telemetry("cpu", enabled=False)
    ctx.pool_path = _pool(tmp_path / "pool.jsonl", _rows(40))
    spec = ctx.spec
    spec.reward_model.batch_size, spec.reward_model.epochs, spec.reward_model.eval_fraction = 12, 2, 0.1
    spec.reward_model.learning_rate = 1e-3
    spec.train.micro_batch_size, spec.train.gradient_checkpointing = micro, checkpointing
    return ctx


def test_micro_batches_with_checkpointing_train_the_one_batch_model(tmp_path, model_dirs):  # noqa: F811
    """40 pairs: 4 held out, 36 to train in 2 epochs of 3 steps of 12 pairs; micro-batches of 4 pairs (3
    accumulation steps, checkpointing on) end at the same weights as one batch of 12 (summation order aside)."""
    outcomes = {}
    for micro, checkpointing in ((0, False), (4, True)):
        ctx = _stage_context(tmp_path / f"m{micro}", model_dirs, micro, checkpointing)
        torch.manual_seed(0)
        outcomes[micro] = reward_model.train(ctx)
    whole, micro = outcomes[0], outcomes[4]
    assert whole.settings["micro_batch_pairs"] == 12 and whole.settings["gradient_accumulation_steps"] == 1
    assert micro.settings["micro_batch_pairs"] == 4 and micro.settings["gradient_accumulation_steps"] == 3
    assert micro.settings["gradient_checkpointing"] is True
    assert whole.steps == micro.steps == 6
    from bench.model.loading import load_sequence_classifier

    initial = load_sequence_classifier(model_dirs[0], "float32", "cpu", trained=True).state_dict()
    a, b = whole.policy.state_dict(), micro.policy.state_dict()
    # training moved the backbone (the score head is freshly initialised at every load: not compared with it)
    assert any(not torch.equal(a[k], initial[k]) for k in a if not k.startswith("score."))
    for key in a:
        assert torch.allclose(a[key], b[key], atol=2e-5), key
    losses = [[p["loss"] for p in o.log_history if "loss" in p] for o in (whole, micro)]
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)


def test_pair_micro_batch_is_the_largest_divisor() -> None:
    assert reward_model.pair_micro_batch(32, 0) == 32
    assert reward_model.pair_micro_batch(32, 8) == 8
    assert reward_model.pair_micro_batch(32, 6) == 4  # equal micro-batches: the mean of means is the mean
    assert reward_model.pair_micro_batch(32, 64) == 32


def test_a_pool_without_pairs_stops_its_consumers_in_one_line(tmp_path, model_dirs):  # noqa: F811
    path = _pool(tmp_path / "wrong.jsonl", _rows(6), right=False)
    with pytest.raises(UserError) as caught:
        required_pairs(path, 4, "the reward model")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the sample pool has 0 preference pairs")
    assert "0 of 12 sampled completions correct" in message and "sample_pool.pairs=gold" in message
    ctx = _stage_context(tmp_path, model_dirs, 0, False)
    ctx.pool_path = path
    with pytest.raises(UserError, match="needs at least 4; set sample_pool.pairs=gold"):
        reward_model.train(ctx)
    ctx.method, ctx.method_spec = "dpo", dpo.Config()
    with pytest.raises(UserError, match="but DPO needs at least 1"):
        dpo.train(ctx)
    gold = _pool(tmp_path / "gold.jsonl", _rows(6), right=False, mode="gold")
    assert len(required_pairs(gold, 4, "the reward model")) == 6  # gold pairs: the worked solution as chosen
