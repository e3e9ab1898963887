"""The memory model's per-implementation terms: what each phase of a step (generation, reward, reference, critic,
update, optimizer_step, evaluation) adds on top of the bytes resident between steps, as the suite's engine and TRL's
trainers run it, and the peak over the phases. The arithmetic is :mod:`bench.systems.memory_terms`; the model as a
whole is described in :mod:`bench.systems.memory_model`. All sizes are bytes.

A phase can pass through several *moments* whose tensors do not coexist (the actor's forward, the critic's forward,
the backward pass): each moment's terms add up, and the phase is its largest moment (``phase_moments`` keeps
every moment, so the prediction shows which one is the peak and by how much).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.systems.memory_terms import (DTYPE_BYTES, ENGINE_METHODS, Layout, NetworkMemory, Settings, Shape,
                                        activation_bytes, activation_bytes_per_token_layer, final_norm_bytes,
                                        forward_working_bytes, fused_head_bytes, kv_cache_bytes)
from bench.systems.memory_vllm import reservation, with_vllm

MIB = 2 ** 20

CUDA_CONTEXT_BYTES = 512 * MIB
"""The CUDA context of one process (driver state, kernels of torch and its libraries, cuBLAS workspaces): about
0.4-0.6 GiB on a Hopper GPU with CUDA 12's lazy module loading. Outside PyTorch's allocator: nvml-process counts
it, cuda-allocated does not. Approximate."""

NCCL_BYTES = 512 * MIB
"""NCCL's buffers per process of a multi-GPU run (its send/receive buffers, NCCL_BUFFSIZE x channels x peers x
protocols, allocated by NCCL itself outside PyTorch's allocator; NVLink SHARP can add more). Order of magnitude."""

ENTROPY_CHUNKS = 3
"""float32 copies of one sequence's logits alive at once in ``rl_math.entropy_from_logits`` (the logits, their
softmax and the product), measured on CPU in tests/test_memory_model.py (2 when the logits are float32: the copy
is the tensor itself)."""
LOGPROB_CHUNKS = 2
"""The same for ``rl_math.logprobs_from_logits``'s forward (the float32 copy and logsumexp's temporary)."""
LOGPROB_BACKWARD_CHUNKS = 4
"""The same for its backward (the probabilities, their negative and the chunk's gradient, with the previous
chunk's probabilities still held by the loop), on top of the logits' gradient."""

Terms = dict[str, int]
Moments = dict[str, Terms]


def scored_positions(method: str, s: Settings) -> int:
    """Logit positions scored per sequence: the suite's engine keeps T + 1 (``logits_to_keep``; the last predicts
    nothing); TRL's fused head scores the labelled completion tokens only (T; DPO: the pair's completion)."""
    return s.completion_tokens + 1 if method in ENGINE_METHODS else s.completion_tokens


@dataclass(frozen=True)
class TrainedNet:
    """How one trained network computes under the settings: what its forward caches and saves."""

    casts: int
    """Bytes autocast caches during one of its forwards (bf16 casts of its float32 weights that require grad)."""
    layer_casts: int
    """One decoder layer's share of ``casts`` (cast again when checkpointing rebuilds the layer)."""
    per_layer: int
    """Bytes one token saves in one decoder layer (``activation_bytes_per_token_layer``)."""
    residual: int
    norms_trained: bool
    layer_weight_gradient: int
    """Bytes an element of a decoder weight's gradient costs at its largest in the backward pass: its gradient in
    the compute dtype and, under autocast, the float32 copy the cast hands to the accumulator (6 under autocast, 4
    in float32, 2 for bf16 modules); 0 for a LoRA network (its adapters' gradients are small). See
    ``layer_gradient``."""
    embedding_gradient: int
    """The embedding's dense float32 gradient (vocabulary x hidden x 4; 0 when frozen)."""


