"""Reward model stage: the classic fourth PPO network, trained with TRL RewardTrainer on the pool's pairs.

A sequence-classification copy of the starting checkpoint (one output, a fresh score head) learns to score
the verifier-correct completion above the incorrect one (Bradley-Terry loss). A held-out share of pairs
measures its pairwise accuracy, which the report shows next to PPO's results.
"""

from __future__ import annotations

import copy
import random

import torch
from datasets import Dataset
from transformers import AutoConfig, AutoModelForSequenceClassification
from trl import RewardConfig, RewardTrainer

from baselines.common import curves_from_log_history, matched_training_args, run_trainer
from bench.context import RunContext, TrainOutcome
from bench.lengths import check_loss, model_context, pair_budget
from bench.models import load_tokenizer, torch_dtype
from bench.sample_pool import preference_pairs, read_pool

LABEL = "Reward model (TRL)"
ENGINE = "trl"


def load_reward_model(path, dtype: str, device: str):
    """A one-output sequence classifier from ``path``.

    transformers 5.x rejects ``from_pretrained(..., num_labels=1)`` for some configs, so the label count is
    set on a copy of the config instead.
    """
    config = copy.deepcopy(AutoConfig.from_pretrained(str(path)))
    config.num_labels = 1
    model = AutoModelForSequenceClassification.from_pretrained(str(path), config=config, dtype=torch_dtype(dtype))
    return model.to(device)


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
    tokenizer = load_tokenizer(ctx.init_model_dir)
    model = load_reward_model(ctx.init_model_dir, spec.model.dtype, ctx.device)
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
        log_history=curves_from_log_history(trainer.state.log_history, {"loss": "loss", "accuracy": "pair_accuracy",
                                                                        "margin": "margin"}),
        steps=trainer.state.global_step,
        settings={"epochs": rm.epochs, "batch_size": rm.batch_size, "learning_rate": rm.learning_rate},
        metrics={"train_pairs": len(train_pairs), "heldout_pairs": len(eval_pairs),
                 "heldout_pair_accuracy": accuracy_after, "heldout_pair_accuracy_untrained": accuracy_before,
                 "lengths": budget.to_dict()},
        save_dir=save_dir,
    )
