"""What training did: training-dynamics and reward-hacking tables, monitor flags, and reward over-optimisation.

Reads ``result["curves"]`` (one dict per logged step, canonical names from bench.results.METRIC_NAMES) and
``result["monitors"]["eval"]`` (the final evaluation's monitors, bench.telemetry.monitors.record_monitors). Imports no
torch: bench.telemetry.monitors is pure Python.

- :func:`dynamics_table`: per method, the mean of the last fifth of its logged points (reward, KL, entropy,
  completion length, zero-variance groups, clip fraction, gradient norm; PPO's value loss and explained
  variance), averaged over ok seeds. The last fifth is the window bench.telemetry.monitors.curve_flags judges a run by,
  so the table and the flags read the same numbers.
- :func:`monitors_table`: the final evaluation's reward-hacking and "aha" monitors per method.
- :func:`flag_lines`: bench.telemetry.monitors.run_flags per ok run, prefixed with the run's name (shown as warnings).
- :func:`overoptimisation_table`: for a method trained against the learned reward model, its reward-model
  score and the verifier's accuracy reward in the first and the last fifth of training: a proxy that rises
  while the true reward falls is reward over-optimisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean
from typing import Any

from bench.telemetry import monitors
from bench.report import fmt, reward_check
from bench.report.labels import metric_label
from bench.report.load import Run, Suite
from bench.results import METRIC_NAMES

DYNAMICS = ("reward", "kl", "entropy", "completion_length", "zero_std_groups", "clipfrac", "grad_norm")
"""Columns of the training-dynamics table for every online method."""
PPO_DYNAMICS = ("value_loss", "explained_variance")
"""Critic columns, shown when some method logged them (PPO)."""
RATIO_DYNAMICS = ("ratio_std",)
"""The importance ratios' spread, shown when some method's policy moved within a rollout (a non-zero value: two or
more optimizer steps per rollout, as in the frontier presets); with one step per rollout it is 0 by construction."""
ONLINE_CURVES = ("reward", "accuracy_reward", "format_reward", "length_penalty_reward", "kl", "entropy",
                 "completion_length", "completion_length_p90", "zero_std_groups", "clipfrac", "grad_norm",
                 "empty_answer_rate", "format_only_rate", "repeated_ngram_rate", "answer_in_think_rate",
                 "reflection_rate", "reflection_count")
"""Curve metrics every online method logs (names from bench.results.METRIC_NAMES): the total reward and
its components, KL to the reference, entropy, completion length (mean, p90), zero-variance groups, clip fraction,
gradient norm, the reward-hacking monitors and the 'aha' monitor. PPO adds :data:`PPO_DYNAMICS`; a method with a
missing-EOS penalty adds ``missing_eos_penalty_reward``. tests/test_monitors.py runs every online method and checks
its curves against this table; :func:`dynamics_table` notes a run that lacks some of them."""
EVAL_MONITORS = ("empty_answer_rate", "format_only_rate", "repeated_ngram_rate", "answer_in_think_rate",
                 "truncated_rate", "reflection_rate", "reflection_count", "completion_length")
"""Columns of the reward-hacking monitors table (final evaluation), in the order a reader checks them."""
START_STAGE = "warm_start"
"""The stage whose evaluation is every method's 'before' (its monitors head the monitors table)."""


def _is_share(name: str) -> bool:
    metric = METRIC_NAMES.get(name)
    return metric is not None and metric.unit.startswith("share")


def _unit(name: str) -> str:
    """'%' for a share, else the metric's unit without its gloss ('nats per token')."""
    if _is_share(name):
        return "%"
    metric = METRIC_NAMES.get(name)
    return metric.unit.split(" (")[0] if metric else ""


def column(name: str) -> str:
    """'KL(policy ‖ reference) (nats per token)', 'zero-variance groups (%)': the metric's name
    (bench.report.labels) with its unit."""
    unit = _unit(name)
    return f"{metric_label(name)} ({unit})" if unit else metric_label(name)


