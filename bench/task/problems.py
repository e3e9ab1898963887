"""Task data: the synthetic GSM8K-format arithmetic task, GSM8K loading, prompt and target formatting.

Every problem is ``{"question": str, "answer": str}`` in GSM8K's layout: the answer is a worked solution
whose last line is ``#### N``. The synthetic generator writes the working tersely (``12+7=19``) because the
`cpu-tiny` model has a ~380-token byte-level vocabulary and a 32-token generation budget: its target
completion ``<think>12+7=19 19-5=14</think> <answer>14</answer>`` must stay under ~28 tokens.

The synthetic train and test splits are held out by working (`synthetic_splits`, `is_held_out`): a test problem
never repeats a training problem's whole working (its operations, operands and results in order) under other
names. They are not held out by step: the steps themselves are seen (a one-step test problem ``11-8=3`` is a step
of some two-step training workings), so the test split measures held-out combinations of seen steps, and
`step_overlap` counts how many test problems use a step that occurs in training. The test split asks each working
once (one question per working), so its questions are independent units for the report's statistics; the training
and validation sides may ask a working under several names (`cluster_key` labels them). `working_overlap` and
`question_overlap` count what two splits share, for any source. A validation split for tuning
(`bench.execution.tune`) is carved from the training side only: synthetic by working too (`is_validation`,
`synthetic_train_validation`), a file's by a hash of the question (`carve_validation`).

Pure Python: ``datasets`` (hub) and ``pyarrow`` (parquet) are imported lazily, only when those are loaded.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import UserError
from bench.task.bundled import BUNDLED_PATH, bundled_rows
from bench.task.verifier import GOLD_LINE as _GOLD_LINE
from bench.task.verifier import gold_number

PROMPT_TEMPLATE = "Question: {question}\nThink in <think></think>, answer in <answer></answer>.\n"
"""The one prompt every method and every evaluation uses; ``{question}`` is the problem text."""

# GSM8K marks calculator calls as "<<12+7=19>>"; they are tool annotations, not reasoning a model should copy.
_CALCULATOR = re.compile(r"<<[^<>]*>>")

# (name, pronoun): a few names so that the model must read the numbers, not memorise the story.
_PEOPLE = (("Tom", "He"), ("Ann", "She"), ("Sam", "He"), ("Mia", "She"), ("Ben", "He"), ("Eva", "She"),
           ("Leo", "He"), ("Zoe", "She"))
_OBJECTS = ("apples", "pens", "cards", "books", "coins", "eggs", "toys", "cups")
# Largest value a default problem reaches: every number has at most 3 digits (= 3 tokens for the tiny
# tokenizer, which splits digits), so that two steps of working fit the completion budget. Raised to
# 2*max_operand when max_operand is larger, so big operands still work.
_MAX_VALUE = 999
# Multiplication factors stay single-digit for the same reason.
_MAX_FACTOR = 9


def _sentence(op: str, amount: int, pronoun: str, rng: random.Random) -> str:
    """One sentence of the story that applies ``op`` with ``amount`` to the running total."""
    if op == "+":
        verb = rng.choice(("buys {b} more.", "finds {b} more.", "gets {b} more."))
    elif op == "-":
        verb = rng.choice(("gives away {b}.", "loses {b}.", "sells {b}."))
    else:
        verb = "then has {b} times as many."
    return f"{pronoun} " + verb.format(b=amount)


def _one_problem(rng: random.Random, max_operand: int, max_steps: int) -> dict:
    """One problem with 1..max_steps operations; every intermediate value is an integer in [0, limit]."""
    limit = max(_MAX_VALUE, 2 * max_operand)
    (name, pronoun), obj = rng.choice(_PEOPLE), rng.choice(_OBJECTS)
    steps = rng.randint(1, max_steps)
    lines: list[str] = []
    # Opening: either a plain amount, or "k bags of b" (which is itself the first step, a multiplication).
    if rng.random() < 0.2:
        bags = rng.randint(2, _MAX_FACTOR)
        each = rng.randint(1, min(max_operand, limit // bags))
        total = bags * each
        sentences = [f"{name} has {bags} bags of {each} {obj}."]
        lines.append(f"{bags}*{each}={total}")
        steps -= 1
    else:
        total = rng.randint(1, max_operand)
        sentences = [f"{name} has {total} {obj}."]
    for _ in range(steps):
        choices = [op for op, ok in (("+", total < limit), ("-", total > 0), ("*", 0 < 2 * total <= limit)) if ok]
        op = rng.choice(choices)
        if op == "+":
            amount = rng.randint(1, min(max_operand, limit - total))
            new = total + amount
        elif op == "-":
            amount = rng.randint(1, min(max_operand, total))  # never below zero
            new = total - amount
        else:
            amount = rng.randint(2, min(_MAX_FACTOR, limit // total))
            new = total * amount
        sentences.append(_sentence(op, amount, pronoun, rng))
        lines.append(f"{total}{op}{amount}={new}")
        total = new
    question = " ".join(sentences) + f" How many {obj} does {name} have now?"
    return {"question": question, "answer": "\n".join(lines + [f"#### {total}"])}


def _problem_stream(seed: int | str, max_operand: int, max_steps: int) -> Iterator[dict]:
    if max_operand < 1:
        raise UserError(f"synthetic 'max_operand' must be >= 1, got {max_operand}")
    if max_steps < 1:
        raise UserError(f"synthetic 'max_steps' must be >= 1, got {max_steps}")
    # random.Random seeded with an int or str is deterministic across runs and platforms (str seeds are
    # hashed with SHA-512, not Python's randomised hash()).
    rng = random.Random(seed)
    while True:
        yield _one_problem(rng, max_operand, max_steps)


def generate_synthetic(n: int, seed: int, max_operand: int = 50, max_steps: int = 2) -> list[dict]:
    """``n`` deterministic GSM8K-format arithmetic word problems (may contain repeats; see `synthetic_splits`).

    Each is ``{"question", "answer"}``; the answer is terse working, one step a line, then ``#### N``:
    ``"Tom has 12 apples. He buys 7 more. How many apples does Tom have now?"`` /
    ``"12+7=19\\n#### 19"``. Operations are +, - and * (``k bags of b``, ``k times as many``); operands are
    1..max_operand (factors 2..9), every value stays a non-negative integer <= 999. Same seed, same list.
    """
    if n < 0:
        raise UserError(f"number of synthetic problems must be >= 0, got {n}")
    stream = _problem_stream(seed, max_operand, max_steps)
    return [next(stream) for _ in range(n)]


TEST_SHARE_PERCENT = 20
"""Percent of all workings held out for the test split (`is_held_out`). 20% leaves the training split four
fifths of the task's space while the test split still draws on thousands of workings at cpu-tiny's settings
(max_operand 20, max_steps 2: 37,765 workings in all, 7,519 of them held out; the 5,000 test questions ask
5,000 of those, one question each)."""

_WHITESPACE = re.compile(r"\s+")


def working(answer: str) -> str:
    """The working of a worked answer: its text without the ``#### N`` line(s) and GSM8K's ``<<...>>``
    calculator annotations, whitespace runs collapsed to one space.

    ``"12+7=19\\n19-5=14\\n#### 14"`` -> ``"12+7=19 19-5=14"``. For the synthetic task the working (its
    operations, operands and results) determines the answer, so two problems with the same working are the
    same exercise told with other names.
    """
    return _WHITESPACE.sub(" ", _GOLD_LINE.sub("", _CALCULATOR.sub("", answer))).strip()


def is_held_out(working_text: str) -> bool:
    """Whether a working belongs to the test split: the first 8 hex digits of its SHA-256 (UTF-8), as an
    integer mod 100, are below `TEST_SHARE_PERCENT`.

    Depends on the working alone (no seed, no split sizes), so anyone can re-check an exported split and every
    synthetic seed holds out the same workings.
    """
    digest = hashlib.sha256(working_text.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % 100 < TEST_SHARE_PERCENT


def synthetic_splits(train_size: int, test_size: int, seed: int, max_operand: int,
                     max_steps: int) -> tuple[list[dict], list[dict]]:
    """Train and test problems held out by working: no test problem's working occurs in the train split.

    Each working is assigned to one split by `is_held_out` (a hash of it), so the test split is drawn only from
    the held-out `TEST_SHARE_PERCENT`% of workings and the train split only from the rest. The test split asks
    every working once (its workings are distinct, so its questions are too): the same working under two names is
    one exercise, and a model right on one is right on the other, so repeats would make per-question intervals
    and tests count the same evidence twice (at cpu-tiny's settings the earlier question-distinct split had
    5,000 questions from 2,099 workings). Training questions are distinct texts (a working may recur with other
    names, objects or verbs). Each split comes from its own seeded stream, so the test split does not change when
    ``train_size`` does (runs with different training budgets are evaluated on the same questions), nor the
    train split when ``test_size`` does. Raises UserError when the settings cannot produce that many distinct
    test workings or training questions.

    Held out by working is not held out by step: the test workings are new combinations of steps the training
    split also uses (`step_overlap`).
    """
    if train_size < 0 or test_size < 0:
        raise UserError(f"synthetic split sizes must be >= 0, got train {train_size}, test {test_size}")

    def take(stream: Iterator[dict], count: int, held_out: bool) -> list[dict]:
        out: list[dict] = []
        seen: set[str] = set()
        # Give up after many consecutive misses (a repeated question or working, or the other split's working):
        # the split's share of the problem space is too small for the request.
        misses, max_misses = 0, 10_000 + 20 * count
        while len(out) < count:
            problem = next(stream)
            work = working(problem["answer"])
            key = work if held_out else problem["question"]  # test: one question per working
            if key in seen or is_held_out(work) != held_out:
                misses += 1
                if misses > max_misses:
                    which = "test workings" if held_out else "train questions"
                    raise UserError(
                        f"synthetic task cannot make {count} distinct {which} with max_operand="
                        f"{max_operand}, max_steps={max_steps} (got {len(out)}; the split draws on "
                        f"{TEST_SHARE_PERCENT if held_out else 100 - TEST_SHARE_PERCENT}% of the workings); "
                        f"raise them or lower the size")
                continue
            misses = 0
            seen.add(key)
            out.append(problem)
        return out

    test = take(_problem_stream(f"{seed}/test", max_operand, max_steps), test_size, held_out=True)
    train = take(_problem_stream(f"{seed}/train", max_operand, max_steps), train_size, held_out=False)
    return train, test


def _normalised_question(question: str) -> str:
    """A question compared across splits: whitespace runs as one space, case-folded."""
    return _WHITESPACE.sub(" ", question).strip().casefold()


def working_overlap(train: list[dict], test: list[dict]) -> int:
    """Number of test problems whose `working` occurs in some train problem (0 for held-out synthetic splits).

    Problems are ``{"question", "answer"}``; a test problem counts once however many train problems share it.
    Workings are compared whole: a test working made of training steps in a new order or combination is not an
    overlap here (`step_overlap` counts those).
    """
    seen = {working(p["answer"]) for p in train}
    return sum(working(p["answer"]) in seen for p in test)


def question_overlap(train: list[dict], test: list[dict]) -> int:
    """Number of test questions whose text, whitespace-normalised and case-folded, occurs in the train split."""
    seen = {_normalised_question(p["question"]) for p in train}
    return sum(_normalised_question(p["question"]) in seen for p in test)


def steps(working_text: str) -> list[str]:
    """The steps of a synthetic `working`, one calculation each: ``"12+7=19 19-5=14"`` -> ``["12+7=19",
    "19-5=14"]``."""
    return working_text.split()


def step_overlap(train: list[dict], test: list[dict]) -> tuple[int, int]:
    """(test problems with at least one step that occurs in some training working, test problems whose every
    step does). For the synthetic task both are large by design: it holds out workings, not steps (every single
    digit sum occurs somewhere in training), so a held-out working is a new combination of seen steps."""
    seen = {step for p in train for step in steps(working(p["answer"]))}
    per_test = [[step in seen for step in steps(working(p["answer"]))] for p in test]
    return sum(any(found) for found in per_test), sum(bool(found) and all(found) for found in per_test)


def cluster_key(source: str, question_id: str, worked_answer: str | None) -> str:
    """The unit a question's verdict is independent at, for the report's statistics.

    Synthetic task: its `working` (the same working asked under other names is one exercise; the test split asks
    each once, the validation split may repeat one). Any other source (GSM8K): the question itself, one question
    per problem. ``question_id`` is the completions file's ``id``, ``worked_answer`` its ``gold_answer``.
    """
    if source == "synthetic" and worked_answer and _GOLD_LINE.search(worked_answer):
        work = working(worked_answer)
        if work:  # a bare "#### N" (or a gold number alone) is no working: never a cluster of its own
            return "w:" + work
    return "q:" + question_id


# --------------------------------------------------------------------------------------------- validation split

VALIDATION_SHARE_PERCENT = 10
"""Percent of all workings set aside for the synthetic validation split (`is_validation`) when a spec asks for one
(``task.validation_size`` > 0): the band just above the test band of the same hash, so a validation working is
never a test working, and never occurs in the training split that remains (held out by working, like test)."""


def _working_bucket(working_text: str) -> int:
    """The working's hash bucket in 0..99: the first 8 hex digits of its SHA-256 (UTF-8) mod 100, as `is_held_out`."""
    return int(hashlib.sha256(working_text.encode("utf-8")).hexdigest()[:8], 16) % 100


