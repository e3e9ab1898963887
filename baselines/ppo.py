"""PPO on the suite's engine (TRL removed PPOTrainer after v1.12): actor, critic, reward model, reference.

One step, as ``ppo_step`` reads:
  1. generation  sample G completions for each of ``prompts_per_step`` prompts (the matched sampling settings);
  2. reward      score each completion: the reward model at its last token (``reward: model``, run ``ppo``) or
                 the rule verifier (``reward: verifier``, run ``ppo_verifier``);
  3. reference   log-probs of the sampled tokens under the frozen reference;
  4. critic      the value of every completion position;
  5. update      rollout log-probs; per-token reward = score on the last token - kl_coef * KL(actor || ref);
                 GAE advantages, whitened; then ``ppo_epochs`` x ``minibatches`` steps of the clipped policy loss
                 + vf_coef x the clipped value loss, one AdamW step for the actor and one for the critic.
Phase rule: every forward of a frozen network has its own phase (reference, critic's rollout forward, reward);
everything the optimisation needs after scoring is "update". The machinery is ``baselines.rollout_engine``,
the maths ``baselines.rl_math``.

Defaults and their sources: clip 0.2, value clip 0.2, gamma 1, lam 0.95, k1 KL in the reward, whitened
advantages, token-mean loss: Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO" (and TRL's
PPOTrainer up to v1.12, which followed it); vf_coef 0.1 as TRL's PPOConfig; a critic learning rate 10x the
actor's as verl's PPO examples (actor 1e-6, critic 1e-5); one update per rollout by default so that PPO makes as
many optimizer steps as TRL's GRPO (num_iterations 1) — set ppo_epochs / minibatches for the classic 4 x 1 or
more, and the report lists it as a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from baselines import rl_math as M
from baselines.common import matched_kl_coef
from baselines.engine_config import EngineConfig, engine_description, validate_engine
from baselines.engine_rollout import Rollout
from baselines.rollout_engine import Engine
from bench.execution.context import RunContext, TrainOutcome
from bench.telemetry.monitors import group_monitors

LABEL = "PPO (suite engine)"
ENGINE = "suite"


@dataclass
class Config(EngineConfig):
    """PPO's settings. Unset ones inherit the matched budget; the report lists every difference."""

    reward: Literal["model", "verifier"] = "model"
    """Score with the learned reward model (the classic fourth network) or the rule verifier."""
    kl_coef: float | None = None
    """Coefficient of the per-token KL penalty in the reward (>= 0; null: train.kl_beta; 0 loads no reference)."""
    kl_estimator: Literal["k1", "k3"] = "k1"
    """Estimator of the per-token KL in the reward (k1: log ratio, N+ details)."""
    critic_learning_rate: float | None = None
    """The critic's learning rate (>= 0; null: 10x the actor's, as verl's PPO examples)."""
    critic_init: Literal["policy", "reward_model"] = "policy"
    """The critic's backbone starts from the policy checkpoint (default: it then exists for the verifier reward
    too, and ``ppo`` and ``ppo_verifier`` differ only in the reward source) or from the reward model (N+ details;
    needs the reward-model stage)."""
    vf_coef: float = 0.1
    """Value-loss coefficient (>= 0). Actor and critic have separate AdamW optimizers, so it acts through the
    critic's gradient clipping only."""
    cliprange_value: float = 0.2
    """Clip range of the value prediction around its rollout value (> 0)."""
    gamma: float = 1.0
    """Discount per token, in [0, 1]."""
    lam: float = 0.95
    """GAE lambda, in [0, 1]."""
    loss_aggregation: M.Aggregation = "token_mean"
    """How per-token losses become the minibatch loss: token_mean (N+ details) | sequence_mean | fixed_length."""


def kl_coef(spec: Any, cfg: Config) -> float:
    """The method's KL coefficient, else the matched train.kl_beta."""
    return matched_kl_coef(spec, cfg.kl_coef)


def networks(spec: Any, cfg: Config) -> tuple[str, ...]:
    """Resident roles: no 'reward' with the verifier, no 'reference' when the KL coefficient is 0."""
    roles = ["actor", "critic"]
    if cfg.reward == "model":
        roles.append("reward")
    if kl_coef(spec, cfg) > 0:
        roles.append("reference")
    return tuple(roles)


def needs(spec: Any, cfg: Config) -> tuple[str, ...]:
    """The warm start always; the reward-model stage (and its pool) when the reward or the critic comes from it."""
    if cfg.reward == "model" or cfg.critic_init == "reward_model":
        return ("warm_start", "sample_pool", "reward_model")
    return ("warm_start",)


def validate(spec: Any, cfg: Config, key: str) -> None:
    """Engine checks plus PPO's own ranges (its choices are Literal fields, checked when the spec is built)."""
    from bench.config.rules import RATE, SHARE, above, check_rules

    validate_engine(spec, cfg, key)
    check_rules(cfg, {
        "kl_coef": RATE,
        "critic_learning_rate": RATE,
        "vf_coef": RATE,
        "cliprange_value": above(0),
        "gamma": SHARE,
        "lam": SHARE,
    }, f"{key}.")


