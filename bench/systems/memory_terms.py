"""The memory model's shared arithmetic: shapes, settings, bytes per network (weights, gradients, AdamW state under the
precision policy), activations saved per token per layer, TRL's fused LM head, the KV cache and the layouts'
dataclass. Every implementation's phase terms (:mod:`bench.systems.memory_phases`), the stages
(:mod:`bench.systems.memory_stages`) and layouts (:mod:`bench.systems.memory_layouts`) are built from these;
:mod:`bench.systems.memory_model` documents the model as a whole and makes the prediction. All sizes are bytes."""

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

    def lora_rank_tensor(self, rank: int) -> int:
        """Elements of the largest LoRA adapter matrix of rank ``rank`` (r x the widest input or output)."""
        return rank * max(max(n_in, n_out) for n_in, n_out in self.layer_linears())

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
    """spec.model.dtype: 'bfloat16' (bf16 autocast over fp32 master weights; frozen networks and a LoRA base bf16)
    or 'float32'."""
    micro_batch_size: int = 8
    """Sequences per forward/backward (DPO and the reward-model stage: pairs); 0: the whole step at once."""
    prompt_tokens: int = 256
    """Padded prompt length (tokens); a GSM8K question in a chat template is about 100-250 tokens."""
    completion_tokens: int = 512
    """generation.max_new_tokens (tokens)."""
    fixed_length: bool = False
    """generation.min_new_tokens is set (the systems presets' fixed-length generation): its logits processor adds
    two float32 copies of the next-token logits per sequence."""
    group_size: int = 8
    """G: completions per prompt."""
    prompts_per_step: int = 16
    """Prompts per optimizer step (DPO: pairs per step)."""
    gradient_checkpointing: bool = True
    """Keep only each layer's input and recompute the rest in the backward pass (the reward-model stage too)."""
    lora_rank: int = 0
    """LoRA rank (0: off, every weight trained)."""
    kl_beta: float = 0.04
    """KL coefficient; 0 loads no reference in the online methods."""
    lora_critic: bool = True
    """With LoRA: PPO's critic trains its own adapters and a value head (train.lora.critic); false: every weight."""
    ds3_gather_for_generation: bool = True
    """TRL GRPO under ZeRO-3 gathers the whole policy on every GPU to generate (GRPOConfig's flag of that name)."""
    device: str = "cuda"
    """spec.device: 'cuda' (torch's fused AdamW, no parameter-sized temporary; TRL's fused LM head in Triton; a
    CUDA context outside the allocator) or 'cpu' (foreach AdamW buffer; the fused LM head's torch tiles)."""
    reward_model_pairs: int = 32
    """reward_model.batch_size: pairs per optimizer step of the reward-model stage (micro-batches of
    ``micro_batch_size`` pairs, gradients accumulated)."""
    reward_model_eval_pairs: int = 64
    """Pairs per forward of the reward-model stage's held-out accuracy (baselines.reward_model.pairwise_accuracy)."""
    pool_batch_size: int = 64
    """sample_pool.batch_size: prompts per generate call of the sample-pool stage."""
    pool_samples: int = 4
    """sample_pool.samples_per_prompt: completions per pool prompt (num_return_sequences)."""
    evaluation: bool = True
    """eval.enabled: the method runs end with a greedy evaluation of the trained policy (phase 'evaluation')."""
    eval_batch_size: int = 64
    """eval.batch_size: prompts per evaluation generate call."""
    eval_completion_tokens: int = 512
    """eval.max_new_tokens (tokens)."""
    gpu_memory_bytes: int = 80 * GIB
    """Memory of one GPU (bytes) for fits, the largest micro-batch and the GPU counts."""
    generation_backend: str = "transformers"
    """generation.backend: 'transformers' (HF generate: its DynamicCache and sampling logits in the generation
    phases) or 'vllm' (an in-process vLLM engine: its weights copy and preallocated KV cache,
    :mod:`bench.systems.memory_vllm`). Default the spec's default; the gsm8k-qwen0.5b preset runs 'vllm'."""
    vllm_gpu_memory_utilization: float = 0.3
    """generation.vllm_gpu_memory_utilization: the share of a GPU's memory vLLM takes (0, 1]."""
    vllm_cpu_kv_cache_gib: float = 1.0
    """generation.vllm_cpu_kv_cache_gib: vLLM's KV cache on a CPU (GiB)."""

    @property
    def compute(self) -> str:
        """The dtype matmuls run in: bfloat16 under autocast, else float32."""
        return "float32" if self.dtype == "float32" else "bfloat16"

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
    """dtype the weights are stored in: float32 for fully trained networks (the master weights); the spec's dtype
    for frozen networks and for a LoRA network's frozen base (its adapters and a critic's value head are float32)."""
    parameters: int
    """Parameters this role holds (0 for a LoRA reference: it is the actor's base)."""
    trainable_parameters: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    working_copy_bytes: int
    """bf16 casts of float32 weights that require grad which autocast caches while this network computes: every
    linear weight of a fully trained network (the actor's LM head included), a LoRA network's adapters only (its
    base is stored in bf16: nothing to cast); 0 in float32. Counted in the phases it computes in, not in the
    static total."""
    lora: bool = False
    """Adapters on a frozen base (the base is stored in ``storage``)."""
    residual_bytes: int = 4
    """Bytes per element of the residual stream: float32 for every network, bf16-stored ones included — the one
    compute numerics (``bench.model.numerics.fp32_residual_stream``) makes a bf16 network's embeddings return
    float32 under autocast, so it computes as the float32-stored actor; only DeepSpeed's bf16 modules (TRL under
    ZeRO, no autocast) carry a bf16 residual (``memory_phases.trained_net``). Norms, layer inputs and the K cache
    take it."""
    largest_trainable_tensor: int = 0
    """Elements of the largest trained parameter tensor (the CPU's for-loop AdamW holds temporaries of its size)."""

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