def is_validation(working_text: str) -> bool:
    """Whether a working belongs to the validation split: its bucket is in [TEST_SHARE_PERCENT,
    TEST_SHARE_PERCENT + VALIDATION_SHARE_PERCENT). Like `is_held_out`, it depends on the working alone."""
    return TEST_SHARE_PERCENT <= _working_bucket(working_text) < TEST_SHARE_PERCENT + VALIDATION_SHARE_PERCENT


def _take_distinct(stream: Iterator[dict], count: int, belongs: Callable[[str], bool], which: str, share: int,
                   max_operand: int, max_steps: int) -> list[dict]:
    """``count`` problems of ``stream`` with distinct questions whose working ``belongs``; UserError when the
    share of the problem space is too small (as `synthetic_splits`)."""
    out: list[dict] = []
    seen: set[str] = set()
    misses, max_misses = 0, 10_000 + 20 * count
    while len(out) < count:
        problem = next(stream)
        if problem["question"] in seen or not belongs(working(problem["answer"])):
            misses += 1
            if misses > max_misses:
                raise UserError(f"synthetic task cannot make {count} distinct {which} questions with max_operand="
                                f"{max_operand}, max_steps={max_steps} (got {len(out)}; the {which} split draws on "
                                f"{share}% of the workings); raise them or lower the size")
            continue
        misses = 0
        seen.add(problem["question"])
        out.append(problem)
    return out


