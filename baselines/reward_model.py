"""Reward model stage: the classic fourth PPO network, trained with TRL RewardTrainer on the pool's pairs.

A sequence-classification copy of the starting checkpoint (one output, a fresh score head) learns to score
the verifier-correct completion above the incorrect one (Bradley-Terry loss). A held-out share of the pool's
*questions* measures its pairwise accuracy (one pair per held-out question; no question on both sides), which the
report shows next to PPO's results, with a curve of held-out and training pair accuracy over the stage's steps.

What it trains on and where it is read: every (correct, incorrect) combination of a training question's
samples (``reward_model.pairs: all``; one pair per question gave a reward model that learned almost nothing), as
token ids the stage builds itself (:func:`pair_token_ids`: prompt + completion + EOS as PPO's rollouts hold them),
and every reader (the pair accuracy here, PPO's rollout scores) reads the score where TRL's trainer trained it
(``bench.model.loading.reward_read_positions``: the token before the EOS when pad == EOS).

Memory: ``reward_model.batch_size`` pairs per optimizer step (2 sequences each) are split into micro-batches of
``train.micro_batch_size`` pairs with gradient accumulation (the largest divisor of the batch not above it, so every
micro-batch has the same size and the mean of their losses is the batch's loss), and gradient checkpointing follows
``train.gradient_checkpointing``: 32 pairs of ~700 tokens in one forward/backward needed 68-78 GiB by the suite's own
activation formula. The memory model (bench.systems) models the stage with this layout:
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
from bench.model.loading import load_sequence_classifier, reward_read_positions
from bench.model.numerics import actor_numerics
from bench.model.precision import precision_for
from bench.results import curve_names
from bench.execution.sample_pool import entry_pair, entry_pairs, read_pool, required_pairs

LABEL = "Reward model (TRL)"
ENGINE = "trl"

CURVE_NAMES = curve_names({"loss": "loss", "accuracy": "pair_accuracy", "margin": "margin",
                           "learning_rate": "learning_rate"})
"""TRL RewardTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""

OWN_CURVES = tuple(curve_names({name: name for name in ("heldout_pair_accuracy", "train_pair_accuracy")}).values())
"""Curves the stage measures itself (:func:`pair_accuracy_curve`), beside TRL's log."""

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


def pair_token_ids(tokenizer: Any, pair: dict[str, str]) -> dict[str, list[int]]:
    """{'chosen_ids', 'rejected_ids'}: prompt ids + completion ids + EOS, each part tokenized without special
    tokens, as PPO's rollout holds them (the prompt tokenized alone, then the completion after it).

    The stage hands these ids to TRL's RewardTrainer (a tokenized dataset is used as it is) and scores its pair
    accuracy on the same ids, so training, evaluation and PPO read the same tokens; TRL left to tokenize the text
    would add the tokenizer's special tokens (a BOS on some models) that PPO's rollouts never hold.
    """
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt, eos = ids(pair["prompt"]), [int(tokenizer.eos_token_id)]
    return {"chosen_ids": prompt + ids(pair["chosen"]) + eos, "rejected_ids": prompt + ids(pair["rejected"]) + eos}