def network_memory(shape: Shape, role: str, settings: Settings, trained: bool | None = None) -> NetworkMemory:
    """Exact static bytes of one role (see bench.systems.memory_model for what each network is). ``trained``
    overrides the role's usual state (the reward-model stage trains the 'reward' network in full)."""
    trained = role in TRAINED_ROLES if trained is None else trained
    frozen_size = DTYPE_BYTES[settings.dtype]
    lora = trained and settings.lora_rank > 0 and (role != "critic" or settings.lora_critic) and role != "reward"
    if role in ("actor", "reference"):
        tensors = shape.lm_tensors()
    elif role == "critic":
        tensors = shape.backbone_tensors() + [shape.hidden, 1]  # value head weight (1 x h) and bias, float32
    else:  # reward: sequence classification, score row (1 x h), no bias
        tensors = shape.backbone_tensors() + [shape.hidden]
    if role == "reference" and settings.lora_rank > 0:
        return NetworkMemory(role, False, settings.dtype, 0, 0, 0, 0, 0, 0)
    base = sum(tensors)
    if not trained:
        return NetworkMemory(role, False, settings.dtype, base, 0, base * frozen_size, 0, 0, 0)
    autocast = settings.dtype != "float32"
    if lora:
        adapters, adapter_tensors = shape.lora_parameters(settings.lora_rank)
        head = [shape.hidden, 1] if role == "critic" else []  # the critic's value head is trained in full
        frozen = base - sum(head)
        trainable, trainable_tensors = adapters + sum(head), adapter_tensors + len(head)
        # The frozen base in the spec's dtype; adapters (peft upcasts them) and the value head in float32.
        weights = frozen * frozen_size + 4 * trainable
        copies = 2 * adapters if autocast else 0  # autocast caches the adapters' casts; the base needs none
        largest = max([shape.lora_rank_tensor(settings.lora_rank)] + head)
        return NetworkMemory(role, True, settings.dtype, base + adapters, trainable, weights, 4 * trainable,
                             ADAM_MOMENTS * 4 * trainable + ADAM_STEP_BYTES * trainable_tensors, copies, lora=True,
                             largest_trainable_tensor=largest)
    # Under bf16 autocast a trained network's linear weights get a cached bf16 copy while it computes.
    copies = 2 * shape.linear_weights(lm_head=role == "actor") if autocast else 0
    return NetworkMemory(role=role, trained=True, storage="float32", parameters=base, trainable_parameters=base,
                         weights_bytes=4 * base, gradients_bytes=4 * base,
                         optimizer_bytes=ADAM_MOMENTS * 4 * base + ADAM_STEP_BYTES * len(tensors),
                         working_copy_bytes=copies, largest_trainable_tensor=max(tensors))


# ----------------------------------------------------------------------------------------------
# Activations, logits and the KV cache (approximate)