def trained_net(shape: Shape, s: Settings, net: NetworkMemory, bf16_modules: bool = False,
                lm_head_cast: bool = True) -> TrainedNet:
    """``net``'s compute facts; ``bf16_modules``: DeepSpeed's bf16 module (no autocast casts, a bf16 residual);
    ``lm_head_cast``: the actor's LM head is cast by autocast (the engine) rather than chunk by chunk (TRL's fused
    head, which autocast never caches)."""
    compute = s.compute
    autocast = compute != "float32" and not bf16_modules
    residual = DTYPE_BYTES[s.dtype] if bf16_modules else net.residual_bytes
    per_layer_linears = sum(n_in * n_out for n_in, n_out in shape.layer_linears())
    if net.lora:
        adapters = shape.lora_parameters(s.lora_rank)[0]
        casts = 2 * adapters if autocast else 0
        layer, layer_gradient, embedding = casts // shape.layers, 0, 0
    else:
        head = shape.vocab * shape.hidden if net.role == "actor" and lm_head_cast else 0
        casts = 2 * (per_layer_linears * shape.layers + head) if autocast else 0
        layer = 2 * per_layer_linears if autocast else 0
        layer_gradient = 6 if autocast else (2 if bf16_modules else 4)
        embedding = (2 if bf16_modules else 4) * shape.vocab * shape.hidden
    per_layer = activation_bytes_per_token_layer(shape, compute, residual, norms_trained=not net.lora,
                                                 lora_rank=s.lora_rank if net.lora else 0)
    return TrainedNet(casts, layer, per_layer, residual, not net.lora, layer_gradient, embedding)


def layers_saved(shape: Shape, t: TrainedNet, tokens: int, checkpointing: bool) -> int:
    """What the decoder layers keep between a forward and its backward: each layer's input under checkpointing,
    else every layer's saved set (the rebuilt layer is a moment of the backward pass: ``rebuilt_layer``)."""
    per_token = shape.hidden * t.residual if checkpointing else t.per_layer
    return tokens * shape.layers * per_token


def layer_gradient(shape: Shape, s: Settings, t: TrainedNet, tokens: int) -> int:
    """The largest weight gradient's transient while a layer's backward runs (the MLP's down projection): the
    gradient in the compute dtype as the matmul makes it, or, once the matmul has freed its saved input (tokens x
    intermediate), that gradient with its float32 copy (measured on CPU)."""
    if not t.layer_weight_gradient:
        return 0
    largest = max(n_in * n_out for n_in, n_out in shape.layer_linears())
    a = DTYPE_BYTES[s.compute] if t.layer_weight_gradient != 2 else 2
    return max(a * largest, t.layer_weight_gradient * largest - a * tokens * shape.intermediate)


def rebuilt_layer(t: TrainedNet, tokens: int) -> int:
    """One layer recomputed in the backward pass under checkpointing: its saved set and its weights' casts."""
    return tokens * t.per_layer + t.layer_casts


def update_activations(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], sequences: int,
                       checkpointing: bool) -> int:
    """Saved activations of every trained network for one micro-batch of ``sequences`` (reported beside the
    phases: with checkpointing, each layer's input plus one rebuilt layer)."""
    tokens = sequences * (s.prompt_tokens + s.completion_tokens)
    head = sequences * scored_positions(method, s)
    total = 0
    for n in nets.values():
        if n.trained:
            t = trained_net(shape, s, n)
            total += activation_bytes(shape, s.compute, tokens, checkpointing, head, t.residual, t.norms_trained,
                                      s.lora_rank if n.lora else 0)
    return total


SAMPLING_COPIES = 5
"""float32 copies of the next-token logits (vocabulary x 4 bytes a sequence) alive at a decoding step of HF's
generate: the copy of the last position's logits, the processed scores, the probabilities and the sampler's
temporaries (measured on CPU in tests/test_memory_measured.py); ``min_new_tokens`` adds 2 (its processor masks the
end-of-sequence tokens with ``torch.where``)."""


def generation_moments(shape: Shape, s: Settings, sequences: int, prompt: int, completion: int, residual: int,
                       compute: str, weight_casts: int) -> Moments:
    """One generate call of ``sequences`` sequences, in two moments: the prefill (the prompts' KV cache and one
    layer's working set over every prompt token) and the last decoding step (the whole KV cache of prompt +
    completion tokens and the float32 next-token logits of every sequence); the bf16 weight casts alive in both."""
    copies = SAMPLING_COPIES + (2 if s.fixed_length else 0)
    return {"prefill": {"kv_cache": kv_cache_bytes(shape, sequences, prompt, residual),
                        "prefill_working": forward_working_bytes(shape, compute, sequences * prompt),
                        "weight_casts": weight_casts},
            "last decoding step": {"kv_cache": kv_cache_bytes(shape, sequences, prompt + completion, residual),
                                   "sampling_logits": copies * 4 * shape.vocab * sequences,
                                   "weight_casts": weight_casts}}


