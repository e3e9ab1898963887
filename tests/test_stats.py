"""bench.scoring.stats against values worked out by hand (shown in the comments)."""

from __future__ import annotations

import pytest

from bench.scoring import stats


# --- Wilson interval -----------------------------------------------------------------------------------
# 5/10, z = 1.96: z^2 = 3.8416, denom = 1 + 3.8416/10 = 1.38416, center = (0.5 + 0.19208)/1.38416 = 0.5,
# half = (1.96/1.38416) * sqrt(0.25/10 + 3.8416/400) = 1.4160212 * sqrt(0.034604) = 0.2634099.
def test_wilson_half() -> None:
    low, high = stats.wilson_interval(5, 10)
    assert low == pytest.approx(0.5 - 0.2634099, abs=1e-6)
    assert high == pytest.approx(0.5 + 0.2634099, abs=1e-6)


# 0/10: center = 0.19208/1.38416 = 0.1387701, half = 1.4160212 * sqrt(0.009604) = 1.4160212 * 0.098
# = 0.1387701, so (0, 0.2775402). 10/10 is the mirror image.
def test_wilson_extremes_stay_in_unit_interval() -> None:
    low, high = stats.wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775402, abs=1e-6)
    low, high = stats.wilson_interval(10, 10)
    assert low == pytest.approx(1 - 0.2775402, abs=1e-6)
    assert high == 1.0


def test_wilson_empty_is_whole_range_and_bad_input_raises() -> None:
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        stats.wilson_interval(3, 2)
    with pytest.raises(ValueError):
        stats.wilson_interval(-1, 2)


def test_wilson_z_widens() -> None:
    narrow = stats.wilson_interval(30, 100, z=1.0)
    wide = stats.wilson_interval(30, 100, z=2.576)
    assert wide[0] < narrow[0] < 0.3 < narrow[1] < wide[1]


# --- McNemar -------------------------------------------------------------------------------------------
def _pairs(both: int, a_only: int, b_only: int, neither: int) -> tuple[list[bool], list[bool]]:
    a = [True] * both + [True] * a_only + [False] * b_only + [False] * neither
    b = [True] * both + [False] * a_only + [True] * b_only + [False] * neither
    return a, b


def test_mcnemar_exact_p() -> None:
    # Discordant 1 vs 7: n = 8, P(X <= 1) = (1 + 8) / 256, two-sided = 18/256 = 0.0703125.
    a, b = _pairs(both=10, a_only=1, b_only=7, neither=4)
    out = stats.mcnemar_test(a, b)
    assert out["n"] == 22
    assert out["a_only"] == 1 and out["b_only"] == 7 and out["discordant"] == 8
    assert out["p_value"] == pytest.approx(18 / 256)


def test_mcnemar_one_sided_all_discordant() -> None:
    # 5 vs 0: P(X <= 0) = 1/32, two-sided 2/32 = 0.0625 (symmetric in a and b).
    a, b = _pairs(both=0, a_only=5, b_only=0, neither=0)
    assert stats.mcnemar_test(a, b)["p_value"] == pytest.approx(0.0625)
    assert stats.mcnemar_test(b, a)["p_value"] == pytest.approx(0.0625)


def test_mcnemar_balanced_and_no_discordance_cap_at_one() -> None:
    # 3 vs 3: 2 * (1 + 6 + 15 + 20) / 64 = 1.3125 -> capped at 1.
    a, b = _pairs(both=2, a_only=3, b_only=3, neither=1)
    assert stats.mcnemar_test(a, b)["p_value"] == 1.0
    a, b = _pairs(both=4, a_only=0, b_only=0, neither=4)
    out = stats.mcnemar_test(a, b)
    assert out["p_value"] == 1.0 and out["discordant"] == 0


def test_mcnemar_length_mismatch() -> None:
    with pytest.raises(ValueError):
        stats.mcnemar_test([True, False], [True])


# --- paired bootstrap ----------------------------------------------------------------------------------
def test_bootstrap_degenerate_differences() -> None:
    out = stats.paired_bootstrap([1, 1, 1, 1, 1], [0, 0, 0, 0, 0], n_resamples=200)
    assert out["mean_diff"] == 1.0 and out["low"] == 1.0 and out["high"] == 1.0 and out["n"] == 5
    same = stats.paired_bootstrap([True, False, True], [True, False, True], n_resamples=200)
    assert same["mean_diff"] == 0.0 and same["low"] == 0.0 and same["high"] == 0.0


def test_bootstrap_two_pairs_interval() -> None:
    # Differences [1, 0]: a resample mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so with 2000
    # resamples the 2.5th percentile is 0 and the 97.5th is 1; the observed difference is 0.5.
    out = stats.paired_bootstrap([True, True], [False, True], n_resamples=2000, seed=3)
    assert out["mean_diff"] == 0.5
    assert out["low"] == 0.0 and out["high"] == 1.0


def test_bootstrap_reproducible_and_validates() -> None:
    a = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    b = [0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
    first = stats.paired_bootstrap(a, b, n_resamples=500, seed=7)
    assert first == stats.paired_bootstrap(a, b, n_resamples=500, seed=7)
    assert first["mean_diff"] == pytest.approx(0.4)
    assert first["low"] <= 0.4 <= first["high"]
    with pytest.raises(ValueError):
        stats.paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError):
        stats.paired_bootstrap([], [])


# --- median / percentile -------------------------------------------------------------------------------
def test_median() -> None:
    assert stats.median([3, 1, 2]) == 2.0
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median([7]) == 7.0
    with pytest.raises(ValueError):
        stats.median([])


