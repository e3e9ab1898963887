"""The maths of PPO and GRPO as small pure torch functions (no model code, no state).

Conventions shared by every function here:
- ``b`` is the number of completions in the batch, ``T`` the completion length in tokens (right-padded),
  ``V`` the vocabulary size.
- ``mask`` is a bool or 0/1 tensor of shape (b, T): True for the completion's real tokens, up to and
  including the end-of-sequence token, False for padding after it. Real tokens form a prefix of each row
  (that is what ``truncate_after_eos`` produces); ``ppo_rewards`` and ``gae`` rely on it.
- Log-probabilities are natural logs (nats); a "per-token" quantity has shape (b, T).
- Losses are returned per token, shape (b, T); ``loss_weights`` turns them into a minibatch loss with a named
  aggregation (token mean: the N+ implementation details' PPO; sequence mean: TRL's GRPO ``loss_type="grpo"``).

References: Schulman et al. 2017 (PPO), Schulman et al. 2016 (GAE), Huang et al. 2024 ("The N+
Implementation Details of RLHF with PPO"), Shao et al. 2024 (DeepSeekMath, GRPO), Schulman 2020
("Approximating KL divergence", the k1/k3 estimators); GRPO's successors: Ahmadian et al. 2024 (RLOO), Hu 2025
(REINFORCE++), Liu et al. 2025 (Dr. GRPO), Yu et al. 2025 (DAPO), Zheng et al. 2025 (GSPO), MiniMax-M1 2025
(CISPO), SAPO 2025.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is true.

    Shape: x (b, T), mask (b, T) -> a scalar (dim None) or x reduced along ``dim``.
    An empty mask gives 0 rather than NaN (the count is clamped to 1): a row with no real tokens
    contributes nothing instead of poisoning the batch.
    """
    mask = mask.to(x.dtype)
    total = (x * mask).sum() if dim is None else (x * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the real positions (a scalar).

    Shape: x (b, T), mask (b, T) -> ().
    ``unbiased`` applies Bessel's correction n / (n - 1) with n the number of real positions; with fewer
    than two real positions the unbiased variance is undefined and 0 is returned.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        if n < 2:
            return torch.zeros_like(var)
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to mean 0 and (unbiased) std 1 over the real positions; padding becomes 0.

    Shape: x (b, T), mask (b, T) -> (b, T).
    ``shift_mean=False`` keeps the original mean (only rescales), as the N+ details do for rewards.
    Padding is set to 0 so that a whitened advantage can never leak a gradient through a padded token.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(x.dtype)


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: Literal["k1", "k3"] = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probabilities.

    Shape: logp (b, T), ref_logp (b, T) -> (b, T), in nats.
    k1 = logp - ref_logp: unbiased, can be negative per token (PPO's reward penalty, N+ details).
    k3 = exp(ref - logp) - (ref - logp) - 1: unbiased, always >= 0, lower variance (GRPO's loss term,
    DeepSeekMath eq. 4). Both are exactly 0 where the two log-probabilities are equal.
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        log_ratio = ref_logp - logp
        return torch.exp(log_ratio) - log_ratio - 1
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1' or 'k3'")


def last_true_indices(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last true position of each row (-1 for a row with none).

    Shape: mask (b, T) -> (b,), long.
    """
    T = mask.shape[-1]
    return T - 1 - first_true_indices(mask.bool().flip(-1))


def ppo_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor,
                kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO rewards: a KL penalty on every token plus the sequence score on the last real token.

    Shape: scores (b,), kl (b, T), mask (b, T) -> rewards (b, T), non_score_reward (b, T).
    non_score_reward = -kl_coef * kl on real tokens (0 on padding); rewards = non_score_reward with
    ``scores`` added at the last real token (the end-of-sequence token when there is one). A row with no
    real token (cannot happen after generation, which emits at least one token) gets no score.
    """
    maskf = mask.to(kl.dtype)
    non_score_reward = -kl_coef * kl * maskf
    rewards = non_score_reward.clone()
    last = last_true_indices(mask)
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    has_token = last >= 0
    rewards[rows[has_token], last[has_token]] += scores[has_token].to(rewards.dtype)
    return rewards, non_score_reward


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the completion tokens (Schulman et al. 2016).

    Shape: rewards (b, T), values (b, T), mask (b, T) -> advantages (b, T), returns (b, T).
    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, backwards in t.
    Padding: rewards and values past the last real token are zeroed first, so the last real token
    bootstraps from V = 0 (the episode ends there) and nothing flows back from padding. Returns are
    A_t + V_t (the value target); both outputs are 0 on padding.
    """
    maskf = mask.to(values.dtype)
    rewards = rewards * maskf
    values = values * maskf
    T = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(values[:, 0])
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
    advantages = advantages * maskf
    returns = (advantages + values) * maskf
    return advantages, returns


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        cliprange: float, cliprange_high: float | None = None
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, per token (aggregate it with ``loss_weights``).

    Shape: logp, old_logp, advantages (b, T) -> loss (b, T), stats of (b, T) detached per-token terms.
    loss_t = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - c, 1 + c_high)) with ratio_t = exp(logp_t - old_logp_t)
    (TRL's GRPO writes the same as -min(ratio * A, clip(ratio) * A)). ``cliprange_high`` None: c_high = c;
    DAPO's clip-higher (Yu et al. 2025) raises it (0.28 against 0.2) so that unlikely tokens can grow.
    stats: clipfrac (1 where the clipped term is the larger, i.e. active), approx_kl = 0.5 (logp - old)^2
    (the quadratic form of the N+ details / TRL's PPO, not k3), ratio.
    """
    return clipped_surrogate(logp - old_logp, advantages, cliprange, cliprange_high)


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float,
                      eps_high: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate on a given log importance ratio: token-level (b, T), or sequence-level (b, 1) from
    ``importance_log_ratio(..., level="sequence")`` (GSPO), broadcast against advantages (b, 1) or (b, T).

    loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)), r = exp(log_ratio); eps_high None: eps_low.
    Returns loss and stats (clipfrac, approx_kl = 0.5 log_ratio^2, ratio), all of the broadcast shape.
    """
    high = eps_low if eps_high is None else eps_high
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        stats = {"clipfrac": (clipped > unclipped).float(), "approx_kl": 0.5 * log_ratio.float() ** 2,
                 "ratio": ratio.float()}
    return loss, stats


ImportanceLevel = Literal["token", "sequence"]


def importance_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                         level: ImportanceLevel = "token") -> torch.Tensor:
    """log of the importance ratio pi / pi_old that the surrogate clips.

    Shape: logp, old_logp, mask (b, T) -> (b, T) for ``token``; (b, 1) for ``sequence``: the mean of the token log
    ratios over the completion's real tokens, i.e. log s_i with s_i = (pi(y_i) / pi_old(y_i))^(1 / |y_i|), GSPO's
    length-normalised sequence ratio (Zheng et al. 2025, eq. 7; TRL ``importance_sampling_level="sequence"``).
    The gradient flows through every token of the sequence alike.
    """
    log_ratio = logp - old_logp
    if level == "token":
        return log_ratio
    if level == "sequence":
        maskf = mask.to(log_ratio.dtype)
        return ((log_ratio * maskf).sum(-1) / maskf.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"unknown importance-sampling level {level!r}; use 'token' or 'sequence'")


def cispo_loss(logp: torch.Tensor, log_ratio: torch.Tensor, advantages: torch.Tensor,
               weight_max: float) -> torch.Tensor:
    """CISPO's per-token loss (MiniMax-M1, 2025; the loss ScaleRL adopts): REINFORCE on every token with the
    importance weight itself clipped and detached, so no token loses its gradient to the clip.

    loss_t = -sg(min(r_t, weight_max)) * A * logp_t, r_t = exp(log_ratio_t). The paper writes the bound as
    1 + eps_high with no lower bound; ``weight_max`` is that bound itself, as TRL's ``loss_type="cispo"`` reads
    its ``epsilon_high``. Shape: logp, log_ratio (b, T), advantages (b, 1) or (b, T) -> (b, T).
    """
    weight = torch.clamp(torch.exp(log_ratio), max=weight_max).detach()
    return -weight * advantages * logp


def sapo_loss(log_ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float = 1.0,
              tau_neg: float = 1.05) -> torch.Tensor:
    """SAPO's per-token loss (Soft Adaptive Policy Optimization, 2025): a smooth gate on the ratio in place of the
    hard clip, sharper for negative advantages.

    loss_t = -(4 / tau) * sigmoid(tau * (r_t - 1)) * A, tau = tau_pos where A > 0 else tau_neg. At r = 1 its
    gradient equals the unclipped surrogate's (sigmoid'(0) * 4 = 1); away from 1 it fades instead of stopping.
    Defaults are TRL's ``sapo_temperature_pos`` / ``_neg``. Shape: log_ratio (b, T), advantages (b, 1) or
    (b, T) -> the broadcast shape.
    """
    tau = torch.where(advantages > 0, torch.as_tensor(tau_pos), torch.as_tensor(tau_neg)).to(log_ratio.dtype)
    return -torch.sigmoid(tau * (torch.exp(log_ratio) - 1)) * 4 / tau * advantages


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       cliprange_value: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, per token (aggregate it with ``loss_weights``).

    Shape: values, old_values, returns (b, T) -> loss (b, T), stats of (b, T) detached per-token terms.
    v_clipped = old + clip(values - old, -c, c); loss_t = 0.5 * max((values - R)^2, (v_clipped - R)^2).
    stats: vf_clipfrac (1 where the clipped error is the larger).
    """
    v_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    err_unclipped = (values - returns) ** 2
    err_clipped = (v_clipped - returns) ** 2
    loss = 0.5 * torch.maximum(err_unclipped, err_clipped)
    with torch.no_grad():
        stats = {"vf_clipfrac": (err_clipped > err_unclipped).float()}
    return loss, stats


