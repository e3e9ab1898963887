"""One run in its own process: ``python -m bench.execution.worker RUN_DIR``.

Reads RUN_DIR/run.json (written by the runner), trains with the recipe, evaluates, and writes
RUN_DIR/result.json atomically. A crash, OOM or kill here never takes the suite or another method down:
whatever happens, a result with status ``ok`` or ``failed`` (with the reason) is written.
Progress goes to stdout as ``@@progress {json}`` lines that the runner turns into a progress display.

A worker never outlives its suite: SIGTERM (what the runner sends its process group on an interrupt) records the
run as ``Interrupted`` and exits, and so does SIGHUP, which a worker gets when its parent dies (Linux parent-death
signal, and a thread that polls the parent PID on every platform).

One job, one file (about 650 lines): a run from start to end — set-up resolved once into the run context, the
recipe, the evaluation, the failure record and the result — read top to bottom in ``_train_and_evaluate``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from bench.config import launcher
from bench.results import MESSAGE_LIMIT, cap_text, empty_result, read_result, result_problems, write_json_atomic

PROGRESS_PREFIX = "@@progress "
PHASE_PREFIX = "@@phase "
"""A line naming the phase the worker just entered: the runner keeps the last one, so that a worker killed from
outside (the Linux OOM killer sends SIGKILL, which leaves no result) is recorded with the phase it was in."""
RUN_FILE = "run.json"
EVAL_FILE = "completions.jsonl"
"""Every evaluation completion with its verdicts, one JSON line per test question (bench.scoring.evaluation.completion_record)."""
PARENT_ENV = "BENCH_PARENT_PID"
"""The runner's PID, set in each worker's environment: the parent the worker must not outlive."""
OUT_OF_MEMORY = "OutOfMemory"
"""error.type of a run that ran out of memory (CUDA, or MemoryError / the allocator's error on a CPU); the error
also names the exception and the phase it happened in (bench.execution.runner treats it as expected at a sweep point)."""
ORPHAN_GRACE_S = 60.0
"""After its parent died, a worker that has not finished recording the interruption by then exits hard."""


class Interrupted(BaseException):
    """Raised in the worker's main thread by SIGTERM (the suite was stopped) or PARENT_DIED (the suite process
    died); its text is the signal's name.

    A BaseException, so that the ``except Exception`` of libraries does not swallow it on its way to :func:`run`.
    """


_interrupts: dict[str, Any] = {"armed": False, "received": False, "parent": None}
"""armed: a stop signal raises :class:`Interrupted` (cleared while the result is written); received: one did;
parent: the runner's PID, when known."""


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


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def throughput(outcome: Any, timing: dict[str, Any], telemetry_summary: dict[str, Any]) -> dict[str, Any]:
    """Counts and rates per second of training time (``timing["train_s"]``); None where nothing was
    generated or trained. ``setup_s`` (model loading, trainer construction) is kept apart so that it
    does not dilute the rates; ``timing`` names the window ``train_s`` covers. (wall_s is added by run.)"""
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
        _interrupts["armed"] = False  # a later SIGTERM must not stop the failure from being written
        result["status"] = "failed"
        result["error"] = failure_record(exc, live.get("telemetry"), live.get("failure_phase"))
        name = "traceback.txt" if launch.is_main() else f"traceback_rank{launch.rank()}.txt"
        (run_dir / name).write_text(traceback.format_exc(), encoding="utf-8")
    _interrupts["armed"] = False  # from here on the result is written whatever arrives
    result["finished_at"] = now()
    result["throughput"]["wall_s"] = time.perf_counter() - wall_start
    if launch.launched():  # every rank: its own record; rank 0 alone writes the result (the runner merges them)
        launch.write_rank_file(run_dir, result, getattr(live.get("telemetry"), "prompt_ids", []))
        launch.finish()
        if not launch.is_main():
            return 0 if result["status"] == "ok" else 1
    if result["status"] == "ok":
        check_own_result(result)
    write_json_atomic(run_dir / "result.json", result)
    return 0 if result["status"] == "ok" else 1


def failure_record(exc: BaseException, telemetry: Any, phase: str | None = None) -> dict[str, Any]:
    """result["error"] for ``exc``: its type (``Interrupted`` for a stop request, OUT_OF_MEMORY for any
    out-of-memory error, whose class goes to ``exception``), a one-line, capped message, the memory reading and
    the phase the run was in (:func:`failure_phase`; None when unknown)."""
    interrupted = isinstance(exc, (Interrupted, KeyboardInterrupt))
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if interrupted:
        text = interruption_message(exc)
    kind = "Interrupted" if interrupted else OUT_OF_MEMORY if is_out_of_memory(exc) else type(exc).__name__
    record = {
        "type": kind,
        "message": cap_text(text or type(exc).__name__, MESSAGE_LIMIT),
        "memory_at_failure": _memory_at_failure(telemetry),
        "phase": phase,
    }
    if kind == OUT_OF_MEMORY:
        record["exception"] = type(exc).__name__
    return record


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (any class named OutOfMemoryError), MemoryError, or the RuntimeError that the
    CUDA runtime and torch's CPU allocator raise when an allocation fails."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@contextlib.contextmanager
