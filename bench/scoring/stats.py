"""Small statistics for the report: intervals, paired tests, percentiles.

Pure Python (``math``) except the bootstrap, which draws its resample counts with numpy (a
dependency of pandas, which the report needs anyway): the report must rebuild on a laptop from a results
folder, so nothing here may pull in torch or scipy. Every function is checked against hand-worked
values in ``tests/test_stats.py``.
"""

from __future__ import annotations

import math
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
        seed: seed of a private ``numpy.random.Generator``, so the result is reproducible and global state untouched.

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
    import numpy as np  # lazy: only the bootstrap needs it (it comes with pandas, which the report uses anyway)

    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    # A resample's mean depends only on how many times each distinct difference is drawn, and those counts are
    # multinomial(n, observed shares): drawing the counts is the same bootstrap as drawing n indices, in
    # O(distinct values) per resample instead of O(n). Per-question verdicts give 3 values (-1, 0, +1), so a
    # 5,000-question comparison costs microseconds instead of seconds, and a report compares dozens of pairs.
    values: dict[float, int] = {}
    for d in diffs:
        values[d] = values.get(d, 0) + 1
    distinct = np.array(list(values), dtype=float)
    shares = np.array(list(values.values()), dtype=float) / n
    counts = np.random.default_rng(seed).multinomial(n, shares, size=n_resamples)
    resampled = (counts @ distinct / n).tolist()
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


def holm_adjust(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values, returned in the input order.

    Sort the m p-values ascending; the i-th smallest (1-based) becomes ``min(1, (m - i + 1) * p)``, then each
    adjusted value is raised to the largest adjusted value before it, so the order is kept (the step-down rule:
    once one test fails to reject, every larger p-value fails too). Rejecting where the adjusted value is below
    alpha controls the family-wise error rate at alpha under any dependence between the tests, which is why it
    fits pairwise comparisons that share runs. ``None`` entries (a test that could not be run) stay None and are
    not counted in m.
    """
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    for p, _ in present:
        if not 0.0 <= p <= 1.0 or math.isnan(p):
            raise ValueError(f"p-values must be in [0, 1], got {p}")
    m = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' betacf)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``0 <= x <= 1``, ``a, b > 0``.

    The continued fraction converges fast for ``x < (a + 1) / (a + b + 2)``; above that the symmetry
    ``I_x(a, b) = 1 - I_{1-x}(b, a)`` is used. Accurate to about 1e-13 in the tests' range.
    """
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be > 0, got a={a}, b={b}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom (pure Python, via the incomplete beta).

    With ``x = df / (df + t^2)``, the two-sided tail ``P(|T| >= |t|)`` is ``I_x(df / 2, 1 / 2)``, so the CDF is
    ``1 - I_x / 2`` for ``t >= 0`` and ``I_x / 2`` below. Infinite ``t`` gives 0 or 1.
    """
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = regularized_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail / 2.0 if t >= 0 else tail / 2.0


def student_t_quantile(q: float, df: float) -> float:
    """The ``t`` with ``student_t_cdf(t, df) == q`` (``0 < q < 1``), by bisection on the CDF (monotone)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    low, high = -1.0, 1.0
    while student_t_cdf(low, df) > q:
        low *= 2.0
    while student_t_cdf(high, df) < q:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if student_t_cdf(mid, df) < q:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, abs(mid)):
            break
    return (low + high) / 2.0


def mean_sd(xs: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1 in the denominator; None for a single value)."""
    if not xs:
        raise ValueError("mean_sd of an empty sequence")
    n = len(xs)
    mean = sum(float(x) for x in xs) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((float(x) - mean) ** 2 for x in xs) / (n - 1))


def paired_t_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict[str, float | int | None]:
    """Paired t-test of ``mean(a - b) = 0`` over matched units (here: seeds), two-sided.

    ``t = mean(d) / (sd(d) / sqrt(n))`` with ``n - 1`` degrees of freedom; the interval is
    ``mean(d) ± t_{(1+confidence)/2, n-1} * sd(d) / sqrt(n)``. Seeds are the unit because seed-to-seed
    variation (sampling during training, data order) is what the per-question tests leave out.

    Returns:
        ``{"n", "df", "mean_diff", "sd_diff", "t", "p_value", "low", "high"}``. With fewer than two pairs there
        is no spread to test against: t, p and the interval are None. When every difference is the same, the
        spread is zero: p is 1.0 if that difference is 0, else 0.0 (t = ±inf), and the interval is the point.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values must have the same length, got {len(a)} and {len(b)}")
    if not a:
        raise ValueError("paired_t_test needs at least one pair")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    mean, sd = mean_sd(diffs)
    out: dict[str, float | int | None] = {"n": n, "df": n - 1, "mean_diff": mean, "sd_diff": sd,
                                          "t": None, "p_value": None, "low": None, "high": None}
    if sd is None:
        return out
    if sd <= 1e-12 * max(1.0, abs(mean)):  # equal differences up to float rounding (0.3 - 0.2 vs 0.8 - 0.7)
        out.update(t=0.0 if mean == 0 else math.copysign(math.inf, mean), p_value=1.0 if mean == 0 else 0.0,
                   low=mean, high=mean)
        return out
    se = sd / math.sqrt(n)
    t = mean / se
    half = student_t_quantile((1.0 + confidence) / 2.0, n - 1) * se
    out.update(t=t, p_value=min(1.0, 2.0 * student_t_cdf(-abs(t), n - 1)), low=mean - half, high=mean + half)
    return out
