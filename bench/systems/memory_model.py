"""The analytical memory model: what PPO, GRPO and DPO (and the stages they read) hold on a GPU, from a model's
shape alone.

Pure Python (no torch, no transformers): ``bench estimate`` answers in well under a second and the report can
set predictions beside measurements anywhere. All sizes are bytes. The pieces: :mod:`bench.systems.memory_terms`
(shapes, settings, bytes per network, activations, the KV cache, TRL's fused head, layouts),
:mod:`bench.systems.memory_phases` (each implementation's phases), :mod:`bench.systems.memory_layouts` (several
GPUs), :mod:`bench.systems.memory_stages` (the sample pool and the reward model); this module makes the prediction.

**Static terms, exact** (checked against ``bench.telemetry.accounting`` on real modules in
tests/test_memory_model.py): per network, weights, gradients and AdamW state under the precision policy
(``bench.model.precision``): trained networks (actor, critic) are stored in float32 — those ARE the master weights,
there is no second copy — with float32 gradients and two float32 moments plus a 4-byte ``step`` tensor per
parameter tensor; frozen networks (reference, reward model) are stored in the spec's dtype. The critic is the
backbone without the LM head plus a float32 value head (hidden -> 1, with bias; float32 in one process and under
DDP alike); the reward model is the backbone plus a ``score`` row (hidden -> 1, no bias). With LoRA (peft
``all-linear``: every linear layer but the LM head, r x (in + out) each) only the adapters are trained; the frozen
base is stored in the spec's dtype (bf16 under ``model.dtype: bfloat16``), the adapters in float32 (peft upcasts
them), and the reference is the actor's base with adapters off (no bytes of its own). PPO's critic gets its own
adapters on its own frozen backbone and a trained value head (``lora_critic``), or is trained in full.

**Resident between steps**: the static total, less TRL's gradients: the Trainer frees them after each optimizer step
(``zero_grad(set_to_none=True)``), so for TRL's methods they are a term of the update and the optimizer step only;
the suite's engine keeps them (it zeroes them at the start of the update) and so does DeepSpeed. Every phase adds
to this; no phase or term is negative.

**Per phase, approximate** (each term tested against a CPU measurement of the tensors it predicts, through torch's
profiler: tests/memory_probe.py). A phase passes through *moments* whose tensors do not coexist; the phase is its
largest moment and the prediction lists every moment (``moments``):

* bf16 weight casts: under bf16 autocast ``torch.autocast`` caches a bf16 cast of every float32 leaf weight that
  requires grad a matmul uses, for the whole autocast region — one forward: the engine and accelerate make each
  forward its own region, so the cache is freed when the forward returns, before the next network's forward and
  before the backward pass. What survives is what the matmuls saved for backward: without gradient checkpointing
  every cast (a linear saves its weight's cast for its input's gradient), with it only the LM head's — the decoder
  layers run their first forward saving nothing and are rebuilt, casts included, one at a time in the backward
  pass. So with checkpointing the actor's and the critic's casts never coexist. Trained weights only: a bf16 base
  (LoRA) or frozen network needs no cast. Generation: the suite's engine samples with the cache off, so one
  transient cast (the largest linear, the LM head) is alive; TRL's trainers keep the cache within each decoding
  forward (the whole copy at its end). TRL 1.16's fused LM head casts its weight chunk by chunk, never cached.
* activations saved for backward per micro-batch, per token per layer (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", arXiv:2205.05198, section 4: count the tensors each op
  saves for its backward pass), adapted to the Hugging Face Llama / Qwen2 layer as the suite runs it: each RMSNorm
  saves its float32 input (or float32 copy of a bf16 input) and, with a trained weight, its normalised input in the
  residual dtype (float32 when trained weights are float32, bf16 for a bf16 base); under autocast over a float32
  residual every linear saves its own bf16 cast of its input (q, k, v, gate, up: 5 x a x h), otherwise the two
  norm outputs are shared; attention saves q and the K/V repeated to every query head (HF repeats K/V when a
  padding mask is passed), its output, and a float32 logsumexp per head (4 x a x hq + 4 x heads; a fused SDPA
  kernel, so no s x s scores — Korthikanti's 5as/h term is gone); the SwiGLU MLP saves gate, SiLU(gate), up and
  their product (4 x a x I); each LoRA adapter its rank-wide A output; no dropout (the suite disables it). a = 2
  under bf16 autocast, 4 in float32. With gradient checkpointing (HF wraps each decoder layer) only each layer's
  input is kept (residual bytes x h per token per layer), and one layer's full set is rebuilt during the backward
  pass (Korthikanti's "full recomputation", 2sbhL), beside that layer's transient weight gradient.
* logits: the suite's engine materialises the LM head's output over the last T + 1 positions (a bytes, kept for
  the backward pass) and its gradient, and takes log-probs and entropies one sequence at a time in float32
  (``rl_math``): 2 float32 chunks in the log-prob forward, 3 in the entropy pass, 4 in the log-prob backward on
  top of the logits' gradient (all measured). TRL 1.16's GRPO and DPO use the fused, chunked LM head
  (``trl/kernels/chunked_logprob.py``, added by ``add_fused_lm_head`` at trainer construction): the logits never
  exist; it keeps its own copy of the scored positions' hidden states, one tile of logits (4,096 tokens x 32,768
  entries), and in the backward pass float32 accumulators for the hidden states' gradient and the whole LM head's
  gradient (the fp32 LM-head gradient buffer, vocabulary x hidden x 4). Weight gradients: a trained linear's bf16
  gradient and the float32 copy autocast's cast hands to the accumulator (6 bytes an element, largest for the LM
  head); the embedding's dense float32 gradient.
* KV cache during generation: layers x kv_heads x head_dim x (k + a) bytes per token, modelled as measured on the
  HF cache: K is float32 under autocast over the fp32-stored actor (RoPE's cos/sin take the residual stream's
  dtype and promote it), V is the projection's a bytes; both bf16 for a bf16 network. For every sequence of the
  generate call (prompt + completion tokens), plus float32 next-token logits (logits, processed scores,
  probabilities: 3 x 4 x V per sequence) and the prefill's working set of one layer.
* the optimizer step: torch's fused AdamW on CUDA updates in place (no parameter-sized temporary; measured on
  CPU, where fused AdamW also exists); on the CPU the foreach implementation holds one parameter-sized float32
  buffer for the whole optimizer while it steps (+1.00 x the parameter bytes, measured).
* evaluation (``eval.enabled``): the worker's greedy evaluation of the trained policy in the one compute numerics
  (``bench.model.numerics``), every network and optimizer still resident: a generate call of ``eval.batch_size``
  prompts (KV cache, logits, prefill, one transient cast). Under ZeRO-3 rank 0 evaluates whole float32 copies of
  the trained networks built beside its shards (the engine's ``_whole_copy`` of the actor and the critic, TRL's
  ``common.evaluable_policy`` of the policy): rank 0's evaluation peak (7B PPO: 55 GiB of copies beside the
  engine's 27 GiB of whole frozen networks, more than an 80 GiB GPU holds).
* the one compute numerics (``bench.model.numerics``): under bf16 autocast every network — bf16-stored frozen
  networks and LoRA bases too — carries a float32 residual stream (their embeddings are hooked), so norms, layer
  inputs and the K cache are float32 everywhere; only DeepSpeed's bf16 modules (TRL under ZeRO) are bf16 through.

**Stages** (:mod:`bench.systems.memory_stages`, their own processes): the sample pool (the frozen starting policy
generating ``sample_pool.batch_size`` x ``samples_per_prompt`` completions per call) and the reward model (TRL's
RewardTrainer: a float32 sequence classifier trained on micro-batches of ``train.micro_batch_size`` pairs with
gradient checkpointing and accumulation; its held-out accuracy in float32, 64 pairs a forward).

**Generation backend** (``generation.backend``, :mod:`bench.systems.memory_vllm`): with ``vllm`` the generation,
evaluation and sample-pool phases hold an in-process vLLM engine's share of the device (ceil(gpu_memory_utilization
x device memory) on a GPU, vLLM's own sizing rule: its weights copy in model.dtype, its profile activations and the
rest as a preallocated KV cache) instead of HF generate's DynamicCache and sampling logits; the phases between
keep its weights and KV cache, except the suite engine's update and optimizer step on CUDA, where it sleeps.

**Outside PyTorch's allocator** (``outside_allocator``): the CUDA context (about 0.5 GiB) and, with several GPUs,
NCCL's buffers (about 0.5 GiB): nvml-process sees them, cuda-allocated does not. ``peak_bytes`` is the allocator's
peak (compare with cuda-allocated); ``device_peak_bytes`` adds these, and ``fits`` asks whether that fits the GPU.

**Several GPUs** (``Layout``, ``layout_memory``; Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv:1910.02054, section 5). Every layout splits the rollout
(prompts x G; DPO's pairs) over the N GPUs, each running micro-batches of the same size on its share:

- ``dp``, plain data parallelism (DDP): every GPU holds every network as on one GPU (the precision policy above),
  plus DDP's bucket copy of the gradients (``gradient_as_bucket_view`` off, in the engine's DDP and accelerate's).
- ``zero1`` / ``zero2`` / ``zero3``, TRL's trainers (grpo, dpo): DeepSpeed's mixed precision, which is how
  accelerate hands TRL's trained network to DeepSpeed: under bf16 the module is cast to bf16 (2 bytes a parameter,
  no autocast casts, a bf16 residual), its gradients are bf16, and the float32 master weights (4 bytes a trained
  parameter) live with AdamW's moments in the optimizer's partition — 16 bytes a trained parameter, as on one
  GPU. ZeRO-1 shards the optimizer state and the master weights over the N GPUs, ZeRO-2 the gradients too, ZeRO-3
  the weights too, and then gathers the weights of the module it computes in (one decoder layer, or the
  embedding / LM head) plus the next one prefetched: 2 x the largest module (``gathered_weights``). Frozen networks
  (reference, reward model) are replicated below ZeRO-3 and sharded under it (TRL's ``prepare_deepspeed`` runs them
  in a stage-0 engine below stage 3). DeepSpeed keeps its gradient partitions between steps. TRL's GRPO gathers
  the whole policy on every GPU to generate under ZeRO-3 (``ds3_gather_for_generation``, default true): a
  generation term of the full bf16 actor.
- ``zero1`` / ``zero2`` / ``zero3``, the suite's engine (ENGINE_METHODS; baselines.rollout_engine under
  ``bench.config.launcher.engine_zero``): the actor and PPO's critic, each with its torch AdamW, go through
  ``deepspeed.initialize`` with no bf16 section, so the modules keep their storage (float32; a LoRA base bf16) and
  their gradients are float32; the suite's bf16 autocast runs the forwards, so the autocast casts are those of one
  GPU. DeepSpeed still clones this GPU's partition of the trained weights into a float32 master copy for the
  optimizer (ZeRO-1/2's ``single_partition_of_fp32_groups``, ZeRO-3's ``fp32_partitioned_groups_flat``:
  ``.clone().float()``, a copy even of float32 weights), so a trained parameter costs 4 (weights) + 4 (gradients)
  + 4 (master) + 8 (moments) = 20 bytes in all, of which ZeRO-1 shards the master and the moments, ZeRO-2 the
  gradients too, ZeRO-3 the weights too, with 2 x the largest module gathered in float32. The design note stands:
  the reference and the reward model stay whole on every rank at every stage (the engine does not hand them to
  DeepSpeed), and under ZeRO-3 the engine generates inside ``deepspeed.zero.GatheredParameters`` of the whole
  actor: a generation term of the full float32 actor (``gathered_actor``). Under stage 0 the engine runs DDP.
- ``zero3_what_if`` (engine methods only, labelled a what-if, not what the engine does): the alternative verl and
  OpenRLHF use — the frozen networks sharded under ZeRO-3 like the trained ones (or run as DeepSpeed inference
  engines) and generation from a bf16 gather of the actor (a bf16 residual and K cache, nothing to cast).
  It also evaluates from that bf16 gather (no whole float32 copies). ``bench estimate`` shows its GPU count beside
  the engine's (``--what-if --gpus N``: one count).
- ``zero3_offload``: ZeRO-3 with the optimizer (master weights, moments, a float32 gradient partition) and the
  weights offloaded to CPU memory (``offload_optimizer`` / ``offload_param``: cpu). The GPU keeps the gathered
  modules and the per-phase terms; the offloaded bytes are reported as host memory, summed over the ranks. The
  suite's engine keeps its torch AdamW for the offloaded step (``zero_force_ds_cpu_optimizer`` false: the same
  host bytes) and its frozen networks whole on the GPU. ``Layout`` also takes optimizer offload alone (ZeRO-1
  to 3).

The per-phase terms keep the suite's policy (float32 residual stream, float32 K cache) under DeepSpeed for the
engine's float32 modules. DeepSpeed's own communication buckets (the gradient reduce bucket, ZeRO-3's prefetch
bucket and small persistent parameters) and the allocator's cache and fragmentation are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.systems.memory_layouts import LayoutMemory, layout_memory
from bench.systems.memory_phases import update_activations
from bench.systems.memory_stages import StagePrediction, stages_for
from bench.systems.memory_vllm import reservation
from bench.systems.memory_terms import (ENGINE_METHODS, GIB, LAYOUTS, METHOD_ROLES, Layout, NetworkMemory, Settings,
                                        Shape, network_memory, roles_for)

MAX_GPUS = 4096
"""Largest GPU count searched for the data-parallel and ZeRO-3 answers."""

WHAT_IF = "zero3_what_if"
"""The engine's what-if layout (``Layout.what_if_engine``): frozen networks sharded, generation gathered in bf16."""
WHAT_IF_LABEL = ("what-if, not what the engine does: ZeRO-3 with the reference and reward model sharded too and "
                 "generation from a bf16 gather of the actor (verl / OpenRLHF)")


