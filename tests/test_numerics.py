"""One compute numerics (bench.model.numerics): a bf16-stored network under bf16 autocast
with its embeddings hooked computes exactly as the float32-stored copy of the same (bf16-valued) weights, so the
engine's bf16 reference gives KL exactly 0 before any update; the value head is float32 in one process and under
DDP alike; AdamW's implementation is chosen from the device.

Tiny random models built in a temporary folder; no network.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.model.numerics import actor_numerics, evaluation_precision, fp32_residual_stream
from test_rollout_engine import _context, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def _tiny(kind: str, folder: Path) -> Path:
    """A random Qwen2 or Llama saved in bf16 (the starting checkpoint's dtype under a bfloat16 spec)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[kind]
    config = config_cls(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
                        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    model_cls(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


def _inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(2, 300, (4, 20))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_bf16_storage_with_the_hook_equals_float32_storage_under_autocast(kind, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = _tiny(kind, tmp_path / kind)
    fp32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    inputs = _inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = fp32(**inputs).logits
        plain = bf16(**inputs).logits
        fp32_residual_stream(bf16)
        hooked = bf16(**inputs).logits
    assert not torch.equal(plain, want)  # what the reference did before: a bf16 residual stream
    assert torch.equal(hooked, want)  # bit for bit
    # greedy generation too (the evaluation), through actor_numerics
    prompt = {k: v[:, :8] for k, v in inputs.items() if k != "position_ids"}
    with torch.no_grad(), actor_numerics(fp32, "bfloat16"):
        a = fp32.generate(**prompt, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
    with torch.no_grad(), actor_numerics(bf16, "bfloat16"):
        b = bf16.generate(**prompt, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
    assert torch.equal(a, b)


def test_the_hook_does_nothing_without_autocast_and_is_added_once(tmp_path):
    from transformers import AutoModelForCausalLM

    bf16 = AutoModelForCausalLM.from_pretrained(_tiny("qwen2", tmp_path / "q"), dtype=torch.bfloat16).eval()
    fp32_residual_stream(fp32_residual_stream(bf16))
    assert len(bf16.get_input_embeddings()._forward_hooks) == 1
    with torch.no_grad():
        out = bf16.get_input_embeddings()(torch.tensor([[2, 3]]))
    assert out.dtype == torch.bfloat16  # a float32 spec, or a library forward outside autocast: untouched


def test_evaluation_precision_names_storage_and_compute(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = _tiny("qwen2", tmp_path / "q")
    fp32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert evaluation_precision(fp32, "bfloat16") == {"storage": "float32",
                                                      "compute": "bfloat16 autocast, float32 residual stream"}
    assert evaluation_precision(fp32, "float32") == {"storage": "float32", "compute": "float32"}
    vllm = {"backend": "vllm", "vllm": {"dtype": "bfloat16"}}  # vLLM decodes in its own kernels
    assert evaluation_precision(fp32, "bfloat16", vllm)["compute"] == "vllm (bfloat16)"


def _bf16_checkpoint(policy_dir: Path, out: Path) -> Path:
    """The tests' fp32 policy saved in bf16, as the warm start saves the starting checkpoint under a bf16 spec."""
    from transformers import AutoModelForCausalLM

    from bench.model.loading import load_tokenizer

    AutoModelForCausalLM.from_pretrained(policy_dir).to(torch.bfloat16).save_pretrained(out)
    load_tokenizer(policy_dir).save_pretrained(out)
    return out


def test_engine_reference_kl_is_exactly_zero_at_lr_0_under_bf16(tmp_path, model_dirs):  # noqa: F811
    """The control arm (lr 0) under the GPU preset's precision policy: a bf16-stored reference, a float32 actor under
    bf16 autocast, micro-batches. The policy never moves, so every step's KL must be exactly 0 (it was about 1e-3 on
    a real model with a bf16 residual stream in the reference)."""
    from baselines import control

    cfg = control.Config(enabled=True, missing_eos_penalty=1.0)
    ctx = _context(tmp_path, model_dirs, "control", cfg)
    ctx.init_model_dir = _bf16_checkpoint(model_dirs[0], tmp_path / "start")
    ctx.spec.model.dtype = "bfloat16"
    ctx.spec.train.micro_batch_size = 2
    torch.manual_seed(0)
    outcome = control.train(ctx)
    assert next(outcome.networks["reference"].parameters()).dtype == torch.bfloat16
    assert next(outcome.networks["actor"].parameters()).dtype == torch.float32
    assert [point["kl"] for point in outcome.log_history] == [0.0] * len(outcome.log_history)
    assert outcome.settings["precision"]["reference"]["compute"] == "bfloat16 autocast"


def test_value_head_is_float32_in_one_process_and_through_the_ddp_forward(tmp_path, model_dirs):  # noqa: F811
    """Engine.values calls the head outside the backbone's autocast with one process and ValueModel.forward (head
    inside autocast) under DDP: both must give the same float32 values."""
    from baselines.engine_networks import build_critic

    ctx = _context(tmp_path, model_dirs, "ppo_verifier", None)
    critic = build_critic(ctx, "policy")
    inputs = _inputs()
    inputs["input_ids"] = inputs["input_ids"] % 150
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = critic.hidden(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"])
            through_forward = critic(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"], 6)
        one_process = critic.values(hidden[:, -7:-1])
    assert through_forward.dtype == one_process.dtype == torch.float32
    assert torch.equal(through_forward, one_process)


def test_adamw_is_fused_on_cuda_and_torchs_default_elsewhere(tmp_path, model_dirs):  # noqa: F811
    from baselines import grpo_engine
    from baselines.common import TRL_OPTIM, adamw_implementation, matched_training_args

    assert adamw_implementation("cuda") == adamw_implementation("cuda:3") == "fused"
    assert adamw_implementation("cpu") == "default"
    assert TRL_OPTIM == {"fused": "adamw_torch_fused", "default": "adamw_torch"}
    ctx = _context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config())
    assert matched_training_args(ctx.spec, ctx, max_steps=1, learning_rate=0.0, batch_size=1)["optim"] == "adamw_torch"
    ctx.device = "cuda"  # the mapping only: nothing is placed on the device
    assert matched_training_args(ctx.spec, ctx, max_steps=1, learning_rate=0.0, batch_size=1)["optim"] == \
        "adamw_torch_fused"
    ctx.device = "cpu"
    ctx.spec.train.steps = 1
    outcome = grpo_engine.train(ctx)
    assert outcome.settings["adamw_implementation"] == "default"
    assert not outcome.optimizers["actor"].defaults.get("fused")


def _trl_context(tmp_path: Path, policy_dir: Path, method: str):
    """A bfloat16 spec at learning rate 0 for a TRL method, on the bf16 start checkpoint."""
    from bench.config.loading import load_spec_dict
    from bench.config.spec import Spec
    from bench.execution.context import RunContext
    from bench.model.loading import load_tokenizer
    from bench.telemetry import Telemetry
    from test_rollout_engine import _rows

    spec = Spec()
    spec.model.dtype = "bfloat16"
    spec.train.steps, spec.train.prompts_per_step, spec.train.group_size = 2, 2, 4
    spec.train.learning_rate, spec.train.log_every, spec.train.kl_beta = 0.0, 1, 0.04
    spec.generation.max_new_tokens = 8
    spec.reward.length_threshold, spec.reward.length_penalty = 0, 0.01  # rewards vary: non-zero advantages
    spec = load_spec_dict(spec.to_dict())
    spec.methods[method].learning_rate = 0.0
    start = _bf16_checkpoint(policy_dir, tmp_path / "start")
    ctx = RunContext(spec=spec, method=method, method_spec=spec.methods[method], seed=0, run_dir=tmp_path / "run",
                     device="cpu", init_model_dir=start, train_rows=_rows(8),
                     telemetry=Telemetry("cpu", enabled=False), progress=lambda *a: None,
                     tokenizer=load_tokenizer(start))
    return ctx


def test_trl_grpo_reference_kl_is_zero_at_lr_0_under_bf16(tmp_path, model_dirs):  # noqa: F811
    """TRL builds GRPO's reference itself (bf16, from the checkpoint); run_trainer hooks it, so at lr 0 under
    accelerate's bf16 autocast every logged KL is exactly 0."""
    from baselines import grpo

    ctx = _trl_context(tmp_path, model_dirs[0], "grpo")
    with ctx.telemetry:
        outcome = grpo.train(ctx)
    assert next(outcome.networks["reference"].parameters()).dtype == torch.bfloat16
    kls = [point["kl"] for point in outcome.log_history if "kl" in point]
    assert kls and kls == [0.0] * len(kls)


def test_trl_dpo_implicit_rewards_are_zero_at_lr_0_under_bf16(tmp_path, model_dirs):  # noqa: F811
    """DPO's implicit rewards are beta x (policy - reference) log-probs: 0 exactly when the bf16 reference computes
    in the float32 actor's numerics."""
    import json

    from baselines import dpo
    from bench.execution.sample_pool import pool_entry

    ctx = _trl_context(tmp_path, model_dirs[0], "dpo")
    ctx.pool_path = tmp_path / "pool.jsonl"
    with open(ctx.pool_path, "w", encoding="utf-8") as handle:
        for row in ctx.train_rows:
            entry = pool_entry(row, [f"<answer>{row['answer']}</answer>", "<answer>0</answer>"], [True, False],
                               "verifier")
            handle.write(json.dumps(entry) + "\n")
    with ctx.telemetry:
        outcome = dpo.train(ctx)
    rewards = [(p["chosen_reward"], p["rejected_reward"]) for p in outcome.log_history if "chosen_reward" in p]
    assert rewards and all(chosen == 0.0 and rejected == 0.0 for chosen, rejected in rewards)


def test_sample_pool_samples_its_bf16_policy_in_the_actors_numerics(tmp_path, model_dirs, monkeypatch):  # noqa: F811
    """The pool's policy is stored in bf16 (frozen) but generates under bf16 autocast with its embeddings hooked:
    the distribution the float32 actor samples its first rollout from."""
    from bench.execution import sample_pool
    from bench.model.numerics import HOOK_ATTRIBUTE
    from bench.telemetry import Telemetry
    from test_rollout_engine import _rows

    ctx = _context(tmp_path, model_dirs, "sample_pool", None)
    ctx.init_model_dir = _bf16_checkpoint(model_dirs[0], tmp_path / "start")
    ctx.spec.model.dtype = "bfloat16"
    ctx.spec.sample_pool.prompts, ctx.spec.sample_pool.samples_per_prompt = 2, 2
    ctx.train_rows, ctx.telemetry = _rows(2), Telemetry("cpu", enabled=False)
    seen = []
    original = sample_pool.sample

    def recording(model, *args, **kwargs):
        seen.append((next(model.parameters()).dtype, torch.is_autocast_enabled("cpu"),
                     getattr(model.get_input_embeddings(), HOOK_ATTRIBUTE, None) is not None))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(sample_pool, "sample", recording)
    with ctx.telemetry:
        sample_pool.train(ctx)
    assert seen == [(torch.bfloat16, True, True)]


def test_trl_lora_stores_the_frozen_base_in_bf16_and_starts_at_kl_0(tmp_path, model_dirs):  # noqa: F811
    """TRL's GRPO under LoRA and a bfloat16 spec: the frozen base in bf16 (half a float32 base),
    the adapters float32 (peft's upcast), the reference the base with adapters off (shared), first KL 0."""
    from baselines import grpo

    ctx = _trl_context(tmp_path, model_dirs[0], "grpo")
    lora = ctx.spec.train.lora
    lora.enabled, lora.r, lora.alpha = True, 4, 8
    ctx.spec.methods["grpo"].learning_rate = 1e-3
    with ctx.telemetry:
        outcome = grpo.train(ctx)
    frozen = {p.dtype for p in outcome.policy.parameters() if not p.requires_grad}
    trained = {p.dtype for p in outcome.policy.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    precision = outcome.settings["precision"]
    assert precision["actor"]["storage"] == "bfloat16" and precision["actor"]["adapters"] == "float32"
    assert precision["reference"]["shared_with"] == "actor"
    assert outcome.log_history[0]["kl"] == 0.0