def transient_cast(shape: Shape, s: Settings, net: NetworkMemory) -> int:
    """The one bf16 cast alive when a network whose float32 weights are cast per use (autocast's cache off, or a
    weight that does not require grad) computes: the largest linear (the LM head for an LM). 0 in float32 and for a
    bf16-stored network or base (nothing to cast but LoRA's small adapters)."""
    if s.compute == "float32" or net.lora or net.storage != "float32":
        return 0
    head = [shape.vocab * shape.hidden] if net.role in ("actor", "reference") else []
    return 2 * max([n_in * n_out for n_in, n_out in shape.layer_linears()] + head)


# ----------------------------------------------------------------------------------------------
# The update, per implementation


def engine_update(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], mb: int,
                  bf16_modules: bool = False) -> Moments:
    """The moments of one micro-batch's forward and backward on the suite's engine (``ppo.loss_fn`` /
    ``grpo_engine.loss_fn``): the actor's forward under autocast, its log-probs and entropies in float32 chunks,
    PPO's critic forward, then the backward pass (the critic's first: its graph is the newer).

    Each forward is its own autocast region, so its cache of bf16 weight casts is freed when the forward returns,
    before the next network's forward and before the backward pass; what survives is what the matmuls saved:
    without checkpointing every cast (a linear saves its weight's cast for its input's gradient), with it only the
    LM head's (the decoder layers run their first forward saving nothing and are rebuilt, casts included, one at a
    time in the backward pass).
    """
    T, L = s.completion_tokens, s.prompt_tokens + s.completion_tokens
    tokens, kept = mb * L, mb * (T + 1)
    ck, compute, h, V = s.gradient_checkpointing, s.compute, shape.hidden, shape.vocab
    a = DTYPE_BYTES[compute]
    actor = nets["actor"]
    A = trained_net(shape, s, actor, bf16_modules)
    head_trained = not actor.lora
    head_cast = 2 * V * h if head_trained and A.casts else 0
    actor_saved = layers_saved(shape, A, tokens, ck) + final_norm_bytes(
        shape, compute, tokens, kept, A.residual, A.norms_trained, head_input=head_trained)
    actor_casts_held = head_cast if ck else A.casts
    logits = a * kept * V
    chunk = 4 * T * V
    entropy_chunks = (ENTROPY_CHUNKS if a != 4 else ENTROPY_CHUNKS - 1) * chunk
    held = {"actor_casts_saved": actor_casts_held, "actor_activations": actor_saved, "logits": logits}
    moments: Moments = {
        "actor forward": {"actor_weight_casts": A.casts, "actor_activations": actor_saved, "logits": logits},
        "actor log-probs and entropy": {**held, "fp32_logit_chunks": entropy_chunks},
    }
    if method == "ppo" or "critic" in nets:
        critic = nets["critic"]
        C = trained_net(shape, s, critic, bf16_modules)
        # The float32 value head reads the last T + 1 positions: a view of the float32 final-norm output keeps it
        # whole; from a bf16 base the cast to float32 is a copy of the slice.
        value_input = 4 * h * tokens if C.residual == 4 else 4 * h * mb * (T + 1)
        critic_saved = layers_saved(shape, C, tokens, ck) + final_norm_bytes(
            shape, compute, tokens, None, C.residual, C.norms_trained, head_input=False) + value_input
        moments["critic forward"] = {**held, "critic_weight_casts": C.casts, "critic_activations": critic_saved,
                                     "layer_working": forward_working_bytes(shape, compute, tokens) if ck else 0}
        moments["critic backward"] = {**held, "critic_activations": critic_saved,
                                      "critic_casts_saved": 0 if ck else C.casts,
                                      "rebuilt_layer": rebuilt_layer(C, tokens) if ck else 0,
                                      "weight_gradient": layer_gradient(shape, s, C, tokens)}
        moments["critic embedding gradient"] = {**held, "weight_gradient": C.embedding_gradient}
    moments["log-prob backward"] = {**held, "logits_gradient": logits,
                                    "fp32_logit_chunks": LOGPROB_BACKWARD_CHUNKS * chunk}
    if head_trained:
        # The head's matmul backward makes the weight's gradient in the compute dtype; autocast's cast then hands
        # a float32 copy to the accumulator, after the matmul's saved cast and the logits' gradient are freed.
        moments["LM head backward"] = {"actor_casts_saved": actor_casts_held, "actor_activations": actor_saved,
                                       "logits_gradient": logits, "weight_gradient": a * V * h}
        moments["LM head gradient cast"] = {"actor_casts_saved": actor_casts_held - head_cast,
                                            "actor_activations": actor_saved,
                                            "weight_gradient": (a + 4 if A.casts else 4) * V * h}
    moments["actor backward"] = {"actor_casts_saved": 0 if ck else A.casts - head_cast,
                                 "actor_activations": actor_saved, "rebuilt_layer": rebuilt_layer(A, tokens) if ck else 0,
                                 "weight_gradient": layer_gradient(shape, s, A, tokens)}
    moments["actor embedding gradient"] = {"weight_gradient": A.embedding_gradient}
    if method == "ppo":  # the rollout log-probs of the actor (no grad, cache on) run in the update phase too
        moments["rollout log-probs"] = {"actor_weight_casts": A.casts,
                                        "forward_working": forward_working_bytes(shape, compute, tokens),
                                        "logits": logits, "fp32_logit_chunks": LOGPROB_CHUNKS * chunk}
    return moments


