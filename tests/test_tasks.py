"""bench.task.problems: the synthetic generator, GSM8K loading from files the tests write, prompt/target formats."""

from __future__ import annotations

import functools
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from bench.errors import UserError
from bench.task.data import load_task, matched_data, matched_rows
from bench.config.spec import Spec
from bench.config.loading import load_spec, load_spec_dict
from bench.task.problems import (MAX_BAD_GOLD_SHARE, PROMPT_TEMPLATE, TEST_SHARE_PERCENT, format_prompt, format_target,
                         generate_synthetic, gold_number, is_held_out, load_gsm8k, question_overlap, read_gsm8k,
                         synthetic_splits, to_rows, working, working_overlap)
from bench.task.verifier import extract_answer, has_format, is_correct

GSM8K_ROWS = [
    {"question": "Janet has 16 eggs. She eats 3. How many are left?",
     "answer": "She has 16 - 3 = <<16-3=13>>13 eggs left.\n#### 13"},
    {"question": "A shop sells 1,000 pens a day. How many in 2 days?",
     "answer": "It sells 1,000 * 2 = <<1000*2=2000>>2,000 pens.\n#### 2,000"},
    {"question": "It is 5 degrees and drops 8. What is the temperature?",
     "answer": "5 - 8 = <<5-8=-3>>-3\n#### -3"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --- synthetic ----------------------------------------------------------------------------------------

def test_synthetic_same_seed_same_data() -> None:
    assert generate_synthetic(200, seed=7) == generate_synthetic(200, seed=7)


def test_synthetic_different_seed_different_data() -> None:
    a, b = generate_synthetic(50, seed=1), generate_synthetic(50, seed=2)
    assert [p["question"] for p in a] != [p["question"] for p in b]


def test_synthetic_prefix_is_stable() -> None:
    # Asking for more problems does not change the first ones.
    assert generate_synthetic(300, seed=3)[:100] == generate_synthetic(100, seed=3)


def _recompute(problem: dict) -> int:
    """Replays the worked lines "a<op>b=c", checking each against Python's arithmetic and the chain."""
    *steps, final = problem["answer"].split("\n")
    previous = None
    for step in steps:
        match = re.fullmatch(r"(\d+)([+*-])(\d+)=(\d+)", step)
        assert match, f"unexpected working line {step!r}"
        a, op, b, c = int(match[1]), match[2], int(match[3]), int(match[4])
        assert c == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert previous is None or a == previous, "each step must continue from the previous result"
        # Every operand that is not a carried-over result appears in the question text.
        assert re.search(rf"\b{b}\b", problem["question"])
        previous = c
    assert final == f"#### {previous}"
    return previous


@pytest.mark.parametrize(("max_operand", "max_steps"), [(50, 2), (10, 1), (20, 3), (2000, 2)])
def test_synthetic_answers_recompute(max_operand: int, max_steps: int) -> None:
    problems = generate_synthetic(500, seed=11, max_operand=max_operand, max_steps=max_steps)
    n_steps = set()
    for problem in problems:
        value = _recompute(problem)
        assert value >= 0
        assert gold_number(problem["answer"]) == str(value)
        n_steps.add(problem["answer"].count("\n"))
    assert n_steps == set(range(1, max_steps + 1)), "every step count from 1 to max_steps occurs"


def test_synthetic_uses_all_operations_and_varied_templates() -> None:
    problems = generate_synthetic(500, seed=0)
    working = "\n".join(p["answer"] for p in problems)
    for op in "+-*":
        assert re.search(rf"\d\{op}\d", working), f"operation {op} never used"
    names = {p["question"].split()[0] for p in problems}
    objects = {p["question"].split("How many ")[1].split()[0] for p in problems}
    assert len(names) >= 5 and len(objects) >= 5


def test_synthetic_default_numbers_stay_small() -> None:
    # At most 3 digits per number keeps the tiny model's completion short.
    for problem in generate_synthetic(2000, seed=5):
        assert all(len(n) <= 3 for n in re.findall(r"\d+", problem["answer"]))


@pytest.mark.parametrize("kwargs", [{"n": -1, "seed": 0}, {"n": 3, "seed": 0, "max_operand": 0},
                                    {"n": 3, "seed": 0, "max_steps": 0}])
def test_synthetic_bad_settings_raise_user_error(kwargs: dict) -> None:
    with pytest.raises(UserError):
        generate_synthetic(**kwargs)


def test_synthetic_splits_disjoint_and_sized() -> None:
    train, test = synthetic_splits(3000, 500, seed=1234, max_operand=50, max_steps=2)
    assert len(train) == 3000 and len(test) == 500
    train_q, test_q = [p["question"] for p in train], [p["question"] for p in test]
    assert len(set(train_q)) == len(train_q) and len(set(test_q)) == len(test_q)
    assert not set(train_q) & set(test_q)


def test_synthetic_splits_test_independent_of_train_size() -> None:
    _, test_a = synthetic_splits(100, 200, seed=9, max_operand=50, max_steps=2)
    _, test_b = synthetic_splits(2000, 200, seed=9, max_operand=50, max_steps=2)
    assert test_a == test_b
    assert synthetic_splits(100, 200, seed=9, max_operand=50, max_steps=2)[0] != \
        synthetic_splits(100, 200, seed=10, max_operand=50, max_steps=2)[0]


def test_synthetic_splits_too_small_space_raises() -> None:
    # max_operand=1, one step: only a handful of distinct questions exist.
    with pytest.raises(UserError, match="distinct"):
        synthetic_splits(5000, 10, seed=0, max_operand=1, max_steps=1)


# --- held out by working -------------------------------------------------------------------------------

def test_working_is_the_answer_without_its_gold_line_and_annotations() -> None:
    assert working("12+7=19\n19-5=14\n#### 14") == "12+7=19 19-5=14"
    assert working(GSM8K_ROWS[0]["answer"]) == "She has 16 - 3 = 13 eggs left."
    # Two answers with the same working and another final line still share it; another result does not.
    assert working("2*3=6\n#### 6") == working("2*3=6\n  ####  6.0")
    assert working("2*3=6\n#### 6") != working("2*3=7\n#### 7")


def test_held_out_share_of_workings_is_the_test_share() -> None:
    flags = [is_held_out(f"{a}+{b}={a + b}") for a in range(100) for b in range(100)]
    assert abs(sum(flags) / len(flags) - TEST_SHARE_PERCENT / 100) < 0.02


@pytest.mark.parametrize(("max_operand", "max_steps", "test_size"), [(20, 2, 400), (9, 1, 40), (50, 3, 400)])
def test_synthetic_splits_hold_out_every_test_working(max_operand: int, max_steps: int, test_size: int) -> None:
    # (9, 1): one-step workings with operands up to 9 number about 250, so only about 50 are test workings.
    train, test = synthetic_splits(2000, test_size, seed=5, max_operand=max_operand, max_steps=max_steps)
    assert all(is_held_out(working(p["answer"])) for p in test)
    assert not any(is_held_out(working(p["answer"])) for p in train)
    assert working_overlap(train, test) == 0 and question_overlap(train, test) == 0


@pytest.mark.parametrize(("max_operand", "max_steps", "test_size"), [(20, 2, 2000), (9, 1, 48), (50, 3, 500)])
def test_synthetic_test_split_asks_each_working_once(max_operand: int, max_steps: int, test_size: int) -> None:
    # Verdicts within a working agree, so a test split of distinct questions but repeated workings (cpu-tiny's
    # 5,000 test questions once came from 2,099 workings) makes per-question intervals several times too narrow.
    # Each test working is asked once: the questions are independent units.
    _, test = synthetic_splits(100, test_size, seed=1234, max_operand=max_operand, max_steps=max_steps)
    assert len({working(p["answer"]) for p in test}) == len(test) == test_size


@functools.lru_cache(maxsize=None)
def _cpu_tiny_task() -> Any:
    """cpu-tiny's splits, loaded once for the tests that read them (20,000 + 5,000 problems)."""
    return load_task(load_spec("cpu-tiny"))


def test_cpu_tiny_test_split_has_one_question_per_working_and_records_its_steps() -> None:
    data = _cpu_tiny_task()
    checks = data.checks
    assert checks["questions"] == checks["clusters"] == 5000 and checks["cluster_unit"] == "working"
    assert checks["working_overlap"] == 0 and checks["question_overlap"] == 0
    # Held out by working, not by step: every test working is a new combination of steps training also uses.
    # The counts are recorded, and the split's description says so.
    train_steps = {t for p in data.train for t in working(p["answer"]).split()}
    steps_seen = [[s in train_steps for s in working(p["answer"]).split()] for p in data.test]
    assert checks["step_overlap"] == sum(any(x) for x in steps_seen) > 0
    assert checks["steps_all_seen"] == sum(all(x) for x in steps_seen) > 0
    assert "held-out combinations of seen steps" in str(checks["held_out_by"])


def test_tokenizer_corpus_comes_from_the_training_side_only() -> None:
    # The tiny tokenizer's corpus keeps only training-side workings: 2,000 problems drawn from a spare generator
    # seed held 35 test questions verbatim and 170 test workings.
    from bench.task.data import tokenizer_corpus
    from bench.task.problems import is_validation

    corpus = tokenizer_corpus(load_spec("cpu-tiny"))
    assert len(corpus) == 2000
    data = _cpu_tiny_task()
    test_questions = {format_prompt(p["question"]) for p in data.test}
    prompts = [line.rsplit("<think>", 1)[0] for line in corpus]  # the prompt itself names <think></think>
    assert not test_questions & set(prompts)
    workings = [" ".join(line.rsplit("<think>", 1)[1].split("</think>", 1)[0].split()) for line in corpus]
    assert not any(is_held_out(w) or is_validation(w) for w in workings)


def test_synthetic_train_split_independent_of_test_size() -> None:
    train_a, _ = synthetic_splits(300, 10, seed=9, max_operand=20, max_steps=2)
    train_b, _ = synthetic_splits(300, 500, seed=9, max_operand=20, max_steps=2)
    assert train_a == train_b


def test_overlap_checks_catch_a_planted_duplicate() -> None:
    train, test = synthetic_splits(500, 100, seed=2, max_operand=20, max_steps=2)
    assert working_overlap(train, test) == 0 and question_overlap(train, test) == 0
    # A training problem's working told as another story: same working, new question text.
    planted = [*test[:-1], {"question": "Zed has something. How many now?", "answer": train[7]["answer"]}]
    assert working_overlap(train, planted) == 1
    assert question_overlap(train, planted) == 0
    # A training question again, with other spacing and case: same question.
    spaced = "  " + train[3]["question"].upper().replace(" ", "   ") + "\n"
    planted_q = [*test[:-1], {"question": spaced, "answer": test[-1]["answer"]}]
    assert question_overlap(train, planted_q) == 1
    assert working_overlap(train, planted_q) == 0
    # A test problem counts once, however many training problems share its working.
    assert working_overlap(train + [train[7]], planted) == 1


@pytest.mark.parametrize("preset", ["cpu-tiny", "cpu-quick"])
def test_shipped_presets_have_no_overlap(preset: str) -> None:
    spec = load_spec(preset)
    data = _cpu_tiny_task() if preset == "cpu-tiny" else load_task(spec)
    assert (len(data.train), len(data.test)) == (spec.task.train_size, spec.task.test_size)
    assert data.checks["working_overlap"] == 0 and data.checks["question_overlap"] == 0
    assert "working" in str(data.checks["held_out_by"]) and data.notes == []
    # The checks are computed, not copied: the same functions on the same splits agree.
    assert working_overlap(data.train, data.test) == 0 and question_overlap(data.train, data.test) == 0


def test_matched_data_returns_the_rows_and_checks_of_one_load() -> None:
    spec = load_spec("cpu-quick")
    train_rows, test_rows, checks = matched_data(spec, None, seed=3)  # no chat template: no tokenizer needed
    assert (train_rows, test_rows) == matched_rows(spec, None, seed=3)
    assert checks == load_task(spec).checks and checks["working_overlap"] == 0
    assert [r["question"] for r in test_rows] == [p["question"] for p in load_task(spec).test]


def _gsm8k_spec(path: Path, train_size: int = 100, test_size: int = 100) -> Spec:
    """A spec reading GSM8K-format files from ``path`` (the model folder is never opened by load_task)."""
    return load_spec_dict({"name": "t", "model": {"source": "path", "name_or_path": str(path)},
                           "task": {"source": "gsm8k", "path": str(path), "train_size": train_size,
                                    "test_size": test_size}, "train": {"prompts_per_step": 1}})


def test_gsm8k_files_report_shared_questions(tmp_path: Path) -> None:
    shared = dict(GSM8K_ROWS[0], question="  " + GSM8K_ROWS[0]["question"].lower())
    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS[:2])
    write_jsonl(tmp_path / "test.jsonl", [shared, GSM8K_ROWS[2]])
    data = load_task(_gsm8k_spec(tmp_path))
    assert data.checks["question_overlap"] == 1 and "working_overlap" not in data.checks
    assert [n for n in data.notes if "1 of 2 test questions also occur in" in n and "train.jsonl" in n]
    # Only the training rows the preset uses count: with train_size 1 the second row is not trained on.
    write_jsonl(tmp_path / "test.jsonl", [GSM8K_ROWS[1]])
    assert load_task(_gsm8k_spec(tmp_path, train_size=1)).checks["question_overlap"] == 0
    assert load_task(_gsm8k_spec(tmp_path, train_size=2)).checks["question_overlap"] == 1


def test_gsm8k_has_one_question_per_cluster(tmp_path: Path) -> None:
    # Real GSM8K has one question per problem: its clusters are its questions, so the clustered statistics
    # reduce to the per-question ones there (tests/test_stats.py) and nothing changes.
    from bench.task.problems import cluster_key

    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS[:1])
    write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS)
    data = load_task(_gsm8k_spec(tmp_path, train_size=1, test_size=3))
    assert data.checks["questions"] == data.checks["clusters"] == 3 and data.checks["cluster_unit"] == "question"
    same_working = "She has 16 - 3 = <<16-3=13>>13 eggs left.\n#### 13"
    assert cluster_key("gsm8k", "id1", same_working) != cluster_key("gsm8k", "id2", same_working)
    assert cluster_key("synthetic", "id1", "2+3=5\n#### 5") == cluster_key("synthetic", "id2", "2+3=5\n#### 5")


