"""The engine's GRPO optimises what TRL's GRPO optimises: the same loss on the same batch, for the mapped settings.

TRL's loss is computed by a real ``GRPOTrainer._compute_loss`` (built on a tiny model) whose log-prob forward is
replaced by fixed log-probs; the engine's by ``grpo_token_loss`` aggregated with the weights the engine uses.
Both the loss values and the gradients with respect to the log-probs must agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baselines import rl_math as M
from baselines.grpo_engine import grpo_token_loss


@pytest.fixture(scope="module")
def tiny_trainer_parts(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.model.loading import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("grpo_eq")
    tokenizer = build_tiny_tokenizer([f"What is {a} + {b}? {a + b}" for a in range(20) for b in range(20)], 128)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=32, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    return root, tokenizer


def _trl_trainer(root: Path, tokenizer, loss_type: str, beta: float, correction: bool):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(output_dir=str(root / f"out-{loss_type}"), per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=5, loss_type=loss_type, beta=beta, use_bias_correction_kl=correction, bf16=False, use_cpu=True,
                        report_to=[], max_steps=1)
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(root / "m"), reward_funcs=[lambda **k: [0.0] * 4],
                       args=config, train_dataset=Dataset.from_list([{"prompt": "What is 1 + 2?"}] * 8),
                       processing_class=tokenizer)


def _batch(seed: int = 0):
    """b = 4 completions (one group), T = 5 tokens, ragged lengths; advantages from group-normalised rewards."""
    g = torch.Generator().manual_seed(seed)
    b, T = 4, 5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    logp = -torch.rand(b, T, generator=g) * 3
    ref_logp = logp + 0.3 * torch.randn(b, T, generator=g)
    advantages = M.group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.0]), 4)
    return logp, ref_logp, advantages, mask


@pytest.mark.parametrize("loss_type,beta,correction", [("grpo", 0.04, True), ("grpo", 0.04, False), ("grpo", 0.0, True),
                                                       ("bnpo", 0.04, True), ("dr_grpo", 0.04, True)])
def test_engine_grpo_loss_equals_trl_grpo_loss(tiny_trainer_parts, loss_type, beta, correction):
    root, tokenizer = tiny_trainer_parts
    trainer = _trl_trainer(root, tokenizer, loss_type, beta, correction)
    logp, ref_logp, advantages, mask = _batch()
    b, T = logp.shape

    trl_logp = logp.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (trl_logp, torch.zeros(b, T), None)
    inputs = {"prompt_ids": torch.ones(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
              "completion_ids": torch.ones(b, T, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": None,
              "num_items_in_batch": mask.sum()}
    if beta:
        inputs["ref_per_token_logps"] = ref_logp
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; the preset maps one step per batch
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()

    engine_logp = logp.clone().requires_grad_(True)
    per_token, _ = grpo_token_loss(engine_logp, engine_logp.detach(), ref_logp if beta else None, advantages,
                                   cliprange=0.2, kl_coef=beta, kl_bias_correction=correction)
    weights = M.loss_weights(mask, M.TRL_LOSS_AGGREGATION[loss_type], max_length=T)
    engine_loss = (per_token * weights).sum()
    engine_loss.backward()

    assert trainer.epsilon_low == trainer.epsilon_high == 0.2  # the engine's default cliprange
    assert engine_loss.item() == pytest.approx(trl_loss.item(), rel=1e-6, abs=1e-6)
    assert torch.allclose(engine_logp.grad, trl_logp.grad, atol=1e-7)
    assert engine_logp.grad.abs().sum() > 0  # the comparison is not vacuous


def test_aggregations_differ_on_ragged_lengths():
    """Sequence mean and token mean are different losses when lengths differ: the mapping matters."""
    _, _, _, mask = _batch()
    per_token = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    seq = (per_token * M.loss_weights(mask, "sequence_mean")).sum()
    tok = (per_token * M.loss_weights(mask, "token_mean")).sum()
    # sequence mean: (2 + 5.5 + 11 + 15) / 4 = 8.375 ; token mean: (10 + 11 + 33 + 15) / 11 = 69 / 11
    assert seq.item() == pytest.approx(8.375)
    assert tok.item() == pytest.approx(69 / 11)
