"""The mathematics of GRPO's successors in ``baselines/rl_math.py`` against TRL 1.16 and against their definitions.

Loss equivalence: a real ``GRPOTrainer._compute_loss`` (tiny model) with its log-prob forward replaced by fixed
log-probs computes TRL's loss for a loss type and its options; the suite's functions, aggregated with
``rl_math.loss_weights``, must give the same loss and the same gradient with respect to the log-probs (1e-6).
The old log-probs differ from the current ones, so the ratio is not 1 and the clip, the sequence-level ratio,
the clipped weight and the soft gate all act (each test checks that they do).
"""

from __future__ import annotations

import pytest
import torch

from baselines import rl_math as M
from test_grpo_equivalence import tiny_trainer_parts  # noqa: F401 (a pytest fixture)


def _trl_trainer(root, tokenizer, loss_type: str, **options):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    name = "-".join([loss_type, *map(str, options.values())])
    config = GRPOConfig(output_dir=str(root / f"out-{name}"), per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=5, loss_type=loss_type, beta=0.0, bf16=False, use_cpu=True,
                        report_to=[], max_steps=1, **options)
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(root / "m"), reward_funcs=[lambda **k: [0.0] * 4],
                       args=config, train_dataset=Dataset.from_list([{"prompt": "What is 1 + 2?"}] * 8),
                       processing_class=tokenizer)


