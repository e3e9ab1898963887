"""Precision and real shapes: with model.dtype bfloat16, updates at RL learning rates must not round away, and a
real architecture (Qwen2.5-0.5B's shape, random weights, no download) trains on the engine with micro-batches and
is accounted exactly as the precision policy says."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from bench.model.loading import load_tokenizer
from bench.execution.context import RunContext
from bench.config.spec import Spec
from bench.telemetry import Telemetry, account_networks

ONLINE = ("grpo", "grpo_engine", "ppo_verifier")


def _rows(n: int) -> list[dict[str, str]]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        rows.append({"prompt": f"What is {a} + {b}? ", "answer": str(a + b), "question": f"What is {a} + {b}?"})
    return rows


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 whose EOS logit has a large spread, so completion lengths (and so the length-penalty
    reward) differ within a group: every method then gets a non-zero advantage to learn from."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.model.loading import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("precision")
    tokenizer = build_tiny_tokenizer([r["prompt"] + r["answer"] for r in _rows(300)], 160)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[tokenizer.eos_token_id] *= 40
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    return root / "policy"


def _context(spec: Spec, method: str, init_dir: Path, run_dir: Path) -> tuple[RunContext, Telemetry]:
    telemetry = Telemetry("cpu", enabled=True, warmup_steps=0, track_training_change=True)
    ctx = RunContext(spec=spec, method=method, method_spec=spec.methods[method], seed=0, run_dir=run_dir,
                     device="cpu", init_model_dir=init_dir, train_rows=_rows(40), telemetry=telemetry,
                     progress=lambda *a: None, tokenizer=load_tokenizer(init_dir))
    return ctx, telemetry


def _bf16_spec(steps: int) -> Spec:
    from bench.config.loading import load_spec_dict

    spec = Spec()
    spec.model.dtype = "bfloat16"
    spec.train.steps, spec.train.prompts_per_step, spec.train.group_size = steps, 2, 4
    spec.train.learning_rate, spec.train.log_every = 1e-6, 5
    spec.generation.max_new_tokens = 8
    spec.reward.length_threshold, spec.reward.length_penalty = 0, 0.01  # reward = -0.01 x length: it varies
    return load_spec_dict(spec.to_dict())  # validated like a preset


@pytest.mark.parametrize("method", ONLINE)
def test_bf16_spec_at_lr_1e6_moves_every_trained_weight(method, policy_dir, tmp_path):
    """Pure-bf16 AdamW at lr 1e-6 moved ~2% of weights in 20 steps; fp32 master weights move all of them."""
    from bench.config.registry import recipe

    spec = _bf16_spec(steps=20)
    ctx, telemetry = _context(spec, method, policy_dir, tmp_path)
    with telemetry:
        outcome = recipe(method).train(ctx)
    change = telemetry.training_change()
    assert change["method"] == "exact"
    assert change["params_changed_fraction"] > 0.9, change  # today's bf16 storage: about 0.02
    actor = outcome.networks["actor"]
    assert next(actor.parameters()).dtype == torch.float32  # fp32 master weights
    if "reference" in outcome.networks:
        assert next(outcome.networks["reference"].parameters()).dtype == torch.bfloat16  # frozen: stored in bf16
    policy = outcome.settings["precision"]
    assert policy["actor"] == {"storage": "float32", "compute": "bfloat16 autocast", "optimizer_state": "float32"}


def test_real_architecture_ppo_with_micro_batches_and_exact_accounting(tmp_path, monkeypatch):
    """Qwen2.5-0.5B's public shape (2 of its 24 layers, width / 8, the real 151,936-entry vocabulary) built from
    the shipped config with random weights; two PPO steps on the engine in micro-batches of 2; the static
    accounting equals parameter count x bytes of the precision policy, exactly."""
    from baselines import ppo
    from bench.config.architectures import architecture_config, parameter_count
    from bench.model.loading import initial_model_source
    from bench.config.loading import load_spec_dict

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    spec = Spec()
    spec.model.source, spec.model.architecture, spec.model.dtype = "architecture", "qwen2.5-0.5b", "bfloat16"
    spec.model.scale.num_layers, spec.model.scale.width_divisor = 2, 8
    spec.train.steps, spec.train.prompts_per_step, spec.train.group_size = 2, 2, 2
    spec.train.micro_batch_size, spec.generation.max_new_tokens, spec.train.log_every = 2, 6, 1
    spec.methods["ppo_verifier"].reward = "verifier"
    spec = load_spec_dict(spec.to_dict())
    init_dir = Path(initial_model_source(spec, []))
    config = architecture_config("qwen2.5-0.5b", spec.model.scale)
    assert config.vocab_size == 151936

    ctx, telemetry = _context(spec, "ppo_verifier", init_dir, tmp_path / "run")
    with telemetry:
        outcome = ppo.train(ctx)
    assert outcome.steps == 2 and outcome.completions == 8
    accounts = account_networks(outcome.networks, outcome.optimizers)

    n = parameter_count(config)
    hidden = config.hidden_size
    actor, critic, reference = accounts["actor"], accounts["critic"], accounts["reference"]
    tensors = {role: sum(1 for p in outcome.networks[role].parameters() if p.requires_grad)
               for role in ("actor", "critic")}
    assert actor["params"] == n and actor["weight_bytes"] == 4 * n and actor["grad_bytes"] == 4 * n
    # AdamW: exp_avg + exp_avg_sq in float32, plus one float32 'step' scalar per parameter tensor
    assert actor["optimizer_bytes"] == 8 * n + 4 * tensors["actor"]
    assert reference["params"] == n and reference["weight_bytes"] == 2 * n and reference["grad_bytes"] == 0
    # the critic: the backbone (the tied LM head adds no parameters) plus a float32 value head (hidden + 1)
    assert critic["params"] == n + hidden + 1 and critic["weight_bytes"] == 4 * (n + hidden + 1)
    assert critic["optimizer_bytes"] == 8 * (n + hidden + 1) + 4 * tensors["critic"]
    assert telemetry.training_change()["params_changed_fraction"] > 0.5
