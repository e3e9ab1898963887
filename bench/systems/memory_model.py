"""The analytical memory model: what PPO, GRPO and DPO hold on one GPU, from a model's shape alone.

Pure Python (no torch, no transformers): ``bench estimate`` answers in well under a second and the report can
set predictions beside measurements anywhere. All sizes are bytes.

Two kinds of terms:

- **Static, exact** (checked against ``bench.telemetry.accounting`` on real modules in tests/test_memory_model.py):
  per network, weights, gradients and AdamW state under the precision policy (``bench.model.precision``): trained
  networks (actor, critic) are stored in float32 — those ARE the master weights, there is no second copy — with
  float32 gradients and two float32 moments plus a 4-byte ``step`` tensor per parameter tensor; frozen networks
  (reference, reward model) are stored in the spec's dtype. The critic is the backbone without the LM head plus a
  float32 value head (hidden -> 1, with bias); the reward model is the backbone plus a ``score`` row (hidden -> 1,
  no bias). With LoRA (peft ``all-linear``: every linear layer but the LM head, r x (in + out) each) only the
  adapters are trained and the reference is the actor's base with adapters off (no bytes of its own). The base of
  a trained network keeps the trained storage (float32: the suite loads the policy and the critic that way); PPO's
  critic gets its own adapters on its own frozen backbone and a trained value head (``lora_critic``), or is
  trained in full.
- **Per-phase, approximate**: what a step adds on top of the static terms, in each phase the telemetry names
  (generation, reward, reference, critic, update):

  * bf16 working copies of trained weights: under bf16 autocast, ``torch.autocast`` caches a bf16 cast of every
    float32 leaf weight that requires grad a matmul uses (2 bytes x linear weights, LM head included) for the
    whole autocast region — a forward — whether or not gradients are on. A frozen weight (a LoRA base) is cast
    anew at every use and the cast freed, unless the matmul saves it for backward: in the update every frozen
    linear of a LoRA network whose input needs a gradient keeps its bf16 cast (all of them without gradient
    checkpointing; one layer's and the LM head's with it: ``frozen_weight_casts``). Generation differs by engine
    (``generation_weight_casts``): the suite's engine samples with the cache off, so only the one weight being
    multiplied has a transient bf16 cast (the largest: 2 x the LM head); TRL's trainers run each decoding forward
    in its own cached autocast region (accelerate wraps ``forward``), so the whole copy is there at its end.
  * activations saved for backward per micro-batch, per token per layer (Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, section 4: count the
    tensors each op saves for its backward pass), adapted to the Hugging Face Llama / Qwen2 layer as the suite
    runs it: RMSNorm computes in float32 and saves its input and normalised output (4 x r x h for two norms,
    r = 4: the residual stream is float32 because trained weights are); under autocast every linear saves its
    own bf16 cast of its input (q, k, v, gate, up: 5 x a x h; in float32 the two norm outputs, 2 x r x h);
    attention saves q and the K/V repeated to every query head (HF repeats K/V when a padding mask is passed),
    its output, and a float32 logsumexp per head (4 x a x hq + 4 x heads; a fused SDPA kernel, so no s x s
    scores — Korthikanti's 5as/h term is gone); the SwiGLU MLP saves gate, SiLU(gate), up and their product
    (4 x a x I); no dropout (the suite disables it). a = 2 under bf16 autocast, 4 in float32. With gradient
    checkpointing (HF wraps each decoder layer) only each layer's input is kept (r x h per token per layer), and
    one layer's full set is rebuilt during the backward pass (Korthikanti's "full recomputation", 2sbhL).
    Transient gradient buffers, allocator fragmentation and the CUDA context are not modelled.
  * KV cache during generation: layers x kv_heads x head_dim x (4 + a) bytes per token (K is float32: RoPE
    promotes it to the fp32 residual's dtype; V is the projection's a bytes), for every
    sequence of the rollout (prompts_per_step x G, prompt + completion tokens), plus float32 next-token logits
    (logits, processed scores, probabilities: 3 x 4 x V per sequence) and the prefill's working set of one layer.
  * logits per micro-batch (`logit_bytes`): V x tokens x a for the LM head's output, its gradient in the
    update, and the float32 upcast for log-softmax where an implementation makes one (one sequence at a time in
    the suite's engine; TRL's GRPO takes a row-by-row log-softmax in the compute dtype; TRL's DPO a fused,
    tiled LM head). Online methods score only the completion positions (``logits_to_keep``).

  * the optimizer step (``optimizer_step``; the telemetry counts it in ``update``): torch's AdamW defaults to its
    foreach implementation on GPU, which holds one parameter-sized float32 buffer for the whole optimizer while it
    steps (measured on CPU with foreach=True: +1.00 x the parameter bytes at the step's peak).

The peak is the static total plus the largest phase. The suite's engine keeps gradients from one step to the next
(it zeroes them at the start of the update), so they count in every phase; TRL's Trainer frees them after each
optimizer step, so for TRL methods every phase but the update carries a negative ``gradients_freed`` term.

**Several GPUs** (``Layout``, ``layout_memory``; Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv:1910.02054, section 5). Every layout splits the rollout
(prompts x G; DPO's pairs) over the N GPUs, each running micro-batches of the same size on its share:

- ``dp``, plain data parallelism (DDP): every GPU holds every network as on one GPU (the precision policy above).
- ``zero1`` / ``zero2`` / ``zero3``, TRL's trainers (grpo, dpo): DeepSpeed's mixed precision, which is how
  accelerate hands TRL's trained network to DeepSpeed: under bf16 the module is cast to bf16 (2 bytes a parameter,
  no autocast casts), its gradients are bf16, and the float32 master weights (4 bytes a trained parameter) live
  with AdamW's moments in the optimizer's partition — 16 bytes a trained parameter, as on one GPU. ZeRO-1 shards
  the optimizer state and the master weights over the N GPUs, ZeRO-2 the gradients too, ZeRO-3 the weights too,
  and then gathers the weights of the module it computes in (one decoder layer, or the embedding / LM head) plus
  the next one prefetched: 2 x the largest module (``gathered_weights``). Frozen networks (reference, reward model)
  are replicated below ZeRO-3 and sharded under it (TRL's ``prepare_deepspeed`` runs them in a stage-0 engine below
  stage 3). DeepSpeed keeps its gradient partitions between steps (no ``gradients_freed``), and the optimizer's
  foreach buffer is the size of this GPU's partition. TRL's GRPO gathers the whole policy on every GPU to
  generate under ZeRO-3 (``ds3_gather_for_generation``, default true): a generation term of the full bf16 actor.
- ``zero1`` / ``zero2`` / ``zero3``, the suite's engine (ENGINE_METHODS; baselines.rollout_engine under
  ``bench.config.launcher.engine_zero``): the actor and PPO's critic, each with its torch AdamW, go through
  ``deepspeed.initialize`` with no bf16 section, so the modules stay float32 (4 bytes a parameter) and their
  gradients are float32; the suite's bf16 autocast runs the forwards, so the autocast casts are those of one GPU
  (working copies, the engine's one transient cast in generation, a LoRA base's saved casts). DeepSpeed still
  clones this GPU's partition of the trained weights into a float32 master copy for the optimizer (ZeRO-1/2's
  ``single_partition_of_fp32_groups``, ZeRO-3's ``fp32_partitioned_groups_flat``: ``.clone().float()``, a copy
  even of float32 weights), so a trained parameter costs 4 (weights) + 4 (gradients) + 4 (master) + 8 (moments)
  = 20 bytes in all, of which ZeRO-1 shards the master and the moments, ZeRO-2 the gradients too, ZeRO-3 the
  weights too (a LoRA network's frozen base included: ZeRO-3 partitions every parameter of the module it is
  given), with 2 x the largest module gathered in float32. The reference and the reward model stay whole on
  every rank at every stage (the engine does not hand them to DeepSpeed). Under ZeRO-3 the engine generates
  inside ``deepspeed.zero.GatheredParameters`` of the whole actor: a generation term of the full float32 actor
  (``gathered_actor``; the gather allocates whole tensors beside this GPU's shard, which it keeps). Under stage 0
  the engine runs DDP: ``dp``.
- ``zero3_offload``: ZeRO-3 with the optimizer (master weights, moments, a float32 gradient partition) and the
  weights offloaded to CPU memory (``offload_optimizer`` / ``offload_param``: cpu). The GPU keeps the gathered
  modules and the per-phase terms; the offloaded bytes are reported as host memory, summed over the ranks. The
  suite's engine keeps its torch AdamW for the offloaded step (``zero_force_ds_cpu_optimizer`` false: the same
  host bytes) and its frozen networks whole on the GPU. ``Layout`` also takes optimizer offload alone (ZeRO-1
  to 3).

The per-phase terms keep the suite's policy (float32 residual stream, float32 K cache) under DeepSpeed too: what
the suite's engine runs, an upper bound for TRL's bf16 modules. DeepSpeed's communication buckets (the gradient
reduce bucket, ZeRO-3's prefetch bucket and small persistent parameters) and the CUDA context are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

GIB = 2 ** 30
"""Bytes in a GiB."""

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each storage or compute dtype."""

