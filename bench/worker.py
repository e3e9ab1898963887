"""One run in its own process: ``python -m bench.worker RUN_DIR``.

Reads RUN_DIR/run.json (written by the runner), trains with the recipe, evaluates, and writes
RUN_DIR/result.json atomically. A crash, OOM or kill here never takes the suite or another method down:
whatever happens, a result with status ``ok`` or ``failed`` (with the reason) is written.
Progress goes to stdout as ``@@progress {json}`` lines that the runner turns into a progress display.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.results import empty_result, read_result, write_json_atomic

PROGRESS_PREFIX = "@@progress "
RUN_FILE = "run.json"
EVAL_FILE = "eval_after.jsonl"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def emit_progress(step: int, total: int, metrics: dict[str, float]) -> None:
    """One machine-readable progress line for the runner."""
    shown = {k: round(v, 4) for k, v in metrics.items() if k in ("reward", "loss", "kl", "accuracy", "score")}
    print(PROGRESS_PREFIX + json.dumps({"step": step, "total": total, "metrics": shown}), flush=True)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def throughput(outcome: Any, train_s: float, telemetry_summary: dict[str, Any]) -> dict[str, Any]:
    """Rates per second of training time; None where nothing was generated or trained. (wall_s is added by run.)"""
    def rate(count: int | None) -> float | None:
        return count / train_s if count and train_s > 0 else None

    return {
        "train_s": train_s,
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


def run(run_dir: Path) -> int:
    """Execute the run described in RUN_DIR/run.json; returns the process exit status (0 ok, 1 failed)."""
    wall_start = time.perf_counter()
    job = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    result = empty_result(job["run_id"], job["kind"], job["name"], job["label"], job["engine"], job["seed"])
    result["started_at"] = now()
    result["spec"] = job["spec"]
    live: dict[str, Any] = {}  # the telemetry, once built: its readings describe a failure too
    try:
        result = _train_and_evaluate(job, run_dir, result, live)
        result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the run must always leave a result behind
        result["status"] = "failed"
        result["error"] = {
            "type": type(exc).__name__,
            "message": str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__,
            "memory_at_failure": _memory_at_failure(live.get("telemetry")),
        }
        (run_dir / "traceback.txt").write_text(traceback.format_exc(), encoding="utf-8")
        if isinstance(exc, KeyboardInterrupt):
            result["error"]["message"] = "interrupted"
    result["finished_at"] = now()
    result["throughput"]["wall_s"] = time.perf_counter() - wall_start
    write_json_atomic(run_dir / "result.json", result)
    return 0 if result["status"] == "ok" else 1


def _memory_at_failure(telemetry: Any) -> str | None:
    if telemetry is None:
        return None
    try:
        memory = telemetry.summary()["memory"]
    except Exception:  # noqa: BLE001 - best effort while reporting another failure
        return None
    if memory.get("peak_bytes") is None:
        return None
    return f"{memory['peak_bytes'] / 2**30:.2f} GiB peak ({memory['source']})"


def _train_and_evaluate(job: dict[str, Any], run_dir: Path, result: dict[str, Any],
                        live: dict[str, Any]) -> dict[str, Any]:
    # Heavy imports happen here, inside the worker process only.
    import torch
    from transformers import set_seed

    from bench.context import RunContext
    from bench.data import matched_rows
    from bench.evaluation import evaluate
    from bench.models import initial_model_source, load_tokenizer, resolve_device
    from bench.registry import lookup
    from bench.spec import MethodSpec, load_spec_dict
    from bench.telemetry import Telemetry, account_networks, capture_environment

    spec = load_spec_dict(job["spec"])
    # Stages run alone, so they take every core; method runs take spec.threads (see Spec.threads).
    threads = spec.threads if job["kind"] == "method" or spec.parallel_runs == 1 else 0
    if threads:
        torch.set_num_threads(threads)
    seed = job["seed"]
    set_seed(seed)
    device = resolve_device(spec)
    inputs = {k: Path(v) if v else None for k, v in job.get("inputs", {}).items()}
    result["environment"] = capture_environment(Path(job.get("repo_dir") or "."))

    if inputs.get("init_model_dir"):
        tokenizer = load_tokenizer(inputs["init_model_dir"])
    else:  # the warm start itself: the tokenizer of the initial model renders the prompts
        from bench.data import tokenizer_corpus

        tokenizer = load_tokenizer(initial_model_source(spec, tokenizer_corpus(spec) if spec.model.source == "tiny" else []))
    train_rows, test_rows = matched_rows(spec, tokenizer, seed)

    tel = spec.telemetry
    telemetry = Telemetry(device, interval_s=tel.sample_interval_ms / 1000.0, enabled=tel.enabled,
                          warmup_steps=tel.warmup_steps)
    live["telemetry"] = telemetry
    info = lookup(job["name"])
    recipe = info.load()
    with telemetry:
        ctx = RunContext(
            spec=spec, method=job["name"], method_spec=spec.methods.get(job["name"], MethodSpec()),
            seed=seed, run_dir=run_dir, device=device, init_model_dir=inputs.get("init_model_dir"),
            train_rows=train_rows, telemetry=telemetry, progress=emit_progress, pool_path=inputs.get("pool_path"),
            reward_model_dir=inputs.get("reward_model_dir"),
        )
        telemetry.mark_baseline()
        train_start = time.perf_counter()
        outcome = recipe.train(ctx)
        train_s = time.perf_counter() - train_start
        networks = account_networks(outcome.networks, outcome.optimizers)
        evaluation = None
        if job["name"] == "warm_start" or job["kind"] == "method":
            with telemetry.phase("evaluation"):
                evaluation = evaluate(outcome.policy, outcome.tokenizer, test_rows, spec.eval.max_new_tokens,
                                      spec.eval.batch_size, spec.eval.samples_in_report)
    summary = telemetry.summary()
    counters = getattr(telemetry, "counters", {}) or {}
    # TRL recipes are counted from outside (bench.telemetry.trl_hooks); the suite engine counts itself.
    if not outcome.completions and counters.get("completions"):
        outcome.completions = int(counters["completions"])
        outcome.generated_tokens = int(counters.get("generated_tokens", 0))
    if outcome.trained_tokens is None and counters.get("trained_tokens"):
        outcome.trained_tokens = int(counters["trained_tokens"])

    result["memory"] = {**summary["memory"], "networks": networks}
    result["phases"] = summary["phases"]
    result["throughput"] = throughput(outcome, train_s, summary)
    result["curves"] = outcome.log_history
    result["metrics"] = dict(outcome.metrics)
    result["settings"] = dict(outcome.settings)
    if evaluation is not None:
        result["accuracy"]["n_questions"] = len(test_rows)
        result["accuracy"]["after"] = evaluation["scores"]
        result["samples"] = evaluation["samples"]
        result["metrics"]["eval_mean_length_tokens"] = evaluation["mean_length_tokens"]
        write_jsonl(run_dir / EVAL_FILE, evaluation["verdicts"])
        result["eval_file"] = EVAL_FILE
        before = read_result(inputs["warm_start_dir"]) if inputs.get("warm_start_dir") else None
        if before is not None:
            result["accuracy"]["before"] = before["accuracy"]["after"]
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.worker RUN_DIR", file=sys.stderr)
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
