"""The shared sample pool: G completions per training prompt from the initial policy, labelled by the verifier.

DPO trains on (correct, incorrect) pairs from it and the PPO reward model is trained on the same pairs,
so the two offline consumers see exactly the same data (DESIGN.md §4).

``sample_pool.pairs: gold`` is for systems runs on random weights, where no sampled completion is ever
correct and the verifier pairs would be empty: each pool line then also carries the gold worked solution
(rendered as the warm start's target, ``bench.task.problems.format_target``) and :func:`preference_pairs` pairs it,
as chosen, with a sampled incorrect completion, as rejected. The lines say which mode wrote them
(``"pairs"``), so the consumers (DPO, the reward model) need no setting of their own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from bench.execution.context import RunContext, TrainOutcome
from bench.model.generation import completion_length, eos_token_ids, generate, sampling_settings
from bench.model.loading import load_causal_lm
from bench.model.numerics import actor_numerics
from bench.task.problems import format_target
from bench.task.verifier import is_correct

LABEL = "Sample pool (verifier-labelled)"
ENGINE = "suite"
POOL_FILE = "pool.jsonl"
VERIFIER_PAIRS = "verifier"
GOLD_PAIRS = "gold"


def sample(model: Any, tokenizer: Any, prompts: list[str], n: int,
           settings: dict[str, Any]) -> tuple[list[list[str]], int]:
    """``n`` completions per prompt decoded with exactly ``settings`` (``generation.sampling_settings``).

    Returns (completions per prompt, generated tokens counted up to and including each first EOS).
    """
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    with torch.inference_mode():
        out = generate(model, enc["input_ids"], enc["attention_mask"], {**settings, "num_return_sequences": n})
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    texts, tokens = [], 0
    for row in new:
        length = completion_length(row, settings["eos_token_id"])
        tokens += length
        texts.append(tokenizer.decode(row[:length], skip_special_tokens=True))
    return [texts[i * n:(i + 1) * n] for i in range(len(prompts))], tokens


def read_pool(path: Path) -> list[dict[str, Any]]:
    """Pool entries: {'prompt', 'answer', 'question', 'completions': [str], 'correct': [bool], 'pairs': mode},
    plus 'gold_completion' (the worked solution as a completion) when mode is 'gold'. Lines written before the
    mode was recorded have no 'pairs' key and are read as verifier lines."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def pool_entry(row: dict[str, Any], completions: list[str], correct: list[bool], pairs: str) -> dict[str, Any]:
    """One pool line for a training ``row`` (``bench.task.problems.to_rows`` keys) and its labelled completions.

    ``pairs`` is the spec's ``sample_pool.pairs``; in gold mode the line also stores the gold worked solution
    as the completion the warm start would learn (``format_target(row["solution"])``).
    """
    entry = {"prompt": row["prompt"], "answer": row["answer"], "question": row["question"],
             "completions": completions, "correct": correct, "pairs": pairs}
    if pairs == GOLD_PAIRS:
        entry["gold_completion"] = format_target(row["solution"])
    return entry


def entry_pair(entry: dict[str, Any]) -> dict[str, str] | None:
    """The (prompt, chosen, rejected) pair of one pool line, or None when it gives no preference.

    verifier lines: chosen = the first correct sampled completion, rejected = the first incorrect one; a
    prompt whose completions are all right or all wrong gives none. gold lines: chosen = the gold worked
    solution, rejected = the first incorrect sampled completion; none when every sample is correct (the gold
    solution is then no better than a sample).
    """
    right = [c for c, ok in zip(entry["completions"], entry["correct"]) if ok]
    wrong = [c for c, ok in zip(entry["completions"], entry["correct"]) if not ok]
    if not wrong:
        return None
    if entry.get("pairs", VERIFIER_PAIRS) == GOLD_PAIRS:
        return {"prompt": entry["prompt"], "chosen": entry["gold_completion"], "rejected": wrong[0]}
    if not right:
        return None
    return {"prompt": entry["prompt"], "chosen": right[0], "rejected": wrong[0]}


def entry_pairs(entry: dict[str, Any]) -> list[dict[str, str]]:
    """Every (prompt, chosen, rejected) pair of one pool line: each correct sample against each incorrect one
    (verifier lines), or the gold solution against each incorrect sample (gold lines); [] when
    :func:`entry_pair` gives none. Its first pair is :func:`entry_pair`'s. The reward model trains on these."""
    if entry_pair(entry) is None:
        return []
    wrong = [c for c, ok in zip(entry["completions"], entry["correct"]) if not ok]
    if entry.get("pairs", VERIFIER_PAIRS) == GOLD_PAIRS:
        right = [entry["gold_completion"]]
    else:
        right = [c for c, ok in zip(entry["completions"], entry["correct"]) if ok]
    return [{"prompt": entry["prompt"], "chosen": c, "rejected": r} for c in right for r in wrong]