def trl_update(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], mb: int,
               bf16_modules: bool = False) -> Moments:
    """The moments of one micro-batch's forward and backward in TRL 1.16's GRPOTrainer / DPOTrainer: the policy's
    forward under accelerate's autocast (its own region, so the cache is freed before the backward pass) into the
    fused LM head (``fused_head_bytes``: the logits never exist; the head's weight is cast chunk by chunk, never
    cached), DPO's reference forward inside the loss (the telemetry's 'reference' phase, on top of the policy's
    saved activations), then the backward pass. ``mb``: sequences (DPO: 2 x pairs)."""
    L = s.prompt_tokens + s.completion_tokens
    tokens, scored = mb * L, fused_scored(s, mb)
    ck, compute, h = s.gradient_checkpointing, s.compute, shape.hidden
    actor = nets["actor"]
    A = trained_net(shape, s, actor, bf16_modules, lm_head_cast=False)
    head_trained = not actor.lora
    saved = (layers_saved(shape, A, tokens, ck)
             + final_norm_bytes(shape, compute, tokens, None, A.residual, A.norms_trained, head_input=False)
             + A.residual * h * scored)  # the fused head saves its own copy of the scored positions' hidden states
    casts_held = 0 if ck else A.casts
    forward = fused_head_bytes(shape, compute, scored, A.residual, False, head_trained, s.device)
    backward = fused_head_bytes(shape, compute, scored, A.residual, True, head_trained, s.device)
    moments: Moments = {
        "policy forward": {"actor_weight_casts": A.casts, "actor_activations": saved, **forward},
        "fused head backward": {"actor_casts_saved": casts_held, "actor_activations": saved, **backward},
        "policy backward": {"actor_casts_saved": casts_held, "actor_activations": saved,
                            "rebuilt_layer": rebuilt_layer(A, tokens) if ck else 0,
                            "weight_gradient": layer_gradient(shape, s, A, tokens)},
        "embedding gradient": {"weight_gradient": A.embedding_gradient},
    }
    return moments


def fused_scored(s: Settings, mb: int) -> int:
    """Positions TRL's fused head projects for ``mb`` sequences: the labelled completion tokens on a GPU (Triton:
    ``hidden_states[mask]``), every position but the last on a CPU (the tile shapes stay fixed there)."""
    if s.device == "cpu":
        return mb * (s.prompt_tokens + s.completion_tokens - 1)
    return mb * s.completion_tokens


