"""Small statistics for the report: intervals, paired tests, percentiles.

Pure Python (``math``) except the bootstrap, which draws its resample counts with numpy (a
dependency of pandas, which the report needs anyway): the report must rebuild on a laptop from a results
folder, so nothing here may pull in torch or scipy. Every function is checked against hand-worked
values in ``tests/test_stats.py``.

Questions that share a cluster (the same synthetic working asked under other names) are not independent: the
clustered functions (`clustered_proportion`, `clustered_mcnemar`, `cluster_bootstrap`) take a label per question
and treat each cluster as one unit; without shared labels they return their per-question counterparts' values.
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


# --- clustered questions ---------------------------------------------------------------------------------
# Questions are not always independent: the synthetic task can ask one working (the same operations, operands and
# results) under several names, and a model that gets one right gets the others right too. Verdicts within such a
# cluster agree, so a per-question interval or test counts the same evidence several times. Every function below
# takes a cluster label per question; when no cluster holds more than one question (real GSM8K: one question per
# problem; the synthetic test split: one question per working) each returns exactly what its per-question
# counterpart returns, so nothing changes where there is nothing to correct.
def cluster_count(clusters: Sequence[object]) -> int:
    """The number of distinct cluster labels."""
    return len(set(clusters))


def has_clusters(clusters: Sequence[object] | None) -> bool:
    """True when ``clusters`` is given and some label is shared by two or more questions."""
    return clusters is not None and len(set(clusters)) < len(clusters)


def _check_clusters(n: int, clusters: Sequence[object]) -> None:
    if len(clusters) != n:
        raise ValueError(f"need one cluster label per question, got {len(clusters)} labels for {n} questions")


def clustered_proportion(values: Sequence[bool], clusters: Sequence[object] | None = None,
                         z: float = 1.96) -> dict[str, float | int]:
    """A proportion with a 95% interval that respects clusters: Wilson at the effective sample size.

    ``p = sum(values) / n``. Its cluster-robust (ratio-estimator) variance is
    ``v = K / (K - 1) * sum_k (y_k - p m_k)^2 / n^2`` over the K clusters (``y_k`` correct of ``m_k`` questions);
    the design effect is ``deff = v / (p (1 - p) / n)``, floored at 1 (clustering never makes an interval
    narrower than the per-question one), and the interval is Wilson's at ``n_eff = n / deff`` (Korn and Graubard
    1998). At p = 0 or 1 there is no spread to estimate ``deff`` from, so ``n_eff`` is K (each cluster one
    observation, the conservative choice); with one cluster it is 1.

    Without clusters (``clusters`` None, or every label distinct) this is `wilson_interval` exactly, with
    ``design_effect`` 1. Returns ``{"n", "clusters", "correct", "accuracy", "low", "high", "design_effect",
    "effective_n"}``.
    """
    n = len(values)
    correct = sum(1 for v in values if v)
    if clusters is not None:
        _check_clusters(n, clusters)
    k = n if clusters is None else cluster_count(clusters)
    out: dict[str, float | int] = {"n": n, "clusters": k, "correct": correct,
                                   "accuracy": correct / n if n else 0.0, "design_effect": 1.0, "effective_n": n}
    if not has_clusters(clusters):
        out["low"], out["high"] = wilson_interval(correct, n, z)
        return out
    p = correct / n
    totals: dict[object, list[int]] = {}
    for v, c in zip(values, clusters):
        entry = totals.setdefault(c, [0, 0])
        entry[0] += 1 if v else 0
        entry[1] += 1
    if k < 2:
        n_eff = 1.0
    elif p in (0.0, 1.0):
        n_eff = float(k)
    else:
        v = k / (k - 1) * sum((y - p * m) ** 2 for y, m in totals.values()) / (n * n)
        deff = max(1.0, v / (p * (1 - p) / n))
        n_eff = n / deff
    out["design_effect"] = n / n_eff
    out["effective_n"] = n_eff
    out["low"], out["high"] = _wilson_at(p, n_eff, z)
    return out


def _wilson_at(p: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """`wilson_interval` for a proportion ``p`` over a (possibly fractional) effective ``n`` > 0."""
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (min(p, max(0.0, center - half)), max(p, min(1.0, center + half)))


def clustered_mcnemar(a: Sequence[bool], b: Sequence[bool], clusters: Sequence[object] | None = None
                      ) -> dict[str, float | int | str]:
    """A paired test of two methods on the same questions that respects clusters.

    Without clusters: `mcnemar_test` (exact) unchanged, ``test`` = "McNemar (exact)". With clusters: the
    adjusted McNemar test for clustered matched pairs of Durkalski, Palesch, Lipsitz and Rust (Statistics in
    Medicine 22, 2003): with ``d_k`` = (A right, B wrong) minus (B right, A wrong) in cluster k,
    ``X^2 = (sum_k d_k)^2 / sum_k d_k^2`` against chi-squared with 1 degree of freedom. Every cluster is one
    unit, so twelve copies of one working count once; with one question per cluster ``sum d_k^2`` is the number
    of discordant questions and ``X^2`` is McNemar's own chi-squared statistic. Returns `mcnemar_test`'s keys and
    ``test``, ``clusters`` (K) and ``statistic`` (X^2; absent for the exact test).
    """
    out: dict[str, float | int | str] = dict(mcnemar_test(a, b))
    if clusters is not None:
        _check_clusters(len(a), clusters)
    out["clusters"] = len(a) if clusters is None else cluster_count(clusters)
    if not has_clusters(clusters):
        out["test"] = EXACT_MCNEMAR
        return out
    diffs: dict[object, int] = {}
    for x, y, c in zip(a, b, clusters):
        diffs[c] = diffs.get(c, 0) + (1 if x and not y else -1 if y and not x else 0)
    numerator = float(sum(diffs.values())) ** 2
    denominator = float(sum(d * d for d in diffs.values()))
    statistic = numerator / denominator if denominator else 0.0
    # P(chi2_1 >= x) = P(|Z| >= sqrt x) = erfc(sqrt(x / 2)).
    out.update(test=CLUSTERED_MCNEMAR, statistic=statistic,
               p_value=1.0 if denominator == 0 else min(1.0, math.erfc(math.sqrt(statistic / 2.0))))
    return out


EXACT_MCNEMAR = "McNemar (exact)"
CLUSTERED_MCNEMAR = "clustered McNemar (Durkalski 2003)"
"""The two names :func:`clustered_mcnemar` gives its test (``test``), for the report's tables."""


