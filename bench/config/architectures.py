"""Real architectures without downloads: the public shape fields of shipped ``config.json`` files.

``bench/config/architectures/<name>.json`` holds, for each model, only the fields that fix its shapes (widths,
depth, heads, vocabulary, tying, norm and RoPE constants) and a ``source`` note naming the hub id the values
come from. From them this module builds a ``transformers`` config (optionally scaled down to a CPU-sized
member of the same family), counts parameters analytically, and instantiates the network with random
weights. That is how memory and speed are measured for 0.5B-72B models with no hub access: the shapes, not
the weights, decide both.

Nothing here imports torch or transformers at module level: ``bench.config.spec`` validates architecture names
through `architecture_names` while loading a spec, which must stay fast.
"""

from __future__ import annotations

import difflib
import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

from bench.errors import SpecError, UserError
from bench.config.spec import ScaleSpec

STAND_IN_VOCAB = 1024
"""Trained size (BPE target, special tokens included) of the stand-in byte-level tokenizer that a shipped
architecture is paired with; the four tag tokens come on top. Its ids all fall below any real vocabulary, so
the embedding, logits and KV cache keep their real sizes."""
STAND_IN_TAG_COUNT = 4
"""Tokens the stand-in tokenizer adds for the answer format (``len(bench.task.prompts.TAG_TOKENS)``; the
configuration layer sits below the task layer, so it keeps the count, and tests/test_layers.py checks they agree)."""

MAX_WIDTH_DIVISOR = 256
"""Largest width divisor searched when listing the valid ones in an error message."""

_SUPPORTED_TYPES = ("qwen2", "llama")
"""model_type values whose parameter layout `parameter_count` knows."""


def architecture_names() -> list[str]:
    """Names of the shipped architectures (``bench/config/architectures/*.json``), sorted."""
    return list(_names())


