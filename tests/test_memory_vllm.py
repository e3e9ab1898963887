"""The memory model's vLLM terms (bench.systems.memory_vllm): with generation.backend vllm the generating device
holds vLLM's own weights copy (model.dtype) and its preallocated KV cache, sized by vLLM's rule (ceil(share x device
memory) less the weights and the profile run's activations), instead of HF generate's cache and logits; released
during the suite engine's update on CUDA (sleep mode), held otherwise. Every term by hand on a small shape, and
`bench estimate --backend vllm`. No torch, no vLLM."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from test_estimate import run as run_estimate
from bench.systems.memory_model import predict, predict_for_spec
from bench.systems.memory_terms import GIB, Settings, Shape
from bench.systems.memory_vllm import VLLM_MOMENT, reservation

# The shape of tests/test_memory_model.py: 2 layers, hidden 8, MLP 16, 2 query heads and 1 KV head of width 4,
# 32 vocabulary entries, untied LM head, q/k/v biases: 1,736 parameters.
SMALL = Shape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=32, tied_embeddings=False,
              head_dim=4, qkv_bias=True)
HF = Settings(dtype="bfloat16", micro_batch_size=2, prompt_tokens=3, completion_tokens=5, group_size=2,
              prompts_per_step=2, gradient_checkpointing=False, kl_beta=0.04, evaluation=False,
              gpu_memory_bytes=4 * 2 ** 20)
VLLM = replace(HF, generation_backend="vllm", vllm_gpu_memory_utilization=0.5)

WEIGHTS = 1736 * 2  # vLLM's copy in model.dtype (bf16)
# The profile run below 70 GiB: 8,192 tokens and 256 sequences (vLLM's LLM-class defaults). One layer's no-grad
# working set in bf16 per token: MLP 3 x 2 x 16 = 96, q/k/v 2 x (8 + 2 x 4) = 32, residual stream 3 x 2 x 8 = 48
# -> 176 B; the dummy sampler's 3 float32 copies of 256 rows of 32 logits.
ACTIVATIONS = 8192 * 176 + 3 * 4 * 32 * 256
REQUESTED = 2 * 2 ** 20  # ceil(0.5 x 4 MiB)
KV = REQUESTED - WEIGHTS - ACTIVATIONS
GENERATING = {"vllm_weights": WEIGHTS, "vllm_kv_cache": KV, "vllm_activations": ACTIVATIONS}
HELD = {"vllm_weights": WEIGHTS, "vllm_kv_cache": KV}


def test_the_reservation_by_hand():
    r = reservation(SMALL, "ppo", VLLM)
    assert (WEIGHTS, ACTIVATIONS, KV) == (3472, 1_540_096, 553_584)
    assert (r.requested_bytes, r.weights_bytes, r.activation_bytes, r.kv_cache_bytes) == (REQUESTED, WEIGHTS,
                                                                                          ACTIVATIONS, KV)
    assert (r.max_num_batched_tokens, r.max_num_seqs) == (8192, 256)
    # K and V of 2 layers x kv width 4 in bf16: 32 B a token; 553,584 B hold 17,299 tokens, 2,162 sequences of 3 + 5.
    assert (r.kv_bytes_per_token, r.kv_tokens) == (32, 17_299)
    assert r.to_json(3, 5)["sequences_held"] == 2_162 and r.problem is None
    assert r.sleeps  # the suite's engine on CUDA sleeps through its update
    assert not reservation(SMALL, "grpo", VLLM).sleeps  # TRL's colocated vLLM starts without sleep mode
    # 70 GiB and more: vLLM batches 16,384 tokens and 1,024 sequences in its profile run.
    big = reservation(SMALL, "ppo", replace(VLLM, gpu_memory_bytes=80 * GIB))
    assert (big.max_num_batched_tokens, big.max_num_seqs) == (16384, 1024)
    assert big.activation_bytes == 16384 * 176 + 3 * 4 * 32 * 1024
    assert big.kv_cache_bytes == 40 * GIB - WEIGHTS - big.activation_bytes


def test_the_engine_holds_vllm_between_generations_and_releases_it_in_the_update():
    hf, p = predict(SMALL, "ppo", HF), predict(SMALL, "ppo", VLLM)
    # HF's cache, logits, prefill and cast are gone from the generation: vLLM's whole share instead.
    assert p.moments["generation"] == {VLLM_MOMENT: GENERATING}
    assert p.phases["generation"]["total"] == REQUESTED
    # Reward, reference and critic run with vLLM awake: its weights and KV cache on top of HF's terms there.
    for phase in ("reward", "reference", "critic"):
        assert p.phases[phase]["total"] == hf.phases[phase]["total"] + WEIGHTS + KV, phase
    # The update and the optimizer step: asleep (CUDA, level 1), nothing of vLLM.
    assert p.moments["update"] == hf.moments["update"] and p.phases["optimizer_step"] == hf.phases["optimizer_step"]
    assert p.resident_bytes == hf.resident_bytes and p.kv_cache_bytes == KV
    assert p.vllm["kv_tokens"] == 17_299 and p.to_json()["generation_backend"] == "vllm"
    assert hf.vllm is None and hf.to_json()["vllm"] is None


def test_trl_grpo_and_a_cpu_hold_vllm_through_the_update():
    hf, p = predict(SMALL, "grpo", HF), predict(SMALL, "grpo", VLLM)
    for phase in ("update", "optimizer_step", "reference"):
        assert p.phases[phase]["total"] == hf.phases[phase]["total"] + WEIGHTS + KV, phase
    assert "held through the update (TRL's colocated engine" in p.notes[-2]
    # On a CPU the KV cache is the size asked for (kv_cache_memory_bytes), and there is no sleep mode.
    cpu = replace(VLLM, device="cpu", vllm_cpu_kv_cache_gib=0.001)
    kv = int(0.001 * GIB)
    r = reservation(SMALL, "ppo", cpu)
    assert (r.kv_cache_bytes, r.requested_bytes, r.sleeps) == (kv, WEIGHTS + ACTIVATIONS + kv, False)
    engine = predict(SMALL, "ppo", cpu)
    assert engine.moments["update"]["actor forward"]["vllm_kv_cache"] == kv


def test_dpo_starts_vllm_for_its_evaluation_only():
    hf = predict(SMALL, "dpo", replace(HF, evaluation=True))
    p = predict(SMALL, "dpo", replace(VLLM, evaluation=True))
    assert p.moments["evaluation"] == {VLLM_MOMENT: GENERATING}
    for phase in ("update", "reference", "optimizer_step"):
        assert p.phases[phase] == hf.phases[phase], phase
    assert p.peak_phase == "evaluation" and p.peak_bytes == p.resident_bytes + REQUESTED


def test_the_sample_pool_stage_decodes_in_vllm():
    stage = predict(SMALL, "ppo", VLLM).stages["sample_pool"]
    assert stage.moments["generation"] == {VLLM_MOMENT: GENERATING}
    assert stage.peak_bytes == 1736 * 2 + REQUESTED  # the frozen bf16 policy and vLLM's share


def test_a_share_too_small_for_the_weights_and_activations_cannot_start():
    tight = replace(VLLM, vllm_gpu_memory_utilization=0.1)  # 419,431 B: less than the activations alone
    p = predict(SMALL, "grpo_engine", tight)
    assert p.vllm["kv_cache_bytes"] < 0 and "no room for a KV cache" in p.vllm["problem"]
    assert p.fits is False and p.max_micro_batch == 0 and p.kv_cache_bytes == 0
    assert all(v >= 0 for phase in p.phases.values() for v in phase.values())  # nothing negative is shown


def test_a_spec_carries_its_backend_and_share():
    from bench.config.loading import load_spec

    spec = load_spec("systems-qwen0.5b", ["generation.vllm_gpu_memory_utilization=0.5"])
    spec.generation.backend = "vllm"  # set after loading: the load-time checks need no vLLM installed here
    p = predict_for_spec(spec, "grpo_engine")
    assert (p.settings.generation_backend, p.settings.vllm_gpu_memory_utilization) == ("vllm", 0.5)
    assert p.phases["generation"]["total"] == 40 * GIB
    assert predict_for_spec(load_spec("systems-qwen0.5b"), "grpo_engine").vllm is None


def test_estimate_backend_vllm_labels_every_term(capsys):
    code, out, _ = run_estimate(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo", "--backend", "vllm", "--json")
    data = json.loads(out)
    assert code == 0 and data["generation_backend"] == "vllm"
    # Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings) x 2 B.
    assert data["vllm"]["weights_bytes"] == 494_032_768 * 2
    assert data["vllm"]["requested_bytes"] == 24 * GIB  # ceil(0.3 x 80 GiB)
    gen = data["phases"]["generation"]
    assert set(gen) == {"vllm_weights", "vllm_kv_cache", "vllm_activations", "total"}
    assert gen["total"] == 24 * GIB and "kv_cache" not in gen
    _, out, _ = run_estimate(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo", "--backend", "vllm",
                          "--vllm-gpu-memory-utilization", "0.5")
    assert "generation backend: vllm, its share ceil(0.5 x 80.00 GiB) = 40.00 GiB: vllm weights" in out
    assert "vllm kv cache" in out and "held through the update" in out
    _, out, _ = run_estimate(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo")
    assert "generation backend: transformers" in out and "vllm" not in out
    # The spec's own keys do the same as the flags.
    _, out, _ = run_estimate(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo_engine", "--json",
                          "generation.backend=vllm", "generation.vllm_gpu_memory_utilization=0.5")
    data = json.loads(out)
    assert data["vllm"]["requested_bytes"] == 40 * GIB and data["vllm"]["sleeps"] is True


@pytest.mark.parametrize("argv, words", [
    (["--vllm-gpu-memory-utilization", "1.5"], "--vllm-gpu-memory-utilization must be in (0, 1], got 1.5"),
    (["generation.backend=vlm"], "'generation_backend' must be transformers or vllm, got 'vlm'"),
    (["vllm_gpu_memory_utilization=0"], "'vllm_gpu_memory_utilization' must be in (0, 1], got '0'"),
])
def test_bad_backend_input_is_one_line(argv: list[str], words: str, capsys):
    code, _, err = run_estimate(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo", *argv)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