@dataclass
class Prediction:
    """The model's answer for one (shape, method, settings)."""

    method: str
    model: str
    parameters: int
    settings: Settings
    networks: dict[str, NetworkMemory]
    static_bytes: int
    """The static accounting: weights, gradients and AdamW state of every resident network (exact)."""
    resident_bytes: int
    """What stays resident between steps: ``static_bytes`` less TRL's freed gradients."""
    phases: dict[str, dict[str, int]]
    """phase -> {term: bytes} on top of ``resident_bytes`` (the phase's largest moment); each has a 'total'."""
    moments: dict[str, dict[str, dict[str, int]]]
    """phase -> moment -> {term: bytes}: every moment of every phase (bench.systems.memory_phases)."""
    activations_bytes: dict[str, int]
    """Saved activations of the trained networks per micro-batch: {'checkpointing', 'no_checkpointing'}."""
    kv_cache_bytes: int
    logits_bytes: int
    """Logit memory of one update micro-batch at its largest (the engine's logits, their gradient and float32
    chunks; TRL's fused-head tiles and float32 gradient buffers)."""
    peak_bytes: int
    """The allocator's peak: resident + the largest phase (compare with cuda-allocated)."""
    peak_phase: str
    peak_moment: str
    outside_allocator: dict[str, int]
    """Device memory outside PyTorch's allocator: the CUDA context (and NCCL's buffers on several GPUs)."""
    fits: bool
    """``device_peak_bytes`` fits ``settings.gpu_memory_bytes``."""
    max_micro_batch: int
    """Largest micro-batch (sequences; DPO pairs) whose peak fits gpu_memory (0: none)."""
    gpus_data_parallel: int | None
    """GPUs needed when each holds every network and a share of the rollout (None: never fits)."""
    gpus_zero3: int | None
    """GPUs needed with weights, gradients and optimizer state sharded (ZeRO-3); None: not within MAX_GPUS."""
    gpus: dict[str, int | None] = field(default_factory=dict)
    """Layout name (LAYOUTS: dp, zero1, zero2, zero3, zero3_offload) -> the fewest GPUs on which it fits (None:
    never / not within MAX_GPUS)."""
    gpus_memory: dict[str, "LayoutMemory | None"] = field(default_factory=dict)
    """Layout name -> its per-GPU memory at that fewest count (None where it never fits)."""
    layout: "LayoutMemory | None" = None
    """The layout asked for (``predict(..., layout=Layout(...))``), or None."""
    stages: dict[str, StagePrediction] = field(default_factory=dict)
    """The stages the method reads (sample_pool, reward_model), each predicted on one GPU."""
    what_if: dict[str, Any] = field(default_factory=dict)
    """Engine methods: {WHAT_IF: {'label', 'gpus', 'memory'}}, the sharded-frozen, bf16-gather alternative."""
    notes: list[str] = field(default_factory=list)
    vllm: dict[str, Any] | None = None
    """With ``generation.backend: vllm``: the engine's reservation (bench.systems.memory_vllm.VllmReservation's
    terms, its KV cache's capacity, whether it sleeps during the update, why it could not start); None with
    transformers."""

    @property
    def device_peak_bytes(self) -> int:
        """The peak plus what the allocator does not see: what the GPU must hold."""
        return self.peak_bytes + sum(self.outside_allocator.values())

    def to_json(self) -> dict[str, Any]:
        """Plain data: what `bench estimate --json` prints and a sweep stores beside each measurement."""
        return {
            "method": self.method, "model": self.model, "parameters": self.parameters,
            "settings": asdict(self.settings),
            "static_bytes": self.static_bytes, "resident_bytes": self.resident_bytes, "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase, "peak_moment": self.peak_moment,
            "peak_telemetry_phase": "update" if self.peak_phase == "optimizer_step" else self.peak_phase,
            "outside_allocator": self.outside_allocator, "device_peak_bytes": self.device_peak_bytes,
            "gpu_memory_bytes": self.settings.gpu_memory_bytes, "fits": self.fits,
            "max_micro_batch": self.max_micro_batch, "gpus_data_parallel": self.gpus_data_parallel,
            "gpus_zero3": self.gpus_zero3, "gpus": self.gpus,
            "gpus_memory": {k: (m.to_json() if m else None) for k, m in self.gpus_memory.items()},
            "layout": self.layout.to_json() if self.layout else None,
            "networks": {role: {**asdict(n), "static_bytes": n.static_bytes} for role, n in self.networks.items()},
            "phases": self.phases, "moments": self.moments, "activations_bytes": self.activations_bytes,
            "kv_cache_bytes": self.kv_cache_bytes, "logits_bytes": self.logits_bytes,
            "stages": {name: stage.to_json() for name, stage in self.stages.items()},
            "what_if": {name: {"label": w["label"], "gpus": w["gpus"],
                               "memory": w["memory"].to_json() if w["memory"] else None}
                        for name, w in self.what_if.items()},
            "generation_backend": self.settings.generation_backend, "vllm": self.vllm,
            "notes": self.notes,
        }