def synthetic_train_validation(train_size: int, validation_size: int, seed: int, max_operand: int,
                               max_steps: int) -> tuple[list[dict], list[dict]]:
    """(train, validation) problems for a spec with a validation split; the test split is not generated.

    Validation problems come from their own seeded stream and only from `is_validation` workings; training
    problems from the train stream, skipping test and validation workings. So no validation problem shares its
    working with a training problem (nor with a test problem), and neither split changes with the other's size.
    """
    if train_size < 0 or validation_size < 0:
        raise UserError(f"synthetic split sizes must be >= 0, got train {train_size}, validation {validation_size}")
    validation = _take_distinct(_problem_stream(f"{seed}/validation", max_operand, max_steps), validation_size,
                                is_validation, "validation", VALIDATION_SHARE_PERCENT, max_operand, max_steps)
    train_share = 100 - TEST_SHARE_PERCENT - VALIDATION_SHARE_PERCENT
    train = _take_distinct(_problem_stream(f"{seed}/train", max_operand, max_steps), train_size,
                           lambda w: not is_held_out(w) and not is_validation(w), "train", train_share,
                           max_operand, max_steps)
    return train, validation


def carve_validation(problems: list[dict], size: int) -> tuple[list[dict], list[dict]]:
    """(rest, validation) of a training split from a file: the ``size`` problems with the lowest SHA-256 of their
    whitespace-normalised, case-folded question are validation; ``rest`` keeps file order and leaves out every
    problem whose question is a validation question (duplicates included). Deterministic, and independent of
    the file's row order."""
    def key(problem: dict) -> str:
        return hashlib.sha256(_normalised_question(problem["question"]).encode("utf-8")).hexdigest()

    ranked = sorted(range(len(problems)), key=lambda i: (key(problems[i]), i))
    validation, taken = [], set()
    for i in ranked:
        if len(validation) >= size:
            break
        question = _normalised_question(problems[i]["question"])
        if question not in taken:  # a duplicated question counts once
            taken.add(question)
            validation.append(problems[i])
    rest = [p for p in problems if _normalised_question(p["question"]) not in taken]
    return rest, validation


