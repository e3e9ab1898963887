"""`bench estimate`: does a method fit on my GPU, and at what micro-batch? Answered from the memory model alone.

    bench estimate --model qwen2.5-7b --method ppo --gpu-memory 80GiB micro_batch_size=4 --json
    bench estimate --model qwen2.5-7b --method grpo --zero-stage 2 --gpus 8     # one layout: per-GPU peak, fits
    bench estimate --time --preset gsm8k-qwen0.5b --gpu-type h100 --gpus 8      # wall time: bench.systems.walltime

Prints, per network, weights, gradients, AdamW state and the bf16 working copies under the precision policy;
what stays resident between steps; per phase what a step adds (KV cache, activations, logits) at its largest moment,
and which moment that is; the peak, the CUDA context and NCCL buffers outside the allocator; whether it fits, the
largest micro-batch that does, and the fewest GPUs needed under plain data parallelism, each ZeRO stage and ZeRO-3
with CPU offload (with the host memory the offload needs), and for the suite's engine the ZeRO-3 what-if (frozen
networks sharded, generation gathered in bf16); then the stages the method reads (sample pool, reward model), each
with its peak. ``--zero-stage`` / ``--gpus`` / ``--offload`` ask for one layout: its per-GPU memory, peak, whether
it fits and its largest micro-batch. Settings default to the gsm8k-qwen0.5b preset's shapes
(`bench.systems.memory_terms.Settings`). Imports no torch: it answers in well under a second. ``--time`` is the
other question, how long a preset's whole suite run takes: a projection per run and phase
(:mod:`bench.systems.walltime`; it loads the preset and its plan, so it imports torch and takes seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from bench.errors import UserError
from bench.systems.memory_layouts import LayoutMemory
from bench.systems.memory_model import MAX_GPUS, Prediction, predict, vllm_when
from bench.systems.memory_stages import StagePrediction
from bench.systems.memory_terms import ENGINE_METHODS, GIB, METHOD_ROLES, Layout, Settings
from bench.systems.walltime import GPUS

ALL = "all"
"""--method value that compares every method side by side."""

OFFLOADS = {"none": (False, False), "optimizer": (True, False), "all": (True, True)}
"""--offload value -> (optimizer state to CPU, weights to CPU)."""

LAYOUT_LABELS = {
    "dp": "plain data parallel (DDP)",
    "zero1": "ZeRO-1 (optimizer + master sharded)",
    "zero2": "ZeRO-2 (+ gradients sharded)",
    "zero3": "ZeRO-3 (+ weights sharded)",
    "zero3_offload": "ZeRO-3 + CPU offload",
}
"""How the table names each layout of bench.systems.memory_layouts.LAYOUTS."""

NEVER = {
    "zero1": "the whole weights and gradients every GPU keeps, plus one sequence's step, exceed one GPU",
    "zero2": "the whole weights every GPU keeps, plus one sequence's step, exceed one GPU",
    "zero3": f"not within {MAX_GPUS} GPUs: the gathered weights plus one sequence's step, or rank 0's whole float32 "
             f"copy of the policy for the evaluation, exceed one GPU",
    "zero3_offload": f"not within {MAX_GPUS} GPUs: the gathered weights plus one sequence's step, or rank 0's whole "
                     f"float32 copy of the policy for the evaluation, exceed one GPU",
}
"""Why a ZeRO layout never fits TRL's trainers (the shards shrink with the GPU count; these parts do not)."""

ENGINE_NEVER = {
    "zero1": "the whole fp32 trained networks with their gradients and the whole frozen networks every GPU keeps, "
             "plus one sequence's step, exceed one GPU",
    "zero2": "the whole fp32 trained networks and the whole frozen networks every GPU keeps, plus one sequence's "
             "step, exceed one GPU",
    "zero3": f"not within {MAX_GPUS} GPUs: the whole frozen networks, the gathered modules and the whole fp32 actor "
             f"gathered to generate (or rank 0's whole fp32 copies of the trained networks for the evaluation), "
             f"plus one sequence's step, exceed one GPU",
    "zero3_offload": f"not within {MAX_GPUS} GPUs: the whole frozen networks, the gathered modules and the whole "
                     f"fp32 actor gathered to generate (or rank 0's whole fp32 copies of the trained networks for the "
                     f"evaluation), plus one sequence's step, exceed one GPU",
}
"""Why a ZeRO layout never fits the suite's engine (ENGINE_METHODS), which keeps float32 modules, leaves its frozen
networks whole on every GPU and under ZeRO-3 generates in a gather of the whole actor (bench.systems.memory_model)."""

