"""LoRA on the suite's engine: PPO and GRPO train only adapters (and PPO's value head), the reference is
the actor's base with adapters disabled (the starting checkpoint's log-probs exactly, no weights of its own), and
the accounting says so.

Runs on the tiny engine models of tests/test_rollout_engine.py (random Qwen2, hidden 32, 2 layers), offline.
"""

from __future__ import annotations

import math

import pytest
import torch

from baselines import grpo_engine, ppo
from bench.telemetry import account_networks
from test_rollout_engine import STEPS, _context, _initial_weights, model_dirs  # noqa: F401 (a pytest fixture)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def _lora_context(tmp_path, model_dirs, method, cfg, **lora):  # noqa: F811 (the fixture's value)
    ctx = _context(tmp_path, model_dirs, method, cfg)
    ctx.spec.train.lora.enabled = True
    ctx.spec.train.lora.r, ctx.spec.train.lora.alpha = 4, 8
    for key, value in lora.items():
        setattr(ctx.spec.train.lora, key, value)
    return ctx


def _split(named: dict[str, torch.Tensor], prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base weights by their checkpoint name, adapter weights by name) of a peft-wrapped module."""
    base, adapters = {}, {}
    for name, param in named.items():
        if "lora_" in name:
            adapters[name] = param
        else:
            base[name.removeprefix(prefix).replace(".base_layer", "")] = param
    return base, adapters


def _assert_base_unchanged(base: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> None:
    assert base and set(base) <= set(initial), sorted(set(base) - set(initial))[:3]
    for name, weight in base.items():
        assert not weight.requires_grad, name
        assert torch.equal(weight, initial[name]), name  # bit for bit


def test_ppo_with_lora_trains_adapters_and_value_head_only(tmp_path, model_dirs):  # noqa: F811
    from transformers import AutoModel

    ctx = _lora_context(tmp_path, model_dirs, "ppo", ppo.Config(reward="model", minibatches=2))
    ctx.spec.train.gradient_checkpointing = True  # adapters inside checkpointed blocks still get gradients
    initial = _initial_weights(model_dirs[0])
    initial_backbone = {k: v.clone() for k, v in AutoModel.from_pretrained(model_dirs[0]).state_dict().items()}
    outcome = ppo.train(ctx)

    assert set(outcome.networks) == {"actor", "critic", "reward", "reference"}
    actor, critic = outcome.networks["actor"], outcome.networks["critic"]
    base, adapters = _split(dict(actor.named_parameters()), "base_model.model.")
    _assert_base_unchanged(base, initial)
    assert adapters and all(p.requires_grad for p in adapters.values())
    assert any(p.abs().sum() > 0 for n, p in adapters.items() if "lora_B" in n)  # B starts at 0: it moved
    critic_base, critic_adapters = _split(dict(critic.named_parameters()), "backbone.base_model.model.")
    head = {n: critic_base.pop(n) for n in ("head.weight", "head.bias")}
    _assert_base_unchanged(critic_base, initial_backbone)
    assert critic_adapters and all(p.requires_grad for p in [*critic_adapters.values(), *head.values()])
    assert any(p.abs().sum() > 0 for n, p in critic_adapters.items() if "lora_B" in n)
    assert not any(p.requires_grad for p in outcome.networks["reward"].parameters())  # the reward model: frozen

    acc = account_networks(outcome.networks, outcome.optimizers)
    assert acc["actor"]["trainable_params"] == sum(p.numel() for p in adapters.values())
    assert acc["critic"]["trainable_params"] == sum(p.numel() for p in [*critic_adapters.values(), *head.values()])
    assert acc["actor"]["grad_bytes"] == 4 * acc["actor"]["trainable_params"]  # no gradient for a frozen base
    reference = acc["reference"]
    assert reference["weight_bytes"] == 0 and reference["params"] == 0
    assert reference["shared_params"] == acc["actor"]["params"] and reference["shared_with"] == ["actor"]
    assert outcome.settings["precision"]["reference"]["shared_with"] == "actor"
    assert outcome.settings["lora"] == {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0,
                                        "critic": True}
    assert outcome.steps == STEPS * 2 and all(math.isfinite(p["value_loss"]) for p in outcome.log_history)


def test_ppo_critic_without_lora_trains_every_weight(tmp_path, model_dirs):  # noqa: F811
    ctx = _lora_context(tmp_path, model_dirs, "ppo_verifier", ppo.Config(reward="verifier"), critic=False)
    ctx.spec.train.steps = 1
    outcome = ppo.train(ctx)
    critic = outcome.networks["critic"]
    assert all(p.requires_grad for p in critic.parameters()) and not any("lora_" in n for n, _ in
                                                                          critic.named_parameters())
    assert outcome.settings["lora"]["critic"] is False


def test_grpo_engine_with_lora_reference_is_the_base_exactly(tmp_path, model_dirs):  # noqa: F811
    """Gradient checkpointing on, so the adapters inside checkpointed blocks must still get gradients."""
    from transformers import AutoModelForCausalLM

    from bench.scoring.evaluation import generate_greedy
    from bench.model.generation import eos_token_ids, sampling_settings

    ctx = _lora_context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config(missing_eos_penalty=1.0),
                        target_modules="q_proj,v_proj")
    ctx.spec.train.gradient_checkpointing = True
    initial = _initial_weights(model_dirs[0])
    torch.manual_seed(0)  # sampling: a draw whose groups' scores differ (else every advantage, and update, is 0)
    outcome = grpo_engine.train(ctx)
    engine_actor = outcome.networks["actor"]
    base, adapters = _split(dict(engine_actor.named_parameters()), "base_model.model.")
    _assert_base_unchanged(base, initial)
    assert {n.split(".")[-4] for n in adapters} == {"q_proj", "v_proj"}  # only the named modules got adapters
    assert any(p.abs().sum() > 0 for n, p in adapters.items() if "lora_B" in n)
    assert all(math.isfinite(p["kl"]) for p in outcome.log_history)

    # The reference (adapters off) gives the starting checkpoint's log-probs exactly; the actor no longer does.
    from baselines.rollout_engine import Engine

    engine = Engine(ctx, ctx.method_spec, kl_coef=0.04)
    engine.actor.load_state_dict(engine_actor.state_dict())  # the trained adapters
    torch.manual_seed(1)
    batch = engine.sample(1)
    base_model = AutoModelForCausalLM.from_pretrained(model_dirs[0])
    assert torch.equal(engine.rollout_logprobs(engine.reference, batch), engine.rollout_logprobs(base_model, batch))
    assert not torch.equal(engine.rollout_logprobs(engine.actor, batch), engine.rollout_logprobs(base_model, batch))
    acc = account_networks(engine.networks, engine.optimizers)
    assert acc["reference"]["weight_bytes"] == 0 and acc["reference"]["shared_with"] == ["actor"]

    # The LoRA policy goes through the evaluation's generation path.
    settings = sampling_settings(ctx.spec, outcome.tokenizer, eos_token_ids(engine_actor, outcome.tokenizer),
                                 greedy=True)
    texts, lengths = generate_greedy(engine_actor, outcome.tokenizer, [r["prompt"] for r in ctx.train_rows],
                                     settings, batch_size=4)
    assert len(texts) == len(ctx.train_rows) and all(0 < n <= settings["max_new_tokens"] for n in lengths)


def test_lora_specs_for_the_engine() -> None:
    from bench.errors import SpecError
    from bench.config.loading import load_spec

    spec = load_spec("cpu-quick", ["train.lora.enabled=true"])  # every method, the engine's included
    assert {"grpo_engine", "ppo", "ppo_verifier"} <= set(spec.enabled_methods())
    preset = load_spec("gsm8k-qwen0.5b-lora")
    assert preset.train.lora.enabled and preset.train.lora.r == 32 and preset.train.lora.critic
    with pytest.raises(SpecError, match="^'train.lora.target_modules' must be 'all-linear' or comma-separated"):
        load_spec("cpu-quick", ["train.lora.target_modules=q-proj"])


def test_bf16_lora_reference_equals_the_untrained_actor(tmp_path, model_dirs):  # noqa: F811
    """Under a bfloat16 spec the frozen LoRA base is stored in bf16 (half a float32 base) and the
    adapters in float32; the shared reference runs that same base: at the first step (adapters' B at 0) its
    log-probs equal the actor's exactly, so the first KL is exactly 0."""
    ctx = _lora_context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config(missing_eos_penalty=1.0))
    ctx.spec.model.dtype = "bfloat16"
    ctx.spec.train.steps = 1
    initial = {k: v.to(torch.bfloat16) for k, v in _initial_weights(model_dirs[0]).items()}
    torch.manual_seed(0)
    outcome = grpo_engine.train(ctx)
    assert outcome.log_history[0]["kl"] == 0.0
    base, adapters = _split(dict(outcome.networks["actor"].named_parameters()), "base_model.model.")
    _assert_base_unchanged(base, initial)
    assert {w.dtype for w in base.values()} == {torch.bfloat16}
    assert adapters and {w.dtype for w in adapters.values()} == {torch.float32}
    precision = outcome.settings["precision"]
    assert precision["actor"] == {"storage": "bfloat16", "compute": "bfloat16 autocast", "optimizer_state": "float32",
                                  "adapters": "float32"}
    assert precision["reference"] == {"storage": "bfloat16", "compute": "bfloat16 autocast", "optimizer_state": None,
                                      "shared_with": "actor"}


