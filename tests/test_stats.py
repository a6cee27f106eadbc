"""gpubench.util.stats on synthetic round times with known effects (seeded)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpubench.util.stats import (
    bootstrap_ratio_ci,
    can_reach_significance,
    compare_independent,
    compare_paired,
    mann_whitney_p,
    min_mann_whitney_p,
    paired_ratio_ci,
    per_round_ratios,
    wilcoxon_paired_p,
)

NOISE = 0.03  # 3% round-to-round spread (log-normal)


def _rounds(rng, n, scale=1.0):
    return scale * np.exp(rng.normal(0, NOISE, n))


@pytest.mark.parametrize("compare", [compare_independent, compare_paired])
def test_known_ten_percent_slowdown_is_detected(compare):
    rng = np.random.default_rng(0)
    for trial in range(20):
        base, slow = _rounds(rng, 15), _rounds(rng, 15, 1.10)
        est = compare(base, slow, seed=trial)
        assert est.ratio == pytest.approx(1 / 1.10, rel=0.03)
        assert est.high < 1 and est.p_value < 0.05  # b is slower: speed ratio below 1


@pytest.mark.parametrize("compare", [compare_independent, compare_paired])
def test_equal_distributions_give_an_interval_containing_one_most_of_the_time(compare):
    rng = np.random.default_rng(1)
    trials = 100
    contains = sum(compare(_rounds(rng, 15), _rounds(rng, 15), seed=t).contains(1.0)
                   for t in range(trials))
    assert contains >= 0.88 * trials  # nominal 95%


def test_paired_rounds_cancel_drift_that_separate_cases_mistake_for_an_effect():
    rng = np.random.default_rng(2)
    n = 20
    # The machine slows down 30% over the run. Separately measured, the technique (a no-op)
    # runs in the second half; in alternation, each of its rounds sits next to a base round.
    drift = np.linspace(1.0, 1.3, 2 * n)
    base_sep, new_sep = _rounds(rng, n) * drift[:n], _rounds(rng, n) * drift[n:]
    separate = compare_independent(base_sep, new_sep)
    assert separate.high < 1 and separate.p_value < 0.05  # a spurious slowdown
    base_alt, new_alt = _rounds(rng, n) * drift[0::2], _rounds(rng, n) * drift[1::2]
    paired = compare_paired(base_alt, new_alt)
    assert paired.contains(1.0) and abs(paired.ratio - 1) < 0.03
    assert paired.p_value > 0.05


def test_intervals_are_reproducible_and_bracket_the_estimate():
    rng = np.random.default_rng(3)
    a, b = _rounds(rng, 12), _rounds(rng, 12, 0.8)
    assert bootstrap_ratio_ci(a, b, seed=7) == bootstrap_ratio_ci(a, b, seed=7)
    est = compare_independent(a, b)
    assert est.low <= est.ratio <= est.high
    assert est.ratio == pytest.approx(np.median(a) / np.median(b))
    paired = compare_paired(a, b)
    assert paired.ratio == pytest.approx(np.median(a / b))
    assert paired.low <= paired.ratio <= paired.high
    assert paired_ratio_ci(a, b) == (paired.low, paired.high)


def test_intervals_are_scipy_bootstrap_paired_where_rounds_are_paired():
    """The intervals are ``scipy.stats.bootstrap``'s (percentile, seeded): independent samples
    each resampled on its own, paired rounds resampled as pairs (``paired=True``)."""
    from scipy import stats

    rng = np.random.default_rng(5)
    a, b = _rounds(rng, 10), _rounds(rng, 10, 0.9)
    common = {"vectorized": True, "axis": -1, "n_resamples": 500, "confidence_level": 0.95,
              "method": "percentile"}
    paired = stats.bootstrap((a, b), lambda x, y, axis=-1: np.median(x / y, axis=axis),
                             paired=True, rng=np.random.default_rng(4), **common)
    assert paired_ratio_ci(a, b, n_resamples=500, seed=4) == pytest.approx(
        (paired.confidence_interval.low, paired.confidence_interval.high))
    separate = stats.bootstrap(
        (a, b), lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
        paired=False, rng=np.random.default_rng(4), **common)
    assert bootstrap_ratio_ci(a, b, n_resamples=500, seed=4) == pytest.approx(
        (separate.confidence_interval.low, separate.confidence_interval.high))


def test_degenerate_samples():
    assert bootstrap_ratio_ci([2.0], [1.0]) == (2.0, 2.0)
    low, high = bootstrap_ratio_ci([2.0], [1.0, 1.0, 1.0])
    assert low == high == 2.0
    low, high = bootstrap_ratio_ci([1.0, 2.0, 3.0], [1.0])
    assert 1.0 <= low <= high <= 3.0
    assert all(np.isnan(bootstrap_ratio_ci([], [1.0])))
    assert bootstrap_ratio_ci([1.0] * 5, [1.0] * 5) == (1.0, 1.0)
    assert mann_whitney_p([1.0], [2.0, 3.0]) == 1.0
    assert wilcoxon_paired_p([1.0, 1.0], [1.0, 1.0]) == 1.0
    with pytest.raises(ValueError):
        per_round_ratios([1.0, 2.0], [1.0])


def test_mann_whitney_floor_with_few_rounds():
    assert min_mann_whitney_p(3, 3) == pytest.approx(0.1)  # 2 / C(6, 3)
    assert not can_reach_significance(3, 3)
    assert can_reach_significance(5, 5)  # 2 / 252
    # Complete separation reaches the floor exactly.
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(min_mann_whitney_p(3, 3))


def test_robust_spread_is_the_unchanged_cases_spread():
    """The spread of 200 log-normal changes of sigma 5% is 5%, and stays near it when a fifth
    of the cases really changed by +50% (where the standard deviation more than doubles)."""
    from gpubench.util.stats import robust_spread

    rng = np.random.default_rng(0)
    changes = np.expm1(rng.normal(0, 0.05, 200))
    assert robust_spread(changes) == pytest.approx(0.05, rel=0.15)
    changes[:40] = 0.5
    assert robust_spread(changes) < 0.08 < 2 * 0.05 < np.std(np.log1p(changes))
    assert math.isnan(robust_spread([0.1]))


def test_a_paired_interval_of_the_totals_sees_a_cost_that_lands_in_few_rounds():
    """A cost in one round of five (a sampler's tick): the median per-round ratio does not see
    it, the ratio of the totals does, and its paired interval brackets it."""
    rng = np.random.default_rng(9)
    off = 0.02 * np.exp(rng.normal(0, 0.002, 40))
    on = off * np.exp(rng.normal(0, 0.002, 40))
    on[::5] += 0.002  # 10% of a step, every fifth round
    low, high = paired_ratio_ci(on, off, of="total")
    total = on.sum() / off.sum()
    assert 1.0 < low <= total <= high
    _, median_high = paired_ratio_ci(on, off)
    assert median_high < 1.005 < low
    with pytest.raises(ValueError, match="of must be one of median, total; got 'mean'"):
        paired_ratio_ci(on, off, of="mean")
