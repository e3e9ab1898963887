"""GRPO with TRL's GRPOTrainer: the library reference implementation.

G completions per prompt are scored by the rule verifier (accuracy + format - length penalty); each
completion's advantage is its reward minus the group mean, divided by the group's std (TRL: unbiased std
via nanstd, + 1e-4; ``scale_rewards="group"``). No critic, no reward network. The KL term against a
frozen reference is on (``beta`` explicit: TRL's default is 0.0, which loads no reference at all), and
``loss_type="grpo"`` is set explicitly (TRL's default is "dapo").
"""

from __future__ import annotations

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from baselines.common import (curves_from_log_history, lora_config, load_initial_policy, matched_training_args,
                              method_beta, method_learning_rate, run_trainer, trainer_networks)
from bench.context import RunContext, TrainOutcome
from bench.data import prompts_for_steps
from bench.rewards import make_reward_functions

LABEL = "GRPO (TRL)"
ENGINE = "trl"

CURVE_NAMES = {
    "reward": "reward", "reward_std": "reward_std", "rewards/accuracy/mean": "accuracy_reward",
    "rewards/format/mean": "format_reward", "kl": "kl", "loss": "loss", "entropy": "entropy",
    "completions/mean_length": "completion_length", "frac_reward_zero_std": "zero_std_groups",
    "learning_rate": "learning_rate",
}


def grpo_config(ctx: RunContext) -> GRPOConfig:
    """The matched budget as a GRPOConfig: one optimizer step per batch of prompts_per_step x G completions."""
    spec, gen, t = ctx.spec, ctx.spec.generation, ctx.spec.train
    args = matched_training_args(spec, ctx, max_steps=t.steps, learning_rate=method_learning_rate(ctx),
                                 batch_size=spec.completions_per_step)  # TRL counts completions, not prompts
    args.update(
        num_generations=t.group_size,
        max_completion_length=gen.max_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        loss_type=ctx.method_spec.loss_type or "grpo",
        beta=method_beta(ctx),
        num_iterations=1,
        scale_rewards="group",
        shuffle_dataset=False,  # the suite fixes the prompt order so every method sees the same one
        reward_weights=None,  # set below with the functions
    )
    return GRPOConfig(**args)


def train(ctx: RunContext) -> TrainOutcome:
    """Train with GRPOTrainer on the matched prompts; return the policy and its reference."""
    spec, t, r = ctx.spec, ctx.spec.train, ctx.spec.reward
    policy, tokenizer = load_initial_policy(ctx)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    reward_funcs, weights = make_reward_functions(r.accuracy_weight, r.format_weight, r.length_threshold,
                                                  r.length_penalty, count_tokens)
    config = grpo_config(ctx)
    config.reward_weights = weights
    rows = prompts_for_steps(ctx.train_rows, t.steps, t.prompts_per_step)
    dataset = Dataset.from_list([{"prompt": row["prompt"], "answer": row["answer"]} for row in rows])
    trainer = GRPOTrainer(model=policy, reward_funcs=reward_funcs, args=config, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=lora_config(spec))
    run_trainer(ctx, trainer, t.steps)
    counters = ctx.telemetry.counters
    return TrainOutcome(
        policy=trainer.model, tokenizer=tokenizer,
        networks=trainer_networks(trainer, uses_reference=config.beta != 0),
        optimizers={"actor": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        completions=int(counters.get("completions", 0)), generated_tokens=int(counters.get("generated_tokens", 0)),
        settings={"loss_type": config.loss_type, "beta": config.beta, "scale_rewards": config.scale_rewards,
                  "advantage_std": "unbiased (nanstd) + 1e-4", "learning_rate": config.learning_rate,
                  "reward_weights": weights},
    )
