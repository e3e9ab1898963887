"""The reward-model stage (baselines/reward_model.py): micro-batches of train.micro_batch_size
pairs with gradient accumulation and gradient checkpointing train the same model as one batch; a pool without
enough pairs stops the stage (and DPO) with one line naming the fixes.

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


# --- the reward model is trained, evaluated and read by PPO on the same tokens at the same position -----
def _entry(question: str, completions: list[str], correct: list[bool]) -> dict:
    return {"prompt": f"Q: {question}\n", "question": question, "answer": "1", "completions": completions,
            "correct": correct, "pairs": "verifier"}


def test_split_is_by_question_with_one_held_out_pair_each_and_every_training_pair() -> None:
    # 10 questions x 2 pool lines each (the same question sampled twice), 2 right x 2 wrong samples per line
    pool = [_entry(f"q{q}", ["r1", "r2", "w1", "w2"], [True, True, False, False]) for q in range(10) for _ in (0, 1)]
    pool.append(_entry("all-right", ["r", "r"], [True, True]))  # gives no pair: in neither side
    heldout, train, probe = reward_model.split_pairs(pool, 0.3, seed=0, every_pair=True)
    held_questions = {p["prompt"] for p in heldout}
    train_questions = {p["prompt"] for p in train}
    assert len(heldout) == 3 and len(held_questions) == 3  # one pair per held-out question, not one per line
    assert not held_questions & train_questions  # no question on both sides
    assert len(train) == 7 * 2 * 4  # every (right, wrong) combination of both lines of the 7 training questions
    assert {(p["chosen"], p["rejected"]) for p in train} == {("r1", "w1"), ("r1", "w2"), ("r2", "w1"), ("r2", "w2")}
    assert len(probe) == 3 and {p["prompt"] for p in probe} <= train_questions
    first = reward_model.split_pairs(pool, 0.3, seed=0, every_pair=False)[1]
    assert len(first) == 14 and {(p["chosen"], p["rejected"]) for p in first} == {("r1", "w1")}
    assert reward_model.split_pairs(pool, 0.3, seed=1, every_pair=True)[0] != heldout  # the seed draws the split


def test_read_positions_skip_an_eos_that_is_the_pad_token() -> None:
    from bench.model.loading import reward_read_positions

    ids = torch.tensor([[0, 5, 6, 2], [5, 6, 2, 0]])  # left- and right-padded rows ending in EOS id 2
    last = torch.tensor([3, 2])
    assert reward_read_positions(ids, last, pad_token_id=0).tolist() == [3, 2]  # pad != EOS: read the EOS
    assert reward_read_positions(ids, last, pad_token_id=2).tolist() == [2, 1]  # pad == EOS: the token before it


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_trainer_evaluation_and_ppo_score_the_same_tokens_at_the_same_position(tmp_path, model_dirs,
                                                                             pad_is_eos):  # noqa: F811
    """The score TRL's loss uses (the model's own forward on the collated, right-padded batch), the stage's pair
    accuracy and PPO's rollout scores (left-padded prompt, completion padded after its EOS) are one number."""
    from trl import RewardConfig, RewardTrainer
    from datasets import Dataset

    from bench.model.loading import load_sequence_classifier, load_tokenizer

    tokenizer = load_tokenizer(model_dirs[1])
    model = load_sequence_classifier(model_dirs[1], "float32", "cpu")
    if pad_is_eos:
        tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.eos_token_id
    pairs = [{"prompt": f"Question {i}: 3 + {i}?\n", "chosen": f"<answer>{3 + i}</answer>",
              "rejected": f"<think>{i}{i}</think> <answer>{i}</answer>"} for i in range(5)]
    trainer = RewardTrainer(model=model, processing_class=tokenizer,
                            args=RewardConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to=[]),
                            train_dataset=Dataset.from_list([reward_model.pair_token_ids(tokenizer, p)
                                                             for p in pairs]))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    with torch.no_grad():
        trained_on = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    scores = reward_model.pair_scores(model, tokenizer, pairs)
    assert torch.allclose(scores.T.reshape(-1), trained_on, atol=1e-5)

    # PPO's read: the engine's reward_model_scores on a rollout holding the same prompt and completion tokens
    from baselines.engine_rollout import Rollout, sequence_inputs
    from baselines.rollout_engine import Engine

    prompts = tokenizer([p["prompt"] for p in pairs], return_tensors="pt", padding=True, add_special_tokens=False)
    completions = [reward_model.pair_token_ids(tokenizer, p)["chosen_ids"][len(tokenizer(p["prompt"],
                   add_special_tokens=False)["input_ids"]):] for p in pairs]
    width = max(map(len, completions)) + 2  # room after the EOS, padded as a rollout is
    completion_ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(pairs), width), dtype=torch.bool)
    for row, seq in enumerate(completions):
        completion_ids[row, :len(seq)], mask[row, :len(seq)] = torch.tensor(seq), True
    input_ids, attention_mask, position_ids = sequence_inputs(prompts["input_ids"], prompts["attention_mask"],
                                                              completion_ids, mask)
    rollout = Rollout([{}] * len(pairs), input_ids, attention_mask, position_ids, completion_ids, mask,
                      torch.ones(len(pairs), dtype=torch.bool), [p["chosen"] for p in pairs])
    engine = Engine.__new__(Engine)  # only the reward model, the device and the micro-batching are read
    engine.reward_model, engine.device = model, "cpu"
    engine.micro_batches = lambda rows: [rows]
    engine.autocast = lambda: torch.autocast("cpu", enabled=False)
    assert torch.allclose(engine.reward_model_scores(rollout), scores[:, 0], atol=1e-5)


def test_the_stage_records_a_pair_accuracy_curve_from_the_untrained_head(tmp_path, model_dirs):  # noqa: F811
    ctx = _stage_context(tmp_path, model_dirs, 0, False)
    ctx.spec.reward_model.curve_points = 3
    outcome = reward_model.train(ctx)
    curve = [p for p in outcome.log_history if "heldout_pair_accuracy" in p]
    assert [p["step"] for p in curve] == [0, 2, 4, 6]  # untrained, then 3 evenly spaced points to the end
    assert curve[0]["heldout_pair_accuracy"] == outcome.metrics["heldout_pair_accuracy_untrained"]
    assert curve[-1]["heldout_pair_accuracy"] == outcome.metrics["heldout_pair_accuracy"]
    assert curve[-1]["train_pair_accuracy"] == outcome.metrics["train_pair_accuracy"]
    # _rows(40) holds 39 distinct questions: int(39 x 0.1) = 3 held out, one pair each
    assert outcome.metrics["heldout_pairs"] == 3 and outcome.settings["split"] == "question"
    assert all(0 <= p["train_pair_accuracy"] <= 1 for p in curve)
    assert reward_model.curve_steps(56, 8) == {7, 14, 21, 28, 35, 42, 49, 56}
    assert reward_model.curve_steps(56, 0) == {56}
