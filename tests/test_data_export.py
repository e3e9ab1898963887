"""`bench data`: the exact splits a preset uses, printed with their overlap checks and exported as GSM8K JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.task.export as data_export
from bench.cli import main
from bench.task.data import load_task
from bench.config.loading import load_spec
from bench.task.problems import read_gsm8k


def _read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_export_writes_exactly_the_preset_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "splits"  # created on demand
    assert main(["data", "--preset", "cpu-quick", "task.test_size=30", "--export", str(out)]) == 0
    data = load_task(load_spec("cpu-quick", ["task.test_size=30"]))
    train, test = _read_lines(out / "train.jsonl"), _read_lines(out / "test.jsonl")
    assert (len(train), len(test)) == (400, 30)
    assert train == data.train and test == data.test  # same problems, same order, only question and answer
    assert all(set(row) == {"question", "answer"} for row in train + test)
    # GSM8K's layout: the folder loads back as a GSM8K source, row for row.
    assert read_gsm8k(str(out), "test").problems == data.test
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[0] == f"train: 400 problems -> {out / 'train.jsonl'}"
    assert stdout[1] == f"test: 30 problems -> {out / 'test.jsonl'}"
    assert stdout[2].startswith("checks: working_overlap 0, question_overlap 0, step_overlap 0 (held out by working")
    assert sorted(p.name for p in out.iterdir()) == ["test.jsonl", "train.jsonl"]  # no temporary files left


def test_export_writes_the_validation_split_when_the_preset_has_one(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "splits"
    overrides = ["task.validation_size=20", "task.test_size=30"]
    assert main(["data", "--preset", "cpu-quick", *overrides, "--export", str(out)]) == 0
    data = load_task(load_spec("cpu-quick", overrides))
    assert sorted(p.name for p in out.iterdir()) == ["test.jsonl", "train.jsonl", "validation.jsonl"]
    train, validation = _read_lines(out / "train.jsonl"), _read_lines(out / "validation.jsonl")
    assert validation == data.validation and len(validation) == 20
    assert train == data.train and _read_lines(out / "test.jsonl") == data.test
    # The validation problems were carved from the training side: none is left among the exported training rows.
    assert not {r["question"] for r in validation} & {r["question"] for r in train}
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[:3] == [f"train: 400 problems -> {out / 'train.jsonl'}",
                          f"validation: 20 problems -> {out / 'validation.jsonl'}",
                          f"test: 30 problems -> {out / 'test.jsonl'}"]
    assert "validation_working_overlap 0" in stdout[3]


def test_a_tuning_runs_splits_export_validation_and_never_test(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.task.data

    def no_test(*args: object, **kwargs: object) -> None:
        raise AssertionError("the test split was generated")

    monkeypatch.setattr(bench.task.data, "synthetic_splits", no_test)
    out = tmp_path / "splits"
    assert main(["data", "--preset", "cpu-quick", "task.validation_size=20", "eval.split=validation",
                 "--export", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["train.jsonl", "validation.jsonl"]
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[1] == f"validation: 20 problems -> {out / 'validation.jsonl'}"
    assert stdout[2] == "test: not loaded (eval.split is validation: the test split is never read)"


def test_without_export_only_counts_and_checks_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["data", "--preset", "cpu-quick", "task.train_size=100"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["train: 100 problems", "test: 48 problems"]
    assert list(tmp_path.iterdir()) == []


def test_gsm8k_overlap_is_printed_with_its_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"question": f"Tom has {i} pens and buys 2 more. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"}
            for i in range(10)]
    src = tmp_path / "gsm8k"
    data_export.export_splits({"train": rows[:8], "test": rows[6:]}, src)  # rows 6 and 7 in both
    overrides = ["task.source=gsm8k", f"task.path={src}", "task.train_size=8", "task.test_size=4",
                 "model.source=path", f"model.name_or_path={tmp_path}"]
    assert main(["data", "--preset", "cpu-quick", *overrides]) == 0
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[2] == "checks: question_overlap 2 (held out by source: its train and test files)"
    assert any(line.startswith("note: ") and "2 of 4 test questions also occur in" in line for line in stdout)


def test_a_bad_preset_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "--preset", "no-such-preset"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench: error: unknown preset 'no-such-preset'") and err.count("\n") == 1


def test_an_unwritable_folder_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["data", "--preset", "cpu-quick", "--export", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    # bench.cli checks every path argument first (bench.config.paths): the message says what the path is
    assert err.startswith(f"bench: error: --export '{blocker / 'out'}' runs through a file") and err.count("\n") == 1


def test_a_failed_write_keeps_the_earlier_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.jsonl"
    data_export.write_jsonl_atomic(path, [{"question": "q1", "answer": "#### 1"}])
    before = path.read_bytes()
    calls, real_dumps = [], json.dumps

    def dumps_then_fail(obj: object, **kwargs: object) -> str:
        calls.append(obj)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_dumps(obj, **kwargs)

    monkeypatch.setattr(data_export.json, "dumps", dumps_then_fail)
    with pytest.raises(OSError):
        data_export.write_jsonl_atomic(path, [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(3)])
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["train.jsonl"]
