"""The matched data: the same training prompts in the same order and the same test questions for every method."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from bench.task.bundled import gsm8k_path
from bench.task.prompts import render_prompt
from bench.config.spec import Spec
from bench.task.problems import (TEST_SHARE_PERCENT, VALIDATION_SHARE_PERCENT, carve_validation, format_target,
                         generate_synthetic, is_held_out, is_validation, question_overlap, read_gsm8k, step_overlap,
                         synthetic_splits, synthetic_train_validation, to_rows, working, working_overlap)


@dataclass
class TaskData:
    """The task's (train, test) problems as every run sees them, and notes on what loading left out."""

    train: list[dict[str, str]]
    test: list[dict[str, str]]
    notes: list[str] = field(default_factory=list)
    """One line each: rows dropped for a bad gold answer, splits shorter than asked, one file for both splits,
    test questions that also occur in the train split."""
    checks: dict[str, int | str] = field(default_factory=dict)
    """What was checked about the test split being held out, for the result. Keys ending in ``_overlap`` are
    counts of test problems (0 expected): ``question_overlap`` (`bench.task.problems.question_overlap`, every source)
    and ``working_overlap`` (`bench.task.problems.working_overlap`, synthetic only); ``held_out_by`` says how the
    splits were kept apart. With a validation split: ``eval_split`` names the evaluated split, the two counts
    above are of its problems, and when that is test, ``validation_*_overlap`` count validation problems."""
    validation: list[dict[str, str]] = field(default_factory=list)
    """Problems carved from the training split for tuning (``task.validation_size``; empty when it is 0)."""
    eval_split: str = "test"
    """Which split evaluation reads (``eval.split``); with 'validation' the test split is not even loaded."""

    @property
    def evaluated(self) -> list[dict[str, str]]:
        """The problems every evaluation of the run scores: validation or test, as ``eval.split`` says."""
        return self.validation if self.eval_split == "validation" else self.test


def load_task(spec: Spec) -> TaskData:
    """Load (or generate) both splits and check their overlap; raises UserError for data that cannot be used
    (bench.task.problems.read_gsm8k). A ``task.path`` the source does not read gets a note: the data a user
    pointed at is not what is trained on, and nothing else would say so."""
    data = _load_task(spec)
    if spec.task.path and spec.task.source != "gsm8k":
        data.notes.append(f"task.path '{spec.task.path}' is not read: task.source is '{spec.task.source}' (set "
                          f"task.source=gsm8k to train and test on that data)")
    return data


def _load_task(spec: Spec) -> TaskData:
    """load_task without the note."""
    task = spec.task
    if task.validation_size or spec.eval.split == "validation":
        return _load_with_validation(spec)
    if task.source == "synthetic":
        s = task.synthetic
        train, test = synthetic_splits(task.train_size, task.test_size, s.seed, s.max_operand, s.max_steps)
        checks: dict[str, int | str] = {
            "working_overlap": working_overlap(train, test), "question_overlap": question_overlap(train, test),
            **synthetic_step_checks(train, test),
            "held_out_by": f"working: sha256(working) % 100 < {TEST_SHARE_PERCENT} is test ({HELD_OUT_STEPS}; "
                           f"one question per test working)"}
        # Zero by construction; a non-zero count is a bug in the split, and the note puts it in front of users.
        # (The step counts are large by design: the task holds out workings, not steps.)
        notes = [f"synthetic task: {checks[key]} of {len(test)} test problems share their {what} with a training "
                 f"problem" for key, what in (("working_overlap", "working"), ("question_overlap", "question"))
                 if checks[key]]
        return TaskData(train, test, notes, checks)
    train = read_gsm8k(gsm8k_path(task), "train", limit=None)
    test = read_gsm8k(gsm8k_path(task), "test", limit=task.test_size)
    notes = [f"{split.source}: dropped {split.dropped} of {split.rows} rows without a usable gold answer "
             f"(first: {split.first_dropped})" for split in (train, test) if split.dropped]
    for split, asked, key in ((train, task.train_size, "task.train_size"), (test, task.test_size, "task.test_size")):
        usable = split.rows - split.dropped
        if usable < asked:
            notes.append(f"{split.source}: {usable} usable rows, fewer than {key}={asked}; using {usable}")
    train_problems = train.problems[: task.train_size]
    notes += duplicate_notes(train.source, train_problems)
    shared = question_overlap(train_problems, test.problems)
    if train.source == test.source:
        notes.append(f"{train.source}: one file serves as both the train and the test split, so the test questions "
                     f"are also trained on; give a folder with train and test files to keep them apart")
    elif shared:
        notes.append(f"{test.source}: {shared} of {len(test.problems)} test questions also occur in {train.source} "
                     f"(same text up to whitespace and case), so they are not held out")
    checks = {"question_overlap": shared, "questions": len(test.problems), "clusters": len(test.problems),
              "cluster_unit": "question",
              "held_out_by": "none: one file for both splits"
              if train.source == test.source else "source: its train and test files"}
    return TaskData(train_problems, test.problems, notes, checks)


