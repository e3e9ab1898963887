"""One explicit generation configuration for every completion the suite decodes (DESIGN.md §4).

Why this module exists: ``model.generate(do_sample=False, max_new_tokens=...)`` is *not* a complete
description of decoding. transformers fills every field the caller leaves unset from the checkpoint's own
``generation_config.json``, and hub models ship sampling defaults there (Qwen2.5 instruct: ``temperature 0.7,
top_p 0.8, top_k 20, repetition_penalty 1.05``). A repetition penalty silently changes *greedy* evaluation too,
and the sampled pool would no longer use the matched settings. So the suite builds one plain settings dict from
the spec (:func:`sampling_settings`), records it with the results, turns it into a ``GenerationConfig`` built
from scratch (:func:`generation_config`) and generates with the model's own config swapped out
(:func:`generate`).

torch and transformers are imported inside the functions so that the spec and the report can import this
module cheaply.
"""

from __future__ import annotations

from typing import Any, Iterable

# Decoding fields the spec does not expose, pinned to the values that switch them off. (min_length is left out:
# min_new_tokens, which the spec does expose, governs the length, and setting both makes transformers warn.) They are recorded with
# the settings and passed explicitly, so that a checkpoint's generation_config.json cannot turn them on (in
# transformers 5 every field left at None is filled from the model's own config). Fields whose "off" value is
# None (min_p, top_h, suppress_tokens, bad_words_ids, sequence_bias, forced_*_token_id, ...) cannot be pinned
# this way: :func:`generate` handles those by swapping the model's config out.
NEUTRAL_DECODING: dict[str, Any] = {
    "num_beams": 1,
    "no_repeat_ngram_size": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
}

# Warpers transformers applies only when do_sample is True; it warns when a non-default one is set for greedy.
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "typical_p", "epsilon_cutoff", "eta_cutoff")


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS first, then the model's declared EOS ids.

    Instruct checkpoints end a turn with a token other than the tokenizer's EOS (Qwen2.5: ``<|im_end|>`` next
    to ``<|endoftext|>``); TRL's GRPOTrainer stops on both, so every suite generation does too.
    """
    declared = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    if tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return [int(i) for i in ids]


BACKEND_KEYS = ("backend", "vllm")
"""Keys of a settings dict that say who decodes (not ``GenerationConfig`` fields): ``backend`` is
``transformers`` or ``vllm``; ``vllm`` holds the engine's options (:func:`vllm_options`) with the vllm backend."""


def _base_settings(tokenizer: Any, eos_ids: list[int] | None, max_new_tokens: int) -> dict[str, Any]:
    """Fields shared by greedy and sampled generation: length budget, special tokens, neutral pins, backend."""
    eos = [int(tokenizer.eos_token_id)] if eos_ids is None else [int(i) for i in eos_ids]
    return {"max_new_tokens": int(max_new_tokens), "pad_token_id": int(tokenizer.pad_token_id),
            "eos_token_id": eos, **NEUTRAL_DECODING, "backend": "transformers"}


def vllm_options(spec: Any) -> dict[str, Any]:
    """The vLLM engine's options from the spec (bench.model.vllm_backend builds the engine from them).

    ``dtype``: the weights' compute dtype (model.dtype); ``gpu_memory_utilization`` (share of a GPU) and
    ``cpu_kv_cache_gib`` (GiB on a CPU): what vLLM reserves; ``cpu_compile``: compile on a CPU rather than run
    eagerly; ``importance_sampling_cap``: 0 = off. The engine holds sequences up to the model's own
    ``max_position_embeddings`` (prompt + completion tokens).
    """
    g = spec.generation
    return {"dtype": str(spec.model.dtype),
            "gpu_memory_utilization": float(g.vllm_gpu_memory_utilization),
            "cpu_kv_cache_gib": float(g.vllm_cpu_kv_cache_gib),
            "cpu_compile": bool(g.vllm_cpu_compile),
            "importance_sampling_cap": float(g.importance_sampling_cap)}


