"""DPO with TRL's DPOTrainer on (correct, incorrect) pairs from the shared sample pool (offline).

DPO never samples during training: its pairs were drawn once from the starting policy and labelled by the
verifier (bench.sample_pool). It takes the matched number of optimizer steps with ``prompts_per_step``
pairs per step, cycling over the pairs; its own learning rate and beta are declared in the preset.
"""

from __future__ import annotations

from datasets import Dataset
from trl import DPOConfig, DPOTrainer

from baselines.common import (curves_from_log_history, lora_config, load_initial_policy, matched_training_args,
                              method_learning_rate, run_trainer, trainer_networks)
from bench.context import RunContext, TrainOutcome
from bench.data import prompts_for_steps
from bench.lengths import check_loss, model_context, pair_budget
from bench.sample_pool import preference_pairs, read_pool

LABEL = "DPO (TRL, pool pairs)"
ENGINE = "trl"

CURVE_NAMES = {
    "loss": "loss", "rewards/accuracies": "pair_accuracy", "rewards/margins": "margin",
    "rewards/chosen": "chosen_reward", "rewards/rejected": "rejected_reward", "learning_rate": "learning_rate",
}


def train(ctx: RunContext) -> TrainOutcome:
    """Train with DPOTrainer for train.steps steps of prompts_per_step pairs."""
    spec, t, m = ctx.spec, ctx.spec.train, ctx.method_spec
    pairs = preference_pairs(read_pool(ctx.pool_path))
    if not pairs:
        raise RuntimeError("the sample pool has no prompt with both a correct and an incorrect completion, so DPO "
                           "has no pairs; raise sample_pool.prompts or sample_pool.samples_per_prompt")
    policy, tokenizer = load_initial_policy(ctx)
    args = matched_training_args(spec, ctx, max_steps=t.steps, learning_rate=method_learning_rate(ctx),
                                 batch_size=t.prompts_per_step)
    beta = m.beta if m.beta is not None else 0.1
    loss_type = [part.strip() for part in (m.loss_type or "sigmoid").split(",")]
    budget = pair_budget(tokenizer, pairs, spec.generation.max_new_tokens, drops=False, cap=model_context(policy))
    check_loss(budget, "dpo", "lower generation.max_new_tokens")
    args.update(beta=beta, loss_type=loss_type, max_length=budget.max_length)
    config = DPOConfig(**args)
    dataset = Dataset.from_list(prompts_for_steps(pairs, t.steps, t.prompts_per_step))
    trainer = DPOTrainer(model=policy, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora_config(spec))
    run_trainer(ctx, trainer, t.steps)
    return TrainOutcome(
        policy=trainer.model, tokenizer=tokenizer, networks=trainer_networks(trainer, uses_reference=True),
        optimizers={"actor": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        settings={"data": "offline pool pairs", "pairs_available": len(pairs), "pairs_per_step": t.prompts_per_step,
                  "beta": beta, "loss_type": ",".join(loss_type), "learning_rate": config.learning_rate},
        metrics={"lengths": budget.to_dict()},
    )