def predict(shape: Shape | dict[str, Any], method: str, settings: Settings | None = None,
            model: str = "custom", layout: Layout | None = None) -> Prediction:
    """Static bytes per network (exact), per-phase bytes, the peak and its phase on one GPU, what fits
    ``settings``'s GPU, the fewest GPUs of that size in every layout (LAYOUTS) and, when ``layout`` is given, the
    per-GPU memory and largest micro-batch there; the stages the method reads; for the engine's methods the
    ZeRO-3 what-if.

    ``shape``: a Shape or config.json shape fields; ``method``: a key of METHOD_ROLES (ValueError otherwise).
    """
    s = settings or Settings()
    sh = shape if isinstance(shape, Shape) else Shape.from_fields(shape)
    roles = roles_for(method, s)
    nets = {role: network_memory(sh, role, s) for role in roles}
    static = sum(n.static_bytes for n in nets.values())
    one = layout_memory(sh, method, s, Layout())
    mb = s.micro_sequences(method)
    acts = {"checkpointing": update_activations(sh, method, s, nets, mb, True),
            "no_checkpointing": update_activations(sh, method, s, nets, mb, False)}
    kv = one.phases.get("generation", {}).get("kv_cache", 0)
    engine = None
    if s.generation_backend == "vllm":
        r = reservation(sh, method, s)
        kv = max(0, r.kv_cache_bytes)
        engine = r.to_json(s.prompt_tokens, s.completion_tokens)
    logits = max((sum(v for k, v in terms.items() if "logit" in k or "fused_head" in k)
                  for terms in one.moments["update"].values()), default=0)
    gpus = {name: gpus_for_layout(sh, method, s, name) for name in LAYOUTS}
    at_count = {name: layout_memory(sh, method, s, Layout.named(name, n)) if n else None for name, n in gpus.items()}
    asked = None
    if layout is not None:
        asked = layout_memory(sh, method, s, layout)
        asked.max_micro_batch = max_micro_batch(sh, method, s, layout)
    what_if: dict[str, Any] = {}
    notes = ["static terms exact; per-phase terms approximate (no allocator cache or fragmentation; the CUDA context "
             "and NCCL buffers as their own terms)"]
    if method in ENGINE_METHODS:
        count = gpus_for_layout(sh, method, s, WHAT_IF)
        what_if[WHAT_IF] = {"label": WHAT_IF_LABEL, "gpus": count,
                            "memory": layout_memory(sh, method, s, Layout.named(WHAT_IF, count)) if count else None}
        notes.append("ZeRO layouts: the suite's engine under DeepSpeed (fp32 actor and critic modules under its own "
                     "bf16 autocast, DeepSpeed's fp32 master partition; reference and reward model whole on every "
                     "GPU; ZeRO-3 generates inside a gather of the whole fp32 actor); communication buckets not "
                     "modelled")
    else:
        notes.append("ZeRO layouts: DeepSpeed's mixed precision (bf16 modules, fp32 master weights in the optimizer "
                     "partition); communication buckets not modelled")
    if engine is not None:
        notes.append(vllm_note(method, s, engine))
    if method not in ENGINE_METHODS and method != "dpo" and s.ds3_gather_for_generation:
        notes.append("under ZeRO-3 TRL's GRPO gathers the whole policy on every GPU to generate "
                     "(ds3_gather_for_generation=false avoids it, generating slower)")
    return Prediction(
        method=method, model=model, parameters=sh.parameters(), settings=s, networks=nets, static_bytes=static,
        resident_bytes=one.static["total"], phases=one.phases, moments=one.moments, activations_bytes=acts,
        kv_cache_bytes=kv, logits_bytes=logits, peak_bytes=one.peak_bytes, peak_phase=one.peak_phase,
        peak_moment=one.peak_moment, outside_allocator=one.outside_allocator or {}, fits=one.fits,
        max_micro_batch=max_micro_batch(sh, method, s), gpus_data_parallel=gpus["dp"],
        gpus_zero3=gpus["zero3"], gpus=gpus, gpus_memory=at_count, layout=asked,
        stages=stages_for(sh, method, s), what_if=what_if, notes=notes, vllm=engine)


