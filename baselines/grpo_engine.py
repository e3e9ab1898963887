"""GRPO on the suite's engine: PPO's loop with the critic replaced by a group-relative advantage.

One step, as ``grpo_step`` reads:
  1. generation  sample G completions for each of ``prompts_per_step`` prompts;
  2. reward      score each with the rule verifier (accuracy + format - length penalty);
  3. reference   log-probs of the sampled tokens under the frozen reference (when beta > 0);
  4. advantage   (score - group mean) / (group std + 1e-4), unbiased std (as TRL's GRPOTrainer), the same on
                 every token of the completion; a group whose G scores are equal gets exactly 0;
  5. update      per-token loss = clipped surrogate + beta x k3 KL (DeepSeekMath eq. 3-4; TRL's per-token KL),
                 aggregated as TRL's ``loss_type`` does (``grpo``: mean per sequence, then over sequences).
With the defaults this optimises exactly what TRL's GRPO (``grpo``, the library reference) optimises — same
reward, same loss aggregation, one update per rollout — which ``tests/test_grpo_equivalence.py`` checks on one
batch. ``ppo_verifier`` vs ``grpo_engine`` then isolates the critic and the advantage estimator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from baselines import rl_math as M
from baselines.common import matched_kl_coef, require_groups
from baselines.engine_config import EngineConfig, engine_description, validate_engine
from baselines.engine_rollout import Rollout
from baselines.rollout_engine import Engine
from bench.execution.context import RunContext, TrainOutcome

LABEL = "GRPO (suite engine)"
ENGINE = "suite"

ADVANTAGE_EPS = 1e-4
"""Added to the group std (TRL's GRPOTrainer)."""


@dataclass
class Config(EngineConfig):
    """GRPO's settings on the engine. Unset ones inherit the matched budget; the report lists every difference."""

    beta: float | None = None
    """KL coefficient of the k3 loss term (>= 0; null: train.kl_beta; 0 loads no reference)."""
    loss_type: Literal["grpo", "bnpo", "dapo", "dr_grpo"] = "grpo"
    """Loss aggregation, named as TRL's GRPO names it: grpo (mean per sequence, then over sequences), bnpo / dapo
    (token mean over the batch), dr_grpo (sum / (batch x max_new_tokens))."""
    advantage_std: Literal["unbiased", "population"] = "unbiased"
    """Std convention of the group advantage (unbiased: TRL; population: one of the seed texts)."""
    kl_bias_correction: bool = True
    """Multiply the per-token k3 by the policy ratio (value 1, gradient not): TRL 1.16's default
    ``use_bias_correction_kl``, which makes the KL term's gradient that of the sampled KL. false: DeepSeekMath's
    plain k3 term."""


def beta(spec: Any, cfg: Config) -> float:
    """The method's KL coefficient, else the matched train.kl_beta."""
    return matched_kl_coef(spec, cfg.beta)


def networks(spec: Any, cfg: Config) -> tuple[str, ...]:
    """Resident roles: the actor, and the reference when beta > 0. No critic, no reward network."""
    return ("actor", "reference") if beta(spec, cfg) > 0 else ("actor",)


def needs(spec: Any, cfg: Config) -> tuple[str, ...]:
    """Only the shared starting checkpoint."""
    return ("warm_start",)


def validate(spec: Any, cfg: Config, key: str) -> None:
    """Engine checks, beta >= 0 and G >= 2 (loss_type and advantage_std are Literals, checked when built)."""
    from bench.config.rules import RATE, check_rules

    validate_engine(spec, cfg, key)
    check_rules(cfg, {"beta": RATE}, f"{key}.")
    require_groups(spec, key)


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: updates per rollout, micro-batch and the loss aggregation."""
    return {**engine_description(spec, cfg), "loss": f"{cfg.loss_type} ({M.TRL_LOSS_AGGREGATION[cfg.loss_type]})"}


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, cliprange: float, kl_coef: float, kl_bias_correction: bool = True,
                    is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO's per-token loss: clipped surrogate + kl_coef x k3(policy || reference) (TRL GRPOTrainer's form);
    with ``kl_bias_correction`` the k3 is multiplied by the ratio exp(logp - old_logp), as TRL does by default.

    ``is_weights`` (b, T): truncated importance-sampling weights of the vLLM backend (Engine.importance_weights),
    multiplying the surrogate only, not the KL term, as TRL's ``vllm_importance_sampling_correction`` does.

    Shape: logp, old_logp, ref_logp (b, T) nats, advantages (b,) -> loss (b, T), stats of (b, T) detached terms.
    Aggregate with ``rl_math.loss_weights(mask, TRL_LOSS_AGGREGATION[loss_type])``.
    """
    per_token, stats = M.clipped_policy_loss(logp, old_logp, advantages.unsqueeze(1), cliprange)
    if is_weights is not None:
        per_token = per_token * is_weights
    if ref_logp is not None:
        kl = M.kl_per_token(logp, ref_logp, "k3")
        if kl_bias_correction:
            kl = kl * torch.exp(logp - old_logp)
        per_token = per_token + kl_coef * kl
        stats["kl"] = kl.detach()
    return per_token, stats


def grpo_step(engine: Engine, cfg: Config, step: int) -> dict[str, float]:
    """One rollout and its updates; returns the step's metrics."""
    tel, spec = engine.ctx.telemetry, engine.spec
    kl_coef = beta(spec, cfg)

    with tel.phase("generation"):
        batch = engine.sample(step)
    with tel.phase("reward"):
        scores, logs = engine.verify(batch)
        scores = engine.eos_penalised(scores, batch)
        grouped = scores.reshape(-1, spec.train.group_size)
        logs["score"] = scores.mean().item()
        logs["zero_std_groups"] = (grouped.amax(1) == grouped.amin(1)).float().mean().item()
    ref_logp = None
    if engine.reference is not None:  # beta / kl_coef 0: no reference network, no phase
        with tel.phase("reference"):
            ref_logp = engine.rollout_logprobs(engine.reference, batch)
    with tel.phase("advantage"), torch.no_grad():  # its own phase: the claim that it is negligible is measured
        advantages = M.group_advantages(scores, spec.train.group_size, ADVANTAGE_EPS, cfg.advantage_std)

    def token_loss(rows: torch.Tensor, logp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return grpo_token_loss(logp, old, ref, advantages[rows], cfg.cliprange, kl_coef, cfg.kl_bias_correction,
                               engine.importance_weights(batch, rows, old))

    logs.update(policy_update(engine, cfg, batch, ref_logp, token_loss))
    return logs


TokenLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"],
                     tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""(rows (m,), logp (m, T), old_logp (m, T), ref_logp (m, T) or None) -> per-token loss (m, T) and detached
per-token stats (m, T) of the minibatch's rows."""


def policy_update(engine: Engine, cfg: Config, batch: Rollout, ref_logp: torch.Tensor | None,
                  token_loss: TokenLoss) -> dict[str, float]:
    """The update phase of every critic-free method on the engine (GRPO and its successors): the old log-probs,
    then ``engine.optimise`` on ``token_loss`` aggregated as ``cfg.loss_type`` says.

    Returns the loss (as minimised), and every stat as a token mean under the loss's own weights divided by their
    sum (so Dr. GRPO's constant normaliser does not shrink its logged entropy or ratio), pooled over the
    optimizer steps; with a ``ratio`` stat also ``ratio_std``, the spread of the importance ratios the losses
    saw (token ratios, or GSPO's sequence ratio on each of its tokens); ``kl`` 0 without a reference.
    """
    with engine.ctx.telemetry.phase("update"), torch.no_grad():
        # With one update per rollout the policy has not moved when the loss is computed, so the rollout
        # log-probs equal the update forward's detached ones (no dropout, same weights): skip that forward.
        single_update = cfg.ppo_epochs * cfg.minibatches == 1
        old_logp = None if single_update else engine.rollout_logprobs(engine.actor, batch)
    averaged: set[str] = set()

    def loss_fn(rows: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logp, entropy = engine.logprobs(engine.actor, batch, rows, with_entropy=True)
        old = logp.detach() if old_logp is None else old_logp[rows]
        ref = None if ref_logp is None else ref_logp[rows]
        per_token, stats = token_loss(rows, logp, old, ref)
        stats = {"entropy": entropy.detach(), **stats}
        if "ratio" in stats:  # about 1: its square taken about 1, else float32 cancels the spread away
            stats["ratio_dev_sq"] = (stats["ratio"].double() - 1) ** 2
        averaged.update(stats)
        loss = (per_token * weights).sum()
        return loss, {"loss": loss, "loss_weight": weights.sum(),
                      **{name: (v * weights).sum() for name, v in stats.items()}}

    with engine.ctx.telemetry.phase("update"):
        logs = engine.optimise(batch, loss_fn, M.TRL_LOSS_AGGREGATION[cfg.loss_type])
    total = logs.pop("loss_weight")
    for name in averaged:
        logs[name] /= total
    if "ratio_dev_sq" in logs:
        logs["ratio_std"] = max(logs.pop("ratio_dev_sq") - (logs["ratio"] - 1) ** 2, 0.0) ** 0.5
    logs.setdefault("kl", 0.0)
    return logs


def train(ctx: RunContext) -> TrainOutcome:
    """GRPO (group-relative advantages, no critic) on the suite engine."""
    cfg: Config = ctx.method_spec
    engine = Engine(ctx, cfg, kl_coef=beta(ctx.spec, cfg))
    log_history, per_step = engine.run(lambda step: grpo_step(engine, cfg, step))
    settings = {"mode": "grpo", "advantage": f"group (r - mean) / (std + {ADVANTAGE_EPS}), {cfg.advantage_std} std",
                "advantage_std": cfg.advantage_std, "beta": beta(ctx.spec, cfg), "kl_estimator": "k3",
                "kl_placement": "loss term beta * k3" + (" x ratio" if cfg.kl_bias_correction else ""),
                "kl_bias_correction": cfg.kl_bias_correction, "reward_source": "verifier", "loss_type": cfg.loss_type,
                "loss_aggregation": M.TRL_LOSS_AGGREGATION[cfg.loss_type]}
    return engine.outcome(log_history, per_step, settings, ("reward", "accuracy_reward", "score"))
