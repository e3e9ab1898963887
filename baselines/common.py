"""What the recipes share: the matched spec -> TrainingArguments mapping, model loading, progress, and the
resolution and checks of settings that several methods have (the KL coefficient, the group size).

The mapping lives here, once, so that "matched" is code with tests (tests/test_matching.py) rather
than a convention each recipe re-implements.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from bench.execution.context import RunContext
from bench.model.loading import load_causal_lm
from bench.model.precision import autocast_dtype, lora_roles, precision_policy, with_shared_reference
from bench.config.spec import Spec


def matched_kl_coef(spec: Spec, own: float | None) -> float:
    """A method's own KL coefficient (GRPO's beta, PPO's kl_coef) when declared, else the matched train.kl_beta."""
    return spec.train.kl_beta if own is None else own


def require_groups(spec: Spec, key: str) -> None:
    """SpecError unless G >= 2: a group of one has no relative advantage."""
    from bench.errors import SpecError

    if spec.train.group_size < 2:
        raise SpecError(f"'train.group_size' must be >= 2 for {key} (a group of one has no relative advantage), got "
                        f"{spec.train.group_size}; set train.group_size=4 or disable it ({key}.enabled=false)")


def matched_training_args(spec: Spec, ctx: RunContext, *, max_steps: int, learning_rate: float,
                          batch_size: int, lr_scheduler: str | None = None) -> dict[str, Any]:
    """Keyword arguments shared by every TRL config: optimizer, schedule, precision, clipping, logging.

    Precision (bench.model.precision): the recipes hand TRL a float32 model (fp32 master weights) and ``bf16`` turns
    on the Trainer's bf16 autocast when the spec asks for bfloat16. It is set explicitly because TRL configs
    default to bf16=True, which would put a float32 spec under autocast.
    """
    on_cpu = ctx.device == "cpu"
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
        "optim": TRL_OPTIM[adamw_implementation(ctx.device)],
        "bf16": autocast_dtype(spec.model.dtype) == "bfloat16",
        "fp16": False,
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


ADAMW_KWARGS: dict[str, dict[str, Any]] = {"fused": {"fused": True}, "default": {}}
"""torch.optim.AdamW keyword arguments of each implementation (:func:`adamw_implementation`)."""
TRL_OPTIM = {"fused": "adamw_torch_fused", "default": "adamw_torch"}
"""The TrainingArguments ``optim`` of each implementation: the same torch AdamW as the engine's."""


def adamw_implementation(device: str) -> str:
    """Which torch AdamW kernel updates parameters whose optimizer state lives on ``device``: 'fused' on CUDA (one
    kernel per parameter group; torch's default foreach implementation there holds a temporary as large as all
    parameters at the step, 28 GiB at 7B), 'default' elsewhere (torch's own choice: the for-loop on a CPU, which
    holds no such temporary). The engine and TRL's trainers use the same one."""
    return "fused" if str(device).startswith("cuda") else "default"


def micro_batching(total: int, micro_batch_size: int) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps) for ``total`` examples per optimizer step.

    train.micro_batch_size 0 (or >= total): one pass. Otherwise ``total`` must divide by it (checked by the
    recipes' validate), so that every micro-batch has the same size and the Trainer's mean over accumulation
    steps equals the mean over the whole batch.
    """
    if not micro_batch_size or micro_batch_size >= total:
        return total, 1
    return micro_batch_size, total // micro_batch_size


def check_micro_batching(total: int, micro_batch_size: int, what: str) -> None:
    """SpecError when ``total`` examples per step do not split into equal micro-batches."""
    from bench.errors import SpecError

    if micro_batch_size and micro_batch_size < total and total % micro_batch_size:
        raise SpecError(f"'train.micro_batch_size' ({micro_batch_size}) must divide the {what} per step ({total}); "
                        f"choose a divisor")


def lora_target_modules(spec: Spec) -> str | list[str]:
    """train.lora.target_modules as peft takes it: 'all-linear', or the list of module names."""
    text = spec.train.lora.target_modules.strip()
    return text if text == "all-linear" else [name.strip() for name in text.split(",") if name.strip()]


def lora_config(spec: Spec, task_type: str | None = "CAUSAL_LM") -> Any:
    """A peft LoraConfig when train.lora.enabled, else None. The same block for every method's policy (TRL's
    trainers take it as ``peft_config``; the engine wraps its actor with :func:`add_lora`); ``task_type`` None
    for a backbone without an LM head (the engine's critic)."""
    lora = spec.train.lora
    if not lora.enabled:
        return None
    from peft import LoraConfig

    # No adapter dropout: TRL's trainers switch every dropout off after wrapping the model (disable_dropout_in_model)
    # and the engine runs without dropout, so a dropout setting would do nothing anywhere.
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=0.0,
                      target_modules=lora_target_modules(spec), task_type=task_type)


def add_lora(model: Any, spec: Spec, task_type: str | None = "CAUSAL_LM") -> Any:
    """``model`` wrapped in a peft PeftModel with train.lora's adapters: the base weights frozen (requires_grad
    False, no gradient, no optimizer state), only the adapters trained. The base keeps its storage dtype.

    With gradient checkpointing the embeddings' output is made to require grad: the base's embeddings are frozen,
    and a checkpointed block whose inputs need no gradient would pass none back to the adapters inside it.
    """
    from peft import get_peft_model

    if spec.train.gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, lora_config(spec, task_type))