def format_prompt(question: str) -> str:
    """The prompt for one question (`PROMPT_TEMPLATE` filled in)."""
    return PROMPT_TEMPLATE.format(question=question.strip())


def format_target(answer: str) -> str:
    """The supervised warm-start completion for a worked answer: ``<think>WORKING</think> <answer>N</answer>``.

    WORKING is the answer without its ``#### N`` line and without GSM8K's ``<<...>>`` calculator
    annotations; N is `gold_number`. Raises ValueError like `gold_number`.
    """
    gold = gold_number(answer)
    working = _GOLD_LINE.sub("", _CALCULATOR.sub("", answer)).strip()
    return f"<think>{working}</think> <answer>{gold}</answer>"


def to_rows(problems: list[dict]) -> list[dict]:
    """Dataset rows for trainers and evaluation: ``prompt``, ``answer`` (canonical gold number), ``question``,
    ``solution`` (the worked answer)."""
    return [{"prompt": format_prompt(p["question"]), "answer": gold_number(p["answer"]),
             "question": p["question"], "solution": p["answer"]} for p in problems]


# --------------------------------------------------------------------------------------------- GSM8K loading

_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")

MAX_BAD_GOLD_SHARE = 0.01
"""Share of a split's rows that may lack a usable gold answer (a numeric ``#### N`` line, a non-empty question).
Up to it they are dropped and counted (a scraped copy with a few broken rows should not stop a run); above it
the file is wrong, or not GSM8K-format, and loading stops with one line naming it."""

