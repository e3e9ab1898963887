"""The matched budget -> each trainer's config. 'Matched' is this mapping, so it is tested, not assumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from baselines import grpo, ppo
from baselines.common import matched_training_args
from baselines.grpo import grpo_config
from bench.execution.context import RunContext
from bench.task.data import matched_rows, prompts_for_steps
from bench.execution.plan import make_plan
from bench.config.loading import load_spec


def make_ctx(spec, method: str, tmp_path: Path, device: str = "cpu", seed: int = 0) -> RunContext:
    return RunContext(spec=spec, method=method, method_spec=spec.methods[method], seed=seed, run_dir=tmp_path,
                      device=device, init_model_dir=None, train_rows=[], telemetry=None,
                      progress=lambda *a: None)


def test_grpo_config_carries_the_matched_budget(tmp_path: Path) -> None:
    spec = load_spec("cpu-tiny", ["train.steps=123", "train.prompts_per_step=4", "train.group_size=6",
                                  "generation.max_new_tokens=20", "generation.temperature=0.8",
                                  "generation.top_p=0.9", "train.kl_beta=0.07", "train.learning_rate=2e-4",
                                  "methods.grpo.learning_rate=null"])  # cpu-tiny ships a tuned rate of its own
    config = grpo_config(make_ctx(spec, "grpo", tmp_path))
    assert config.max_steps == 123
    assert config.per_device_train_batch_size == 24  # TRL counts completions: 4 prompts x G 6
    assert config.num_generations == 6
    assert config.max_completion_length == 20
    assert config.temperature == pytest.approx(0.8) and config.top_p == pytest.approx(0.9)
    assert config.loss_type == "grpo"  # TRL's default is "dapo"
    assert config.beta == pytest.approx(0.07)  # TRL's default is 0.0 (no reference model)
    assert config.learning_rate == pytest.approx(2e-4)
    assert config.bf16 is False  # TRL's default bf16=True fails on CPU
    assert config.shuffle_dataset is False and config.num_iterations == 1
    assert config.seed == 0 and config.report_to == []


def test_method_overrides_are_declared_differences(tmp_path: Path) -> None:
    spec = load_spec("cpu-tiny", ["methods.grpo.learning_rate=5e-5", "methods.grpo.beta=0.0"])
    assert spec.methods["grpo"].resolved_learning_rate(spec) == pytest.approx(5e-5)
    assert grpo.beta(spec, spec.methods["grpo"]) == 0.0
    assert grpo_config(make_ctx(spec, "grpo", tmp_path)).beta == 0.0
    # GRPO's overrides leave the other methods where the preset put them (PPO: the matched learning rate, its tuned
    # KL coefficient, which is not GRPO's beta).
    base, other = load_spec("cpu-tiny"), spec.methods["ppo"]
    assert other.resolved_learning_rate(spec) == pytest.approx(spec.train.learning_rate)
    assert ppo.kl_coef(spec, other) == pytest.approx(ppo.kl_coef(base, base.methods["ppo"])) != 0.0


def test_shared_training_args_are_identical_across_methods(tmp_path: Path) -> None:
    spec = load_spec("cpu-tiny", ["train.max_grad_norm=0.5", "train.lr_scheduler=cosine", "train.warmup_steps=3"])
    args = [matched_training_args(spec, make_ctx(spec, m, tmp_path), max_steps=10, learning_rate=1e-4,
                                  batch_size=8) for m in ("grpo", "dpo")]
    assert args[0] == args[1]
    assert args[0]["max_grad_norm"] == 0.5 and args[0]["lr_scheduler_type"] == "cosine"
    assert args[0]["warmup_steps"] == 3 and args[0]["optim"] == "adamw_torch"
    assert args[0]["use_cpu"] is True and args[0]["bf16"] is False


def test_bf16_is_autocast_over_fp32_weights(tmp_path: Path) -> None:
    """bfloat16 in the spec turns on the Trainer's bf16 autocast; float32 leaves it off (TRL defaults it on)."""
    spec = load_spec("gsm8k-qwen0.5b")
    gpu = matched_training_args(spec, make_ctx(spec, "grpo", tmp_path, device="cuda"), max_steps=1,
                                learning_rate=1e-6, batch_size=8)
    fp32 = load_spec("cpu-quick")
    cpu = matched_training_args(fp32, make_ctx(fp32, "grpo", tmp_path, device="cpu"), max_steps=1,
                                learning_rate=1e-6, batch_size=8)
    assert gpu["bf16"] is True and cpu["bf16"] is False and gpu["fp16"] is False


