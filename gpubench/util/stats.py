"""The statistics gpubench's comparisons rest on, in one place, from ``scipy.stats``.

Every comparison is of two samples of per-round times (or times per sample), ``a`` and ``b``;
the effect is the ratio ``median(a) / median(b)`` (with ``a`` the baseline's times, above 1
means ``b`` is faster). Two designs:

- *independent* samples (two cases measured one after the other): the ratio of medians, a
  percentile bootstrap interval that resamples each sample on its own
  (``scipy.stats.bootstrap``), and a two-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``);
- *paired* rounds (the two sides measured in alternation, round ``i`` of ``a`` next to round
  ``i`` of ``b``): the median of the per-round ratios ``a[i] / b[i]``, a percentile bootstrap
  interval over the rounds (pairs resampled together; ``paired_ratio_ci``'s ``of="total"``
  bounds the ratio of the totals instead, for a cost that lands in a few rounds), and a
  Wilcoxon signed-rank test of the log ratios (``scipy.stats.wilcoxon``). Machine drift slower
  than one round moves both sides of a pair alike and cancels in its ratio, which is why paired
  rounds are the drift-robust design.

Paired rounds cancel drift, not a difference between the two *processes* the sides run in (on
a shared VM, two processes running the same step can differ by several percent for their whole
lives), so ``measure.PairedBaseline`` steps an in-process case's baseline in the same process.

Bootstrap intervals are percentile intervals (BCa needs a non-degenerate jackknife, which medians
of a few rounds often lack), seeded, so the same rounds always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000

ArrayLike = Sequence[float] | np.ndarray


@dataclass(frozen=True)
class RatioEstimate:
    """``ratio`` = median(a) / median(b) (paired: median of a[i] / b[i]), its bootstrap
    interval ``low``-``high`` and the p-value of ``test`` (two-sided unless asked otherwise)."""

    ratio: float
    low: float
    high: float
    p_value: float
    test: str

    def contains(self, value: float = 1.0) -> bool:
        return self.low <= value <= self.high


def _array(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=float).ravel()


def _ratio_of_medians(a, b, axis=-1):
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def _median_ratio(a, b, axis=-1):
    return np.median(a / b, axis=axis)


def ratio_of_medians(a: ArrayLike, b: ArrayLike) -> float:
    a, b = _array(a), _array(b)
    if not a.size or not b.size:
        return math.nan
    return float(np.median(a) / np.median(b))


def _interval(data: tuple[np.ndarray, ...], statistic, *, paired: bool, confidence: float,
              n_resamples: int, seed: int) -> tuple[float, float]:
    result = stats.bootstrap(data, statistic, n_resamples=n_resamples, vectorized=True,
                             paired=paired, axis=-1, confidence_level=confidence,
                             method="percentile", rng=np.random.default_rng(seed))
    ci = result.confidence_interval
    return float(ci.low), float(ci.high)


def bootstrap_ratio_ci(a: ArrayLike, b: ArrayLike, *, confidence: float = CONFIDENCE,
                       n_resamples: int = N_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of median(a) / median(b) for two independent samples, each resampled
    on its own. A sample of one value is held fixed (it has no spread to resample); two of one
    value give the point itself; an empty one gives NaNs."""
    a, b = _array(a), _array(b)
    if not a.size or not b.size:
        return math.nan, math.nan
    kw = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    if a.size > 1 and b.size > 1:
        return _interval((a, b), _ratio_of_medians, paired=False, **kw)
    if a.size > 1:
        return _interval((a,), lambda x, axis=-1: np.median(x, axis=axis) / b[0], paired=False,
                         **kw)
    if b.size > 1:
        return _interval((b,), lambda x, axis=-1: a[0] / np.median(x, axis=axis), paired=False,
                         **kw)
    ratio = float(a[0] / b[0])
    return ratio, ratio