def test_percentile_linear_interpolation() -> None:
    xs = [15, 20, 35, 40, 50]
    assert stats.percentile(xs, 0) == 15.0
    assert stats.percentile(xs, 100) == 50.0
    # position (5 - 1) * 0.4 = 1.6 -> 20 + 0.6 * (35 - 20) = 29
    assert stats.percentile(xs, 40) == pytest.approx(29.0)
    # [1, 2, 3, 4], q = 90: position 2.7 -> 3 + 0.7 = 3.7
    assert stats.percentile([4, 3, 2, 1], 90) == pytest.approx(3.7)
    with pytest.raises(ValueError):
        stats.percentile(xs, 101)
    with pytest.raises(ValueError):
        stats.percentile([], 50)


# --- Holm adjustment -----------------------------------------------------------------------------------
def test_holm_adjust_by_hand() -> None:
    # m = 4. Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to the running
    # maximum 0.06 (step-down keeps the order). Back in input order: [0.03, 0.06, 0.06, 0.02].
    assert stats.holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # Capped at 1: 0.4 x 3 = 1.2 -> 1; 0.5 x 2 = 1.0; 0.9 x 1 = 0.9 -> running max 1.0.
    assert stats.holm_adjust([0.5, 0.4, 0.9]) == [1.0, 1.0, 1.0]
    # None (a test that could not run) stays None and is not counted: m = 2, 0.02 x 2 = 0.04, 0.03 x 1 -> 0.04.
    assert stats.holm_adjust([0.03, None, 0.02]) == pytest.approx([0.04, None, 0.04])
    assert stats.holm_adjust([]) == []
    assert stats.holm_adjust([0.2]) == [0.2]  # a family of one is not adjusted
    with pytest.raises(ValueError):
        stats.holm_adjust([1.5])


# --- Student t -----------------------------------------------------------------------------------------
def test_student_t_cdf_against_closed_forms() -> None:
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/pi; F(1) = 0.75.
    assert stats.student_t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)); F(1) = 1/2 + 1/(2 sqrt 3) = 0.7886751345948129.
    assert stats.student_t_cdf(1.0, 2) == pytest.approx(0.7886751345948129, abs=1e-12)
    assert stats.student_t_cdf(-1.0, 2) == pytest.approx(1 - 0.7886751345948129, abs=1e-12)
    assert stats.student_t_cdf(0.0, 7) == pytest.approx(0.5)
    assert stats.student_t_cdf(float("inf"), 3) == 1.0 and stats.student_t_cdf(float("-inf"), 3) == 0.0
    # Large df approaches the normal: F(1.96) -> 0.9750021.
    assert stats.student_t_cdf(1.96, 1e6) == pytest.approx(0.9750021, abs=1e-6)


def test_student_t_quantiles_match_tables() -> None:
    # Two-sided 5% critical values from any t table: df 1 -> 12.706, 2 -> 4.303, 4 -> 2.776, 30 -> 2.042.
    # df = 2 in closed form: u = 2q - 1 = 0.95, t = u sqrt(2 / (1 - u^2)) = 4.302653.
    assert stats.student_t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert stats.student_t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert stats.student_t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert stats.student_t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert stats.student_t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=1e-4)


def test_paired_t_test_by_hand() -> None:
    # Seeds' accuracies A = [0.6, 0.5, 0.7], B = [0.5, 0.45, 0.55]: d = [0.1, 0.05, 0.15], mean 0.1,
    # sd = sqrt((0 + 0.0025 + 0.0025) / 2) = 0.05, se = 0.05 / sqrt 3 = 0.0288675, t = 3.4641016, df = 2.
    # df = 2 CDF: 1/2 + t / (2 sqrt(2 + t^2)) = 1/2 + 3.4641016 / 7.4833148 = 0.9629100; p = 2 (1 - F) = 0.0741799.
    # Interval: 0.1 ± 4.302653 x 0.0288675 = 0.1 ± 0.1242069.
    out = stats.paired_t_test([0.6, 0.5, 0.7], [0.5, 0.45, 0.55])
    assert (out["n"], out["df"]) == (3, 2)
    assert out["mean_diff"] == pytest.approx(0.1) and out["sd_diff"] == pytest.approx(0.05)
    assert out["t"] == pytest.approx(3.4641016, abs=1e-6)
    assert out["p_value"] == pytest.approx(0.0741799, abs=1e-6)
    assert out["low"] == pytest.approx(0.1 - 0.1242069, abs=1e-6)
    assert out["high"] == pytest.approx(0.1 + 0.1242069, abs=1e-6)


def test_paired_t_test_degenerate_cases() -> None:
    one = stats.paired_t_test([0.6], [0.5])  # one seed: a difference but no spread to judge it by
    assert one["mean_diff"] == pytest.approx(0.1) and one["p_value"] is None and one["t"] is None
    same = stats.paired_t_test([0.5, 0.6], [0.5, 0.6])  # identical runs (the control arm against its start)
    assert same["p_value"] == 1.0 and same["low"] == same["high"] == 0.0
    shifted = stats.paired_t_test([0.6, 0.7], [0.5, 0.6])  # every seed exactly 0.1 apart: zero spread
    assert shifted["p_value"] == 0.0 and shifted["t"] == float("inf")
    # 0.3 - 0.2 = 0.09999999999999998 and 0.8 - 0.7 = 0.10000000000000009: float rounding, not a spread.
    rounded = stats.paired_t_test([0.3, 0.8], [0.2, 0.7])
    assert rounded["p_value"] == 0.0 and rounded["low"] == rounded["high"]
    with pytest.raises(ValueError):
        stats.paired_t_test([0.1, 0.2], [0.1])


def test_mean_sd() -> None:
    # [2, 4, 6]: mean 4, sd = sqrt((4 + 0 + 4) / 2) = 2.
    assert stats.mean_sd([2, 4, 6]) == (4.0, 2.0)
    assert stats.mean_sd([3]) == (3.0, None)
