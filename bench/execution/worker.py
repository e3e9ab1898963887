"""One run in its own process: ``python -m bench.execution.worker RUN_DIR``.

Reads RUN_DIR/run.json (written by the runner), trains with the recipe, evaluates, and writes
RUN_DIR/result.json atomically. A crash, OOM or kill here never takes the suite or another method down:
whatever happens, a result with status ``ok`` or ``failed`` (with the reason) is written.
Progress goes to stdout as ``@@progress {json}`` lines that the runner turns into a progress display.

This module is a run from start to end, read top to bottom in ``_train_and_evaluate``: set-up resolved once into
the run context, the recipe, the evaluation and the result. Each other job has its own module:

- ``worker_signals``: how a worker stops (SIGTERM, its parent's death) and never outlives its suite;
- ``cpu_threads``: torch's CPU threads for the run and for every evaluation;
- ``run_evaluation``: which runs are evaluated, and the greedy evaluation of the trained policy;
- ``run_failure``: the record of a failed run (type, message, memory, phase);
- ``run_result``: the result of a finished one (training, evaluation, the schema check).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.config import launcher
from bench.execution.cpu_threads import configure_threads, evaluation_threads
from bench.execution.run_evaluation import evaluate_policy, evaluates, source_start_scores
from bench.execution.run_failure import failure_phase, failure_record
from bench.execution.run_result import assemble_evaluation, assemble_training, check_own_result
from bench.execution.worker_signals import disarm, install_stop_handlers
from bench.results import empty_result, write_json_atomic
from bench.telemetry.trackers import finish_trackers, open_trackers

PROGRESS_PREFIX = "@@progress "
PHASE_PREFIX = "@@phase "
"""A line naming the phase the worker just entered: the runner keeps the last one, so that a worker killed from
outside (the Linux OOM killer sends SIGKILL, which leaves no result) is recorded with the phase it was in."""
RUN_FILE = "run.json"
PARENT_ENV = "BENCH_PARENT_PID"
"""The runner's PID, set in each worker's environment: the parent the worker must not outlive."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def emit_progress(step: int, total: int, metrics: dict[str, float]) -> None:
    """One machine-readable progress line for the runner."""
    shown = {k: round(v, 4) for k, v in metrics.items() if k in ("reward", "loss", "kl", "accuracy", "score")}
    try:
        print(PROGRESS_PREFIX + json.dumps({"step": step, "total": total, "metrics": shown}), flush=True)
    except OSError:  # the runner is gone (broken pipe): the parent-death signal, not this, ends the run
        pass


def announce_phases(telemetry: Any) -> None:
    """Print a PHASE_PREFIX line whenever a different phase opens (re-opening the same one prints nothing)."""
    original = telemetry.begin_phase
    last: list[str | None] = [None]

    def begin_phase(name: str) -> None:
        if name != last[0]:
            last[0] = name
            try:
                print(PHASE_PREFIX + name, flush=True)
            except OSError:  # the runner is gone: the parent-death signal ends the run
                pass
        original(name)

    telemetry.begin_phase = begin_phase


def run(run_dir: Path) -> int:
    """Execute the run described in RUN_DIR/run.json; returns the process exit status (0 ok, 1 failed)."""
    wall_start = time.perf_counter()
    job = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    result = empty_result(job["run_id"], job["kind"], job["name"], job["label"], job["engine"], job["seed"])
    result["started_at"] = now()
    result["spec"] = job["spec"]
    result["inputs_hash"] = job.get("inputs_hash")  # the stage outputs this run reads (see bench.execution.runner)
    live: dict[str, Any] = {}  # the telemetry, once built: its readings describe a failure too
    from bench.execution import launch

    try:
        result = _train_and_evaluate(job, run_dir, result, live)
        result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the run must always leave a result behind
        disarm()  # a later SIGTERM must not stop the failure from being written
        result["status"] = "failed"
        result["error"] = failure_record(exc, live.get("telemetry"), live.get("failure_phase"))
        name = "traceback.txt" if launch.is_main() else f"traceback_rank{launch.rank()}.txt"
        (run_dir / name).write_text(traceback.format_exc(), encoding="utf-8")
    disarm()  # from here on the result is written whatever arrives
    result["finished_at"] = now()
    result["throughput"]["wall_s"] = time.perf_counter() - wall_start
    finish_trackers(live.get("trackers"), result)  # the curves its log points missed, the final numbers; never raises
    if launch.launched():  # every rank: its own record; rank 0 alone writes the result (the runner merges them)
        launch.write_rank_file(run_dir, result, getattr(live.get("telemetry"), "prompt_ids", []))
        launch.finish()
        if not launch.is_main():
            return 0 if result["status"] == "ok" else 1
    if result["status"] == "ok":
        check_own_result(result)
    write_json_atomic(run_dir / "result.json", result)
    return 0 if result["status"] == "ok" else 1