Located = tuple[str, Any]
"""(where, row): a row and where it came from, ``file:line`` for JSON Lines, ``file row i`` otherwise."""


@dataclass
class Gsm8kSplit:
    """One split as loaded: the usable problems, and what was dropped (for preflight to report)."""

    problems: list[dict]
    """``[{"question", "answer"}]`` in file order, dropped rows left out, ``limit`` applied."""
    source: str
    """The file (or folder, or hub id[split]) the rows came from, as messages name it."""
    rows: int
    """Rows read, before dropping."""
    dropped: int = 0
    """Rows without a usable gold answer (at most MAX_BAD_GOLD_SHARE of ``rows``)."""
    first_dropped: str = ""
    """Where the first dropped row is, and why."""


def _read_text(path: Path) -> str:
    """The file as UTF-8 text (a BOM is accepted); a non-UTF-8 file is a UserError naming the line and byte."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__}); check its permissions"
                        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        f"re-save the file as UTF-8") from None


def _read_jsonl(path: Path) -> list[Located]:
    text = _read_text(path)
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); give a JSON array or JSON Lines file"
                            ) from None
        rows = rows if isinstance(rows, list) else [rows]
        return [(f"{path} item {i}", row) for i, row in enumerate(rows)]
    located = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            located.append((f"{path}:{number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not a JSON line ({exc.msg}); each line must be one JSON object"
                            ) from None
    return located


def _read_parquet(path: Path) -> list[Located]:
    try:
        import pyarrow.parquet as pq  # lazy: only parquet users pay for it (installed with `datasets`)
    except ImportError:
        raise UserError(f"{path}: reading parquet needs pyarrow; install it or convert the file to .jsonl") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise UserError(f"{path}: not a readable parquet file ({type(exc).__name__}); check or re-download it"
                        ) from None
    return [(f"{path} row {i}", row) for i, row in enumerate(rows)]


def _read_file(path: Path) -> list[Located]:
    return _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)


def _split_files(folder: Path, split: str) -> list[Path]:
    """Files in ``folder`` (or its ``main/`` subfolder, the hub repo's layout) holding ``split``."""
    for where in (folder, folder / "main"):
        for suffix in (".jsonl", ".parquet", ".json"):
            exact = where / f"{split}{suffix}"
            if exact.is_file():
                return [exact]
        # Sharded files: "test-00000-of-00001.parquet"; all shards, in name order.
        shards = sorted(p for p in where.glob(f"{split}*") if p.is_file() and p.suffix in _LOCAL_SUFFIXES)
        if shards:
            return shards
    return []


def _load_hub(path: str, split: str) -> tuple[list[Located], str]:
    try:
        import datasets  # lazy: heavy, and only hub users need it
    except ImportError:
        raise UserError(f"loading '{path}' from the hub needs the 'datasets' package; install it or give a "
                        "local .jsonl/.parquet file") from None
    try:
        ds = datasets.load_dataset(path, "main", split=split)
    except Exception as exc:  # network, missing id, missing split: all the user's to fix
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"could not load hub dataset '{path}' (config 'main', split '{split}'): {message}; "
                        "check the id and split, give a local .jsonl/.parquet file or folder, or set "
                        "task.source=gsm8k-bundled (the GSM8K shipped with the suite, offline)") from None
    source = f"{path}[{split}]"
    return [(f"{source} row {i}", dict(row)) for i, row in enumerate(ds)], source


