"""The memory model (bench.systems.memory_model): every term against hand arithmetic on a small shape; weights, gradients
and optimizer state exactly against the static accounting of real modules (scaled Qwen and Llama, fp32 and
bf16-with-fp32-master, LoRA); the search answers (largest micro-batch, GPU counts); no torch import."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from bench.config.architectures import architecture_config, architecture_fields, build_random_model, parameter_count
from bench.systems.memory_model import gpus_data_parallel, predict, predict_for_spec
from bench.systems.memory_terms import GIB, Settings, Shape
from bench.config.spec import ScaleSpec

# A Qwen2-type shape small enough to count by hand: 2 layers, hidden 8, MLP 16, 2 query heads and 1 KV head of
# width 4 (q width 8, kv width 4), 32 vocabulary entries, untied LM head, q/k/v biases.
SMALL = Shape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=32, tied_embeddings=False,
              head_dim=4, qkv_bias=True)
SMALL_SETTINGS = Settings(dtype="bfloat16", micro_batch_size=2, prompt_tokens=3, completion_tokens=5, group_size=2,
                          prompts_per_step=2, gradient_checkpointing=False, kl_beta=0.04)


def test_every_term_of_a_small_ppo_step_matches_hand_arithmetic():
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
    # bf16 autocast copies: actor linears 2x576 + LM head 256 = 1408 x 2 B; critic 1152 x 2 B.
    assert (actor.working_copy_bytes, critic.working_copy_bytes) == (2816, 2304)

    gen = p.phases["generation"]
    # 2 prompts x G 2 = 4 sequences of 3 + 5 tokens: 2 layers x kv width 4 x (fp32 K 4 B + bf16 V 2 B) = 48 B.
    assert gen["kv_cache"] == 4 * 8 * 48 == 1536 == p.kv_cache_bytes
    assert gen["sampling_logits"] == 3 * 4 * 32 * 4  # logits, processed scores, probabilities: fp32, per sequence
    # One layer's no-grad working set per token: 3 x 2 x 16 (MLP) + 2 x (8 + 2 x 4) (q, k, v) + 2 x 4 x 8 = 192 B;
    # the prefill covers 4 x 3 prompt tokens.
    assert gen["prefill_working"] == 12 * 192
    # The engine samples with autocast's weight cache off: one transient bf16 cast, the largest linear (the LM
    # head 32 x 8 = 256 elements x 2 B); TRL's GRPO caches within each decoding forward: the whole copy.
    assert gen["actor_working_copy"] == 512
    assert predict(SMALL, "grpo", SMALL_SETTINGS).phases["generation"]["actor_working_copy"] == 2816
    assert gen["total"] == 1536 + 1536 + 2304 + 512

    # Scoring forwards see one micro-batch: 2 sequences x 8 tokens = 16 tokens.
    assert p.phases["reward"]["total"] == 16 * 192 + 16 * 8 * 2  # + the last hidden state in bf16
    # Engine logits over T + 1 = 6 positions: 32 x (12 tokens x 2 B) + one sequence's fp32 copy and probabilities.
    assert p.phases["reference"] == {"forward_working": 3072, "logits": 32 * (12 * 2 + 2 * 4 * 6), "total": 5376}
    assert p.phases["critic"]["total"] == 3072 + 2304

    # Saved activations per token per layer (bf16 autocast, fp32 residual): norms 4x4x8 = 128, per-linear bf16
    # input casts 5x2x8 = 80, attention 4x2x8 + 4x2 heads = 72, MLP 4x2x16 = 128 -> 408 B. Final norm: fp32 input
    # and output for 16 tokens (16 x 2 x 4 x 8 = 1024) + the head's bf16 input at 2 x 6 scored positions (192).
    per_net = 16 * 2 * 408 + 1024 + 192
    assert p.activations_bytes["no_checkpointing"] == 2 * per_net == 28544  # actor and critic
    # Checkpointing keeps each layer's fp32 input (2 layers x 4 x 8) and rebuilds one layer: 16 x (64 + 408).
    assert p.activations_bytes["checkpointing"] == 2 * (16 * (64 + 408) + 1216)
    update = p.phases["update"]
    assert update["activations"] == 2 * per_net
    assert update["logits"] == 32 * (12 * 2 * 2 + 2 * 4 * 6) == p.logits_bytes  # output + its gradient
    assert update["working_copies"] == 2816 + 2304
    # The foreach AdamW step of the larger optimizer: one fp32 buffer the size of the actor's parameters.
    assert p.phases["optimizer_step"] == {"adamw_foreach_buffer": 1736 * 4, "total": 6944}
    assert (p.peak_phase, p.peak_bytes) == ("update", 58268 + 28544 + 3072 + 5120)


def test_methods_keep_their_networks_and_the_reference_goes_with_kl_zero():
    assert set(predict(SMALL, "ppo", SMALL_SETTINGS).networks) == {"actor", "critic", "reward", "reference"}
    assert set(predict(SMALL, "ppo_verifier", SMALL_SETTINGS).networks) == {"actor", "critic", "reference"}
    assert set(predict(SMALL, "grpo", SMALL_SETTINGS).networks) == {"actor", "reference"}
    assert set(predict(SMALL, "grpo", replace(SMALL_SETTINGS, kl_beta=0)).networks) == {"actor"}
    dpo = predict(SMALL, "dpo", replace(SMALL_SETTINGS, kl_beta=0))
    assert set(dpo.networks) == {"actor", "reference"} and "generation" not in dpo.phases
    with pytest.raises(ValueError, match="unknown method 'rloo'"):
        predict(SMALL, "rloo", SMALL_SETTINGS)


def test_trl_frees_gradients_outside_the_update_and_the_engine_keeps_them():
    trl, engine = predict(SMALL, "grpo", SMALL_SETTINGS), predict(SMALL, "grpo_engine", SMALL_SETTINGS)
    assert trl.phases["generation"]["gradients_freed"] == -1736 * 4  # the actor's fp32 gradients
    assert "gradients_freed" not in trl.phases["update"]
    assert all("gradients_freed" not in terms for terms in engine.phases.values())


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
    assert on.phases["update"]["activations"] < off.phases["update"]["activations"] / 5
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
    p = predict(fields, "ppo", Settings(gpu_memory_bytes=80 * GIB))
    assert not p.fits and p.max_micro_batch == 0
    assert p.gpus_data_parallel is None  # 4 networks of 70B: ~2.3 TiB of static state on every GPU
    # The suite's engine keeps the reference and reward model whole on every GPU and gathers the whole fp32 actor
    # (~263 GiB) to generate under ZeRO-3: no GPU count of 80 GiB fits it.
    assert p.gpus_zero3 is None and p.gpus["zero3_offload"] is None
    dpo = predict(fields, "dpo", Settings(gpu_memory_bytes=80 * GIB))  # TRL: ZeRO-3 shards every network
    assert dpo.gpus_zero3 is not None and dpo.gpus_zero3 * 80 * GIB > dpo.static_bytes
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


# ------------------------------------------------------------------------------------------------ exact vs accounting

SCALED = {
    "qwen": ("qwen2.5-0.5b", ScaleSpec(num_layers=2, width_divisor=8, vocab_size=2048)),   # tied, biases
    "llama": ("llama-3.1-8b", ScaleSpec(num_layers=2, width_divisor=64, vocab_size=2048)),  # untied, no biases
}


def _measured_ppo_accounting(name: str, scale: ScaleSpec, dtype: str, lora_rank: int = 0) -> dict:
    """account_networks of the four PPO networks built as the suite builds them, after one AdamW step."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    from baselines.engine_networks import ValueModel
    from bench.model.precision import storage_dtype
    from bench.telemetry.accounting import account_networks

    config = architecture_config(name, scale)
    actor = build_random_model(config, storage_dtype(dtype, True), seed=0)
    networks = {"actor": actor}
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        actor = get_peft_model(actor, LoraConfig(r=lora_rank, target_modules="all-linear", task_type="CAUSAL_LM"))
        networks = {"actor": actor, "reference": actor.get_base_model()}  # adapters off: the same weights
    else:
        reference = build_random_model(config, storage_dtype(dtype, False), seed=0).requires_grad_(False)
        backbone = AutoModel.from_config(config, dtype=torch.float32)
        critic = ValueModel(backbone, config.hidden_size)
        reward_config = architecture_config(name, scale)
        reward_config.num_labels = 1
        reward = AutoModelForSequenceClassification.from_config(reward_config, dtype=getattr(torch, dtype))
        networks.update(critic=critic, reward=reward.requires_grad_(False), reference=reference)
    optimizers = {role: torch.optim.AdamW([p for p in networks[role].parameters() if p.requires_grad], lr=1e-3)
                  for role in ("actor", "critic") if role in networks}
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = actor(input_ids=ids).logits.float().mean()
    if "critic" in networks:
        loss = loss + networks["critic"].values(networks["critic"].hidden(ids, torch.ones_like(ids), ids - 1)).mean()
    loss.backward()
    for opt in optimizers.values():
        opt.step()
    return account_networks(networks, optimizers)