def _batch(drift: float = 0.4, seed: int = 5):
    """b = 4 completions (one group), T = 5, ragged lengths; old log-probs ``drift`` nats (std) from the current."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    logp = -torch.rand(4, 5, generator=g) * 3
    old_logp = logp + drift * torch.randn(4, 5, generator=g)
    advantages = M.group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.0]), 4)
    return logp, old_logp, advantages, mask


def _trl_loss_and_grad(trainer, logp, old_logp, advantages, mask):
    b, T = logp.shape
    trl_logp = logp.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (trl_logp, torch.zeros(b, T), None)
    inputs = {"prompt_ids": torch.ones(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
              "completion_ids": torch.ones(b, T, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old_logp, "num_items_in_batch": mask.sum()}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one optimizer step per batch here
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.item(), trl_logp.grad


def _suite_loss_and_grad(per_token_fn, logp, mask, aggregation):
    suite_logp = logp.clone().requires_grad_(True)
    per_token = per_token_fn(suite_logp).expand(logp.shape)
    loss = (per_token * M.loss_weights(mask, aggregation, max_length=logp.shape[1])).sum()
    loss.backward()
    return loss.item(), suite_logp.grad


def _assert_same(trl, suite):
    (trl_loss, trl_grad), (suite_loss, suite_grad) = trl, suite
    assert suite_loss == pytest.approx(trl_loss, rel=1e-6, abs=1e-6)
    assert torch.allclose(suite_grad, trl_grad, atol=1e-6)
    assert suite_grad.abs().sum() > 0  # the comparison is not vacuous


def test_dapo_clip_higher_equals_trl_dapo(tiny_trainer_parts):
    """DAPO: eps_low 0.2, eps_high 0.28, token-level loss over the batch (TRL loss_type="dapo", epsilon_high)."""
    logp, old_logp, advantages, mask = _batch()
    trainer = _trl_trainer(*tiny_trainer_parts, "dapo", epsilon=0.2, epsilon_high=0.28)
    A = advantages.unsqueeze(1)
    _, stats = M.clipped_policy_loss(logp, old_logp, A.expand_as(logp), 0.2, 0.28)
    clipped = stats["clipfrac"][mask.bool()]
    assert 0 < clipped.sum() < clipped.numel()  # the clip acts on some tokens, not all
    _, symmetric = M.clipped_policy_loss(logp, old_logp, A.expand_as(logp), 0.2)
    assert not torch.equal(stats["clipfrac"], symmetric["clipfrac"])  # clip-higher changed which tokens clip
    suite = _suite_loss_and_grad(lambda lp: M.clipped_policy_loss(lp, old_logp, A, 0.2, 0.28)[0], logp, mask,
                                 "token_mean")
    _assert_same(_trl_loss_and_grad(trainer, logp, old_logp, advantages, mask), suite)


def test_dr_grpo_with_a_moved_policy_equals_trl_dr_grpo(tiny_trainer_parts):
    """Dr. GRPO: the summed token loss divided by b x the generation budget (TRL loss_type="dr_grpo")."""
    logp, old_logp, advantages, mask = _batch()
    trainer = _trl_trainer(*tiny_trainer_parts, "dr_grpo")
    A = advantages.unsqueeze(1)
    suite = _suite_loss_and_grad(lambda lp: M.clipped_policy_loss(lp, old_logp, A, 0.2)[0], logp, mask,
                                 "fixed_length")
    _assert_same(_trl_loss_and_grad(trainer, logp, old_logp, advantages, mask), suite)


def test_gspo_sequence_ratio_equals_trl_sequence_importance_sampling(tiny_trainer_parts):
    """GSPO: one length-normalised ratio per sequence, clipped with its own small range (the paper's 3e-4 /
    4e-4), the loss a mean over sequences (TRL importance_sampling_level="sequence", loss_type="grpo")."""
    logp, old_logp, advantages, mask = _batch(drift=0.001)
    trainer = _trl_trainer(*tiny_trainer_parts, "grpo", epsilon=3e-4, epsilon_high=4e-4,
                           importance_sampling_level="sequence")
    A = advantages.unsqueeze(1)
    log_ratio = M.importance_log_ratio(logp, old_logp, mask, "sequence")
    assert log_ratio.shape == (4, 1)
    token_mean = torch.tensor([(logp - old_logp)[i, :n].mean() for i, n in enumerate(mask.sum(1).tolist())])
    assert torch.allclose(log_ratio.squeeze(1), token_mean, atol=1e-7)  # the masked mean of the token log ratios
    _, stats = M.clipped_surrogate(log_ratio, A, 3e-4, 4e-4)
    assert 0 < stats["clipfrac"].sum() < 4  # some sequences clipped, some not

    def per_token(lp):
        return M.clipped_surrogate(M.importance_log_ratio(lp, old_logp, mask, "sequence"), A, 3e-4, 4e-4)[0]

    suite = _suite_loss_and_grad(per_token, logp, mask, "sequence_mean")
    _assert_same(_trl_loss_and_grad(trainer, logp, old_logp, advantages, mask), suite)


def test_cispo_clipped_detached_weight_equals_trl_cispo(tiny_trainer_parts):
    """CISPO: every token keeps a gradient, scaled by its importance weight clipped at the bound (TRL reads
    epsilon_high as the bound itself; the paper writes it 1 + eps_high: 1.28 here is eps_high 0.28)."""
    logp, old_logp, advantages, mask = _batch()
    trainer = _trl_trainer(*tiny_trainer_parts, "cispo", epsilon_high=1.28)
    A = advantages.unsqueeze(1)
    ratio = torch.exp(logp - old_logp)[mask.bool()]
    assert (ratio > 1.28).any() and (ratio < 1.28).any()  # the bound acts on some tokens
    suite = _suite_loss_and_grad(lambda lp: M.cispo_loss(lp, lp - old_logp, A, 1.28), logp, mask, "token_mean")
    _assert_same(_trl_loss_and_grad(trainer, logp, old_logp, advantages, mask), suite)
    # no token's gradient is zeroed by the clip: every real token with a non-zero advantage has one
    moving = mask.bool() & (A != 0)
    assert (suite[1][moving] != 0).all()


def test_sapo_soft_gate_equals_trl_sapo(tiny_trainer_parts):
    """SAPO: the smooth gate with TRL's default temperatures (1.0 positive, 1.05 negative advantages)."""
    logp, old_logp, advantages, mask = _batch()
    trainer = _trl_trainer(*tiny_trainer_parts, "sapo")
    assert (trainer.args.sapo_temperature_pos, trainer.args.sapo_temperature_neg) == (1.0, 1.05)
    A = advantages.unsqueeze(1)
    suite = _suite_loss_and_grad(lambda lp: M.sapo_loss(lp - old_logp, A), logp, mask, "sequence_mean")
    _assert_same(_trl_loss_and_grad(trainer, logp, old_logp, advantages, mask), suite)


