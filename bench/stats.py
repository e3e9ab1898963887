"""Small statistics for the report: intervals, paired tests, percentiles.

Pure Python (``math`` and ``random`` only) on purpose: the report must rebuild on a laptop from a results
folder, so nothing here may pull in numpy, torch or scipy. Every function is checked against hand-worked
values in ``tests/test_stats.py``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``correct / total``.

    Args:
        correct: number of successes, ``0 <= correct <= total``.
        total: number of trials.
        z: standard-normal quantile; 1.96 gives a 95% interval.

    Returns:
        ``(low, high)``, both in ``[0, 1]``. With ``total == 0`` there is no information, so the interval is
        the whole range ``(0.0, 1.0)`` rather than an error: a run that evaluated nothing still gets a row.

    Wilson rather than the normal ("Wald") interval because it stays inside [0, 1] and behaves at 0% and
    100%, which tiny CPU presets hit often.
    """
    if total < 0 or correct < 0 or correct > total:
        raise ValueError(f"need 0 <= correct <= total, got correct={correct}, total={total}")
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    z2 = z * z
    denom = 1.0 + z2 / total
    center = (p + z2 / (2 * total)) / denom
    half = (z / denom) * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    # Clamp: rounding can push the ends a hair outside [0, 1], or past p itself, at p = 0 or 1.
    return (min(p, max(0.0, center - half)), max(p, min(1.0, center + half)))


def mcnemar_test(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float | int]:
    """Exact McNemar test: do two methods differ on the same questions?

    Only discordant questions carry information (one method right, the other wrong). Under the null
    hypothesis each discordant question is a fair coin, so the two-sided p-value is the exact binomial
    tail ``min(1, 2 * P(X <= min(a_only, b_only)))`` with ``X ~ Binomial(a_only + b_only, 1/2)``.
    The exact form rather than the chi-squared approximation because eval sets here can be small.

    Args:
        a: per-question verdicts of method A (truthy = correct), in the shared question order.
        b: the same for method B; must have the same length.

    Returns:
        ``{"n": questions compared, "a_only": A right and B wrong, "b_only": B right and A wrong,
        "discordant": a_only + b_only, "p_value": float}``; ``p_value`` is 1.0 with no discordant pairs.
    """
    if len(a) != len(b):
        raise ValueError(f"paired verdicts must have the same length, got {len(a)} and {len(b)}")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    n_disc = a_only + b_only
    if n_disc == 0:
        p_value = 1.0
    else:
        k = min(a_only, b_only)
        # math.comb is exact integer arithmetic, so the tail is exact up to the final division.
        tail = sum(math.comb(n_disc, i) for i in range(k + 1)) / 2**n_disc
        p_value = min(1.0, 2.0 * tail)
    return {"n": len(a), "a_only": a_only, "b_only": b_only, "discordant": n_disc, "p_value": p_value}


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], n_resamples: int = 2000, seed: int = 0
) -> dict[str, float | int]:
    """Paired bootstrap of the difference of means ``mean(a) - mean(b)`` with a 95% percentile interval.

    Questions are resampled with replacement as pairs (the same indices for a and b), so the question
    difficulty cancels out; this is what makes it a paired comparison.

    Args:
        a: per-question values of method A (bools count as 0/1).
        b: per-question values of method B, same length and order.
        n_resamples: number of bootstrap resamples.
        seed: seed of a private ``random.Random``, so the result is reproducible and global state untouched.

    Returns:
        ``{"n": pairs, "mean_diff": observed difference, "low": 2.5th percentile, "high": 97.5th percentile,
        "n_resamples": ..., "seed": ...}``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values must have the same length, got {len(a)} and {len(b)}")
    if not a:
        raise ValueError("paired_bootstrap needs at least one pair")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    rng = random.Random(seed)
    # rng.choices draws the n indices in one call: several times faster than a Python loop, which matters
    # for 1000-question evals and every pair of methods.
    resampled = [sum(rng.choices(diffs, k=n)) / n for _ in range(n_resamples)]
    return {
        "n": n,
        "mean_diff": sum(diffs) / n,
        "low": percentile(resampled, 2.5),
        "high": percentile(resampled, 97.5),
        "n_resamples": n_resamples,
        "seed": seed,
    }


def median(xs: Sequence[float]) -> float:
    """Median (the mean of the two middle values for an even count). Raises ValueError when empty."""
    return percentile(xs, 50.0)


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (``0 <= q <= 100``) with linear interpolation between order statistics.

    Same definition as numpy's default (``method="linear"``): position ``(n - 1) * q / 100`` in the sorted
    values. Raises ValueError for an empty sequence, because there is no honest value to return.
    """
    if not xs:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    values = sorted(float(x) for x in xs)
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return values[lo]
    frac = pos - lo
    return values[lo] + (values[hi] - values[lo]) * frac