def critic_learning_rate(spec: Any, cfg: Config) -> float:
    """The critic's own learning rate, else 10x the actor's."""
    if cfg.critic_learning_rate is not None:
        return cfg.critic_learning_rate
    return 10 * cfg.resolved_learning_rate(spec)


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: updates per rollout, micro-batch, the critic's learning rate and the reward source."""
    return {**engine_description(spec, cfg), "critic lr": f"{critic_learning_rate(spec, cfg):g}",
            "reward": "reward model" if cfg.reward == "model" else "rule verifier"}


def ppo_step(engine: Engine, cfg: Config, step: int) -> dict[str, float]:
    """One rollout and its updates; returns the step's metrics."""
    tel, kl_c = engine.ctx.telemetry, kl_coef(engine.spec, cfg)

    with tel.phase("generation"):
        batch: Rollout = engine.sample(step)
    with tel.phase("reward"):
        verifier_scores, logs = engine.verify(batch)
        if cfg.reward == "model":
            raw_scores = engine.reward_model_scores(batch)
            logs["rm_score"] = raw_scores.mean().item()
        else:
            raw_scores = verifier_scores
        scores = engine.eos_penalised(raw_scores, batch)
        logs["score"] = scores.mean().item()
        # PPO samples G completions per prompt too (the matched budget): prompts whose G scores tie, as GRPO logs it.
        logs.update(group_monitors(scores.tolist(), engine.spec.train.group_size))
    mask = batch.mask
    ref_logp = None
    if engine.reference is not None:  # beta / kl_coef 0: no reference network, no phase
        with tel.phase("reference"):
            ref_logp = engine.rollout_logprobs(engine.reference, batch)
    with tel.phase("critic"):
        old_values = engine.rollout_values(batch)
    with tel.phase("update"), torch.no_grad():
        old_logp = engine.rollout_logprobs(engine.actor, batch)
    # The KL-shaped rewards, GAE and whitening: elementwise maths over (b, T), timed apart from the forwards.
    with tel.phase("advantage"), torch.no_grad():
        kl = M.kl_per_token(old_logp, ref_logp, cfg.kl_estimator) if ref_logp is not None else torch.zeros_like(old_logp)
        rewards, non_score_reward = M.ppo_rewards(scores, kl, mask, kl_c)
        advantages, returns = M.gae(rewards, old_values, mask, cfg.gamma, cfg.lam)
        advantages = M.masked_whiten(advantages, mask)
    logs.update(kl=M.masked_mean(kl, mask).item(), non_score_reward=non_score_reward.sum(dim=1).mean().item(),
                explained_variance=M.explained_variance(old_values, returns, mask).item(),
                value_mean=M.masked_mean(old_values, mask).item())

    def loss_fn(rows: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logp, entropy = engine.logprobs(engine.actor, batch, rows, with_entropy=True)
        pg_loss, pg_stats = M.clipped_policy_loss(logp, old_logp[rows], advantages[rows], cfg.cliprange)
        is_weights = engine.importance_weights(batch, rows, old_logp[rows])  # vLLM backend, cap > 0 only
        pg_loss = pg_loss if is_weights is None else pg_loss * is_weights
        values = engine.values(batch, rows)
        vf_loss, vf_stats = M.clipped_value_loss(values, old_values[rows], returns[rows], cfg.cliprange_value)
        policy, value = (pg_loss * weights).sum(), (vf_loss * weights).sum()
        loss = policy + cfg.vf_coef * value
        stats = {"loss": loss, "policy_loss": policy, "value_loss": value, "entropy": (entropy * weights).sum(),
                 **{name: (v * weights).sum() for name, v in {**pg_stats, **vf_stats}.items()}}
        return loss, stats

    with tel.phase("update"):
        logs.update(engine.optimise(batch, loss_fn, cfg.loss_aggregation))
    return logs


def train(ctx: RunContext) -> TrainOutcome:
    """PPO with a critic and GAE on the suite engine."""
    cfg: Config = ctx.method_spec
    spec = ctx.spec
    if cfg.reward == "model" or cfg.critic_init == "reward_model":
        assert ctx.reward_model_dir is not None, "the reward_model stage provides the reward model (see needs())"
    engine = Engine(ctx, cfg, kl_coef=kl_coef(spec, cfg), critic_init=cfg.critic_init,
                    reward_model=cfg.reward == "model", critic_learning_rate=critic_learning_rate(spec, cfg))
    log_history, per_step = engine.run(lambda step: ppo_step(engine, cfg, step))
    settings = {"mode": "ppo", "advantage": "GAE, whitened over the batch's real tokens", "gamma": cfg.gamma,
                "lam": cfg.lam, "vf_coef": cfg.vf_coef, "cliprange_value": cfg.cliprange_value,
                "kl_coef": kl_coef(spec, cfg), "kl_estimator": cfg.kl_estimator,
                "kl_placement": "per-token penalty in the reward", "reward_source": cfg.reward,
                "critic_init": cfg.critic_init, "critic_learning_rate": critic_learning_rate(spec, cfg),
                "loss_aggregation": cfg.loss_aggregation}
    return engine.outcome(log_history, per_step, settings,
                          ("reward", "accuracy_reward", "score", "rm_score"))