def median_ci(a: ArrayLike, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
              seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of the median of one sample (fewer than two values: the point)."""
    a = _array(a)
    if not a.size:
        return math.nan, math.nan
    if a.size == 1:
        return float(a[0]), float(a[0])
    return _interval((a,), lambda x, axis=-1: np.median(x, axis=axis), paired=False,
                     confidence=confidence, n_resamples=n_resamples, seed=seed)


def per_round_ratios(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """a[i] / b[i] for rounds measured in alternation (the two must be equally long)."""
    a, b = _array(a), _array(b)
    if a.size != b.size:
        raise ValueError(f"paired rounds need equal counts, got {a.size} and {b.size}")
    return a / b


def _total_ratio(a, b, axis=-1):
    return np.sum(a, axis=axis) / np.sum(b, axis=axis)


PAIRED_STATISTICS = {"median": _median_ratio, "total": _total_ratio}
"""What ``paired_ratio_ci`` bounds: the median per-round ratio, or the ratio of the totals
(for a cost that lands in only some rounds, such as a sampler's tick, which a median misses)."""


def paired_ratio_ci(a: ArrayLike, b: ArrayLike, *, of: str = "median",
                    confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                    seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of the median per-round ratio a[i] / b[i] (``of="total"``: of
    sum(a) / sum(b)), ``scipy.stats.bootstrap`` with ``paired=True``: rounds resampled as
    pairs. Fewer than two rounds: the point itself (NaNs when there is none)."""
    if of not in PAIRED_STATISTICS:
        raise ValueError(f"of must be one of {', '.join(PAIRED_STATISTICS)}; got {of!r}")
    ratios = per_round_ratios(a, b)
    if not ratios.size:
        return math.nan, math.nan
    if ratios.size == 1:
        return float(ratios[0]), float(ratios[0])
    return _interval((_array(a), _array(b)), PAIRED_STATISTICS[of], paired=True,
                     confidence=confidence, n_resamples=n_resamples, seed=seed)


def mann_whitney_p(a: ArrayLike, b: ArrayLike, alternative: str = "two-sided") -> float:
    """p-value of the Mann-Whitney U test of two independent samples; 1.0 when either has fewer
    than two values (no test is possible)."""
    a, b = _array(a), _array(b)
    if min(a.size, b.size) < 2:
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative=alternative).pvalue)


def min_mann_whitney_p(n_a: int, n_b: int, alternative: str = "two-sided") -> float:
    """The smallest p-value the exact Mann-Whitney test can give with ``n_a`` and ``n_b``
    values (complete separation): above the significance level, no difference can be shown
    with so few rounds, however large (3 against 3 rounds: 0.1)."""
    if min(n_a, n_b) < 1:
        return 1.0
    p = 1 / math.comb(n_a + n_b, n_a)
    return min(1.0, 2 * p if alternative == "two-sided" else p)


def can_reach_significance(n_a: int, n_b: int, alpha: float = 0.05) -> bool:
    """Whether Mann-Whitney with these many rounds can reach ``alpha`` at all."""
    return min_mann_whitney_p(n_a, n_b) < alpha


def wilcoxon_paired_p(a: ArrayLike, b: ArrayLike, alternative: str = "two-sided") -> float:
    """p-value of the Wilcoxon signed-rank test that the per-round log ratios log(a[i] / b[i])
    are centred on 0 (rounds measured in alternation); 1.0 when fewer than two rounds differ."""
    log_ratios = np.log(per_round_ratios(a, b))
    if np.count_nonzero(log_ratios) < 2:
        return 1.0
    return float(stats.wilcoxon(log_ratios, alternative=alternative).pvalue)


def compare_independent(a: ArrayLike, b: ArrayLike, *, confidence: float = CONFIDENCE,
                        n_resamples: int = N_RESAMPLES, seed: int = 0) -> RatioEstimate:
    """Two separately measured samples: ratio of medians, bootstrap interval, Mann-Whitney."""
    low, high = bootstrap_ratio_ci(a, b, confidence=confidence, n_resamples=n_resamples,
                                   seed=seed)
    return RatioEstimate(ratio_of_medians(a, b), low, high, mann_whitney_p(a, b),
                         "Mann-Whitney")


def compare_paired(a: ArrayLike, b: ArrayLike, *, confidence: float = CONFIDENCE,
                   n_resamples: int = N_RESAMPLES, seed: int = 0) -> RatioEstimate:
    """Rounds measured in alternation: median per-round ratio, its bootstrap interval over the
    rounds, Wilcoxon signed-rank test of the log ratios."""
    ratios = per_round_ratios(a, b)
    ratio = float(np.median(ratios)) if ratios.size else math.nan
    low, high = paired_ratio_ci(a, b, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return RatioEstimate(ratio, low, high, wilcoxon_paired_p(a, b), "Wilcoxon signed-rank")


def run_spread(sides: Sequence[ArrayLike]) -> tuple[float, int]:
    """One case's own spread between runs, from its level (a median) in each run of one or more
    sides, each side one code version (the base runs; the new run and its re-measurements): the
    pooled standard deviation of the logs about each side's own mean, as a relative change
    (``expm1``, like ``robust_spread``), and its degrees of freedom (runs minus sides, counting
    only sides of two runs or more). (NaN, 0) when no side has two runs. A case whose level
    moves more between processes than the others (an emulated precision's step) needs its own
    figure: the spread across cases describes the typical case."""
    squares, dof = 0.0, 0
    for side in sides:
        levels = _array(side)
        logs = np.log(levels[np.isfinite(levels) & (levels > 0)])
        if logs.size >= 2:
            squares += float(np.sum((logs - logs.mean()) ** 2))
            dof += logs.size - 1
    if not dof:
        return math.nan, 0
    return float(np.expm1(math.sqrt(squares / dof))), dof


def spread_excess_p(own: float, dof: int, typical: float) -> float:
    """p-value of ``own`` (a spread with ``dof`` degrees of freedom, ``run_spread``) being no
    larger than ``typical`` (taken as known: it comes from many cases): ``dof`` times the ratio
    of their variances of logs against a chi-square with ``dof`` degrees of freedom. NaN where
    either is missing."""
    if not (math.isfinite(own) and math.isfinite(typical)) or not dof or typical <= 0:
        return math.nan
    ratio = (math.log1p(own) / math.log1p(typical)) ** 2
    return float(stats.chi2.sf(dof * ratio, dof))


def moderated_spread(own: float, dof: int, typical: float, prior_dof: float) -> float:
    """``own`` (a spread with ``dof`` degrees of freedom, ``run_spread``) shrunk towards
    ``typical`` (the spread of the typical case) as if that were ``prior_dof`` degrees of
    freedom of the same quantity: the square root of the dof-weighted mean of the two variances
    of the logs (the moderated variance of limma's empirical Bayes). A case whose few runs happen
    to differ by two of their spreads moves a little; one whose runs differ ten times more than
    the others' moves most of the way. ``own`` unchanged where ``typical`` is not finite."""
    if not math.isfinite(own) or not dof:
        return math.nan
    if not math.isfinite(typical):
        return own
    var = (prior_dof * math.log1p(typical) ** 2 + dof * math.log1p(own) ** 2) / (prior_dof + dof)
    return float(np.expm1(math.sqrt(var)))


def robust_spread(changes: ArrayLike) -> float:
    """Spread of relative changes ``new / base - 1`` across cases, as a standard deviation of
    their logs estimated from the median absolute deviation (``scipy.stats.median_abs_deviation``
    with ``scale="normal"``): robust to up to half the cases having really changed, so the
    cases that did not give the between-run noise. NaN for fewer than two finite changes."""
    logs = np.log1p(_array(changes))
    logs = logs[np.isfinite(logs)]
    if logs.size < 2:
        return math.nan
    return float(np.expm1(stats.median_abs_deviation(logs, scale="normal")))