def activation_bytes_per_token_layer(shape: Shape, dtype: str, residual: int = 4, norms_trained: bool = True,
                                     lora_rank: int = 0) -> int:
    """Bytes one token saves for backward in one decoder layer without checkpointing (bench.systems.memory_model).

    ``dtype``: the compute dtype (bfloat16 under autocast); ``residual``: bytes of the residual stream (4 under the
    one compute numerics; 2: DeepSpeed's bf16 modules); ``norms_trained``: the RMSNorm weights are trained
    (they then save the normalised input); ``lora_rank``: each adapted linear saves its rank-wide A output.
    """
    a, r = DTYPE_BYTES[dtype], residual
    h, hq, i = shape.hidden, shape.q_width, shape.intermediate
    # Each RMSNorm saves its float32 input (or float32 copy of it) and, with a trained weight, the normalised
    # input in the residual dtype.
    norms = 2 * (4 * h + (r * h if norms_trained else 0))
    # The inputs the linears save: their own bf16 casts of a float32 norm output (q, k, v, gate, up) under
    # autocast, else the two norm outputs themselves (shared).
    projection_inputs = 5 * a * h if a != r else 2 * r * h
    attention = 4 * a * hq + 4 * shape.heads                 # q, repeated K and V, output; fp32 logsumexp
    if r == 2:  # a bf16 residual: RoPE runs in bf16 and its q and k (with v before the repeat) are kept as well
        attention += 2 * a * hq + 4 * a * shape.kv_width
    mlp = 4 * a * i                                          # gate, SiLU(gate), up, product
    adapters = len(shape.layer_linears()) * lora_rank * a    # each adapter's A output, saved by its B
    return norms + projection_inputs + attention + mlp + adapters


def activation_bytes(shape: Shape, dtype: str, tokens: int, checkpointing: bool, head_tokens: int | None = None,
                     residual: int = 4, norms_trained: bool = True, lora_rank: int = 0,
                     head_input: bool = True) -> int:
    """Saved activations of one trained network for ``tokens`` tokens in one forward/backward (approximate), the
    one layer rebuilt in the backward pass under checkpointing included.

    ``head_tokens``: positions the LM head reads (``logits_to_keep``; default all). The final RMSNorm saves its
    float32 input (and, trained, its normalised input); the head's input is a bf16 cast of the kept positions under
    autocast over a float32 residual, and otherwise a view that keeps the whole normalised output alive
    (``head_input`` False: the head saves no input, as a frozen LM head does).
    """
    per_layer = activation_bytes_per_token_layer(shape, dtype, residual, norms_trained, lora_rank)
    return layer_activations(shape, tokens, checkpointing, per_layer, residual) + final_norm_bytes(
        shape, dtype, tokens, head_tokens, residual, norms_trained, head_input)


def layer_activations(shape: Shape, tokens: int, checkpointing: bool, per_layer: int, residual: int = 4) -> int:
    """The decoder layers' share of ``activation_bytes``: every layer's saved set, or with checkpointing each
    layer's input (``residual`` bytes x hidden) plus one layer rebuilt at a time in the backward pass."""
    if checkpointing:
        return tokens * (shape.layers * residual * shape.hidden + per_layer)
    return tokens * shape.layers * per_layer


def final_norm_bytes(shape: Shape, dtype: str, tokens: int, head_tokens: int | None = None, residual: int = 4,
                     norms_trained: bool = True, head_input: bool = True) -> int:
    """What the final RMSNorm and the LM head's input keep for backward (see ``activation_bytes``)."""
    head_tokens = tokens if head_tokens is None else head_tokens
    h, a = shape.hidden, DTYPE_BYTES[dtype]
    norm = tokens * (4 * h + (residual * h if norms_trained else 0))
    if not head_input:
        return norm
    head = a * h * head_tokens if a != residual else residual * h * tokens
    return norm + head


def forward_working_bytes(shape: Shape, dtype: str, tokens: int) -> int:
    """One layer's transient working set in a forward that saves nothing (no grad, or a checkpointed layer's first
    forward): the MLP's three intermediates dominate, beside q, k and v, the float32 residual stream and the norm's
    float32 output (3 x 4 x h: the residual, its sum, the normalised input) and the float32 RoPE tables (cos and
    sin, 2 x head_dim x 4) shared by the layers (measured on a prefill: tests/test_memory_measured.py)."""
    a = DTYPE_BYTES[dtype]
    return tokens * (3 * a * shape.intermediate + a * (shape.q_width + 2 * shape.kv_width) + 3 * 4 * shape.hidden
                     + 2 * 4 * shape.head_dim)


FUSED_CHUNK = (4096, 32768)
"""(tokens, vocabulary entries) of one tile of TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py: tiles of
TOKEN_CHUNK_SIZE tokens; GRPO and DPO pass _CHUNKED_LOGPROB_CHUNK_SIZE = 32,768 vocabulary entries)."""


