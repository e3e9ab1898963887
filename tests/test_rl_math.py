"""Hand-worked values for baselines.rl_math (each expected number is derived in a comment)."""

from __future__ import annotations

import math

import pytest
import torch

from baselines import rl_math as M

# ----------------------------------------------------------------------------------------------
# masked statistics


def test_masked_mean_ignores_padding_and_survives_empty_mask():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert M.masked_mean(x, mask).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert M.masked_mean(x, mask, dim=1).tolist() == pytest.approx([1.5, 3.0])
    assert M.masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # no NaN


def test_masked_var_unbiased_and_population():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 50.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    # real values 1, 2, 3, 4: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
    assert M.masked_var(x, mask, unbiased=True).item() == pytest.approx(5 / 3)
    assert M.masked_var(x, mask, unbiased=False).item() == pytest.approx(5 / 4)


def test_masked_whiten_over_real_tokens_only():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    w = M.masked_whiten(x, mask)
    # mean 2.5, unbiased std sqrt(5/3) = 1.2910: (1 - 2.5) / 1.2910 = -1.1619, (2 - 2.5) / 1.2910 = -0.3873
    s = math.sqrt(5 / 3)
    assert w[0].tolist() == pytest.approx([-1.5 / s, -0.5 / s, 0.5 / s], abs=1e-5)
    assert w[1, 0].item() == pytest.approx(1.5 / s, abs=1e-5)
    assert w[1, 1:].tolist() == [0.0, 0.0]  # padding is zeroed, the 100s did not enter the statistics
    assert M.masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert M.masked_var(w, mask).item() == pytest.approx(1.0, abs=1e-5)
    kept = M.masked_whiten(x, mask, shift_mean=False)
    assert M.masked_mean(kept, mask).item() == pytest.approx(2.5, abs=1e-5)


# ----------------------------------------------------------------------------------------------
# KL estimators and the PPO reward


def test_k1_and_k3_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-2.0, -1.0, -0.5]])
    # k1 = logp - ref = [1, -1, 0]
    assert M.kl_per_token(logp, ref, "k1").tolist()[0] == pytest.approx([1.0, -1.0, 0.0])
    # k3 = e^r - r - 1 with r = ref - logp = [-1, 1, 0]: [e^-1, e - 2, 0] = [0.36788, 0.71828, 0]
    k3 = M.kl_per_token(logp, ref, "k3").tolist()[0]
    assert k3 == pytest.approx([math.exp(-1), math.e - 2, 0.0], abs=1e-6)
    with pytest.raises(ValueError):
        M.kl_per_token(logp, ref, "k2")  # type: ignore[arg-type]


def test_k3_is_never_negative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(64, 16, generator=g) * 5
    ref = -torch.rand(64, 16, generator=g) * 5
    assert (M.kl_per_token(logp, ref, "k3") >= 0).all()
    assert M.kl_per_token(logp, logp, "k3").abs().max().item() == 0.0
    assert M.kl_per_token(logp, logp, "k1").abs().max().item() == 0.0


