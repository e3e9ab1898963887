"""The matched data: the same training prompts in the same order and the same test questions for every method."""

from __future__ import annotations

import random
from typing import Any

from bench.models import render_prompt
from bench.spec import Spec
from bench.tasks import format_target, generate_synthetic, load_gsm8k, synthetic_splits, to_rows


def task_problems(spec: Spec) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test) problems ({'question', 'answer'}) as the spec describes; deterministic."""
    task = spec.task
    if task.source == "synthetic":
        s = task.synthetic
        return synthetic_splits(task.train_size, task.test_size, s.seed, s.max_operand, s.max_steps)
    train = load_gsm8k(str(task.path), "train", limit=None)
    test = load_gsm8k(str(task.path), "test", limit=task.test_size)
    return train[: task.train_size], test


def tokenizer_corpus(spec: Spec) -> list[str]:
    """Text a stand-in tokenizer is trained on: prompts and warm-start targets of the task.

    Synthetic task: 2,000 problems from a generator seed the splits do not use. GSM8K: the training split's
    questions and worked answers (never the test split), so the tokenizer covers what training sees.
    """
    if spec.task.source == "gsm8k":
        train, _ = task_problems(spec)
        return [r["prompt"] + format_target(p["answer"]) for r, p in zip(to_rows(train), train)]
    s = spec.task.synthetic
    problems = generate_synthetic(2000, s.seed + 1, s.max_operand, s.max_steps)
    rows = to_rows(problems)
    return [r["prompt"] + format_target(p["answer"]) for r, p in zip(rows, problems)]


def matched_rows(spec: Spec, tokenizer: Any, seed: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train_rows, test_rows) with fully rendered prompts; training rows shuffled once with ``seed``.

    Every method of a given seed sees exactly this order; online methods take
    ``train.prompts_per_step`` rows per step from the front, wrapping around.
    """
    train, test = task_problems(spec)
    train_rows, test_rows = to_rows(train), to_rows(test)
    for row in train_rows + test_rows:
        row["prompt"] = render_prompt(tokenizer, row["prompt"], spec.model.use_chat_template)
    random.Random(seed).shuffle(train_rows)
    return train_rows, test_rows


def prompts_for_steps(rows: list[dict[str, str]], steps: int, per_step: int) -> list[dict[str, str]]:
    """The first ``steps * per_step`` rows of the matched order, wrapping around when the set is smaller."""
    total = steps * per_step
    return [rows[i % len(rows)] for i in range(total)]