def test_bf16_lora_critic_stores_its_base_in_bf16_and_trains_float32_adapters_and_head(tmp_path,
                                                                                    model_dirs):  # noqa: F811
    ctx = _lora_context(tmp_path, model_dirs, "ppo_verifier", ppo.Config(reward="verifier"))
    ctx.spec.model.dtype = "bfloat16"
    ctx.spec.train.steps = 1
    outcome = ppo.train(ctx)
    critic = outcome.networks["critic"]
    frozen = {p.dtype for p in critic.parameters() if not p.requires_grad}
    trained = {p.dtype for p in critic.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    assert outcome.settings["precision"]["critic"]["adapters"] == "float32"


def test_dry_run_says_the_lora_reference_shares_the_actors_weights() -> None:
    """The dry run's networks line: without LoRA a frozen copy in the spec's dtype; with LoRA (every method, the
    engine's included) the actor's base with adapters disabled, no weights of its own."""
    from bench.execution.plan import describe_method
    from bench.config.loading import load_spec

    full = load_spec("cpu-quick", ["model.dtype=bfloat16"])
    assert "reference bfloat16 (frozen)" in describe_method(full, "grpo_engine")[0]
    lora = load_spec("cpu-quick", ["model.dtype=bfloat16", "train.lora.enabled=true"])
    for method in ("grpo_engine", "ppo", "grpo", "dpo"):
        line = describe_method(lora, method)[0]
        assert line.startswith("networks: actor bfloat16 base + float32 adapters, bfloat16 autocast"), line
        assert "reference = actor's base with adapters disabled (its bfloat16 weights, shared: no copy)" in line
        assert "reference bfloat16" not in line
    assert "reward bfloat16 (frozen)" in describe_method(lora, "ppo")[0]  # the reward model stays its own copy