def fused_head_bytes(shape: Shape, dtype: str, tokens: int, residual: int, backward: bool, head_trained: bool,
                     device: str = "cuda") -> dict[str, int]:
    """Transient bytes of TRL 1.16's fused, chunked LM head (``ChunkedLogProbFunction``) over ``tokens`` scored
    positions, by term; the logits are never materialised.

    Forward: one tile of logits in the compute dtype (``mm_buf``: min(tokens, 4,096) x 32,768) and the compute-dtype
    cast of one vocabulary chunk of the weight. Backward (``backward``): the same tile and chunk, the float32
    accumulators of the hidden states' gradient (tokens x hidden) and, when the head is trained, of the whole weight's
    gradient (vocab x hidden x 4 bytes: the fp32 LM-head gradient buffer), plus the hidden gradient cast back to
    the residual dtype when that is not float32. Without Triton (``device`` 'cpu') the tile is folded in torch:
    three float32 copies of it in the forward, seven and a boolean one in the backward (measured on CPU in
    tests/test_memory_model.py).
    """
    a, h = DTYPE_BYTES[dtype], shape.hidden
    rows, width = min(tokens, FUSED_CHUNK[0]), min(FUSED_CHUNK[1], shape.vocab)
    # The tile buffer is allocated at the full chunk width even for a smaller vocabulary.
    terms = {"fused_head_tile": rows * FUSED_CHUNK[1] * a, "fused_head_weight_chunk": width * h * a}
    if device == "cpu":
        terms["fused_head_torch_tiles"] = (7 * 4 + 1) * rows * width if backward else 3 * 4 * rows * width
    if backward:
        terms["fused_head_hidden_grad"] = 4 * tokens * h + (residual * tokens * h if residual != 4 else 0)
        if head_trained:
            terms["fused_head_weight_grad"] = 4 * shape.vocab * h
    return terms


def kv_cache_bytes(shape: Shape, sequences: int, tokens: int, residual: int = 4) -> int:
    """K and V of every layer for ``sequences`` x ``tokens`` in Hugging Face's DynamicCache while a network generates.

    K passes through RoPE, whose cos/sin tables take the residual stream's dtype (``residual`` bytes): float32 under
    the one compute numerics (a bf16-stored network's residual is float32 too), so type promotion makes K float32
    even under bf16 autocast; bf16 only for DeepSpeed's bf16 modules. V is the v projection's compute-dtype output,
    but the cache (transformers 5.16-5.17, the pinned range) starts each layer as an empty tensor of K's dtype and
    concatenates onto it, which promotes V to K's dtype: both take ``residual`` bytes (measured on the HF cache:
    tests/test_memory_measured.py).
    """
    per_token = shape.layers * shape.kv_width * 2 * residual
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
    what_if_engine: bool = False
    """A what-if for the suite's engine under ZeRO-3, not what it does: the reference and the reward model sharded
    like the trained networks (or run as DeepSpeed inference engines), and generation from a gather of the actor
    in bf16 instead of float32 (verl's and OpenRLHF's arrangement). TRL's trainers shard their frozen networks
    under ZeRO-3 already."""

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.gpus < 1:
            raise ValueError(f"the GPU count must be >= 1, got {self.gpus}")
        if self.offload_optimizer and self.stage < 1:
            raise ValueError("optimizer offload needs ZeRO stage 1, 2 or 3")
        if self.offload_params and self.stage != 3:
            raise ValueError("weight (parameter) offload needs ZeRO stage 3")
        if self.what_if_engine and self.stage != 3:
            raise ValueError("the engine's sharded-frozen what-if is a ZeRO stage 3 layout")

    @property
    def name(self) -> str:
        """'dp', 'zero1'..'zero3', 'zero3_offload' (both offloaded), 'zeroK_offload_optimizer' or 'zero3_what_if'."""
        if self.stage == 0:
            return "dp"
        if self.what_if_engine:
            return "zero3_what_if"
        if self.offload_params:
            return f"zero{self.stage}_offload" if self.offload_optimizer else f"zero{self.stage}_offload_params"
        return f"zero{self.stage}_offload_optimizer" if self.offload_optimizer else f"zero{self.stage}"

    @classmethod
    def named(cls, name: str, gpus: int = 1) -> "Layout":
        """The layout of a LAYOUTS name on ``gpus`` GPUs."""
        if name == "zero3_what_if":
            return cls(3, gpus, what_if_engine=True)
        if name not in LAYOUTS:
            raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}, zero3_what_if")
        if name == "dp":
            return cls(0, gpus)
        offload = name.endswith("_offload")
        return cls(int(name[4]), gpus, offload_optimizer=offload, offload_params=offload)