def load_policy_weights(path: Any, spec: Spec, device: str) -> Any:
    """The policy's weights from ``path`` as the precision policy stores a trained actor: float32 master weights,
    or under LoRA (train.lora.enabled) a frozen base in the spec's dtype (bf16 under a bfloat16 spec; its adapters
    are float32). The embeddings are hooked for the one compute numerics (bench.model.numerics.fp32_residual_stream),
    so a bf16 base computes as its float32 copy would. No adapters are added here."""
    from bench.model.numerics import fp32_residual_stream

    return fp32_residual_stream(load_causal_lm(path, spec.model, device, trained=not spec.train.lora.enabled))


def load_actor(path: Any, spec: Spec, device: str) -> Any:
    """The suite engine's actor: :func:`load_policy_weights`, wrapped with train.lora's adapters when on."""
    policy = load_policy_weights(path, spec, device)
    return add_lora(policy, spec) if spec.train.lora.enabled else policy


def load_initial_policy(ctx: RunContext) -> tuple[Any, Any]:
    """(policy, tokenizer) from the shared starting checkpoint for a TRL trainer (which adds any LoRA adapters
    itself from ``lora_config``): float32 (it is trained), or a frozen bf16 base under LoRA."""
    assert ctx.init_model_dir is not None, "the warm_start stage provides the starting checkpoint"
    tokenizer = ctx.starting_tokenizer()
    return load_policy_weights(ctx.init_model_dir, ctx.spec, ctx.device), tokenizer


def load_reference(ctx: RunContext) -> Any:
    """The frozen reference: the starting checkpoint stored in the spec's dtype (bench.model.precision), computing
    in the actor's numerics (bench.model.numerics: under the trainer's autocast its log-probs at the first step
    equal the float32 actor's exactly)."""
    from bench.model.numerics import fp32_residual_stream

    model = load_causal_lm(ctx.init_model_dir, ctx.spec.model, ctx.device)
    model.eval()
    model.requires_grad_(False)
    return fp32_residual_stream(model)


def trl_precision(spec: Spec, networks: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The precision policy recorded for a TRL run, checked against the live modules' storage dtypes."""
    policy = precision_policy(spec.model.dtype, tuple(networks), lora_roles=lora_roles(spec.train.lora))
    for role, net in networks.items():
        stored = str(next(net.parameters()).dtype).replace("torch.", "")
        if policy[role]["storage"] != stored:  # a network stored otherwise than the policy says: record what is there
            policy[role] = {**policy[role], "storage": stored}
    # Under LoRA TRL's reference is the policy's base with the adapters off (trainer_networks): the actor's weights.
    return with_shared_reference(policy) if spec.train.lora.enabled else policy


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
    """Attach telemetry (from outside, see bench.telemetry.trl_hooks) and progress, then train.

    A reference TRL built or prepared itself (GRPO builds it from the checkpoint in ``model_init_kwargs``' dtype;
    DPO gets ours) is hooked for the one compute numerics (bench.model.numerics): TRL runs it inside accelerate's
    autocast, where its bf16 weights then give exactly the float32 actor's log-probs before the first update (KL 0,
    DPO's implicit rewards 0). Under DeepSpeed TRL runs policy and reference in DeepSpeed's bf16 (no autocast: the
    hook does nothing), both from the same bf16 values, so they agree at the first step there too."""
    from bench.model.numerics import fp32_residual_stream
    from bench.telemetry import instrument_trl_trainer

    reference = getattr(trainer, "ref_model", None)
    if reference is not None:
        fp32_residual_stream(trainer.accelerator.unwrap_model(reference))
    instrument_trl_trainer(trainer, ctx.telemetry)
    trainer.add_callback(ProgressCallback(ctx, total_steps))
    trainer.train()


def zero3_partitioned(model: Any) -> bool:
    """Whether ``model``'s parameters are partitioned over the ranks by DeepSpeed ZeRO-3 (each carries ``ds_id``;
    its local tensor is then empty and a forward needs every rank to gather it)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def evaluable_policy(ctx: RunContext, trainer: Any) -> Any:
    """The trained policy as the worker evaluates it: ``trainer.model``, or under DeepSpeed ZeRO-3 a whole copy on
    rank 0 (None on the other ranks).

    Under ZeRO-3 TRL's ``trainer.model`` holds only this rank's shards, and a forward gathers them from every rank:
    rank 0 evaluating it alone, while the other ranks finish and leave the process group, hangs. So every rank
    gathers the whole weights here, together (a collective, as the engine's ``_whole_copy``), and rank 0 loads
    them into a policy built as the recipe built it (:func:`load_policy_weights`, plus TRL's adapters under LoRA)."""
    from bench.execution.launch import is_main

    model = trainer.model
    if not zero3_partitioned(model):
        return model
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        state = {k: v.detach().clone() for k, v in model.state_dict().items()} if is_main() else None
    if state is None:
        return None
    whole = load_policy_weights(ctx.init_model_dir, ctx.spec, ctx.device)
    if ctx.spec.train.lora.enabled:
        from peft import get_peft_model

        whole = get_peft_model(whole, lora_config(ctx.spec))
    whole.load_state_dict(state)
    return whole


def curves_from_log_history(log_history: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, float]]:
    """TRL's log_history -> curve points with the suite's stable metric names (bench.results.METRIC_NAMES).

    ``names`` maps a TRL key (e.g. 'rewards/accuracy/mean') to a suite name (e.g. 'accuracy_reward'); a suite
    name missing from METRIC_NAMES raises ValueError, so no recipe can write a curve the table does not define.
    TRL's final summary entry (``train_runtime``) and entries with none of the keys are skipped.
    """
    from bench.results import curve_names

    curve_names(names)
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