def trl_reference_forward(shape: Shape, s: Settings, mb: int) -> Terms:
    """A reference forward (no grad) into TRL's fused head: one layer's working set, the scored hidden states'
    copy in the reference's dtype, the head's forward tile."""
    L, compute = s.prompt_tokens + s.completion_tokens, s.compute
    scored = fused_scored(s, mb)
    residual = DTYPE_BYTES[s.dtype]
    return {"forward_working": forward_working_bytes(shape, compute, mb * L),
            "reference_hidden": residual * shape.hidden * scored,
            **{f"reference_{k}": v for k, v in fused_head_bytes(shape, compute, scored, residual, False, False,
                                                              s.device).items()}}


# ----------------------------------------------------------------------------------------------
# Every phase


def phase_moments(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], share: int = 1,
                  layout: Layout | None = None) -> dict[str, Moments]:
    """phase -> moment -> {term: bytes} on top of the bytes resident between steps (``resident_bytes``);
    ``share``: GPUs the rollout is split over; ``layout``: a DeepSpeed layout (ZeRO stage >= 1), whose gradients
    stay in their partitions between steps and whose optimizer steps on this GPU's partition (or on the CPU).
    TRL's modules hold bf16 weights there (no autocast casts, a bf16 residual); the suite's engine keeps float32
    modules under its own autocast (the casts of one GPU) and, under ZeRO-3, generates inside a gather of the whole
    float32 actor (bf16 in the what-if layout)."""
    zero = layout is not None and layout.stage > 0
    engine = method in ENGINE_METHODS
    bf16_modules = zero and not engine and s.dtype != "float32"  # DeepSpeed's bf16 modules: nothing to cast
    # Each GPU runs micro-batches of the same size on its share of the step (fewer when the share is smaller).
    mb = min(s.micro_sequences(method), max(1, math.ceil(s.sequences_per_step(method) / share)))
    out: dict[str, Moments] = {}
    grads = sum(n.gradients_bytes for n in nets.values())
    freed = not engine and not zero  # TRL's Trainer frees gradients after each optimizer step (set_to_none)

    if method != "dpo":
        out["generation"] = rollout_generation(shape, s, nets["actor"], engine, bf16_modules, share, layout)
        if "reward" in nets:
            L = s.prompt_tokens + s.completion_tokens
            out["reward"] = {"reward model forward": {
                "forward_working": forward_working_bytes(shape, s.compute, mb * L),
                "last_hidden_state": mb * L * shape.hidden * nets["reward"].residual_bytes}}
    if engine:
        out.update(engine_phases(shape, method, s, nets, mb, bf16_modules))
    else:
        out.update(trl_phases(shape, method, s, nets, mb, bf16_modules, grads if freed else None))

    out["optimizer_step"] = {"step": {**({"gradients": grads} if freed else {}),
                                      **optimizer_step_terms(s, nets, layout)}}

    if s.evaluation:  # the worker evaluates the trained policy with every network and optimizer still resident
        out["evaluation"] = final_evaluation(shape, s, nets, engine, bf16_modules, layout)
    if s.generation_backend == "vllm":  # vLLM's weights copy and KV cache instead of HF generate's terms
        out = with_vllm(out, method, s, reservation(shape, method, s))
    return out


def rollout_generation(shape: Shape, s: Settings, actor: NetworkMemory, engine: bool, bf16_modules: bool,
                       share: int, layout: Layout | None) -> Moments:
    """The rollout's generation phase: this GPU's share of the step's completions decoded by the actor, with the
    bf16 casts its forwards hold and, under ZeRO-3, the actor's gathered weights."""
    zero = layout is not None and layout.stage > 0
    what_if = layout is not None and layout.what_if_engine
    rollout = max(1, math.ceil(s.prompts_per_step * s.group_size / share))
    if bf16_modules:
        casts = 0
    elif engine:
        casts = 0 if what_if else transient_cast(shape, s, actor)  # Engine.sample: autocast's cache off
    else:  # TRL: each decoding forward is its own cached autocast region (accelerate wraps forward)
        casts = actor.working_copy_bytes
    # The actor's residual: the what-if's bf16 copy computes in the one numerics too, so K stays float32.
    residual = trained_net(shape, s, actor, bf16_modules).residual
    gen = generation_moments(shape, s, rollout, s.prompt_tokens, s.completion_tokens, residual, s.compute, casts)
    gathered: Terms = {}
    if zero and layout.stage == 3 and engine:
        # Engine.sample runs in deepspeed.zero.GatheredParameters of every actor parameter: whole float32
        # tensors on every rank beside the shard it keeps (the what-if: a bf16 gather).
        gathered["gathered_actor"] = actor.parameters * (2 if what_if else 4)
    elif zero and layout.stage == 3 and s.ds3_gather_for_generation:
        # TRL's unwrap_model_for_generation gathers every shard of the policy: the whole module minus this
        # GPU's own shard (with the weights offloaded, the whole module).
        whole = actor.parameters * DTYPE_BYTES[s.dtype]
        gathered["gathered_policy"] = whole - (0 if layout.offload_params else math.ceil(whole / layout.gpus))
    return {name: {**terms, **gathered} for name, terms in gen.items()}