@pytest.mark.parametrize("family", sorted(SCALED))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_static_terms_equal_the_accounting_of_real_modules(family, dtype):
    name, scale = SCALED[family]
    from bench.config.architectures import scaled_fields

    measured = _measured_ppo_accounting(name, scale, dtype)
    predicted = predict(scaled_fields(name, scale), "ppo", Settings(dtype=dtype)).networks
    for role, m in measured.items():
        assert m["grad_materialized"] and m["optimizer_state_materialized"]
        p = predicted[role]
        assert (p.weights_bytes, p.gradients_bytes, p.optimizer_bytes) == (
            m["weight_bytes"], m["grad_bytes"], m["optimizer_bytes"]), role
        assert (p.parameters, p.trainable_parameters) == (m["params"], m["trainable_params"]), role


def test_lora_terms_equal_the_accounting_of_a_peft_model():
    pytest.importorskip("peft")
    from bench.config.architectures import scaled_fields

    name, scale = SCALED["qwen"]
    measured = _measured_ppo_accounting(name, scale, "bfloat16", lora_rank=4)
    predicted = predict(scaled_fields(name, scale), "grpo", Settings(dtype="bfloat16", lora_rank=4)).networks
    for role in ("actor", "reference"):
        m, p = measured[role], predicted[role]
        assert (p.weights_bytes, p.gradients_bytes, p.optimizer_bytes) == (
            m["weight_bytes"], m["grad_bytes"], m["optimizer_bytes"]), role


