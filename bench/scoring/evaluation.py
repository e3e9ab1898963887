"""Evaluation: greedy, batched (left padding) accuracy on the held-out split under every scoring mode.

Every method is evaluated by this one function on the same questions in the same order with the same
decoding, so per-question verdicts can be paired across methods (McNemar in the report). Every completion is
kept (`completion_records`, written by the worker as RUN_DIR/completions.jsonl) so that any number can be
audited and re-scored (`bench score RUN_DIR`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from bench.model.generation import completion_length, eos_token_ids, generate, greedy_settings
from bench.scoring.stats import wilson_interval
from bench.task.verifier import HEADLINE_MODE, MODES, judge


def score_summary(verdicts: list[bool]) -> dict[str, Any]:
    """{'correct', 'total', 'accuracy', 'low', 'high'} with a 95% Wilson interval."""
    correct, total = sum(verdicts), len(verdicts)
    low, high = wilson_interval(correct, total)
    return {"correct": correct, "total": total, "accuracy": correct / total if total else 0.0, "low": low, "high": high}


def question_id(question: str) -> str:
    """A stable id of a question: the first 16 hex digits of sha256 of its text (UTF-8, as given)."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


def _generate(model: Any, tokenizer: Any, prompts: list[str], settings: dict[str, Any], batch_size: int,
              on_batch: Callable[[int, int], None] | None) -> tuple[list[str], list[int], list[bool]]:
    """(texts, token counts, hit-max flags) for ``prompts``; see `generate_greedy`."""
    import torch

    texts: list[str] = []
    lengths: list[int] = []
    hit_max: list[bool] = []
    eos_ids = settings["eos_token_id"]
    stops = {int(eos_ids)} if isinstance(eos_ids, int) else {int(i) for i in eos_ids or ()}
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
                # A row with no EOS ran to the budget: a batch only stops early once every row has ended.
                hit_max.append(not (n > 0 and int(row[n - 1]) in stops))
                texts.append(tokenizer.decode(row[:n], skip_special_tokens=True))
            if on_batch:
                on_batch(min(start + batch_size, len(prompts)), len(prompts))
    if was_training:
        model.train()
    return texts, lengths, hit_max


def generate_greedy(model: Any, tokenizer: Any, prompts: list[str], settings: dict[str, Any], batch_size: int,
                    on_batch: Callable[[int, int], None] | None = None) -> tuple[list[str], list[int]]:
    """Completions for ``prompts`` decoded with exactly ``settings`` (greedy: ``generation.greedy_settings``).

    Returns (texts, new-token counts up to and including the first EOS of ``settings['eos_token_id']``).
    ``batch_size``: prompts per generate call (left padded). The model's own generation_config never applies.
    """
    texts, lengths, _ = _generate(model, tokenizer, prompts, settings, batch_size, on_batch)
    return texts, lengths


def completion_record(index: int, row: dict[str, str], completion: str, tokens: int, hit_max: bool) -> dict[str, Any]:
    """One line of completions.jsonl: the question's completion and its verdict under every mode.

    ``row``: {'question', 'prompt', 'answer' (canonical gold number), 'solution' (the GSM8K worked answer;
    optional, defaults to 'answer')}. Suite modes compare with the gold number, lm-eval modes with the worked
    answer, as lm-eval does. Keys: index, id (`question_id`), prompt, completion, tokens (generated tokens,
    the EOS included), hit_max (no EOS within max_new_tokens), gold, gold_answer, extracted {mode: str | None},
    correct {mode: bool}.
    """
    gold, gold_answer = row["answer"], row.get("solution") or row["answer"]
    record: dict[str, Any] = {"index": index, "id": question_id(row["question"]), "prompt": row["prompt"],
                              "completion": completion, "tokens": int(tokens), "hit_max": bool(hit_max),
                              "gold": gold, "gold_answer": gold_answer}
    return {**record, **verdicts_of(completion, gold, gold_answer)}


def verdicts_of(completion: str, gold: str, gold_answer: str) -> dict[str, dict[str, Any]]:
    """{'extracted': {mode: str | None}, 'correct': {mode: bool}} for one completion under every mode in MODES."""
    extracted: dict[str, str | None] = {}
    correct: dict[str, bool] = {}
    for mode in MODES:
        reference = gold_answer if mode.startswith("lmeval-") else gold
        extracted[mode], correct[mode] = judge(completion, reference, mode)
    return {"extracted": extracted, "correct": correct}


def summarize_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Scores and rates of a list of completion records (as `completion_record` writes them).

    Returns {'scores': {mode: SCORE}, 'format_rate': share of completions from which suite-strict extracts an
    answer, 'truncated_rate': share that hit max_new_tokens without EOS, 'mean_length_tokens': float}; rates
    are 0.0 for no records.
    """
    n = len(records)
    return {
        "scores": {mode: score_summary([bool(r["correct"][mode]) for r in records]) for mode in MODES},
        "format_rate": sum(r["extracted"][HEADLINE_MODE] is not None for r in records) / n if n else 0.0,
        "truncated_rate": sum(bool(r["hit_max"]) for r in records) / n if n else 0.0,
        "mean_length_tokens": sum(r["tokens"] for r in records) / n if n else 0.0,
    }


def evaluate(model: Any, tokenizer: Any, rows: list[dict[str, str]], max_new_tokens: int, batch_size: int,
             samples_in_report: int = 5, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Accuracy of ``model`` on ``rows`` ({'prompt', 'answer', 'question'}, optionally 'solution').

    ``settings``: the decoding (``generation.sampling_settings(spec, tokenizer, eos_token_ids(model, tokenizer),
    greedy=True)``); its ``max_new_tokens`` must equal ``max_new_tokens``. Without it, greedy decoding with
    ``max_new_tokens`` and every EOS id of the model and tokenizer.

    Returns {'scores': {mode: SCORE}, 'records': [completion_record per row, in order], 'format_rate',
    'truncated_rate', 'samples': the first ``samples_in_report`` as {'question', 'completion', 'gold', 'correct'
    (headline mode)}, 'mean_length_tokens': float, 'generation': settings used}.
    """
    if settings is None:
        settings = greedy_settings(tokenizer, eos_token_ids(model, tokenizer), max_new_tokens)
    elif settings["max_new_tokens"] != max_new_tokens:
        raise ValueError(f"evaluate: settings['max_new_tokens'] ({settings['max_new_tokens']}) differs from "
                         f"max_new_tokens ({max_new_tokens}); build the settings from the same spec")
    texts, lengths, hit_max = _generate(model, tokenizer, [r["prompt"] for r in rows], settings, batch_size, None)
    records = [completion_record(i, row, text, n, hit) for i, (row, text, n, hit)
               in enumerate(zip(rows, texts, lengths, hit_max))]
    samples = [
        {"question": row["question"], "completion": r["completion"], "gold": row["answer"],
         "correct": r["correct"][HEADLINE_MODE]}
        for row, r in list(zip(rows, records))[:samples_in_report]
    ]
    return {**summarize_records(records), "records": records, "samples": samples, "generation": dict(settings)}
