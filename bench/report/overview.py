"""The tables a writeup quotes, in text: the headline per method, time per phase with shares, and per-phase
peak memory. Figures illustrate these tables; no number lives only in a picture.

The headline has one row per method (seeds pooled: accuracy is the mean over ok seeds when there are
several, with every seed listed), marks a column's best value only where a test separates it from every other
contestant's (``best``: (row, column) pairs; bench.report.findings.best_labels: never the control arm, never
across methods that generate and methods that do not), and compares peak memory only between runs whose readings
share a source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from statistics import mean, stdev

from bench.report import datachecks, fmt, tables
from bench.report.findings import BOLD_NOTE, accuracy, best_labels, headline_mode, network_bytes
from bench.report.load import Run, Suite
from bench.results import PHASES

HEADLINE_HEADER = [
    "method", "networks resident", "static memory per network (MiB, accounting)", "peak memory (source)",
    "s/step (median)", "generated tokens/s of training", "completions/s of training", "accuracy before → after (95% CI)",
    "tuning (grid points on validation)", "n questions (independent units)", "seeds",
    "status",
]
ACCURACY_COLUMN = "accuracy before → after (95% CI)"
"""Template of the accuracy column; :func:`headline_table` puts the headline mode into it."""
LOWER_IS_BETTER = {2: "static", 3: "peak", 4: "step"}
HIGHER_IS_BETTER = {5: "tokens", 6: "completions", 7: "accuracy"}


@dataclass
class MarkedTable(fmt.Table):
    """A :class:`fmt.Table` whose best cell per column is marked (bold in Markdown, highlighted in HTML)."""

    best: set[tuple[int, int]] = field(default_factory=set)


def _groups(suite: Suite) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in suite.methods:
        groups.setdefault(run.label, []).append(run)
    return groups


def _mean(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return mean(xs) if xs else None


def _static_cell(run: Run | None) -> tuple[str, float | None]:
    nets = network_bytes(run) if run else {}
    if not nets:
        return fmt.NOT_MEASURED, None
    parts = " + ".join(f"{role} {b / fmt.MIB:,.2f}" for role, b in nets.items())
    total = sum(nets.values())
    return (f"{parts} = {total / fmt.MIB:,.2f}" if len(nets) > 1 else parts), total


def seed_scope(suite: Suite) -> str:
    """'method' (the shared stages ran once, with the first seed) or 'pipeline' (once per seed), from the spec."""
    return str((suite.spec or {}).get("seed_scope") or "method")


def seed_spread_text(suite: Suite) -> str:
    """What the spread over seeds measures: the method stage alone, or the whole pipeline (``seed_scope``)."""
    if seed_scope(suite) == "pipeline":
        return "seed spread of the whole pipeline: warm start, pool, reward model and model initialisation per seed"
    return "seed spread of the method stage; warm start, pool and reward model shared"


def _accuracy_cell(suite: Suite, ok: list[Run], mode: str) -> tuple[str, float | None, str, float | None]:
    """(text, mean accuracy after, n questions with their clusters, the widest seed's 95% half-width) over the ok
    seeds; the half-width is None for a single run (its own interval is in the cell)."""
    scored = [(accuracy(r, "before", mode, suite), accuracy(r, "after", mode)) for r in ok]
    scored = [(b, a) for b, a in scored if a is not None]
    if not scored:
        evaluated = all(((r.result.get("spec") or {}).get("eval") or {}).get("enabled", True) for r in ok)
        return (fmt.MISSING if evaluated or not ok else "not evaluated"), None, fmt.MISSING, None
    first = scored[0][1]
    n = fmt.n_short(first.get("total"), first.get("clusters"), fmt.cluster_unit(ok[0]))
    if len(scored) == 1:
        before, after = scored[0]
        return f"{fmt.score_text(before)} → {fmt.score_text(after)}", after["accuracy"], n, None
    after_mean = mean(a["accuracy"] for _, a in scored)
    before_mean = _mean([b["accuracy"] if b else None for b, _ in scored])
    spread = stdev(a["accuracy"] for _, a in scored)  # sample sd over seeds (n - 1), as Across seeds
    halves = [(a["high"] - a["low"]) / 2 for _, a in scored if fmt.num(a.get("high")) is not None
              and fmt.num(a.get("low")) is not None]
    return (f"{fmt.pct(before_mean)} → {fmt.pct(after_mean)} ± {100 * spread:.1f} pp (mean ± sd of {len(scored)} "
            f"seeds)"), after_mean, n, (max(halves) if halves else None)


def seeds_note(suite: Suite, halves: list[float]) -> str:
    """The note under the headline when a row is over several seeds (said once, not in every cell): what the spread
    measures and how wide each seed's own interval is; ``halves``: the widest seed half-width of each such row."""
    within = f"; each seed's own 95% CI is ±{100 * max(halves):.1f} pp or less" if halves else ""
    return (f"Over several seeds: mean ± sample sd of the seeds ({seed_spread_text(suite)}){within}; every seed "
            f"under Results per method.")


def headline_table(suite: Suite) -> MarkedTable:
    """One row per method: what it keeps resident, what it costs, how fast, what it buys."""
    rows: list[list[str]] = []
    halves: list[float] = []
    multi_seed = one_seed = False
    for label, runs in _groups(suite).items():
        ok = [r for r in runs if r.status == "ok"]
        first = ok[0] if ok else runs[0]
        counted = next((r for r in ok if network_bytes(r)), None)
        static_text, static = _static_cell(counted)
        roles = ", ".join(network_bytes(counted)) if counted else (
            ", ".join((first.result.get("memory", {}).get("networks") or {})) or fmt.MISSING)
        peaks = [fmt.num(r.result.get("memory", {}).get("peak_bytes")) for r in ok]
        source = first.result.get("memory", {}).get("source")
        peak = _mean(peaks)
        acc_text, acc, n, half = _accuracy_cell(suite, ok, headline_mode(suite))
        multi_seed, one_seed = multi_seed or len(ok) > 1, one_seed or len(ok) == 1
        halves += [half] if half is not None else []
        step, tokens, comps = (_mean([fmt.throughput(r, k) for r in ok])
                               for k in ("step_s_median", "tokens_per_s", "completions_per_s"))
        seeds = sorted({str(r.result.get("seed")) for r in runs if r.result.get("seed") is not None})
        statuses = sorted({fmt.status_text(r) for r in runs})
        offline = bool(ok) and all(fmt.generation_rate_text(r, "completions_per_s") == fmt.NO_GENERATION for r in ok)
        rows.append([
            label, roles, static_text, fmt.bytes_text(peak, source) if ok else fmt.NOT_MEASURED,
            fmt.float_text(step, 3, " s"),
            fmt.NO_GENERATION if offline else fmt.float_text(tokens, 1),
            fmt.NO_GENERATION if offline else fmt.float_text(comps, 2),
            acc_text, _tuning_cell(first), n, ", ".join(seeds) or fmt.MISSING,
            ", ".join(statuses) + (f" ({len(ok)} of {len(runs)} ok)" if len(runs) > 1 else ""),
        ])
    marked = best_labels(suite)  # only what a test separates from every other contestant
    best = {(i, col) for col, key in {**LOWER_IS_BETTER, **HIGHER_IS_BETTER}.items()
            for i, label in enumerate(_groups(suite)) if marked.get(key) == label}
    notes = [f"Accuracy: {headline_mode(suite)} scoring, greedy, on {datachecks.split_text(suite)}; brackets are "
             f"95% {datachecks.interval_text(suite)}. {BOLD_NOTE}",
             "Static memory: weights + gradients + optimizer state of each resident network (exact accounting); "
             "peak memory: the highest reading of the whole run from the named source.",
             tuning_note(suite)]
    if multi_seed:
        notes.insert(1, seeds_note(suite, halves))
    if len(rows) < 2:
        best = set()
    # The column names the mode its numbers use and what its brackets hold: a row over several seeds holds their
    # mean ± sd, not an interval.
    held = "95% CI" if not multi_seed else "mean ± sd over seeds" if not one_seed else "95% CI; several seeds: mean ± sd"
    header = [f"accuracy {headline_mode(suite)} before → after ({held})" if h == ACCURACY_COLUMN else h
              for h in HEADLINE_HEADER]
    # The reward model's chance-level warning sits beside PPO (reward model)'s row, where its accuracy is read.
    return (MarkedTable(header, rows, notes=notes, warnings=tables.reward_model_warnings(suite), best=best)
            if rows else MarkedTable([], []))


def tuning_entry(run: Run, name: str | None = None) -> dict[str, Any] | None:
    """The run's own entry of ``spec.tuning.methods`` (written by `bench tune`), or ``name``'s (``reward_model``: the
    reward model it read, tuned on its own held-out pairs), or None when it ran untuned."""
    tuning = (run.result.get("spec") or {}).get("tuning") or {}
    entry = ((tuning.get("methods") or {}).get(name or run.result.get("method")) if isinstance(tuning, dict)
             else None)
    return entry if isinstance(entry, dict) and entry.get("chosen") is not None else None


def grid_points(entry: dict[str, Any]) -> int:
    """How many grid points a tune scored (bench.execution.tune records "points" as a count, every point's score
    under "scores"; older entries list the points)."""
    points = entry.get("points")
    return points if isinstance(points, int) else len(points or entry.get("scores") or [])


def _tuning_cell(run: Run) -> str:
    """The headline's tuning cell: the grid size beside the validation score it chose, or why there is none."""
    from bench.config.registry import UNTUNABLE

    if run.result.get("method") in UNTUNABLE:
        return "never tuned (lr 0 by design)"
    entry = tuning_entry(run)
    if entry is None:
        return "untuned defaults"
    score = fmt.num((entry.get("score") or {}).get("mean"))
    return f"{grid_points(entry)} points, validation {fmt.pct(score) if score is not None else fmt.MISSING}"


def tuning_effort(suite: Suite) -> dict[str, int]:
    """Label -> grid points its tune scored (0: untuned defaults), for every tunable method, in suite order."""
    from bench.config.registry import UNTUNABLE

    out = {}
    for label, runs in _groups(suite).items():
        if runs[0].result.get("method") not in UNTUNABLE:
            entry = tuning_entry(runs[0])
            out[label] = grid_points(entry) if entry else 0
    return out


def unequal_effort_text(suite: Suite) -> str:
    """A sentence when the methods were tuned on grids of different sizes (or some not at all), else ''.

    Why: a method given 12 points had more chances at a good setting than one given 3, so a gap between them
    is partly a gap in tuning effort, not only in the method."""
    effort = tuning_effort(suite)
    if len(set(effort.values())) < 2:
        return ""
    listed = ", ".join(f"{label} {n if n else 'untuned'}" for label, n in
                       sorted(effort.items(), key=lambda item: -item[1]))
    return (f"Unequal tuning effort: grid points per method {listed}. A method tuned on a larger grid had more "
            f"chances to find good values, so the comparison between methods is at unequal tuning effort.")


def tuning_note(suite: Suite) -> str:
    """Which methods run at values tuned on the validation split (``spec.tuning``, written by `bench tune`) and
    which at untuned defaults, so a reader knows whether each contestant was given its best chance; ends with
    :func:`unequal_effort_text` when the grids differ in size. With a method that read the learned reward model,
    starts with the reward model's own tune when it had one ("reward model: lr X, epochs Y, held-out pair accuracy
    Z (k grid points, ...)": chosen first, on its held-out pairs; the methods reading it tuned at it)."""
    from bench.config.registry import UNTUNABLE
    from bench.report.reward_check import uses_reward_model

    tuned: dict[str, str] = {}
    untuned: list[str] = []
    by_design: list[str] = []
    for label, runs in _groups(suite).items():
        run = runs[0]
        if run.result.get("method") in UNTUNABLE:
            by_design.append(label)
            continue
        entry = tuning_entry(run)
        if entry is not None:
            score = entry.get("score") or {}
            mean_text = fmt.pct(fmt.num(score.get("mean"))) if fmt.num(score.get("mean")) is not None else fmt.MISSING
            overridden = _overridden(run, entry.get("chosen"))
            ran = (f"; overridden: ran {', '.join(f'{_short(k)} = {v}' for k, v in overridden.items())}, not the "
                   f"tuned value" if overridden else "")
            at = ", at the reward model tuned first" if entry.get("tuned_at") else ""
            tuned[label] = (f"{label}: tuned on validation ({grid_points(entry)} grid points, "
                            f"n = {entry.get('n_questions', fmt.MISSING)}, seeds {entry.get('seeds', fmt.MISSING)}; "
                            f"chosen {_chosen_text(entry.get('chosen'))}{at}, validation {mean_text}{ran})")
        else:
            untuned.append(label)
    readers = [runs[0] for runs in _groups(suite).values() if uses_reward_model(runs[0])]
    stage, reader = next(((e, r) for r in readers for e in [tuning_entry(r, "reward_model")] if e), (None, None))
    if stage is not None and isinstance(stage.get("chosen"), dict):
        mean_rm = fmt.num((stage.get("score") or {}).get("mean"))
        names = {"learning_rate": "lr"}
        chosen = ", ".join(f"{names.get(str(k).rsplit('.', 1)[-1], str(k).rsplit('.', 1)[-1])} "
                           f"{f'{v:g}' if isinstance(v, float) else v}" for k, v in stage["chosen"].items())
        overridden = _overridden(reader, stage["chosen"])
        ran = (f"; overridden: ran {', '.join(f'{k} = {v}' for k, v in overridden.items())}, not the tuned value"
               if overridden else "")
        pairs = stage.get("heldout_pairs", stage.get("n_questions", fmt.MISSING))
        tuned = {"reward model": (f"reward model: {chosen}, held-out pair accuracy "
                                  f"{fmt.pct(mean_rm) if mean_rm is not None else fmt.MISSING} ({grid_points(stage)} "
                                  f"grid points, n = {pairs} held-out pairs, seeds {stage.get('seeds', fmt.MISSING)}"
                                  f"{ran})"), **tuned}
    parts = list(tuned.values()) + ([f"untuned defaults: {', '.join(untuned)}"] if untuned else [])
    parts += [f"never tuned (learning rate 0 by design): {', '.join(by_design)}"] if by_design else []
    unequal = unequal_effort_text(suite)
    return ("Hyperparameters: " + "; ".join(parts) + " (bench tune picks each method's values on a validation split)."
            + (f" {unequal}" if unequal else ""))


def _short(key: str) -> str:
    """A dotted spec key without ``methods.<name>.``: ``learning_rate``, ``reward_model.epochs``."""
    parts = str(key).split(".")
    return ".".join(parts[2:]) if parts[0] == "methods" and len(parts) > 2 else str(key)


def _chosen_text(chosen: Any) -> str:
    """A tune's chosen values as ``key = value`` pairs, the method's own keys without ``methods.<name>.``
    (``learning_rate = 0.001, reward_model.epochs = 4``); a null value is the key's derived default (a critic
    learning rate of 10x the actor's, a KL coefficient of train.kl_beta), so it reads "its default", never "None"."""
    if not isinstance(chosen, dict) or not chosen:
        return fmt.MISSING if chosen is None else str(chosen)
    return ", ".join(f"{_short(str(key))} = {'its default' if value is None else value}"
                     for key, value in chosen.items())


_UNSET = object()


def _spec_value(spec: Any, key: str) -> Any:
    """The value at dotted ``key`` of a result's resolved spec, or ``_UNSET`` when the spec does not have it."""
    node = spec
    for part in str(key).split("."):
        if not isinstance(node, dict) or part not in node:
            return _UNSET
        node = node[part]
    return node


def _same(a: Any, b: Any) -> bool:
    """Equal as settings: numbers within float rounding (1e-4 and 0.0001), anything else by value."""
    x, y = fmt.num(a), fmt.num(b)
    if x is not None and y is not None and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(x - y) <= 1e-12 * max(abs(x), abs(y), 1.0)
    return a == b


def _overridden(run: Run, chosen: Any) -> dict[str, Any]:
    """The tuned keys whose value in the spec that ran differs from the chosen one (a command-line override such
    as ``methods.grpo.learning_rate=4e-4``): key -> the value that ran. Keys the spec does not record are left out."""
    if not isinstance(chosen, dict):
        return {}
    spec = run.result.get("spec") or {}
    out = {}
    for key, value in chosen.items():
        ran = _spec_value(spec, str(key))
        if ran is not _UNSET and not _same(ran, value):
            out[str(key)] = ran
    return out


def _phase_runs(suite: Suite) -> list[Run]:
    return [r for r in suite.methods if r.status == "ok" and isinstance(r.result.get("phases"), dict)
            and r.result["phases"]]


def _columns(runs: list[Run], key: str) -> list[str]:
    seen = {p for r in runs for p, v in (r.result.get(key) or {}).items() if isinstance(v, dict)}
    return [p for p in PHASES if p in seen] + sorted(seen - set(PHASES))


def phase_share_table(suite: Suite) -> fmt.Table:
    """Seconds per phase and each phase's share of the run's phase time, one row per ok method run."""
    runs = _phase_runs(suite)
    if not runs:
        return fmt.Table([], [])
    names = fmt.display_names(suite.methods)
    columns = _columns(runs, "phases")
    rows = []
    for run in runs:
        phases = run.result["phases"]
        times = {p: fmt.num(phases[p].get("time_s")) if isinstance(phases.get(p), dict) else None for p in columns}
        total = sum(t for t in times.values() if t is not None)
        cells = [names[run.run_id]]
        for p in columns:
            t = times[p]
            cells.append(fmt.MISSING if t is None else f"{t:,.2f} s ({t / total:.0%})" if total else f"{t:,.2f} s")
        rows.append(cells + [f"{total:,.2f} s"])
    return fmt.Table(["run", *[f"{p} (s, share)" for p in columns], "all phases (s)"], rows,
                     notes=["Exclusive seconds per phase (bench.telemetry) and the share of the run's phase time; "
                            "a dash: the run has no such phase. 'not instrumented' phases are under Time per phase."])


def phase_memory_table(suite: Suite) -> fmt.Table:
    """Peak memory per phase per ok method run; on CPU as the delta over the post-load baseline, labelled so."""
    runs = [r for r in suite.methods if r.status == "ok" and (r.result.get("memory", {}).get("phases"))]
    if not runs:
        return fmt.Table([], [])
    names = fmt.display_names(suite.methods)
    columns = [p for p in PHASES if any(p in r.result["memory"]["phases"] for r in runs)]
    columns += sorted({p for r in runs for p in r.result["memory"]["phases"]} - set(columns))
    rows, cpu = [], False
    for run in runs:
        memory = run.result["memory"]
        source = str(memory.get("source") or "source unknown")
        base = fmt.num(memory.get("baseline_bytes"))
        delta = source.startswith("cpu") and base is not None
        cpu |= delta
        cells = [names[run.run_id], f"{source}, Δ over post-load baseline {base / fmt.MIB:,.1f} MiB"
                 if delta else source]
        for p in columns:
            entry = memory["phases"].get(p)
            peak = fmt.num(entry.get("peak_bytes")) if isinstance(entry, dict) else None
            if peak is None:
                cells.append(fmt.MISSING)
            elif delta:
                cells.append(f"{(peak - base) / fmt.MIB:+,.1f}")
            else:
                cells.append(f"{peak / fmt.MIB:,.1f}")
        rows.append(cells)
    notes = ["MiB. GPU sources: the phase's peak reading. "
             + ("CPU (cpu-rss): the phase's highest resident-memory reading minus the reading after the models "
                "were loaded (Δ, can be negative), because the Python runtime dominates the absolute figure."
                if cpu else "")]
    return fmt.Table(["run", "source", *[f"{p} (MiB)" for p in columns]], rows, notes=notes)