def engine_phases(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], mb: int,
                  bf16_modules: bool) -> dict[str, Moments]:
    """The suite engine's phases after generation: the reference's log-probs, the critic's rollout values (each
    when the method has the network) and the update (:func:`engine_update`)."""
    compute, L, T = s.compute, s.prompt_tokens + s.completion_tokens, s.completion_tokens
    chunk = 4 * T * shape.vocab
    out: dict[str, Moments] = {}
    if "reference" in nets:
        out["reference"] = {"reference log-probs": {
            "forward_working": forward_working_bytes(shape, compute, mb * L),
            "logits": DTYPE_BYTES[compute] * mb * (T + 1) * shape.vocab,
            "fp32_logit_chunks": (LOGPROB_CHUNKS if compute != "float32" else 1) * chunk}}
    if "critic" in nets:
        critic = nets["critic"]
        out["critic"] = {"rollout values": {
            "critic_weight_casts": trained_net(shape, s, critic, bf16_modules).casts,
            "forward_working": forward_working_bytes(shape, compute, mb * L),
            "last_hidden_state": mb * L * shape.hidden * critic.residual_bytes}}
    out["update"] = engine_update(shape, method, s, nets, mb, bf16_modules)
    return out


def trl_phases(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], mb: int,
               bf16_modules: bool, freed_gradients: int | None) -> dict[str, Moments]:
    """TRL's phases after generation: the update (:func:`trl_update`; ``freed_gradients``: the gradients' bytes,
    live through it, where the Trainer frees them after each step, else None) and the reference's forward (DPO's
    inside the loss, on top of the policy's saved activations)."""
    update = trl_update(shape, method, s, nets, mb, bf16_modules)
    if freed_gradients is not None:
        update = {name: {"gradients": freed_gradients, **terms} for name, terms in update.items()}
    out: dict[str, Moments] = {"update": update}
    if method == "dpo":  # the reference forward inside the loss, after the policy's forward
        policy = update["policy forward"]
        kept = {k: v for k, v in policy.items() if k in ("gradients", "actor_activations")}
        if not s.gradient_checkpointing:
            kept["actor_casts_saved"] = policy["actor_weight_casts"]
        out["reference"] = {"reference forward in the loss": {**kept, **trl_reference_forward(shape, s, mb)}}
    elif "reference" in nets:
        out["reference"] = {"reference log-probs": trl_reference_forward(shape, s, mb)}
    return out


def final_evaluation(shape: Shape, s: Settings, nets: dict[str, NetworkMemory], engine: bool, bf16_modules: bool,
                     layout: Layout | None) -> Moments:
    """The worker's evaluation of the trained policy (greedy generation at the eval batch size) with every network
    and optimizer still resident; under ZeRO-3 also the gathered or whole copy it evaluates."""
    actor = nets["actor"]
    zero = layout is not None and layout.stage > 0
    what_if = layout is not None and layout.what_if_engine
    residual = trained_net(shape, s, actor, bf16_modules).residual if not bf16_modules else DTYPE_BYTES[s.dtype]
    casts = 0 if bf16_modules else transient_cast(shape, s, actor)
    evaluation = generation_moments(shape, s, s.eval_batch_size, s.prompt_tokens, s.eval_completion_tokens,
                                    residual, s.compute, casts)
    if zero and layout.stage == 3 and what_if:
        # The what-if evaluates as it generates: from a bf16 gather of the actor.
        evaluation = {name: {**terms, "gathered_actor": actor.parameters * 2} for name, terms in evaluation.items()}
    elif zero and layout.stage == 3:
        # Rank 0 evaluates a whole copy of each trained network, built as the recipe builds it (float32 masters;
        # the engine's _whole_copy of the actor and the critic, TRL's common.evaluable_policy of the policy),
        # beside its shards: rank 0's peak.
        whole = sum(n.weights_bytes for n in nets.values() if n.trained and (engine or n.role == "actor"))
        evaluation = {name: {**terms, "whole_copy_rank0": whole} for name, terms in evaluation.items()}
    return evaluation


