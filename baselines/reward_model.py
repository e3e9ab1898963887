"""Reward model stage: the classic fourth PPO network, trained with TRL RewardTrainer on the pool's pairs.

A sequence-classification copy of the starting checkpoint (one output, a fresh score head) learns to score
the verifier-correct completion above the incorrect one (Bradley-Terry loss). A held-out share of pairs
measures its pairwise accuracy, which the report shows next to PPO's results.

Memory: ``reward_model.batch_size`` pairs per optimizer step (2 sequences each) are split into micro-batches of
``train.micro_batch_size`` pairs with gradient accumulation (the largest divisor of the batch not above it, so every
micro-batch has the same size and the mean of their losses is the batch's loss), and gradient checkpointing follows
``train.gradient_checkpointing``: 32 pairs of ~700 tokens in one forward/backward needed 68-78 GiB by the suite's own
activation formula (issue 21 item 3). The memory model (bench.systems) models the stage with this layout:
``per_device_train_batch_size`` = the micro-batch in pairs, ``gradient_accumulation_steps`` = batch / micro-batch.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from datasets import Dataset
from trl import RewardConfig, RewardTrainer

from baselines.common import curves_from_log_history, matched_training_args, micro_batching, run_trainer, trl_precision
from bench.execution.context import RunContext, TrainOutcome
from bench.task.lengths import check_loss, model_context, pair_budget
from bench.model.loading import load_sequence_classifier
from bench.model.numerics import actor_numerics
from bench.model.precision import precision_for
from bench.results import curve_names
from bench.execution.sample_pool import required_pairs

LABEL = "Reward model (TRL)"
ENGINE = "trl"

CURVE_NAMES = curve_names({"loss": "loss", "accuracy": "pair_accuracy", "margin": "margin",
                           "learning_rate": "learning_rate"})
"""TRL RewardTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""


MIN_PAIRS = 4
"""Pool pairs the stage needs: a held-out share for its pair accuracy and the rest to train on."""


def pair_micro_batch(batch_size: int, micro_batch_size: int) -> int:
    """Pairs per forward/backward: the largest divisor of ``batch_size`` not above ``micro_batch_size`` (0 or
    >= batch_size: the whole batch), so that the accumulated mean over equal micro-batches is the batch's mean."""
    if not micro_batch_size or micro_batch_size >= batch_size:
        return batch_size
    return max(d for d in range(1, micro_batch_size + 1) if batch_size % d == 0)


def trainer_args(spec: Any, ctx: RunContext, steps: int) -> dict[str, Any]:
    """RewardConfig keyword arguments of the stage (without max_length): the matched arguments at the stage's own
    learning rate and a linear schedule, ``reward_model.batch_size`` pairs per step in micro-batches of
    :func:`pair_micro_batch` pairs with gradient accumulation, checkpointing as ``train.gradient_checkpointing``."""
    rm = spec.reward_model
    micro = pair_micro_batch(rm.batch_size, spec.train.micro_batch_size)
    per_device, accumulation = micro_batching(rm.batch_size, micro)
    args = matched_training_args(spec, ctx, max_steps=steps, learning_rate=rm.learning_rate,
                                 batch_size=per_device, lr_scheduler="linear")
    args.update(gradient_accumulation_steps=accumulation, logging_steps=max(1, steps // 20))
    return args


def stage_precision(spec: Any, model: Any) -> dict[str, dict[str, str | None]]:
    """The precision record of this stage, ``{"reward": {storage, compute, optimizer_state}}``.

    Here the reward model is *trained* (float32 master weights, bf16 autocast under a bfloat16 spec, float32
    AdamW state), while in a method run it is frozen. ``trl_precision`` applies the method-run roles, where
    'reward' is frozen, so only its live storage check is kept and the rest is the trained policy.
    """
    live = trl_precision(spec, {"reward": model})["reward"]
    return {"reward": {**precision_for(spec.model.dtype, trained=True).to_dict(), "storage": live["storage"]}}


@torch.no_grad()
def pairwise_accuracy(model, tokenizer, pairs: list[dict[str, str]], batch_size: int = 64) -> float:
    """Share of pairs where the model scores chosen above rejected (EOS appended, as in training)."""
    if not pairs:
        return float("nan")
    model.eval()
    device = next(model.parameters()).device
    eos = tokenizer.eos_token or ""
    wins = 0
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start:start + batch_size]
        texts = [p["prompt"] + p["chosen"] + eos for p in batch] + [p["prompt"] + p["rejected"] + eos for p in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        scores = model(**enc).logits.squeeze(-1)
        wins += int((scores[: len(batch)] > scores[len(batch):]).sum())
    return wins / len(pairs)


def train(ctx: RunContext) -> TrainOutcome:
    """Train the reward model on the pool's pairs; save it to RUN_DIR/model."""
    spec, rm = ctx.spec, ctx.spec.reward_model
    tokenizer = ctx.starting_tokenizer()
    pairs = required_pairs(ctx.pool_path, MIN_PAIRS, "the reward model")  # one line before anything loads
    # trained=True: the optimizer updates it here, so float32 master weights (bench.model.precision).
    model = load_sequence_classifier(ctx.init_model_dir, spec.model.dtype, ctx.device, trained=True)
    model.config.pad_token_id = tokenizer.pad_token_id
    random.Random(ctx.seed).shuffle(pairs)
    n_eval = max(1, int(len(pairs) * rm.eval_fraction))
    eval_pairs, train_pairs = pairs[:n_eval], pairs[n_eval:]
    steps = max(1, rm.epochs * len(train_pairs) // rm.batch_size)
    args = trainer_args(spec, ctx, steps)
    budget = pair_budget(tokenizer, train_pairs, spec.generation.max_new_tokens, drops=True,
                         cap=model_context(model))
    check_loss(budget, "reward_model", "lower generation.max_new_tokens")
    args.update(max_length=budget.max_length)
    trainer = RewardTrainer(model=model, args=RewardConfig(**args), train_dataset=Dataset.from_list(train_pairs),
                            processing_class=tokenizer)
    # Pair accuracy in the numerics PPO will read the model in (bench.model.numerics; bf16 there, float32 here).
    with actor_numerics(model, spec.model.dtype):
        accuracy_before = pairwise_accuracy(model, tokenizer, eval_pairs)
    run_trainer(ctx, trainer, steps)
    model = trainer.model
    with ctx.telemetry.phase("evaluation"), actor_numerics(model, spec.model.dtype):
        accuracy_after = pairwise_accuracy(model, tokenizer, eval_pairs)
    save_dir = ctx.run_dir / "model"
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    return TrainOutcome(
        policy=model, tokenizer=tokenizer, networks={"reward": model}, optimizers={"reward": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        settings={"epochs": rm.epochs, "batch_size": rm.batch_size, "learning_rate": rm.learning_rate,
                  "micro_batch_pairs": args["per_device_train_batch_size"],
                  "gradient_accumulation_steps": args["gradient_accumulation_steps"],
                  "gradient_checkpointing": args["gradient_checkpointing"],
                  "precision": stage_precision(spec, model)},
        metrics={"train_pairs": len(train_pairs), "heldout_pairs": len(eval_pairs),
                 "heldout_pair_accuracy": accuracy_after, "heldout_pair_accuracy_untrained": accuracy_before,
                 "lengths": budget.to_dict()},
        save_dir=save_dir,
    )
