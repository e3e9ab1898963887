"""The memory model (bench.systems.memory_model): every term against hand arithmetic on a small shape; weights, gradients
and optimizer state exactly against the static accounting of real modules (scaled Qwen and Llama, fp32 and
bf16-with-fp32-master, LoRA); the search answers (largest micro-batch, GPU counts); no torch import."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from bench.config.architectures import architecture_config, architecture_fields, parameter_count
from bench.systems.memory_model import gpus_data_parallel, predict, predict_for_spec
from bench.systems.memory_terms import GIB, Settings, Shape
from bench.config.spec import ScaleSpec

# A Qwen2-type shape small enough to count by hand: 2 layers, hidden 8, MLP 16, 2 query heads and 1 KV head of
# width 4 (q width 8, kv width 4), 32 vocabulary entries, untied LM head, q/k/v biases.
SMALL = Shape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=32, tied_embeddings=False,
              head_dim=4, qkv_bias=True)
SMALL_SETTINGS = Settings(dtype="bfloat16", micro_batch_size=2, prompt_tokens=3, completion_tokens=5, group_size=2,
                          prompts_per_step=2, gradient_checkpointing=False, kl_beta=0.04, evaluation=False)


def test_static_terms_of_a_small_ppo_step_match_hand_arithmetic():
    p = predict(SMALL, "ppo", SMALL_SETTINGS)
    # Per layer: q 8x8=64, k 8x4=32, v 32, o 64, gate 8x16=128, up 128, down 128 (linears 576) + q/k/v biases
    # 8+4+4=16 + two norms 16 = 608 elements in 12 tensors. LM: embedding 32x8=256 + 2x608 + final norm 8 +
    # LM head 256 = 1736 elements in 1 + 24 + 1 + 1 = 27 tensors.
    assert SMALL.parameters() == 1736
    actor = p.networks["actor"]
    assert (actor.weights_bytes, actor.gradients_bytes) == (1736 * 4, 1736 * 4)  # fp32 master weights and grads
    assert actor.optimizer_bytes == 2 * 1736 * 4 + 4 * 27  # two fp32 moments + a 4-byte step per tensor = 13996
    # Critic: backbone 256 + 1216 + 8 = 1480 + value head 8 + 1 = 1489 elements in 26 + 2 = 28 tensors, fp32.
    critic = p.networks["critic"]
    assert (critic.weights_bytes, critic.gradients_bytes, critic.optimizer_bytes) == (5956, 5956, 11912 + 112)
    # Frozen networks in bf16: reward = backbone 1480 + score row 8; reference = the whole LM.
    assert (p.networks["reward"].weights_bytes, p.networks["reward"].optimizer_bytes) == (1488 * 2, 0)
    assert (p.networks["reference"].weights_bytes, p.networks["reference"].gradients_bytes) == (1736 * 2, 0)
    assert p.static_bytes == 6944 * 2 + 13996 + 5956 * 2 + 12024 + 2976 + 3472 == 58268
    assert p.resident_bytes == p.static_bytes  # the engine keeps its gradients between steps
    # bf16 autocast copies: actor linears 2x576 + LM head 256 = 1408 x 2 B; critic 1152 x 2 B.
    assert (actor.working_copy_bytes, critic.working_copy_bytes) == (2816, 2304)
    # The one compute numerics: every network's residual stream is float32 under autocast, a bf16 one's too.
    assert (actor.residual_bytes, p.networks["reference"].residual_bytes) == (4, 4)


def test_every_phase_of_a_small_ppo_step_matches_hand_arithmetic():
    p = predict(SMALL, "ppo", SMALL_SETTINGS)
    gen = p.moments["generation"]
    # 2 prompts x G 2 = 4 sequences of 3 + 5 tokens: 2 layers x kv width 4 x (fp32 K 4 B + V 4 B, promoted to K's
    # dtype by the cache) = 64 B a token. The prefill holds the prompts' cache (4 x 3 tokens) and one layer's no-grad working set over them:
    # 3 x 2 x 16 (MLP) + 2 x (8 + 2 x 4) (q, k, v) + 3 x 4 x 8 (fp32 residual, sum, norm) + 2 x 4 x 4 (RoPE
    # tables) = 256 B a token; the last decoding step the whole
    # cache and 5 float32 copies of every sequence's next-token logits (32 entries).
    assert gen["prefill"] == {"kv_cache": 12 * 64, "prefill_working": 12 * 256, "weight_casts": 512}
    assert gen["last decoding step"] == {"kv_cache": 4 * 8 * 64, "sampling_logits": 5 * 4 * 32 * 4,
                                         "weight_casts": 512}
    assert p.kv_cache_bytes == 2048 and p.phases["generation"]["total"] == 2048 + 2560 + 512
    # The engine samples with autocast's weight cache off: one transient bf16 cast, the largest linear (the LM
    # head 32 x 8 = 256 elements x 2 B); TRL's GRPO caches within each decoding forward: the whole copy.
    assert predict(SMALL, "grpo", SMALL_SETTINGS).phases["generation"]["weight_casts"] == 2816
    # Fixed-length generation (min_new_tokens) adds two copies of the logits.
    fixed = predict(SMALL, "ppo", replace(SMALL_SETTINGS, fixed_length=True)).phases["generation"]
    assert fixed["sampling_logits"] == 7 * 4 * 32 * 4

    # Scoring forwards see one micro-batch: 2 sequences x 8 tokens = 16 tokens.
    assert p.phases["reward"]["total"] == 16 * 256 + 16 * 8 * 4  # + the last hidden state, float32 (one numerics)
    # Engine logits over T + 1 = 6 positions in bf16 (2 x 6 x 32 x 2 = 768) and 2 float32 chunks of one
    # sequence's 5 x 32 logits (640 B each) in the log-prob pass.
    assert p.phases["reference"] == {"forward_working": 4096, "logits": 768, "fp32_logit_chunks": 1280,
                                     "total": 6144}
    # The critic's rollout values: its cached casts, the working set, its float32 last hidden state (16 x 8 x 4).
    assert p.phases["critic"]["total"] == 2304 + 4096 + 512

    # Saved activations per token per layer (bf16 autocast, fp32 residual): norms 2 x (4 x 8 + 4 x 8) = 128,
    # per-linear bf16 input casts 5x2x8 = 80, attention 4x2x8 + 4x2 heads = 72, MLP 4x2x16 = 128 -> 408 B. Final
    # norm: fp32 input and normalised input for 16 tokens (16 x 2 x 4 x 8 = 1024); the actor's head reads a bf16
    # cast of 2 x 6 positions (192), the critic's float32 value head a view of the whole fp32 output (512).
    actor_saved, critic_saved = 16 * 2 * 408 + 1024 + 192, 16 * 2 * 408 + 1024 + 512
    assert p.activations_bytes["no_checkpointing"] == 2 * actor_saved == 28544  # as reported: both read like the actor
    moments = p.moments["update"]
    # Without checkpointing the casts the matmuls saved survive each forward: the critic's forward sits on the
    # actor's saved casts, activations and logits; its backward adds its own saved casts and the largest weight
    # gradient of a layer: a bf16 gate gradient (2 x 128), or with its fp32 copy once the matmul has freed its
    # saved 16 x 16 bf16 input (6 x 128 - 512): 256.
    assert sum(moments["critic forward"].values()) == 2816 + actor_saved + 768 + 2304 + critic_saved == 34752
    assert moments["critic backward"] == {"actor_casts_saved": 2816, "actor_activations": actor_saved,
                                          "logits": 768, "critic_activations": critic_saved,
                                          "critic_casts_saved": 2304, "rebuilt_layer": 0, "weight_gradient": 256}
    # The entropy pass holds 3 float32 chunks, the log-prob backward 4 beside the logits' gradient.
    assert moments["actor log-probs and entropy"]["fp32_logit_chunks"] == 3 * 640
    assert moments["log-prob backward"]["fp32_logit_chunks"] == 4 * 640
    assert (p.peak_phase, p.peak_moment) == ("update", "critic backward")
    assert p.phases["update"]["total"] == 35008 and p.peak_bytes == 58268 + 35008
    # torch's fused AdamW on CUDA: nothing parameter-sized at the step; the CPU's foreach buffer is the actor's.
    assert p.phases["optimizer_step"] == {"total": 0}
    # On a CPU torch's default for-loop AdamW holds 3 float32 copies of the largest tensor (the 32 x 8 LM head).
    cpu = predict(SMALL, "ppo", replace(SMALL_SETTINGS, device="cpu"))
    assert cpu.phases["optimizer_step"] == {"adamw_step_temporaries": 3 * 4 * 256, "total": 3072}
    # The CUDA context is outside the allocator: in the device peak, not in the allocator's.
    assert p.outside_allocator == {"cuda_context": 512 * 2**20} and cpu.outside_allocator == {}
    assert p.device_peak_bytes == p.peak_bytes + 512 * 2**20


def test_with_checkpointing_the_actors_and_critics_casts_never_coexist():
    p = predict(SMALL, "ppo", replace(SMALL_SETTINGS, gradient_checkpointing=True))
    moments = p.moments["update"]
    # Each forward's cache is freed when it returns; only the LM head's saved cast (256 x 2) outlives the actor's
    # forward. Checkpointing keeps each layer's fp32 input (2 layers x 4 x 8 per token) and rebuilds one layer
    # (408 per token + its casts 2 x 576) in the backward pass.
    actor_kept = 16 * 2 * 32 + 1024 + 192
    assert moments["critic forward"] == {"actor_casts_saved": 512, "actor_activations": actor_kept, "logits": 768,
                                         "critic_weight_casts": 2304, "critic_activations": 16 * 64 + 1024 + 512,
                                         "layer_working": 16 * 256}
    assert moments["actor forward"]["actor_weight_casts"] == 2816 and "critic_weight_casts" not in moments[
        "actor forward"]
    assert moments["critic backward"]["rebuilt_layer"] == 16 * 408 + 2 * 576
    # The reported per-micro-batch activations (both networks, each with its rebuilt layer):
    assert p.activations_bytes["checkpointing"] == 2 * (16 * (64 + 408) + 1216)
    assert p.peak_moment == "critic backward" and p.phases["update"]["total"] == 14016


def test_trl_gradients_count_in_the_update_and_no_phase_is_negative():
    trl, engine = predict(SMALL, "grpo", SMALL_SETTINGS), predict(SMALL, "grpo_engine", SMALL_SETTINGS)
    # TRL's Trainer frees the actor's fp32 gradients after each step: resident is the static total less them,
    # and they come back in the update and the optimizer step.
    assert trl.resident_bytes == trl.static_bytes - 1736 * 4
    assert all(terms["gradients"] == 6944 for terms in trl.moments["update"].values())
    assert trl.phases["optimizer_step"] == {"gradients": 6944, "total": 6944}
    assert "gradients" not in trl.phases["generation"]
    assert engine.resident_bytes == engine.static_bytes
    assert all("gradients" not in terms for terms in engine.phases.values())
    for p in (trl, engine, predict(SMALL, "dpo", SMALL_SETTINGS)):
        assert all(v >= 0 for moments in p.moments.values() for terms in moments.values() for v in terms.values())


def test_trl_grpo_uses_the_fused_lm_head_and_its_fp32_gradient_buffer():
    p = predict(SMALL, "grpo", replace(SMALL_SETTINGS, gradient_checkpointing=True))
    moments = p.moments["update"]
    # No logits: the fused head projects 2 sequences x 5 completion tokens = 10 positions in one tile buffer of
    # 10 x 32,768 entries in bf16, casting the weight chunk by chunk (32 x 8 x 2); the forward's autocast cache
    # holds the decoder layers' casts only (2 x 1152), not the head's. It saves its own copy of the 10 positions'
    # fp32 hidden states (10 x 8 x 4).
    assert moments["policy forward"] == {"gradients": 6944, "actor_weight_casts": 2304,
                                         "actor_activations": 16 * 64 + 16 * 64 + 320,
                                         "fused_head_tile": 10 * 32768 * 2, "fused_head_weight_chunk": 512}
    # Its backward: float32 accumulators for the hidden states' gradient (10 x 8 x 4) and the whole LM head's
    # gradient (32 x 8 x 4: the fp32 LM-head gradient buffer).
    backward = moments["fused head backward"]
    assert (backward["fused_head_hidden_grad"], backward["fused_head_weight_grad"]) == (320, 1024)
    assert "logits" not in p.phases["update"] and "logits" not in p.phases["reference"]
    # DPO: its reference forward runs inside the loss, on top of the policy's saved activations and gradients.
    dpo = predict(SMALL, "dpo", replace(SMALL_SETTINGS, gradient_checkpointing=True)).phases["reference"]
    assert dpo["gradients"] == 6944 and dpo["actor_activations"] > 0 and dpo["forward_working"] == 2 * 2 * 8 * 256


def test_methods_keep_their_networks_and_the_reference_goes_with_kl_zero():
    assert set(predict(SMALL, "ppo", SMALL_SETTINGS).networks) == {"actor", "critic", "reward", "reference"}
    assert set(predict(SMALL, "ppo_verifier", SMALL_SETTINGS).networks) == {"actor", "critic", "reference"}
    assert set(predict(SMALL, "grpo", SMALL_SETTINGS).networks) == {"actor", "reference"}
    assert set(predict(SMALL, "grpo", replace(SMALL_SETTINGS, kl_beta=0)).networks) == {"actor"}
    dpo = predict(SMALL, "dpo", replace(SMALL_SETTINGS, kl_beta=0))
    assert set(dpo.networks) == {"actor", "reference"} and "generation" not in dpo.phases
    with pytest.raises(ValueError, match="unknown method 'rloo'"):
        predict(SMALL, "rloo", SMALL_SETTINGS)


def test_float32_has_no_working_copies_and_stores_the_frozen_networks_in_float32():
    p = predict(SMALL, "ppo", replace(SMALL_SETTINGS, dtype="float32"))
    assert p.networks["reference"].weights_bytes == 1736 * 4
    assert all(n.working_copy_bytes == 0 for n in p.networks.values())


def test_shape_counts_match_the_architectures_module_for_every_shipped_model():
    for name in ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b", "llama-3.1-8b", "llama-3.1-70b"):
        assert Shape.from_fields(architecture_fields(name)).parameters() == parameter_count(name)


def test_checkpointing_and_smaller_micro_batches_lower_the_update_peak():
    fields = architecture_fields("qwen2.5-7b")
    on = predict(fields, "grpo", Settings(gradient_checkpointing=True))
    off = predict(fields, "grpo", Settings(gradient_checkpointing=False))
    assert on.activations_bytes == off.activations_bytes  # both are always reported
    assert on.phases["update"]["actor_activations"] < off.phases["update"]["actor_activations"] / 5
    small = predict(fields, "grpo", Settings(micro_batch_size=1))
    assert small.phases["update"]["total"] < on.phases["update"]["total"]
    assert small.static_bytes == on.static_bytes


def test_the_largest_micro_batch_fits_and_one_more_does_not():
    fields = architecture_fields("qwen2.5-0.5b")
    s = Settings(gpu_memory_bytes=24 * GIB)
    p = predict(fields, "ppo", s)
    assert p.max_micro_batch >= 1
    assert predict(fields, "ppo", replace(s, micro_batch_size=p.max_micro_batch)).fits
    assert not predict(fields, "ppo", replace(s, micro_batch_size=p.max_micro_batch + 1)).fits


def test_gpu_counts_data_parallel_needs_the_static_terms_on_one_gpu_zero3_shards_them():
    fields = architecture_fields("llama-3.1-70b")
    quiet = Settings(gpu_memory_bytes=80 * GIB, evaluation=False)
    p = predict(fields, "ppo", quiet)
    assert not p.fits and p.max_micro_batch == 0
    assert p.gpus_data_parallel is None  # 4 networks of 70B: ~2.3 TiB of static state on every GPU
    # The suite's engine keeps the reference and reward model whole on every GPU and gathers the whole fp32 actor
    # (~263 GiB) to generate under ZeRO-3: no GPU count of 80 GiB fits it.
    assert p.gpus_zero3 is None and p.gpus["zero3_offload"] is None
    dpo = predict(fields, "dpo", quiet)  # TRL: ZeRO-3 shards every network
    assert dpo.gpus_zero3 is not None and dpo.gpus_zero3 * 80 * GIB > dpo.static_bytes
    # With the evaluation on, rank 0 builds a whole float32 copy of the policy to evaluate (common.evaluable_policy;
    # 263 GiB at 70B) beside its shards: no count fits then.
    evaluated = predict(fields, "dpo", replace(quiet, evaluation=True))
    assert evaluated.gpus_zero3 is None
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    copy = layout_memory(fields, "dpo", replace(quiet, evaluation=True), Layout(3, 64)).phases["evaluation"]
    assert copy["whole_copy_rank0"] == evaluated.networks["actor"].weights_bytes
    small = Settings(gpu_memory_bytes=80 * GIB, micro_batch_size=8)
    assert gpus_data_parallel(Shape.from_fields(architecture_fields("qwen2.5-0.5b")), "ppo", small) == 1


def test_to_json_has_the_fields_the_cli_and_the_sweep_read():
    data = predict(SMALL, "ppo", SMALL_SETTINGS, model="small").to_json()
    for key in ("method", "model", "parameters", "static_bytes", "peak_bytes", "peak_phase", "fits", "networks"):
        assert key in data
    assert data["networks"]["actor"]["weights_bytes"] == 6944
    assert {"weights_bytes", "gradients_bytes", "optimizer_bytes"} <= set(data["networks"]["critic"])


def test_predict_for_spec_reads_the_shape_and_settings_of_a_preset():
    from bench.config.loading import load_spec

    spec = load_spec("systems-qwen0.5b")
    p = predict_for_spec(spec, "ppo")
    assert p.model == "qwen2.5-0.5b" and p.parameters == parameter_count("qwen2.5-0.5b")
    assert (p.settings.micro_batch_size, p.settings.completion_tokens, p.settings.group_size) == (8, 512, 8)
    assert p.settings.gradient_checkpointing and p.settings.dtype == "bfloat16"
    scaled = load_spec("systems-qwen0.5b", ["model.scale.num_layers=2", "model.scale.width_divisor=8"])
    assert predict_for_spec(scaled, "grpo").parameters == parameter_count(architecture_config(
        "qwen2.5-0.5b", ScaleSpec(num_layers=2, width_divisor=8)))


def test_a_registered_method_the_model_does_not_name_is_modelled_from_its_recipe():
    from bench.config.loading import load_spec

    spec = load_spec("systems-qwen0.5b")
    if "control" not in spec.methods:
        pytest.skip("no control arm in this checkout")
    p = predict_for_spec(spec, "control")
    assert p.method == "control" and "modelled as grpo_engine" in p.notes[-1]
    assert p.static_bytes == predict_for_spec(spec, "grpo_engine").static_bytes


def test_a_hub_preset_is_predicted_from_the_shipped_shape_of_its_model():
    from bench.systems.memory_model import shipped_architecture_for
    from bench.config.loading import load_spec

    assert shipped_architecture_for("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
    assert shipped_architecture_for("meta-llama/Llama-3.1-70B") == "llama-3.1-70b"
    assert shipped_architecture_for("someone/else") is None
    p = predict_for_spec(load_spec("gsm8k-qwen0.5b"), "grpo")
    assert p.model == "qwen2.5-0.5b" and p.settings.prompts_per_step == 16


def test_the_module_imports_no_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "import bench.systems.memory_model as m, bench.config.architectures as a\n"
            "p = m.predict(a.architecture_fields('qwen2.5-7b'), 'ppo'); print(p.peak_phase)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in {"generation", "reward", "reference", "critic", "update", "optimizer_step"}


# ------------------------------------------------------------------------------------------------ layouts: ZeRO, LoRA

def test_each_zero_stage_shards_what_it_should_for_trl_grpo():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    # DeepSpeed's bf16 mixed precision on SMALL's GRPO networks (see the first test for the element counts):
    # actor 1736 parameters in 27 tensors: bf16 weights 3472, bf16 gradients 3472, fp32 master 6944, AdamW
    # 2 x 1736 x 4 + 4 x 27 = 13996; frozen reference 1736 x 2 = 3472. Two GPUs.
    def static(stage, settings=SMALL_SETTINGS, **offload):
        m = layout_memory(SMALL, "grpo", settings, Layout(stage, 2, **offload))
        return m.static, m.host_bytes

    replicated = 3472 + 3472  # every network's weights on every GPU below ZeRO-3
    zero1, host = static(1)  # optimizer state and master weights halved, gradients whole
    assert zero1 == {"weights": replicated, "gradients": 3472, "master_weights": 3472, "optimizer": 6998,
                     "gathered_weights": 0, "gradient_buckets": 0, "total": 20886} and host == 0
    zero2, _ = static(2)  # + gradients halved
    assert zero2["gradients"] == 1736 and zero2["total"] == 20886 - 1736
    zero3, _ = static(3)  # + every network's weights halved, the frozen reference included, and two gathered
    # modules: the largest is a decoder layer (608 elements) over the embedding / LM head (32 x 8 = 256), in bf16.
    assert (zero3["weights"], zero3["gathered_weights"]) == (1736 + 1736, 2 * 608 * 2)
    assert zero3["total"] == 3472 + 1736 + 3472 + 6998 + 2432 == 18110
    offloaded, host = static(3, offload_optimizer=True, offload_params=True)
    assert offloaded == {"weights": 0, "gradients": 0, "master_weights": 0, "optimizer": 0,
                         "gathered_weights": 2432, "gradient_buckets": 0, "total": 2432}
    # Host, all ranks: every network's bf16 weights + the actor's master weights, AdamW state and a float32
    # gradient partition (4 + 12 + 4 bytes a trained parameter, plus the step tensors).
    assert host == replicated + 6944 + 13996 + 6944 == 34828
    optimizer_only, host = static(2, offload_optimizer=True)
    assert (optimizer_only["weights"], optimizer_only["gradients"], optimizer_only["optimizer"]) == (replicated, 0, 0)
    assert host == 34828 - replicated
    # float32: the modules are float32, and DeepSpeed still clones its partition into a float32 master copy.
    fp32, _ = static(1, replace(SMALL_SETTINGS, dtype="float32"))
    assert fp32 == {"weights": 6944 + 6944, "gradients": 6944, "master_weights": 3472, "optimizer": 6998,
                    "gathered_weights": 0, "gradient_buckets": 0, "total": 31302}


def test_plain_dp_keeps_a_bucket_copy_of_the_gradients_and_trl_frees_its_gradients():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    # DDP (gradient_as_bucket_view off, in the engine's wrapper and accelerate's) allocates buckets as large as
    # every gradient once, on top of the gradients; TRL's gradients are not resident between steps (freed).
    ppo = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(0, 2)).static
    assert (ppo["gradients"], ppo["gradient_buckets"]) == (6944 + 5956, 6944 + 5956)
    trl = layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(0, 2))
    assert (trl.static["gradients"], trl.static["gradient_buckets"]) == (0, 6944)
    assert trl.phases["update"]["gradients"] == 6944
    assert layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(0, 1)).static["gradient_buckets"] == 0  # no DDP
    # Several GPUs: NCCL's buffers beside the CUDA context, outside the allocator.
    assert set(trl.outside_allocator) == {"cuda_context", "nccl_buffers"}
    assert trl.device_peak_bytes == trl.peak_bytes + 2 * 512 * 2**20


def test_the_engine_under_zero2_and_zero3_every_term_by_hand():
    """The suite's engine (PPO) as ``deepspeed.initialize`` runs it (baselines.rollout_engine): float32 actor and
    critic with float32 gradients, DeepSpeed's float32 master partition and AdamW's moments sharded, the reference
    and the reward model whole on every GPU, the suite's autocast casts as on one GPU, and under ZeRO-3 generation
    in a gather of the whole float32 actor."""
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    # Actor 1736 parameters in 27 tensors: fp32 weights 6944, fp32 gradients 6944, master 6944, AdamW 13996;
    # critic 1489 in 28 tensors: 5956, 5956, 5956, 12024; frozen bf16 reward 1488 x 2 = 2976 and reference
    # 1736 x 2 = 3472, whole at every stage. Two GPUs.
    frozen = 2976 + 3472
    zero2 = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(2, 2))
    assert zero2.static == {"weights": 6944 + 5956 + frozen, "gradients": 3472 + 2978,
                            "master_weights": 3472 + 2978, "optimizer": 6998 + 6012, "gathered_weights": 0,
                            "gradient_buckets": 0, "total": 19348 + 6450 + 6450 + 13010} and zero2.host_bytes == 0
    assert zero2.static["total"] == 45258
    zero3 = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 2))
    # + the trained weights halved (not the frozen ones) and two gathered float32 modules (2 x 608 x 4).
    assert zero3.static == {"weights": 3472 + 2978 + frozen, "gradients": 6450, "master_weights": 6450,
                            "optimizer": 13010, "gathered_weights": 4864, "gradient_buckets": 0, "total": 43672}
    assert zero3.host_bytes == 0

    # Phases: 4 sequences over 2 GPUs, 2 each, micro-batches of 2 (16 tokens); the terms of the phase test.
    gen = zero3.phases["generation"]
    assert gen == {"kv_cache": 2 * 8 * 64, "sampling_logits": 5 * 4 * 32 * 2,
                   "weight_casts": 512,  # the engine's one transient bf16 cast (the LM head), as on one GPU
                   "gathered_actor": 1736 * 4,  # GatheredParameters: the whole fp32 actor beside its shard
                   "total": 1024 + 1280 + 512 + 6944}
    assert zero3.phases["reward"]["total"] == 16 * 256 + 16 * 8 * 4 == 4608
    assert zero3.phases["reference"]["total"] == 4096 + 768 + 1280
    assert zero3.phases["critic"] == {"critic_weight_casts": 2304, "forward_working": 4096,
                                      "last_hidden_state": 512, "total": 6912}
    # autocast caches bf16 casts of the fp32 modules, as on one GPU: the update is the one-GPU update.
    assert zero3.phases["update"] == predict(SMALL, "ppo", SMALL_SETTINGS).phases["update"]
    assert zero3.phases["optimizer_step"] == {"total": 0}  # fused AdamW on CUDA
    cpu = layout_memory(SMALL, "ppo", replace(SMALL_SETTINGS, device="cpu"), Layout(3, 2))
    # DeepSpeed hands the CPU's for-loop AdamW one flat partition (1736 / 2 elements): 3 copies of it.
    assert cpu.phases["optimizer_step"] == {"adamw_step_temporaries": 3 * 4 * 868, "total": 10416}
    assert "gradients" not in gen  # the engine keeps its gradient partitions
    assert (zero3.peak_phase, zero3.peak_bytes) == ("update", 43672 + 35008)
    # ZeRO-2: the same phases without the gather (the weights are whole already).
    assert "gathered_actor" not in zero2.phases["generation"]
    assert zero2.phases["generation"]["total"] == 1024 + 1280 + 512
    assert {k: v for k, v in zero2.phases.items() if k != "generation"} == {
        k: v for k, v in zero3.phases.items() if k != "generation"}
    assert (zero2.peak_phase, zero2.peak_bytes) == ("update", 45258 + 35008)

    # ZeRO-3 with everything offloaded: the trained networks' weights and optimizer state go to the host, the
    # frozen networks stay whole on the GPU, and generation still gathers the whole actor.
    offloaded = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 2, True, True))
    assert offloaded.static == {"weights": frozen, "gradients": 0, "master_weights": 0, "optimizer": 0,
                                "gathered_weights": 4864, "gradient_buckets": 0, "total": 6448 + 4864}
    assert offloaded.host_bytes == 6944 + 5956 + (6944 + 13996 + 6944) + (5956 + 12024 + 5956) == 64720
    assert offloaded.phases["generation"]["gathered_actor"] == 6944
    # With LoRA the gather covers the bf16 base and the fp32 adapters (2248 parameters, gathered as float32).
    lora = layout_memory(SMALL, "grpo_engine", replace(SMALL_SETTINGS, lora_rank=2), Layout(3, 2))
    assert lora.phases["generation"]["gathered_actor"] == 2248 * 4


def test_the_engine_what_if_shards_the_frozen_networks_and_gathers_in_bf16():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    engine = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 2))
    what_if = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout.named("zero3_what_if", 2))
    assert what_if.layout.name == "zero3_what_if" and what_if.layout.what_if_engine
    # The frozen reward model (2976) and reference (3472) halved like the trained networks.
    assert engine.static["weights"] - what_if.static["weights"] == (2976 + 3472) // 2
    # Generation from a bf16 gather: 2 bytes a parameter, nothing to cast; in the one numerics K stays float32.
    gen = what_if.phases["generation"]
    assert (gen["gathered_actor"], gen["kv_cache"], gen.get("weight_casts", 0)) == (1736 * 2, 2 * 8 * 64, 0)
    with pytest.raises(ValueError, match="ZeRO stage 3"):
        Layout(2, 2, what_if_engine=True)
    # bench estimate shows it for the engine's methods, labelled, with its GPU count (fewer at 7B).
    p = predict(architecture_fields("qwen2.5-7b"), "ppo", Settings(evaluation=False))
    w = p.what_if["zero3_what_if"]
    assert "what-if" in w["label"] and w["gpus"] < p.gpus["zero3"]
    # With the evaluation on the engine's ZeRO-3 never fits 7B PPO on 80 GiB (rank 0's whole fp32 actor and critic
    # beside the whole frozen networks); the what-if evaluates from its bf16 gather and still fits.
    evaluated = predict(architecture_fields("qwen2.5-7b"), "ppo", Settings())
    assert evaluated.gpus["zero3"] is None and evaluated.what_if["zero3_what_if"]["gpus"] == w["gpus"]
    assert predict(SMALL, "grpo", SMALL_SETTINGS).what_if == {}  # TRL shards its frozen networks already


def test_zero_phases_of_trl_hold_no_autocast_casts_split_the_rollout_and_step_one_partition():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    m = layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(2, 2))
    # bf16 modules: nothing to cast, a bf16 residual. 4 sequences over 2 GPUs: 2 each, 8 tokens x 2 layers x 4 x
    # (2 + 2) = 32 B of KV cache per token.
    assert m.phases["generation"]["kv_cache"] == 2 * 8 * 32 and "weight_casts" not in m.phases["generation"]
    assert all(not terms.get("actor_weight_casts") for terms in m.moments["update"].values())
    # On the CPU, the for-loop AdamW steps this GPU's flat fp32 partition (1736 / 2): 3 copies; fused on CUDA: nothing.
    cpu = replace(SMALL_SETTINGS, device="cpu")
    assert layout_memory(SMALL, "grpo", cpu, Layout(2, 2)).phases["optimizer_step"]["adamw_step_temporaries"] == 10416
    assert m.phases["optimizer_step"]["total"] == 0
    assert layout_memory(SMALL, "grpo", cpu, Layout(3, 2, True, True)).phases["optimizer_step"]["total"] == 0
    # TRL's GRPO under ZeRO-3 gathers the whole bf16 policy to generate: 3472 less the 1736 it holds; DeepSpeed
    # keeps its gradient partitions, so none are counted in the update.
    trl = layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(3, 2))
    assert trl.phases["generation"]["gathered_policy"] == 1736 and "gradients" not in trl.phases["update"]
    assert "gathered_actor" not in trl.phases["generation"]
    no_gather = replace(SMALL_SETTINGS, ds3_gather_for_generation=False)
    assert "gathered_policy" not in layout_memory(SMALL, "grpo", no_gather, Layout(3, 2)).phases["generation"]
    engine = layout_memory(SMALL, "grpo_engine", SMALL_SETTINGS, Layout(3, 2)).phases["generation"]
    assert "gathered_policy" not in engine and engine["gathered_actor"] == 6944  # the engine's own gather


def test_plain_dp_on_one_gpu_is_the_one_gpu_prediction_and_zero_costs_its_bytes_there():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    p = predict(SMALL, "ppo", SMALL_SETTINGS)
    one = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout())
    assert (one.static["total"], one.peak_bytes, one.peak_phase) == (p.resident_bytes, p.peak_bytes, p.peak_phase)
    # TRL: 16 bytes a trained parameter either way (fp32 weights + grads + moments, or bf16 weights + grads + fp32
    # master + moments); the frozen networks as stored. DeepSpeed keeps its gradients: its static total is the
    # one-GPU static accounting, not the resident bytes.
    trl = predict(SMALL, "grpo", SMALL_SETTINGS)
    for stage in (1, 2):
        assert layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(stage, 1)).static["total"] == trl.static_bytes
    assert layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(3, 1)).static["total"] == trl.static_bytes + 2432
    # The engine: its fp32 modules plus DeepSpeed's fp32 master clone, 4 bytes a trained parameter more (actor
    # 1736 + critic 1489), and under ZeRO-3 two gathered fp32 modules.
    for stage in (1, 2):
        assert layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(stage, 1)).static["total"] == p.static_bytes + 12900
    assert layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 1)).static["total"] == p.static_bytes + 12900 + 4864


def test_lora_trains_adapters_on_a_bf16_base_and_the_reference_costs_nothing():
    # Rank 2 on every decoder linear: r x (in + out) = 2 x (16 + 12 + 12 + 16 + 24 + 24 + 24) = 256 a layer,
    # 512 elements in 2 x 7 x 2 = 28 tensors.
    lora = replace(SMALL_SETTINGS, lora_rank=2)
    p = predict(SMALL, "ppo", lora)
    actor, critic, ref = p.networks["actor"], p.networks["critic"], p.networks["reference"]
    assert (actor.parameters, actor.trainable_parameters, actor.storage) == (1736 + 512, 512, "bfloat16")
    # The frozen base in bf16 (model.dtype bfloat16), the adapters in float32 (peft upcasts them).
    assert (actor.weights_bytes, actor.gradients_bytes, actor.optimizer_bytes) == (1736 * 2 + 512 * 4, 512 * 4,
                                                                                    4096 + 4 * 28)
    assert actor.residual_bytes == 4  # the one numerics: a float32 residual stream; the bf16 base needs no cast
    assert (ref.parameters, ref.weights_bytes) == (0, 0)  # the actor's base with adapters off
    # The critic: its own frozen bf16 backbone (1480) + fp32 adapters + a trained fp32 value head (8 + 1) in 30
    # tensors.
    assert (critic.weights_bytes, critic.gradients_bytes, critic.optimizer_bytes) == (
        1480 * 2 + 521 * 4, 521 * 4, 4168 + 120)
    assert p.networks["reward"].weights_bytes == 1488 * 2  # frozen as always
    full_critic = predict(SMALL, "ppo", replace(lora, lora_critic=False)).networks["critic"]
    assert (full_critic.weights_bytes, full_critic.optimizer_bytes) == (5956, 12024)
    # float32: the base stays float32.
    assert predict(SMALL, "grpo", replace(lora, dtype="float32")).networks["actor"].weights_bytes == 2248 * 4
    # Autocast caches the adapters' casts only (2 x 512 B each); the bf16 base needs no cast, so nothing else is
    # cast or saved: no transient cast in generation either, and TRL generates with the adapters' cached casts.
    assert (actor.working_copy_bytes, critic.working_copy_bytes) == (1024, 1024)
    assert "weight_casts" not in p.phases["generation"]
    assert predict(SMALL, "grpo", lora).phases["generation"]["weight_casts"] == 1024
    # The K cache stays float32 (the float32 residual stream): 4 sequences x 8 tokens x 64 B (V promoted to K's dtype by the cache).
    assert p.phases["generation"]["kv_cache"] == 4 * 8 * 64


def test_lora_under_zero_shards_the_adapters_state_and_keeps_no_reference():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    lora = replace(SMALL_SETTINGS, lora_rank=2)
    m = layout_memory(SMALL, "grpo", lora, Layout(2, 2))
    # bf16 modules: the actor's 2248 parameters x 2 B; the reference adds nothing; 512 trained parameters: bf16
    # gradients / 2, fp32 master / 2, AdamW (4096 + 112) / 2.
    assert m.static == {"weights": 4496, "gradients": 512, "master_weights": 1024, "optimizer": 2104,
                        "gathered_weights": 0, "gradient_buckets": 0, "total": 8136}


def test_more_gpus_never_need_more_memory_per_gpu():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import LAYOUTS, Layout
    from bench.systems.memory_terms import METHOD_ROLES

    fields = architecture_fields("qwen2.5-7b")
    for settings in (Settings(), Settings(lora_rank=32, gradient_checkpointing=False)):
        for method in METHOD_ROLES:
            for name in LAYOUTS:
                # plain DP from 2 GPUs: one GPU has no DDP buckets
                counts = [*range(2 if name == "dp" else 1, 40), 64, 100, 128, 256, 1024]
                peaks = [layout_memory(fields, method, settings, Layout.named(name, n)).peak_bytes for n in counts]
                assert all(b <= a for a, b in zip(peaks, peaks[1:])), (method, name, settings.lora_rank)


def test_each_gpu_count_is_the_fewest_that_fits():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import LAYOUTS, Layout

    fields = architecture_fields("qwen2.5-7b")
    s = Settings(evaluation=False)  # rank 0's whole copies for the evaluation: see the GPU-count test above
    for method in ("ppo", "grpo_engine", "grpo"):
        p = predict(fields, method, s)
        assert set(p.gpus) == set(LAYOUTS) and p.gpus["dp"] is None
        assert (p.gpus_data_parallel, p.gpus_zero3) == (p.gpus["dp"], p.gpus["zero3"])
        for name in ("zero2", "zero3", "zero3_offload"):
            n = p.gpus[name]
            if n is None:
                continue
            assert layout_memory(fields, method, s, Layout.named(name, n)).fits, (method, name)
            assert n == 1 or not layout_memory(fields, method, s, Layout.named(name, n - 1)).fits, (method, name)
            assert p.gpus_memory[name].layout.gpus == n
        assert p.gpus["zero3"] >= p.gpus["zero3_offload"]
        assert p.gpus_memory["zero3_offload"].host_bytes > p.static_bytes / 2  # the offloaded state is on the host
    # The engine's PPO keeps whole fp32 actor and critic below ZeRO-3 (plus the whole bf16 reference and reward
    # model): more than 80 GiB at any count; TRL's GRPO fits ZeRO-2 on fewer GPUs than the engine's GRPO, which
    # keeps 4-byte weights whole on every GPU.
    ppo, engine, trl = (predict(fields, m, s).gpus for m in ("ppo", "grpo_engine", "grpo"))
    assert ppo["zero1"] is None and ppo["zero2"] is None and ppo["zero3"] is not None
    assert trl["zero2"] < engine["zero2"] and engine["zero2"] > engine["zero3"]


def test_an_impossible_layout_is_refused():
    from bench.systems.memory_layouts import Layout

    for kwargs, words in [({"stage": 4}, "stage must be 0, 1, 2 or 3"), ({"gpus": 0}, "must be >= 1"),
                          ({"offload_optimizer": True}, "needs ZeRO stage 1, 2 or 3"),
                          ({"stage": 2, "offload_params": True}, "needs ZeRO stage 3")]:
        with pytest.raises(ValueError, match=words):
            Layout(**kwargs)
    with pytest.raises(ValueError, match="unknown layout"):
        Layout.named("zero4")


# ------------------------------------------------------------------------------------------------ stages, totals

def test_the_reward_model_and_sample_pool_stages_by_hand():
    from bench.systems.memory_stages import stage_memory

    s = replace(SMALL_SETTINGS, reward_model_pairs=4, reward_model_eval_pairs=2, pool_batch_size=2, pool_samples=3)
    rm = stage_memory(SMALL, "reward_model", s)
    # A trained float32 sequence classifier: backbone 1480 + score row 8 = 1488 parameters in 27 tensors: weights
    # and gradients 5952 each, AdamW 2 x 5952 + 4 x 27 = 12012; RewardTrainer frees the gradients between steps.
    net = rm.networks["reward"]
    assert (net.weights_bytes, net.gradients_bytes, net.optimizer_bytes) == (5952, 5952, 12012)
    assert (rm.static_bytes, rm.resident_bytes) == (23916, 23916 - 5952)
    # A micro-batch of train.micro_batch_size = 2 pairs: 4 sequences x 8 tokens = 32 tokens in one forward. Its
    # casts: 2 x (2 layers x 576) + the score row's 2 x 8; saved: 32 x 2 x 408 + the final norm 32 x 64 + the score
    # row's bf16 cast of every position (32 x 8 x 2).
    forward = rm.moments["update"]["forward"]
    assert forward == {"gradients": 5952, "weight_casts": 2304 + 16,
                       "activations": 32 * 2 * 408 + 32 * 64 + 32 * 16, "layer_working": 0}
    # The held-out accuracy: 2 pairs (4 sequences x 8 tokens) per forward in the actor's numerics (bf16 autocast,
    # its cache off): one layer's working set (32 x 256), the float32 last hidden state (32 x 8 x 4) and one
    # transient cast of the largest linear (2 x 128).
    assert rm.moments["evaluation"]["held-out accuracy"] == {"forward_working": 32 * 256,
                                                             "last_hidden_state": 4 * 8 * 32, "weight_casts": 256}
    # Micro-batches are the largest divisor of reward_model.batch_size not above train.micro_batch_size.
    from bench.systems.memory_stages import reward_model_pairs_per_micro_batch
    assert [reward_model_pairs_per_micro_batch(replace(s, reward_model_pairs=32, micro_batch_size=m))
            for m in (0, 5, 8, 64)] == [32, 4, 8, 32]
    assert rm.phases["optimizer_step"] == {"gradients": 5952, "total": 5952}
    pool = stage_memory(SMALL, "sample_pool", s)
    # The frozen bf16 policy (1736 x 2) generating 2 prompts x 3 completions in the actor's numerics: float32 K and
    # V promoted to K's dtype (64 B a token) over 6 x 8 tokens at the last decoding step, beside 5 float32 copies of
    # 6 x 32 logits; its bf16 weights need no cast.
    assert pool.resident_bytes == 3472
    assert pool.moments["generation"]["last decoding step"] == {"kv_cache": 6 * 8 * 64,
                                                                 "sampling_logits": 5 * 4 * 32 * 6, "weight_casts": 0}
    assert set(predict(SMALL, "ppo", SMALL_SETTINGS).stages) == {"sample_pool", "reward_model"}
    assert set(predict(SMALL, "dpo", SMALL_SETTINGS).stages) == {"sample_pool"}
    assert predict(SMALL, "ppo_verifier", SMALL_SETTINGS).stages == {}


def test_evaluation_is_a_phase_with_every_network_resident():
    p = predict(SMALL, "grpo", replace(SMALL_SETTINGS, evaluation=True, eval_batch_size=3, eval_completion_tokens=7))
    last = p.moments["evaluation"]["last decoding step"]
    # 3 prompts x (3 + 7) tokens of fp32 K and V (V promoted by the cache; 64 B a token), 5 float32 copies of 3 x 32 logits, the one
    # transient cast of the LM head.
    assert last == {"kv_cache": 3 * 10 * 64, "sampling_logits": 5 * 4 * 32 * 3, "weight_casts": 512}
    assert "evaluation" not in predict(SMALL, "grpo", SMALL_SETTINGS).phases  # eval.enabled false


def _numbers(data, path=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _numbers(value, f"{path}/{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _numbers(value, f"{path}/{i}")
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield path, data


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b", "llama-3.1-8b", "llama-3.1-70b"])
def test_no_phase_term_or_total_is_ever_negative(model):
    """bench estimate --json printed negative phase totals for TRL's methods (7B GRPO generation -2.5 GiB,
    reference -25.2 GiB) when TRL's freed gradients were a negative term: now they are not resident at all."""
    from bench.systems.memory_terms import METHOD_ROLES

    fields = architecture_fields(model)
    for settings in (Settings(), Settings(lora_rank=16), Settings(dtype="float32", gradient_checkpointing=False),
                     Settings(micro_batch_size=1, kl_beta=0)):
        for method in METHOD_ROLES:
            data = predict(fields, method, settings).to_json()
            negative = [(path, value) for path, value in _numbers(data) if value < 0]
            assert negative == [], (model, method, negative[:3])


def test_the_7b_ppo_update_is_the_critic_forward_of_the_hand_calculation():
    """Qwen2.5-7B PPO at the GPU preset's shapes (micro-batch 8 x 768 tokens, checkpointing, bf16 autocast): with
    each forward's cache freed before the next, the update peaks at the end of the critic's forward with the
    actor's retained tensors (the hand calculation, in GiB): LM head cast 1.02 + actor checkpoint inputs and final
    norm 2.49 + logits 1.16 + critic casts 12.15 + critic inputs, final norm and value-head view 2.54 + one layer's
    working set 0.96 = 20.32 (adding every forward's casts instead would give 36.3)."""
    p = predict(architecture_fields("qwen2.5-7b"), "ppo", Settings())
    assert (p.peak_phase, p.peak_moment) == ("update", "critic forward")
    assert 19 * GIB < p.phases["update"]["total"] < 21 * GIB
    grpo = predict(architecture_fields("qwen2.5-7b"), "grpo", Settings()).phases["update"]
    # TRL's GRPO (fused head, no logits; gradients allocated in the update): about 16.6 GiB by hand besides them.
    assert 14.5 * GIB < grpo["total"] - grpo["gradients"] < 17 * GIB