def test_lora_frozen_weight_casts_equal_the_casts_a_peft_forward_saves_on_cpu():
    """Without checkpointing a training forward saves the bf16 cast of every frozen linear whose input needs a
    gradient (all but the first layer's q, k, v) and of the LM head; with it only the LM head's (the rebuilt
    layer's casts are saved in the backward pass, which the prediction adds)."""
    pytest.importorskip("peft")
    import torch
    from peft import LoraConfig, get_peft_model

    from bench.config.architectures import scaled_fields
    from bench.systems.memory_phases import frozen_weight_casts
    from bench.systems.memory_terms import network_memory

    name, scale = SCALED["qwen"]
    shape = Shape.from_fields(scaled_fields(name, scale))
    for checkpointing in (False, True):
        model = build_random_model(architecture_config(name, scale), "float32", seed=0)
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0,
                                                 task_type="CAUSAL_LM"))
        model.train()
        if checkpointing:  # as baselines.common.add_lora and TRL do
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
        frozen = {tuple(p.shape) for p in model.parameters() if not p.requires_grad and p.dim() == 2}
        frozen |= {s[::-1] for s in frozen}  # a linear saves its weight's transpose
        saved: dict[int, int] = {}

        def pack(t):
            if t.dtype == torch.bfloat16 and tuple(t.shape) in frozen:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(5, 2000, (3, 37), generator=torch.Generator().manual_seed(0))  # 111 tokens: no clash
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids, use_cache=False)
        s = Settings(lora_rank=4, gradient_checkpointing=checkpointing)
        predicted = frozen_weight_casts(shape, s, {"actor": network_memory(shape, "actor", s)})
        rebuilt = 2 * sum(n_in * n_out for n_in, n_out in shape.layer_linears()) if checkpointing else 0
        assert sum(saved.values()) == predicted - rebuilt, checkpointing


