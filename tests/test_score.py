"""bench.execution.score: scoring a JSON Lines file of completions, verdicts, and one-line errors for bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.errors import UserError
from bench.execution.score import add_score_arguments, main, run_score, score_file

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


# --- every completion on disk (bench.scoring.evaluation, bench.execution.run_result.assemble_evaluation) ------------------------

GOLD_ANSWER = "She has 2+3=<<2+3=5>>5 apples.\n#### 5"
ROW = {"question": "Ann has 2 apples and buys 3. How many?", "prompt": "Q: ...", "answer": "5", "solution": GOLD_ANSWER}


def test_completion_record_holds_text_and_every_mode() -> None:
    import hashlib

    from bench.scoring.evaluation import completion_record
    from bench.task.verifier import MODES

    record = completion_record(3, ROW, "2+3=5\n#### 5.0", 9, False)
    assert record["index"] == 3 and record["tokens"] == 9 and record["hit_max"] is False
    assert record["id"] == hashlib.sha256(ROW["question"].encode()).hexdigest()[:16]
    assert (record["prompt"], record["gold"], record["gold_answer"]) == ("Q: ...", "5", GOLD_ANSWER)
    assert set(record["extracted"]) == set(record["correct"]) == set(MODES)
    # "5.0": the same number for the suite, another string for lm-eval.
    assert record["extracted"]["suite-strict"] == "5" and record["correct"]["suite-strict"] is True
    assert record["extracted"]["lmeval-strict"] == "5.0" and record["correct"]["lmeval-strict"] is False
    json.dumps(record)  # one JSON line


class _Batch(dict):
    def to(self, device: object) -> "_Batch":
        return self


class _Tokenizer:
    """Characters as token ids; id 1 is EOS, id 0 padding."""

    eos_token_id, pad_token_id, padding_side = 1, 0, "right"

    def __call__(self, texts: list[str], **kwargs: object) -> _Batch:
        import torch

        width = max(len(t) for t in texts)
        ids = [[0] * (width - len(t)) + [ord(c) for c in t] for t in texts]
        mask = [[0] * (width - len(t)) + [1] * len(t) for t in texts]
        return _Batch(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i > 1)


class _Model:
    """Answers each prompt with a fixed continuation (token ids), as a batch of generate would (EOS-padded)."""

    training = False

    def __init__(self, replies: dict[str, list[int]]) -> None:
        self.replies, self.generation_config = replies, None

    def parameters(self):  # noqa: ANN201
        import torch

        yield torch.zeros(1)

    def eval(self) -> "_Model":
        return self

    def generate(self, input_ids, attention_mask, generation_config):  # noqa: ANN001, ANN201
        import torch

        prompts = ["".join(chr(int(i)) for i in row if int(i) > 1) for row in input_ids]
        new = [self.replies[p][: generation_config.max_new_tokens] for p in prompts]
        width = max(len(n) for n in new)
        new = [n + [1] * (width - len(n)) for n in new]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)


def test_evaluate_keeps_every_completion_with_length_and_hit_max() -> None:
    from bench.scoring.evaluation import evaluate

    text = [ord(c) for c in "#### 5"]
    rows = [{**ROW, "prompt": p, "question": f"question {p}"} for p in ("a", "b", "c")]
    model = _Model({"a": text + [1], "b": text + [ord("0")] * 10, "c": text[:4] + [1]})
    result = evaluate(model, _Tokenizer(), rows, max_new_tokens=8, batch_size=2, samples_in_report=1)
    records = result["records"]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert [r["completion"] for r in records] == ["#### 5", "#### 500", "####"]
    assert [r["tokens"] for r in records] == [7, 8, 5]  # the EOS counts; b ran to the budget
    assert [r["hit_max"] for r in records] == [False, True, False]
    assert result["truncated_rate"] == pytest.approx(1 / 3)
    assert result["format_rate"] == pytest.approx(2 / 3)  # "####" alone has no answer
    assert result["scores"]["suite-strict"]["correct"] == 1 and result["scores"]["lmeval-strict"]["total"] == 3
    assert result["samples"] == [{"question": "question a", "completion": "#### 5", "gold": "5", "correct": True}]


def test_budget_ending_exactly_on_eos_is_not_hit_max() -> None:
    from bench.scoring.evaluation import evaluate

    reply = [ord(c) for c in "#### 5"] + [1]  # 7 tokens, the 7th EOS
    result = evaluate(_Model({"a": reply}), _Tokenizer(), [{**ROW, "prompt": "a"}], max_new_tokens=7, batch_size=1)
    assert result["records"][0]["hit_max"] is False and result["records"][0]["tokens"] == 7


def test_assemble_evaluation_writes_completions_and_rates(tmp_path: Path) -> None:
    from bench.scoring.evaluation import completion_record, summarize_records
    from bench.results import empty_result, write_json_atomic
    from bench.execution.run_result import EVAL_FILE, assemble_evaluation

    warm = tmp_path / "warm_start-s0"
    warm.mkdir()
    before = empty_result("warm_start-s0", "stage", "warm_start", "Warm start", "trl", 0)
    before["accuracy"]["after"] = {"suite-strict": {"accuracy": 0.5}}
    before["accuracy"]["format_rate"] = {"before": None, "after": 0.25}
    write_json_atomic(warm / "result.json", before)
    records = [completion_record(0, ROW, "#### 5", 3, False), completion_record(1, ROW, "5 5 5 5", 8, True)]
    evaluation = {**summarize_records(records), "records": records, "samples": [], "generation": {},
                  "prompt_style": "cot"}
    result = empty_result("grpo-s0", "method", "grpo", "GRPO", "trl", 0)
    run_dir = tmp_path / "grpo-s0"
    run_dir.mkdir()
    assemble_evaluation(result, run_dir, evaluation, 2, warm)
    assert result["eval_file"] == EVAL_FILE == "completions.jsonl"
    lines = [json.loads(line) for line in (run_dir / EVAL_FILE).read_text(encoding="utf-8").splitlines()]
    assert lines == records
    accuracy = result["accuracy"]
    assert accuracy["before"] == before["accuracy"]["after"]
    assert accuracy["after"]["suite-strict"]["correct"] == 1 and accuracy["after"]["suite-flexible"]["correct"] == 2
    assert accuracy["format_rate"] == {"before": 0.25, "after": 0.5}
    assert accuracy["truncated_rate"] == {"before": None, "after": 0.5}
    assert accuracy["prompt_style"] == "cot"


# --- bench score SUITE_DIR --------------------------------------------------------------------------------

def _ok_result(run_id: str, method: str, kind: str) -> dict:
    from bench.results import empty_result

    result = empty_result(run_id, kind, method, method, "trl", 0)
    result.update(status="ok", started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:01:00+00:00",
                  eval_file="completions.jsonl", throughput={"wall_s": 60.0})
    return result


def _suite(tmp_path: Path) -> Path:
    """A fabricated suite: a warm start and a method read it, each with completions.jsonl whose stored verdicts
    are stale (all False) and whose stored accuracy is a placeholder; a sample pool that is not evaluated."""
    from bench.scoring.evaluation import completion_record, summarize_records
    from bench.results import write_json_atomic
    from bench.execution.runner import inputs_hash

    suite = tmp_path / "suite"
    runs = suite / "runs"
    write_json_atomic(suite / "suite.json", {"preset": "t", "runs": ["warm_start-s0", "sample_pool-s0", "grpo-s0"],
                                             "spec": {}})
    completions = {"warm_start-s0": ["#### 5", "5", "#### 5.0", "x"], "grpo-s0": ["#### 5", "#### 5.", "#### 5.0", "5"]}
    for run_id, texts in completions.items():
        records = [completion_record(i, ROW, t, 4, i == 3) for i, t in enumerate(texts)]
        for r in records:  # stale verdicts: re-scoring must recompute them
            r["correct"] = {m: False for m in r["correct"]}
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    write_json_atomic(runs / "warm_start-s0" / "result.json", _ok_result("warm_start-s0", "warm_start", "stage"))
    write_json_atomic(runs / "warm_start-s0" / "run.json", {"inputs": {}})
    pool = _ok_result("sample_pool-s0", "sample_pool", "stage")
    pool["eval_file"] = None
    for run_id, result in (("sample_pool-s0", pool), ("grpo-s0", _ok_result("grpo-s0", "grpo", "method"))):
        result["inputs_hash"] = inputs_hash(suite, SimpleNamespace(needs=["warm_start-s0"]))
        write_json_atomic(runs / run_id / "result.json", result)
        write_json_atomic(runs / run_id / "run.json", {"inputs": {
            "init_model_dir": str(runs / "warm_start-s0" / "model"), "warm_start_dir": str(runs / "warm_start-s0")}})
    return suite


def test_score_a_suite_folder_rescores_rewrites_and_rebuilds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from bench.results import incomplete_reason
    from bench.execution.runner import inputs_hash

    suite = _suite(tmp_path)
    assert main([str(suite), "--mode", "lmeval-strict"]) == 0
    out = capsys.readouterr().out
    # lm-eval strict: "#### 5" and "#### 5." right, "#### 5.0" and a bare "5" wrong.
    assert "grpo-s0" in out and "accuracy 0.5000 (2/4)" in out and "not evaluated" in out
    grpo = json.loads((suite / "runs" / "grpo-s0" / "result.json").read_text())
    assert grpo["accuracy"]["after"]["lmeval-strict"]["correct"] == 2
    assert grpo["accuracy"]["after"]["suite-strict"]["correct"] == 3  # 5.0 equals 5 as a number
    assert grpo["accuracy"]["after"]["suite-flexible"]["correct"] == 4
    assert grpo["accuracy"]["before"]["suite-strict"]["correct"] == 2  # the re-scored warm start's after
    assert grpo["accuracy"]["truncated_rate"] == {"before": 0.25, "after": 0.25}
    assert grpo["accuracy"]["format_rate"] == {"before": 0.5, "after": 0.75}
    lines = [json.loads(line) for line in (suite / "runs" / "grpo-s0" / "completions.jsonl").read_text().splitlines()]
    assert [r["correct"]["lmeval-strict"] for r in lines] == [True, True, False, False]
    assert json.loads((suite / "report_settings.json").read_text()) == {"headline_mode": "lmeval-strict"}
    assert (suite / "index.html").is_file()
    # Only scores changed, not the checkpoint: --resume still reuses the runs that read the warm start.
    needs = SimpleNamespace(needs=["warm_start-s0"])
    for run_id in ("grpo-s0", "sample_pool-s0"):
        assert incomplete_reason(suite / "runs" / run_id, inputs_hash(suite, needs)) is None, run_id


def test_score_a_suite_folder_accepts_old_mode_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite = _suite(tmp_path)
    assert main([str(suite), "--mode", "strict"]) == 0
    assert "accuracy 0.7500 (3/4)" in capsys.readouterr().out
    assert json.loads((suite / "report_settings.json").read_text()) == {"headline_mode": "suite-strict"}


def test_score_a_folder_that_is_not_a_suite_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a suite folder (no suite.json)" in err and len(err.strip().splitlines()) == 1


def test_score_a_file_still_needs_its_fields(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path / "c.jsonl", ROWS)
    assert main([str(path)]) == 2
    assert "--completion-field and --gold-field" in capsys.readouterr().err


def test_score_a_file_in_lmeval_mode_uses_the_gold_text(tmp_path: Path) -> None:
    rows = [{"out": "#### 5.0", "gold": GOLD_ANSWER}, {"out": "#### 5", "gold": GOLD_ANSWER}]
    path = write(tmp_path / "c.jsonl", rows)
    assert score_file(path, "out", "gold", "lmeval-strict", None) == (1, 2)
    assert score_file(path, "out", "gold", "suite-strict", None) == (2, 2)