def test_gsm8k_files_without_shared_questions_have_no_note(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS[:2])
    write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS[2:])
    data = load_task(_gsm8k_spec(tmp_path, train_size=2, test_size=1))
    assert data.checks["question_overlap"] == 0 and data.notes == []


# --- gold / prompt / target ---------------------------------------------------------------------------

@pytest.mark.parametrize(("answer", "gold"), [
    ("12+7=19\n#### 19", "19"),
    ("x\n#### 1,000", "1000"),
    ("x\n####  -3 ", "-3"),
    ("x\n#### 18.00", "18"),
    ("x\n#### $5", "5"),
    ("#### 1\nfix\n#### 2", "2"),
])
def test_gold_number(answer: str, gold: str) -> None:
    assert gold_number(answer) == gold


@pytest.mark.parametrize("answer", ["no marker 19", "x\n#### nineteen", "x\n####", ""])
def test_gold_number_rejects(answer: str) -> None:
    with pytest.raises(ValueError):
        gold_number(answer)


def test_format_prompt() -> None:
    prompt = format_prompt("  What is 2+2?  ")
    assert prompt == PROMPT_TEMPLATE.format(question="What is 2+2?")
    assert "What is 2+2?" in prompt and "<think>" in prompt and "<answer>" in prompt
    assert len(prompt) - len("What is 2+2?") < 80, "the instruction must stay short for the tiny model"
    # Braces in a question are text, not format fields.
    assert "{x}" in format_prompt("Is {x} a set?")