KEY_ALIASES = {
    "model.dtype": "dtype",
    "train.micro_batch_size": "micro_batch_size",
    "generation.max_new_tokens": "completion_tokens",
    "max_new_tokens": "completion_tokens",
    "generation.min_new_tokens": "fixed_length",
    "train.group_size": "group_size",
    "G": "group_size",
    "train.prompts_per_step": "prompts_per_step",
    "train.gradient_checkpointing": "gradient_checkpointing",
    "train.lora.r": "lora_rank",
    "train.kl_beta": "kl_beta",
    "train.lora.critic": "lora_critic",
    "reward_model.batch_size": "reward_model_pairs",
    "sample_pool.batch_size": "pool_batch_size",
    "sample_pool.samples_per_prompt": "pool_samples",
    "eval.enabled": "evaluation",
    "eval.batch_size": "eval_batch_size",
    "eval.max_new_tokens": "eval_completion_tokens",
    "generation.backend": "generation_backend",
    "generation.vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "generation.vllm_cpu_kv_cache_gib": "vllm_cpu_kv_cache_gib",
}
"""Spec-style keys accepted for the Settings fields (so a preset's override reads the same here)."""

_UNITS = {"": GIB, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "k": 2 ** 10, "m": 2 ** 20, "g": GIB, "t": 2 ** 40,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": GIB, "tib": 2 ** 40}
"""Memory units (a bare number is GiB; K/M/G/T and *iB are binary, kB/MB/GB/TB decimal)."""


def parse_memory(text: str) -> int:
    """'80GiB', '80GB', '141G', '81920MiB' or '80' (GiB) -> bytes; UserError for anything else or <= 0."""
    match = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise UserError(f"--gpu-memory '{text}' is not a memory size; write e.g. 80GiB, 141GB or 81920MiB")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise UserError(f"--gpu-memory must be positive, got '{text}'; write e.g. 80GiB")
    return int(value)


def parse_settings(items: list[str], gpu_memory_bytes: int) -> Settings:
    """``key=value`` items over the default Settings (fields or their spec-style aliases); UserError when bad."""
    fields = {f.name: f for f in dataclasses.fields(Settings) if f.name != "gpu_memory_bytes"}
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"'{item}' is not key=value; write e.g. micro_batch_size=4")
        name = KEY_ALIASES.get(key, key)
        if name not in fields:
            close = difflib.get_close_matches(key, [*fields, *KEY_ALIASES], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"unknown setting '{key}'{hint}; known: {', '.join(fields)}")
        values[name] = _convert(name, raw.strip(), type(getattr(Settings(), name)))
    return Settings(**values, gpu_memory_bytes=gpu_memory_bytes)


CHOICES = {"dtype": ("float32", "bfloat16"), "device": ("cuda", "cpu"), "generation_backend": ("transformers", "vllm")}
"""The text settings and their values."""


def _convert(name: str, raw: str, kind: type) -> Any:
    """One setting's value, checked: booleans true/false, counts >= 0 (sizes >= 1), dtype float32 | bfloat16,
    device cuda | cpu."""
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0", "on", "off"):
            raise UserError(f"'{name}' must be true or false, got '{raw}'")
        return raw.lower() in ("true", "1", "on")
    if kind is str:
        if raw not in CHOICES[name]:
            raise UserError(f"'{name}' must be {' or '.join(CHOICES[name])}, got '{raw}'")
        return raw
    try:
        value = kind(raw)
    except ValueError:
        raise UserError(f"'{name}' must be a{'n integer' if kind is int else ' number'}, got '{raw}'") from None
    least = 1 if name in ("prompt_tokens", "completion_tokens", "group_size", "prompts_per_step", "reward_model_pairs",
                          "reward_model_eval_pairs", "pool_batch_size", "pool_samples", "eval_batch_size",
                          "eval_completion_tokens") else 0
    if value < least:
        raise UserError(f"'{name}' must be >= {least}, got '{raw}'")
    if name == "vllm_gpu_memory_utilization" and not 0 < value <= 1:
        raise UserError(f"'{name}' must be in (0, 1], got '{raw}'")
    return value


