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
    assert one["undefined"] == stats.ONE_PAIR
    same = stats.paired_t_test([0.5, 0.6], [0.5, 0.6])  # identical runs (the control arm against its start)
    assert same["p_value"] is None and same["undefined"] == stats.ZERO_SPREAD
    # Every seed exactly 0.1 apart: zero spread. Dividing by the zero standard error gave p = 0 ("significant");
    # the test is undefined there, so it has no p-value and no interval.
    shifted = stats.paired_t_test([0.6, 0.7], [0.5, 0.6])
    assert shifted["p_value"] is None and shifted["t"] is None and shifted["low"] is None
    assert shifted["undefined"] == stats.ZERO_SPREAD and shifted["mean_diff"] == pytest.approx(0.1)
    # 0.3 - 0.2 = 0.09999999999999998 and 0.8 - 0.7 = 0.10000000000000009: float rounding, not a spread.
    rounded = stats.paired_t_test([0.3, 0.8], [0.2, 0.7])
    assert rounded["p_value"] is None and rounded["undefined"] == stats.ZERO_SPREAD
    # The lr-0 control (seed-invariant) against a method that lands on the same score every seed: 2 questions
    # of 5,000 apart on each of 3 seeds. Holm leaves the undefined test out rather than adjusting a p of 0.
    control = stats.paired_t_test([0.4554, 0.4554, 0.4554], [0.4550, 0.4550, 0.4550])
    assert control["p_value"] is None and stats.holm_adjust([control["p_value"], 0.01]) == [None, 0.01]
    assert stats.paired_t_test([0.6, 0.5, 0.7], [0.5, 0.45, 0.55])["undefined"] is None
    with pytest.raises(ValueError):
        stats.paired_t_test([0.1, 0.2], [0.1])


def test_mean_sd() -> None:
    # [2, 4, 6]: mean 4, sd = sqrt((4 + 0 + 4) / 2) = 2.
    assert stats.mean_sd([2, 4, 6]) == (4.0, 2.0)
    assert stats.mean_sd([3]) == (3.0, None)


# --- clustered questions -------------------------------------------------------------------------------
def test_clustered_proportion_by_hand() -> None:
    # Two clusters of two questions, [right, right] and [wrong, wrong]: p = 0.5, n = 4, K = 2, y = (2, 0),
    # m = (2, 2). sum (y - p m)^2 = 1 + 1 = 2; v = K / (K - 1) * 2 / n^2 = 2 * 2 / 16 = 0.25; the binomial
    # variance is 0.25 / 4 = 0.0625, so deff = 4 and n_eff = 1. Wilson at p = 0.5, n = 1: denom = 4.8416,
    # center = 0.5, half = (1.96 / 4.8416) * sqrt(0.25 + 0.9604) = 0.4048248 * 1.1001818 = 0.4453809.
    out = stats.clustered_proportion([True, True, False, False], ["a", "a", "b", "b"])
    assert (out["n"], out["clusters"], out["correct"]) == (4, 2, 2)
    assert out["design_effect"] == pytest.approx(4.0) and out["effective_n"] == pytest.approx(1.0)
    assert out["low"] == pytest.approx(0.5 - 0.4453809, abs=1e-6)
    assert out["high"] == pytest.approx(0.5 + 0.4453809, abs=1e-6)


def test_clustered_proportion_widens_with_copies_and_is_wilson_without() -> None:
    # 100 workings asked 10 times each with identical verdicts carry the evidence of 100 questions, not 1,000.
    verdicts = [i % 3 == 0 for i in range(100)]
    copies = [v for v in verdicts for _ in range(10)]
    clusters = [i for i in range(100) for _ in range(10)]
    clustered = stats.clustered_proportion(copies, clusters)
    assert clustered["design_effect"] > 9.5
    wide = stats.wilson_interval(sum(verdicts), 100)
    assert clustered["low"] == pytest.approx(wide[0], abs=0.01) and clustered["high"] == pytest.approx(wide[1], abs=0.01)
    # One question per cluster (real GSM8K, the synthetic test split) is Wilson exactly: nothing changes.
    alone = stats.clustered_proportion(copies, list(range(1000)))
    assert (alone["low"], alone["high"]) == stats.wilson_interval(sum(copies), 1000)
    assert alone["design_effect"] == 1.0 and alone["clusters"] == 1000
    assert stats.clustered_proportion(copies)["low"] == alone["low"]
    # All right: no spread to estimate the design effect from, so each cluster counts once (n_eff = K).
    allright = stats.clustered_proportion([True] * 6, [0, 0, 0, 1, 1, 1])
    assert allright["effective_n"] == 2 and allright["low"] == pytest.approx(stats.wilson_interval(2, 2)[0])
    with pytest.raises(ValueError):
        stats.clustered_proportion([True, False], [0])


