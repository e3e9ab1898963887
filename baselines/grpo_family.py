"""GRPO's successors on the suite's engine: RLOO, REINFORCE++, Dr. GRPO, DAPO, GSPO, CISPO and SAPO, one recipe.

Each method is the engine GRPO (``baselines/grpo_engine.py``) with a few switches changed; the switches are this
recipe's ``Config`` fields, their defaults are GRPO's, and each method's differences from GRPO are its defaults in
``bench/config/registry.py`` (one line per method):

  method        advantage               loss                        aggregation (loss_type)     KL
  rloo          leave_one_out           clip (ratio 1: REINFORCE)   grpo (sequence mean)        in the reward
  reinforce_pp  reinforce_pp (global)   clip                        bnpo (token mean)           in the reward
  dr_grpo       group_no_std            clip                        dr_grpo (constant)          loss term
  dapo          group                   clip, eps 0.2 / 0.28        dapo (token mean)           none
                + dynamic sampling, + the overlong soft penalty
  gspo          group                   sequence_clip 3e-4 / 4e-4   grpo (sequence mean)        none
  cispo         group                   cispo, weight <= 5 (ScaleRL) dapo (token mean)          loss term
  sapo          group                   sapo, tau 1.0 / 1.05        grpo (sequence mean)        loss term

The mathematics is ``baselines/rl_math.py`` (each function checked against TRL 1.16 in tests/test_frontier_math.py).
One step, as ``family_step`` reads: generation (and, for DAPO, further rounds replacing groups whose G rewards are
equal), reward (+ the overlong penalty), reference, advantage (KL folded in when ``kl: reward``), update.
The clip, the sequence ratio and CISPO's / SAPO's weights act only when the policy has moved since the rollout,
i.e. with more than one optimizer step per rollout (ppo_epochs x minibatches > 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from baselines import grpo_engine
from baselines import rl_math as M
from baselines.engine_rollout import Rollout, select_and_join
from baselines.rollout_engine import Engine
from bench.errors import SpecError
from bench.execution.context import RunContext, TrainOutcome

LABEL = "GRPO family (suite engine)"
ENGINE = "suite"

Advantage = Literal["group", "group_no_std", "leave_one_out", "reinforce_pp", "reinforce_pp_baseline"]
Loss = Literal["clip", "sequence_clip", "cispo", "sapo"]


@dataclass
class Config(grpo_engine.Config):
    """The engine GRPO's settings plus the switches of its successors (defaults: GRPO itself)."""

    enabled: bool = False
    """Run this method (off by default; turn it on with methods.<name>.enabled=true)."""
    advantage: Advantage = "group"
    """group: (r - mean) / (std + 1e-4) (GRPO); group_no_std: r - mean (Dr. GRPO); leave_one_out: r - mean of the
    other G - 1 (RLOO); reinforce_pp: returns normalised over the batch's tokens (REINFORCE++);
    reinforce_pp_baseline: group mean subtracted first, then the same global normalisation."""
    loss: Loss = "clip"
    """clip: the clipped token ratio (eps cliprange / cliprange_high); sequence_clip: GSPO's length-normalised
    sequence ratio, clipped per sequence; cispo: the clipped, detached weight min(r, 1 + cliprange_high) on every
    token's log-prob; sapo: SAPO's soft gate (sapo_tau_pos / sapo_tau_neg)."""
    cliprange_high: float | None = None
    """Upper clip range (null: cliprange). DAPO's clip-higher 0.28; CISPO's weight bound is 1 + this."""
    kl: Literal["loss", "reward", "none"] = "loss"
    """Where the KL to the reference goes: loss (GRPO's beta x k3 term), reward (beta x k1 subtracted from the reward:
    summed over the completion for the group estimators, per token for REINFORCE++), none (no reference)."""
    sapo_tau_pos: float = 1.0
    """SAPO's gate temperature where the advantage is positive (TRL's default)."""
    sapo_tau_neg: float = 1.05
    """SAPO's gate temperature where the advantage is not positive (TRL's default)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose G rewards are all equal and generate new prompts in their place."""
    max_extra_rounds: int = 3
    """Cap on dynamic sampling's extra generation rounds per step; past it the batch is filled up with dropped
    groups (zero advantage) so that its size stays matched."""
    overlong_penalty: bool = False
    """DAPO's soft overlong punishment added to the reward (0 up to max_new_tokens - overlong_cache, then down to -1)."""
    overlong_cache: int | None = None
    """Soft zone of the overlong penalty in tokens (null: a fifth of generation.max_new_tokens, DAPO's 4096 of 20480)."""