def test_format_target_strips_annotations_and_marker() -> None:
    target = format_target(GSM8K_ROWS[0]["answer"])
    assert target == "<think>She has 16 - 3 = 13 eggs left.</think> <answer>13</answer>"
    assert format_target(GSM8K_ROWS[1]["answer"]).endswith("<answer>2000</answer>")
    assert "####" not in format_target(GSM8K_ROWS[2]["answer"])


def test_format_target_round_trip_on_synthetic() -> None:
    train, test = synthetic_splits(2000, 500, seed=3, max_operand=50, max_steps=3)
    for problem in train + test:
        target = format_target(problem["answer"])
        assert has_format(target)
        assert is_correct(target, gold_number(problem["answer"]))


def test_format_target_round_trip_on_gsm8k_rows() -> None:
    for row in GSM8K_ROWS:
        target = format_target(row["answer"])
        assert has_format(target) and is_correct(target, gold_number(row["answer"]))


def test_to_rows() -> None:
    rows = to_rows(GSM8K_ROWS[1:2])
    assert rows == [{"prompt": format_prompt(GSM8K_ROWS[1]["question"]), "answer": "2000",
                     "question": GSM8K_ROWS[1]["question"], "solution": GSM8K_ROWS[1]["answer"]}]
    assert extract_answer(format_target(rows[0]["solution"])) == rows[0]["answer"]