def test_clustered_mcnemar_by_hand() -> None:
    # Cluster x: A only right on 3 questions (d = 3); y: B only right on 1 (d = -1); z: A only right on 1 (d = 1);
    # w: both right on 2 (d = 0). X^2 = (3 - 1 + 1)^2 / (9 + 1 + 1) = 9 / 11 = 0.8181818; p = P(chi2_1 >= X^2)
    # = erfc(sqrt(X^2 / 2)) = erfc(0.6396021) = 0.3657...; per question (exact McNemar, 4 vs 1) p = 0.375.
    a = [True, True, True, False, True, True, True]
    b = [False, False, False, True, False, True, True]
    clusters = ["x", "x", "x", "y", "z", "w", "w"]
    out = stats.clustered_mcnemar(a, b, clusters)
    assert out["test"] == stats.CLUSTERED_MCNEMAR and out["clusters"] == 4
    assert out["statistic"] == pytest.approx(9 / 11)
    assert out["p_value"] == pytest.approx(0.3657, abs=2e-4)
    assert (out["a_only"], out["b_only"]) == (4, 1)
    # A cluster whose discordant questions cancel (one each way) carries no evidence either way.
    balanced = stats.clustered_mcnemar([True, False], [False, True], [0, 0])
    assert balanced["p_value"] == 1.0


def test_clustered_mcnemar_counts_copies_once_and_is_exact_without_clusters() -> None:
    # 10 workings where A alone is right, each asked 12 times: per question 120 vs 0 (exact p ~ 1e-36); per
    # working, 10 clusters with d_k = 12: X^2 = 120^2 / (10 * 144) = 10, p = erfc(sqrt 5) = 0.0015654.
    a = [True] * 120 + [False] * 40
    b = [False] * 120 + [False] * 40
    clusters = [i // 12 for i in range(120)] + list(range(100, 140))
    out = stats.clustered_mcnemar(a, b, clusters)
    assert out["statistic"] == pytest.approx(10.0)
    assert out["p_value"] == pytest.approx(0.0015654, abs=1e-6)
    assert stats.mcnemar_test(a, b)["p_value"] < 1e-30
    single = stats.clustered_mcnemar(a, b, list(range(160)))
    assert single["test"] == stats.EXACT_MCNEMAR and single["p_value"] == stats.mcnemar_test(a, b)["p_value"]
    assert stats.clustered_mcnemar(a, b)["p_value"] == single["p_value"]


def test_cluster_bootstrap_resamples_clusters() -> None:
    # 40 workings x 10 copies, A right on every copy of 20 of them, B on every copy of 18 (other ones):
    # the per-question bootstrap thinks it has 400 independent pairs, the cluster bootstrap 40.
    a = [(i // 10) < 20 for i in range(400)]
    b = [(i // 10) >= 22 for i in range(400)]
    clusters = [i // 10 for i in range(400)]
    by_cluster = stats.cluster_bootstrap(a, b, clusters)
    by_question = stats.paired_bootstrap(a, b)
    assert by_cluster["mean_diff"] == pytest.approx(by_question["mean_diff"]) == pytest.approx(0.05)
    assert by_cluster["clusters"] == 40
    assert (by_cluster["high"] - by_cluster["low"]) > 2.5 * (by_question["high"] - by_question["low"])
    assert stats.cluster_bootstrap(a, b, clusters) == by_cluster  # seeded: reproducible
    # One question per cluster: the per-question bootstrap, number for number.
    single = stats.cluster_bootstrap(a, b, list(range(400)))
    assert {k: single[k] for k in by_question} == by_question and single["clusters"] == 400