def with_backend_flags(settings: Settings, backend: str | None, utilization: float | None) -> Settings:
    """``settings`` with ``--backend`` and ``--vllm-gpu-memory-utilization`` applied (they win over key=value);
    UserError for a share outside (0, 1]."""
    if utilization is not None:
        if not 0 < utilization <= 1:
            raise UserError(f"--vllm-gpu-memory-utilization must be in (0, 1], got {utilization:g}")
        settings = dataclasses.replace(settings, vllm_gpu_memory_utilization=utilization)
    if backend is not None:
        settings = dataclasses.replace(settings, generation_backend=backend)
    return settings


def parse_layout(stage: int | None, gpus: int | None, offload: str, what_if: bool = False) -> Layout | None:
    """The layout ``--zero-stage`` / ``--gpus`` / ``--offload`` / ``--what-if`` ask for (None when none is given);
    UserError when DeepSpeed cannot run it."""
    if what_if:
        if stage not in (None, 3) or offload != "none":
            raise UserError("--what-if is a ZeRO-3 layout without offload; drop --zero-stage / --offload or give "
                            "--zero-stage 3")
        if gpus is not None and not 1 <= gpus <= MAX_GPUS:
            raise UserError(f"--gpus must be between 1 and {MAX_GPUS}, got {gpus}")
        return Layout(3, gpus or 1, what_if_engine=True)
    if stage is None and gpus is None and offload == "none":
        return None
    if gpus is not None and not 1 <= gpus <= MAX_GPUS:
        raise UserError(f"--gpus must be between 1 and {MAX_GPUS}, got {gpus}")
    optimizer, weights = OFFLOADS[offload]
    if stage is None:
        stage = 3 if weights else 0  # weights offload exists only under ZeRO-3; optimizer offload names a stage
    try:
        return Layout(stage, gpus or 1, offload_optimizer=optimizer, offload_params=weights)
    except ValueError as exc:
        raise UserError(f"--zero-stage {stage} --offload {offload}: {exc}") from None


def load_shape(model: str) -> dict[str, Any]:
    """Shape fields of a shipped architecture name, or of a config.json file or a folder holding one."""
    path = Path(model)
    if model.endswith(".json") or path.is_dir():
        config = path / "config.json" if path.is_dir() else path
        if not config.is_file():
            raise UserError(f"--model '{model}' has no config.json; give a shipped architecture name or a config.json")
        try:
            return json.loads(config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"--model '{config}' is not readable JSON ({exc.__class__.__name__})") from None
    from bench.config.architectures import architecture_fields  # torch-free: reads bench/config/architectures/*.json

    try:
        return architecture_fields(model)
    except UserError as exc:
        raise UserError(f"--model: {exc}") from None


