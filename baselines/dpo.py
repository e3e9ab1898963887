"""DPO with TRL's DPOTrainer on (correct, incorrect) pairs from the shared sample pool (offline).

DPO never samples during training: its pairs were drawn once from the starting policy and labelled by the
verifier (bench.execution.sample_pool). It takes the matched number of optimizer steps with ``prompts_per_step``
pairs per step, cycling over the pairs; its own learning rate and beta are declared in the preset.

Under a launcher (bench.execution.launch) it runs as N processes: DPOTrainer is a transformers Trainer, so accelerate's launch
gives it DDP. Each rank takes ``prompts_per_step / N`` pairs of every step (gradients averaged over the ranks), so a
step is still ``prompts_per_step`` pairs, the same pairs as the one-process run's step: every rank draws the same
seeded permutation and takes its own batches of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baselines.common import (check_micro_batching, curves_from_log_history, evaluable_policy, load_initial_policy,
                              load_reference, lora_config, matched_training_args, micro_batching, run_trainer,
                              trainer_networks, trl_precision)
from bench.execution.context import MethodConfig, RunContext, TrainOutcome
from bench.task.data import prompts_for_steps
from bench.errors import SpecError
from bench.task.lengths import check_loss, model_context, pair_budget
from bench.results import curve_names
from bench.execution.sample_pool import required_pairs

LABEL = "DPO (TRL, pool pairs)"
ENGINE = "trl"
DATA_PARALLEL = True
"""Under a launcher it runs as N processes, each on prompts_per_step / N pairs of every step (see train)."""
PAIR_ID = "pair_id"
"""Dataset column under a launcher: each pair's position in the matched order, recorded per rank (rank files)."""

MIN_PAIRS = 1
"""Pool pairs DPO needs to take a step (it cycles over them for train.steps x prompts_per_step pairs)."""

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
    from bench.config.rules import RATE, above, check_rules

    check_rules(cfg, {"learning_rate": RATE, "beta": above(0)}, f"{key}.")
    unknown = [name for name in cfg.loss_types() if name not in TRL_LOSS_TYPES]
    if unknown or not cfg.loss_types():
        raise SpecError(f"'{key}.loss_type' has unknown loss {', '.join(unknown) or repr(cfg.loss_type)}; use one of "
                        f"{', '.join(TRL_LOSS_TYPES)} or a comma-separated combination such as sigmoid,sft")
    check_micro_batching(spec.train.prompts_per_step, spec.train.micro_batch_size, "pairs (train.prompts_per_step)")
    from bench.config.launcher import processes_for

    processes = processes_for(spec, "dpo")
    if processes > 1:  # each rank micro-batches its own share (bench.execution.launch checks that N divides the pairs)
        check_micro_batching(spec.train.prompts_per_step // processes, spec.train.micro_batch_size,
                             f"pairs per process ({processes} processes)")


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: DPO is offline, one optimizer step per prompts_per_step pairs."""
    return {"updates": f"1 per {spec.train.prompts_per_step} pool pairs (offline, no rollouts)",
            "loss": f"{cfg.loss_type}, beta {cfg.beta:g}"}


CURVE_NAMES = curve_names({
    "loss": "loss", "rewards/accuracies": "pair_accuracy", "rewards/margins": "margin",
    "rewards/chosen": "chosen_reward", "rewards/rejected": "rejected_reward", "learning_rate": "learning_rate",
})
"""TRL DPOTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""


def per_device_batching(spec: Any, processes: int) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps) of one of ``processes`` ranks: per_device x
    accumulation x processes = train.prompts_per_step pairs per optimizer step (the one-process run's batch)."""
    return micro_batching(spec.train.prompts_per_step // processes, spec.train.micro_batch_size)


def record_pair_ids(trainer: Any, seen: list[int]) -> None:
    """Make ``trainer`` append the :data:`PAIR_ID` of every pair it collates to ``seen`` (the pairs this rank
    trained on) and keep the column out of the batch: the column survives the Trainer's removal of unused columns
    and the collator drops it before TRL's DataCollatorForPreference sees the pair."""
    trainer._set_signature_columns_if_needed()
    trainer._signature_columns = [*trainer._signature_columns, PAIR_ID]
    collate = trainer.data_collator

    def recorded(examples: list[dict[str, Any]]) -> Any:
        seen.extend(int(example[PAIR_ID]) for example in examples)
        return collate([{k: v for k, v in example.items() if k != PAIR_ID} for example in examples])

    trainer.data_collator = recorded


def train(ctx: RunContext) -> TrainOutcome:
    """Train with DPOTrainer for train.steps steps of prompts_per_step pairs (over all ranks under a launcher)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from bench.execution.launch import world_size

    spec, t, m = ctx.spec, ctx.spec.train, ctx.method_spec
    pairs = required_pairs(ctx.pool_path, MIN_PAIRS, "DPO")  # one line before anything loads
    policy, tokenizer = load_initial_policy(ctx)
    per_device, accumulation = per_device_batching(spec, world_size())
    args = matched_training_args(spec, ctx, max_steps=t.steps, learning_rate=m.resolved_learning_rate(spec),
                                 batch_size=per_device)
    args["gradient_accumulation_steps"] = accumulation
    beta, loss_type = m.beta, m.loss_types()
    budget = pair_budget(tokenizer, pairs, spec.generation.max_new_tokens, drops=False, cap=model_context(policy))
    check_loss(budget, "dpo", "lower generation.max_new_tokens")
    args.update(beta=beta, loss_type=loss_type, max_length=budget.max_length)
    config = DPOConfig(**args)
    dataset = Dataset.from_list(prompts_for_steps(pairs, t.steps, t.prompts_per_step))
    if world_size() > 1:  # the position of each pair in the matched order, for this rank's record
        dataset = dataset.add_column(PAIR_ID, list(range(len(dataset))))
    # With LoRA TRL needs no reference (adapters off); otherwise it gets the frozen copy in the spec's dtype.
    reference = None if spec.train.lora.enabled else load_reference(ctx)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=config, train_dataset=dataset,
                         processing_class=tokenizer, peft_config=lora_config(spec))
    if world_size() > 1:
        record_pair_ids(trainer, ctx.telemetry.prompt_ids)
    run_trainer(ctx, trainer, t.steps)
    resident = trainer_networks(trainer, uses_reference=True)
    return TrainOutcome(
        policy=evaluable_policy(ctx, trainer), tokenizer=tokenizer, networks=resident,
        optimizers={"actor": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        settings={"data": "offline pool pairs", "pairs_available": len(pairs), "pairs_per_step": t.prompts_per_step,
                  "beta": beta, "loss_type": ",".join(loss_type), "learning_rate": config.learning_rate,
                  "max_length": budget.max_length, "precision": trl_precision(spec, resident)},
        metrics={"lengths": budget.to_dict()},
    )