def _train_and_evaluate(job: dict[str, Any], run_dir: Path, result: dict[str, Any],
                        live: dict[str, Any]) -> dict[str, Any]:
    """The run's body: set up, train, account, evaluate, and fill ``result`` (each step is one function)."""
    # Heavy imports happen inside these functions, in the worker process only.
    from bench.config.loading import load_spec_dict
    from bench.model.loading import resolve_device
    from bench.task.data import matched_data
    from bench.telemetry import account_networks, capture_environment
    from bench.telemetry.trl_hooks import seam_record

    from bench.execution import launch

    spec = load_spec_dict(job["spec"])
    threads = configure_threads(spec, job["kind"], job.get("parallel_runs"))
    device = resolve_device(spec)
    if launch.launched():  # join the ranks before any model is placed (each rank on its own GPU)
        launch.init_process_group(device)
    from transformers import set_seed

    set_seed(job["seed"])  # python, numpy and torch, before anything random happens
    inputs = job_inputs(job)
    result["environment"] = capture_environment(Path(job.get("repo_dir") or "."))
    result["environment"]["torch_threads"] = threads  # what configure_threads set (spec.threads, or cores / runs)
    if launch.launched():
        result["environment"]["launcher"] = launch.launcher_environment(spec)
    model_source, tokenizer = resolve_model(spec, inputs)
    train_rows, test_rows, checks = matched_data(spec, tokenizer, job["seed"])  # prompts in the seed's matched order
    result["data_checks"] = checks  # the held-out split's overlap checks (0 expected), recorded for every run
    telemetry = build_telemetry(spec, job["kind"], device)
    live["telemetry"] = telemetry  # its readings describe a failure too
    announce_phases(telemetry)  # the runner records the last phase of a worker killed from outside
    if launch.is_main():  # live curves (telemetry.report_to), from rank 0 alone
        telemetry.trackers = live["trackers"] = open_trackers(spec, job, run_dir)
    if job.get("sweep"):  # a sweep point: its prediction (before training, so a failure keeps it), the OOM hook
        from bench.execution.sweep import prepare_point

        prepare_point(job, spec, result, telemetry, tokenizer, train_rows)
    with telemetry, failure_phase(telemetry, live):
        ctx = build_context(job, spec, run_dir, inputs, train_rows, telemetry, device, model_source, tokenizer)
        outcome = train_recipe(job["name"], ctx, telemetry)
        networks = account_networks(outcome.networks, outcome.optimizers)
        # eval.enabled false (systems runs on random weights): no accuracy, so result["accuracy"] stays empty.
        evaluated = evaluates(job) and spec.eval.enabled and launch.is_main()  # rank 0 alone evaluates
        eval_threads = evaluation_threads(spec, job.get("parallel_runs"))
        evaluation = evaluate_policy(spec, outcome, test_rows, telemetry, eval_threads) if evaluated else None
        # A start that is a rounded copy of the source weights: the source's own accuracy beside it.
        source_scores = (source_start_scores(spec, outcome, test_rows, telemetry, device, eval_threads)
                         if evaluated and job["name"] == "warm_start" else None)
    summary = telemetry.summary()
    count_from_telemetry(outcome, summary.get("counters") or {})
    assemble_training(result, outcome, networks, summary)
    if job["kind"] == "method" and launcher.active(spec):  # the layout, for the report's "what differs"
        result["settings"]["parallel"] = launch.parallel_settings(spec, job["name"])
    seams = seam_record(telemetry)  # TRL runs: which seams fed which phase (None for the suite's engine)
    if seams is not None:
        result["seams"] = seams
    if job["kind"] == "method":
        assess_learning(result, spec, job["name"], outcome, telemetry.training_change())
    if evaluation is not None:
        assemble_evaluation(result, run_dir, evaluation, len(test_rows), inputs.get("warm_start_dir"))
        if source_scores is not None:
            result["accuracy"]["source_weights"] = source_scores
    return result


# -- set-up ---------------------------------------------------------------------------------------
def job_inputs(job: dict[str, Any]) -> dict[str, Path | None]:
    """The folders and files earlier stages wrote for this run (see bench.execution.runner.run_inputs)."""
    return {k: Path(v) if v else None for k, v in job.get("inputs", {}).items()}


