"""bench.stats against values worked out by hand (shown in the comments)."""

from __future__ import annotations

import pytest

from bench import stats


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
