"""The memory model's per-implementation terms: what each phase of a step (generation, reward, reference, critic,
update) adds on top of the static terms, as the suite's engine and TRL's trainers run it (weight casts under
autocast, saved activations, logits, the KV cache, the optimizer step), and the peak over the phases. The
arithmetic is :mod:`bench.systems.memory_terms`; the model as a whole is described in
:mod:`bench.systems.memory_model`. All sizes are bytes."""

from __future__ import annotations

import math
from bench.systems.memory_terms import (Layout, DTYPE_BYTES, ENGINE_METHODS, NetworkMemory, Settings, Shape, TRAINED_ROLES,
                                        activation_bytes, forward_working_bytes, kv_cache_bytes, logit_bytes)


def scored_positions(method: str, s: Settings) -> int:
    """Positions per sequence whose logits are scored: whole sequences in DPO, T + 1 online (logits_to_keep)."""
    return s.prompt_tokens + s.completion_tokens if method == "dpo" else s.completion_tokens + 1


def update_activations(shape: Shape, method: str, s: Settings, roles: tuple[str, ...], sequences: int,
                       checkpointing: bool) -> int:
    """Saved activations of every trained network for one micro-batch of ``sequences`` (their heads read the
    scored positions: the actor's LM head and the critic's value head)."""
    compute = "float32" if s.dtype == "float32" else "bfloat16"
    tokens = sequences * (s.prompt_tokens + s.completion_tokens)
    head = sequences * scored_positions(method, s)
    return sum(activation_bytes(shape, compute, tokens, checkpointing, head) for r in roles if r in TRAINED_ROLES)


def generation_weight_casts(shape: Shape, method: str, s: Settings, actor: NetworkMemory) -> int:
    """bf16 weight casts alive at the generation peak, bytes (0 in float32).

    The suite's engine samples under autocast with its weight cache off (``Engine.sample``): each fp32 weight is
    cast when its matmul runs and freed after it, so at most one cast is alive, the largest linear (2 bytes x
    the LM head for an LM). TRL's trainers keep the cache within each decoding forward: the actor's whole working
    copy (``actor.working_copy_bytes``); with LoRA that is the adapters' casts, and the frozen base is cast per use
    (one transient cast, the largest, on top).
    """
    if s.dtype == "float32":
        return 0
    largest = DTYPE_BYTES["bfloat16"] * max([n_in * n_out for n_in, n_out in shape.layer_linears()]
                                            + [shape.vocab * shape.hidden])
    if method in ENGINE_METHODS:
        return largest
    return actor.working_copy_bytes + (largest if actor.frozen_layer_linears else 0)


def frozen_weight_casts(shape: Shape, s: Settings, nets: dict[str, NetworkMemory]) -> int:
    """bf16 casts of frozen LoRA base weights that the update saves for backward, bytes (0 in float32).

    A frozen weight's cast is not cached by autocast, but a matmul whose input needs a gradient saves it: every
    decoder layer's without gradient checkpointing, one layer's (the one being rebuilt) with it, and the LM head.
    Without checkpointing the first layer's q, k and v read the frozen embedding's output, which needs no gradient,
    so their casts are not saved (with it, the suite and TRL make that output require grad; measured on CPU with
    peft in tests/test_memory_model.py).
    """
    if s.dtype == "float32":
        return 0
    if s.gradient_checkpointing:
        per_net = lambda n: n.frozen_layer_linears + n.frozen_head  # noqa: E731
    else:
        first_qkv = shape.hidden * (shape.q_width + 2 * shape.kv_width)
        per_net = lambda n: n.frozen_layer_linears * shape.layers - first_qkv + n.frozen_head  # noqa: E731
    return sum(2 * per_net(n) for n in nets.values() if n.trained and n.frozen_layer_linears)