Aggregation = Literal["token_mean", "sequence_mean", "fixed_length"]

TRL_LOSS_AGGREGATION: dict[str, Aggregation] = {
    "grpo": "sequence_mean", "bnpo": "token_mean", "dapo": "token_mean", "dr_grpo": "fixed_length",
}
"""TRL GRPO ``loss_type`` -> the aggregation it applies (one process, one optimizer step per generation batch:
there ``dapo``'s normaliser, the batch's active tokens, equals ``bnpo``'s)."""


def loss_weights(mask: torch.Tensor, aggregation: Aggregation, max_length: int | None = None) -> torch.Tensor:
    """Per-token weights that turn a per-token loss into the minibatch loss: loss = (per_token * w).sum().

    Shape: mask (b, T) -> (b, T), zero on padding.
    - token_mean: 1 / (real tokens in the minibatch): every token counts the same (N+ details' PPO; TRL bnpo/dapo);
    - sequence_mean: 1 / (b * tokens of its own sequence): the mean per sequence, then over sequences (TRL grpo);
    - fixed_length: 1 / (b * max_length) (Dr. GRPO; TRL dr_grpo).
    The weights are computed once for the whole minibatch, so a loss summed over micro-batches of it (each
    with its slice of the weights) is exactly the minibatch loss: gradient accumulation does not depend on the
    micro-batch size.
    """
    maskf = mask.to(torch.float32)
    b = mask.shape[0]
    if aggregation == "token_mean":
        return maskf / maskf.sum().clamp(min=1.0)
    if aggregation == "sequence_mean":
        return maskf / (maskf.sum(dim=1, keepdim=True).clamp(min=1.0) * b)
    if aggregation == "fixed_length":
        if not max_length:
            raise ValueError("fixed_length aggregation needs max_length (the completion budget in tokens)")
        return maskf / (b * max_length)
    raise ValueError(f"unknown aggregation {aggregation!r}; use token_mean, sequence_mean or fixed_length")


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4,
                     std: Literal["unbiased", "population"] = "unbiased", scale: bool = True) -> torch.Tensor:
    """GRPO's group-relative advantage: (r - group mean) / (group std + eps) for each completion.

    Shape: rewards (n_prompts * G,) ordered group by group (the G completions of a prompt adjacent)
    -> advantages (n_prompts * G,).
    Defaults follow TRL's GRPOTrainer (unbiased std, eps 1e-4), so the suite engine's GRPO matches the
    library's; ``std="population"`` divides by G instead of G - 1 (one of the seed texts' form).
    ``scale=False``: r - group mean, no division by the std (Dr. GRPO, Liu et al. 2025: the division weights
    prompts by how little their rewards vary; TRL ``scale_rewards="none"``).
    A group whose G rewards are identical carries no signal: its advantages are exactly 0 (set
    explicitly, so rounding in the mean cannot leave a tiny non-zero value, and no 0/0 appears).
    Raises ValueError for G < 2 (a group of one has no relative advantage) or a size not divisible by G.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if std not in ("unbiased", "population"):
        raise ValueError(f"unknown std convention {std!r}; use 'unbiased' or 'population'")
    grouped = rewards.reshape(-1, group_size).to(torch.float32)
    mean = grouped.mean(dim=1, keepdim=True)
    spread = grouped.std(dim=1, keepdim=True, correction=1 if std == "unbiased" else 0)
    advantages = (grouped - mean) / (spread + eps) if scale else grouped - mean
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    return advantages.reshape(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO's advantage (Ahmadian et al. 2024): each completion's reward minus the mean reward of the other G - 1
    completions of its prompt; no std normalisation.

    Shape: rewards (n_prompts * G,) group by group -> (n_prompts * G,). A_i = r_i - (sum_j r_j - r_i) / (G - 1),
    which is G / (G - 1) times GRPO's unscaled r_i - mean. A group of equal rewards gets exactly 0.
    Raises ValueError for G < 2 or a size not divisible by G.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for a leave-one-out baseline, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.reshape(-1, group_size).to(torch.float32)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    advantages = grouped - baseline
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(advantages), advantages).reshape(-1)


def reinforce_pp_advantages(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float,
                            group_size: int | None = None) -> torch.Tensor:
    """REINFORCE++'s token advantages (Hu 2025): the KL penalty folded into the reward, returns-to-go with
    gamma = 1, then normalised over every real token of the global batch (not per group).

    Shape: scores (b,), kl (b, T) k1 nats, mask (b, T) -> (b, T), 0 on padding.
    r_t = -kl_coef * kl_t + [t = last] * score (``ppo_rewards``); A_t = sum_{s >= t} r_s; A = whiten(A) over the
    batch's real tokens. ``group_size``: the "REINFORCE++-baseline" variant, which first subtracts each prompt's
    mean score (its G completions adjacent) and then normalises globally the same way.
    """
    if group_size is not None:
        grouped = scores.reshape(-1, group_size).to(torch.float32)
        scores = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    rewards, _ = ppo_rewards(scores.to(kl.dtype), kl, mask, kl_coef)
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask.to(rewards.dtype)
    return masked_whiten(returns, mask)


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    Shape: lengths (b,) tokens -> (b,) float32: 0 up to max_length - cache, then falling linearly to -1 at
    max_length, -1 beyond. ``cache`` 0: no soft zone (0 up to max_length). Same values as TRL's
    ``trl.rewards.get_soft_overlong_punishment``.
    """
    lengths = lengths.to(torch.float32)
    if cache <= 0:
        return torch.where(lengths > max_length, -1.0, 0.0)
    start = max_length - cache
    soft = (start - lengths) / cache
    return torch.where(lengths <= start, 0.0, torch.where(lengths <= max_length, soft, -1.0))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns) over the real tokens (a scalar; 1 is a perfect critic).

    Shape: values, returns, mask (b, T) -> (). NaN when the returns do not vary (undefined).
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    if var_returns == 0:
        return torch.tensor(float("nan"), device=values.device)
    return 1.0 - var_residual / var_returns


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_rows: int = 1) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at each position, in nats (no gradient: a monitor).

    Shape: logits (b, T, V) -> (b, T) float32. H = logsumexp(z) - sum(softmax(z) * z), in float32,
    ``chunk_rows`` sequences at a time so that no float32 copy of the whole (b, T, V) tensor exists.
    """
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for start in range(0, logits.shape[0], chunk_rows):
            z = _scaled(logits[start:start + chunk_rows], temperature)
            probs = torch.softmax(z, dim=-1)
            out[start:start + chunk_rows] = torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)
    return out


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / temperature (no division at temperature 1)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits / temperature)[token], computed and differentiated a few sequences at a time.

    Why not ``log_softmax(logits.float())``: for a whole minibatch that is a float32 copy of (b, T, V), kept
    for the backward pass (64 x 513 x 151,936 x 4 bytes = 20 GB). Here only the (b, T) logsumexp is kept; the
    softmax is recomputed per chunk in the backward pass, and the gradient is written in the logits' dtype.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, temperature: float,  # type: ignore[override]
                chunk_rows: int) -> torch.Tensor:
        lse = torch.empty(tokens.shape, dtype=torch.float32, device=logits.device)
        picked = torch.empty_like(lse)
        for start in range(0, logits.shape[0], chunk_rows):
            z = _scaled(logits[start:start + chunk_rows], temperature)
            lse[start:start + chunk_rows] = torch.logsumexp(z, dim=-1)
            picked[start:start + chunk_rows] = torch.gather(z, -1, tokens[start:start + chunk_rows].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return picked - lse

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, tokens, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            g = grad_out[rows].float().unsqueeze(-1) / ctx.temperature
            probs = torch.exp(_scaled(logits[rows], ctx.temperature) - lse[rows].unsqueeze(-1))
            chunk = -probs * g
            chunk.scatter_add_(-1, tokens[rows].unsqueeze(-1), g)
            grad[rows] = chunk.to(grad.dtype)
        return grad, None, None, None


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                         chunk_rows: int = 1) -> torch.Tensor:
    """Log-probability of each token under softmax(logits / temperature) at its position.

    Shape: logits (b, T, V), tokens (b, T) -> (b, T), nats, float32; differentiable with respect to the logits.
    Computed ``chunk_rows`` sequences at a time in float32 (see ``_TokenLogprobs``); dividing by the sampling
    temperature makes it the log-prob of the distribution that sampled the token (N+ details).
    """
    return _TokenLogprobs.apply(logits, tokens, float(temperature), max(1, int(chunk_rows)))


def first_true_indices(bools: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Index of the first true position of each row, or T for a row with none.

    Shape: bools (b, T) -> (b,).
    """
    T = bools.shape[-1]
    positions = torch.arange(T, device=bools.device, dtype=dtype)
    not_true_penalty = T * (~bools.bool()).to(dtype)
    return (positions + not_true_penalty).min(dim=-1).values


def truncate_after_eos(tokens: torch.Tensor, eos_id: int | Sequence[int],
                       pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut each completion after its first end-of-sequence token.

    Shape: tokens (b, T) -> tokens (b, T), mask (b, T) bool.
    The first EOS (any of ``eos_id`` when a list, e.g. an end-of-turn token and end-of-text) is kept
    and counts as a real token (the policy chose to stop, so its log-prob is trained); everything after
    it becomes ``pad_id`` and is masked out. A row with no EOS keeps all T tokens.
    """
    eos_ids = torch.as_tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=tokens.device)
    is_eos = torch.isin(tokens, eos_ids)
    first_eos = first_true_indices(is_eos)
    positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
    mask = positions <= first_eos.unsqueeze(1)
    return torch.where(mask, tokens, torch.full_like(tokens, pad_id)), mask
