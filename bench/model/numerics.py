"""The one compute numerics: every network a run evaluates or reads computes as the trained actor does.

Why it is needed. Under bf16 autocast torch casts the *inputs of matmuls* to bf16 and leaves every other op in the
dtype it is given. A network stored in float32 (the actor's master weights) therefore carries its residual stream
in float32 — the embedding output, RMSNorm, the residual additions, RoPE — with only the matmuls in bf16, while the
same values stored in bf16 carry the whole residual stream in bf16. Their outputs differ (on a real model: greedy
completions on 7 of 12 questions, and KL ~ 0.0018 between a bf16 reference and the autocast actor before any
update), although their weights are equal.

The fix keeps the storage policy (``bench.model.precision``: frozen networks in bf16, half the memory) and changes
the compute: :func:`fp32_residual_stream` makes a network's input embeddings return float32 whenever autocast is
on. Everything downstream then runs as in the float32-stored copy: norm weights and biases promote to float32
exactly (a bf16 value is a float32 value), the matmuls see the same bf16 operands, RoPE's tables are float32
buffers in both. For weights that are bf16 values (the starting checkpoint is saved in the frozen networks' dtype,
``baselines/sft.py``) a bf16-stored network under autocast + this hook equals the float32-stored one bit for bit
(``tests/test_numerics.py``, Qwen2 and Llama). Without autocast (float32 specs, or a library forward outside its
autocast) the hook does nothing.

What follows (the "evaluation numerics", recorded in every evaluated result as ``evaluation.precision``):
- every policy — the starting checkpoint, every method, every seed — is evaluated with float32 weights (or bf16
  values with the hook, the same numbers) under bf16 autocast when ``model.dtype`` is bfloat16, float32 otherwise;
- the reference (and the reward model) computes in the actor's numerics, so KL is 0 before the first update;
- the K cache of generation under autocast is float32 (RoPE promotes the keys to the residual stream's float32;
  V comes straight from a bf16 matmul and stays bf16): the memory model counts K at 4 bytes and V at 2.

torch is imported inside the functions: importing this module stays light.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bench.model.precision import autocast_dtype

HOOK_ATTRIBUTE = "_bench_fp32_residual_hook"
"""Set on an embedding module once :func:`fp32_residual_stream` has hooked it (so a second call adds nothing)."""

COMPUTE_AUTOCAST = "bfloat16 autocast, float32 residual stream"
"""How a network computes under a bfloat16 spec (the record's ``compute``)."""


def _upcast_under_autocast(module: Any, inputs: Any, output: Any) -> Any:
    """Forward hook: the embedding output in float32 while autocast is on for its device, else unchanged."""
    import torch

    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.dtype == torch.float32:
        return output
    if torch.is_autocast_enabled(output.device.type):
        return output.float()
    return output


def fp32_residual_stream(model: Any) -> Any:
    """Hook ``model``'s input embeddings (``get_input_embeddings()``) so that, under autocast, a network stored
    in bf16 computes exactly as its float32-stored copy (see the module docstring). Idempotent; returns ``model``.

    A model without ``get_input_embeddings`` (or whose embeddings are None) is returned unchanged; peft models,
    sequence classifiers and bare backbones all have it. The hook lives as long as the module (it is not saved
    with ``save_pretrained``)."""
    getter = getattr(model, "get_input_embeddings", None)
    embeddings = getter() if callable(getter) else None
    if embeddings is None or getattr(embeddings, HOOK_ATTRIBUTE, None) is not None:
        return model
    handle = embeddings.register_forward_hook(_upcast_under_autocast)
    setattr(embeddings, HOOK_ATTRIBUTE, handle)
    return model


def compute_autocast(model_dtype: str, device: str, cache: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` ('cpu' | 'cuda' | 'cuda:N') when ``model_dtype`` is bfloat16, else nothing.

    ``cache``: torch.autocast's cache of bf16 casts of float32 leaf weights that require grad (useful when a
    backward follows; generation turns it off, see ``baselines.engine_placement.Placement.autocast``)."""
    dtype = autocast_dtype(model_dtype)
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    from bench.model.loading import torch_dtype

    return torch.autocast(device_type=torch.device(device).type, dtype=torch_dtype(dtype), cache_enabled=cache)


@contextlib.contextmanager
def actor_numerics(model: Any, model_dtype: str):
    """A region in which ``model`` computes in the trained actor's numerics: its embeddings hooked
    (:func:`fp32_residual_stream`) and bf16 autocast on its device under a bfloat16 spec. For evaluation and any
    read of a network outside the engine's own autocast."""
    fp32_residual_stream(model)
    device = str(next(model.parameters()).device)
    with compute_autocast(model_dtype, device, cache=False):
        yield model


def storage_of(model: Any) -> str:
    """The dtype(s) ``model``'s parameters are stored in: 'float32', 'bfloat16', or e.g. 'bfloat16 + float32'
    (a bf16 LoRA base with float32 adapters), most elements first."""
    counts: dict[str, int] = {}
    for param in model.parameters():
        name = str(param.dtype).replace("torch.", "")
        counts[name] = counts.get(name, 0) + param.numel()
    return " + ".join(sorted(counts, key=lambda k: -counts[k])) or "none"


def evaluation_precision(model: Any, model_dtype: str, settings: dict[str, Any] | None = None) -> dict[str, str]:
    """``result["evaluation"]["precision"]``: {'storage': the evaluated policy's parameter dtypes ('float32', or
    'bfloat16 + float32' for a bf16 LoRA base with its adapters), 'compute': :data:`COMPUTE_AUTOCAST` under a
    bfloat16 spec, else 'float32'; with the vllm backend (``settings['backend']``, bench.model.generation) vLLM
    decodes in its own kernels: 'vllm (<dtype>)'}. Two results with the same 'compute' were scored alike."""
    if (settings or {}).get("backend") == "vllm":
        compute = f"vllm ({((settings or {}).get('vllm') or {}).get('dtype', model_dtype)})"
    else:
        compute = COMPUTE_AUTOCAST if autocast_dtype(model_dtype) else "float32"
    return {"storage": storage_of(model), "compute": compute}