def failure_phase(telemetry: Any, live: dict[str, Any]) -> Iterator[None]:
    """On an exception, record in ``live["failure_phase"]`` where the run was: the innermost phase open when it was
    raised, else 'setup' before training started (models loading), else 'other'.

    A ``with telemetry.phase(...)`` block closes its phase while the exception passes through it, so the phase is
    noted as it closes (the innermost first, with the exception in flight); a phase still open when the exception
    arrives here (one closed by no ``with``) is read directly. Entered inside ``with telemetry``.
    """
    seen: dict[str, Any] = {}
    original = telemetry.end_phase

    def end_phase(name: str) -> None:
        exc = sys.exc_info()[1]
        if exc is not None and seen.get("exc") is not exc:
            active = telemetry.active_phases()
            seen.update(exc=exc, phase=active[-1] if active else name)
        original(name)

    telemetry.end_phase = end_phase
    try:
        yield
    except BaseException as exc:
        try:
            live["failure_phase"] = _phase_of(exc, seen, telemetry)
        except Exception:  # noqa: BLE001 - best effort while another failure is on its way out
            pass
        raise
    finally:
        telemetry.end_phase = original


def _phase_of(exc: BaseException, seen: dict[str, Any], telemetry: Any) -> str:
    """The phase noted for ``exc`` (or for an exception it was raised from), else the open one, else setup/other."""
    link: BaseException | None = exc
    while link is not None:
        if seen.get("exc") is link:
            return seen["phase"]
        link = link.__cause__ or link.__context__
    active = telemetry.active_phases()
    if active:
        return active[-1]
    return "other" if (telemetry.timing() or {}).get("setup_s") is not None else "setup"


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


# -- stopping ---------------------------------------------------------------------------------------
PARENT_DIED = getattr(signal, "SIGHUP", signal.SIGTERM)
"""The signal a worker gets when its runner dies (the kernel's parent-death signal, or its own watch thread):
handled like SIGTERM, but it says what happened, so the result can tell a dead suite from a stopped one."""


def install_stop_handlers(parent_pid: int | None, runner_pid: int | None = None) -> None:
    """SIGTERM records the run as interrupted; the death of ``parent_pid`` (the runner) delivers PARENT_DIED,
    which does the same with its own message.

    Two ways to notice the parent died, because either alone can miss: Linux's parent-death signal is exact but
    fires when the *thread* that started the worker ends (the runner's threads live until their runs end), and
    polling ``os.getppid()`` once a second works everywhere.

    A rank started by a launcher (bench.execution.launch) passes the launcher as ``parent_pid`` (the runner stops it) and
    the runner as ``runner_pid``, whose death the same thread notices.
    """
    _interrupts["armed"], _interrupts["parent"] = True, runner_pid or parent_pid
    signal.signal(signal.SIGTERM, _on_stop_signal)
    signal.signal(PARENT_DIED, _on_stop_signal)
    if parent_pid is None:
        return
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the signal was set up: nothing to run for
        raise SystemExit(f"bench.execution.worker: the suite process (PID {parent_pid}) is gone; not starting the run")
    threading.Thread(target=_watch_parent, args=(parent_pid, runner_pid), name="parent-watch", daemon=True).start()


def _on_stop_signal(signum: int, frame: Any) -> None:
    """The first stop signal while training raises :class:`Interrupted`; later ones (or one while the result is
    being written) are ignored: the worker is already on its way out."""
    if _interrupts["armed"] and not _interrupts["received"]:
        _interrupts["received"] = True
        raise Interrupted(signal.Signals(signum).name)


def interruption_message(exc: BaseException) -> str:
    """Why the run stopped: the runner died (PARENT_DIED), or the suite was interrupted (SIGTERM from the runner)."""
    if isinstance(exc, Interrupted) and str(exc) == PARENT_DIED.name:
        return (f"the suite process (PID {_interrupts['parent']}) died during this run and the worker stopped "
                f"itself; `bench run ... --resume` re-runs it")
    received = f" (the worker received {exc})" if isinstance(exc, Interrupted) and str(exc) else ""
    return f"the suite was interrupted during this run{received}; `bench run ... --resume` re-runs it"