def _read_split(path: str, split: str) -> tuple[list[Located], str]:
    """Every row of ``split`` with its location, and the source's name (a file when there is one)."""
    if path == BUNDLED_PATH:  # task.source gsm8k-bundled: the GSM8K shipped in the package
        return bundled_rows(split)
    local = Path(path).expanduser()
    looks_local = path.startswith((".", "/", "~")) or local.suffix in _LOCAL_SUFFIXES or local.exists()
    if local.is_dir():
        files = _split_files(local, split)
        if not files:
            raise UserError(f"{local}: no '{split}.jsonl' or '{split}.parquet' (or '{split}-*' shard) in this "
                            "folder; add it or point task.path at the file")
        rows = [item for file in files for item in _read_file(file)]
        return rows, str(files[0]) if len(files) == 1 else f"{local} ({split} shards)"
    if local.is_file():
        if local.suffix not in _LOCAL_SUFFIXES:
            raise UserError(f"{local}: unsupported file type '{local.suffix}'; give a .jsonl or .parquet file")
        return _read_file(local), str(local)
    if looks_local:
        raise UserError(f"{path}: file or folder not found; check the path, or give a hub id like openai/gsm8k")
    return _load_hub(path, split)


def _problem(where: str, row: Any) -> dict:
    """``{"question", "answer"}`` of one row. A missing column is a UserError (the file has the wrong layout);
    an unusable value raises ValueError (the row is bad: counted, and dropped while few)."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: a row must be an object with 'question' and 'answer', got "
                        f"{type(row).__name__}; give GSM8K-format rows")
    missing = [column for column in ("question", "answer") if column not in row]
    if missing:
        present = ", ".join(repr(str(k)) for k in sorted(row, key=str)) or "nothing"
        raise UserError(f"{where}: no {' or '.join(repr(m) for m in missing)} column (the row has {present}); "
                        "GSM8K rows need 'question' and 'answer'")
    question, answer = row["question"], row["answer"]
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the question is empty or not text")
    if not isinstance(answer, str):
        raise ValueError(f"the answer is {type(answer).__name__}, not text ending in '#### N'")
    gold_number(answer)  # ValueError: no '#### N' line, or not a number
    return {"question": question, "answer": answer}


def read_gsm8k(path: str, split: str, limit: int | None = None) -> Gsm8kSplit:
    """One GSM8K-format split, checked: the problems and a count of the rows dropped for a bad gold answer.

    ``path`` as in `load_gsm8k`. Raises UserError (one line naming the file, and the line where there is one)
    for: a missing file, a non-UTF-8 file, a malformed JSON line, a row without ``question``/``answer``, an
    empty split, or more than ``MAX_BAD_GOLD_SHARE`` of the rows without a usable ``#### N`` answer. Fewer bad
    rows are dropped and counted. ``limit`` keeps the first ``limit`` usable rows.
    """
    if limit is not None and limit < 0:
        raise UserError(f"'limit' must be >= 0 or None, got {limit}")
    located, source = _read_split(path, split)
    if not located:
        raise UserError(f"{source}: no rows (the '{split}' split is empty); give a file with GSM8K-format rows")
    problems, dropped, first = [], 0, ""
    for where, row in located:
        try:
            problems.append(_problem(where, row))
        except ValueError as exc:
            dropped += 1
            first = first or f"{where}: {exc}"
    if dropped > MAX_BAD_GOLD_SHARE * len(located):
        raise UserError(f"{source}: {dropped} of {len(located)} rows have no usable gold answer, more than the "
                        f"{MAX_BAD_GOLD_SHARE:.0%} allowed (first: {first}); GSM8K answers end with a line '#### N'")
    if limit is not None:
        problems = problems[:limit]
    return Gsm8kSplit(problems, source, len(located), dropped, first)


def load_gsm8k(path: str, split: str, limit: int | None = None) -> list[dict]:
    """GSM8K-format problems ``[{"question", "answer"}]`` from a local file, a local folder or the hub.

    ``path`` is one of: a ``.jsonl`` / ``.json`` / ``.parquet`` file (``split`` is then ignored); a folder
    holding ``{split}.jsonl`` / ``{split}.parquet`` or shards named ``{split}*`` (also looked for in a
    ``main/`` subfolder, the hub repo's layout); or a hub dataset id such as ``openai/gsm8k`` (config
    ``main``). ``limit`` keeps the first ``limit`` usable rows. Extra columns are dropped; so are rows without
    a usable gold answer while they are at most ``MAX_BAD_GOLD_SHARE`` of the split (`read_gsm8k` counts them).
    Raises UserError (one line, naming the file and the fix) for every problem `read_gsm8k` lists.
    """
    return read_gsm8k(path, split, limit).problems
