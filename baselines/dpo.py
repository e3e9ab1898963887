"""DPO with TRL's DPOTrainer on (correct, incorrect) pairs from the shared sample pool (offline).

DPO never samples during training: its pairs were drawn once from the starting policy and labelled by the
verifier (bench.sample_pool). It takes the matched number of optimizer steps with ``prompts_per_step``
pairs per step, cycling over the pairs; its own learning rate and beta are declared in the preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baselines.common import (check_micro_batching, curves_from_log_history, load_initial_policy, load_reference,
                              lora_config, matched_training_args, micro_batching, run_trainer, trainer_networks,
                              trl_precision)
from bench.context import MethodConfig, RunContext, TrainOutcome
from bench.data import prompts_for_steps
from bench.errors import SpecError
from bench.lengths import check_loss, model_context, pair_budget
from bench.results import curve_names
from bench.sample_pool import preference_pairs, read_pool

LABEL = "DPO (TRL, pool pairs)"
ENGINE = "trl"

TRL_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
"""Loss names DPOConfig 1.16 accepts (one or a combination)."""


@dataclass
class Config(MethodConfig):
    """DPO's settings (TRL DPOTrainer). Unset ones inherit the matched budget; the report lists differences."""

    learning_rate: float | None = 1e-5
    """Own learning rate (DPO is usually run well below the online methods' rate); null: train.learning_rate."""
    beta: float = 0.1
    """DPO's temperature on the implicit reward (> 0); not a KL penalty coefficient, so not train.kl_beta."""
    loss_type: str = "sigmoid"
    """TRL loss name, or a comma-separated combination such as sigmoid,sft (one of TRL_LOSS_TYPES each)."""

    def loss_types(self) -> list[str]:
        """loss_type as TRL's list."""
        return [part.strip() for part in self.loss_type.split(",") if part.strip()]


def networks(spec: Any, cfg: Config) -> tuple[str, ...]:
    """The actor and the frozen reference (with LoRA, the base model with adapters off)."""
    return ("actor", "reference")


def needs(spec: Any, cfg: Config) -> tuple[str, ...]:
    """The starting checkpoint and the sample pool whose (correct, incorrect) pairs it trains on."""
    return ("warm_start", "sample_pool")


def validate(spec: Any, cfg: Config, key: str) -> None:
    """A non-negative learning rate, beta > 0, known loss names, micro-batches that split the step evenly."""
    from bench.spec import RATE, above, check_rules

    check_rules(cfg, {"learning_rate": RATE, "beta": above(0)}, f"{key}.")
    unknown = [name for name in cfg.loss_types() if name not in TRL_LOSS_TYPES]
    if unknown or not cfg.loss_types():
        raise SpecError(f"'{key}.loss_type' has unknown loss {', '.join(unknown) or repr(cfg.loss_type)}; use one of "
                        f"{', '.join(TRL_LOSS_TYPES)} or a comma-separated combination such as sigmoid,sft")
    check_micro_batching(spec.train.prompts_per_step, spec.train.micro_batch_size, "pairs (train.prompts_per_step)")


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: DPO is offline, one optimizer step per prompts_per_step pairs."""
    return {"updates": f"1 per {spec.train.prompts_per_step} pool pairs (offline, no rollouts)",
            "loss": f"{cfg.loss_type}, beta {cfg.beta:g}"}


CURVE_NAMES = curve_names({
    "loss": "loss", "rewards/accuracies": "pair_accuracy", "rewards/margins": "margin",
    "rewards/chosen": "chosen_reward", "rewards/rejected": "rejected_reward", "learning_rate": "learning_rate",
})
"""TRL DPOTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""


def train(ctx: RunContext) -> TrainOutcome:
    """Train with DPOTrainer for train.steps steps of prompts_per_step pairs."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    spec, t, m = ctx.spec, ctx.spec.train, ctx.method_spec
    pairs = preference_pairs(read_pool(ctx.pool_path))
    if not pairs:
        raise RuntimeError(f"the sample pool has no pairs for DPO (sample_pool.pairs: {spec.sample_pool.pairs}); "
                           f"raise sample_pool.prompts or sample_pool.samples_per_prompt")
    policy, tokenizer = load_initial_policy(ctx)
    per_device, accumulation = micro_batching(t.prompts_per_step, t.micro_batch_size)
    args = matched_training_args(spec, ctx, max_steps=t.steps, learning_rate=m.resolved_learning_rate(spec),
                                 batch_size=per_device)
    args["gradient_accumulation_steps"] = accumulation
    beta, loss_type = m.beta, m.loss_types()
    budget = pair_budget(tokenizer, pairs, spec.generation.max_new_tokens, drops=False, cap=model_context(policy))
    check_loss(budget, "dpo", "lower generation.max_new_tokens")
    args.update(beta=beta, loss_type=loss_type, max_length=budget.max_length)
    config = DPOConfig(**args)
    dataset = Dataset.from_list(prompts_for_steps(pairs, t.steps, t.prompts_per_step))
    # With LoRA TRL needs no reference (adapters off); otherwise it gets the frozen copy in the spec's dtype.
    reference = None if spec.train.lora.enabled else load_reference(ctx)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=config, train_dataset=dataset,
                         processing_class=tokenizer, peft_config=lora_config(spec))
    run_trainer(ctx, trainer, t.steps)
    resident = trainer_networks(trainer, uses_reference=True)
    return TrainOutcome(
        policy=trainer.model, tokenizer=tokenizer, networks=resident,
        optimizers={"actor": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        settings={"data": "offline pool pairs", "pairs_available": len(pairs), "pairs_per_step": t.prompts_per_step,
                  "beta": beta, "loss_type": ",".join(loss_type), "learning_rate": config.learning_rate,
                  "max_length": budget.max_length, "precision": trl_precision(spec, resident)},
        metrics={"lengths": budget.to_dict()},
    )