def _set_parent_death_signal() -> None:
    """prctl(PR_SET_PDEATHSIG, PARENT_DIED) on Linux; elsewhere nothing (the polling thread covers it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(PARENT_DIED), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch_parent(parent_pid: int, runner_pid: int | None = None) -> None:
    """Once a second: if the runner is gone (this process was re-parented, or for a rank: the launcher or the
    runner is gone), stop like on an interrupt; if that has not ended the process within ORPHAN_GRACE_S (stuck in
    native code), exit hard."""
    while os.getppid() == parent_pid and (runner_pid is None or _alive(runner_pid)):
        time.sleep(1.0)
    os.kill(os.getpid(), PARENT_DIED)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(143)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (killed, not yet reaped by its parent) has stopped."""
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: gone
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    """The run's body: set up, train, account, evaluate, and fill ``result`` (each step is one function)."""
    # Heavy imports happen inside these functions, in the worker process only.
    from bench.config.loading import load_spec_dict
    from bench.model.loading import resolve_device
    from bench.telemetry import account_networks, capture_environment
    from bench.telemetry.trl_hooks import seam_record

    from bench.execution import launch

    spec = load_spec_dict(job["spec"])
    threads = configure_threads(spec, job["kind"], job.get("parallel_runs"))
    device = resolve_device(spec)
    if launch.launched():  # join the ranks before any model is placed (each rank on its own GPU)
        launch.init_process_group(device)
    seed_everything(job["seed"])
    inputs = job_inputs(job)
    result["environment"] = capture_environment(Path(job.get("repo_dir") or "."))
    result["environment"]["torch_threads"] = threads  # what configure_threads set (spec.threads, or cores / runs)
    if launch.launched():
        result["environment"]["launcher"] = launch.launcher_environment(spec)
    model_source, tokenizer = resolve_model(spec, inputs)
    train_rows, test_rows, checks = load_rows(spec, tokenizer, job["seed"])
    result["data_checks"] = checks  # the held-out split's overlap checks (0 expected), recorded for every run
    telemetry = build_telemetry(spec, job["kind"], device)
    live["telemetry"] = telemetry  # its readings describe a failure too
    announce_phases(telemetry)  # the runner records the last phase of a worker killed from outside
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
    return result


# -- set-up ---------------------------------------------------------------------------------------
def configure_threads(spec: Any, kind: str, concurrent: Any = None) -> int:
    """Set torch's CPU threads for this run (:func:`worker_threads`) and return the number set.

    ``concurrent``: how many runs share the machine, as the runner resolved ``parallel_runs`` (an int; ``auto``
    or None: ``spec.parallel_runs`` when it is a number, else 1)."""
    import torch

    threads = worker_threads(spec.threads, concurrent_runs(spec, concurrent), kind, available_cores())
    torch.set_num_threads(threads)
    return threads