def modelled_method(method: str) -> tuple[str, float | None]:
    """(the method of METHOD_ROLES a registered method's memory is modelled as, its KL coefficient where that differs
    from the preset's), from the registry alone (torch-free). GRPO's successors (baselines/grpo_family.py) are the
    engine GRPO's networks and phases with other losses: ``grpo_engine``, without a reference where their defaults
    switch the KL off (DAPO, GSPO). Unknown names raise UserError with the closest known one."""
    from bench.config import registry

    if method in METHOD_ROLES:
        return method, None
    entry = registry.METHODS.get(method)
    if entry is not None and entry.module == "baselines.grpo_family":
        return "grpo_engine", 0.0 if entry.defaults.get("kl") == "none" else None
    known = [*METHOD_ROLES, *successor_names(), ALL]
    close = difflib.get_close_matches(method, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UserError(f"unknown method '{method}'{hint}; use one of {', '.join(known[:-1])} or {ALL}")


def successor_names() -> list[str]:
    """GRPO's successors in registry order (estimated as the engine GRPO: :func:`modelled_method`)."""
    from bench.config import registry

    return [name for name, entry in registry.METHODS.items() if entry.module == "baselines.grpo_family"]


def predict_method(fields: dict[str, Any], method: str, settings: Settings, model: str,
                   layout: Layout | None) -> Prediction:
    """:func:`predict` for any estimable method: a successor is predicted as the method it is modelled as, renamed,
    with a note saying so."""
    like, beta = modelled_method(method)
    own = settings if beta is None else dataclasses.replace(settings, kl_beta=beta)
    prediction = predict(fields, like, own, model=model, layout=layout)
    if like != method:
        prediction.method = method
        prediction.notes.append(f"{method} is modelled as {like} (the same engine, networks and phases; another loss)"
                                + (": no reference, its KL is off" if beta == 0 else ""))
    return prediction


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """`bench estimate`'s arguments (bench/cli.py adds the subcommand with these)."""
    methods = ", ".join([*METHOD_ROLES, *successor_names()])

    def one_line_error(message: str) -> NoReturn:
        # argparse prints the usage block; a mistake here is one line (exit 2) like every other user error.
        if "--gpu-memory" in message and "expected one argument" in message:  # '--gpu-memory -5GiB'
            message = "--gpu-memory must be a positive size such as 80GiB"
        parser.exit(2, f"bench estimate: error: {message}; see bench estimate --help\n")

    parser.error = one_line_error  # type: ignore[method-assign]
    parser.add_argument("--model", default=None,
                        help="shipped architecture (qwen2.5-0.5b ... qwen2.5-72b, llama-3.1-8b, llama-3.1-70b) or a "
                             "config.json / folder holding one")
    parser.add_argument("--method", default=None, help=f"{methods}, or '{ALL}' for every one side by side")
    parser.add_argument("--gpu-memory", default="80GiB", help="memory of one GPU (default 80GiB; e.g. 141GB, 24GiB)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="ask for one layout: DeepSpeed ZeRO stage (0: plain data parallelism)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="ask for one layout: GPUs the run spreads over (default 1); with --time: the GPUs of "
                             "the box, placed as bench run places runs (default 1)")
    parser.add_argument("--offload", choices=tuple(OFFLOADS), default="none",
                        help="ask for one layout: offload the optimizer state (ZeRO >= 1) or it and the weights "
                             "(all; ZeRO-3) to CPU memory")
    parser.add_argument("--what-if", action="store_true",
                        help="ask for the suite engine's ZeRO-3 what-if (not what it does): the reference and reward "
                             "model sharded too, generation from a bf16 gather of the actor")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default=None,
                        help="generation.backend (default transformers, the spec's default; the gsm8k-qwen0.5b preset "
                             "runs vllm): vllm replaces HF generate's KV cache by vLLM's weights copy and "
                             "preallocated KV cache")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=None, metavar="SHARE",
                        help="with --backend vllm: the share of the GPU vLLM takes, in (0, 1] (default 0.3, "
                             "generation.vllm_gpu_memory_utilization)")
    parser.add_argument("--time", action="store_true",
                        help="project the wall time of a whole suite run instead of its memory: per run of the plan "
                             "and per phase, tokens and FLOPs over assumed (datasheet) or calibrated rates, totals "
                             "for 1 and --gpus GPUs; a projection, never a measurement (bench.systems.walltime)")
    parser.add_argument("--preset", default=None,
                        help="with --time: the preset (or YAML file) whose plan is projected; key=value items are "
                             "then its overrides, e.g. seeds=[0]")
    parser.add_argument("--gpu-type", default=None, metavar="TYPE",
                        help="with --time: the GPU the projection is for: " + ", ".join(GPUS))
    parser.add_argument("--calibrate", action="append", default=None, metavar="DIR",
                        help="with --time: a suite folder of finished runs (e.g. the step1/ and step2/ folders "
                             "scripts/gpu_check.sh writes): its measured phase times replace the assumed rates of "
                             "the phases it timed (repeatable)")
    names = ", ".join(f.name for f in dataclasses.fields(Settings) if f.name != "gpu_memory_bytes")
    parser.add_argument("settings", nargs="*", metavar="key=value",
                        help=f"override the gsm8k-qwen0.5b preset's shapes: {names} (or the spec's keys, e.g. "
                             f"train.micro_batch_size); with --time: overrides of the preset")