def test_grpo_micro_batches_keep_the_step_batch(tmp_path: Path) -> None:
    """TRL GRPO with micro-batches: same completions per optimizer step, accumulated (the preset maps 128 = 16 x 8)."""
    spec = load_spec("gsm8k-qwen0.5b")
    config = grpo_config(make_ctx(spec, "grpo", tmp_path, device="cpu"))
    assert config.per_device_train_batch_size == spec.train.micro_batch_size == 8
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == spec.completions_per_step
    assert config.generation_batch_size == spec.completions_per_step  # one generation per optimizer step


class _IdentityTokenizer:
    chat_template = None


def test_every_method_of_a_seed_sees_the_same_prompts_in_the_same_order() -> None:
    spec = load_spec("cpu-quick")
    train_a, test_a = matched_rows(spec, _IdentityTokenizer(), seed=0)
    train_b, test_b = matched_rows(spec, _IdentityTokenizer(), seed=0)
    train_c, _ = matched_rows(spec, _IdentityTokenizer(), seed=1)
    assert [r["prompt"] for r in train_a] == [r["prompt"] for r in train_b]
    assert [r["prompt"] for r in test_a] == [r["prompt"] for r in test_b]
    assert [r["prompt"] for r in train_a] != [r["prompt"] for r in train_c]  # a new seed, a new order
    assert {r["prompt"] for r in train_a} == {r["prompt"] for r in train_c}  # ... of the same prompts
    step_prompts = prompts_for_steps(train_a, steps=3, per_step=4)
    assert step_prompts == train_a[:12]
    wrapped = prompts_for_steps(train_a[:5], steps=2, per_step=4)
    assert wrapped == train_a[:5] + train_a[:3]


def test_plan_orders_stages_before_methods_and_only_what_is_needed() -> None:
    spec = load_spec("cpu-quick", ["seeds=[0,1]"])
    runs = make_plan(spec)
    ids = [r.run_id for r in runs]
    assert ids[:3] == ["warm_start", "sample_pool", "reward_model"]
    assert ids[3:] == [f"{m}-s{s}" for s in (0, 1) for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo")]
    by_id = {r.run_id: r for r in runs}
    assert by_id["ppo-s0"].needs == ("warm_start", "sample_pool", "reward_model")
    assert by_id["ppo_verifier-s1"].needs == ("warm_start",)
    only_grpo = load_spec("cpu-quick", ["methods.ppo.enabled=false", "methods.dpo.enabled=false"])
    assert [r.run_id for r in make_plan(only_grpo)] == ["warm_start", "grpo-s0", "grpo_engine-s0", "ppo_verifier-s0"]


def test_every_prerequisite_rule_is_planned() -> None:
    """Each recipe declares its stages from its config; the plan runs exactly those (and what they read)."""
    cases = {
        # only the verifier and a policy-initialised critic: the starting checkpoint is all PPO needs
        ("methods.ppo_verifier.critic_init=policy",): {"ppo_verifier-s0": ("warm_start",)},
        # a critic initialised from the reward model needs the reward-model stage, and so the pool
        ("methods.ppo_verifier.critic_init=reward_model",):
            {"ppo_verifier-s0": ("warm_start", "sample_pool", "reward_model")},
        ("methods.ppo.reward=model",): {"ppo-s0": ("warm_start", "sample_pool", "reward_model")},
        ("methods.ppo.reward=verifier",): {"ppo-s0": ("warm_start",)},
        ("methods.dpo.enabled=true",): {"dpo-s0": ("warm_start", "sample_pool")},
        ("methods.grpo.enabled=true",): {"grpo-s0": ("warm_start",)},
        ("methods.grpo_engine.enabled=true",): {"grpo_engine-s0": ("warm_start",)},
    }
    for overrides, expected in cases.items():
        (run_id, needs), = expected.items()
        method = run_id.rsplit("-s", 1)[0]
        only = [f"methods.{m}.enabled=false" for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo")
                if m != method]
        runs = make_plan(load_spec("cpu-quick", [*only, *overrides]))
        assert [r.run_id for r in runs] == [*needs, run_id], overrides
        assert {r.run_id: r.needs for r in runs}[run_id] == needs