@torch.no_grad()
def pair_scores(model, tokenizer, pairs: list[dict[str, str]], batch_size: int = 64) -> torch.Tensor:
    """(n, 2) float32 scores of (chosen, rejected) per pair on :func:`pair_token_ids`, read where training read
    (``reward_read_positions``), right-padded with positions from 0 as the trainer's collator pads."""
    model.eval()
    device = next(model.parameters()).device
    backbone = getattr(model, model.base_model_prefix)
    pad_id = model.config.get_text_config().pad_token_id
    out = []
    for start in range(0, len(pairs), batch_size):
        batch = [pair_token_ids(tokenizer, p) for p in pairs[start:start + batch_size]]
        ids = [b["chosen_ids"] for b in batch] + [b["rejected_ids"] for b in batch]
        input_ids = torch.full((len(ids), max(map(len, ids))), int(pad_id or 0), dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, seq in enumerate(ids):
            input_ids[row, :len(seq)], mask[row, :len(seq)] = torch.tensor(seq), 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        hidden = backbone(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
        read = reward_read_positions(input_ids, mask.sum(dim=1) - 1, pad_id)
        scores = model.score(hidden[torch.arange(len(ids), device=device), read]).squeeze(-1).float().cpu()
        out.append(torch.stack([scores[: len(batch)], scores[len(batch):]], dim=1))
    return torch.cat(out) if out else torch.zeros(0, 2)


def pairwise_accuracy(model, tokenizer, pairs: list[dict[str, str]], batch_size: int = 64) -> float:
    """Share of pairs where the model scores chosen above rejected (:func:`pair_scores`); NaN without pairs."""
    if not pairs:
        return float("nan")
    scores = pair_scores(model, tokenizer, pairs, batch_size)
    return float((scores[:, 0] > scores[:, 1]).float().mean())


def question_of(entry: dict[str, Any]) -> str:
    """The unit the held-out split is drawn by: the question's text (the prompt for pool lines without one)."""
    return entry.get("question") or entry["prompt"]


def split_pairs(pool: list[dict[str, Any]], eval_fraction: float, seed: int,
                every_pair: bool) -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]]]:
    """(held-out, train, train probe) pairs of a pool, split by question (no question on both sides).

    Held out: ``eval_fraction`` of the questions that give a pair (at least one, and at least one left to
    train on), one pair each (:func:`entry_pair`), so its pairs are independent units for a Wilson interval.
    Train: every pair of the other questions (``every_pair``; ``entry_pairs``) or their first, shuffled by
    ``seed``. Probe: one pair per training question, as many as held out, to put a training accuracy beside the
    held-out one on the same footing.
    """
    usable = [e for e in pool if entry_pair(e) is not None]
    questions = sorted({question_of(e) for e in usable})
    random.Random(seed).shuffle(questions)
    n_eval = min(max(1, int(len(questions) * eval_fraction)), len(questions) - 1)
    held = set(questions[:n_eval])
    heldout: dict[str, dict[str, str]] = {}
    probe: dict[str, dict[str, str]] = {}
    train_pairs: list[dict[str, str]] = []
    for entry in usable:
        question = question_of(entry)
        if question in held:
            heldout.setdefault(question, entry_pair(entry))
            continue
        probe.setdefault(question, entry_pair(entry))
        train_pairs += entry_pairs(entry) if every_pair else [entry_pair(entry)]
    random.Random(seed).shuffle(train_pairs)
    return list(heldout.values()), train_pairs, list(probe.values())[: len(heldout)]


def curve_steps(total_steps: int, points: int) -> set[int]:
    """Optimizer steps after which the pair-accuracy curve is measured: ``points`` evenly spaced, the last one
    included (0 points: only the last; step 0, the untrained head, is measured before training)."""
    if points <= 0:
        return {total_steps}
    return {max(1, round(total_steps * (k + 1) / points)) for k in range(points)} | {total_steps}


