"""The memory model's vLLM terms (``generation.backend: vllm``): what an in-process vLLM engine holds on the device
that generates, and in which phases. All sizes are bytes.

With the vllm backend (bench.model.vllm_backend) every generation of a run decodes in a vLLM engine inside the
training process, built from the policy and holding its own copy of the policy's weights in ``model.dtype``. HF
``generate`` is then never called, so its terms (the DynamicCache, the sampling logits, the prefill's working set,
the weight casts: ``memory_phases.generation_moments``) leave the generation and evaluation phases; vLLM's take
their place.

**How vLLM sizes its reservation on a GPU** (vLLM v1's worker, read from vLLM's repository source; not checked
against the pinned 0.31 wheel itself, which is not installed here):
``vllm/v1/worker/utils.py: request_memory`` takes ``requested = ceil(total_memory x gpu_memory_utilization)`` of
the device and refuses to start when less than that is free ("Free memory on device ... is less than desired GPU
memory utilization"); ``vllm/v1/worker/gpu_worker.py: Worker.determine_available_memory`` then profiles one dummy
forward of ``max_num_batched_tokens`` tokens plus a dummy sampler run of ``max_num_seqs`` rows
(``vllm/utils/mem_utils.py: memory_profiling``) and gives the KV cache what is left of the request:
``available_kv_cache_memory = requested - non_kv_cache_memory`` with ``non_kv_cache_memory = weights +
torch_peak_increase + non_torch_increase`` (each measured against the snapshot taken before vLLM started: the
trainer's memory is not charged to vLLM, but it must leave ``requested`` free). So the instance takes the share of
the device it was told to, whatever else is there: ``gpu_memory_utilization x device memory``, of which the KV cache
is the rest after the weights and the profile's activation peak. ``max_num_batched_tokens`` / ``max_num_seqs``
default, for the ``LLM`` class, to 16,384 / 1,024 on a device of at least 70 GiB and 8,192 / 256 below
(``vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults``; A100s get the smaller pair too). On a CPU the
suite passes the KV cache's size itself (``kv_cache_memory_bytes`` = ``generation.vllm_cpu_kv_cache_gib``).

**When it is held**: from the first generation to the end of the run (the evaluation reuses the rollouts' engine).
The suite's engine puts vLLM to sleep for its update where the platform has sleep mode (CUDA:
``LLM.sleep(level=1)``, weights offloaded to pinned host memory, KV cache discarded), so the update and optimizer
step hold nothing of vLLM there; on a CPU, and for TRL's GRPO (its colocated engine starts with
``vllm_enable_sleep_mode`` false), the weights and KV cache stay through the update. DPO trains on the pool's pairs
and generates only to evaluate: its engine exists in the evaluation phase alone.

Approximate: the profile's activation peak (one layer's no-grad working set over ``max_num_batched_tokens`` tokens
in the model's dtype, plus ``SAMPLER_COPIES`` float32 copies of ``max_num_seqs`` rows of logits); CUDA graphs'
memory pool and allocator rounding are not modelled. The weights and, given the request, the KV cache are exact
up to vLLM's rounding to whole blocks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from bench.systems.memory_terms import DTYPE_BYTES, ENGINE_METHODS, GIB, Settings, Shape

Terms = dict[str, int]
Moments = dict[str, Terms]

VLLM_MOMENT = "vLLM generation"
"""The one moment of a generation phase decoded by vLLM (its memory is preallocated: no prefill / last-step split)."""

HF_GENERATION_TERMS = ("kv_cache", "prefill_working", "sampling_logits", "weight_casts")
"""The HF ``generate`` terms (``memory_phases.generation_moments``) that vLLM replaces; other terms of a generation
phase (ZeRO-3's gathers, rank 0's whole copies for the evaluation) stay: the weights still have to be gathered to
be loaded into vLLM."""

LARGE_DEVICE_BYTES = 70 * GIB
"""From this device memory on, vLLM's ``LLM`` class batches more per step (EngineArgs.get_batch_defaults)."""

BATCH_DEFAULTS = {"large": (16384, 1024), "small": (8192, 256)}
"""(max_num_batched_tokens, max_num_seqs) vLLM's ``LLM`` class defaults to on a device of at least / below
LARGE_DEVICE_BYTES."""

SAMPLER_COPIES = 3
"""float32 copies of ``max_num_seqs`` rows of logits alive in vLLM's dummy sampler run (the logits, their
float32 softmax, the sampler's temporary): approximate."""