def run_estimate(args: argparse.Namespace) -> int:
    """Predict and print (table or JSON); UserError for bad input. (``--time``, the wall-time projection, is
    bench.systems.walltime.run_time_estimate: bench.cli hands it the planner.)"""
    for attr, flag in (("preset", "--preset"), ("gpu_type", "--gpu-type"), ("calibrate", "--calibrate")):
        if getattr(args, attr, None):
            raise UserError(f"{flag} belongs to the wall-time projection; add --time (bench estimate --time "
                            f"--preset PRESET --gpu-type TYPE), or drop {flag}")
    missing = [flag for attr, flag in (("model", "--model"), ("method", "--method")) if getattr(args, attr) is None]
    if missing:
        raise UserError(f"the following arguments are required: {', '.join(missing)} (or --time --preset PRESET "
                        f"--gpu-type TYPE for the wall-time projection); see bench estimate --help")
    methods = list(METHOD_ROLES) if args.method == ALL else [args.method]
    engine_methods = [m for m in methods if modelled_method(m)[0] in ENGINE_METHODS]
    gpu_memory = parse_memory(args.gpu_memory)
    layout = parse_layout(args.zero_stage, args.gpus, args.offload, getattr(args, "what_if", False))
    if layout is not None and layout.what_if_engine and len(engine_methods) < len(methods):
        raise UserError(f"--what-if is the suite engine's ({', '.join(ENGINE_METHODS)}); TRL's trainers shard their "
                        f"frozen networks under ZeRO-3 already: use --zero-stage 3")
    fields = load_shape(args.model)
    settings = with_backend_flags(parse_settings(args.settings, gpu_memory), getattr(args, "backend", None),
                                  getattr(args, "vllm_gpu_memory_utilization", None))
    try:
        predictions = [predict_method(fields, m, settings, args.model, layout) for m in methods]
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise UserError(f"--model '{args.model}' lacks a shape field ({exc}); it needs hidden_size, "
                        f"intermediate_size, num_hidden_layers, num_attention_heads and vocab_size") from None
    if args.json:
        data = predictions[0].to_json() if len(predictions) == 1 else {
            "model": args.model, "methods": {p.method: p.to_json() for p in predictions}}
        print(json.dumps(data, indent=2))
    else:
        print("\n\n".join(format_prediction(p) for p in predictions))
    return 0


# ----------------------------------------------------------------------------------------------
# The table


