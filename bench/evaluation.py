"""Evaluation: greedy, batched (left padding) accuracy on the held-out split, strict and flexible.

Every method is evaluated by this one function on the same questions in the same order with the same
decoding, so per-question verdicts can be paired across methods (McNemar in the report).
"""

from __future__ import annotations

from typing import Any, Callable

from bench.generation import completion_length, eos_token_ids, generate, greedy_settings
from bench.stats import wilson_interval
from bench.verifier import MODES, is_correct


def score_summary(verdicts: list[bool]) -> dict[str, Any]:
    """{'correct', 'total', 'accuracy', 'low', 'high'} with a 95% Wilson interval."""
    correct, total = sum(verdicts), len(verdicts)
    low, high = wilson_interval(correct, total)
    return {"correct": correct, "total": total, "accuracy": correct / total if total else 0.0, "low": low, "high": high}


def generate_greedy(model: Any, tokenizer: Any, prompts: list[str], settings: dict[str, Any], batch_size: int,
                    on_batch: Callable[[int, int], None] | None = None) -> tuple[list[str], list[int]]:
    """Completions for ``prompts`` decoded with exactly ``settings`` (greedy: ``generation.greedy_settings``).

    Returns (texts, new-token counts up to and including the first EOS of ``settings['eos_token_id']``).
    ``batch_size``: prompts per generate call (left padded). The model's own generation_config never applies.
    """
    import torch

    texts: list[str] = []
    lengths: list[int] = []
    eos_ids = settings["eos_token_id"]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            out = generate(model, enc["input_ids"], enc["attention_mask"], settings)
            new = out[:, enc["input_ids"].shape[1] :]
            for row in new.tolist():
                n = completion_length(row, eos_ids)
                lengths.append(n)
                texts.append(tokenizer.decode(row[:n], skip_special_tokens=True))
            if on_batch:
                on_batch(min(start + batch_size, len(prompts)), len(prompts))
    if was_training:
        model.train()
    return texts, lengths


def evaluate(model: Any, tokenizer: Any, rows: list[dict[str, str]], max_new_tokens: int, batch_size: int,
             samples_in_report: int = 5, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Accuracy of ``model`` on ``rows`` ({'prompt', 'answer', 'question'}).

    ``settings``: the decoding (``generation.sampling_settings(spec, tokenizer, eos_token_ids(model, tokenizer),
    greedy=True)``); its ``max_new_tokens`` must equal ``max_new_tokens``. Without it, greedy decoding with
    ``max_new_tokens`` and every EOS id of the model and tokenizer.

    Returns {'scores': {mode: SCORE}, 'verdicts': [{'index', 'correct_strict', 'correct_flexible'}],
    'samples': [...], 'mean_length_tokens': float, 'generation': settings used}.
    """
    if settings is None:
        settings = greedy_settings(tokenizer, eos_token_ids(model, tokenizer), max_new_tokens)
    elif settings["max_new_tokens"] != max_new_tokens:
        raise ValueError(f"evaluate: settings['max_new_tokens'] ({settings['max_new_tokens']}) differs from "
                         f"max_new_tokens ({max_new_tokens}); build the settings from the same spec")
    completions, lengths = generate_greedy(model, tokenizer, [r["prompt"] for r in rows], settings, batch_size)
    verdicts = []
    by_mode: dict[str, list[bool]] = {mode: [] for mode in MODES}
    for index, (row, text) in enumerate(zip(rows, completions)):
        entry: dict[str, Any] = {"index": index}
        for mode in MODES:
            ok = is_correct(text, row["answer"], mode)
            by_mode[mode].append(ok)
            entry[f"correct_{mode}"] = ok
        verdicts.append(entry)
    samples = [
        {"question": row["question"], "completion": text, "gold": row["answer"], "correct": v["correct_strict"]}
        for row, text, v in list(zip(rows, completions, verdicts))[:samples_in_report]
    ]
    return {
        "scores": {mode: score_summary(values) for mode, values in by_mode.items()},
        "verdicts": verdicts,
        "samples": samples,
        "mean_length_tokens": sum(lengths) / len(lengths) if lengths else 0.0,
        "generation": dict(settings),
    }