# --- load_gsm8k ---------------------------------------------------------------------------------------

def test_load_jsonl(tmp_path: Path) -> None:
    rows = [dict(r, extra="dropped") for r in GSM8K_ROWS]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    assert load_gsm8k(str(path), "test") == GSM8K_ROWS
    assert load_gsm8k(str(path), "test", limit=2) == GSM8K_ROWS[:2]


def test_load_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n" + json.dumps(GSM8K_ROWS[0]) + "\n\n", encoding="utf-8")
    assert load_gsm8k(str(path), "train") == GSM8K_ROWS[:1]


def test_load_parquet(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "data.parquet", GSM8K_ROWS)
    assert load_gsm8k(str(path), "test") == GSM8K_ROWS


def test_load_folder_by_split(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS[:1])
    write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS[1:])
    assert load_gsm8k(str(tmp_path), "train") == GSM8K_ROWS[:1]
    assert load_gsm8k(str(tmp_path), "test") == GSM8K_ROWS[1:]


def test_load_folder_with_parquet_shards_in_hub_layout(tmp_path: Path) -> None:
    # The hub repo's layout: main/test-00000-of-00002.parquet, main/test-00001-of-00002.parquet.
    (tmp_path / "main").mkdir()
    write_parquet(tmp_path / "main" / "test-00001-of-00002.parquet", GSM8K_ROWS[2:])
    write_parquet(tmp_path / "main" / "test-00000-of-00002.parquet", GSM8K_ROWS[:2])
    write_parquet(tmp_path / "main" / "train-00000-of-00001.parquet", GSM8K_ROWS[:1])
    assert load_gsm8k(str(tmp_path), "test") == GSM8K_ROWS  # shards in name order
    assert load_gsm8k(str(tmp_path), "train") == GSM8K_ROWS[:1]


