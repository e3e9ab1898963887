"""What every worker result records beside training: the held-out split's overlap checks (``data_checks``) and
the final evaluation's monitors (``monitors.eval``). See the schema in bench/results.py.

No model is built: the worker's body runs up to the point where training would start (the overlap checks are
recorded before it, so a failed run keeps them), and the evaluation part runs on hand-made completion records.
"""

from __future__ import annotations

from pathlib import Path

import pytest


class _Stop(Exception):
    """Raised where the worker would build its telemetry and train: the test has what it came for."""


class _IdentityTokenizer:
    """Prompts pass through unchanged (cpu-quick renders no chat template)."""

    chat_template = None


@pytest.mark.parametrize("kind, name", [("method", "grpo_engine"), ("stage", "warm_start")])
def test_every_run_records_the_overlap_checks_before_training(tmp_path: Path, monkeypatch, kind, name) -> None:
    import bench.telemetry
    import bench.execution.worker as worker
    from bench.results import empty_result
    from bench.config.loading import load_spec

    monkeypatch.setattr(bench.telemetry, "capture_environment", lambda repo: {})
    monkeypatch.setattr(worker, "resolve_model", lambda spec, inputs: ("unused", _IdentityTokenizer()))
    monkeypatch.setattr(worker, "build_telemetry", lambda spec, kind, device: (_ for _ in ()).throw(_Stop()))
    job = {"spec": load_spec("cpu-quick").to_dict(), "kind": kind, "name": name, "seed": 0, "inputs": {}}
    result = empty_result(f"{name}-s0", kind, name, name, "suite", 0)
    with pytest.raises(_Stop):
        worker._train_and_evaluate(job, tmp_path, result, {})
    checks = result["data_checks"]
    assert checks["working_overlap"] == 0 and checks["question_overlap"] == 0  # held out for real
    assert isinstance(checks.get("held_out_by"), str)


def test_the_evaluation_records_its_monitors(tmp_path: Path) -> None:
    from bench.scoring.evaluation import completion_record, summarize_records
    from bench.results import empty_result
    from bench.execution.run_result import assemble_evaluation

    row = {"question": "What is 2 + 3?", "prompt": "What is 2 + 3?", "answer": "5"}
    texts = ["<think>2 + 3 = 5</think> <answer>5</answer>", "no answer here", "<think>2+3</think> <answer>4</answer>",
             "wait, let me check <answer>5</answer>"]
    records = [completion_record(i, row, text, 6, False) for i, text in enumerate(texts)]
    evaluation = {**summarize_records(records), "records": records, "samples": [], "generation": {}}
    result = empty_result("grpo-s0", "method", "grpo", "GRPO", "trl", 0)
    assemble_evaluation(result, tmp_path, evaluation, len(records), None)
    monitors = result["monitors"]["eval"]
    assert monitors["empty_answer_rate"] == pytest.approx(0.25)  # 'no answer here'
    assert monitors["format_only_rate"] == pytest.approx(0.25)  # the format with a wrong answer
    assert monitors["answer_in_think_rate"] == pytest.approx(0.25)
    assert monitors["reflection_rate"] == pytest.approx(0.25)
    assert monitors["completion_length"] == 6 and monitors["truncated_rate"] == 0
