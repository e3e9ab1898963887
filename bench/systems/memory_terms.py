"""The memory model's shared arithmetic: shapes, settings, bytes per network (weights, gradients, AdamW state under the
precision policy), activations saved per token per layer, logits and the KV cache. Every implementation's
phase terms (:mod:`bench.systems.memory_phases`) and layouts (:mod:`bench.systems.memory_layouts`) are built from
these; :mod:`bench.systems.memory_model` documents the model as a whole and makes the prediction. All sizes are bytes."""

from __future__ import annotations

from dataclasses import dataclass
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
