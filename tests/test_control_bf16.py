"""The control arm under the GPU preset's precision policy (issue 20, issue 21 item 2): with ``model.dtype: bfloat16``
(fp32 master weights under bf16 autocast, frozen networks in bf16) the lr-0 control must score exactly its start on
every question in every mode, because the start and every method are scored in one evaluation numerics.

Before the fix the warm start scored its bf16-stored weights and the control its float32 reload of them, and greedy
completions differed on a real model (7 of 12 questions). On cpu-quick's tiny model they happened to agree (the old
code run once against this test: 48 of 48 questions equal), so what fails there before the fix is the recorded
evaluation numerics and the control's KL (a bf16 reference against the autocast actor); the completion-level
equality of the two numerics is tested on the logits in tests/test_numerics.py. This runs the real CLI (the warm
start and the control arm in their own workers, about three CPU-minutes).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench_cli import run_quick_suite

OFF = [f"methods.{m}.enabled=false" for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo")]


def _records(run_dir: Path) -> list[dict]:
    with open(run_dir / "completions.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_control_equals_its_start_on_every_question_under_bf16(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    proc = run_quick_suite(out, "model.dtype=bfloat16", "methods.control.enabled=true", *OFF,
                           "eval.max_new_tokens=16", cache_dir=tmp_path / "cache", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start_dir, control_dir = out / "runs" / "warm_start", out / "runs" / "control-s0"
    start, control = _records(start_dir), _records(control_dir)
    assert len(start) == len(control) > 0
    for before, after in zip(start, control):
        assert after["completion"] == before["completion"], before["index"]  # token for token
        assert after["correct"] == before["correct"], before["index"]  # so every mode's verdict
    assert any(any(r["correct"].values()) for r in start)  # the verdicts compared are not all False
    result = json.loads((control_dir / "result.json").read_text())
    assert result["accuracy"]["after"] == result["accuracy"]["before"]
    evaluation = result["evaluation"]
    assert evaluation["precision"] == {"storage": "float32", "compute": "bfloat16 autocast, float32 residual stream"}
    assert evaluation["before_precision"] == evaluation["precision"] and evaluation["same_numerics"] is True
    # the reference (bf16) computes in the actor's numerics: the policy never moves, so no step shows a KL
    assert [point["kl"] for point in result["curves"]] == [0.0] * len(result["curves"])