def test_load_folder_without_split_raises(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    with pytest.raises(UserError, match="no 'test.jsonl'"):
        load_gsm8k(str(tmp_path), "test")


def test_load_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found") as info:
        load_gsm8k(str(tmp_path / "nope.jsonl"), "test")
    assert "\n" not in str(info.value)


def test_load_missing_column_raises(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [GSM8K_ROWS[0], {"question": "q", "solution": "#### 1"}])
    expected = r"d.jsonl:2: no 'answer' column \(the row has 'question', 'solution'\)"
    with pytest.raises(UserError, match=expected) as info:
        load_gsm8k(str(path), "test")
    assert str(path) in str(info.value)


def test_load_bad_answer_raises(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "it is 5"}])
    with pytest.raises(UserError, match=r"1 of 1 rows have no usable gold answer.*d.jsonl:1.*####") as info:
        load_gsm8k(str(path), "test")
    assert "\n" not in str(info.value)


def _rows(n: int) -> list[dict]:
    return [{"question": f"Tom has {i} pens. How many?", "answer": f"{i}\n#### {i}"} for i in range(n)]


def test_a_few_bad_gold_answers_are_dropped_and_counted(tmp_path: Path) -> None:
    rows = _rows(200)
    rows[5]["answer"] = "no marker"
    rows[17]["answer"] = "#### many"
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    split = read_gsm8k(str(path), "train")
    assert (split.rows, split.dropped) == (200, 2)  # 1% of 200 is the most that may be dropped
    assert split.first_dropped.startswith(f"{path}:6: ")
    assert len(split.problems) == 198 and rows[5] not in split.problems
    # limit counts usable rows: the dropped ones never take a test slot
    assert load_gsm8k(str(path), "test", limit=10) == rows[:5] + rows[6:11]