ADAM_MOMENTS = 2
"""AdamW keeps exp_avg and exp_avg_sq, each the size (and dtype) of the parameter."""

ADAM_STEP_BYTES = 4
"""torch's AdamW keeps a float32 scalar ``step`` tensor per parameter tensor (bytes)."""

METHOD_ROLES: dict[str, tuple[str, ...]] = {
    "ppo": ("actor", "critic", "reward", "reference"),
    "ppo_verifier": ("actor", "critic", "reference"),
    "grpo": ("actor", "reference"),
    "grpo_engine": ("actor", "reference"),
    "dpo": ("actor", "reference"),
}
"""Networks each method keeps resident (baselines/*.py ``networks``) with a KL coefficient > 0; with kl_beta 0
the online methods drop the reference."""

ENGINE_METHODS = ("ppo", "ppo_verifier", "grpo_engine")
"""Methods on the suite's engine: log-softmax upcast one sequence at a time; under ZeRO float32 trained modules,
whole frozen networks and, under ZeRO-3, generation in a gather of the whole actor (the rest are TRL trainers)."""

TRAINED_ROLES = ("actor", "critic")
"""Roles an optimizer updates (bench.model.precision.TRAINED_ROLES)."""

MAX_GPUS = 4096
"""Largest GPU count searched for the data-parallel and ZeRO-3 answers."""


