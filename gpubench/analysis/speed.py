"""How two sides' speed is compared and judged: per sample, from paired or separately measured
rounds (``gpubench.util.stats``), against an effect size and a claimed range."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpubench.util.stats import compare_independent, compare_paired
from gpubench.util.verdicts import ALPHA, MIN_EFFECT, Kind

MIN_MEMORY_EFFECT = 0.05


@dataclass(frozen=True)
class SpeedComparison:
    """``new`` against ``base``: speed ratio (>1: new is faster per sample), p-value of
    ``test``, 95% CI."""

    ratio: float
    p_value: float
    low: float
    high: float
    test: str = "Mann-Whitney"

    def decide(self, min_effect: float = MIN_EFFECT) -> str:
        if self.p_value < ALPHA and self.ratio >= 1 + min_effect:
            return Kind.HOLDS
        if self.p_value < ALPHA and self.ratio < 1:
            return Kind.DOES_NOT_HOLD
        if self.high < 1 - min_effect:  # the whole interval is a slowdown beyond the effect size
            return Kind.DOES_NOT_HOLD
        if 1 - min_effect <= self.low and self.high <= 1 + min_effect:
            return Kind.DOES_NOT_HOLD
        return Kind.INCONCLUSIVE

    def inverted(self) -> SpeedComparison:
        """``base`` against ``new``: the same measurement read the other way."""
        return SpeedComparison(1 / self.ratio, self.p_value, 1 / self.high, 1 / self.low,
                               self.test)

    def describe(self) -> str:
        return (f"{self.ratio:.2f}x speed (95% CI {self.low:.2f}-{self.high:.2f}, "
                f"{self.test} p={self.p_value:.3g})")

    def judge(self, claimed: tuple[float, float]) -> str:
        """This speed ratio against a claimed range of speed-ups (see the module doc)."""
        faster = self.p_value < ALPHA and self.ratio >= 1 + MIN_EFFECT
        if faster and self.high >= claimed[0]:
            return Kind.HOLDS
        if faster:
            return Kind.SMALLER
        return self.decide()


def judge_memory(ratio: float, claimed: tuple[float, float]) -> str:
    """A memory ratio (exact training memory on the CPU, the allocator's peak on CUDA) against a
    claimed range: holds at or below the range's top, smaller than claimed when it falls but
    not that far, does not hold when it does not fall by ``MIN_MEMORY_EFFECT``."""
    if not ratio == ratio:
        return Kind.INCONCLUSIVE
    if ratio <= claimed[1]:
        return Kind.HOLDS
    if ratio <= 1 - MIN_MEMORY_EFFECT:
        return Kind.SMALLER
    return Kind.DOES_NOT_HOLD


def _per_sample_rounds(row: pd.Series) -> np.ndarray:
    rounds = row["rounds_s"] if isinstance(row.get("rounds_s"), list) else [row["step_time_s"]]
    return np.asarray(rounds, dtype=float) / row["global_batch"]


def compare_speed(base: pd.Series, new: pd.Series) -> SpeedComparison:
    """Two separately measured cases, per sample."""
    return compare_rounds(_per_sample_rounds(base), _per_sample_rounds(new))


def compare_rounds(a: np.ndarray, b: np.ndarray, n_boot: int = 2000,
                   seed: int = 0) -> SpeedComparison:
    """Per-sample round times of a baseline ``a`` and a technique ``b``, measured separately:
    ratio of medians, Mann-Whitney, bootstrap interval (``stats.compare_independent``)."""
    est = compare_independent(a, b, n_resamples=n_boot, seed=seed)
    return SpeedComparison(est.ratio, est.p_value, est.low, est.high, est.test)


def compare_paired_rounds(a: np.ndarray, b: np.ndarray, n_boot: int = 2000,
                          seed: int = 0) -> SpeedComparison:
    """Per-sample round times of a baseline ``a`` and a technique ``b`` measured in
    alternation (round ``i`` of each side next to the other's): median per-round ratio,
    Wilcoxon signed-rank, bootstrap interval over the rounds (``stats.compare_paired``)."""
    est = compare_paired(a, b, n_resamples=n_boot, seed=seed)
    return SpeedComparison(est.ratio, est.p_value, est.low, est.high, est.test)


def _speed_vs_baseline(baseline: pd.Series, row: pd.Series) -> SpeedComparison:
    """Against the baseline: the paired rounds when the case has them, else separate cases."""
    if row.get("speedup_method") == "paired" and pd.notna(row.get("speedup_low")):
        p, test = row.get("speedup_paired_p"), row.get("speedup_paired_test")
        return SpeedComparison(float(row["speedup"]), float(p) if pd.notna(p) else 1.0,
                               float(row["speedup_low"]), float(row["speedup_high"]),
                               test if isinstance(test, str) else "Wilcoxon signed-rank")
    return compare_speed(baseline, row)