def cluster_bootstrap(a: Sequence[float], b: Sequence[float], clusters: Sequence[object] | None = None,
                      n_resamples: int = 2000, seed: int = 0) -> dict[str, float | int]:
    """Paired bootstrap of ``mean(a) - mean(b)`` that resamples clusters, not questions.

    Without clusters: `paired_bootstrap` unchanged. With clusters: K clusters are drawn with replacement (the same
    draw for a and b, so it stays paired) and each resample's difference is ``sum of the drawn clusters' (a - b) /
    their questions`` (the ratio estimator, since clusters differ in size); the interval is the 2.5th to 97.5th
    percentile. Returns `paired_bootstrap`'s keys and ``clusters`` (K).
    """
    if clusters is not None:
        _check_clusters(len(a), clusters)
    if not has_clusters(clusters):
        out = dict(paired_bootstrap(a, b, n_resamples, seed))
        out["clusters"] = out["n"]
        return out
    if len(a) != len(b):
        raise ValueError(f"paired values must have the same length, got {len(a)} and {len(b)}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    import numpy as np  # lazy, as in paired_bootstrap

    sums: dict[object, list[float]] = {}
    for x, y, c in zip(a, b, clusters):
        entry = sums.setdefault(c, [0.0, 0.0])
        entry[0] += float(x) - float(y)
        entry[1] += 1.0
    d = np.array([v[0] for v in sums.values()])
    m = np.array([v[1] for v in sums.values()])
    k = len(d)
    rng = np.random.default_rng(seed)
    resampled: list[float] = []
    for start in range(0, n_resamples, 250):  # chunks keep the (resamples x clusters) count matrix small
        counts = rng.multinomial(k, np.full(k, 1.0 / k), size=min(250, n_resamples - start))
        resampled += (counts @ d / (counts @ m)).tolist()
    return {"n": len(a), "clusters": k, "mean_diff": float(d.sum() / m.sum()),
            "low": percentile(resampled, 2.5), "high": percentile(resampled, 97.5),
            "n_resamples": n_resamples, "seed": seed}


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


ONE_PAIR = "one pair (no spread to test against)"
ZERO_SPREAD = "zero spread across seeds (every paired difference is the same, so the standard error is 0)"
"""Why :func:`paired_t_test` is undefined: its ``undefined`` field, printed as is by the report."""


def paired_t_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95
                  ) -> dict[str, float | int | str | None]:
    """Paired t-test of ``mean(a - b) = 0`` over matched units (here: seeds), two-sided.

    ``t = mean(d) / (sd(d) / sqrt(n))`` with ``n - 1`` degrees of freedom; the interval is
    ``mean(d) ± t_{(1+confidence)/2, n-1} * sd(d) / sqrt(n)``. Seeds are the unit because seed-to-seed
    variation (sampling during training, data order) is what the per-question tests leave out.

    Returns:
        ``{"n", "df", "mean_diff", "sd_diff", "t", "p_value", "low", "high", "undefined"}``. ``undefined`` is None
        when the test ran, else why it cannot: with fewer than two pairs there is no spread to test against
        ("one pair"); when every difference is the same (``sd_diff`` 0 up to float rounding: both methods land
        on the same scores every seed, e.g. the lr-0 control against a seed-invariant method) the standard error
        is zero and t = mean / 0 is no evidence of anything ("zero spread across seeds"). In both cases t, p and
        the interval are None, so Holm leaves the pair out and nothing calls it significant.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values must have the same length, got {len(a)} and {len(b)}")
    if not a:
        raise ValueError("paired_t_test needs at least one pair")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    mean, sd = mean_sd(diffs)
    out: dict[str, float | int | str | None] = {"n": n, "df": n - 1, "mean_diff": mean, "sd_diff": sd,
                                                "t": None, "p_value": None, "low": None, "high": None,
                                                "undefined": None}
    if sd is None:
        out["undefined"] = ONE_PAIR
        return out
    if sd <= 1e-12 * max(1.0, abs(mean)):  # equal differences up to float rounding (0.3 - 0.2 vs 0.8 - 0.7)
        out.update(sd_diff=0.0, undefined=ZERO_SPREAD)
        return out
    se = sd / math.sqrt(n)
    t = mean / se
    half = student_t_quantile((1.0 + confidence) / 2.0, n - 1) * se
    out.update(t=t, p_value=min(1.0, 2.0 * student_t_cdf(-abs(t), n - 1)), low=mean - half, high=mean + half)
    return out


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float | str | None]:
    """Welch's two-sample t-test of ``mean(a) = mean(b)``, two-sided, for unpaired measurements (seconds per step
    or peak bytes of two methods' seeds: the seeds of two methods are not matched on these).

    ``t = (mean(a) - mean(b)) / sqrt(s_a^2 / n_a + s_b^2 / n_b)`` with the Welch-Satterthwaite degrees of freedom
    ``(s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1))``. Returns ``{"mean_diff",
    "t", "df", "p_value", "undefined"}`` in the values' unit; ``undefined`` says why there is no test (a group of one
    value has no spread; two groups with no spread at all have a standard error of 0), and then t, df and p are
    None, so nothing reads the pair as separated.
    """
    if not a or not b:
        raise ValueError("welch_t_test needs at least one value in each group")
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    out: dict[str, float | str | None] = {"mean_diff": ma - mb, "t": None, "df": None, "p_value": None,
                                          "undefined": None}
    if sa is None or sb is None:
        out["undefined"] = ONE_VALUE
        return out
    va, vb = sa * sa / len(a), sb * sb / len(b)
    if va + vb <= (1e-12 * max(1.0, abs(ma), abs(mb))) ** 2:
        out["undefined"] = NO_SPREAD
        return out
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    t = (ma - mb) / math.sqrt(va + vb)
    out.update(t=t, df=df, p_value=min(1.0, 2.0 * student_t_cdf(-abs(t), df)))
    return out


ONE_VALUE = "a single value in a group (no spread to test against)"
NO_SPREAD = "no spread in either group (every value the same, so the standard error is 0)"
"""Why :func:`welch_t_test` is undefined: its ``undefined`` field."""


def holm_family(tests: list[dict], name: str) -> list[dict]:
    """Holm-adjust one family of tests in place and name it: each test gets ``p_holm`` (`holm_adjust` of the
    family's ``p_value``; a test without one stays None and is not counted), ``family`` (``name``) and
    ``family_size`` (m, the tests with a p-value, adjusted together). Returns ``tests``.

    One comparison belongs to one family: a caller builds each family from comparisons no other family holds, so
    a difference is never adjusted twice, against two different m.
    """
    size = sum(t.get("p_value") is not None for t in tests)
    for test, adjusted in zip(tests, holm_adjust([t.get("p_value") for t in tests])):
        test.update(p_holm=adjusted, family=name, family_size=size)
    return tests
