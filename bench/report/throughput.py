"""Throughput and time per run: set-up beside training, and the window every rate was divided by.

``throughput.train_s`` is the denominator of every rate, and what it covers depends on the recipe
(``throughput.timing``): for TRL trainers and the suite's engine it is "first on_train_begin to last
on_train_end", so model loading and trainer set-up (``setup_s``) are left out; a stage that fires no
on_train_begin (the sample pool) is timed whole. Showing setup_s next to train_s, and the timing basis in the
table's note, keeps a reader from comparing a rate over training alone with one over a whole recipe.

Per second of training is not per second of generating: a recipe whose update, reward or critic takes longer
generates fewer completions per training second at the same decoding speed. :func:`generation_rate` divides by
the generation phase's own seconds (``phases.generation.time_s``, bench.telemetry), the decoding speed itself.
"""

from __future__ import annotations

from bench.report import fmt, phases
from bench.report.load import Run, Suite

HEADER = ["run", "steps", "setup (s)", "train (s)", "median s/step", "p90 s/step", "completions/s of training",
          "generated tokens/s of training", "completions/s of generation phase",
          "generated tokens/s of generation phase", "trained tokens/s", "wall (s)"]
DEFAULT_TIMING = "first on_train_begin to last on_train_end"


def _runs(suite: Suite) -> list[Run]:
    """Method runs, then stages, that recorded a training time (a run that never trained has no row)."""
    return [r for r in suite.methods + suite.stages if fmt.throughput(r, "train_s") is not None]


def _timing(run: Run) -> str | None:
    value = run.result.get("throughput", {}).get("timing")
    return value if isinstance(value, str) and value else None


def generation_s(run: Run) -> float | None:
    """Seconds the run spent in its generation phase (``phases.generation.time_s``); None when it recorded none,
    or when the seam that times it did not attach (bench.report.phases: not instrumented, not zero)."""
    if "generation" in phases.uninstrumented(run):
        return None
    entry = (run.result.get("phases") or {}).get("generation")
    seconds = fmt.num(entry.get("time_s")) if isinstance(entry, dict) else None
    return seconds if seconds else None


def generation_rate(run: Run, key: str = "completions") -> float | None:
    """``throughput[key]`` (``completions`` or ``generated_tokens``, counts) per second of the generation phase
    (1/s, tokens/s): how fast the run decoded, apart from the other phases of its steps. None without both."""
    count, seconds = fmt.num(run.result.get("throughput", {}).get(key)), generation_s(run)
    return count / seconds if count and seconds else None


def _phase_cell(run: Run, key: str, digits: int) -> str:
    """A generation-phase rate as text; the offline mark where the run generated nothing (as the other rates)."""
    if fmt.generation_rate_text(run, "completions_per_s") == fmt.NO_GENERATION:
        return fmt.NO_GENERATION
    return fmt.float_text(generation_rate(run, key), digits)


def _cell(run: Run, key: str, digits: int = 2) -> str:
    return fmt.float_text(fmt.throughput(run, key), digits)


def _row(name: str, run: Run) -> list[str]:
    """Units are in the header; a rate the run could not have (DPO generates nothing) is the dash."""
    setup = _cell(run, "setup_s")
    if setup == fmt.MISSING and _timing(run) not in (None, DEFAULT_TIMING):
        setup = "in train (timed whole)"
    steps = fmt.throughput(run, "steps")
    # Step times are per optimizer step: a run that took none (the sample pool) has no such time to show.
    median, p90 = ((fmt.MISSING, fmt.MISSING) if steps == 0
                   else (_cell(run, "step_s_median", 3), _cell(run, "step_s_p90", 3)))
    return [name, fmt.int_text(steps), setup, _cell(run, "train_s"), median, p90,
            fmt.generation_rate_text(run, "completions_per_s"), fmt.generation_rate_text(run, "tokens_per_s", 1),
            _phase_cell(run, "completions", 2), _phase_cell(run, "generated_tokens", 1),
            _cell(run, "trained_tokens_per_s", 1), _cell(run, "wall_s", 1)]


def concurrency(suite: Suite) -> tuple[int, str]:
    """(method runs at once, "cuda" or "cpu"): suite.json's ``schedule`` (parallel_runs resolved by the runner,
    bench.execution.devices), else the spec's parallel_runs (``auto`` with no schedule recorded: 1) on a CPU, the
    only place runs went side by side before GPUs were scheduled."""
    schedule = suite.meta.get("schedule") if isinstance(suite.meta.get("schedule"), dict) else {}
    count = schedule.get("parallel_runs")
    if not isinstance(count, int) or isinstance(count, bool):
        count = (suite.spec or {}).get("parallel_runs", 1)
        count = count if isinstance(count, int) and not isinstance(count, bool) else 1
    return max(1, count), "cuda" if schedule.get("device") == "cuda" else "cpu"


def _gpus(run: Run) -> str | None:
    """The GPUs a run ran on (result["placement"]["gpus"], as CUDA_VISIBLE_DEVICES entries), None when not recorded."""
    placed = run.result.get("placement")
    gpus = placed.get("gpus") if isinstance(placed, dict) else None
    return ",".join(str(g) for g in gpus) if isinstance(gpus, list) and gpus else None


def throughput_table(suite: Suite) -> fmt.Table:
    """One row per run that trained: steps, set-up and training seconds, step times, rates and wall time.

    The notes state the timing basis: the one most runs share, then each run timed differently by name.
    """
    runs = _runs(suite)
    if not runs:
        return fmt.Table([], [])
    names = fmt.display_names(runs)
    rows = [_row(names[r.run_id], r) for r in runs]
    header = list(HEADER)
    if any(_gpus(r) for r in runs):  # which GPU ran what (bench.execution.devices), when the runner recorded it
        header.append("GPU")
        rows = [row + [_gpus(r) or fmt.MISSING] for row, r in zip(rows, runs)]
    recorded = [t for t in (_timing(r) for r in runs) if t]
    # The most common basis; on a tie the usual one (on_train_begin to on_train_end), then the first seen.
    basis = max(dict.fromkeys(recorded), key=lambda t: (recorded.count(t), t == DEFAULT_TIMING), default=None)
    notes = [f"Timing basis of train (s): {basis or 'not recorded'}; every rate 'of training' (completions, "
             f"generated and trained tokens per second) divides by it. The rates 'of generation phase' divide the "
             f"same completions and generated tokens by the seconds of the generation phase alone (Time per "
             f"phase): the decoding speed, which the other phases of a step (reward, critic, update) leave out. "
             f"Setup (s) is the recipe's start to the first "
             f"on_train_begin (model loading, trainer set-up), left out of the rates. Wall (s) is the whole "
             f"worker: load, set-up, training and evaluation. Step times are per optimizer step."]
    if any(fmt.NO_GENERATION in row for row in rows):
        notes.append(f"{fmt.NO_GENERATION}: the run trained on fixed data and generated nothing while training, "
                     f"so it has no generation rate (not a missing measurement).")
    different = [f"{names[r.run_id]}: {_timing(r)}" for r in runs if _timing(r) not in (None, basis)]
    if different:
        notes.append("Timed differently: " + "; ".join(different) + ".")
    unknown = [names[r.run_id] for r in runs if _timing(r) is None]
    if unknown and basis:
        notes.append("Timing basis not recorded (a result written before it was): " + ", ".join(unknown) + ".")
    if "GPU" in header:
        notes.append("GPU: the device(s) the run's worker saw (CUDA_VISIBLE_DEVICES, as nvidia-smi numbers them); "
                     "runs side by side never share one.")
    return fmt.Table(header, rows, notes)