def value_text(name: str, value: float | None) -> str:
    """A share as '12.5%', anything else to four significant digits; the dash when not logged."""
    if value is None:
        return fmt.MISSING
    return fmt.pct(value) if _is_share(name) else f"{value:.4g}"


def _points(run: Run) -> list[Mapping[str, Any]]:
    curves = run.result.get("curves")
    return [p for p in curves if isinstance(p, Mapping)] if isinstance(curves, list) else []


def window_mean(points: Sequence[Mapping[str, Any]], name: str, first: bool = False) -> float | None:
    """Mean of ``name`` over the last (or ``first``) fifth of the logged points (at least one point), over the
    points in the window that carry it; None when none does. The window of bench.telemetry.monitors.curve_flags."""
    if not points:
        return None
    size = max(1, len(points) // 5)
    window = points[:size] if first else points[-size:]
    values = [fmt.num(p.get(name)) for p in window]
    values = [v for v in values if v is not None]
    return mean(values) if values else None


def eval_monitors(run: Run) -> dict[str, float]:
    """``result["monitors"]["eval"]`` as {name: number} (non-numbers left out); {} when the run has none."""
    block = run.result.get("monitors")
    found = block.get("eval") if isinstance(block, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {str(k): v for k, v in found.items() if fmt.num(v) is not None}


def _by_label(suite: Suite, has: Any) -> dict[str, list[Run]]:
    """Label -> its ok runs for which ``has(run)``, in suite order (labels without one left out)."""
    out: dict[str, list[Run]] = {}
    for run in suite.methods:
        if run.status == "ok" and has(run):
            out.setdefault(run.label, []).append(run)
    return out


def _mean_over(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return mean(found) if found else None


def dynamics_table(suite: Suite) -> fmt.Table:
    """Per method: the last-fifth mean of each dynamics metric, averaged over its ok seeds; PPO's critic columns
    when some method logged them."""
    groups = _by_label(suite, lambda r: bool(_points(r)))
    if not groups:
        return fmt.Table([], [])
    logged = {n for runs in groups.values() for r in runs for p in _points(r) for n in p}
    moved = {n for runs in groups.values() for r in runs for p in _points(r) for n in RATIO_DYNAMICS
             if fmt.num(p.get(n))}
    names = ([n for n in DYNAMICS if n in logged] + [n for n in RATIO_DYNAMICS if n in moved]
             + [n for n in PPO_DYNAMICS if n in logged])
    rows = []
    for label, runs in groups.items():
        cells = [value_text(n, _mean_over([window_mean(_points(r), n) for r in runs])) for n in names]
        steps = max(len(_points(r)) for r in runs)
        rows.append([label, str(len(runs)), fmt.int_text(steps), *cells])
    notes = ["Each value: the mean over the last fifth of the run's logged steps (the window the monitor flags "
             "use), then the mean over the method's ok seeds. A dash: the method does not log that metric "
             "(DPO trains offline; the critic columns are PPO's).",
             "Metric meanings and units: bench.results.METRIC_NAMES; thresholds: bench.telemetry.monitors.THRESHOLDS."]
    if flag_lines(suite):
        notes.append("Monitor flags (a threshold crossed) are shown as warnings under Results per method.")
    notes += monitor_problems(suite) + missing_curves(suite)
    return fmt.Table(["method", "seeds", "logged steps", *(column(n) for n in names)], rows, notes)


def missing_curves(suite: Suite) -> list[str]:
    """'GRPO (TRL): no curve of entropy, clipfrac (...)' for every ok online run (one that logged a reward) that
    lacks some of :data:`ONLINE_CURVES` at every logged step: a dash in its row is then a gap, not a zero."""
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        points = _points(run)
        if run.status != "ok" or not any(fmt.num(p.get("reward")) is not None for p in points):
            continue
        logged = {n for p in points for n, v in p.items() if fmt.num(v) is not None}
        missing = [n for n in ONLINE_CURVES if n not in logged]
        if missing:
            out.append(f"{names[run.run_id]}: no curve of {', '.join(missing)} (every online method should log "
                       f"them: bench.report.dynamics.ONLINE_CURVES).")
    return out


def monitors_table(suite: Suite) -> fmt.Table:
    """The final evaluation's reward-hacking and 'aha' monitors per method, averaged over its ok seeds, after
    the warm start's (the checkpoint every method began from) when it recorded them."""
    groups = _by_label(suite, lambda r: bool(eval_monitors(r)))
    start = next((r for r in suite.stages if r.status == "ok" and r.result.get("method") == START_STAGE
                  and eval_monitors(r)), None)
    if start is not None:  # the checkpoint every method began from: the row each method's change is read against
        groups = {f"start: {start.label}": [start], **groups}
    if not groups:
        return fmt.Table([], [])
    present = {n for runs in groups.values() for r in runs for n in eval_monitors(r)}
    names = [n for n in EVAL_MONITORS if n in present]
    rows = [[label, str(len(runs)),
             *(value_text(n, _mean_over([eval_monitors(r).get(n) for r in runs])) for n in names)]
            for label, runs in groups.items()]
    limits = ", ".join(f"{n} {c} {value_text(n, v)}" for n, (c, v, _) in monitors.THRESHOLDS.items()
                       if n in names)
    notes = ["On the final (greedy) evaluation's completions, every question (bench.telemetry.monitors.record_monitors); "
             "each rate is a share of all completions. Right format, wrong answer: the format reward earned "
             "without the accuracy reward. Answer in think block: the strict answer also written inside "
             "<think>. Reflection: phrases such as 'wait', 'let me check', 'verify' (the 'aha' monitor)."]
    if limits:
        notes.append(f"Flag thresholds: {limits}.")
    return fmt.Table(["method", "seeds", *(column(n) for n in names)], rows, notes)


def monitor_problems(suite: Suite) -> list[str]:
    """'GRPO (TRL): monitors incomplete: ...' for every run whose recipe recorded ``metrics.monitor_problems``
    (TRL GRPO when its monitor hook saw missing or partial data): a dash there is not a zero."""
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        problem = (run.result.get("metrics") or {}).get("monitor_problems")
        if isinstance(problem, str) and problem:
            out.append(f"{names[run.run_id]}: monitors incomplete: {fmt.cap_text(problem, 300)}")
    return out


CONTROL_METHOD = "control"
"""The lr-0 control arm: the same loop and sampling with no learning, the floor every flag is judged against."""


def control_run(suite: Suite, seed: Any) -> Run | None:
    """The ok control run of ``seed``, else the first ok control run; None without one."""
    controls = [r for r in suite.methods if r.status == "ok" and r.result.get("method") == CONTROL_METHOD]
    return next((r for r in controls if r.result.get("seed") == seed), controls[0] if controls else None)


def _start_for(suite: Suite, seed: Any) -> Run | None:
    starts = [r for r in suite.stages if r.status == "ok" and r.result.get("method") == START_STAGE]
    return next((r for r in starts if r.result.get("seed") == seed), starts[0] if starts else None)


def _n_questions(run: Run) -> int | None:
    n = fmt.num((run.result.get("accuracy") or {}).get("n_questions"))
    return int(n) if n else None


def flag_lines(suite: Suite) -> list[str]:
    """bench.telemetry.monitors.run_flags of every ok method run, each line prefixed with the run's name.

    Each run is judged beside the control arm of its seed (its curves and its final evaluation): a flag fires only
    beyond what a model that cannot learn shows too, and the control arm, judged beside itself, never flags.
    Without a control arm in the suite the windows' own noise is the bar."""
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        if run.status != "ok":
            continue
        seed = run.result.get("seed")
        start = _start_for(suite, seed)
        start_monitors = eval_monitors(start) if start is not None else None  # rises are read against the start
        control = control_run(suite, seed)
        lines = monitors.run_flags(_points(run), eval_monitors(run), start_monitors,
                                   control=_points(control) if control is not None else None,
                                   control_evaluation=eval_monitors(control) if control is not None else None,
                                   n=_n_questions(run))
        out += [f"{names[run.run_id]}: {line}" for line in lines]
    return out


def rm_runs(suite: Suite) -> list[Run]:
    """Ok method runs that logged a reward-model score (``rm_score``): PPO trained against the reward model."""
    return [r for r in suite.methods if r.status == "ok" and any(fmt.num(p.get("rm_score")) is not None
                                                                   for p in _points(r))]


def overoptimisation_table(suite: Suite) -> fmt.Table:
    """Reward-model score and the verifier's accuracy reward, first vs last fifth of training, per run trained
    against the reward model; a warning when the proxy rose while the verifier's reward fell."""
    runs = rm_runs(suite)
    if not runs:
        return fmt.Table([], [])
    names = fmt.display_names(suite.methods)
    rows, warnings = [], []
    chance = reward_model_at_chance(suite)
    for run in runs:
        cells, moves = [], {}
        points = _points(run)
        for metric in ("rm_score", "accuracy_reward"):
            first = monitors.window_stats(monitors.window(points, first=True), metric)
            last = monitors.window_stats(monitors.window(points), metric)
            moves[metric] = None if first is None or last is None else (
                last[0] - first[0], monitors.NOISE_SE * _se(first[1], last[1]) if None not in (first[1], last[1])
                else None)
            cells += [value_text(metric, first and first[0]), value_text(metric, last and last[0])]
        rows.append([names[run.run_id], *cells])
        line = _overoptimisation_line(names[run.run_id], moves["rm_score"], moves["accuracy_reward"], chance)
        if line:
            warnings.append(line)
    header = ["run", "reward-model score, first fifth (logit)", "reward-model score, last fifth (logit)",
              "verifier accuracy reward, first fifth (%)", "verifier accuracy reward, last fifth (%)"]
    notes = ["Both on the same rollout completions at every logged step: the reward model's raw score (rm_score, "
             "what PPO optimised) and the verifier's accuracy reward (what the benchmark scores). Means over the "
             "first and the last fifth of the logged steps. The reward model's held-out pair accuracy is under "
             "Reward model.",
             f"Flagged only when the proxy rose and the verifier's reward fell each by more than "
             f"{monitors.NOISE_SE:g} standard errors of the change (from the spread of the points in each "
             f"window); when the reward model did not learn (its held-out pair accuracy not shown above chance and "
             f"its untrained head, bench.report.reward_check) the line says that instead of over-optimisation."]
    return fmt.Table(header, rows, notes, warnings)


def _se(a: float | None, b: float | None) -> float:
    return ((a or 0.0) ** 2 + (b or 0.0) ** 2) ** 0.5


# --- the reward model's signal: its held-out pair accuracy (bench.report.reward_check) -------------------------
def reward_model_at_chance(suite: Suite) -> dict[str, Any] | None:
    """The reward model's held-out check when it did not learn (interval at or below chance, or not above its
    untrained head), else None."""
    check = reward_check.reward_model_check(suite.runs)
    return check if check is not None and not check["learned"] else None


def _overoptimisation_line(name: str, proxy: tuple[float, float | None] | None,
                           true: tuple[float, float | None] | None, chance: dict[str, Any] | None) -> str | None:
    """The warning for one PPO run: over-optimisation only when the reward-model score rose and the verifier's
    reward fell, each beyond its noise; said otherwise when the reward model did not learn (``chance``)."""
    if proxy is None or true is None:
        return None
    (rose, rose_noise), (fell, fell_noise) = proxy, true
    if rose_noise is None or fell_noise is None:
        return None  # one point per window: no spread to tell a change from sampling noise
    if not (rose > rose_noise and -fell > fell_noise):
        return None
    moved = (f"its reward-model score rose ({rose:+.3g}, noise ±{rose_noise:.2g}) while the verifier's accuracy "
             f"reward fell ({100 * fell:+.1f} pp, noise ±{100 * fell_noise:.1f} pp), first to last fifth of "
             f"training")
    if chance is not None:
        return (f"{name}: its reward model did not learn ({reward_check.interval_text(chance)}), so this is not "
                f"over-optimisation of a learned reward: {moved}.")
    return f"{name}: reward over-optimisation: {moved}."