def pair_accuracy_curve(ctx: RunContext, tokenizer: Any, heldout: list[dict[str, str]],
                        probe: list[dict[str, str]], at_steps: set[int], points: list[dict[str, float]]) -> Any:
    """A TrainerCallback appending {step, heldout_pair_accuracy, train_pair_accuracy} to ``points`` after each
    optimizer step in ``at_steps``, timed as the run's evaluation phase, in the numerics PPO reads the model in."""
    from transformers import TrainerCallback

    spec = ctx.spec

    class PairAccuracyCurve(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if state.global_step not in at_steps or model is None:
                return
            with ctx.telemetry.phase("evaluation"), actor_numerics(model, spec.model.dtype):
                points.append({"step": int(state.global_step),
                               "heldout_pair_accuracy": pairwise_accuracy(model, tokenizer, heldout),
                               "train_pair_accuracy": pairwise_accuracy(model, tokenizer, probe)})
            model.train()  # pairwise_accuracy switched it to eval; the trainer's next step expects train mode

    return PairAccuracyCurve()


def merge_curves(log_points: list[dict[str, float]], extra: list[dict[str, float]]) -> list[dict[str, float]]:
    """Curve points of TRL's log and of :func:`pair_accuracy_curve` merged by step, in step order."""
    by_step: dict[int, dict[str, float]] = {}
    for point in [*log_points, *extra]:
        by_step.setdefault(int(point["step"]), {"step": int(point["step"])}).update(point)
    return [by_step[step] for step in sorted(by_step)]


def train(ctx: RunContext) -> TrainOutcome:
    """Train the reward model on the pool's pairs; save it to RUN_DIR/model."""
    spec, rm = ctx.spec, ctx.spec.reward_model
    tokenizer = ctx.starting_tokenizer()
    required_pairs(ctx.pool_path, MIN_PAIRS, "the reward model")  # one line before anything loads
    eval_pairs, train_pairs, probe = split_pairs(read_pool(ctx.pool_path), rm.eval_fraction, ctx.seed,
                                                 rm.pairs == "all")
    # trained=True: the optimizer updates it here, so float32 master weights (bench.model.precision).
    model = load_sequence_classifier(ctx.init_model_dir, spec.model.dtype, ctx.device, trained=True)
    model.config.pad_token_id = tokenizer.pad_token_id
    steps = max(1, rm.epochs * len(train_pairs) // rm.batch_size)
    args = trainer_args(spec, ctx, steps)
    budget = pair_budget(tokenizer, train_pairs, spec.generation.max_new_tokens, drops=True,
                         cap=model_context(model))
    check_loss(budget, "reward_model", "lower generation.max_new_tokens")
    args.update(max_length=budget.max_length)
    dataset = Dataset.from_list([pair_token_ids(tokenizer, pair) for pair in train_pairs])
    trainer = RewardTrainer(model=model, args=RewardConfig(**args), train_dataset=dataset, processing_class=tokenizer)
    # Pair accuracy in the numerics PPO will read the model in (bench.model.numerics; bf16 there, float32 here).
    with actor_numerics(model, spec.model.dtype):
        accuracy_before = pairwise_accuracy(model, tokenizer, eval_pairs)
        probe_before = pairwise_accuracy(model, tokenizer, probe)
    points = [{"step": 0, "heldout_pair_accuracy": accuracy_before, "train_pair_accuracy": probe_before}]
    trainer.add_callback(pair_accuracy_curve(ctx, tokenizer, eval_pairs, probe, curve_steps(steps, rm.curve_points), points))
    run_trainer(ctx, trainer, steps)
    model = trainer.model
    accuracy_after = points[-1]["heldout_pair_accuracy"]
    save_dir = ctx.run_dir / "model"
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    return TrainOutcome(
        policy=model, tokenizer=tokenizer, networks={"reward": model}, optimizers={"reward": trainer.optimizer},
        log_history=merge_curves(curves_from_log_history(trainer.state.log_history, CURVE_NAMES), points),
        steps=trainer.state.global_step,
        settings={"epochs": rm.epochs, "batch_size": rm.batch_size, "learning_rate": rm.learning_rate,
                  "pairs": rm.pairs, "eval_fraction": rm.eval_fraction, "split": "question",
                  "micro_batch_pairs": args["per_device_train_batch_size"],
                  "gradient_accumulation_steps": args["gradient_accumulation_steps"],
                  "gradient_checkpointing": args["gradient_checkpointing"],
                  "precision": stage_precision(spec, model)},
        metrics={"train_pairs": len(train_pairs), "heldout_pairs": len(eval_pairs),
                 "heldout_pair_accuracy": accuracy_after, "heldout_pair_accuracy_untrained": accuracy_before,
                 "train_pair_accuracy": points[-1]["train_pair_accuracy"],
                 "train_pair_accuracy_untrained": probe_before, "probe_pairs": len(probe),
                 "lengths": budget.to_dict()},
        save_dir=save_dir,
    )
