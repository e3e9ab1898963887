"""Across seeds: mean and spread per method of accuracy, seconds per step and peak memory (pandas).

One seed says little about a method: RL fine-tuning is noisy, and the difference between two methods means
something only next to the spread between seeds of one method. This table appears when some method has more
than one ok seed; it is computed from :func:`bench.report.load.results_frame`, the same cells as results.csv.

Spread is the sample standard deviation over seeds (ddof = 1: with n seeds it estimates the seed-to-seed
standard deviation, not that of the mean) together with the range (min to max), which is what two or three
seeds can honestly show. Only ok runs count: a failed seed has no "after" to average.

Accuracy is the suite's headline mode (``Suite.headline_mode``, named in every table's note). Besides the
aggregate, :func:`per_seed_table` lists each seed's value, and :func:`seed_tests_table` compares methods at the
seed level: a paired t-test over the seeds both methods finished (seed s of A against seed s of B), which
carries the seed-to-seed noise that the per-question McNemar tests leave out.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

import itertools

from bench.scoring import stats
from bench.report import fmt
from bench.report.load import Suite, results_frame

METRICS = ("accuracy_after", "step_s_median", "peak_memory_bytes")
"""Columns of results.csv aggregated per method: accuracy after in the headline mode (fraction), median seconds
per optimizer step (s), whole-run peak memory (bytes, one source)."""

HEADER = ["method", "ok seeds", "accuracy after: mean ± sd (min–max)",
          "median s/step: mean ± sd (min–max)", "peak memory: mean ± sd (min–max, source)"]

NOTE = ("Across seeds: ok runs only; sd is the sample standard deviation over seeds (n − 1 in the denominator), "
        "the range is the lowest and highest seed. Accuracy is greedy, after training, in the headline mode {mode}; "
        "s/step is each run's median seconds per optimizer step; peak memory is each run's whole-run peak from the "
        "source in brackets (seeds are averaged only when they share one source).")


def seed_stats(suite: Suite) -> pd.DataFrame:
    """Per method label (suite order): ``seeds`` (count of ok runs), ``seed_list`` and, for each of
    :data:`METRICS`, ``<metric>_mean``, ``_sd`` (ddof 1; NA for one value), ``_min``, ``_max`` and ``_n`` (ok
    runs that measured it). Peak memory is averaged only over one source: a method whose seeds report
    different sources gets NA there and ``memory_source`` = "mixed".
    """
    frame = results_frame(suite)
    ok = frame[frame["status"] == "ok"]
    columns = ["label", "seeds", "seed_list", "memory_source"] + [
        f"{m}_{s}" for m in METRICS for s in ("mean", "sd", "min", "max", "n")]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    grouped = ok.groupby("label", sort=False)
    stats = grouped[list(METRICS)].agg(["mean", "std", "min", "max", "count"])
    stats.columns = [f"{m}_{'sd' if s == 'std' else 'n' if s == 'count' else s}" for m, s in stats.columns]
    stats["seeds"] = grouped.size()
    stats["seed_list"] = grouped["seed"].agg(lambda s: [int(v) for v in s.dropna()])
    sources = grouped["memory_source"].agg(lambda s: sorted(set(s.dropna())))
    stats["memory_source"] = sources.map(lambda found: found[0] if len(found) == 1 else ("mixed" if found else None))
    mixed = stats["memory_source"] == "mixed"
    for stat in ("mean", "sd", "min", "max"):
        stats[f"peak_memory_bytes_{stat}"] = stats[f"peak_memory_bytes_{stat}"].mask(mixed)
    return stats.reset_index()[columns]


def has_several_seeds(suite: Suite) -> bool:
    """True when some method has more than one ok seed: only then is an across-seeds table worth a section."""
    stats = seed_stats(suite)
    return bool((stats["seeds"] > 1).any()) if not stats.empty else False


def _value(value: Any) -> float | None:
    """A pandas cell as a float, or None for NA."""
    return None if value is None or pd.isna(value) else float(value)


def _pct(value: float, spread: bool = False) -> str:
    """A fraction as percent; a spread of fractions in percentage points (pp)."""
    return f"{100 * value:.1f} pp" if spread else f"{100 * value:.1f}%"


def _sec(value: float, spread: bool = False) -> str:
    """Seconds to three significant digits, trailing zeros kept ('10.0 s', '0.707 s') so columns read alike."""
    return f"{value:#.3g} s"


def _mib(value: float, spread: bool = False) -> str:
    """Bytes in MiB (one unit for the whole column, so seeds and methods compare at a glance)."""
    return f"{value / fmt.MIB:,.1f} MiB"


def _spread(row: pd.Series, metric: str, show: Any) -> str:
    """'mean ± sd (min–max)' with ``show`` formatting one number; '(k of n seeds)' when some seeds lacked it."""
    mean, sd = _value(row[f"{metric}_mean"]), _value(row[f"{metric}_sd"])
    if mean is None:
        return fmt.NOT_MEASURED
    text = show(mean) + (f" ± {show(sd, True)}" if sd is not None else "")
    low, high = _value(row[f"{metric}_min"]), _value(row[f"{metric}_max"])
    if low is not None and high is not None and row[f"{metric}_n"] > 1:
        text += f" ({show(low)}–{show(high)})"
    if row[f"{metric}_n"] < row["seeds"]:
        text += f" ({int(row[f'{metric}_n'])} of {int(row['seeds'])} seeds)"
    return text


def across_seeds(suite: Suite) -> fmt.Table:
    """The across-seeds table, one row per method with an ok run; empty when no method has several ok seeds."""
    if not has_several_seeds(suite):
        return fmt.Table([], [])
    rows = []
    for _, row in seed_stats(suite).iterrows():
        memory = _spread(row, "peak_memory_bytes", _mib)
        if row["memory_source"] == "mixed":
            memory = "not averaged: seeds report different memory sources"
        elif memory != fmt.NOT_MEASURED:
            memory += f" [{row['memory_source']}]"
        seeds = ", ".join(str(s) for s in row["seed_list"]) or fmt.MISSING
        rows.append([row["label"], f"{int(row['seeds'])} (seed {seeds})",
                     _spread(row, "accuracy_after", _pct), _spread(row, "step_s_median", _sec), memory])
    return fmt.Table(list(HEADER), rows, [NOTE.format(mode=fmt.mode_note(suite.headline_mode)), varied_note(suite)])


def varied_note(suite: Suite) -> str:
    """What the seeds varied (spec ``seed_scope``), so a spread is read as the spread of what it measures."""
    spec = suite.spec or {}
    if spec.get("seed_scope") == "pipeline":
        return ("What the seeds vary (seed_scope: pipeline): every seed re-ran the shared stages (warm start, sample "
                "pool, reward model) and initialised the model with its own seed, so the spread is the whole "
                "pipeline's.")
    first = (spec.get("seeds") or [None])[0]
    return ("What the seeds vary (seed_scope: method): only the method stage, its data order and sampling. The warm "
            "start, sample pool, reward model and the model's initialisation ran once"
            + (f", with seed {first}," if first is not None else "")
            + " and are shared by every seed, so this spread leaves their variance out; seed_scope=pipeline "
              "re-runs them per seed.")


def _ok_accuracy(suite: Suite) -> dict[str, dict[int, float]]:
    """Label -> {seed: accuracy after in the headline mode} over ok runs that measured it (suite order)."""
    frame = results_frame(suite)
    ok = frame[(frame["status"] == "ok") & frame["accuracy_after"].notna() & frame["seed"].notna()]
    out: dict[str, dict[int, float]] = {}
    for _, row in ok.iterrows():
        out.setdefault(str(row["label"]), {})[int(row["seed"])] = float(row["accuracy_after"])
    return out


def per_seed_table(suite: Suite) -> fmt.Table:
    """Each method's accuracy after per seed (one column per seed), then mean ± sd; empty when no method has
    several ok seeds. A seed a method did not finish is the dash."""
    if not has_several_seeds(suite):
        return fmt.Table([], [])
    per_label = _ok_accuracy(suite)
    seeds = sorted({seed for values in per_label.values() for seed in values})
    rows = []
    for label, values in per_label.items():
        mean, sd = stats.mean_sd(list(values.values()))
        spread = _pct(mean) + (f" ± {_pct(sd, True)}" if sd is not None else "")
        rows.append([label] + [_pct(values[s]) if s in values else fmt.MISSING for s in seeds]
                    + [f"{spread} (n = {len(values)})"])
    note = (f"Accuracy after training, greedy, headline mode {fmt.mode_note(suite.headline_mode)}; ok runs only. "
            f"sd: sample standard deviation over the method's seeds (n − 1).")
    return fmt.Table(["method"] + [f"seed {s}" for s in seeds] + ["mean ± sd"], rows, [note])


BETWEEN_FAMILY = "between methods, over seeds"
START_FAMILY = "each method against the control arm (its start), over seeds"
"""The two Holm families of :func:`seed_tests`. The lr-0 control arm equals its start on every question, so a
method against it is a method against its start, not a contest between methods: it has a family of its own."""


def seed_tests(suite: Suite) -> list[dict[str, Any]]:
    """Paired t-tests over seeds between every two methods with at least two ok seeds in common.

    Each seed is one pair (A's accuracy after on seed s, B's on seed s; the seed fixes data order and sampling,
    so same-seed runs are matched). ``p_holm`` is Holm-adjusted within its ``family`` (one mode): pairs of
    contestants in :data:`BETWEEN_FAMILY`, pairs with the control arm in :data:`START_FAMILY`.
    """
    per_label = _ok_accuracy(suite)
    controls = {r.label for r in suite.methods if fmt.is_control(r)}
    out = []
    for a, b in itertools.combinations(per_label, 2):
        common = sorted(set(per_label[a]) & set(per_label[b]))
        if len(common) < 2 or (a in controls and b in controls):
            continue
        test = stats.paired_t_test([per_label[a][s] for s in common], [per_label[b][s] for s in common])
        out.append({"a": a, "b": b, "seeds": common, "control": a in controls or b in controls, **test})
    stats.holm_family([t for t in out if not t["control"]], BETWEEN_FAMILY)
    stats.holm_family([t for t in out if t["control"]], START_FAMILY)
    return out


def seed_tests_table(suite: Suite) -> fmt.Table:
    """Seed-level comparison of methods: mean difference ± sd over paired seeds, t interval, t-test p, Holm p."""
    tests = seed_tests(suite)
    if not tests:
        return fmt.Table([], [])
    rows = []
    for t in tests:
        sd = "" if t["sd_diff"] is None else f" ± {100 * t['sd_diff']:.1f}"
        ci = (fmt.MISSING if t["low"] is None
              else f"[{100 * t['low']:+.1f}, {100 * t['high']:+.1f}] (df {t['df']})")
        undefined = "undefined (zero spread)" if t.get("undefined") == stats.ZERO_SPREAD else fmt.MISSING
        rows.append([t["a"], t["b"], ", ".join(str(s) for s in t["seeds"]), f"{100 * t['mean_diff']:+.1f}{sd} pp", ci,
                     t["family"], undefined if t["p_value"] is None else fmt.p_value_text(t["p_value"]),
                     undefined if t["p_holm"] is None else fmt.p_value_text(t["p_holm"])])
    notes = [f"Headline mode {fmt.mode_note(suite.headline_mode)}. Paired t-test over seeds: for each seed both "
             f"methods finished, the difference of their accuracies after; t = mean / (sd / √n) with n − 1 degrees of "
             f"freedom, two-sided; the interval is the 95% t interval of the mean difference. With 2–3 seeds the "
             f"test has little power: a large p says the seeds cannot tell the methods apart, not that they are equal.",
             f"Holm-adjusted p: within its family (column 'Holm family'), over the pairs that have a test. "
             + fmt.family_note(tests) + " 'undefined (zero spread)': every seed gave the same difference "
             f"(e.g. two seed-invariant methods), so the standard error is 0 and the t-test has nothing to judge "
             f"by; such a pair is never called significant.",
             varied_note(suite)]
    return fmt.Table(["A", "B", "seeds", "A − B: mean ± sd over seeds", "95% CI (t)", "Holm family", "t-test p",
                      "Holm-adjusted p"], rows, notes)