# ------------------------------------------------------------------------------------------------ activations on CPU

def _saved_activation_bytes(name: str, scale: ScaleSpec, dtype: str, checkpointing: bool, b: int = 4,
                            length: int = 64) -> int:
    """Bytes of the distinct storages a training forward saves for backward, less the weights and their bf16
    autocast copies (counted as working copies): what `activation_bytes` predicts, read through
    torch.autograd.graph.saved_tensors_hooks on a scaled model (left padding, so the attention has a mask)."""
    import torch

    model = build_random_model(architecture_config(name, scale), "float32", seed=0)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    mask = torch.ones(b, length, dtype=torch.long)
    mask[0, :10] = 0
    ids = torch.randint(5, 2000, (b, length), generator=torch.Generator().manual_seed(0))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        is_copy = t.dtype == torch.bfloat16 and tuple(t.shape) in shapes
        if storage.data_ptr() not in weights and not is_copy:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False,
              logits_to_keep=1)
    return sum(saved.values())


@pytest.mark.parametrize("family", sorted(SCALED))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_activation_formula_is_within_5_percent_of_the_tensors_saved_on_cpu(family, dtype):
    """CPU runs torch's CPU SDPA kernel, not CUDA's; the check is on the per-layer bookkeeping (measured on
    2026-11-30: +2% to +3% over what was saved, both families, fp32 and bf16 autocast)."""
    from bench.config.architectures import scaled_fields
    from bench.systems.memory_terms import activation_bytes

    name, scale = SCALED[family]
    shape = Shape.from_fields(scaled_fields(name, scale))
    measured = _saved_activation_bytes(name, scale, dtype, checkpointing=False)
    predicted = activation_bytes(shape, dtype, 4 * 64, checkpointing=False, head_tokens=4)  # logits_to_keep=1
    assert abs(predicted - measured) / measured < 0.05, (predicted, measured)


