"""What every TRL-based recipe shares: the matched spec -> TrainingArguments mapping, model loading, progress.

The mapping lives here, once, so that "matched" is code with tests (tests/test_matching.py) rather
than a convention each recipe re-implements.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from bench.context import RunContext
from bench.models import load_causal_lm, load_tokenizer
from bench.spec import Spec


def method_learning_rate(ctx: RunContext) -> float:
    """The method's own learning rate when declared, else the matched one."""
    own = ctx.method_spec.learning_rate
    return ctx.spec.train.learning_rate if own is None else own


def method_beta(ctx: RunContext) -> float:
    """KL coefficient: the method's own when declared, else the matched ``train.kl_beta``."""
    own = ctx.method_spec.beta
    return ctx.spec.train.kl_beta if own is None else own


def matched_training_args(spec: Spec, ctx: RunContext, *, max_steps: int, learning_rate: float,
                          batch_size: int, lr_scheduler: str | None = None) -> dict[str, Any]:
    """Keyword arguments shared by every TRL config: optimizer, schedule, precision, clipping, logging.

    ``bf16`` is set explicitly because TRL configs default to bf16=True, which fails on CPU.
    """
    on_cpu = ctx.device == "cpu"
    dtype = spec.model.dtype
    return {
        "output_dir": str(ctx.run_dir / "trainer"),
        "max_steps": max_steps,
        "per_device_train_batch_size": batch_size,
        "gradient_accumulation_steps": 1,
        "learning_rate": learning_rate,
        "lr_scheduler_type": lr_scheduler or spec.train.lr_scheduler,
        "warmup_steps": spec.train.warmup_steps,
        "weight_decay": spec.train.weight_decay,
        "max_grad_norm": spec.train.max_grad_norm,
        "optim": "adamw_torch",
        "bf16": dtype == "bfloat16" and not on_cpu,
        "fp16": dtype == "float16" and not on_cpu,
        "use_cpu": on_cpu,
        "gradient_checkpointing": spec.train.gradient_checkpointing,
        "seed": ctx.seed,
        "data_seed": ctx.seed,
        "logging_steps": spec.train.log_every,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,  # the suite prints its own progress lines
        "dataloader_num_workers": 0,
    }


def lora_config(spec: Spec) -> Any:
    """A peft LoraConfig when train.lora.enabled, else None."""
    lora = spec.train.lora
    if not lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules="all-linear",
                      task_type="CAUSAL_LM")


def load_initial_policy(ctx: RunContext) -> tuple[Any, Any]:
    """(policy, tokenizer) from the shared starting checkpoint."""
    assert ctx.init_model_dir is not None, "the warm_start stage provides the starting checkpoint"
    tokenizer = load_tokenizer(ctx.init_model_dir)
    policy = load_causal_lm(ctx.init_model_dir, ctx.spec.model, ctx.device)
    return policy, tokenizer


class ProgressCallback(TrainerCallback):
    """Forwards each optimizer step (and the latest logged metrics) to ``ctx.progress``."""

    def __init__(self, ctx: RunContext, total_steps: int) -> None:
        self.ctx = ctx
        self.total = total_steps
        self.latest: dict[str, float] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102 (TrainerCallback hook)
        if logs:
            self.latest = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        self.ctx.progress(state.global_step, self.total, self.latest)


def run_trainer(ctx: RunContext, trainer: Any, total_steps: int) -> None:
    """Attach telemetry (from outside, see bench.telemetry.trl_hooks) and progress, then train."""
    from bench.telemetry import instrument_trl_trainer

    instrument_trl_trainer(trainer, ctx.telemetry)
    trainer.add_callback(ProgressCallback(ctx, total_steps))
    trainer.train()


def curves_from_log_history(log_history: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, float]]:
    """TRL's log_history -> curve points with the suite's stable metric names.

    ``names`` maps a TRL key (e.g. 'rewards/accuracy/mean') to a suite name (e.g. 'accuracy_reward').
    """
    curves = []
    for entry in log_history:
        if "step" not in entry or "train_runtime" in entry:
            continue
        point: dict[str, float] = {"step": int(entry["step"])}
        for trl_key, suite_key in names.items():
            value = entry.get(trl_key)
            if isinstance(value, (int, float)):
                point[suite_key] = float(value)
        if len(point) > 1:
            curves.append(point)
    return curves


def trainer_networks(trainer: Any, uses_reference: bool) -> dict[str, Any]:
    """Resident networks of a TRL trainer by role: the policy, and the reference when the method uses one.

    With LoRA, TRL builds no separate reference: it runs the policy's frozen base with the adapters switched
    off. The base model is then listed as the reference; its weights are the actor's own, so the accounting
    counts them once (as shared) instead of twice.
    """
    networks = {"actor": trainer.model}
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        networks["reference"] = ref
    elif uses_reference and hasattr(trainer.model, "get_base_model"):
        networks["reference"] = trainer.model.get_base_model()
    return networks