def size(n: int | float) -> str:
    """Bytes as GiB (MiB below 1 GiB, KiB below 1 MiB, plain bytes below that)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{int(n)} B"


def format_prediction(p: Prediction) -> str:
    """The readable answer: networks, phases, peak, fits, largest micro-batch and GPU counts."""
    s = p.settings
    step = (f"{s.prompts_per_step} pairs" if p.method == "dpo"
            else f"{s.prompts_per_step} prompts x G {s.group_size}")
    lines = [f"{p.method} on {p.model} ({p.parameters / 1e9:.2f}B parameters), {s.dtype}: micro-batch "
             f"{s.micro_batch_size or 'whole step'}, {step}, "
             f"{s.prompt_tokens} + {s.completion_tokens} tokens, gradient checkpointing "
             f"{'on' if s.gradient_checkpointing else 'off'}, LoRA {s.lora_rank or 'off'}", ""]
    header = ("network", "stored", "parameters", "weights", "gradients", "optimizer", "static", "bf16 copy")
    rows = [header]
    for n in p.networks.values():
        stored = f"{n.storage}{' (frozen)' if not n.trained else ''}"
        if n.role == "reference" and p.settings.lora_rank and not n.parameters:
            stored = "actor's base, adapters off"  # no weights of its own
        rows.append((n.role, stored, f"{n.parameters / 1e9:.3f}B", size(n.weights_bytes), size(n.gradients_bytes),
                     size(n.optimizer_bytes), size(n.static_bytes), size(n.working_copy_bytes)))
    rows.append(("total", "", "", size(sum(n.weights_bytes for n in p.networks.values())),
                 size(sum(n.gradients_bytes for n in p.networks.values())),
                 size(sum(n.optimizer_bytes for n in p.networks.values())), size(p.static_bytes), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    resident = (f"resident between steps: {size(p.resident_bytes)}"
                + (f" (the static total less the {size(p.static_bytes - p.resident_bytes)} of gradients TRL's Trainer "
                   f"frees after each step; they count in the update)" if p.resident_bytes != p.static_bytes else
                   " (the static total)"))
    lines += ["", resident, *format_backend(p), "per phase, on top of it (approximate; the phase's largest moment):"]
    lines += format_phases(p.phases, p.moments, p.peak_phase)
    acts = p.activations_bytes
    why = ("the static terms alone exceed one GPU" if p.resident_bytes > s.gpu_memory_bytes
           else "the static terms plus one sequence's step exceed one GPU")
    outside = ", ".join(f"{k.replace('_', ' ')} {size(v)}" for k, v in p.outside_allocator.items())
    lines += [f"activations per micro-batch (trained networks): {size(acts['checkpointing'])} with gradient "
              f"checkpointing, {size(acts['no_checkpointing'])} without; KV cache {size(p.kv_cache_bytes)}; "
              f"update logits {size(p.logits_bytes)}",
              "",
              f"peak {size(p.peak_bytes)} in {p.peak_phase} ({p.peak_moment}; PyTorch's allocator)"
              + (f" + {outside} outside it = {size(p.device_peak_bytes)}" if outside else "")
              + f"; GPU {size(s.gpu_memory_bytes)}: {'fits' if p.fits else 'does NOT fit'}",
              f"largest micro-batch that fits: {p.max_micro_batch or f'none ({why})'}",
              "", *format_gpu_counts(p, why)]
    if p.layout is not None:
        lines += ["", *format_layout(p.layout, s.gpu_memory_bytes)]
    for stage in p.stages.values():
        lines += ["", *format_stage(stage, s.gpu_memory_bytes)]
    lines += ["", "static terms exact; the rest approximate (no allocator cache or fragmentation)",
              *[f"note: {n}" for n in p.notes[1:] if not n.startswith("generation backend vllm")]]  # shown above
    return "\n".join(lines)


def format_backend(p: Prediction) -> list[str]:
    """The generation backend and, with vLLM, its reservation term by term (bench.systems.memory_vllm)."""
    s, v = p.settings, p.vllm
    if v is None:
        return ["generation backend: transformers (HF generate: its KV cache and sampling logits in the generation "
                "phases)"]
    share = (f"ceil({s.vllm_gpu_memory_utilization:g} x {size(s.gpu_memory_bytes)})" if s.device != "cpu"
             else "CPU: the KV cache asked for plus")
    lines = [f"generation backend: vllm, its share {share} = {size(v['requested_bytes'])}: vllm weights "
             f"{size(v['weights_bytes'])} + vllm activations {size(v['activation_bytes'])} (profile run of "
             f"{v['max_num_batched_tokens']:,} tokens, {v['max_num_seqs']:,} sequences) + vllm kv cache "
             f"{size(max(0, v['kv_cache_bytes']))} ({v['kv_tokens']:,} tokens, {v['sequences_held']:,} sequences of "
             f"{s.prompt_tokens} + {s.completion_tokens})",
             f"  {vllm_when(p.method, s, v['sleeps'])}"]
    if v["problem"]:
        lines.append(f"  vLLM cannot start: {v['problem']}")
    return lines


def format_phases(phases: dict[str, dict[str, int]], moments: dict[str, Any], peak_phase: str,
                  indent: str = "  ") -> list[str]:
    """One line per phase: its total, its terms and, for a phase of several moments, the moment that peaks."""
    lines = []
    for phase, terms in phases.items():
        parts = ", ".join(f"{k.replace('_', ' ')} {size(v)}" for k, v in terms.items() if k != "total")
        by_moment = moments.get(phase) or {}
        at = max(by_moment, key=lambda m: sum(by_moment[m].values())) if len(by_moment) > 1 else None
        mark = "  <- peak" if phase == peak_phase else ""
        lines.append(f"{indent}{phase:<14} {size(terms['total']):>12}  "
                     f"({f'at {at}: ' if at else ''}{parts or 'nothing'}){mark}")
    return lines


def format_stage(stage: StagePrediction, gpu_memory: int) -> list[str]:
    """A stage the method reads (its own process): resident bytes, phases, peak, fits."""
    title = {"reward_model": "reward-model stage (TRL RewardTrainer, micro-batches of train.micro_batch_size pairs)",
             "sample_pool": "sample-pool stage (the frozen starting policy generating the pool)"}[stage.stage]
    lines = [f"{title}: resident {size(stage.resident_bytes)} (static {size(stage.static_bytes)})"]
    lines += format_phases(stage.phases, stage.moments, stage.peak_phase)
    line = (f"  peak {size(stage.peak_bytes)} in {stage.peak_phase}; with the CUDA context "
            f"{size(stage.device_peak_bytes)}; GPU {size(gpu_memory)}: {'fits' if stage.fits else 'does NOT fit'}")
    if stage.max_micro_batch is not None:
        fits = f"{stage.max_micro_batch} pairs" if stage.max_micro_batch else "none"
        line += f"; largest micro-batch that fits: {fits}"
    return [*lines, line]


def format_gpu_counts(p: Prediction, why: str) -> list[str]:
    """The fewest GPUs of the given size per layout, each with its per-GPU peak there (and host memory)."""
    lines = [f"GPUs of {size(p.settings.gpu_memory_bytes)} needed (the rollout split over them; per-GPU peak there):"]
    width = max(len(label) for label in LAYOUT_LABELS.values())
    for name in LAYOUT_LABELS:
        count, memory = p.gpus.get(name), p.gpus_memory.get(name)
        if count is None or memory is None:
            never = ENGINE_NEVER if modelled_method(p.method)[0] in ENGINE_METHODS else NEVER
            answer = f"never ({why})" if name == "dp" else f"never ({never[name]})"
        else:
            answer = f"{count:>4}   peak {size(memory.peak_bytes)} in {memory.peak_phase}"
            if memory.host_bytes:
                answer += f"; host memory {size(memory.host_bytes)} over all ranks"
        lines.append(f"  {LAYOUT_LABELS[name]:<{width}}  {answer}")
    for name, w in p.what_if.items():
        memory = w["memory"]
        answer = (f"{w['gpus']:>4}   peak {size(memory.peak_bytes)} in {memory.peak_phase}" if memory
                  else f"never (not within {MAX_GPUS} GPUs)")
        lines.append(f"  {'what-if ' + LAYOUT_LABELS['zero3']:<{width}}  {answer}")
        lines.append(f"    ({w['label']})")
    return lines


def layout_title(layout: Layout) -> str:
    """'ZeRO-2 on 8 GPUs', 'ZeRO-3 + CPU offload (optimizer, weights) on 4 GPUs', 'plain data parallel on 1 GPU'."""
    what = "plain data parallel" if layout.stage == 0 else f"ZeRO-{layout.stage}"
    if layout.what_if_engine:
        what = "what-if ZeRO-3 (frozen networks sharded, bf16 generation gather)"
    offloaded = [w for w, on in (("optimizer", layout.offload_optimizer), ("weights", layout.offload_params)) if on]
    if offloaded:
        what += f" + CPU offload ({', '.join(offloaded)})"
    return f"{what} on {layout.gpus} GPU{'s' if layout.gpus > 1 else ''}"


def format_layout(m: LayoutMemory, gpu_memory: int) -> list[str]:
    """The asked-for layout: what each GPU holds, what each phase adds, the peak, fits, largest micro-batch."""
    held = ", ".join(f"{k.replace('_', ' ')} {size(v)}" for k, v in m.static.items() if k != "total" and v)
    lines = [f"layout: {layout_title(m.layout)}",
             f"  per GPU between steps: {size(m.static['total'])} ({held or 'nothing'})"]
    for phase, terms in m.phases.items():
        mark = "  <- peak" if phase == m.peak_phase else ""
        lines.append(f"  {phase:<14} +{size(terms['total'])}{mark}")
    outside = sum((m.outside_allocator or {}).values())
    if outside:
        lines.append(f"  outside the allocator: {size(outside)} (CUDA context, NCCL buffers)")
    lines.append(f"  peak per GPU {size(m.peak_bytes)} in {m.peak_phase}; GPU {size(gpu_memory)}: "
                 f"{'fits' if m.fits else 'does NOT fit'}; largest micro-batch that fits: "
                 f"{m.max_micro_batch or 'none'}")
    if m.host_bytes:
        lines.append(f"  host (CPU) memory for the offloaded state: {size(m.host_bytes)} over all ranks "
                     f"({size(m.host_bytes / m.layout.gpus)} per rank)")
    return lines


if __name__ == "__main__":  # python -m bench.systems.estimate ... (the same as `bench estimate`)
    parser = argparse.ArgumentParser(prog="bench estimate")
    add_estimate_arguments(parser)
    try:
        sys.exit(run_estimate(parser.parse_args()))
    except UserError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
