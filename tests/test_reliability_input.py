"""Every input bounded before anything exists, no number that is not one, no uncapped text on the page, and a note
on duplicated training questions.

- a YAML alias bomb, a 50 MB string, a preset file of many MB, deep or huge free-form mappings, a control
  character: each refused in one line by ``load_spec`` (so by ``--dry-run`` and ``bench run``), in well under a second,
  with no folder created;
- a result whose measurements are NaN is malformed: ``--resume`` re-runs it, the report shows it failed
  with the keys named, and no page prints ``nan``;
- a 5,000-character label (and every other string from a result or suite.json) reaches the page capped, once,
  where results are loaded;
- a training file of 200 copies of one question says how many repeats it found and that they are kept.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

from bench.cli import main
from bench.config.loading import MAX_NODES, MAX_PRESET_BYTES, load_spec
from bench.errors import SpecError
from bench.results import incomplete_reason, result_problems, write_json_atomic

BOMB = """name: bomb
tuning:
  methods:
    a: &a [x, x, x, x, x, x, x, x, x, x]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
"""
"""10^7 strings from 400 bytes: it passed validation and --dry-run, and the real run hung serialising it."""


def _preset(tmp_path: Path, text: str | bytes, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _deep(levels: int) -> str:
    return "tuning:\n  methods:\n" + "".join("    " + "  " * i + f"k{i}:\n" for i in range(levels)) + \
        "    " + "  " * levels + "leaf: 1\n"


@pytest.mark.parametrize("what, text, message", [
    ("an alias bomb under a free-form mapping", BOMB, "YAML alias '*a' is not allowed"),
    ("one alias", "name: a\ndescription: &d hello\ntuning: {command: *d}\n", "YAML alias '*d' is not allowed"),
    ("a 2 MB description", "description: " + "x" * 2_000_000 + "\n", "larger than 1,048,576 bytes"),
    ("a 5,000-character description", "description: " + "x" * 5000 + "\n", "'description' is 5,000 characters long"),
    ("a 10,000-character string", "tuning: {command: " + "x" * 10_000 + "}\n", "'tuning.command' is 10,000"),
    ("a free-form mapping 40 levels deep", _deep(40), "nested more than 16 levels deep"),
    ("a free-form mapping of 30,000 values", "tuning:\n  methods:\n" +
     "".join(f"    k{i}: {i}\n" for i in range(30_000)), f"more than {MAX_NODES:,} values"),
    ("brackets 100,000 deep", "tuning: {methods: " + "[" * 100_000 + "]" * 100_000 + "}\n", "nested"),
    ("an escape sequence for the terminal", 'description: "\\e[2J\\e[31mhi"\n', "control character (0x1b)"),
])
def test_unbounded_input_is_refused_at_once_in_one_line(what: str, text: str, message: str, tmp_path: Path) -> None:
    path = _preset(tmp_path, text)
    started = time.monotonic()
    with pytest.raises(SpecError, match=re.escape(message)) as caught:
        load_spec(path)
    assert time.monotonic() - started < 10, f"{what}: took {time.monotonic() - started:.1f}s"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("override, message", [
    ("tuning.methods={a: &x [1, 2], b: *x}", "YAML alias '*x' is not allowed"),
    ("description=" + "x" * 100_000, "'description' is 100,000 characters long"),
    ("tuning.methods=" + "[" * 50_000, "nested"),
])
def test_overrides_are_bounded_the_same_way(override: str, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec("cpu-quick", [override])


def test_a_bomb_run_is_refused_before_any_folder_exists(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _preset(tmp_path, BOMB)
    for argv in (["run", "--preset", path, "--dry-run"], ["run", "--preset", path, "--out", str(tmp_path / "out")],
                 ["run", "--preset", path]):
        started = time.monotonic()
        assert main(argv) == 2
        assert time.monotonic() - started < 10
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "YAML alias" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]  # no out/, no reports/, no lock


def test_the_shipped_presets_are_within_the_bounds() -> None:
    from bench.config.loading import preset_names

    for name in preset_names():
        load_spec(name)
    assert MAX_PRESET_BYTES >= 64 * 1024


# -- non-finite numbers -------------------------------------------------------------------------------------
def _nan_everywhere(value):
    if isinstance(value, bool) or isinstance(value, str) or value is None:
        return value
    if isinstance(value, (int, float)):
        return math.nan
    if isinstance(value, dict):
        return {k: _nan_everywhere(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_everywhere(v) for v in value]
    return value


def _ok_result(run_id: str = "grpo-s0") -> dict:
    from report_fixtures import method_result

    result = method_result("grpo")
    result["run_id"] = run_id
    return result


def test_a_result_whose_measurements_are_nan_is_malformed_and_resume_reruns_it(tmp_path: Path) -> None:
    result = _ok_result()
    assert result_problems(result) == []
    for section in ("accuracy", "memory", "throughput", "phases"):
        result[section] = _nan_everywhere(result[section])
    problems = result_problems(result)
    assert any("non-finite" in p and "accuracy." in p for p in problems), problems
    write_json_atomic(tmp_path / "grpo-s0" / "result.json", result)
    assert incomplete_reason(tmp_path / "grpo-s0").startswith("invalid result (non-finite number(s)")
    one = _ok_result()
    one["throughput"]["tokens_per_s"] = math.inf
    assert any("throughput.tokens_per_s" in p for p in result_problems(one))
    curves = _ok_result()
    curves["curves"] = [{"step": 1, "explained_variance": math.nan}]  # undefined at a step: allowed there
    assert result_problems(curves) == []


def test_the_page_never_prints_nan_and_says_why_the_run_failed(tmp_path: Path) -> None:
    from report_fixtures import write_suite

    from bench.report import build_report

    suite = write_suite(tmp_path)
    path = suite / "runs" / "grpo-s0" / "result.json"
    result = json.loads(path.read_text())
    nan = {k: (_nan_everywhere(v) if k not in ("schema_version", "seed", "run_id") else v) for k, v in result.items()}
    path.write_text(json.dumps(nan))  # Python writes NaN and Infinity; so might any other tool
    control = suite / "runs" / "control-s0" / "result.json"
    data = json.loads(control.read_text())
    data["curves"] = [{**p, "reward": math.nan, "kl": math.inf} for p in data["curves"]]
    data["metrics"]["pair_accuracy"] = math.nan
    control.write_text(json.dumps(data))
    build_report(suite)
    page = (suite / "index.html").read_text()
    summary = (suite / "summary.md").read_text()
    for text in (page, summary, (suite / "results.csv").read_text()):
        assert not re.search(r"\b(nan|NaN|inf|Infinity)\b", text), re.search(r".{60}\b(nan|NaN|inf|Infinity)\b.{20}",
                                                                           text)
    assert "non-finite number(s) where a measurement belongs" in page


# -- uncapped text --------------------------------------------------------------------------------------------
def test_a_5000_character_label_reaches_the_page_capped(tmp_path: Path) -> None:
    from report_fixtures import write_suite

    from bench.report import build_report
    from bench.report.load import NAME_LIMIT

    suite = write_suite(tmp_path)
    long = "L" * 5000
    for run in (suite / "runs").iterdir():
        path = run / "result.json"
        data = json.loads(path.read_text())
        if data["method"] == "grpo":
            data.update(label=long, engine="E" * 5000)
            data["metrics"]["M" * 5000] = 1.0
            data["settings"]["note"] = "S" * 50_000
            path.write_text(json.dumps(data))
    meta = json.loads((suite / "suite.json").read_text())
    meta.update(preset="P" * 5000, description="D" * 50_000)
    meta["commands"]["run"] = "bench run " + "C" * 100_000
    (suite / "suite.json").write_text(json.dumps(meta))
    build_report(suite)
    for name in ("index.html", "summary.md", "results.csv"):
        text = (suite / name).read_text()
        for letter in "LEMP":
            assert letter * (NAME_LIMIT + 1) not in text, (name, letter)
        for letter, limit in (("S", 2000), ("D", 1000), ("C", 2000)):
            assert letter * (limit + 1) not in text, (name, letter)
        assert len(text) < 600_000, name
    page = (suite / "index.html").read_text()
    assert "L" * NAME_LIMIT + "… (4,900 more characters)" in page


def test_a_result_nested_thousands_deep_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    from report_fixtures import write_suite

    from bench.report import build_report

    suite = write_suite(tmp_path)
    (suite / "runs" / "dpo-s0" / "result.json").write_text("[" * 200_000 + "]" * 200_000)
    build_report(suite)
    assert "result.json unreadable" in (suite / "index.html").read_text()
    from bench.results import is_complete

    assert not is_complete(suite / "runs" / "dpo-s0")


# -- duplicated training questions ----------------------------------------------------------------------------
def test_a_training_file_of_one_question_repeated_says_so(tmp_path: Path) -> None:
    from bench.task.data import load_task

    question = {"question": "Tom has 3 apples and gets 2 more. How many apples does he have?",
                "answer": "3 + 2 = 5\n#### 5"}
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(question) for _ in range(200)) + "\n")
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps({"question": f"Ann has {i} pens and buys one. How "
                                                                           f"many?", "answer": f"#### {i + 1}"})
                                                   for i in range(20)) + "\n")
    spec = load_spec("cpu-quick", ["task.source=gsm8k", f"task.path={tmp_path}", "model.source=hub",
                                   "model.name_or_path=x", "task.train_size=200", "task.test_size=20"])
    notes = load_task(spec).notes
    repeat = [n for n in notes if "repeat" in n]
    assert len(repeat) == 1 and "199 of 200 training questions repeat an earlier one (1 distinct" in repeat[0]
    assert "kept" in repeat[0]