def resolve_model(spec: Any, inputs: dict[str, Path | None]) -> tuple[str | Path, Any]:
    """(model source, tokenizer), resolved once for the whole run (with the device: the context's inputs).

    The model source is the starting checkpoint a method reads, or for the warm start itself the initial model
    (the tiny model and its tokenizer are built here, from the task's tokenizer corpus); the tokenizer is that
    source's, left-padded.
    """
    from bench.model.loading import initial_model_source, load_tokenizer
    from bench.task.data import tokenizer_corpus

    source: str | Path
    if inputs.get("init_model_dir"):
        source = inputs["init_model_dir"]
    else:
        source = initial_model_source(spec, tokenizer_corpus(spec) if spec.model.source == "tiny" else [])
    return source, load_tokenizer(source)


def build_telemetry(spec: Any, kind: str, device: str) -> Any:
    """The run's Telemetry; method runs also snapshot their trainable weights (evidence training moved them)."""
    from bench.telemetry import Telemetry

    tel = spec.telemetry
    return Telemetry(device, interval_s=tel.sample_interval_ms / 1000.0, enabled=tel.enabled,
                     warmup_steps=tel.warmup_steps, track_training_change=kind == "method")


def build_context(job: dict[str, Any], spec: Any, run_dir: Path, inputs: dict[str, Path | None],
                  train_rows: list[dict[str, str]], telemetry: Any, device: str, model_source: str | Path,
                  tokenizer: Any) -> Any:
    """The RunContext the recipe trains from: everything resolved once, here."""
    from bench.execution.context import RunContext
    from bench.execution.launch import is_main

    return RunContext(
        spec=spec, method=job["name"], method_spec=spec.methods.get(job["name"]),
        seed=job["seed"], run_dir=run_dir, device=device, init_model_dir=inputs.get("init_model_dir"),
        train_rows=train_rows, telemetry=telemetry, pool_path=inputs.get("pool_path"),
        progress=emit_progress if is_main() else _no_progress,  # one progress line per step, from rank 0
        reward_model_dir=inputs.get("reward_model_dir"), tokenizer=tokenizer, model_source=model_source,
    )


def _no_progress(step: int, total: int, metrics: dict[str, float]) -> None:
    """Progress of a rank other than 0: rank 0 reports the step for every rank."""


# -- training ---------------------------------------------------------------------------------------
def train_recipe(name: str, ctx: Any, telemetry: Any) -> Any:
    """Run the recipe, marking its start and end for the setup / training split.

    The baseline read here is a fallback, taken before the recipe loads its models; the telemetry
    callback replaces it at ``on_train_begin`` (models loaded), which is what ``baseline_bytes`` means.
    """
    from bench.config.registry import lookup
    from bench.telemetry.tracker import BASELINE_BEFORE_LOAD

    recipe = lookup(name).load()
    telemetry.mark_baseline(BASELINE_BEFORE_LOAD)
    telemetry.mark_recipe_start()
    try:
        return recipe.train(ctx)
    finally:
        telemetry.mark_recipe_end()


def count_from_telemetry(outcome: Any, counters: dict[str, Any]) -> None:
    """Fill the outcome's counts from the telemetry's counters where the recipe left them empty.

    TRL recipes are counted from outside (bench.telemetry.trl_hooks); the suite engine counts itself.
    """
    if not outcome.completions and counters.get("completions"):
        outcome.completions = int(counters["completions"])
        outcome.generated_tokens = int(counters.get("generated_tokens", 0))
    if outcome.trained_tokens is None and counters.get("trained_tokens"):
        outcome.trained_tokens = int(counters["trained_tokens"])


def assess_learning(result: dict[str, Any], spec: Any, method: str, outcome: Any, change: dict[str, Any]) -> None:
    """result["learning_signal"] (did the reward ever tell completions apart?) and result["training_change"] (the
    weight comparison with its weight-decay floor and verdict; bench.telemetry.param_change)."""
    from bench.telemetry.param_change import assess_training_change, learning_signal

    signal = learning_signal(outcome.log_history, outcome.metrics)
    result["learning_signal"] = signal
    method_spec = spec.methods.get(method)
    rate = method_spec.resolved_learning_rate(spec) if method_spec is not None else spec.train.learning_rate
    result["training_change"] = assess_training_change(change, signal, rate, spec.train.weight_decay, outcome.steps)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.execution.worker RUN_DIR", file=sys.stderr)
        return 2
    parent = os.environ.get(PARENT_ENV, "")
    runner = int(parent) if parent.isdigit() else None
    from bench.execution.launch import launched

    if launched():  # a rank: its parent is accelerate's launcher, which the runner stops; the runner is watched too
        install_stop_handlers(os.getppid(), runner)
    else:
        install_stop_handlers(runner)
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