def vllm_note(method: str, s: Settings, engine: dict[str, Any]) -> str:
    """One line on the vLLM engine's reservation: when it is held and what its KV cache holds."""
    return (f"generation backend vllm: its own weights copy, profile activations and a preallocated KV cache "
            f"of {engine['kv_tokens']:,} tokens ({engine['sequences_held']:,} sequences of {s.prompt_tokens} + "
            f"{s.completion_tokens}); {vllm_when(method, s, engine['sleeps'])}; activations approximate, CUDA "
            f"graphs not modelled")


def vllm_when(method: str, s: Settings, sleeps: bool) -> str:
    """When the vLLM engine holds its share: DPO's only to evaluate; else released in the update or held."""
    if method == "dpo":
        return "started for the evaluation only (DPO trains on the pool's pairs)"
    if sleeps:
        return "released during the update and optimizer step (sleep mode, level 1: weights to host memory)"
    why = "no sleep mode on a CPU" if s.device == "cpu" else "TRL's colocated engine starts without sleep mode"
    return f"held through the update ({why})"


def max_micro_batch(shape: Shape, method: str, s: Settings, layout: Layout | None = None) -> int:
    """Largest micro-batch (sequences; DPO pairs) whose predicted per-GPU peak fits ``s.gpu_memory_bytes`` in
    ``layout`` (default: one GPU); 0: none."""
    layout = layout or Layout()
    # Past this GPU's share of the step a larger micro-batch changes nothing.
    limit = max(1, math.ceil(s.sequences_per_step(method) / ((2 if method == "dpo" else 1) * layout.gpus)))
    best = 0
    lo, hi = 1, limit  # the peak grows with the micro-batch: binary search
    while lo <= hi:
        mid = (lo + hi) // 2
        if layout_memory(shape, method, replace(s, micro_batch_size=mid), layout).fits:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def gpus_for_layout(shape: Shape, method: str, s: Settings, name: str) -> int | None:
    """Fewest GPUs on which ``method`` fits in layout ``name`` (LAYOUTS, or WHAT_IF); None when none up to MAX_GPUS
    does (plain DP stops at one sequence per GPU: past that nothing shrinks)."""
    most = s.sequences_per_step(method) if name == "dp" else MAX_GPUS
    return _smallest_count(lambda n: layout_memory(shape, method, s, Layout.named(name, n)).device_peak_bytes,
                           s.gpu_memory_bytes, most)