HELD_OUT_STEPS = "held-out combinations of seen steps"
"""What the synthetic split holds out, in the words every claim of it uses: whole workings, not their steps."""


def synthetic_step_checks(train: list[dict], evaluated: list[dict], prefix: str = "") -> dict[str, int | str]:
    """The step-level and cluster counts of a synthetic split against the training split (`TaskData.checks`):
    ``step_overlap`` (evaluated problems with a step that occurs in training), ``steps_all_seen`` (problems every
    step of which does), ``questions`` and ``clusters`` (distinct workings: the independent units the report's
    statistics count), ``cluster_unit`` 'working'. ``prefix`` ('validation_') names the validation split's."""
    any_seen, all_seen = step_overlap(train, evaluated)
    out: dict[str, int | str] = {f"{prefix}step_overlap": any_seen, f"{prefix}steps_all_seen": all_seen}
    if not prefix:
        out.update(questions=len(evaluated), clusters=len({working(p["answer"]) for p in evaluated}),
                   cluster_unit="working")
    return out


def duplicate_notes(source: str, problems: list[dict]) -> list[str]:
    """One note when training questions repeat (same text up to whitespace and case): how many, and that they are
    kept (each is trained on as often as it occurs). Empty when none does."""
    from bench.task.problems import _normalised_question  # question_overlap's comparison

    distinct = len({_normalised_question(p["question"]) for p in problems})
    repeats = len(problems) - distinct
    return [f"{source}: {repeats} of {len(problems)} training questions repeat an earlier one ({distinct} distinct; "
            f"same text up to whitespace and case); kept, so each is trained on as often as it occurs"] if repeats else []


def _load_with_validation(spec: Spec) -> TaskData:
    """`load_task` for a spec with ``task.validation_size`` > 0: train minus validation, validation, and the test
    split only when evaluation reads it (a tuning run, ``eval.split: validation``, never loads test problems)."""
    task, on_validation = spec.task, spec.eval.split == "validation"
    notes: list[str] = []
    if task.source == "synthetic":
        s = task.synthetic
        train, validation = synthetic_train_validation(task.train_size, task.validation_size, s.seed,
                                                       s.max_operand, s.max_steps)
        test = [] if on_validation else synthetic_splits(0, task.test_size, s.seed, s.max_operand, s.max_steps)[1]
        held_out_by = (f"working: sha256(working) % 100 < {TEST_SHARE_PERCENT} is test, in [{TEST_SHARE_PERCENT}, "
                       f"{TEST_SHARE_PERCENT + VALIDATION_SHARE_PERCENT}) validation ({HELD_OUT_STEPS}; one "
                       f"question per test working, validation may ask a working more than once)")
    else:
        split = read_gsm8k(gsm8k_path(task), "train", limit=None)
        if split.dropped:
            notes.append(f"{split.source}: dropped {split.dropped} of {split.rows} rows without a usable gold answer "
                         f"(first: {split.first_dropped})")
        rest, validation = carve_validation(split.problems, task.validation_size)
        train = rest[: task.train_size]
        notes += duplicate_notes(split.source, train)
        for got, asked, key in ((len(validation), task.validation_size, "task.validation_size"),
                                (len(train), task.train_size, "task.train_size")):
            if got < asked:
                notes.append(f"{split.source}: {got} usable rows for {key}={asked}; using {got}")
        test = []
        if not on_validation:
            test_split = read_gsm8k(gsm8k_path(task), "test", limit=task.test_size)
            test = test_split.problems
            if test_split.source == split.source:
                notes.append(f"{split.source}: one file serves as both the train and the test split, so the test "
                             f"questions are also trained on; give a folder with train and test files")
        held_out_by = "validation: the training questions with the lowest sha256 of their text"
    evaluated = validation if on_validation else test
    checks: dict[str, int | str] = {"question_overlap": question_overlap(train, evaluated)}
    if task.source == "synthetic":
        checks["working_overlap"] = working_overlap(train, evaluated)
        checks.update(synthetic_step_checks(train, evaluated))
    else:
        checks.update(questions=len(evaluated), clusters=len(evaluated), cluster_unit="question")
    if not on_validation:
        checks["validation_question_overlap"] = question_overlap(train, validation)
        if task.source == "synthetic":
            checks["validation_working_overlap"] = working_overlap(train, validation)
            checks.update(synthetic_step_checks(train, validation, prefix="validation_"))
    checks["held_out_by"] = held_out_by
    checks["eval_split"] = spec.eval.split
    # Zero by construction (the test file's overlap excepted); a non-zero count is put in front of users.
    notes += [f"{key}: {value} {'validation' if key.startswith('validation_') else spec.eval.split} problems share "
              f"it with a training problem" for key, value in checks.items()
              if key.endswith(("question_overlap", "working_overlap")) and value]
    return TaskData(train, test, notes, checks, validation=validation, eval_split=spec.eval.split)