def test_ppo_rewards_puts_score_on_last_real_token():
    scores = torch.tensor([1.0, 2.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rewards, non_score = M.ppo_rewards(scores, kl, mask, kl_coef=0.5)
    # non-score = -0.5 * kl on real tokens: [[-0.05, -0.1, 0], [-0.2, -0.25, -0.3]]
    assert non_score.tolist()[0] == pytest.approx([-0.05, -0.1, 0.0])
    assert non_score.tolist()[1] == pytest.approx([-0.2, -0.25, -0.3])
    # score lands on index 1 of row 0 (last real token) and index 2 of row 1
    assert rewards.tolist()[0] == pytest.approx([-0.05, 0.9, 0.0])
    assert rewards.tolist()[1] == pytest.approx([-0.2, -0.25, 1.7])


# ----------------------------------------------------------------------------------------------
# GAE


def test_gae_with_padding_gamma_one():
    # Row 0: T = 3 with the last position padded (garbage 999 / 777 must not enter).
    #   after masking r = [0.1, 0.2, 0], V = [0.5, 0.4, 0]
    #   t=2 (pad): delta = 0                         -> A2 = 0
    #   t=1: delta = 0.2 + 1 * 0 - 0.4 = -0.2         -> A1 = -0.2   (no bootstrap from padding)
    #   t=0: delta = 0.1 + 1 * 0.4 - 0.5 = 0.0        -> A0 = 0 + 0.95 * -0.2 = -0.19
    #   returns = A + V = [0.31, 0.2, 0]
    # Row 1: full length, r = [0, 0, 1], V = [0.5, 0.6, 0.7]
    #   t=2: delta = 1 - 0.7 = 0.3                    -> A2 = 0.3
    #   t=1: delta = 0.7 - 0.6 = 0.1                  -> A1 = 0.1 + 0.95 * 0.3 = 0.385
    #   t=0: delta = 0.6 - 0.5 = 0.1                  -> A0 = 0.1 + 0.95 * 0.385 = 0.46575
    rewards = torch.tensor([[0.1, 0.2, 999.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.4, 777.0], [0.5, 0.6, 0.7]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv, ret = M.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    assert adv.tolist()[0] == pytest.approx([-0.19, -0.2, 0.0], abs=1e-6)
    assert ret.tolist()[0] == pytest.approx([0.31, 0.2, 0.0], abs=1e-6)
    assert adv.tolist()[1] == pytest.approx([0.46575, 0.385, 0.3], abs=1e-6)
    assert ret.tolist()[1] == pytest.approx([0.96575, 0.985, 1.0], abs=1e-6)


def test_gae_with_padding_gamma_point_nine():
    # r = [0.1, 0.2, pad], V = [0.5, 0.4, pad], gamma 0.9, lam 0.95 (gamma * lam = 0.855)
    #   t=1: delta = 0.2 + 0.9 * 0 - 0.4 = -0.2               -> A1 = -0.2
    #   t=0: delta = 0.1 + 0.9 * 0.4 - 0.5 = -0.04            -> A0 = -0.04 + 0.855 * -0.2 = -0.211
    #   returns = [-0.211 + 0.5, -0.2 + 0.4, 0] = [0.289, 0.2, 0]
    rewards = torch.tensor([[0.1, 0.2, 5.0]])
    values = torch.tensor([[0.5, 0.4, 5.0]])
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    adv, ret = M.gae(rewards, values, mask, gamma=0.9, lam=0.95)
    assert adv.tolist()[0] == pytest.approx([-0.211, -0.2, 0.0], abs=1e-6)
    assert ret.tolist()[0] == pytest.approx([0.289, 0.2, 0.0], abs=1e-6)


# ----------------------------------------------------------------------------------------------
# clipped losses


def _policy_case(ratio: float, advantage: float):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    per_token, stats = M.clipped_policy_loss(logp, old, torch.tensor([[advantage]]), cliprange=0.2)
    loss = (per_token * M.loss_weights(mask, "token_mean")).sum()
    loss.backward()
    return loss.item(), stats["clipfrac"].item(), logp.grad.item()


@pytest.mark.parametrize(
    "ratio, advantage, expected_loss, clipped",
    [
        # A > 0, ratio 1.5: max(-1.5, -1 * 1.2) = -1.2, the clip is active (no incentive past 1 + eps)
        (1.5, 1.0, -1.2, True),
        # A > 0, ratio 0.5: max(-0.5, -0.8) = -0.5, unclipped (moving back up is still rewarded)
        (0.5, 1.0, -0.5, False),
        # A < 0, ratio 1.5: max(1.5, 1.2) = 1.5, unclipped (the pessimistic term keeps the gradient)
        (1.5, -1.0, 1.5, False),
        # A < 0, ratio 0.5: max(0.5, 0.8) = 0.8, the clip is active
        (0.5, -1.0, 0.8, True),
        # inside the trust region: -2 * 1.1 = -2.2
        (1.1, 2.0, -2.2, False),
    ],
)
def test_policy_loss_clipped_and_unclipped(ratio, advantage, expected_loss, clipped):
    loss, clipfrac, grad = _policy_case(ratio, advantage)
    assert loss == pytest.approx(expected_loss, abs=1e-6)
    assert clipfrac == (1.0 if clipped else 0.0)
    if clipped:
        assert grad == 0.0  # the clipped term is constant in logp
    else:
        assert grad == pytest.approx(-advantage * ratio, abs=1e-5)  # d(-A e^logp)/dlogp


def test_policy_loss_batch_mean_ignores_padding():
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1, 9.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    per_token, stats = M.clipped_policy_loss(ratios.log(), torch.zeros_like(ratios), adv, cliprange=0.2)
    weights = M.loss_weights(mask, "token_mean")
    # the five cases above: (-1.2 - 0.5 + 1.5 + 0.8 - 2.2) / 5 = -0.32; two of five clipped
    assert (per_token * weights).sum().item() == pytest.approx(-0.32, abs=1e-6)
    assert (stats["clipfrac"] * weights).sum().item() == pytest.approx(0.4)
    # approx_kl = 0.5 * mean(log(ratio)^2) over the five real tokens
    expected = 0.5 * sum(math.log(r) ** 2 for r in [1.5, 0.5, 1.5, 0.5, 1.1]) / 5
    assert (stats["approx_kl"] * weights).sum().item() == pytest.approx(expected, rel=1e-5)


def test_value_loss_clipped():
    # cliprange 0.2, old values 0:
    #   v=0.5, R=1: unclipped (0.5-1)^2 = 0.25, clipped v=0.2 -> (0.2-1)^2 = 0.64 -> 0.64 (clip active)
    #   v=0.1, R=1: inside the range, both 0.81                                  -> 0.81
    #   v=0.5, R=0: unclipped 0.25, clipped (0.2-0)^2 = 0.04                     -> 0.25
    # loss = 0.5 * (0.64 + 0.81 + 0.25) / 3 = 0.283333; vf_clipfrac = 1/3
    values = torch.tensor([[0.5, 0.1, 0.5, 42.0]])
    old = torch.zeros(1, 4)
    returns = torch.tensor([[1.0, 1.0, 0.0, -42.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    per_token, stats = M.clipped_value_loss(values, old, returns, cliprange_value=0.2)
    weights = M.loss_weights(mask, "token_mean")
    assert (per_token * weights).sum().item() == pytest.approx(0.5 * 1.7 / 3, abs=1e-6)
    assert (stats["vf_clipfrac"] * weights).sum().item() == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------------------------
# GRPO group advantages


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # mean 0.5; squared deviations 4 * 0.25 = 1
    # unbiased std = sqrt(1 / 3) = 0.57735 -> A = +-0.5 / 0.57735 = +-0.866025 (eps 0)
    # population std = sqrt(1 / 4) = 0.5  -> A = +-1
    unbiased = M.group_advantages(r, 4, eps=0.0, std="unbiased")
    assert unbiased.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    population = M.group_advantages(r, 4, eps=0.0, std="population")
    assert population.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-6)
    # default eps 1e-4: 0.5 / (0.57735 + 1e-4) = 0.865876
    assert M.group_advantages(r, 4)[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-4), abs=1e-6)


def test_group_advantages_identical_group_is_exactly_zero():
    r = torch.tensor([0.1, 0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 1.0])
    for eps in (0.0, 1e-4):
        a = M.group_advantages(r, 4, eps=eps)
        assert not torch.isnan(a).any()
        assert a[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
        assert a[4:].abs().sum().item() > 0  # the other group still has signal
        assert a[4:].sum().item() == pytest.approx(0.0, abs=1e-6)  # advantages are centred per group


def test_group_advantages_rejects_bad_group_size():
    with pytest.raises(ValueError):
        M.group_advantages(torch.tensor([1.0, 0.0]), 1)
    with pytest.raises(ValueError):
        M.group_advantages(torch.tensor([1.0, 0.0, 1.0]), 2)


# ----------------------------------------------------------------------------------------------
# token helpers


def test_truncate_after_eos():
    tokens = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 3, 4, 5, 6]])
    out, mask = M.truncate_after_eos(tokens, eos_id=2, pad_id=0)
    assert out.tolist() == [[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]]
    assert mask.tolist() == [[True, True, True, False, False], [True] * 5, [True, False, False, False, False]]
    out, mask = M.truncate_after_eos(tokens, eos_id=[3, 7], pad_id=0)  # several end tokens
    assert out.tolist() == [[5, 6, 2, 7, 0], [5, 6, 7, 0, 0], [2, 3, 0, 0, 0]]


def test_first_and_last_true_indices():
    b = torch.tensor([[0, 1, 1], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    assert M.first_true_indices(b).tolist() == [1, 3, 0]
    assert M.last_true_indices(b).tolist() == [2, -1, 0]


def test_logprobs_and_entropy_match_torch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 7, generator=g)
    tokens = torch.randint(0, 7, (2, 3), generator=g)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(M.logprobs_from_logits(logits, tokens), expected, atol=1e-6)
    ent = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(M.entropy_from_logits(logits), ent, atol=1e-5)
    assert M.entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8), abs=1e-6)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    assert M.explained_variance(returns.clone(), returns, mask).item() == pytest.approx(1.0)
    # predicting the mean explains nothing: 1 - Var(R - mean) / Var(R) = 0
    assert M.explained_variance(torch.full_like(returns, 2.0), returns, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(M.explained_variance(returns, torch.ones_like(returns), mask).item())


# ----------------------------------------------------------------------------------------------
# Loss aggregation and chunked log-probs


def test_loss_weights_by_hand():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    # token mean: 4 real tokens -> 1/4 each
    assert torch.allclose(M.loss_weights(mask, "token_mean"), mask.float() / 4)
    # sequence mean: row 0 has 3 tokens -> 1/(2*3); row 1 has 1 -> 1/(2*1)
    expected = torch.tensor([[1 / 6, 1 / 6, 1 / 6, 0], [0.5, 0, 0, 0]])
    assert torch.allclose(M.loss_weights(mask, "sequence_mean"), expected)
    # fixed length 4: 1 / (2 * 4) on every real token
    assert torch.allclose(M.loss_weights(mask, "fixed_length", max_length=4), mask.float() / 8)
    assert M.loss_weights(torch.zeros(1, 3, dtype=torch.bool), "token_mean").sum() == 0  # empty: no NaN
    with pytest.raises(ValueError, match="max_length"):
        M.loss_weights(mask, "fixed_length")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_match_log_softmax_values_and_gradients(temperature, dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 4, 11, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, 11, (3, 4), generator=g)
    upstream = torch.randn(3, 4, generator=g)

    ours = logits.clone().requires_grad_(True)
    lp = M.logprobs_from_logits(ours, tokens, temperature, chunk_rows=2)
    (lp * upstream).sum().backward()

    ref = logits.clone().float().requires_grad_(True)
    expected = torch.log_softmax(ref / temperature, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    (expected * upstream).sum().backward()

    assert lp.dtype == torch.float32
    assert torch.allclose(lp, expected, atol=1e-5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # the gradient is written back in the logits' dtype
    assert ours.grad.dtype == dtype
    assert torch.allclose(ours.grad.float(), ref.grad, atol=tol)
    entropy = M.entropy_from_logits(logits, temperature, chunk_rows=2)
    probs = torch.softmax(logits.float() / temperature, -1)
    assert torch.allclose(entropy, -(probs * probs.log()).sum(-1), atol=1e-4)
