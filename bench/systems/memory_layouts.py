"""The memory model over several GPUs: plain data parallelism and ZeRO-1/2/3 (with offload), per implementation (TRL's
trainers under DeepSpeed's bf16, the suite's engine with float32 modules and DeepSpeed's master clone), as
described in :mod:`bench.systems.memory_model`. All sizes are bytes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any
from bench.systems.memory_terms import (DTYPE_BYTES, ENGINE_METHODS, Layout, NetworkMemory, Settings, Shape, network_memory,
                                        roles_for)
from bench.systems.memory_phases import (Moments, freed_between_steps, outside_allocator, peak_moment, peak_of,
                                         phase_moments, totals)
from bench.systems.memory_vllm import start_problem


@dataclass
class LayoutMemory:
    """Per-GPU memory of one method in one layout."""

    layout: Layout
    static: dict[str, int]
    """Bytes resident on each GPU between steps: weights, gradients (0 for TRL's trainers outside DeepSpeed: the
    Trainer frees them after each step; they count in the update), master_weights, optimizer, gathered_weights
    (ZeRO-3's working set of gathered modules), gradient_buckets (DDP's bucket copy of the gradients) and their
    total."""
    host_bytes: int
    """CPU memory of the offloaded state, all ranks together (bytes; 0 without offload)."""
    phases: dict[str, dict[str, int]]
    """phase -> {term: bytes} on top of ``static['total']`` on one GPU (its largest moment); each has a 'total'."""
    peak_bytes: int
    """What PyTorch's allocator holds at the peak (comparable with cuda-allocated)."""
    peak_phase: str
    fits: bool
    """``device_peak_bytes`` fits the GPU."""
    max_micro_batch: int | None = None
    """Largest micro-batch (sequences; DPO pairs) that fits this layout (0: none); None when not searched."""
    moments: dict[str, Moments] | None = None
    """phase -> moment -> {term: bytes} (bench.systems.memory_phases.phase_moments)."""
    outside_allocator: dict[str, int] | None = None
    """Device memory outside PyTorch's allocator on each GPU: the CUDA context, NCCL's buffers."""

    @property
    def device_peak_bytes(self) -> int:
        """The peak plus what the allocator does not see: what the GPU must hold."""
        return self.peak_bytes + sum((self.outside_allocator or {}).values())

    @property
    def peak_moment(self) -> str:
        return peak_moment(self.moments, self.peak_phase) if self.moments else self.peak_phase

    def to_json(self) -> dict[str, Any]:
        """Plain data (``Prediction.to_json``'s ``layout`` and ``gpus_memory``)."""
        return {"layout": self.layout.name, **asdict(self.layout), "static": self.static,
                "host_bytes": self.host_bytes, "host_bytes_per_gpu": math.ceil(self.host_bytes / self.layout.gpus),
                "phases": self.phases, "moments": self.moments, "peak_bytes": self.peak_bytes,
                "peak_phase": self.peak_phase, "peak_moment": self.peak_moment,
                "outside_allocator": self.outside_allocator or {}, "device_peak_bytes": self.device_peak_bytes,
                "fits": self.fits, "max_micro_batch": self.max_micro_batch}


def largest_module(shape: Shape) -> int:
    """Elements of the largest module ZeRO-3 gathers at once: a decoder layer, or the embedding / LM head."""
    return max(sum(shape.layer_tensors()), shape.vocab * shape.hidden)


def layout_static(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory],
                  layout: Layout) -> tuple[dict[str, int], int]:
    """(bytes resident on each GPU by kind, bytes offloaded to CPU memory over all ranks) for ``layout``.

    Plain DP: the networks as on one GPU (float32 storage of trained networks is their master copy), less TRL's
    freed gradients, plus, on several GPUs, DDP's gradient buckets (``gradient_as_bucket_view`` is off in both
    the engine's and accelerate's DDP: a bucket copy of every gradient, allocated once). ZeRO: a float32 master
    partition beside the trained modules, which are in the spec's dtype for TRL's trainers and float32 for the
    suite's engine, whose frozen networks also stay whole at every stage (module docstring) unless the layout is
    the what-if that shards them.
    """
    n, stage = layout.gpus, layout.stage
    terms = {"weights": 0, "gradients": 0, "master_weights": 0, "optimizer": 0, "gathered_weights": 0,
             "gradient_buckets": 0}
    if stage == 0:
        for net in nets.values():
            terms["weights"] += net.weights_bytes
            terms["gradients"] += net.gradients_bytes
            terms["optimizer"] += net.optimizer_bytes
            if n > 1 and net.trained:
                terms["gradient_buckets"] += net.gradients_bytes
        terms["gradients"] -= freed_between_steps(method, nets, layout)
        return {**terms, "total": sum(terms.values())}, 0
    engine = method in ENGINE_METHODS
    module = 4 if engine else DTYPE_BYTES[s.dtype]  # the engine's DeepSpeed config has no bf16 section
    host = 0
    for net in nets.values():
        trained = net.trainable_parameters if net.trained else 0
        # TRL's DeepSpeed casts the whole trained module to the spec's dtype; the engine keeps its storage (float32,
        # or a LoRA network's bf16 base with float32 adapters).
        weights = net.parameters * module if net.trained and not engine else net.weights_bytes
        grads = trained * module
        master = trained * 4  # DeepSpeed clones its partition into a float32 copy, of float32 weights too
        optim = net.optimizer_bytes
        # the engine's frozen networks stay whole (but in the what-if)
        sharded = stage == 3 and (net.trained or not engine or layout.what_if_engine)
        if layout.offload_params and sharded:
            host += weights
        else:
            terms["weights"] += math.ceil(weights / n) if sharded else weights
        if layout.offload_optimizer:  # the step runs on the CPU over a float32 copy of the gradient partition
            host += master + optim + 4 * trained
            terms["gradients"] += grads if stage == 1 else 0  # from stage 2 the partitions go to the CPU
        else:
            terms["gradients"] += math.ceil(grads / n) if stage >= 2 else grads
            terms["master_weights"] += math.ceil(master / n)
            terms["optimizer"] += math.ceil(optim / n)
    if stage == 3:  # the module computing and the next one, prefetched
        terms["gathered_weights"] = 2 * largest_module(shape) * module
    return {**terms, "total": sum(terms.values())}, host


def layout_memory(shape: Shape | dict[str, Any], method: str, s: Settings, layout: Layout) -> LayoutMemory:
    """Per-GPU memory of ``method`` spread over ``layout`` (the rollout split over its GPUs)."""
    sh = shape if isinstance(shape, Shape) else Shape.from_fields(shape)
    nets = {role: network_memory(sh, role, s) for role in roles_for(method, s)}
    static, host = layout_static(sh, method, s, nets, layout)
    moments = phase_moments(sh, method, s, nets, share=layout.gpus, layout=layout)
    phases = totals(moments)
    peak, phase = peak_of(static["total"], phases)
    outside = outside_allocator(s, layout)
    fits = peak + sum(outside.values()) <= s.gpu_memory_bytes and start_problem(sh, method, s) is None
    return LayoutMemory(layout, static, host, phases, peak, phase, fits, moments=moments, outside_allocator=outside)

