"""The result of a run that finished: training (memory, phases, throughput, curves, metrics, settings), evaluation
(accuracy before and after, rates, samples, every completion on disk, the numerics each side was scored in), and
the schema check that turns a malformed ok result into a failed one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.results import MESSAGE_LIMIT, cap_text, read_result, result_problems

EVAL_FILE = "completions.jsonl"
"""Every evaluation completion with its verdicts, one JSON line per test question
(bench.scoring.evaluation.completion_record)."""


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """One JSON line per row."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def throughput(outcome: Any, timing: dict[str, Any], telemetry_summary: dict[str, Any]) -> dict[str, Any]:
    """Counts and rates per second of training time (``timing["train_s"]``); None where nothing was
    generated or trained. ``setup_s`` (model loading, trainer construction) is kept apart so that it
    does not dilute the rates; ``timing`` names the window ``train_s`` covers. (bench.execution.worker.run adds
    wall_s.)"""
    train_s = timing.get("train_s")

    def rate(count: int | None) -> float | None:
        return count / train_s if count and train_s else None

    return {
        "train_s": train_s,
        "setup_s": timing.get("setup_s"),
        "recipe_s": timing.get("recipe_s"),
        "timing": timing.get("timing"),
        "steps": outcome.steps,
        "completions": outcome.completions,
        "generated_tokens": outcome.generated_tokens,
        "trained_tokens": outcome.trained_tokens,
        "completions_per_s": rate(outcome.completions),
        "tokens_per_s": rate(outcome.generated_tokens),
        "trained_tokens_per_s": rate(outcome.trained_tokens),
        "step_s_median": telemetry_summary.get("step_s_median"),
        "step_s_p90": telemetry_summary.get("step_s_p90"),
        "step_times_s": telemetry_summary.get("step_times_s", []),
    }


def check_own_result(result: dict[str, Any]) -> None:
    """Turn an ok result that does not match the schema into a failed one, so that the recipe or worker bug
    shows now instead of as a run that --resume re-runs forever (it reuses only well-formed results)."""
    problems = result_problems(result)
    if problems:
        result["status"] = "failed"
        result["error"] = {"type": "InvalidResult", "message": cap_text("the run finished but its result does not "
                                                                       f"match the schema: {'; '.join(problems)}",
                                                                       MESSAGE_LIMIT),
                           "memory_at_failure": None}


def assemble_training(result: dict[str, Any], outcome: Any, networks: dict[str, Any],
                      summary: dict[str, Any]) -> None:
    """Memory, phases, throughput, curves, metrics and settings of the training."""
    result["memory"] = {**summary["memory"], "networks": networks}
    result["phases"] = summary["phases"]
    result["throughput"] = throughput(outcome, summary.get("timing") or {}, summary)
    result["curves"] = outcome.log_history
    result["metrics"] = dict(outcome.metrics)
    result["settings"] = dict(outcome.settings)


def assemble_evaluation(result: dict[str, Any], run_dir: Path, evaluation: dict[str, Any], n_questions: int,
                        warm_start_dir: Path | None) -> None:
    """Accuracy after (and before, from the warm start's result) under every mode, format and truncation rates,
    the prompt style, samples, and every completion with its verdicts (EVAL_FILE)."""
    accuracy = result["accuracy"]
    accuracy["n_questions"] = n_questions
    accuracy["after"] = evaluation["scores"]
    accuracy["prompt_style"] = evaluation.get("prompt_style", "tags")
    result["samples"] = evaluation["samples"]
    result["metrics"]["eval_mean_length_tokens"] = evaluation["mean_length_tokens"]
    result["generation"] = evaluation.get("generation")  # the decoding settings the evaluation used
    write_jsonl(run_dir / EVAL_FILE, evaluation["records"])
    result["eval_file"] = EVAL_FILE
    # The reward-hacking and 'aha' monitors of the final evaluation, the same definitions as the training curves.
    from bench.telemetry.monitors import record_monitors

    result["monitors"] = {"eval": record_monitors(evaluation["records"])}
    before = read_result(warm_start_dir) if warm_start_dir else None
    before_accuracy = (before or {}).get("accuracy") or {}
    if before is not None:
        accuracy["before"] = before_accuracy.get("after")
    result["evaluation"] = evaluation_record(evaluation.get("precision"), before)
    for rate in ("format_rate", "truncated_rate"):
        # The warm start's own rate "after" is every method's "before" (None for the warm start itself).
        accuracy[rate] = {"before": (before_accuracy.get(rate) or {}).get("after"), "after": evaluation[rate]}


def evaluation_record(precision: dict[str, str] | None, before: dict[str, Any] | None) -> dict[str, Any]:
    """``result["evaluation"]``: {'precision': how this run's policy was scored ({'storage', 'compute'}, and
    'cpu_threads' on a CPU),
    'before_precision': how the warm start's (the 'before' score's) was (None: no warm start read, or a result
    from before the record existed), 'same_numerics': whether the two were computed alike (None when unknown)}.

    A 'before' and 'after' in different numerics would carry a precision shift into every gain: the report can say
    so instead of reading it as learning."""
    before_precision = ((before or {}).get("evaluation") or {}).get("precision")
    same = None
    if precision and before_precision:
        # The CPU thread count too: it orders a matmul's sums (evaluation_threads); absent on a GPU, equal then.
        same = all(precision.get(key) == before_precision.get(key) for key in ("compute", "cpu_threads"))
    return {"precision": precision, "before_precision": before_precision, "same_numerics": same}