def phase_terms(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], share: int = 1,
            layout: "Layout | None" = None) -> dict[str, dict[str, int]]:
    """Bytes each phase adds on top of the static total; ``share``: GPUs the rollout is split over; ``layout``: a
    DeepSpeed layout (ZeRO stage >= 1), whose gradients stay in their partitions between steps and whose optimizer
    steps on this GPU's partition (or on the CPU). TRL's modules hold bf16 weights there (no autocast casts); the
    suite's engine keeps float32 modules under its own autocast (the casts of one GPU) and, under ZeRO-3,
    generates inside a gather of the whole float32 actor."""
    compute = "float32" if s.dtype == "float32" else "bfloat16"
    zero = layout is not None and layout.stage > 0
    engine = method in ENGINE_METHODS
    bf16_modules = zero and not engine  # DeepSpeed's bf16 modules: nothing for autocast to cast
    # Each GPU runs micro-batches of the same size on its share of the step (fewer when the share is smaller).
    mb = min(s.micro_sequences(method), max(1, math.ceil(s.sequences_per_step(method) / share)))
    seq_len = s.prompt_tokens + s.completion_tokens
    copies = {role: 0 if bf16_modules else n.working_copy_bytes for role, n in nets.items()}
    phases: dict[str, dict[str, int]] = {}
    logit_positions = scored_positions(method, s)
    if method != "dpo":
        rollout = max(1, math.ceil(s.prompts_per_step * s.group_size / share))
        gen = {"kv_cache": kv_cache_bytes(shape, compute, rollout, seq_len),
               "sampling_logits": 3 * 4 * shape.vocab * rollout,
               "prefill_working": forward_working_bytes(shape, compute, rollout * s.prompt_tokens),
               "actor_working_copy": 0 if bf16_modules else generation_weight_casts(shape, method, s, nets["actor"])}
        if zero and layout.stage == 3 and engine:
            # Engine.sample runs in deepspeed.zero.GatheredParameters of every actor parameter (a LoRA base too):
            # whole float32 tensors allocated on every rank beside the shard it keeps (offloaded or not).
            gen["gathered_actor"] = nets["actor"].parameters * 4
        elif zero and layout.stage == 3 and s.ds3_gather_for_generation:
            # TRL's unwrap_model_for_generation gathers every shard of the policy: the whole module minus this
            # GPU's own shard (with the weights offloaded, the whole module).
            actor = nets["actor"].parameters * DTYPE_BYTES[s.dtype]
            gen["gathered_policy"] = actor - (0 if layout.offload_params else math.ceil(actor / layout.gpus))
        phases["generation"] = gen
        if "reward" in nets:
            phases["reward"] = {"forward_working": forward_working_bytes(shape, compute, mb * seq_len)
                                + mb * seq_len * shape.hidden * DTYPE_BYTES[compute]}
    if "reference" in nets or method == "dpo":
        phases["reference"] = {"forward_working": forward_working_bytes(shape, compute, mb * seq_len),
                               "logits": logit_bytes(shape, compute, mb, logit_positions, method, backward=False)}
    if "critic" in nets:
        phases["critic"] = {"forward_working": forward_working_bytes(shape, compute, mb * seq_len),
                            "critic_working_copy": copies["critic"]}
    update = {"activations": update_activations(shape, method, s, tuple(nets), mb, s.gradient_checkpointing),
              "logits": logit_bytes(shape, compute, mb, logit_positions, method, backward=True),
              "working_copies": sum(copies.values())}
    if not bf16_modules and frozen_weight_casts(shape, s, nets):
        update["frozen_weight_casts"] = frozen_weight_casts(shape, s, nets)
    phases["update"] = update
    # torch's AdamW on GPU defaults to the foreach implementation, whose step holds one parameter-sized buffer
    # (sqrt of exp_avg_sq) for all of an optimizer's parameters at once; the optimizers step one after another.
    # Under ZeRO it steps this GPU's float32 partition; offloaded, it steps on the CPU.
    trained = [n.trainable_parameters * 4 if zero else n.gradients_bytes for n in nets.values() if n.trained]
    parts = 0 if layout is not None and layout.offload_optimizer else (layout.gpus if zero else 1)
    phases["optimizer_step"] = {"adamw_foreach_buffer": max((math.ceil(b / parts) for b in trained), default=0)
                                if parts else 0}
    if not engine and not zero:  # TRL's Trainer frees gradients after each step (set_to_none)
        grads = sum(n.gradients_bytes for n in nets.values())
        for name, terms in phases.items():
            if name not in ("update", "optimizer_step") and grads:
                terms["gradients_freed"] = -grads
    for terms in phases.values():
        terms["total"] = sum(terms.values())
    return phases


def peak_of(static: int, phases: dict[str, dict[str, int]]) -> tuple[int, str]:
    phase = max(phases, key=lambda p: phases[p]["total"])
    return static + phases[phase]["total"], phase


# ----------------------------------------------------------------------------------------------
# Layouts over several GPUs