def test_sapo_gate_has_the_unclipped_gradient_at_ratio_one():
    log_ratio = torch.zeros(3, 1, requires_grad=True)
    A = torch.tensor([[1.0], [-2.0], [0.5]])
    M.sapo_loss(log_ratio, A).sum().backward()
    assert torch.allclose(log_ratio.grad, -A)  # d/dlog r of -A * r at r = 1


def test_dr_grpo_advantages_are_the_group_mean_removed_without_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0, 0.5, 1.5, 0.0, 1.0])
    grouped = rewards.reshape(3, 4)
    expected = (grouped - grouped.mean(1, keepdim=True)).reshape(-1)
    assert torch.allclose(M.group_advantages(rewards, 4, scale=False), expected)
    assert not torch.allclose(M.group_advantages(rewards, 4), expected)  # GRPO's std division is a different thing


def test_leave_one_out_advantage_is_the_reward_minus_the_others_mean():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 3.0, 3.0, 3.0, 3.0])
    advantages = M.leave_one_out_advantages(rewards, 4)
    for i in range(8):
        group = rewards[(i // 4) * 4: (i // 4) * 4 + 4]
        others = torch.cat([group[: i % 4], group[i % 4 + 1:]])
        assert advantages[i].item() == pytest.approx((rewards[i] - others.mean()).item())
    assert torch.equal(advantages[4:], torch.zeros(4))  # a group of equal rewards carries no signal
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        M.leave_one_out_advantages(rewards, 1)


def test_reinforce_pp_folds_the_kl_into_returns_and_normalises_over_the_batch():
    scores = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, -0.2, 9.0]])  # the padded 9.0 must not count
    advantages = M.reinforce_pp_advantages(scores, kl, mask, kl_coef=0.5)
    # rewards: row 0 [-0.05, -0.1, -0.15 + 1], row 1 [-0.2, 0.1]; returns-to-go with gamma 1:
    returns = torch.tensor([0.7, 0.75, 0.85, -0.1, 0.1])
    expected = (returns - returns.mean()) / returns.std()
    assert torch.allclose(advantages[mask.bool()], expected, atol=1e-5)
    assert advantages[1, 2] == 0  # padding
    baseline = M.reinforce_pp_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), torch.zeros(4, 1),
                                         torch.ones(4, 1), 0.0, group_size=2)
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0])  # each pair's mean removed: (1, 0) -> (0.5, -0.5), (2, 2) -> 0
    assert torch.allclose(baseline[:, 0], (centred - centred.mean()) / centred.std())


@pytest.mark.parametrize("max_length,cache", [(10, 4), (10, 0), (16, 16)])
def test_overlong_penalty_equals_trl_soft_overlong_punishment(max_length, cache):
    from trl.rewards import get_soft_overlong_punishment

    lengths = list(range(0, max_length + 4))
    trl = get_soft_overlong_punishment(max_length, cache)([[1] * n for n in lengths])
    suite = M.overlong_penalty(torch.tensor(lengths), max_length, cache)
    assert torch.allclose(suite, torch.tensor(trl, dtype=torch.float32))
    assert suite.min() == -1.0 and suite[0] == 0.0


def test_unknown_importance_level_is_refused():
    with pytest.raises(ValueError, match="use 'token' or 'sequence'"):
        M.importance_log_ratio(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "sentence")