def evaluation_threads(spec: Any, concurrent: Any = None) -> int:
    """torch CPU threads of every evaluation, a stage's included: a method run's (:func:`worker_threads` of kind
    'method'), so the start and every method are scored at the same thread count.

    Why: a CPU matmul splits its work by the thread count, and the split changes the order of its sums; a real
    model's greedy completion can turn on that last bit (SmolLM2-135M under bf16 autocast: 1 of 4 questions
    differed between 1 and 2 threads), so a start scored by a stage at every core and a control arm at its share
    would differ with no weight changed. On a GPU the count does not enter (the record carries it on a CPU only)."""
    return worker_threads(spec.threads, concurrent_runs(spec, concurrent), "method", available_cores())


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """A region in which torch uses ``threads`` CPU threads; the count before it is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def concurrent_runs(spec: Any, concurrent: Any = None) -> int:
    """The resolved number of method runs at a time: ``concurrent`` when the runner gave one, else
    ``spec.parallel_runs`` when it is a number (``auto`` unresolved: 1)."""
    for value in (concurrent, spec.parallel_runs):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return 1


def worker_threads(threads: int, parallel_runs: int, kind: str, cores: int) -> int:
    """torch CPU threads of one worker: ``threads`` when set (> 0; with ``parallel_runs`` > 1 for method runs
    only), else cores / parallel_runs for a method run (at least 1) and every core for a stage (stages run alone).

    Why not torch's default (every core per process): two runs side by side with every core each oversubscribe
    the machine (a real model's evaluation of 12 questions took 301 s that way, 28-70 s at 1 thread)."""
    if kind == "method":
        return threads if threads > 0 else max(1, cores // max(1, parallel_runs))
    return threads if threads > 0 and parallel_runs == 1 else cores


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else os.cpu_count())."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (transformers.set_seed) before anything random happens."""
    from transformers import set_seed

    set_seed(seed)


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


def load_rows(spec: Any, tokenizer: Any, seed: int
              ) -> tuple[list[dict[str, str]], list[dict[str, str]], dict[str, int | str]]:
    """(train_rows, test_rows, checks): rendered prompts in the matched order of ``seed``, and what was checked
    about the test split being held out (``bench.task.data.TaskData.checks``: ``*_overlap`` counts, 0 expected)."""
    from bench.task.data import matched_data

    return matched_data(spec, tokenizer, seed)


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

    return RunContext(
        spec=spec, method=job["name"], method_spec=spec.methods.get(job["name"]),
        seed=job["seed"], run_dir=run_dir, device=device, init_model_dir=inputs.get("init_model_dir"),
        train_rows=train_rows, telemetry=telemetry, pool_path=inputs.get("pool_path"),
        progress=emit_progress if is_main_rank() else _no_progress,  # one progress line per step, from rank 0
        reward_model_dir=inputs.get("reward_model_dir"), tokenizer=tokenizer, model_source=model_source,
    )


def is_main_rank() -> bool:
    """Rank 0, or a run without a launcher (bench.execution.launch)."""
    from bench.execution.launch import is_main

    return is_main()


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


# -- evaluation -----------------------------------------------------------------------------------
def evaluates(job: dict[str, Any]) -> bool:
    """Method runs and the warm start are evaluated (the warm start's score is every method's 'before')."""
    return job["name"] == "warm_start" or job["kind"] == "method"


def evaluate_policy(spec: Any, outcome: Any, test_rows: list[dict[str, str]], telemetry: Any,
                    threads: int | None = None) -> dict[str, Any]:
    """Greedy evaluation of the trained policy on the held-out rows, timed as phase 'evaluation'.

    The questions are asked in ``spec.eval.prompt_style`` (bench.task.prompts; training used the tags prompt); the
    returned dict is bench.scoring.evaluation.evaluate's plus 'prompt_style' and 'precision'. Every policy — the
    warm start's checkpoint, every method, every seed — is scored in the one evaluation numerics
    (bench.model.numerics.actor_numerics: bf16 autocast with a float32 residual stream under a bfloat16 spec, float32
    otherwise), recorded as 'precision' (bench.model.numerics.evaluation_precision); on a CPU also at one thread
    count (``threads``: :func:`evaluation_threads`; None: torch's current), recorded as precision['cpu_threads'].
    """
    import torch

    from bench.scoring.evaluation import evaluate
    from bench.model.generation import eos_token_ids, sampling_settings
    from bench.model.numerics import actor_numerics, evaluation_precision
    from bench.task.prompts import styled_rows

    # Explicit settings, built from the spec alone (not from the model's generation_config), so that every
    # method is evaluated with the same decoding; evaluate() returns them as "generation" for the result.
    settings = sampling_settings(spec, outcome.tokenizer, eos_token_ids(outcome.policy, outcome.tokenizer),
                                 greedy=True)
    style = spec.eval.prompt_style
    rows = styled_rows(test_rows, outcome.tokenizer, style, spec.model.use_chat_template)
    threads = torch.get_num_threads() if threads is None else threads
    # vLLM decodes in its own threads (and its CPU build refuses torch.set_num_threads once it has bound them).
    by_torch = settings.get("backend") != "vllm"
    with (telemetry.phase("evaluation"), actor_numerics(outcome.policy, spec.model.dtype),
          torch_threads(threads) if by_torch else contextlib.nullcontext()):
        evaluation = evaluate(outcome.policy, outcome.tokenizer, rows, spec.eval.max_new_tokens,
                              spec.eval.batch_size, spec.eval.samples_in_report, settings=settings)
    precision = evaluation_precision(outcome.policy, spec.model.dtype, settings)
    if next(outcome.policy.parameters()).device.type == "cpu" and by_torch:
        precision["cpu_threads"] = threads
    return {**evaluation, "prompt_style": style, "precision": precision}


# -- the result -----------------------------------------------------------------------------------
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

    A 'before' and 'after' in different numerics would carry a precision shift into every gain (issue 20): the
    report can say so instead of reading it as learning."""
    before_precision = ((before or {}).get("evaluation") or {}).get("precision")
    same = None
    if precision and before_precision:
        # The CPU thread count too: it orders a matmul's sums (evaluation_threads); absent on a GPU, equal then.
        same = all(precision.get(key) == before_precision.get(key) for key in ("compute", "cpu_threads"))
    return {"precision": precision, "before_precision": before_precision, "same_numerics": same}


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