@dataclass(frozen=True)
class VllmReservation:
    """What one vLLM engine holds on the device it generates on (one per GPU: every rank colocates its own)."""

    requested_bytes: int
    """The instance's share: ceil(gpu_memory_utilization x device memory) on a GPU; on a CPU weights + profile
    activations + the KV cache asked for."""
    weights_bytes: int
    """vLLM's own copy of the policy weights in model.dtype (parameters x bytes per element; exact)."""
    activation_bytes: int
    """The profile run's activation peak vLLM keeps free for its forwards (approximate)."""
    kv_cache_bytes: int
    """The preallocated KV cache: the request less the weights and the activation peak (negative: vLLM cannot
    start; see ``problem``)."""
    kv_bytes_per_token: int
    """K and V of every layer for one token in the cache dtype (model.dtype)."""
    max_num_batched_tokens: int
    max_num_seqs: int
    sleeps: bool
    """Released during the update (sleep mode, level 1: CUDA, the suite's engine)."""

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds at once (0 when it has no room)."""
        return max(0, self.kv_cache_bytes) // self.kv_bytes_per_token

    @property
    def problem(self) -> str | None:
        """Why vLLM cannot start (its KV cache would have no room), or None."""
        if self.kv_cache_bytes > 0:
            return None
        return (f"vLLM's share ({self.requested_bytes / GIB:.2f} GiB) does not hold its weights "
                f"({self.weights_bytes / GIB:.2f} GiB) and profile activations ({self.activation_bytes / GIB:.2f} "
                f"GiB): no room for a KV cache; raise generation.vllm_gpu_memory_utilization")

    def held(self) -> Terms:
        """What stays allocated between its generations: the weights and the whole KV cache."""
        return {"vllm_weights": self.weights_bytes, "vllm_kv_cache": max(0, self.kv_cache_bytes)}

    def generating(self) -> Terms:
        """While it generates: what it holds plus its activations (together the whole request)."""
        return {**self.held(), "vllm_activations": self.activation_bytes}

    def to_json(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """Plain data with the KV cache's capacity in tokens and in whole sequences of prompt + completion."""
        per_sequence = prompt_tokens + completion_tokens
        return {**asdict(self), "kv_tokens": self.kv_tokens, "sequences_held": self.kv_tokens // per_sequence,
                "problem": self.problem}


def batch_defaults(s: Settings) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of vLLM's ``LLM`` class on ``s``'s device."""
    if s.device != "cpu" and s.gpu_memory_bytes >= LARGE_DEVICE_BYTES:
        return BATCH_DEFAULTS["large"]
    return BATCH_DEFAULTS["small"]


def profile_activation_bytes(shape: Shape, s: Settings, tokens: int, seqs: int) -> int:
    """The profile run's activation peak (approximate): one decoder layer's no-grad working set over ``tokens``
    tokens in model.dtype (the MLP's three intermediates, q/k/v, three hidden-sized tensors of vLLM's residual
    stream, which stays in the model's dtype) plus SAMPLER_COPIES float32 copies of ``seqs`` rows of logits."""
    a = DTYPE_BYTES[s.dtype]
    layer = tokens * (3 * a * shape.intermediate + a * (shape.q_width + 2 * shape.kv_width) + 3 * a * shape.hidden)
    return layer + SAMPLER_COPIES * 4 * shape.vocab * seqs


def reservation(shape: Shape, method: str, s: Settings) -> VllmReservation:
    """vLLM's reservation for ``method`` under ``s`` (see the module docstring for vLLM's own sizing rule)."""
    a = DTYPE_BYTES[s.dtype]
    weights = shape.parameters() * a
    tokens, seqs = batch_defaults(s)
    activations = profile_activation_bytes(shape, s, tokens, seqs)
    if s.device == "cpu":  # the suite gives the KV cache's size itself (kv_cache_memory_bytes)
        kv = int(s.vllm_cpu_kv_cache_gib * GIB)
        requested = weights + activations + kv
    else:
        requested = math.ceil(s.gpu_memory_bytes * s.vllm_gpu_memory_utilization)
        kv = requested - weights - activations
    sleeps = s.device != "cpu" and method in ENGINE_METHODS
    return VllmReservation(requested, weights, activations, kv, 2 * shape.layers * shape.kv_width * a, tokens, seqs,
                           sleeps)


def with_vllm(moments: dict[str, Moments], method: str, s: Settings, r: VllmReservation) -> dict[str, Moments]:
    """``moments`` (phase -> moment -> terms, HF generate's) as the vllm backend runs them: generation and
    evaluation decode in vLLM (HF's generation terms replaced by ``r.generating()``); the phases between hold its
    weights and KV cache (``r.held()``), but the update and the optimizer step where it sleeps. DPO's engine exists
    in the evaluation only."""
    out: dict[str, Moments] = {}
    for phase, by_moment in moments.items():
        if phase in ("generation", "evaluation"):
            kept: Terms = {}
            for terms in by_moment.values():  # the gathers are the same in every moment of the phase
                kept.update({k: v for k, v in terms.items() if k not in HF_GENERATION_TERMS})
            out[phase] = {VLLM_MOMENT: {**r.generating(), **kept}}
        elif method == "dpo" or (r.sleeps and phase in ("update", "optimizer_step")):
            out[phase] = by_moment
        else:
            out[phase] = {name: {**terms, **r.held()} for name, terms in by_moment.items()}
    return out


def stage_generation(shape: Shape, s: Settings) -> Moments:
    """A stage's generation (the sample pool) decoded by vLLM: its whole request while it generates."""
    return {VLLM_MOMENT: reservation(shape, "sample_pool", s).generating()}


def start_problem(shape: Shape, method: str, s: Settings) -> str | None:
    """Why the run's vLLM engine could not start under ``s`` (no room for its KV cache), or None (also when the
    backend is transformers, or DPO never generates because its evaluation is off)."""
    if s.generation_backend != "vllm" or (method == "dpo" and not s.evaluation):
        return None
    return reservation(shape, method, s).problem