def test_with_checkpointing_the_forward_keeps_only_layer_inputs():
    from bench.config.architectures import scaled_fields
    from bench.systems.memory_terms import activation_bytes, activation_bytes_per_token_layer

    name, scale = SCALED["qwen"]
    shape = Shape.from_fields(scaled_fields(name, scale))
    measured = _saved_activation_bytes(name, scale, "bfloat16", checkpointing=True)
    # The prediction also holds the one layer rebuilt during the backward pass, which a forward never saves.
    forward_part = activation_bytes(shape, "bfloat16", 256, True, head_tokens=4) - 256 * activation_bytes_per_token_layer(
        shape, "bfloat16")
    assert abs(forward_part - measured) / measured < 0.05, (forward_part, measured)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_cache_equals_the_hugging_face_cache_of_a_prefill(dtype):
    import torch

    from bench.config.architectures import scaled_fields
    from bench.systems.memory_terms import kv_cache_bytes

    name, scale = SCALED["llama"]
    model = build_random_model(architecture_config(name, scale), "float32", seed=0)  # the actor: fp32 storage
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        cache = model(input_ids=torch.randint(5, 2000, (3, 20)), use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == kv_cache_bytes(Shape.from_fields(scaled_fields(name, scale)), dtype, 3, 20)


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
                     "gathered_weights": 0, "total": 20886} and host == 0
    zero2, _ = static(2)  # + gradients halved
    assert zero2["gradients"] == 1736 and zero2["total"] == 20886 - 1736
    zero3, _ = static(3)  # + every network's weights halved, the frozen reference included, and two gathered
    # modules: the largest is a decoder layer (608 elements) over the embedding / LM head (32 x 8 = 256), in bf16.
    assert (zero3["weights"], zero3["gathered_weights"]) == (1736 + 1736, 2 * 608 * 2)
    assert zero3["total"] == 3472 + 1736 + 3472 + 6998 + 2432 == 18110
    offloaded, host = static(3, offload_optimizer=True, offload_params=True)
    assert offloaded == {"weights": 0, "gradients": 0, "master_weights": 0, "optimizer": 0,
                         "gathered_weights": 2432, "total": 2432}
    # Host, all ranks: every network's bf16 weights + the actor's master weights, AdamW state and a float32
    # gradient partition (4 + 12 + 4 bytes a trained parameter, plus the step tensors).
    assert host == replicated + 6944 + 13996 + 6944 == 34828
    optimizer_only, host = static(2, offload_optimizer=True)
    assert (optimizer_only["weights"], optimizer_only["gradients"], optimizer_only["optimizer"]) == (replicated, 0, 0)
    assert host == 34828 - replicated
    # float32: the modules are float32, and DeepSpeed still clones its partition into a float32 master copy.
    fp32, _ = static(1, replace(SMALL_SETTINGS, dtype="float32"))
    assert fp32 == {"weights": 6944 + 6944, "gradients": 6944, "master_weights": 3472, "optimizer": 6998,
                    "gathered_weights": 0, "total": 31302}


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
                            "total": 19348 + 6450 + 6450 + 13010} and zero2.host_bytes == 0
    assert zero2.static["total"] == 45258
    zero3 = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 2))
    # + the trained weights halved (not the frozen ones) and two gathered float32 modules (2 x 608 x 4).
    assert zero3.static == {"weights": 3472 + 2978 + frozen, "gradients": 6450, "master_weights": 6450,
                            "optimizer": 13010, "gathered_weights": 4864, "total": 43672}
    assert zero3.host_bytes == 0

    # Phases: 4 sequences over 2 GPUs, 2 each, micro-batches of 2 (16 tokens); the terms of the first test.
    gen = zero3.phases["generation"]
    assert gen == {"kv_cache": 2 * 8 * 48, "sampling_logits": 3 * 4 * 32 * 2, "prefill_working": 6 * 192,
                   "actor_working_copy": 512,  # the engine's one transient bf16 cast (the LM head), as on one GPU
                   "gathered_actor": 1736 * 4,  # GatheredParameters: the whole fp32 actor beside its shard
                   "total": 768 + 768 + 1152 + 512 + 6944}
    assert zero3.phases["reward"]["total"] == 16 * 192 + 16 * 8 * 2 == 3328
    assert zero3.phases["reference"]["total"] == 3072 + 32 * (12 * 2 + 2 * 4 * 6) == 5376
    assert zero3.phases["critic"] == {"forward_working": 3072, "critic_working_copy": 2304, "total": 5376}
    update = {"activations": 2 * (16 * 2 * 408 + 1024 + 192), "logits": 32 * (12 * 2 * 2 + 2 * 4 * 6),
              "working_copies": 2816 + 2304}  # autocast caches bf16 casts of the fp32 modules, as on one GPU
    assert zero3.phases["update"] == {**update, "total": 28544 + 3072 + 5120}
    assert zero3.phases["optimizer_step"] == {"adamw_foreach_buffer": 1736 * 4 // 2, "total": 3472}
    assert "gradients_freed" not in gen  # the engine keeps its gradient partitions
    assert (zero3.peak_phase, zero3.peak_bytes) == ("update", 43672 + 36736)
    # ZeRO-2: the same phases without the gather (the weights are whole already).
    assert "gathered_actor" not in zero2.phases["generation"]
    assert zero2.phases["generation"]["total"] == 768 + 768 + 1152 + 512
    assert {k: v for k, v in zero2.phases.items() if k != "generation"} == {
        k: v for k, v in zero3.phases.items() if k != "generation"}
    assert (zero2.peak_phase, zero2.peak_bytes) == ("update", 45258 + 36736)

    # ZeRO-3 with everything offloaded: the trained networks' weights and optimizer state go to the host, the
    # frozen networks stay whole on the GPU, and generation still gathers the whole actor.
    offloaded = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 2, True, True))
    assert offloaded.static == {"weights": frozen, "gradients": 0, "master_weights": 0, "optimizer": 0,
                                "gathered_weights": 4864, "total": 6448 + 4864}
    assert offloaded.host_bytes == 6944 + 5956 + (6944 + 13996 + 6944) + (5956 + 12024 + 5956) == 64720
    assert offloaded.phases["generation"]["gathered_actor"] == 6944
    # With LoRA the gather covers the frozen fp32 base too (2248 parameters), and the saved casts stay.
    lora = layout_memory(SMALL, "grpo_engine", replace(SMALL_SETTINGS, lora_rank=2), Layout(3, 2))
    assert lora.phases["generation"]["gathered_actor"] == 2248 * 4 and lora.phases["update"]["frozen_weight_casts"]