def test_bad_gold_answers_above_the_share_name_the_file_and_count(tmp_path: Path) -> None:
    rows = _rows(200)
    for i in (3, 4, 9):
        rows[i]["answer"] = str(i)
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(UserError) as info:
        read_gsm8k(str(path), "train")
    message = str(info.value)
    assert message.startswith(f"{path}: 3 of 200 rows have no usable gold answer, more than the 1% allowed")
    assert f"{path}:4" in message and "\n" not in message
    assert MAX_BAD_GOLD_SHARE == 0.01


def test_empty_and_blank_files_are_empty_splits(tmp_path: Path) -> None:
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n")):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(UserError, match=rf"{name}: no rows \(the 'train' split is empty\)"):
            load_gsm8k(str(path), "train")


def test_a_non_utf8_file_names_the_line_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GSM8K_ROWS[0]).encode() + b"\n" + '{"question": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(UserError) as info:
        load_gsm8k(str(path), "train")
    assert str(info.value).startswith(f"{path}:2: not UTF-8 text (byte 0xe9")
    assert "\n" not in str(info.value)


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in GSM8K_ROWS).encode())
    assert load_gsm8k(str(path), "train") == GSM8K_ROWS


def test_a_json_array_with_a_syntax_error_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text("[\n" + json.dumps(GSM8K_ROWS[0]) + ",\n{oops}\n]", encoding="utf-8")
    with pytest.raises(UserError, match=r"d.json:3: not valid JSON"):
        load_gsm8k(str(path), "train")


def test_a_line_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GSM8K_ROWS[0]) + "\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"d.jsonl:2: a row must be an object .* got list"):
        load_gsm8k(str(path), "train")


def test_a_parquet_file_without_the_answer_column_is_named(tmp_path: Path) -> None:
    write_parquet(tmp_path / "train.parquet", [{"question": "q", "solution": "#### 1"}])
    with pytest.raises(UserError, match=r"train.parquet row 0: no 'answer' column"):
        load_gsm8k(str(tmp_path), "train")


def test_load_bad_json_line_raises(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GSM8K_ROWS[0]) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"d.jsonl:2"):
        load_gsm8k(str(path), "test")


def test_load_unsupported_file_type_raises(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(UserError, match="unsupported"):
        load_gsm8k(str(path), "test")


def test_load_negative_limit_raises(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", GSM8K_ROWS)
    with pytest.raises(UserError, match="limit"):
        load_gsm8k(str(path), "test", limit=-1)


def test_load_hub_id_uses_datasets_main_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in `datasets` module: the hub path is exercised without the network.
    calls = []

    def load_dataset(path: str, name: str, split: str) -> list[dict]:
        calls.append((path, name, split))
        return [dict(r, extra=1) for r in GSM8K_ROWS]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_gsm8k("openai/gsm8k", "test", limit=2) == GSM8K_ROWS[:2]
    assert calls == [("openai/gsm8k", "main", "test")]


def test_load_hub_failure_is_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def load_dataset(path: str, name: str, split: str) -> list[dict]:
        raise ConnectionError("Couldn't reach the hub\nsecond line")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(UserError, match="openai/gsm8k.*Couldn't reach the hub") as info:
        load_gsm8k("openai/gsm8k", "test")
    assert "\n" not in str(info.value)
