"""Warm start: supervised fine-tuning (TRL SFTTrainer) on worked solutions, shared by every method.

The tiny random-init model cannot answer anything, and RL from zero reward learns nothing; a short SFT
gives it a non-zero starting accuracy. The checkpoint saved here is the one every method starts from.
With ``warm_start.enabled: false`` (instruct models) the initial model is saved unchanged.

Precision: the SFT trains float32 master weights (under bf16 autocast with a bfloat16 spec), as every trained
network does (bench.model.precision). The checkpoint is saved in the frozen networks' dtype (bf16 under a bfloat16
spec), so the reference's bf16 copy holds exactly the values the actor starts from. The "before" score of every
method is this stage's evaluation of that saved checkpoint, loaded as every method loads its actor (float32) and
scored in the one evaluation numerics (bench.model.numerics), never of the in-memory trained weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from baselines.common import curves_from_log_history, matched_training_args, run_trainer
from bench.execution.context import RunContext, TrainOutcome
from bench.task.lengths import check_loss, model_context, sft_budget
from bench.model.loading import load_causal_lm, torch_dtype
from bench.model.precision import storage_dtype
from bench.results import curve_names
from bench.task.problems import format_target

LABEL = "Warm start (SFT, TRL)"
ENGINE = "trl"

CURVE_NAMES = curve_names({"loss": "loss", "learning_rate": "learning_rate", "mean_token_accuracy": "token_accuracy"})
"""TRL SFTTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""


def train(ctx: RunContext) -> TrainOutcome:
    """SFT the initial model on (prompt, worked solution) pairs; save it to RUN_DIR/model."""
    spec, ws = ctx.spec, ctx.spec.warm_start
    source = ctx.model_source  # the initial model, resolved once by the worker
    tokenizer = ctx.starting_tokenizer()
    policy = load_causal_lm(source, spec.model, ctx.device, trained=ws.enabled)
    save_dir = ctx.run_dir / "model"
    log_history: list[dict] = []
    steps = 0
    metrics: dict = {}
    if ws.enabled:
        rows = [{"prompt": r["prompt"], "completion": format_target(r["solution"])} for r in ctx.train_rows]
        args = matched_training_args(spec, ctx, max_steps=ws.steps, learning_rate=ws.learning_rate,
                                     batch_size=ws.batch_size, lr_scheduler="constant")
        budget = sft_budget(tokenizer, rows, spec.generation.max_new_tokens, cap=model_context(policy))
        check_loss(budget, "warm_start", "set warm_start.enabled=false")
        metrics["lengths"] = budget.to_dict()
        args.update(logging_steps=max(1, ws.steps // 20), max_length=budget.max_length, packing=False)
        trainer = SFTTrainer(model=policy, args=SFTConfig(**args), train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer)
        run_trainer(ctx, trainer, ws.steps)
        policy = trainer.model
        steps = trainer.state.global_step
        log_history = curves_from_log_history(trainer.state.log_history, CURVE_NAMES)
        del trainer  # its optimizer state goes before the start is reloaded
    save_start(policy, tokenizer, save_dir, spec.model.dtype)
    metrics.update({f"start_{k}": v for k, v in start_record(policy, None if ws.enabled else source, spec).items()})
    del policy
    # What every method loads as its actor (float32), so the start is scored as each method's "after" is.
    policy = load_causal_lm(save_dir, spec.model, ctx.device, trained=True)
    return TrainOutcome(
        policy=policy, tokenizer=tokenizer, networks={"actor": policy}, log_history=log_history, steps=steps,
        settings={"steps": ws.steps if ws.enabled else 0, "batch_size": ws.batch_size,
                  "learning_rate": ws.learning_rate, "source": source},
        metrics=metrics, save_dir=save_dir,
    )


@torch.no_grad()
def start_record(policy: Any, source: Any, spec: Any) -> dict[str, Any]:
    """What every method starts from: {'dtype' (as saved), 'from' ('warm start' or 'source weights'), and with
    the warm start off, 'max_abs_change' / 'changed_share' of the saved copy's elements against the source's own
    weights read in float32}.

    With the warm start off the start is meant to be the source model, but it is saved in the frozen networks'
    dtype (bf16 under a bfloat16 spec, so that the bf16 reference holds exactly the actor's start): the record
    says how far that copy is from the source, so a reader comparing with a plain run from the source weights
    knows they are not the same start.
    """
    dtype = str(next(policy.parameters()).dtype).replace("torch.", "")
    if source is None:
        return {"from": "warm start", "dtype": dtype}
    original = load_causal_lm(source, spec.model, "cpu", trained=True)  # float32: the source's values
    saved = dict(policy.named_parameters())
    max_abs, changed, total = 0.0, 0, 0
    for name, weight in original.named_parameters():
        copy = saved[name].detach().to("cpu", torch.float32)
        diff = (copy - weight.detach()).abs()
        max_abs, changed, total = max(max_abs, float(diff.max())), changed + int((diff > 0).sum()), total + diff.numel()
    del original
    return {"from": "source weights", "dtype": dtype, "max_abs_change": max_abs,
            "changed_share": changed / total if total else None}


def save_start(policy: Any, tokenizer: Any, save_dir: Path, model_dtype: str) -> None:
    """Save the starting checkpoint in the frozen networks' dtype (``storage_dtype(model_dtype, trained=False)``:
    bf16 under a bfloat16 spec). Every method's float32 actor then starts from bf16 values, which its bf16
    reference holds exactly (KL 0 at the first step)."""
    policy.to(torch_dtype(storage_dtype(model_dtype, trained=False)))
    policy.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