@lru_cache(maxsize=1)
def _names() -> tuple[str, ...]:
    folder = resources.files("bench.config") / "architectures"
    return tuple(sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json")))


def architecture_fields(name: str) -> dict[str, Any]:
    """The shipped shape fields of ``name`` (a fresh dict; ``source`` included).

    Raises UserError naming the known architectures, with a did-you-mean suggestion.
    """
    if name not in _names():
        close = difflib.get_close_matches(name, _names(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"unknown architecture '{name}'{hint}; known architectures: {', '.join(_names())}")
    return dict(_load_fields(name))


@lru_cache(maxsize=None)
def _load_fields(name: str) -> dict[str, Any]:
    path = resources.files("bench.config") / "architectures" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _head_dim(fields: dict[str, Any]) -> int:
    """Per-head width: the explicit ``head_dim`` if any, else hidden_size / num_attention_heads."""
    explicit = fields.get("head_dim")
    return int(explicit) if explicit else fields["hidden_size"] // fields["num_attention_heads"]


def _width_problem(fields: dict[str, Any], divisor: int) -> str | None:
    """Why ``divisor`` cannot shrink these widths (None when it can).

    The divisor is split into a head-count factor, gcd(divisor, num_key_value_heads), which divides both the
    query and the KV head counts (so the GQA ratio is unchanged), and a head-width factor (the rest), which
    divides head_dim; the scaled head_dim must stay even because rotary embeddings rotate pairs of channels.
    """
    head_factor = math.gcd(divisor, fields["num_key_value_heads"])
    dim_factor = divisor // head_factor
    head_dim = _head_dim(fields)
    if fields["hidden_size"] % divisor or fields["intermediate_size"] % divisor:
        return "it must divide hidden_size and intermediate_size"
    if fields["num_attention_heads"] % head_factor:
        return "it must divide the attention heads consistently with the KV heads"
    if head_dim % dim_factor or (head_dim // dim_factor) % 2:
        return "the remaining factor must leave an even head_dim"
    return None


def valid_width_divisors(fields: dict[str, Any]) -> list[int]:
    """Every width divisor (up to MAX_WIDTH_DIVISOR) that yields a valid scaled shape for ``fields``."""
    return [d for d in range(1, MAX_WIDTH_DIVISOR + 1) if _width_problem(fields, d) is None]


def scaled_fields(name: str, scale: ScaleSpec | None = None) -> dict[str, Any]:
    """Shape fields of ``name`` after ``scale`` (fewer layers, narrower widths, another vocabulary).

    Width scaling divides hidden_size and intermediate_size by ``scale.width_divisor`` and attention width
    by the same factor, split between head count and head width (see `_width_problem`); hidden_size stays
    num_attention_heads x head_dim. Raises SpecError naming the ``model.scale`` key when the scale does not
    fit this architecture.
    """
    fields = architecture_fields(name)
    if scale is None:
        return fields
    if scale.num_layers is not None:
        layers = fields["num_hidden_layers"]
        if not 1 <= scale.num_layers <= layers:
            raise SpecError(f"'model.scale.num_layers' must be in 1..{layers} for {name}, got {scale.num_layers}")
        fields["num_hidden_layers"] = scale.num_layers
    divisor = scale.width_divisor
    if divisor != 1:
        problem = _width_problem(fields, divisor) if divisor >= 1 else "it must be >= 1"
        if problem:
            valid = ", ".join(str(d) for d in valid_width_divisors(fields))
            raise SpecError(f"'model.scale.width_divisor' {divisor} does not fit {name} ({problem}); "
                            f"valid divisors: {valid}")
        head_factor = math.gcd(divisor, fields["num_key_value_heads"])
        fields["head_dim"] = _head_dim(fields) // (divisor // head_factor)
        fields["hidden_size"] //= divisor
        fields["intermediate_size"] //= divisor
        fields["num_attention_heads"] //= head_factor
        fields["num_key_value_heads"] //= head_factor
    if scale.vocab_size is not None:
        fields["vocab_size"] = scale.vocab_size
    return fields


def architecture_config(name: str, scale: ScaleSpec | None = None) -> Any:
    """A ``transformers.PretrainedConfig`` for ``name`` (scaled by ``scale`` when given).

    Raises UserError for an unknown name (listing the known ones) and SpecError for a scale that does not fit.
    """
    from transformers import AutoConfig

    fields = scaled_fields(name, scale)
    fields.pop("source", None)
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


def _shape(name_or_config: Any) -> dict[str, Any]:
    """Shape fields from an architecture name, a dict of fields, or a PretrainedConfig."""
    if isinstance(name_or_config, str):
        return architecture_fields(name_or_config)
    if isinstance(name_or_config, dict):
        return dict(name_or_config)
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings", "head_dim", "attention_bias", "mlp_bias")
    return {k: getattr(name_or_config, k, None) for k in keys}


def parameter_count(name_or_config: Any) -> int:
    """Trainable parameters of the decoder-only LM, computed from its shape fields alone (no weights).

    Embedding (vocab x hidden); per layer: q/k/v/o projections (q/k/v with biases for Qwen2, none for
    Llama unless ``attention_bias``), the gated MLP (gate, up, down; biases only with Llama's ``mlp_bias``)
    and two RMSNorm weight vectors; the final norm; and an LM head unless tied to the embedding. Accepts an
    architecture name, a dict of shape fields or a PretrainedConfig.
    """
    f = _shape(name_or_config)
    model_type = f.get("model_type")
    if model_type not in _SUPPORTED_TYPES:
        raise UserError(f"parameter_count knows model types {', '.join(_SUPPORTED_TYPES)}, not {model_type!r}")
    hidden, inter, vocab = f["hidden_size"], f["intermediate_size"], f["vocab_size"]
    heads, kv_heads, head_dim = f["num_attention_heads"], f["num_key_value_heads"], _head_dim(f)
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    qkv_bias = model_type == "qwen2" or bool(f.get("attention_bias"))
    o_bias = model_type == "llama" and bool(f.get("attention_bias"))
    attention = hidden * (q_width + 2 * kv_width) + q_width * hidden
    attention += (q_width + 2 * kv_width) * qkv_bias + hidden * o_bias
    mlp = 3 * hidden * inter + (2 * inter + hidden) * bool(f.get("mlp_bias"))
    per_layer = attention + mlp + 2 * hidden
    embedding = vocab * hidden
    head = 0 if f.get("tie_word_embeddings") else vocab * hidden
    return embedding + f["num_hidden_layers"] * per_layer + hidden + head


def build_random_model(config: Any, dtype: Any = "float32", seed: int = 0, device: str = "cpu") -> Any:
    """The causal LM of ``config`` with random weights drawn after ``torch.manual_seed(seed)``.

    ``dtype`` is a name (float32, bfloat16, float16) or a torch dtype. The weights are allocated directly on
    ``device`` ("cpu", "cuda", or "meta" for shapes without memory), so a large model never needs a CPU copy.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)
