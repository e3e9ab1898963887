"""Across seeds: mean and spread per method of accuracy, seconds per step and peak memory (pandas).

One seed says little about a method: RL fine-tuning is noisy, and the difference between two methods means
something only next to the spread between seeds of one method. This table appears when some method has more
than one ok seed; it is computed from :func:`bench.report.load.results_frame`, the same cells as results.csv.

Spread is the sample standard deviation over seeds (ddof = 1: with n seeds it estimates the seed-to-seed
standard deviation, not that of the mean) together with the range (min to max), which is what two or three
seeds can honestly show. Only ok runs count: a failed seed has no "after" to average.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from bench.report import fmt
from bench.report.load import Suite, results_frame

METRICS = ("accuracy_after", "step_s_median", "peak_memory_bytes")
"""Columns of results.csv aggregated per method: strict accuracy after (fraction), median seconds per optimizer
step (s), whole-run peak memory (bytes, one source)."""

HEADER = ["method", "ok seeds", "accuracy strict after: mean ± sd (min–max)",
          "median s/step: mean ± sd (min–max)", "peak memory: mean ± sd (min–max, source)"]

NOTE = ("Across seeds: ok runs only; sd is the sample standard deviation over seeds (n − 1 in the denominator), "
        "the range is the lowest and highest seed. Accuracy is strict, greedy, after training; s/step is each "
        "run's median seconds per optimizer step; peak memory is each run's whole-run peak from the source in "
        "brackets (seeds are averaged only when they share one source).")


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
    return fmt.Table(list(HEADER), rows, [NOTE])