# ----------------------------------------------------------------------------------------------
# Shapes


@dataclass(frozen=True)
class Shape:
    """The fields of a decoder-only Llama / Qwen2 model that fix its memory."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool
    head_dim: int
    qkv_bias: bool = False
    """Biases on q, k and v (Qwen2 always; Llama with attention_bias)."""
    o_bias: bool = False
    """Bias on the output projection (Llama with attention_bias)."""
    mlp_bias: bool = False
    """Biases on gate, up and down (Llama with mlp_bias)."""

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> "Shape":
        """From config.json shape fields (bench/config/architectures/*.json, or `bench.config.architectures.scaled_fields`)."""
        model_type = f.get("model_type", "qwen2")
        head_dim = int(f.get("head_dim") or f["hidden_size"] // f["num_attention_heads"])
        return cls(layers=int(f["num_hidden_layers"]), hidden=int(f["hidden_size"]),
                   intermediate=int(f["intermediate_size"]), heads=int(f["num_attention_heads"]),
                   kv_heads=int(f.get("num_key_value_heads") or f["num_attention_heads"]),
                   vocab=int(f["vocab_size"]), tied_embeddings=bool(f.get("tie_word_embeddings")),
                   head_dim=head_dim, qkv_bias=model_type == "qwen2" or bool(f.get("attention_bias")),
                   o_bias=model_type != "qwen2" and bool(f.get("attention_bias")), mlp_bias=bool(f.get("mlp_bias")))

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_linears(self) -> list[tuple[int, int]]:
        """(in, out) of each linear layer in one decoder layer: q, k, v, o, gate, up, down."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def layer_tensors(self) -> list[int]:
        """Element counts of one decoder layer's parameter tensors (weights, biases, two norm vectors)."""
        tensors = [n_in * n_out for n_in, n_out in self.layer_linears()]
        if self.qkv_bias:
            tensors += [self.q_width, self.kv_width, self.kv_width]
        if self.o_bias:
            tensors.append(self.hidden)
        if self.mlp_bias:
            tensors += [self.intermediate, self.intermediate, self.hidden]
        return tensors + [self.hidden, self.hidden]

    def backbone_tensors(self) -> list[int]:
        """Element counts of the backbone's parameter tensors: embedding, layers, final norm (no head)."""
        return [self.vocab * self.hidden] + self.layer_tensors() * self.layers + [self.hidden]

    def lm_tensors(self) -> list[int]:
        """The causal LM's tensors: the backbone plus an LM head unless tied to the embedding."""
        return self.backbone_tensors() + ([] if self.tied_embeddings else [self.vocab * self.hidden])

    def parameters(self) -> int:
        """Parameters of the causal LM (equals `bench.config.architectures.parameter_count`)."""
        return sum(self.lm_tensors())

    def linear_weights(self, lm_head: bool) -> int:
        """Elements of every linear weight (what autocast casts to bf16), with the LM head when ``lm_head``."""
        per_layer = sum(n_in * n_out for n_in, n_out in self.layer_linears())
        return per_layer * self.layers + (self.vocab * self.hidden if lm_head else 0)

    def lora_parameters(self, rank: int) -> tuple[int, int]:
        """(elements, tensors) of peft ``all-linear`` adapters of rank ``rank``: A (r x in) and B (out x r) on every
        decoder linear layer, none on the LM head."""
        per_layer = sum(rank * (n_in + n_out) for n_in, n_out in self.layer_linears())
        return per_layer * self.layers, 2 * len(self.layer_linears()) * self.layers


# ----------------------------------------------------------------------------------------------
# Settings and results


@dataclass(frozen=True)
class Settings:
    """What a run does per step. Defaults: the gsm8k-qwen0.5b preset (bench/config/presets/gsm8k-qwen0.5b.yaml)."""

    dtype: str = "bfloat16"
    """spec.model.dtype: 'bfloat16' (bf16 autocast over fp32 master weights; frozen networks bf16) or 'float32'."""
    micro_batch_size: int = 8
    """Sequences per forward/backward (DPO: pairs); 0: the whole step at once."""
    prompt_tokens: int = 256
    """Padded prompt length (tokens); a GSM8K question in a chat template is about 100-250 tokens."""
    completion_tokens: int = 512
    """generation.max_new_tokens (tokens)."""
    group_size: int = 8
    """G: completions per prompt."""
    prompts_per_step: int = 16
    """Prompts per optimizer step (DPO: pairs per step)."""
    gradient_checkpointing: bool = True
    """Keep only each layer's input and recompute the rest in the backward pass."""
    lora_rank: int = 0
    """LoRA rank (0: off, every weight trained)."""
    kl_beta: float = 0.04
    """KL coefficient; 0 loads no reference in the online methods."""
    lora_critic: bool = True
    """With LoRA: PPO's critic trains its own adapters and a value head (train.lora.critic); false: every weight."""
    ds3_gather_for_generation: bool = True
    """TRL GRPO under ZeRO-3 gathers the whole policy on every GPU to generate (GRPOConfig's flag of that name)."""
    gpu_memory_bytes: int = 80 * GIB
    """Memory of one GPU (bytes) for fits, the largest micro-batch and the GPU counts."""

    def sequences_per_step(self, method: str) -> int:
        """Sequences one optimizer step trains on: prompts x G online; 2 x pairs for DPO."""
        return 2 * self.prompts_per_step if method == "dpo" else self.prompts_per_step * self.group_size

    def micro_sequences(self, method: str) -> int:
        """Sequences in one forward/backward pass (DPO: chosen + rejected of each pair)."""
        per_step = self.sequences_per_step(method)
        unit = 2 if method == "dpo" else 1
        return min(per_step, self.micro_batch_size * unit) if self.micro_batch_size else per_step


@dataclass
class NetworkMemory:
    """Static bytes of one resident network under the precision policy (exact)."""

    role: str
    trained: bool
    storage: str
    """dtype the weights are stored in (float32 for trained networks: the master weights)."""
    parameters: int
    """Parameters this role holds (0 for a LoRA reference: it is the actor's base)."""
    trainable_parameters: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    working_copy_bytes: int
    """bf16 casts of the linear weights that autocast caches while this network computes (0 unless trained under
    bf16 autocast; with LoRA the adapters' only, as a frozen base is not cached); counted in the phases it computes
    in, not in the static total."""
    frozen_layer_linears: int = 0
    """Elements of one decoder layer's frozen linear weights in a trained LoRA network: their bf16 casts are saved
    for backward in the update (``frozen_weight_casts``)."""
    frozen_head: int = 0
    """Elements of a trained LoRA network's frozen LM head (0 for the critic, whose value head is trained)."""

    @property
    def static_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


@dataclass
class Prediction:
    """The model's answer for one (shape, method, settings)."""

    method: str
    model: str
    parameters: int
    settings: Settings
    networks: dict[str, NetworkMemory]
    static_bytes: int
    phases: dict[str, dict[str, int]]
    """phase -> {term: bytes} on top of the static total; each has a 'total'."""
    activations_bytes: dict[str, int]
    """Saved activations of the trained networks per micro-batch: {'checkpointing', 'no_checkpointing'}."""
    kv_cache_bytes: int
    logits_bytes: int
    """Logit memory of one update micro-batch (output, its gradient, the fp32 log-softmax upcast)."""
    peak_bytes: int
    peak_phase: str
    fits: bool
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
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain data: what `bench estimate --json` prints and a sweep stores beside each measurement."""
        return {
            "method": self.method, "model": self.model, "parameters": self.parameters,
            "settings": asdict(self.settings),
            "static_bytes": self.static_bytes, "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
            "peak_telemetry_phase": "update" if self.peak_phase == "optimizer_step" else self.peak_phase,
            "gpu_memory_bytes": self.settings.gpu_memory_bytes, "fits": self.fits,
            "max_micro_batch": self.max_micro_batch, "gpus_data_parallel": self.gpus_data_parallel,
            "gpus_zero3": self.gpus_zero3, "gpus": self.gpus,
            "gpus_memory": {k: (m.to_json() if m else None) for k, m in self.gpus_memory.items()},
            "layout": self.layout.to_json() if self.layout else None,
            "networks": {role: {**asdict(n), "static_bytes": n.static_bytes} for role, n in self.networks.items()},
            "phases": self.phases, "activations_bytes": self.activations_bytes,
            "kv_cache_bytes": self.kv_cache_bytes, "logits_bytes": self.logits_bytes, "notes": self.notes,
        }


# ----------------------------------------------------------------------------------------------
# Static terms (exact)


def roles_for(method: str, settings: Settings) -> tuple[str, ...]:
    """Resident networks of ``method``: the reference only with kl_beta > 0 (DPO always has one)."""
    if method not in METHOD_ROLES:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHOD_ROLES)}")
    roles = METHOD_ROLES[method]
    if method != "dpo" and settings.kl_beta <= 0:
        roles = tuple(r for r in roles if r != "reference")
    return roles


def network_memory(shape: Shape, role: str, settings: Settings) -> NetworkMemory:
    """Exact static bytes of one role (see the module docstring for what each network is)."""
    trained = role in TRAINED_ROLES
    storage = "float32" if trained else settings.dtype
    size = DTYPE_BYTES[storage]
    lora = settings.lora_rank > 0 and (role != "critic" or settings.lora_critic)
    if role in ("actor", "reference"):
        tensors = shape.lm_tensors()
    elif role == "critic":
        tensors = shape.backbone_tensors() + [shape.hidden, 1]  # value head weight (1 x h) and bias, float32
    else:  # reward: sequence classification, score row (1 x h), no bias
        tensors = shape.backbone_tensors() + [shape.hidden]
    if role == "reference" and settings.lora_rank > 0:
        return NetworkMemory(role, False, storage, 0, 0, 0, 0, 0, 0)
    base = sum(tensors)
    if not trained:
        return NetworkMemory(role, False, storage, base, 0, base * size, 0, 0, 0)
    autocast = settings.dtype != "float32"
    frozen_layer = frozen_head = 0
    if lora:
        adapters, adapter_tensors = shape.lora_parameters(settings.lora_rank)
        head = [shape.hidden, 1] if role == "critic" else []  # the critic's value head is trained in full
        trainable, trainable_tensors = adapters + sum(head), adapter_tensors + len(head)
        params = base + adapters
        # Autocast caches casts of weights that require grad only: the adapters. The frozen base is cast per use.
        copies = 2 * adapters if autocast else 0
        frozen_layer = sum(n_in * n_out for n_in, n_out in shape.layer_linears())
        frozen_head = shape.vocab * shape.hidden if role == "actor" else 0
    else:
        trainable, trainable_tensors, params = base, len(tensors), base
        # Under bf16 autocast a trained network's linear weights get a cached bf16 copy while it computes.
        copies = 2 * (shape.linear_weights(lm_head=role == "actor")) if autocast else 0
    return NetworkMemory(
        role=role, trained=True, storage=storage, parameters=params, trainable_parameters=trainable,
        weights_bytes=params * size,
        gradients_bytes=trainable * size,
        optimizer_bytes=ADAM_MOMENTS * trainable * size + ADAM_STEP_BYTES * trainable_tensors,
        working_copy_bytes=copies, frozen_layer_linears=frozen_layer, frozen_head=frozen_head)


# ----------------------------------------------------------------------------------------------
# Per-phase terms (approximate)


def activation_bytes_per_token_layer(shape: Shape, dtype: str) -> int:
    """Bytes one token saves for backward in one decoder layer without checkpointing (module docstring)."""
    a, r = DTYPE_BYTES[dtype], 4
    h, hq, i = shape.hidden, shape.q_width, shape.intermediate
    norms = 4 * r * h                                        # two RMSNorms: fp32 input + normalised output
    projection_inputs = 5 * a * h if dtype != "float32" else 2 * r * h  # per-linear bf16 casts, or shared fp32
    attention = 4 * a * hq + 4 * shape.heads                 # q, repeated K and V, output; fp32 logsumexp
    mlp = 4 * a * i                                          # gate, SiLU(gate), up, product
    return norms + projection_inputs + attention + mlp


def activation_bytes(shape: Shape, dtype: str, tokens: int, checkpointing: bool, head_tokens: int | None = None) -> int:
    """Saved activations of one trained network for ``tokens`` tokens in one forward/backward (approximate).

    ``head_tokens``: positions the LM head reads (``logits_to_keep``; default all). The final RMSNorm saves its
    fp32 input and normalised output for every token; the head's input is a bf16 cast of the kept positions under
    autocast, and in float32 a view that keeps the whole normalised output alive.
    """
    per_layer = activation_bytes_per_token_layer(shape, dtype)
    head_tokens = tokens if head_tokens is None else head_tokens
    head = 4 * shape.hidden * tokens if dtype == "float32" else DTYPE_BYTES[dtype] * shape.hidden * head_tokens
    final_norm = tokens * 2 * 4 * shape.hidden + head
    if checkpointing:  # each layer's fp32 input kept; one layer rebuilt at a time in the backward pass
        return tokens * (shape.layers * 4 * shape.hidden + per_layer) + final_norm
    return tokens * shape.layers * per_layer + final_norm


def forward_working_bytes(shape: Shape, dtype: str, tokens: int) -> int:
    """One layer's transient working set in a no-grad forward (the MLP's three intermediates dominate)."""
    a = DTYPE_BYTES[dtype]
    return tokens * (3 * a * shape.intermediate + a * (shape.q_width + 2 * shape.kv_width) + 2 * 4 * shape.hidden)


FUSED_TILE = (4096, 4096)
"""(tokens, vocabulary entries) of one float32 tile of TRL's fused LM head (trl/kernels/chunked_logprob.py tiles
4,096 tokens; the vocabulary width is the caller's chunk size, assumed 4,096)."""


def logit_bytes(shape: Shape, dtype: str, sequences: int, positions: int, method: str, backward: bool) -> int:
    """Logit memory of ``sequences`` x ``positions`` scored positions in one forward (and backward).

    engine (ppo, grpo_engine): the LM head's output (a bytes, kept for backward), its gradient of the same size,
    and a float32 copy plus probabilities of one sequence at a time (baselines.rl_math._TokenLogprobs).
    TRL GRPO: the output and the row-by-row log-softmax outputs (a bytes each; trl selective_log_softmax),
    whose gradient replaces them in the backward pass. DPO: TRL 1.16's fused LM head never materialises the
    logits; one float32 tile (FUSED_TILE), twice with the backward pass.
    """
    a = DTYPE_BYTES[dtype]
    tokens = sequences * positions
    if method == "dpo":
        return 4 * FUSED_TILE[0] * min(FUSED_TILE[1], shape.vocab) * (2 if backward else 1)
    if method in ENGINE_METHODS:
        return shape.vocab * (tokens * a * (2 if backward else 1) + 2 * 4 * positions)
    return shape.vocab * tokens * a * 2


def kv_cache_bytes(shape: Shape, dtype: str, sequences: int, tokens: int) -> int:
    """K and V of every layer for ``sequences`` x ``tokens`` while the actor generates under ``dtype``.

    V is the v projection's output (a bytes); K passes through RoPE, whose cos/sin tables take the residual
    stream's dtype, float32 for the fp32-stored actor, so type promotion stores K in float32 even under bf16
    autocast (measured on the HF cache: tests/test_memory_model.py).
    """
    per_token = shape.layers * shape.kv_width * (4 + DTYPE_BYTES[dtype])
    return per_token * sequences * tokens


def _logit_positions(method: str, s: Settings) -> int:
    """Positions per sequence whose logits are scored: whole sequences in DPO, T + 1 online (logits_to_keep)."""
    return s.prompt_tokens + s.completion_tokens if method == "dpo" else s.completion_tokens + 1


def update_activations(shape: Shape, method: str, s: Settings, roles: tuple[str, ...], sequences: int,
                       checkpointing: bool) -> int:
    """Saved activations of every trained network for one micro-batch of ``sequences`` (their heads read the
    scored positions: the actor's LM head and the critic's value head)."""
    compute = "float32" if s.dtype == "float32" else "bfloat16"
    tokens = sequences * (s.prompt_tokens + s.completion_tokens)
    head = sequences * _logit_positions(method, s)
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


def _phases(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory], share: int = 1,
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
    logit_positions = _logit_positions(method, s)
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


def _peak(static: int, phases: dict[str, dict[str, int]]) -> tuple[int, str]:
    phase = max(phases, key=lambda p: phases[p]["total"])
    return static + phases[phase]["total"], phase


# ----------------------------------------------------------------------------------------------
# Layouts over several GPUs


LAYOUTS = ("dp", "zero1", "zero2", "zero3", "zero3_offload")
"""The layouts every prediction answers a GPU count for (``Prediction.gpus``): plain data parallelism, ZeRO
stages 1-3 and ZeRO-3 with optimizer and weights offloaded to the CPU (bench/config/accelerate/*.yaml ship each)."""


@dataclass(frozen=True)
class Layout:
    """How a run spreads over ``gpus`` GPUs: ZeRO ``stage`` (0: plain data parallelism) and what it offloads to CPU
    memory. ValueError on a combination DeepSpeed does not run (the message names the fix)."""

    stage: int = 0
    """0 (plain DP: every GPU holds everything), 1 (optimizer state and master weights sharded), 2 (+ gradients),
    3 (+ weights)."""
    gpus: int = 1
    """GPUs the run spreads over (>= 1)."""
    offload_optimizer: bool = False
    """Master weights, AdamW moments and a float32 gradient partition in CPU memory (ZeRO stage >= 1)."""
    offload_params: bool = False
    """The weights in CPU memory, gathered to the GPU per module (ZeRO-3 only)."""

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.gpus < 1:
            raise ValueError(f"the GPU count must be >= 1, got {self.gpus}")
        if self.offload_optimizer and self.stage < 1:
            raise ValueError("optimizer offload needs ZeRO stage 1, 2 or 3")
        if self.offload_params and self.stage != 3:
            raise ValueError("weight (parameter) offload needs ZeRO stage 3")

    @property
    def name(self) -> str:
        """'dp', 'zero1'..'zero3', 'zero3_offload' (both offloaded) or 'zeroK_offload_optimizer'."""
        if self.stage == 0:
            return "dp"
        if self.offload_params:
            return f"zero{self.stage}_offload" if self.offload_optimizer else f"zero{self.stage}_offload_params"
        return f"zero{self.stage}_offload_optimizer" if self.offload_optimizer else f"zero{self.stage}"

    @classmethod
    def named(cls, name: str, gpus: int = 1) -> "Layout":
        """The layout of a LAYOUTS name on ``gpus`` GPUs."""
        if name not in LAYOUTS:
            raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
        if name == "dp":
            return cls(0, gpus)
        offload = name.endswith("_offload")
        return cls(int(name[4]), gpus, offload_optimizer=offload, offload_params=offload)


@dataclass
class LayoutMemory:
    """Per-GPU memory of one method in one layout."""

    layout: Layout
    static: dict[str, int]
    """Bytes resident on each GPU between steps: weights, gradients, master_weights, optimizer, gathered_weights
    (ZeRO-3's working set of gathered modules) and their total."""
    host_bytes: int
    """CPU memory of the offloaded state, all ranks together (bytes; 0 without offload)."""
    phases: dict[str, dict[str, int]]
    """phase -> {term: bytes} on top of ``static['total']`` on one GPU; each has a 'total'."""
    peak_bytes: int
    peak_phase: str
    fits: bool
    max_micro_batch: int | None = None
    """Largest micro-batch (sequences; DPO pairs) that fits this layout (0: none); None when not searched."""

    def to_json(self) -> dict[str, Any]:
        """Plain data (``Prediction.to_json``'s ``layout`` and ``gpus_memory``)."""
        return {"layout": self.layout.name, **asdict(self.layout), "static": self.static,
                "host_bytes": self.host_bytes, "host_bytes_per_gpu": math.ceil(self.host_bytes / self.layout.gpus),
                "phases": self.phases, "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
                "fits": self.fits, "max_micro_batch": self.max_micro_batch}


def largest_module(shape: Shape) -> int:
    """Elements of the largest module ZeRO-3 gathers at once: a decoder layer, or the embedding / LM head."""
    return max(sum(shape.layer_tensors()), shape.vocab * shape.hidden)


def layout_static(shape: Shape, method: str, s: Settings, nets: dict[str, NetworkMemory],
                  layout: Layout) -> tuple[dict[str, int], int]:
    """(bytes resident on each GPU by kind, bytes offloaded to CPU memory over all ranks) for ``layout``.

    Plain DP: the networks as on one GPU (float32 storage of trained networks is their master copy). ZeRO: a
    float32 master partition beside the trained modules, which are in the spec's dtype for TRL's trainers and
    float32 for the suite's engine, whose frozen networks also stay whole at every stage (module docstring).
    """
    n, stage = layout.gpus, layout.stage
    terms = {"weights": 0, "gradients": 0, "master_weights": 0, "optimizer": 0, "gathered_weights": 0}
    if stage == 0:
        for net in nets.values():
            terms["weights"] += net.weights_bytes
            terms["gradients"] += net.gradients_bytes
            terms["optimizer"] += net.optimizer_bytes
        return {**terms, "total": sum(terms.values())}, 0
    engine = method in ENGINE_METHODS
    module = 4 if engine else DTYPE_BYTES[s.dtype]  # the engine's DeepSpeed config has no bf16 section
    host = 0
    for net in nets.values():
        trained = net.trainable_parameters if net.trained else 0
        weights = net.parameters * module if net.trained else net.weights_bytes
        grads = trained * module
        master = trained * 4  # DeepSpeed clones its partition into a float32 copy, of float32 weights too
        optim = net.optimizer_bytes
        sharded = stage == 3 and (net.trained or not engine)  # the engine's frozen networks stay whole
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
    phases = _phases(sh, method, s, nets, share=layout.gpus, layout=layout)
    peak, phase = _peak(static["total"], phases)
    return LayoutMemory(layout, static, host, phases, peak, phase, peak <= s.gpu_memory_bytes)


# ----------------------------------------------------------------------------------------------
# The prediction


def predict(shape: Shape | dict[str, Any], method: str, settings: Settings | None = None,
            model: str = "custom", layout: Layout | None = None) -> Prediction:
    """Static bytes per network (exact), per-phase bytes, the peak and its phase on one GPU, what fits
    ``settings``'s GPU, the fewest GPUs of that size in every layout (LAYOUTS) and, when ``layout`` is given, the
    per-GPU memory and largest micro-batch there.

    ``shape``: a Shape or config.json shape fields; ``method``: a key of METHOD_ROLES (ValueError otherwise).
    """
    s = settings or Settings()
    sh = shape if isinstance(shape, Shape) else Shape.from_fields(shape)
    roles = roles_for(method, s)
    nets = {role: network_memory(sh, role, s) for role in roles}
    static = sum(n.static_bytes for n in nets.values())
    phases = _phases(sh, method, s, nets)
    peak, peak_phase = _peak(static, phases)
    mb = s.micro_sequences(method)
    acts = {"checkpointing": update_activations(sh, method, s, roles, mb, True),
            "no_checkpointing": update_activations(sh, method, s, roles, mb, False)}
    kv = phases.get("generation", {}).get("kv_cache", 0)
    gpus = {name: gpus_for_layout(sh, method, s, name) for name in LAYOUTS}
    at_count = {name: layout_memory(sh, method, s, Layout.named(name, n)) if n else None for name, n in gpus.items()}
    asked = None
    if layout is not None:
        asked = layout_memory(sh, method, s, layout)
        asked.max_micro_batch = max_micro_batch(sh, method, s, layout)
    notes = ["static terms exact; per-phase terms approximate (no allocator cache, CUDA context or fragmentation)"]
    if method in ENGINE_METHODS:
        notes.append("ZeRO layouts: the suite's engine under DeepSpeed (fp32 actor and critic modules under its own "
                     "bf16 autocast, DeepSpeed's fp32 master partition; reference and reward model whole on every "
                     "GPU; ZeRO-3 generates inside a gather of the whole fp32 actor); communication buckets not "
                     "modelled")
    else:
        notes.append("ZeRO layouts: DeepSpeed's mixed precision (bf16 modules, fp32 master weights in the optimizer "
                     "partition); communication buckets not modelled")
    if method not in ENGINE_METHODS and method != "dpo" and s.ds3_gather_for_generation:
        notes.append("under ZeRO-3 TRL's GRPO gathers the whole policy on every GPU to generate "
                     "(ds3_gather_for_generation=false avoids it, generating slower)")
    return Prediction(
        method=method, model=model, parameters=sh.parameters(), settings=s, networks=nets, static_bytes=static,
        phases=phases, activations_bytes=acts, kv_cache_bytes=kv, logits_bytes=phases["update"]["logits"],
        peak_bytes=peak, peak_phase=peak_phase, fits=peak <= s.gpu_memory_bytes,
        max_micro_batch=max_micro_batch(sh, method, s), gpus_data_parallel=gpus["dp"],
        gpus_zero3=gpus["zero3"], gpus=gpus, gpus_memory=at_count, layout=asked, notes=notes)


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
        if layout_memory(shape, method, replace(s, micro_batch_size=mid), layout).peak_bytes <= s.gpu_memory_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def gpus_for_layout(shape: Shape, method: str, s: Settings, name: str) -> int | None:
    """Fewest GPUs on which ``method`` fits in layout ``name`` (LAYOUTS); None when none up to MAX_GPUS does (plain
    DP stops at one sequence per GPU: past that nothing shrinks)."""
    most = s.sequences_per_step(method) if name == "dp" else MAX_GPUS
    return _smallest_count(lambda n: layout_memory(shape, method, s, Layout.named(name, n)).peak_bytes,
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
                    completion_tokens=spec.generation.max_new_tokens, group_size=t.group_size,
                    prompts_per_step=t.prompts_per_step, gradient_checkpointing=t.gradient_checkpointing,
                    lora_rank=t.lora.r if t.lora.enabled else 0, kl_beta=t.kl_beta if own is None else own,
                    lora_critic=t.lora.critic, gpu_memory_bytes=gpu_memory_bytes)


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