def beta(spec: Any, cfg: Config) -> float:
    """The KL coefficient: 0 with kl none, else the method's beta or the matched train.kl_beta."""
    return 0.0 if cfg.kl == "none" else grpo_engine.beta(spec, cfg)


def networks(spec: Any, cfg: Config) -> tuple[str, ...]:
    """The actor, and the reference when a KL is used. No critic, no reward network."""
    return ("actor", "reference") if beta(spec, cfg) > 0 else ("actor",)


def needs(spec: Any, cfg: Config) -> tuple[str, ...]:
    """Only the shared starting checkpoint."""
    return ("warm_start",)


def overlong_cache(spec: Any, cfg: Config) -> int:
    """The overlong penalty's soft zone in tokens."""
    return spec.generation.max_new_tokens // 5 if cfg.overlong_cache is None else cfg.overlong_cache


def validate(spec: Any, cfg: Config, key: str) -> None:
    """The engine GRPO's checks, then the successors' own numbers and combinations."""
    from bench.config import launcher
    from bench.config.rules import COUNT, above, check_rules

    grpo_engine.validate(spec, cfg, key)
    check_rules(cfg, {"cliprange_high": above(0), "sapo_tau_pos": above(0), "sapo_tau_neg": above(0)}, f"{key}.")
    if cfg.max_extra_rounds:
        check_rules(cfg, {"max_extra_rounds": COUNT}, f"{key}.")
    if cfg.overlong_cache is not None and not 0 <= cfg.overlong_cache <= spec.generation.max_new_tokens:
        raise SpecError(f"'{key}.overlong_cache' must be in [0, generation.max_new_tokens "
                        f"({spec.generation.max_new_tokens})], got {cfg.overlong_cache}")
    if cfg.kl == "reward" and cfg.advantage == "group":
        raise SpecError(f"'{key}.kl' reward is for the REINFORCE estimators (leave_one_out, reinforce_pp*, "
                        f"group_no_std); with advantage 'group' use kl: loss (GRPO's)")
    if cfg.kl != "reward" and cfg.advantage.startswith("reinforce_pp") and beta(spec, cfg) > 0:
        raise SpecError(f"'{key}.advantage' {cfg.advantage} folds the KL into the reward: set '{key}.kl' to reward "
                        f"or none")
    if cfg.dynamic_sampling and launcher.active(spec) and spec.launcher.num_processes > 1:
        raise SpecError(f"'{key}.dynamic_sampling' runs in one process (each rank would draw its own extra rounds); "
                        f"set it to false or launcher.num_processes to 1")


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: the engine GRPO's, plus the estimator, the loss and the KL placement."""
    lines = {**grpo_engine.describe(spec, cfg), "advantage": cfg.advantage,
             "policy loss": f"{cfg.loss} (eps {cfg.cliprange} / {clip_high(cfg)})",
             "kl": f"{cfg.kl} (beta {beta(spec, cfg)})"}
    if cfg.dynamic_sampling:
        lines["dynamic sampling"] = f"constant groups replaced, at most {cfg.max_extra_rounds} extra rounds per step"
    return lines


def clip_high(cfg: Config) -> float:
    """The upper clip range (cliprange when unset)."""
    return cfg.cliprange if cfg.cliprange_high is None else cfg.cliprange_high


# -- the step ------------------------------------------------------------------------------------------------------
def constant_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(n_groups,) bool: the groups whose G scores are all equal (no learning signal)."""
    grouped = scores.reshape(-1, group_size)
    return grouped.amax(1) == grouped.amin(1)


def rewarded(engine: Engine, cfg: Config, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
    """The verifier's scores with the missing-EOS and (when on) overlong penalties, and the reward logs."""
    scores, logs = engine.verify(batch)
    scores = engine.eos_penalised(scores, batch)
    if cfg.overlong_penalty:
        penalty = M.overlong_penalty(batch.lengths, engine.spec.generation.max_new_tokens,
                                     overlong_cache(engine.spec, cfg)).to(scores.device)
        scores = scores + penalty
        logs["overlong_penalty_reward"] = penalty.mean().item()
    return scores, logs