CPU_ADAMW_TEMPORARIES = 3
"""Copies of one parameter tensor torch's default (for-loop) AdamW holds at once on a CPU (two of the tensor it
steps and one left from the previous: measured in tests/test_memory_measured.py)."""


def optimizer_step_terms(s: Settings, nets: dict[str, NetworkMemory], layout: Layout | None = None) -> Terms:
    """What the AdamW step adds, as ``baselines.common.adamw_implementation`` picks it: torch's fused kernel on CUDA
    (in place: nothing parameter-sized), torch's default on a CPU (the for-loop: temporaries the size of the
    largest parameter tensor; under ZeRO DeepSpeed hands it one flat partition, so of that). The optimizers step one
    after another; offloaded (ZeRO's offload_optimizer), the step runs on the CPU and adds nothing here."""
    if s.device != "cpu":
        return {"adamw_fused": 0}
    zero = layout is not None and layout.stage > 0
    if zero and layout.offload_optimizer:
        return {"adamw_step_temporaries": 0}
    largest = [math.ceil(n.trainable_parameters / layout.gpus) if zero else n.largest_trainable_tensor
               for n in nets.values() if n.trained]
    return {"adamw_step_temporaries": CPU_ADAMW_TEMPORARIES * 4 * max(largest, default=0)}


def totals(moments: dict[str, Moments]) -> dict[str, Terms]:
    """phase -> the terms of its largest moment, with their 'total'."""
    phases: dict[str, Terms] = {}
    for phase, by_moment in moments.items():
        name = max(by_moment, key=lambda m: sum(by_moment[m].values()))
        terms = {k: v for k, v in by_moment[name].items() if v}
        phases[phase] = {**terms, "total": sum(terms.values())}
    return phases


def peak_moment(moments: dict[str, Moments], phase: str) -> str:
    """The moment of ``phase`` that is its peak."""
    by_moment = moments[phase]
    return max(by_moment, key=lambda m: sum(by_moment[m].values()))


def phase_terms(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], share: int = 1,
                layout: Layout | None = None) -> dict[str, Terms]:
    """Bytes each phase adds on top of the resident total, its largest moment's terms (``phase_moments``)."""
    return totals(phase_moments(shape, method, s, nets, share, layout))


def freed_between_steps(method: str, nets: dict[str, NetworkMemory], layout: Layout | None = None) -> int:
    """Bytes of the static accounting not resident between steps: TRL's Trainer frees every gradient after each
    optimizer step (``zero_grad(set_to_none=True)``), so its gradients count in the update and the optimizer step
    only; the suite's engine keeps them (it zeroes them at the start of the update), and so does DeepSpeed (its
    gradient partitions)."""
    zero = layout is not None and layout.stage > 0
    if method in ENGINE_METHODS or zero:
        return 0
    return sum(n.gradients_bytes for n in nets.values())


def outside_allocator(s: Settings, layout: Layout | None = None) -> Terms:
    """Device memory PyTorch's allocator does not see (cuda-allocated misses it, nvml-process has it): the CUDA
    context, and NCCL's buffers with several GPUs. Nothing on a CPU."""
    if s.device == "cpu":
        return {}
    terms = {"cuda_context": CUDA_CONTEXT_BYTES}
    if layout is not None and layout.gpus > 1:
        terms["nccl_buffers"] = NCCL_BYTES
    return terms


def peak_of(resident: int, phases: dict[str, Terms]) -> tuple[int, str]:
    """(resident + the largest phase, that phase)."""
    phase = max(phases, key=lambda p: phases[p]["total"])
    return resident + phases[phase]["total"], phase