def test_zero_phases_of_trl_hold_no_autocast_casts_split_the_rollout_and_step_one_partition():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    m = layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(2, 2))
    # bf16 modules: nothing to cast. 4 sequences over 2 GPUs: 2 each, 8 tokens x 48 B of KV cache per token.
    assert m.phases["generation"]["kv_cache"] == 2 * 8 * 48 and m.phases["generation"]["actor_working_copy"] == 0
    assert m.phases["update"]["working_copies"] == 0
    # AdamW's foreach buffer covers this GPU's fp32 partition: 1736 x 4 / 2.
    assert m.phases["optimizer_step"]["adamw_foreach_buffer"] == 3472
    assert layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(3, 2, True, True)).phases["optimizer_step"][
        "total"] == 0
    # TRL's GRPO under ZeRO-3 gathers the whole bf16 policy to generate: 3472 less the 1736 it holds; DeepSpeed
    # keeps its gradient partitions, so nothing is freed.
    trl = layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(3, 2)).phases
    assert trl["generation"]["gathered_policy"] == 1736 and "gradients_freed" not in trl["generation"]
    assert "gathered_actor" not in trl["generation"]
    no_gather = replace(SMALL_SETTINGS, ds3_gather_for_generation=False)
    assert "gathered_policy" not in layout_memory(SMALL, "grpo", no_gather, Layout(3, 2)).phases["generation"]
    engine = layout_memory(SMALL, "grpo_engine", SMALL_SETTINGS, Layout(3, 2)).phases["generation"]
    assert "gathered_policy" not in engine and engine["gathered_actor"] == 6944  # the engine's own gather


def test_plain_dp_on_one_gpu_is_the_one_gpu_prediction_and_zero_costs_its_bytes_there():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    p = predict(SMALL, "ppo", SMALL_SETTINGS)
    one = layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout())
    assert (one.static["total"], one.peak_bytes, one.peak_phase) == (p.static_bytes, p.peak_bytes, p.peak_phase)
    # TRL: 16 bytes a trained parameter either way (fp32 weights + grads + moments, or bf16 weights + grads + fp32
    # master + moments); the frozen networks as stored.
    trl = predict(SMALL, "grpo", SMALL_SETTINGS)
    for stage in (1, 2):
        assert layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(stage, 1)).static["total"] == trl.static_bytes
    assert layout_memory(SMALL, "grpo", SMALL_SETTINGS, Layout(3, 1)).static["total"] == trl.static_bytes + 2432
    # The engine: its fp32 modules plus DeepSpeed's fp32 master clone, 4 bytes a trained parameter more (actor
    # 1736 + critic 1489), and under ZeRO-3 two gathered fp32 modules.
    for stage in (1, 2):
        assert layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(stage, 1)).static["total"] == p.static_bytes + 12900
    assert layout_memory(SMALL, "ppo", SMALL_SETTINGS, Layout(3, 1)).static["total"] == p.static_bytes + 12900 + 4864