def with_backend(settings: dict[str, Any], spec: Any) -> dict[str, Any]:
    """``settings`` decoded by the suite's backend (``spec.generation.backend``): ``backend`` set, and the engine's
    options under ``vllm`` for the vllm backend."""
    backend = spec.generation.backend
    out = {**settings, "backend": backend}
    if backend == "vllm":
        out["vllm"] = vllm_options(spec)
    return out


def greedy_settings(tokenizer: Any, eos_ids: list[int] | None, max_new_tokens: int) -> dict[str, Any]:
    """Greedy decoding: argmax at every step, no penalty, no forced length; ``max_new_tokens`` in tokens.

    The sampling fields are recorded at the values that mean "off" (temperature 1.0, top_p 1.0, top_k 0);
    :func:`generation_config` leaves them out of the greedy config because transformers ignores them there.
    """
    return {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0,
            "min_new_tokens": 0, **_base_settings(tokenizer, eos_ids, max_new_tokens)}


def decoding_settings(gen: Any, max_new_tokens: int | None = None) -> dict[str, Any]:
    """The token-independent sampling fields of ``spec.generation`` (a ``GenerationSpec``), neutral pins included.

    ``max_new_tokens`` overrides the budget (tokens); ``min_new_tokens`` is clamped to it. Used on its own where
    the trainer supplies pad/EOS itself (TRL's GRPOConfig).
    """
    budget = gen.max_new_tokens if max_new_tokens is None else max_new_tokens
    return {"do_sample": True, "temperature": float(gen.temperature), "top_p": float(gen.top_p),
            "top_k": int(gen.top_k), "repetition_penalty": float(gen.repetition_penalty),
            "min_new_tokens": min(int(gen.min_new_tokens), int(budget)), "max_new_tokens": int(budget),
            **NEUTRAL_DECODING}


def sampling_settings(spec: Any, tokenizer: Any, eos_token_ids: list[int] | None = None, *, greedy: bool,
                      max_new_tokens: int | None = None) -> dict[str, Any]:
    """Every decoding setting as a plain JSON-able dict whose keys are ``GenerationConfig`` fields.

    ``greedy=True``: the evaluation decoding, ``spec.eval.max_new_tokens`` by default. ``greedy=False``: the
    matched sampling settings of ``spec.generation`` (:func:`decoding_settings`). ``max_new_tokens`` overrides
    the budget (tokens). ``eos_token_ids``: every id that ends a completion (:func:`eos_token_ids`); default:
    the tokenizer's EOS only.
    """
    if greedy:
        budget = spec.eval.max_new_tokens if max_new_tokens is None else max_new_tokens
        return with_backend(greedy_settings(tokenizer, eos_token_ids, budget), spec)
    decoding = decoding_settings(spec.generation, max_new_tokens)
    return with_backend({**decoding, **_base_settings(tokenizer, eos_token_ids, decoding["max_new_tokens"])}, spec)


def generation_config(settings: dict[str, Any]) -> Any:
    """A ``transformers.GenerationConfig`` built from ``settings`` alone, never from a model's config.

    ``top_k=0`` is passed explicitly when sampling: an unset top_k means transformers' global default of 50,
    not "off". For greedy settings the sampling-only fields are left out: transformers applies them only when
    ``do_sample`` is True and warns about non-default ones (top_k=0) in a greedy config.
    """
    from transformers import GenerationConfig

    fields = {k: v for k, v in settings.items() if k not in BACKEND_KEYS}
    if not fields.get("do_sample", False):
        for name in SAMPLING_ONLY:
            fields.pop(name, None)
    return GenerationConfig(**fields)


def _generating_model(model: Any) -> Any:
    """The transformers model whose ``generate`` runs: the base model under a PEFT wrapper.

    PeftModel.generate copies ``self.generation_config`` (read through to the base model) onto the base
    model, so the swap in :func:`generate` must happen on the base model, not on the wrapper.
    """
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def generate(model: Any, input_ids: Any, attention_mask: Any, settings: dict[str, Any]) -> Any:
    """Generate with exactly ``settings`` on their backend: (b, P) prompt ids/mask -> (b * n, P + T) sequences.

    n = ``settings.get('num_return_sequences', 1)``; T <= ``settings['max_new_tokens']``. ``settings['backend']``
    ``vllm`` decodes with the model's vLLM engine (:func:`generate_with_logprobs`), else ``model.generate``
    (:func:`hf_generate`). Every generation of the suite goes through here, so one switch moves all of them.
    """
    return generate_with_logprobs(model, input_ids, attention_mask, settings)[0]