def gpus_data_parallel(shape: Shape, method: str, s: Settings) -> int | None:
    """GPUs needed under plain data parallelism: every GPU holds every network, the rollout and micro-batch are
    split. None when even one sequence per GPU does not fit (the static terms alone may exceed the GPU)."""
    return gpus_for_layout(shape, method, s, "dp")


def gpus_zero3(shape: Shape, method: str, s: Settings) -> int | None:
    """GPUs needed under ZeRO-3 (weights, gradients, optimizer state sharded; rollout split); None past MAX_GPUS."""
    return gpus_for_layout(shape, method, s, "zero3")


def _smallest_count(peak_at: Any, limit: int, most: int) -> int | None:
    """Smallest n in 1..most with peak_at(n) <= limit (peaks fall as n grows; doubling then bisection)."""
    if peak_at(1) <= limit:
        return 1
    hi = 2
    while hi < most and peak_at(hi) > limit:
        hi *= 2
    hi = min(hi, most)
    if hi < 2 or peak_at(hi) > limit:
        return None
    lo = hi // 2 + 1 if hi > 2 else 2
    while lo < hi:
        mid = (lo + hi) // 2
        if peak_at(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return hi


# ----------------------------------------------------------------------------------------------
# From a spec


def settings_from_spec(spec: Any, method: str, gpu_memory_bytes: int = 80 * GIB, prompt_tokens: int = 256) -> Settings:
    """Settings of a ``bench.config.spec.Spec`` for ``method`` (its own KL coefficient when it declares one)."""
    t, cfg = spec.train, spec.methods.get(method)
    own = getattr(cfg, "beta", None) if method in ("grpo", "grpo_engine") else getattr(cfg, "kl_coef", None)
    return Settings(dtype=spec.model.dtype, micro_batch_size=t.micro_batch_size, prompt_tokens=prompt_tokens,
                    completion_tokens=spec.generation.max_new_tokens,
                    fixed_length=bool(spec.generation.min_new_tokens), group_size=t.group_size,
                    prompts_per_step=t.prompts_per_step, gradient_checkpointing=t.gradient_checkpointing,
                    lora_rank=t.lora.r if t.lora.enabled else 0, kl_beta=t.kl_beta if own is None else own,
                    lora_critic=t.lora.critic, device="cpu" if spec.device == "cpu" else "cuda",
                    reward_model_pairs=spec.reward_model.batch_size, pool_batch_size=spec.sample_pool.batch_size,
                    pool_samples=spec.sample_pool.samples_per_prompt, evaluation=spec.eval.enabled,
                    eval_batch_size=spec.eval.batch_size, eval_completion_tokens=spec.eval.max_new_tokens,
                    gpu_memory_bytes=gpu_memory_bytes, generation_backend=spec.generation.backend,
                    vllm_gpu_memory_utilization=spec.generation.vllm_gpu_memory_utilization,
                    vllm_cpu_kv_cache_gib=spec.generation.vllm_cpu_kv_cache_gib)


def shape_fields_from_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """(model name, shape fields) of the network a spec trains: a shipped architecture (scaled), the tiny model
    (its vocabulary is the tokenizer's upper bound, so the embedding may be over-counted), a local folder's
    config.json, or a hub id whose shapes ship (Qwen/Qwen2.5-0.5B-Instruct -> qwen2.5-0.5b). Raises
    bench.errors.UserError when the shape cannot be known offline."""
    import json
    from pathlib import Path

    from bench.errors import UserError

    m = spec.model
    if m.source == "architecture":
        from bench.config.architectures import scaled_fields

        return m.architecture, scaled_fields(m.architecture, m.scale)
    if m.source == "tiny":
        t = m.tiny  # vocab_size is the tokenizer's upper bound: the embedding has at most that many rows
        return "tiny", {"model_type": "qwen2", "hidden_size": t.hidden_size, "num_hidden_layers": t.num_layers,
                        "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_heads,
                        "intermediate_size": t.intermediate_size, "vocab_size": t.vocab_size,
                        "tie_word_embeddings": True}
    config = Path(str(m.name_or_path)) / "config.json"
    if config.is_file():
        return str(m.name_or_path), json.loads(config.read_text(encoding="utf-8"))
    shipped = shipped_architecture_for(str(m.name_or_path))
    if shipped is not None:
        from bench.config.architectures import architecture_fields

        return shipped, architecture_fields(shipped)
    raise UserError(f"the memory model needs the shape of '{m.name_or_path}' offline; use model.source=architecture "
                    f"or a local folder with a config.json")


def shipped_architecture_for(hub_id: str) -> str | None:
    """The shipped architecture whose ``source`` names ``hub_id`` (base or -Instruct: the same shapes), or None."""
    from bench.config.architectures import architecture_fields, architecture_names

    wanted = hub_id.strip().lower().removesuffix("-instruct")
    for name in architecture_names():
        source = str(architecture_fields(name).get("source", "")).split()[0].lower()
        if source.removesuffix("-instruct") == wanted:
            return name
    return None


def predict_for_spec(spec: Any, method: str, gpu_memory_bytes: int = 80 * GIB, prompt_tokens: int = 256) -> Prediction:
    """The prediction for one method of a ``bench.config.spec.Spec`` (a sweep stores it beside each measurement).

    ``method`` is a registry name (ppo, ppo_verifier, grpo, grpo_engine, dpo); ``prompt_tokens`` the padded
    prompt length (the spec does not fix it: it comes from the data).
    """
    name, fields = shape_fields_from_spec(spec)
    like = method if method in METHOD_ROLES else modelled_as(spec, method)
    prediction = predict(fields, like, settings_from_spec(spec, method, gpu_memory_bytes, prompt_tokens), model=name)
    if like != method:
        prediction.method = method
        prediction.notes.append(f"{method} is modelled as {like} (same engine and resident networks)")
    return prediction


def modelled_as(spec: Any, method: str) -> str:
    """The known method a registered recipe's run is modelled as, from its declared engine and networks (e.g. the
    control arm, the engine's GRPO at learning rate 0, is grpo_engine). Imports the recipe (torch): worker use."""
    from bench.config.registry import recipe

    module = recipe(method)
    roles = tuple(module.networks(spec, spec.methods[method]))
    if "critic" in roles:
        return "ppo" if "reward" in roles else "ppo_verifier"
    return "grpo_engine" if module.ENGINE == "suite" else "grpo"