def test_lora_trains_adapters_only_and_the_reference_costs_nothing():
    # Rank 2 on every decoder linear: r x (in + out) = 2 x (16 + 12 + 12 + 16 + 24 + 24 + 24) = 256 a layer,
    # 512 elements in 2 x 7 x 2 = 28 tensors.
    lora = replace(SMALL_SETTINGS, lora_rank=2)
    p = predict(SMALL, "ppo", lora)
    actor, critic, ref = p.networks["actor"], p.networks["critic"], p.networks["reference"]
    assert (actor.parameters, actor.trainable_parameters) == (1736 + 512, 512)
    assert (actor.weights_bytes, actor.gradients_bytes, actor.optimizer_bytes) == (2248 * 4, 512 * 4, 4096 + 4 * 28)
    assert (ref.parameters, ref.weights_bytes) == (0, 0)  # the actor's base with adapters off
    # The critic: its own frozen backbone (1480) + adapters + a trained value head (8 + 1) in 30 tensors.
    assert (critic.weights_bytes, critic.gradients_bytes, critic.optimizer_bytes) == (2001 * 4, 521 * 4, 4168 + 120)
    assert p.networks["reward"].weights_bytes == 1488 * 2  # frozen as always
    full_critic = predict(SMALL, "ppo", replace(lora, lora_critic=False)).networks["critic"]
    assert (full_critic.weights_bytes, full_critic.optimizer_bytes) == (5956, 12024)
    # Autocast caches the adapters' casts only (2 x 512 B each); the update saves a bf16 cast of every frozen
    # linear whose input needs a gradient: without checkpointing both layers' (576 elements each) but the first
    # layer's q, k, v (8 x (8 + 4 + 4) = 128: their input, the frozen embedding's, needs none) and the actor's
    # LM head (256), 2 x (1152 - 128 + 256) + 2 x (1152 - 128); with it the rebuilt layer's: 2 x (576 + 256) +
    # 2 x 576.
    assert (actor.working_copy_bytes, critic.working_copy_bytes) == (1024, 1024)
    assert p.phases["update"]["frozen_weight_casts"] == 2560 + 2048
    checkpointed = predict(SMALL, "ppo", replace(lora, gradient_checkpointing=True))
    assert checkpointed.phases["update"]["frozen_weight_casts"] == 1664 + 1152
    # TRL generates with the adapters' cached casts plus one transient cast of the largest frozen weight.
    assert predict(SMALL, "grpo", lora).phases["generation"]["actor_working_copy"] == 1024 + 512
    assert "frozen_weight_casts" not in predict(SMALL, "ppo", replace(lora, dtype="float32")).phases["update"]


def test_lora_under_zero_shards_the_adapters_state_and_keeps_no_reference():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import Layout

    lora = replace(SMALL_SETTINGS, lora_rank=2)
    m = layout_memory(SMALL, "grpo", lora, Layout(2, 2))
    # bf16 modules: the actor's 2248 parameters x 2 B; the reference adds nothing; 512 trained parameters: bf16
    # gradients / 2, fp32 master / 2, AdamW (4096 + 112) / 2.
    assert m.static == {"weights": 4496, "gradients": 512, "master_weights": 1024, "optimizer": 2104,
                        "gathered_weights": 0, "total": 8136}


def test_more_gpus_never_need_more_memory_per_gpu():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import LAYOUTS, Layout
    from bench.systems.memory_terms import METHOD_ROLES

    fields = architecture_fields("qwen2.5-7b")
    for settings in (Settings(), Settings(lora_rank=32, gradient_checkpointing=False)):
        for method in METHOD_ROLES:
            for name in LAYOUTS:
                counts = [*range(1, 40), 64, 100, 128, 256, 1024]
                peaks = [layout_memory(fields, method, settings, Layout.named(name, n)).peak_bytes for n in counts]
                assert all(b <= a for a, b in zip(peaks, peaks[1:])), (method, name, settings.lora_rank)


def test_each_gpu_count_is_the_fewest_that_fits():
    from bench.systems.memory_layouts import layout_memory
    from bench.systems.memory_terms import LAYOUTS, Layout

    fields = architecture_fields("qwen2.5-7b")
    s = Settings()
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
