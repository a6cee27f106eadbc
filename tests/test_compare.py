"""The regression decision on synthetic rounds: power and false-alarm rate at the defaults."""

import numpy as np
import pandas as pd
import pytest

from gpubench.compare import Thresholds, compare_runs, time_verdict

ROUNDS = 10  # the cpu profile's default rounds per case
NOISE = 0.03  # relative spread of round times, typical of a quiet machine
TRIALS = 400


def _sample(rng, median, n=ROUNDS):
    return median * np.exp(rng.normal(0, NOISE, n))


def test_detects_slowdown_and_rarely_false_alarms():
    rng = np.random.default_rng(1)
    th = Thresholds()
    caught = sum(
        time_verdict(_sample(rng, 1.0), _sample(rng, 1.10), th)[0] == "regression"
        for _ in range(TRIALS)
    )
    false = sum(
        time_verdict(_sample(rng, 1.0), _sample(rng, 1.0), th)[0] == "regression"
        for _ in range(TRIALS)
    )
    print(f"10% slowdown caught in {caught / TRIALS:.1%}; false alarms {false / TRIALS:.1%}")
    assert caught / TRIALS >= 0.95
    assert false / TRIALS <= 0.05


def test_small_change_below_threshold_is_unchanged():
    rng = np.random.default_rng(2)
    verdict, change, _ = time_verdict(_sample(rng, 1.0, 50), _sample(rng, 1.03, 50), Thresholds())
    assert verdict == "unchanged" and 0 < change < 0.07


def _frame(cases: dict[str, float], scale=1.0, memory=1000):
    rng = np.random.default_rng(3)
    rows = []
    for case, median in cases.items():
        rounds = list(_sample(rng, median * scale))
        rows.append({
            "case_id": case, "model": "m", "profile": "cpu", "device": "cpu",
            "is_baseline": case == "base", "step_time_s": float(np.median(rounds)),
            "rounds_s": rounds, "peak_memory_bytes": memory, "mfu": 0.1,
        })
    return pd.DataFrame(rows)


def test_added_removed_and_regressed_cases():
    base = _frame({"base": 1.0, "a": 1.0, "gone": 1.0})
    new = _frame({"base": 1.0, "a": 1.3, "fresh": 1.0})
    table = compare_runs(base, new).set_index("case_id")
    assert table.loc["a", "status"] == "regression"
    assert table.loc["gone", "status"] == "removed"
    assert table.loc["fresh", "status"] == "added"
    assert table.loc["base", "status"] == "unchanged"


def test_memory_regression_is_flagged():
    table = compare_runs(_frame({"base": 1.0}), _frame({"base": 1.0}, memory=1100))
    assert table.loc[0, "status"] == "regression"
    assert table.loc[0, "memory_change"] == pytest.approx(0.1)


def test_normalized_compare_survives_a_slower_machine():
    base = _frame({"base": 1.0, "a": 0.5})
    slower = _frame({"base": 1.0, "a": 0.5}, scale=1.5)  # everything 50% slower
    raw = compare_runs(base, slower).set_index("case_id")
    norm = compare_runs(base, slower, normalized=True).set_index("case_id")
    assert raw.loc["a", "status"] == "regression"
    assert norm.loc["a", "status"] == "unchanged"
