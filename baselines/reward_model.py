"""Reward model stage: the classic fourth PPO network, trained with TRL RewardTrainer on the pool's pairs.

A sequence-classification copy of the starting checkpoint (one output, a fresh score head) learns to score
the verifier-correct completion above the incorrect one (Bradley-Terry loss). A held-out share of pairs
measures its pairwise accuracy, which the report shows next to PPO's results.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from datasets import Dataset
from trl import RewardConfig, RewardTrainer

from baselines.common import curves_from_log_history, matched_training_args, run_trainer, trl_precision
from bench.execution.context import RunContext, TrainOutcome
from bench.task.lengths import check_loss, model_context, pair_budget
from bench.model.loading import load_sequence_classifier
from bench.model.precision import precision_for
from bench.results import curve_names
from bench.execution.sample_pool import preference_pairs, read_pool

LABEL = "Reward model (TRL)"
ENGINE = "trl"

CURVE_NAMES = curve_names({"loss": "loss", "accuracy": "pair_accuracy", "margin": "margin",
                           "learning_rate": "learning_rate"})
"""TRL RewardTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""


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
    # trained=True: the optimizer updates it here, so float32 master weights (bench.model.precision).
    model = load_sequence_classifier(ctx.init_model_dir, spec.model.dtype, ctx.device, trained=True)
    model.config.pad_token_id = tokenizer.pad_token_id
    pairs = preference_pairs(read_pool(ctx.pool_path))
    if len(pairs) < 4:
        raise RuntimeError(f"the sample pool has only {len(pairs)} (correct, incorrect) pairs; the reward model "
                           f"needs more: raise sample_pool.prompts or sample_pool.samples_per_prompt")
    random.Random(ctx.seed).shuffle(pairs)
    n_eval = max(1, int(len(pairs) * rm.eval_fraction))
    eval_pairs, train_pairs = pairs[:n_eval], pairs[n_eval:]
    steps = max(1, rm.epochs * len(train_pairs) // rm.batch_size)
    args = matched_training_args(spec, ctx, max_steps=steps, learning_rate=rm.learning_rate,
                                 batch_size=rm.batch_size, lr_scheduler="linear")
    budget = pair_budget(tokenizer, train_pairs, spec.generation.max_new_tokens, drops=True,
                         cap=model_context(model))
    check_loss(budget, "reward_model", "lower generation.max_new_tokens")
    args.update(max_length=budget.max_length, logging_steps=max(1, steps // 20), gradient_checkpointing=False)
    trainer = RewardTrainer(model=model, args=RewardConfig(**args), train_dataset=Dataset.from_list(train_pairs),
                            processing_class=tokenizer)
    accuracy_before = pairwise_accuracy(model, tokenizer, eval_pairs)
    run_trainer(ctx, trainer, steps)
    model = trainer.model
    with ctx.telemetry.phase("evaluation"):
        accuracy_after = pairwise_accuracy(model, tokenizer, eval_pairs)
    save_dir = ctx.run_dir / "model"
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    return TrainOutcome(
        policy=model, tokenizer=tokenizer, networks={"reward": model}, optimizers={"reward": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        settings={"epochs": rm.epochs, "batch_size": rm.batch_size, "learning_rate": rm.learning_rate,
                  "precision": stage_precision(spec, model)},
        metrics={"train_pairs": len(train_pairs), "heldout_pairs": len(eval_pairs),
                 "heldout_pair_accuracy": accuracy_after, "heldout_pair_accuracy_untrained": accuracy_before,
                 "lengths": budget.to_dict()},
        save_dir=save_dir,
    )