def generate_with_logprobs(model: Any, input_ids: Any, attention_mask: Any,
                           settings: dict[str, Any]) -> tuple[Any, Any]:
    """(sequences, sampler log-probs): :func:`generate`'s (b * n, P + T) sequences, and with the vllm backend
    vLLM's own log-prob of each generated token, (b * n, T) float32 nats (0 after a row's last token), else None.

    The vLLM path gives the same layout as ``model.generate``: the prompt as passed (left padding kept), the
    new tokens after it, rows shorter than the longest right-padded with ``pad_token_id``. The engine is the
    model's own (bench.model.vllm_backend.generator_for), its weights synced when the model's changed.
    """
    if settings.get("backend", "transformers") != "vllm":
        return hf_generate(model, input_ids, attention_mask, settings), None
    return _vllm_generate(model, input_ids, attention_mask, settings)


def _vllm_generate(model: Any, input_ids: Any, attention_mask: Any, settings: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    from bench.model import vllm_backend

    generator = vllm_backend.generator_for(model, settings.get("vllm") or {})
    generator.sync(model)
    n = int(settings.get("num_return_sequences", 1))
    prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids.cpu(), attention_mask.cpu())]
    per_prompt = generator.generate(prompts, settings, n=n)
    completions = [c for group in per_prompt for c in group]
    width = max((len(c.token_ids) for c in completions), default=0)
    new = torch.full((len(completions), width), int(settings["pad_token_id"]), dtype=input_ids.dtype)
    logprobs = torch.zeros((len(completions), width), dtype=torch.float32)
    for i, c in enumerate(completions):
        new[i, :len(c.token_ids)] = torch.as_tensor(c.token_ids, dtype=input_ids.dtype)
        if c.logprobs is not None:
            logprobs[i, :len(c.logprobs)] = torch.as_tensor(c.logprobs, dtype=torch.float32)
    prompt = input_ids.cpu().repeat_interleave(n, dim=0)
    sequences = torch.cat([prompt, new], dim=1).to(input_ids.device)
    return sequences, logprobs.to(input_ids.device)


def hf_generate(model: Any, input_ids: Any, attention_mask: Any, settings: dict[str, Any]) -> Any:
    """``model.generate`` with exactly ``settings``: (b, P) prompt ids/mask -> (b * n, P + T) sequences.

    n = ``settings.get('num_return_sequences', 1)``; T <= ``settings['max_new_tokens']``.

    Why the swap: ``GenerationMixin._prepare_generation_config`` (transformers 5.x) deep-copies the passed
    config, then ``update(**self.generation_config.to_dict(), defaults_only=True)``: every field still None is
    filled from the *model's* config (its generation_config.json), then from global defaults (top_k=50 among
    them). Passing values explicitly closes the fields whose "off" value is not None, but not min_p,
    suppress_tokens, bad_words_ids, sequence_bias, forced_*_token_id, ... whose off value *is* None. So for the
    call the model's config is replaced by the explicit one (restored in ``finally``, so a later save still
    writes the checkpoint's own file): the merge then only meets our values and transformers' global defaults.
    """
    config = generation_config(settings)
    target = _generating_model(model)
    own = target.generation_config
    target.generation_config = config
    try:
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    finally:
        target.generation_config = own


def completion_length(row_ids: Iterable[int], eos_ids: int | Iterable[int] | None) -> int:
    """Tokens of one generated row up to and including the first EOS; the whole row when none appears.

    ``row_ids``: the new tokens only (prompt cut off). ``eos_ids``: one id or every id that ends a
    completion. Right padding after EOS (pad may equal EOS) is therefore never counted.
    """
    row = list(row_ids)
    if eos_ids is None:
        return len(row)
    stops = {int(eos_ids)} if isinstance(eos_ids, int) else {int(i) for i in eos_ids}
    for index, token in enumerate(row):
        if int(token) in stops:
            return index + 1
    return len(row)
