"""bench.score: scoring a JSON Lines file of completions, verdicts, and one-line errors for bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.errors import UserError
from bench.score import add_score_arguments, main, run_score, score_file

ROWS = [
    {"out": "<think>9*2=18</think> <answer>18</answer>", "gold": "18"},  # right
    {"out": "<answer>17</answer>", "gold": "She makes 9*2=<<9*2=18>>18.\n#### 18"},  # wrong, gold worked
    {"out": "the total is 1000", "gold": "#### 1,000"},  # right only in flexible
    {"out": "#### 5", "gold": 5},  # right, gold a JSON number
]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_score_file_strict_and_flexible(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", ROWS)
    assert score_file(path, "out", "gold", "strict", None) == (2, 4)
    assert score_file(path, "out", "gold", "flexible", None) == (3, 4)


def test_score_file_writes_verdicts(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    # A blank line is skipped, and verdict line numbers are the input's line numbers.
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    out = tmp_path / "sub" / "v.jsonl"
    assert score_file(path, "out", "gold", "strict", out) == (1, 2)
    verdicts = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert verdicts == [{"line": 1, "extracted": "18", "gold": "18", "correct": True},
                        {"line": 3, "extracted": "17", "gold": "18", "correct": False}]


def test_score_file_verdict_extracted_none(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", [{"out": "no idea", "gold": "3"}])
    out = tmp_path / "v.jsonl"
    assert score_file(path, "out", "gold", "strict", out) == (0, 1)
    assert json.loads(out.read_text()) == {"line": 1, "extracted": None, "gold": "3", "correct": False}


def test_bad_json_line_reports_line_number(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n{not json\n", encoding="utf-8")
    out = tmp_path / "v.jsonl"
    with pytest.raises(UserError, match=r"c\.jsonl:3: not valid JSON") as info:
        score_file(path, "out", "gold", "strict", out)
    assert "\n" not in str(info.value)
    assert not out.exists(), "no partial verdicts file on bad input"


def test_missing_field_names_fields_present(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", [ROWS[0], {"text": "x", "answer": "1"}])
    with pytest.raises(UserError, match=r":2: no field 'out' \(fields present: answer, text\)"):
        score_file(path, "out", "gold", "strict", None)


def test_non_object_line_raises(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(UserError, match=r":1: expected a JSON object"):
        score_file(path, "out", "gold", "strict", None)


@pytest.mark.parametrize("gold", ["eighteen", "x\n#### abc", None, True])
def test_bad_gold_raises(tmp_path: Path, gold: object) -> None:
    path = write(tmp_path / "c.jsonl", [{"out": "<answer>1</answer>", "gold": gold}])
    with pytest.raises(UserError, match=r":1: gold field 'gold'"):
        score_file(path, "out", "gold", "strict", None)


def test_missing_file_and_bad_mode_raise(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        score_file(tmp_path / "nope.jsonl", "out", "gold", "strict", None)
    path = write(tmp_path / "c.jsonl", ROWS)
    with pytest.raises(UserError, match="mode"):
        score_file(path, "out", "gold", "loose", None)


def test_run_score_prints_accuracy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "c.jsonl", ROWS)
    parser = argparse.ArgumentParser()
    add_score_arguments(parser)
    args = parser.parse_args([str(path), "--completion-field", "out", "--gold-field", "gold", "--mode", "flexible"])
    assert run_score(args) == 0
    assert capsys.readouterr().out.startswith("accuracy: 0.7500 (3/4)")


def test_main_end_to_end_and_user_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "c.jsonl", ROWS)
    verdicts = tmp_path / "v.jsonl"
    assert main([str(path), "--completion-field", "out", "--gold-field", "gold", "--verdicts", str(verdicts)]) == 0
    assert "accuracy: 0.5000 (2/4)" in capsys.readouterr().out
    assert len(verdicts.read_text().splitlines()) == 4
    assert main([str(path), "--completion-field", "missing", "--gold-field", "gold"]) == 2
    err = capsys.readouterr().err
    assert "no field 'missing'" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):  # argparse rejects an unknown mode before scoring
        main([str(path), "--completion-field", "out", "--gold-field", "gold", "--mode", "loose"])