def dynamic_batch(engine: Engine, cfg: Config, step: int, state: dict[str, int]
                  ) -> tuple[Rollout, torch.Tensor, dict[str, float]]:
    """DAPO's dynamic sampling: the step's prompts, then up to ``max_extra_rounds`` rounds of new prompts (read after
    the matched order, where no method's step reads) in place of the groups whose G rewards are equal, until
    ``prompts_per_step`` groups have a signal. Past the cap the batch is filled up with dropped groups."""
    G, need, tel = engine.spec.train.group_size, engine.spec.train.prompts_per_step, engine.ctx.telemetry
    with tel.phase("generation"):
        batch = engine.sample(step)
    with tel.phase("reward"):
        scores, logs = rewarded(engine, cfg, batch)
    parts, dropped, rounds, extra = [(batch, scores)], [], 0, 0
    kept = int((~constant_groups(scores, G)).sum())
    while kept < need and rounds < cfg.max_extra_rounds:
        rows = engine.ctx.train_rows
        fresh = [rows[(len(engine.prompts) + state["cursor"] + i) % len(rows)] for i in range(need - kept)]
        state["cursor"] += len(fresh)
        with tel.phase("generation"):
            more = engine.sample_prompts(fresh)
        with tel.phase("reward"):
            more_scores, _ = rewarded(engine, cfg, more)
        parts.append((more, more_scores))
        rounds, extra = rounds + 1, extra + len(more)
        kept += int((~constant_groups(more_scores, G)).sum())
    chosen, chosen_scores, groups = [], [], 0
    for keep_signal in (True, False):  # groups with a signal first, then dropped ones to fill up
        for b, s in parts:
            flat = constant_groups(s, G) != keep_signal
            picks = flat.nonzero().flatten().tolist()[: need - groups]
            groups += len(picks)
            dropped += [len(picks)] if not keep_signal else []
            index = torch.tensor([g * G + j for g in picks for j in range(G)], dtype=torch.long, device=s.device)
            chosen.append((b, index))
            chosen_scores.append(s[index])
    joined = select_and_join([(b, i.cpu()) for b, i in chosen if len(i)], engine.tokenizer.pad_token_id)
    logs.update(dynamic_sampling_rounds=float(rounds), dynamic_sampling_completions=float(extra),
                dynamic_sampling_filled=float(sum(dropped)) / need)
    return joined, torch.cat(chosen_scores), logs


def advantages_of(engine: Engine, cfg: Config, batch: Rollout, scores: torch.Tensor,
                  ref_logp: torch.Tensor | None, kl_coef: float) -> torch.Tensor:
    """The method's advantage, (b, 1) for the sequence estimators, (b, T) for REINFORCE++'s token returns."""
    G = engine.spec.train.group_size
    kl = None
    if ref_logp is not None and cfg.kl == "reward":  # k1 of the sampled tokens under the rollout policy
        old = engine.rollout_logprobs(engine.actor, batch)
        kl = M.kl_per_token(old, ref_logp, "k1") * batch.mask
    if cfg.advantage.startswith("reinforce_pp"):
        kl = torch.zeros_like(batch.mask, dtype=torch.float32) if kl is None else kl
        return M.reinforce_pp_advantages(scores, kl, batch.mask, kl_coef,
                                         G if cfg.advantage == "reinforce_pp_baseline" else None)
    if kl is not None:
        scores = scores - kl_coef * kl.sum(dim=1)
    if cfg.advantage == "leave_one_out":
        return M.leave_one_out_advantages(scores, G).unsqueeze(1)
    return M.group_advantages(scores, G, grpo_engine.ADVANTAGE_EPS, cfg.advantage_std,
                              scale=cfg.advantage == "group").unsqueeze(1)