def task_problems(spec: Spec) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test) problems ({'question', 'answer'}) as the spec describes; deterministic."""
    data = load_task(spec)
    return data.train, data.test


TOKENIZER_PROBLEMS = 2000
"""Synthetic problems in the tiny tokenizer's corpus."""
TOKENIZER_DRAWS = 4000
"""Problems drawn for it, of which the training side's first TOKENIZER_PROBLEMS are kept (about 70% of draws are
training-side: 100 - TEST_SHARE_PERCENT - VALIDATION_SHARE_PERCENT of the workings, weighted by how often the
generator writes them)."""


def training_side(problems: list[dict]) -> list[dict]:
    """The synthetic problems whose working is neither a test nor a validation working."""
    return [p for p in problems if not is_held_out(w := working(p["answer"])) and not is_validation(w)]


def tokenizer_corpus(spec: Spec) -> list[str]:
    """Text a stand-in tokenizer is trained on: prompts and warm-start targets of the task.

    Synthetic task: 2,000 problems from a generator seed the splits do not use, kept to the training side's
    workings (never a test or validation working: the tokenizer sees nothing evaluation asks). GSM8K: the
    training split's questions and worked answers (never the test split), so the tokenizer covers what training
    sees.
    """
    if spec.task.source != "synthetic":  # GSM8K, from files, the hub or the bundled copy
        train, _ = task_problems(spec)
        return [r["prompt"] + format_target(p["answer"]) for r, p in zip(to_rows(train), train)]
    s = spec.task.synthetic
    problems = training_side(generate_synthetic(TOKENIZER_DRAWS, s.seed + 1, s.max_operand, s.max_steps))
    problems = problems[:TOKENIZER_PROBLEMS]
    rows = to_rows(problems)
    return [r["prompt"] + format_target(p["answer"]) for r, p in zip(rows, problems)]


def matched_data(spec: Spec, tokenizer: Any, seed: int
                 ) -> tuple[list[dict[str, str]], list[dict[str, str]], dict[str, int | str]]:
    """`matched_rows` and, from the same load, the overlap checks (`TaskData.checks`) a result records."""
    data = load_task(spec)
    # "test_rows" are the evaluated rows: the validation split in a tuning run (eval.split: validation).
    train_rows, test_rows = to_rows(data.train), to_rows(data.evaluated)
    for row in train_rows + test_rows:
        row["prompt"] = render_prompt(tokenizer, row["prompt"], spec.model.use_chat_template)
    random.Random(seed).shuffle(train_rows)
    return train_rows, test_rows, data.checks


def matched_rows(spec: Spec, tokenizer: Any, seed: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train_rows, test_rows) with fully rendered prompts; training rows shuffled once with ``seed``.

    Every method of a given seed sees exactly this order; online methods take
    ``train.prompts_per_step`` rows per step from the front, wrapping around.
    """
    train_rows, test_rows, _ = matched_data(spec, tokenizer, seed)
    return train_rows, test_rows


def prompts_for_steps(rows: list[dict[str, str]], steps: int, per_step: int) -> list[dict[str, str]]:
    """The first ``steps * per_step`` rows of the matched order, wrapping around when the set is smaller."""
    total = steps * per_step
    return [rows[i % len(rows)] for i in range(total)]