def preference_pairs(pool: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One (prompt, chosen, rejected) pair per pool line that gives a preference (see :func:`entry_pair`)."""
    return [pair for pair in map(entry_pair, pool) if pair is not None]


def required_pairs(path: Path, needed: int, consumer: str) -> list[dict[str, str]]:
    """The pool's preference pairs, or a one-line UserError when there are fewer than ``needed`` for ``consumer``
    (e.g. 'the reward model'), naming the fixes: gold pairs, or a larger pool.

    Called by the pool's consumers (DPO, the reward-model stage) before they load anything: a pool with no
    correct sample (a weak model at temperature 1.0) gives no verifier pair, and the run must say so in one line
    rather than fail inside a trainer."""
    from bench.errors import UserError

    pool = read_pool(path)
    pairs = preference_pairs(pool)
    if len(pairs) >= needed:
        return pairs
    mode = pool[0].get("pairs", VERIFIER_PAIRS) if pool else VERIFIER_PAIRS
    completions = sum(len(e["completions"]) for e in pool)
    correct = sum(sum(map(bool, e["correct"])) for e in pool)
    fix = ("raise sample_pool.prompts or sample_pool.samples_per_prompt" if mode == GOLD_PAIRS else
           "set sample_pool.pairs=gold (the gold solution as chosen), or raise sample_pool.prompts or "
           "sample_pool.samples_per_prompt, or warm-start the model further")
    raise UserError(f"the sample pool has {len(pairs)} preference pairs (sample_pool.pairs={mode}; {correct} of "
                    f"{completions} sampled completions correct over {len(pool)} prompts) but {consumer} needs at "
                    f"least {needed}; {fix}")


def train(ctx: RunContext) -> TrainOutcome:
    """Sample the pool with the matched generation settings and write RUN_DIR/pool.jsonl."""
    spec, pool_spec = ctx.spec, ctx.spec.sample_pool
    tokenizer = ctx.starting_tokenizer()
    policy = load_causal_lm(ctx.init_model_dir, spec.model, ctx.device).eval()
    rows = ctx.train_rows[: pool_spec.prompts]
    path = ctx.run_dir / POOL_FILE
    n = pool_spec.samples_per_prompt
    settings = sampling_settings(spec, tokenizer, eos_token_ids(policy, tokenizer), greedy=False)
    counts = {"completions": 0, "correct": 0, "mixed": 0, "all_right": 0, "all_wrong": 0, "tokens": 0, "pairs": 0}
    with open(path, "w", encoding="utf-8") as handle:
        for start in range(0, len(rows), pool_spec.batch_size):
            batch = rows[start:start + pool_spec.batch_size]
            ctx.telemetry.step_begin()
            # the starting policy stored in bf16 but sampled in the actor's numerics (bench.model.numerics): the
            # distribution every online method's first rollout samples from
            with ctx.telemetry.phase("generation"), actor_numerics(policy, spec.model.dtype):
                completions, tokens = sample(policy, tokenizer, [r["prompt"] for r in batch], n, settings)
            with ctx.telemetry.phase("reward"):
                for row, texts in zip(batch, completions):
                    correct = [is_correct(t, row["answer"], "suite-strict") for t in texts]
                    entry = pool_entry(row, texts, correct, pool_spec.pairs)
                    handle.write(json.dumps(entry) + "\n")
                    counts["pairs"] += entry_pair(entry) is not None
                    counts["completions"] += n
                    counts["correct"] += sum(correct)
                    counts["mixed"] += 0 < sum(correct) < n
                    counts["all_right"] += sum(correct) == n
                    counts["all_wrong"] += sum(correct) == 0
            counts["tokens"] += tokens
            ctx.telemetry.step_end()
            done = min(start + pool_spec.batch_size, len(rows))
            ctx.progress(done, len(rows), {"accuracy": counts["correct"] / max(counts["completions"], 1)})
    prompts = max(len(rows), 1)
    return TrainOutcome(
        policy=policy, tokenizer=tokenizer, networks={"actor": policy},
        steps=0, completions=counts["completions"], generated_tokens=counts["tokens"],
        settings={"prompts": len(rows), "samples_per_prompt": n, "pairs": pool_spec.pairs, "generation": settings},
        metrics={"pool_accuracy": counts["correct"] / max(counts["completions"], 1),
                 "pairs": counts["pairs"], "mixed_prompt_share": counts["mixed"] / prompts,
                 "all_right_share": counts["all_right"] / prompts, "all_wrong_share": counts["all_wrong"] / prompts},
        save_dir=path,
    )