def policy_token_loss(cfg: Config, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                      advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The method's per-token policy loss (b, T) and its stats (b, T), from rl_math."""
    log_ratio = logp - old_logp
    if cfg.loss == "clip":
        return M.clipped_surrogate(log_ratio, advantages, cfg.cliprange, clip_high(cfg))
    if cfg.loss == "sequence_clip":
        seq = M.importance_log_ratio(logp, old_logp, mask, "sequence")
        loss, stats = M.clipped_surrogate(seq, advantages, cfg.cliprange, clip_high(cfg))
        return loss.expand_as(logp), {k: v.expand_as(logp) for k, v in stats.items()}
    ratio = torch.exp(log_ratio.detach()).float()
    stats = {"approx_kl": 0.5 * log_ratio.detach().float() ** 2, "ratio": ratio}
    if cfg.loss == "cispo":
        stats["clipfrac"] = (ratio > 1 + clip_high(cfg)).float()
        return M.cispo_loss(logp, log_ratio, advantages, 1 + clip_high(cfg)), stats
    stats["clipfrac"] = torch.zeros_like(ratio)  # a soft gate clips nothing
    return M.sapo_loss(log_ratio, advantages, cfg.sapo_tau_pos, cfg.sapo_tau_neg).expand_as(logp), stats


def token_loss(cfg: Config, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
               mask: torch.Tensor, advantages: torch.Tensor, kl_coef: float,
               is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss (x vLLM's importance weights) + GRPO's beta x k3 term when ``kl: loss``; shapes (b, T)."""
    per_token, stats = policy_token_loss(cfg, logp, old_logp, mask, advantages)
    if is_weights is not None:
        per_token = per_token * is_weights
    if ref_logp is not None and cfg.kl == "loss":
        kl = M.kl_per_token(logp, ref_logp, "k3")
        if cfg.kl_bias_correction:
            kl = kl * torch.exp(logp - old_logp)
        per_token = per_token + kl_coef * kl
        stats["kl"] = kl.detach()
    elif ref_logp is not None:  # KL in the reward: logged as the same k3 estimate, no gradient
        stats["kl"] = M.kl_per_token(logp.detach(), ref_logp, "k3")
    return per_token, stats


def family_step(engine: Engine, cfg: Config, step: int, state: dict[str, int]) -> dict[str, float]:
    """One rollout (with DAPO's extra rounds) and its updates; returns the step's metrics."""
    tel, spec = engine.ctx.telemetry, engine.spec
    kl_coef = beta(spec, cfg)
    if cfg.dynamic_sampling:
        batch, scores, logs = dynamic_batch(engine, cfg, step, state)
    else:
        with tel.phase("generation"):
            batch = engine.sample(step)
        with tel.phase("reward"):
            scores, logs = rewarded(engine, cfg, batch)
    logs["score"] = scores.mean().item()
    logs["zero_std_groups"] = constant_groups(scores, spec.train.group_size).float().mean().item()
    ref_logp = None
    if engine.reference is not None:
        with tel.phase("reference"):
            ref_logp = engine.rollout_logprobs(engine.reference, batch)
    with tel.phase("advantage"), torch.no_grad():
        advantages = advantages_of(engine, cfg, batch, scores, ref_logp, kl_coef)

    def per_token(rows: torch.Tensor, logp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return token_loss(cfg, logp, old, ref, batch.mask[rows], advantages[rows], kl_coef,
                          engine.importance_weights(batch, rows, old))

    logs.update(grpo_engine.policy_update(engine, cfg, batch, ref_logp, per_token))
    return logs


def train(ctx: RunContext) -> TrainOutcome:
    """The method named by the run (its switches are the Config's) on the suite engine."""
    cfg: Config = ctx.method_spec
    engine = Engine(ctx, cfg, kl_coef=beta(ctx.spec, cfg))
    state = {"cursor": 0}
    log_history, per_step = engine.run(lambda step: family_step(engine, cfg, step, state))
    settings = {"mode": ctx.method, "advantage": cfg.advantage, "advantage_std": cfg.advantage_std,
                "policy_loss": cfg.loss, "cliprange_high": clip_high(cfg), "beta": beta(ctx.spec, cfg),
                "kl_placement": cfg.kl, "kl_bias_correction": cfg.kl_bias_correction, "reward_source": "verifier",
                "loss_type": cfg.loss_type, "loss_aggregation": M.TRL_LOSS_AGGREGATION[cfg.loss_type],
                "dynamic_sampling": cfg.dynamic_sampling, "overlong_penalty": cfg.overlong_penalty}
    if cfg.loss == "sapo":
        settings.update(sapo_tau_pos=cfg.sapo_tau_pos, sapo_tau_neg=cfg.sapo_tau_neg)
    if cfg.overlong_penalty:
        settings["overlong_cache"] = overlong_cache(ctx.spec, cfg)
    if cfg.dynamic_sampling:
        settings["max_extra_rounds"] = cfg.max_extra_rounds
    outcome = engine.outcome(log_history, per_step, settings, ("reward", "accuracy_reward", "score"))
    if cfg.dynamic_sampling:
        outcome.metrics["extra_generation_rounds"] = sum(p.get("dynamic_sampling_rounds", 0) for p in per_step)
        outcome.metrics["extra_completions"] = sum(p.get("dynamic_sampling_completions", 0) for p in per_step)
    return outcome
