"""Regression tracking: compare runs case by case with a statistical test on the raw rounds.

Cases are matched by (model, profile, device, case id): a smoke run never meets a cpu-profile
run. A case regresses when its time distribution differs significantly (two-sided Mann-Whitney
U on the per-round times, as asv does) *and* its median moved by more than a minimum effect
(default 7% for time, like TorchBench; 2% for memory, which is near-deterministic and has no
test). When a case has so few rounds that the test cannot reach the significance level however
large the change (3 against 3 rounds: p >= 0.1), it is Kind.TOO_FEW, never Kind.UNCHANGED.
Several base files pool their rounds per case.

A case's rounds are compared over the paired baseline rounds taken right before them where both
runs have them (``BASES``: machine state and drift within a run cancel), else as they are. Two
runs of one commit on a shared machine differ by more than their rounds say, so a change must
also exceed ``NOISE_SIGMAS`` times the between-run spread of its basis, estimated from the
changes of all compared cases (most of which did not change); a shift common to all cases is
said in one line (``common_shift``).

With ``--confirm`` the gate has two stages (``confirm_regressions``): a lower limit,
``SCREEN_SIGMAS`` spreads, flags cases, which are re-measured on the new code; a flagged case
stays a regression only when the re-measurement alone is flagged again and the new and
re-measured rounds pooled exceed ``CONFIRM_SIGMAS`` standard deviations of their pooled change.
The base run's own noise is in both comparisons, so the second stage cannot be as low as the
first comparison's would be alone. Where the base's code can be run again (its commit, checked
out), it is re-measured too, in runs alternating with the new code's (base, new, new, base):
a flagged case then stays a regression only when the new code's runs are slower than the base
code's beyond ``CONFIRM_SIGMAS`` standard deviations of that change, judged run by run
(``confirm_alternated``), and stay so over up to ``CONFIRM_EXTRA_PAIRS`` more pairs of runs.
A machine that changed speed between the base run and the new one (a slower host, a noisy
neighbour) slows both sides of that comparison alike.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gpubench.analysis.results import (
    ResultsError,
    load_results,
    read_benchmark_json,
    training_memory,
)
from gpubench.util import atomic
from gpubench.util.stats import (
    can_reach_significance,
    mann_whitney_p,
    moderated_spread,
    robust_spread,
    run_spread,
    spread_excess_p,
)
from gpubench.util.tables import figures_table
from gpubench.util.verdicts import (
    ALPHA,
    COMPARE_BASES,
    CONFIRM_EXTRA_PAIRS,
    CONFIRM_SIGMAS,
    MEMORY_THRESHOLD,
    MIN_NOISE_CASES,
    NOISE_SIGMAS,
    OWN_SPREAD_ALPHA,
    PRIOR_RUNS,
    SCREEN_SIGMAS,
    SCREEN_THRESHOLD_SHARE,
    TIME_THRESHOLD,
    Kind,
)

KEY = ("model", "profile", "device", "case_id")

ALTERNATED = "base code, re-measured"
"""``confirm_against`` of a flag decided against the base code re-measured beside the new."""
"""What identifies a case across runs."""

COMPARED = (Kind.UNCHANGED, Kind.REGRESSION, Kind.IMPROVEMENT, Kind.TOO_FEW)
"""Statuses of cases measured in both runs (the others: added, removed, skipped)."""

BASES = COMPARE_BASES
"""What a case's round times are compared as (``--basis``). *auto*, the default: over the paired
baseline rounds taken right before them where both runs have them (machine state and drift
cancel), else as they are, and the FP32 baseline case itself always as it is, which is what
anchors the others; *raw*: as they are; *normalized*: every case over its own run's FP32
baseline, by the paired rounds where it has them, else by the baseline's median."""


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    time: float = TIME_THRESHOLD
    """Minimum relative change of median step time that counts."""
    memory: float = MEMORY_THRESHOLD
    """Minimum relative change of training memory that counts."""
    alpha: float = ALPHA
    """Significance level of the Mann-Whitney U test."""
    noise_sigmas: float = NOISE_SIGMAS
    """How many between-run spreads a time change must also exceed."""
    screen_sigmas: float = SCREEN_SIGMAS
    """With --confirm: how many between-run spreads flag a case for re-measurement."""
    confirm_sigmas: float = CONFIRM_SIGMAS
    """With --confirm: how many standard deviations of the pooled change confirm a flag."""

    def __post_init__(self) -> None:
        for name in ("time", "memory", "noise_sigmas", "screen_sigmas", "confirm_sigmas"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} threshold must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.alpha, int | float) and 0 < self.alpha < 1):
            raise ValueError(f"alpha must lie strictly between 0 and 1, got {self.alpha!r}")

    def time_limit(self, spread: float, cases: int) -> float:
        """The time change that counts on a basis whose changes spread by ``spread`` over
        ``cases`` compared cases: the time threshold, or ``noise_sigmas`` spreads when that is
        larger and the spread was estimated from at least ``MIN_NOISE_CASES`` cases."""
        if cases < MIN_NOISE_CASES or not math.isfinite(spread):
            return self.time
        return max(self.time, self.noise_sigmas * spread)

    def screen_limit(self, spread: float, cases: int) -> float:
        """With --confirm, the time change that flags a case for re-measurement:
        ``screen_sigmas`` spreads, at least ``SCREEN_THRESHOLD_SHARE`` of the time threshold,
        at most ``time_limit``; ``time_limit`` where no spread could be estimated."""
        plain = self.time_limit(spread, cases)
        if cases < MIN_NOISE_CASES or not math.isfinite(spread):
            return plain
        return min(plain, max(SCREEN_THRESHOLD_SHARE * self.time, self.screen_sigmas * spread))

    def confirm_limit(self, spread: float, cases: int, factor: float) -> float:
        """The pooled change (new and re-measured rounds against the base) that confirms a
        flag: the time threshold, or ``confirm_sigmas`` times its standard deviation, ``factor``
        (``pooled_spread_factor``) times the between-run spread, when that is larger."""
        if cases < MIN_NOISE_CASES or not math.isfinite(spread):
            return self.time
        return max(self.time, self.confirm_sigmas * factor * spread)


def pooled_spread_factor(base_runs: int, new_runs: int, again_runs: int) -> float:
    """The standard deviation of a case's change with the new and re-measured runs pooled, over
    the between-run spread (the spread of its change between the base and the new runs alone):
    each run's level varies independently by the same amount, and a side's pooled runs by that
    over their count, so the ratio is sqrt((1/B + 1/(N + R)) / (1/B + 1/N)). One base, one new
    run and one re-measurement: 0.87, not 0.71: the base's noise is in both comparisons."""
    b, n, r = (max(1, int(k)) for k in (base_runs, new_runs, again_runs))
    return math.sqrt((1 / b + 1 / (n + r)) / (1 / b + 1 / n))


def time_verdict(base: np.ndarray, new: np.ndarray, th: Thresholds,
                 limit: float | None = None) -> tuple[str, float, float]:
    """(verdict, relative change of the median, p-value) for two samples of round times; a
    change counts beyond ``limit`` (default: the time threshold)."""
    base, new = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    change = float(np.median(new) / np.median(base) - 1)
    p = mann_whitney_p(base, new) if min(len(base), len(new)) >= 2 else float("nan")
    sizes = (len(base), len(new))
    return _time_kind(change, p, sizes, th, th.time if limit is None else limit), change, p


def _time_kind(change: float, p: float, sizes: tuple[int, int], th: Thresholds,
               limit: float) -> str:
    """``time_verdict``'s verdict from its change, p-value and the two samples' sizes."""
    if not can_reach_significance(*sizes, th.alpha):
        return Kind.TOO_FEW
    if p >= th.alpha or abs(change) < limit:
        return Kind.UNCHANGED
    return Kind.REGRESSION if change > 0 else Kind.IMPROVEMENT


def flag_time(base: np.ndarray, new: np.ndarray, th: Thresholds, limit: float,
              screen: float | None = None) -> tuple[str, float, float]:
    """``time_verdict`` beyond ``limit``, except that a slowdown counts beyond ``screen`` (the
    first stage of --confirm: a flag to re-measure) where that is given and lower."""
    verdict, change, p = time_verdict(base, new, th, limit)
    if screen is not None and screen < limit and verdict == Kind.UNCHANGED and change > 0:
        verdict = _time_kind(change, p, (len(base), len(new)), th, screen)
    return verdict, change, p


def confirm_time(base: np.ndarray, new: np.ndarray, again: np.ndarray, th: Thresholds,
                 spread: float, cases: int, runs: tuple[int, int, int],
                 own: float = math.nan) -> tuple[bool, float, float, float]:
    """The second stage of --confirm for a case's time, from its rounds on one basis: the base
    (pooled over its runs), the new run's and the re-measurement's (pooled over its runs), the
    between-run spread of the comparison and how many cases it came from, and the number of
    (base, new, re-measured) runs. (confirmed, re-measured change, pooled change, pooled
    limit): confirmed when the re-measurement alone regresses beyond the first stage's limit
    (``screen_limit``) and the new and re-measured rounds pooled regress beyond
    ``confirm_limit``, both also significant. ``own``: the case's own spread between runs
    (``own_spread`` over the base, new and re-measured runs; NaN where they give none): where
    its change spreads are larger, both limits are the same numbers of them."""
    b, n, r = runs
    screen = th.screen_limit(spread, cases)
    limit = th.confirm_limit(spread, cases, pooled_spread_factor(*runs))
    if math.isfinite(own):
        screen = max(screen, th.screen_sigmas * change_spread(own, b, r))
        limit = max(limit, th.confirm_sigmas * change_spread(own, b, n + r))
    again_kind, again_change, _ = time_verdict(base, again, th, screen)
    pooled_kind, pooled_change, _ = time_verdict(base, np.concatenate([new, again]), th, limit)
    held = again_kind == pooled_kind == Kind.REGRESSION
    return held, again_change, pooled_change, limit


def confirm_alternated(base_levels: list[float], new_levels: list[float], th: Thresholds,
                       spread: float, cases: int, base_runs: int) -> tuple[bool, float, float]:
    """The second stage of --confirm where the base code was re-measured too, in runs
    alternating with the new code's: (confirmed, change, limit). The unit is the run (a
    process: on a shared machine a case's level moves between processes, and its rounds within
    one share that level): ``base_levels`` and ``new_levels`` are the case's level (median of
    its rounds on one basis) in each re-measurement run of the base code and of the new code.
    The change is the ratio of their geometric means; its standard deviation comes from the
    runs' own spread about each side's mean, moderated towards one run's typical spread (the
    first comparison's between-run ``spread`` over ``cases`` cases, against ``base_runs`` base
    runs, taken back to one run) as if that were ``PRIOR_RUNS`` more runs (limma's moderated
    t). Confirmed when the change exceeds the time threshold and ``confirm_sigmas`` of its
    standard deviations. A case whose level jumps between processes (two levels, as a
    multi-process case's can on a 2-core machine) shows that jump within a side as soon as
    one side's runs land on both levels; with every base run low and every new run high it
    cannot be told from a slowdown, which ``CONFIRM_EXTRA_PAIRS`` more runs make rarer."""
    b = np.log(np.asarray([x for x in base_levels if x > 0], dtype=float))
    n = np.log(np.asarray([x for x in new_levels if x > 0], dtype=float))
    if not (b.size and n.size):
        return False, math.nan, math.nan
    diff = float(n.mean() - b.mean())
    squares = float(((b - b.mean()) ** 2).sum() + ((n - n.mean()) ** 2).sum())
    dof = b.size + n.size - 2
    typical = math.log1p(one_run_spread(spread, cases, base_runs))
    if math.isfinite(typical):
        var = (PRIOR_RUNS * typical ** 2 + squares) / (PRIOR_RUNS + dof)
    elif dof:
        var = squares / dof
    else:  # one run a side and no typical spread: nothing to judge the change by
        return False, math.expm1(diff), math.nan
    deviation = math.sqrt(var * (1 / b.size + 1 / n.size))
    limit = max(math.log1p(th.time), th.confirm_sigmas * deviation)
    return diff > limit, math.expm1(diff), math.expm1(limit)


def memory_verdict(base: float, new: float, th: Thresholds) -> tuple[str, float]:
    if not base or pd.isna(base) or pd.isna(new):
        return Kind.UNCHANGED, float("nan")
    change = new / base - 1
    if abs(change) < th.memory:
        return Kind.UNCHANGED, change
    return (Kind.REGRESSION if change > 0 else Kind.IMPROVEMENT), change


def _steps(df: pd.DataFrame) -> pd.DataFrame:
    if "kind" in df:
        df = df[df["kind"].isna() | (df["kind"] == "step")]
    return df.dropna(subset=["case_id"])


def _round_times(row: pd.Series) -> np.ndarray:
    rounds = row.get("rounds_s")
    if isinstance(rounds, list | tuple | np.ndarray) and len(rounds):
        return np.asarray(rounds, dtype=float)
    return np.asarray([row["step_time_s"]], dtype=float)


def _paired_rounds(row: pd.Series, n: int) -> np.ndarray | None:
    """The case's paired baseline rounds (``paired_baseline_rounds_s``, round i before the
    case's round i), where it has one positive round per round of its own; else None."""
    paired = row.get("paired_baseline_rounds_s")
    if not isinstance(paired, list | tuple | np.ndarray) or len(paired) != n:
        return None
    paired = np.asarray(paired, dtype=float)
    return paired if np.all(np.isfinite(paired) & (paired > 0)) else None


def _pool(parts: list[np.ndarray | None]) -> np.ndarray | None:
    """The rounds of several records of one case on one basis: None unless every record has
    them (a basis is one case's only where all its records can be put on it)."""
    if not parts or any(p is None for p in parts):
        return None
    rounds = np.concatenate(parts)
    rounds = rounds[np.isfinite(rounds) & (rounds > 0)]
    return rounds if rounds.size else None


def _levels(parts: list[np.ndarray | None]) -> list[float]:
    """A case's level in each of its runs on one basis (the median of that run's rounds)."""
    return [float(np.median(p)) for p in parts if p is not None and p.size]


def case_run_spread(on: str, base: dict, *new: dict) -> tuple[float, int]:
    """One case's own spread between runs on basis ``on``: ``stats.run_spread`` of its levels
    in the base runs and in the new side's (the new run and any re-measurements, one code
    version); (NaN, 0) when neither side has two runs of the case."""
    return run_spread([base["levels"][on], [x for n in new for x in n["levels"][on]]])


def change_spread(run: float, base_runs: int, new_runs: int) -> float:
    """The spread of a change between ``new_runs`` pooled runs and ``base_runs`` pooled runs,
    each run's level varying by ``run``: ``sqrt(1/B + 1/N)`` times it (on logs)."""
    if not math.isfinite(run):
        return math.nan
    b, n = max(1, int(base_runs)), max(1, int(new_runs))
    return float(np.expm1(math.log1p(run) * math.sqrt(1 / b + 1 / n)))


def one_run_spread(spread: float, cases: int, base_runs: int) -> float:
    """One run's spread of a typical case: the comparison's between-run ``spread`` (of the
    changes of ``cases`` cases, ``base_runs`` base runs pooled against one new run) taken back
    to one run's (on logs, over sqrt(1/B + 1)); NaN where too few cases gave no spread."""
    if cases < MIN_NOISE_CASES or not math.isfinite(spread):
        return math.nan
    return float(np.expm1(math.log1p(spread) / math.sqrt(1 / max(1, base_runs) + 1)))


def own_spread(on: str, spread: float, cases: int, base: dict, *new: dict
               ) -> tuple[float, int]:
    """A case's own spread between runs on basis ``on`` (``case_run_spread``), where it is
    significantly larger than the typical case's (``stats.spread_excess_p`` below
    ``OWN_SPREAD_ALPHA``), shrunk towards that (``stats.moderated_spread`` with
    ``PRIOR_RUNS``); the typical spread is the comparison's between-run ``spread`` over
    ``cases`` cases, one base side against one new run, taken back to one run's. (spread, its
    degrees of freedom); the spread NaN where neither side has two runs of the case, or where
    the case is not shown to spread more."""
    run, dof = case_run_spread(on, base, *new)
    typical = one_run_spread(spread, cases, base["records"])
    if math.isfinite(typical):
        if not spread_excess_p(run, dof, typical) < OWN_SPREAD_ALPHA:
            return math.nan, dof
    return moderated_spread(run, dof, typical, PRIOR_RUNS), dof


def case_limits(th: Thresholds, limit: float, screen: float, own_change: float
                ) -> tuple[float, float, bool]:
    """A case's (plain limit, first-stage limit, whether its own spread set them) from its
    basis's ``limit`` and ``screen`` limit (NaN without --confirm) and the spread of its change
    that its own runs show (``own_spread`` through ``change_spread``; NaN where they show
    none): the same numbers of its own spreads wherever those are larger."""
    if not math.isfinite(own_change):
        return limit, screen, False
    own = th.noise_sigmas * own_change > limit
    limit = max(limit, th.noise_sigmas * own_change)
    if math.isfinite(screen):
        screen = min(limit, max(screen, th.screen_sigmas * own_change))
    return limit, screen, own


def _cases(df: pd.DataFrame) -> dict[tuple, dict]:
    """KEY -> the case's pooled rounds of one side (one or more runs) on each basis it has
    (``raw``; ``paired``: each round over the paired baseline round taken right before it;
    ``median``: over its run's baseline median), its memory and memory kind. Memory is the
    training memory (``results.training_memory``: exact on the CPU, where the process peak
    wanders between runs); the peak only for records that lack its parts."""
    df = _steps(df).copy()
    if "run" not in df:
        df["run"] = ""
    train = training_memory(df)
    df["_memory"] = train.fillna(df["peak_memory_bytes"].astype(float))
    df["_memory_kind"] = np.where(train.notna(), "training", "peak")
    base = df[(df["is_baseline"] == True) & df["step_time_s"].notna()]  # noqa: E712
    refs = {(r["run"], r["model"], r["profile"], r["device"]): r["step_time_s"]
            for _, r in base.iterrows()}
    parts: dict[tuple, dict] = {}
    for _, r in df.iterrows():
        key = tuple(r[k] for k in KEY)
        case = parts.setdefault(key, {"raw": [], "paired": [], "median": [], "memory": [],
                                      "kinds": set(), "baseline": False})
        case["baseline"] |= r["is_baseline"] == True  # noqa: E712
        time = r["step_time_s"]
        if pd.isna(time) or not np.isfinite(float(time)) or float(time) <= 0:
            continue
        rounds = _round_times(r)
        paired = _paired_rounds(r, rounds.size)
        ref = refs.get((r["run"], r["model"], r["profile"], r["device"]))
        case["raw"].append(rounds)
        # Round i over the baseline round taken right before it: the drift between the case's
        # rounds and the baseline's separate ones cancels (as in the summary).
        case["paired"].append(None if paired is None else rounds / paired)
        case["median"].append(rounds / ref if ref is not None and ref > 0 else None)
        case["memory"].append(r["_memory"])
        case["kinds"].add(r["_memory_kind"])
        case["records"] = case.get("records", 0) + 1
    cases = {}
    for key, case in parts.items():
        mem = [m for m in case["memory"] if not pd.isna(m)]
        cases[key] = {"raw": _pool(case["raw"]), "paired": _pool(case["paired"]),
                      "median": _pool(case["median"]), "kinds": case["kinds"],
                      "levels": {on: _levels(case[on]) for on in ("raw", "paired", "median")},
                      "baseline": case["baseline"], "records": case.get("records", 0),
                      "memory": float(np.median(mem)) if mem else float("nan")}
    return cases


def _basis(b: dict, n: dict, basis: str) -> str | None:
    """The basis a case both sides have is compared on, under ``--basis``."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
    if basis == "raw" or (basis == "auto" and (b["baseline"] or n["baseline"])):
        return "raw"  # the FP32 baseline over its own paired rounds would hide its changes
    if b["paired"] is not None and n["paired"] is not None:
        return "paired"
    if basis == "auto":
        return "raw"
    return "median" if b["median"] is not None and n["median"] is not None else None


def _change(b: dict, n: dict, on: str) -> float:
    if b[on] is None or n[on] is None:
        return math.nan
    return float(np.median(n[on]) / np.median(b[on]) - 1)


def compare_runs(base: pd.DataFrame, new: pd.DataFrame, th: Thresholds = Thresholds(),
                 basis: str = "auto", screen: bool = False) -> pd.DataFrame:
    """One row per case (model, profile, device, case id) present in either side, with status
    and changes. ``base`` may hold several runs: a case's rounds are pooled across them.

    Each case is compared on ``basis`` (``BASES``). A time change counts beyond
    ``Thresholds.time_limit`` of its basis: the time threshold, or ``noise_sigmas`` times the
    between-run spread of that basis, the robust spread of the changes of every compared case
    on it (``stats.robust_spread``). Two runs of one commit differ by more than their rounds'
    spread says (the machine's state between runs), which a test of the rounds alone cannot
    see; most cases of a comparison did not change, so their spread measures it.

    ``screen``: the first stage of --confirm, a slowdown is flagged as a regression beyond
    ``Thresholds.screen_limit`` (column ``screen_limit``), to be re-measured and decided by
    ``confirm_regressions``; improvements keep the plain limit."""
    b_cases, n_cases = _cases(base), _cases(new)
    both = [k for k in b_cases if k in n_cases
            and b_cases[k]["raw"] is not None and n_cases[k]["raw"] is not None]
    noise = {}
    for on in ("raw", "paired", "median"):
        changes = [c for c in (_change(b_cases[k], n_cases[k], on) for k in both)
                   if math.isfinite(c)]
        spread = robust_spread(changes)
        noise[on] = (spread, len(changes), th.time_limit(spread, len(changes)),
                     th.screen_limit(spread, len(changes)) if screen else math.nan)
    rows = []
    for key in dict.fromkeys([*b_cases, *n_cases]):
        ident = dict(zip(KEY, key, strict=True))
        if key not in n_cases:
            rows.append({**ident, "status": "removed"})
            continue
        if key not in b_cases:
            rows.append({**ident, "status": "added"})
            continue
        b, n = b_cases[key], n_cases[key]
        on = _basis(b, n, basis) if key in both else None
        if on is None:
            note = ("no baseline to normalize" if key in both else "not measured in " + (
                "either run" if b["raw"] is None and n["raw"] is None
                else "the base run" if b["raw"] is None else "the new run"))
            rows.append({**ident, "status": "skipped", "note": note})
            continue
        spread, cases, limit, screen_limit = noise[on]
        # A case whose runs spread more than the typical case's (the spread across cases) is
        # judged by its own spread, where both sides' runs give one.
        own, own_dof = own_spread(on, spread, cases, b, n)
        limit, screen_limit, own_limit = case_limits(
            th, limit, screen_limit, change_spread(own, b["records"], n["records"]))
        verdict, t_change, p = flag_time(b[on], n[on], th, limit,
                                         screen_limit if screen else None)
        if b["kinds"] == n["kinds"] and len(b["kinds"]) == 1:
            mem_verdict, m_change = memory_verdict(b["memory"], n["memory"], th)
        else:  # an exact sum against a process peak says nothing
            mem_verdict, m_change = Kind.UNCHANGED, float("nan")
        status = Kind.REGRESSION if Kind.REGRESSION in (verdict, mem_verdict) else (
            Kind.IMPROVEMENT if Kind.IMPROVEMENT in (verdict, mem_verdict) else verdict)
        rows.append({
            **ident, "status": status, "basis": on, "time_change": t_change, "p_value": p,
            "throughput_change": 1 / (1 + t_change) - 1, "memory_change": m_change,
            "raw_change": _change(b, n, "raw"), "time_limit": limit,
            "screen_limit": screen_limit, "spread": spread, "spread_cases": cases,
            "case_spread": own, "case_spread_dof": own_dof, "own_limit": own_limit,
            "basis_limit": noise[on][2],
            "base_step_time_s": float(np.median(b["raw"])),
            "new_step_time_s": float(np.median(n["raw"])),
            "base_rounds": int(b[on].size), "new_rounds": int(n[on].size),
            "time_verdict": verdict, "memory_verdict": mem_verdict,
        })
    return pd.DataFrame(rows, columns=[*KEY, "status", "basis", "time_change", "p_value",
                                       "throughput_change", "memory_change", "raw_change",
                                       "time_limit", "screen_limit", "spread",
                                       "spread_cases", "case_spread", "case_spread_dof",
                                       "own_limit", "basis_limit", "base_step_time_s",
                                       "new_step_time_s", "base_rounds", "new_rounds",
                                       "time_verdict",
                                       "memory_verdict", "note"])


BASIS_SHORT = {"paired": "paired", "raw": "raw", "median": "vs median"}
"""The table's word for each basis."""

BASIS_WORDS = {"paired": "over paired baseline rounds", "raw": "raw",
               "median": "over the baseline's median"}


def noise_line(table: pd.DataFrame) -> str | None:
    """One line of what a time change had to exceed on each basis used, and why: the spread
    between the runs and how many cases it was estimated from."""
    used = table.dropna(subset=["basis"]) if "basis" in table else table.iloc[:0]
    parts = []
    for on, rows in used.groupby("basis", sort=False):
        own = (rows[rows["own_limit"] == True] if "own_limit" in rows  # noqa: E712
               else rows.iloc[:0])
        r = rows.iloc[0]
        common = r["basis_limit"] if "basis_limit" in r else r["time_limit"]
        spread = (f"between-run spread {r['spread']:.1%} over {int(r['spread_cases'])} cases"
                  if r["spread_cases"] >= MIN_NOISE_CASES and math.isfinite(r["spread"])
                  else f"too few cases ({int(r['spread_cases'])}) for a between-run spread")
        cases = f"{len(rows)} case{'s' if len(rows) != 1 else ''}"
        confirm = ""
        if "screen_limit" in rows and math.isfinite(r["screen_limit"]):
            confirm = f"; with --confirm, a slowdown flagged beyond {r['screen_limit']:.1%}"
            limits = rows["confirm_limit"].dropna() if "confirm_limit" in rows else ()
            if len(limits):
                low, high = limits.min(), limits.max()
                against = (rows.loc[limits.index, "confirm_against"]
                           if "confirm_against" in rows else pd.Series(dtype=object))
                confirm += (" and confirmed beyond " + (f"{low:.1%}" if high - low < 5e-4 else
                                                         f"{low:.1%}-{high:.1%}")
                            + (" against the base code re-measured beside the new"
                               if (against == ALTERNATED).all() and len(against)
                               else " with the re-measured rounds pooled"))
        if len(own):
            low, high = own["time_limit"].min(), own["time_limit"].max()
            many = len(own) > 1
            spread += (f"; {len(own)} case{'s' if many else ''} by {'their' if many else 'its'}"
                       " own spread between runs, beyond "
                       + (f"{low:.1%}" if high - low < 5e-4 else f"{low:.1%}-{high:.1%}"))
        parts.append(f"{BASIS_WORDS[on]} ({cases}): beyond {common:.1%} ({spread}{confirm})")
    return "a time change counted " + "; ".join(parts) if parts else None


COMMON_SHARE = 0.75
"""Share of the compared cases that must move the same way for a shift to count as the
machine's (``common_shift``) rather than the cases'."""


def common_shift(table: pd.DataFrame, th: Thresholds = Thresholds()) -> str | None:
    """One line when the new run's raw times moved together (a machine-state change: clocks,
    load, a thermal or power state, another machine of the same name), or None: the median raw
    time change over the compared cases exceeds the time threshold and at least
    ``COMMON_SHARE`` of them moved that way. Raw verdicts then mostly measure the machine;
    verdicts over paired baseline rounds do not."""
    column = "raw_change" if "raw_change" in table else "time_change"
    changes = pd.to_numeric(table.get(column), errors="coerce").dropna() \
        if column in table else pd.Series(dtype=float)
    if len(changes) < 3:
        return None
    median = float(changes.median())
    same_way = float((np.sign(changes) == np.sign(median)).mean())
    if abs(median) <= th.time or same_way < COMMON_SHARE:
        return None
    how = "slower" if median > 0 else "faster"
    return (f"the new run is {abs(median):.0%} {how} across the board (median time change "
            f"{median:+.1%} over {len(changes)} cases, {same_way:.0%} of them {how}): a change "
            "of machine state (clocks, load, thermals, another machine), not of each case; "
            "cases with paired baseline rounds are compared over them, and --basis normalized "
            "puts every case over its own run's FP32 baseline")


SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512vnni", "avx512_bf16", "avx512_fp16", "avx512fp16", "avx_vnni", "amx_tile",
              "amx_bf16", "amx_int8", "amx_fp16", "sve", "sve2", "asimd")
"""CPU instruction-set flags (py-cpuinfo names) that change PyTorch's CPU kernels."""


def _machine(path: str | Path) -> tuple[dict, dict, dict, str | None]:
    data = read_benchmark_json(path)
    machine = data.get("machine_info")
    machine = machine if isinstance(machine, dict) else {}
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
    gpubench = machine.get("gpubench") if isinstance(machine.get("gpubench"), dict) else {}
    return machine, cpu, gpubench, data.get("version")


def _profiles(path: str | Path) -> set[str]:
    out = set()
    for bench in read_benchmark_json(path)["benchmarks"]:
        extra = bench.get("extra_info") if isinstance(bench, dict) else None
        if isinstance(extra, dict) and isinstance(extra.get("profile"), str):
            out.add(extra["profile"])
    return out


def environment_warnings(base_file: str | Path, new_file: str | Path) -> list[str]:
    """Differences between two runs that make their times hard to compare: profile, machine,
    CPU model and instruction sets (AVX-512 vs AVX2), GPU, and library versions."""
    bm, bc, bg, bv = _machine(base_file)
    nm, nc, ng, nv = _machine(new_file)
    out = []
    bp, np_ = _profiles(base_file), _profiles(new_file)
    if bp and np_ and bp != np_:
        out.append(f"profile differs: {', '.join(sorted(bp))} vs {', '.join(sorted(np_))} "
                   "(cases of different profiles are never matched)")
    for key in ("node", "machine", "python_version"):
        if bm.get(key) != nm.get(key):
            out.append(f"{key} differs: {bm.get(key)!r} vs {nm.get(key)!r}")
    if (bc.get("brand_raw") or bg.get("cpu")) != (nc.get("brand_raw") or ng.get("cpu")):
        out.append(f"CPU differs: {bc.get('brand_raw') or bg.get('cpu')!r} vs "
                   f"{nc.get('brand_raw') or ng.get('cpu')!r}")
    b_flags, n_flags = set(bc.get("flags") or ()), set(nc.get("flags") or ())
    if b_flags and n_flags:
        only_b = sorted(f for f in SIMD_FLAGS if f in b_flags - n_flags)
        only_n = sorted(f for f in SIMD_FLAGS if f in n_flags - b_flags)
        if only_b or only_n:
            out.append("CPU instruction sets differ: "
                       + "; ".join(part for part in (
                           f"only the base has {', '.join(only_b)}" if only_b else "",
                           f"only the new run has {', '.join(only_n)}" if only_n else "")
                           if part))
    for key, what in (("cpu_capability", "PyTorch CPU capability"), ("cpu_count", "CPU count"),
                      ("torch_threads", "torch threads"), ("device_name", "device"),
                      ("device_count", "device count"), ("torch", "torch"),
                      ("torchvision", "torchvision"), ("transformers", "transformers"),
                      ("cuda", "CUDA"), ("cudnn", "cuDNN")):
        if bg.get(key) != ng.get(key):
            out.append(f"{what} differs: {bg.get(key)!r} vs {ng.get(key)!r}")
    if bv != nv:
        out.append(f"pytest-benchmark differs: {bv!r} vs {nv!r}")
    return out


def _series_name(r: pd.Series) -> str:
    case = str(r["case_id"])
    if not case.startswith(str(r["model"])):
        case = f"{r['model']} {case}"
    return f"{case} [{r['profile']} profile, {r['device']}]"


def github_benchmark_json(new: pd.DataFrame) -> dict[str, list[dict]]:
    """github-action-benchmark series (``customSmallerIsBetter``: median step time and training
    memory; ``customBiggerIsBetter``: samples/s and MFU), named with case, model, profile and
    device so that histories of different profiles or devices never mix. Memory is the training
    memory (CUDA peak; CPU exact parameters + gradients + optimizer state + activations), never
    the CPU process peak, so that it is comparable between runs. Raises ``ResultsError`` when
    there is no gpubench step record to export."""
    steps = _steps(new)
    steps = steps.dropna(subset=["step_time_s", "model", "profile", "device"])
    if steps.empty:
        files = ", ".join(dict.fromkeys(map(str, new.get("file", pd.Series(dtype=str)))))
        raise ResultsError(f"{files + ': ' if files else ''}no measured gpubench case to "
                           "export (records need step_time_s, model, profile and device)")
    steps = steps.assign(_memory=training_memory(steps))
    smaller, bigger = [], []
    for _, r in steps.iterrows():
        name = _series_name(r)
        rounds = r.get("time_rounds")
        extra = [f"rounds: {int(rounds)}" if not pd.isna(rounds) else "",
                 f"device: {r.get('device_name')}" if isinstance(r.get("device_name"), str)
                 else ""]
        entry = {"name": f"{name} median step time", "unit": "s",
                 "value": float(r["step_time_s"]),
                 "extra": "\n".join(e for e in extra if e)}
        iqr = r.get("step_time_iqr_s", r.get("time_iqr"))
        if iqr is not None and not pd.isna(iqr):
            entry["range"] = f"IQR {float(iqr):.3g} s"
        smaller.append(entry)
        if not pd.isna(r["_memory"]):
            cuda = r["device"] == "cuda"
            smaller.append({
                "name": f"{name} {'peak memory' if cuda else 'training memory'}",
                "unit": "MiB", "value": float(r["_memory"]) / 2**20,
                "extra": "CUDA allocator peak per device" if cuda else
                "exact parameters + gradients + optimizer state + saved activations, per rank",
            })
        if not pd.isna(r.get("samples_per_s")):
            bigger.append({"name": f"{name} throughput", "unit": "samples/s",
                           "value": float(r["samples_per_s"])})
        if not pd.isna(r.get("mfu")):
            bigger.append({"name": f"{name} MFU", "unit": "fraction of peak",
                           "value": float(r["mfu"])})
    return {"customSmallerIsBetter": smaller, "customBiggerIsBetter": bigger}


GITHUB_FILES = {"customSmallerIsBetter": "smaller_is_better.json",
                "customBiggerIsBetter": "bigger_is_better.json"}


def write_github_json(results: pd.DataFrame, folder: str | Path) -> list[Path]:
    """``smaller_is_better.json`` and ``bigger_is_better.json`` for github-action-benchmark;
    ``ResultsError`` (nothing written) when the results hold no measured gpubench case."""
    payload = github_benchmark_json(results)
    written = []
    for tool, name in GITHUB_FILES.items():
        atomic.write_json(Path(folder) / name, payload[tool], indent=1)
        written.append(Path(folder) / name)
    return written


COMPARE_COLUMNS = {
    "case_id": "case",
    "status": "status",
    "basis": "compared",
    "time_change": "time",
    "throughput_change": "throughput",
    "memory_change": "training memory",
    "p_value": "p",
}


def compare_markdown(table: pd.DataFrame) -> str:
    columns = dict(COMPARE_COLUMNS)
    if "confirmed" in table and table["confirmed"].notna().any():
        columns["confirm_change"] = "time re-measured"
        columns["pooled_change"] = "time pooled"
        if "confirm_against" in table and (
                table["confirm_against"] == ALTERNATED).any():
            columns["confirm_against"] = "re-measured against"
        columns["confirmed"] = "confirmed"
    own = table["own_limit"] == True if "own_limit" in table else None  # noqa: E712
    if own is not None and own.any():
        columns["own_spread"] = "own spread between runs"
    shown = table.reindex(columns=[*KEY, *columns]).copy()
    shown = shown.loc[:, ~shown.columns.duplicated()]
    if "own_spread" in columns:
        shown["own_spread"] = [
            f"{s:.1%} (limit {limit:.1%})" if mine else "-" for mine, s, limit in
            zip(own, table["case_spread"], table["time_limit"], strict=True)]
    if shown[["profile", "device"]].drop_duplicates().shape[0] > 1:
        shown["case_id"] = [f"{c} ({p}, {d})" for c, p, d in
                            zip(shown["case_id"], shown["profile"], shown["device"], strict=True)]
    for col in ("time_change", "throughput_change", "memory_change", "confirm_change",
                "pooled_change"):
        if col in shown:
            shown[col] = shown[col].map(lambda v: "-" if pd.isna(v) else f"{100 * v:+.1f}%")
    if "confirmed" in shown:
        shown["confirmed"] = shown["confirmed"].map(
            lambda v: "-" if v is None or pd.isna(v) else "yes" if v else "no")
    shown["p_value"] = shown["p_value"].map(lambda v: "-" if pd.isna(v) else f"{v:.3f}")
    shown["basis"] = shown["basis"].map(lambda v: BASIS_SHORT.get(v, "-"))
    return figures_table(shown.astype(object).fillna("-"), columns)


def split_files(args: argparse.Namespace) -> tuple[list[str], str]:
    """(base files, new file) from ``BASE [BASE ...] NEW`` or ``--base BASE ... NEW``."""
    if args.base:
        if len(args.files) != 1:
            raise ResultsError("with --base, give exactly one NEW file "
                               f"(got {len(args.files)}: {' '.join(args.files)})")
        return list(args.base), args.files[0]
    if len(args.files) < 2:
        raise ResultsError("compare needs BASE [BASE ...] NEW (or --base BASE NEW)")
    return list(args.files[:-1]), args.files[-1]


def _remeasured(done) -> Remeasurement:
    """A re-measurement's answer as a ``Remeasurement`` (a file or files: the new code's)."""
    if isinstance(done, Remeasurement):
        return done
    return Remeasurement(new=[done] if isinstance(done, str | Path) else list(done or []))


def _confirmed(base: pd.DataFrame, new: pd.DataFrame, screened: pd.DataFrame,
               done: Remeasurement, th: Thresholds) -> pd.DataFrame:
    """``confirm_regressions`` of the flags of ``screened`` by what ``done`` holds."""
    again = again_base = None
    if done.new:
        again = load_results(list(done.new),
                             labels=[f"again{i + 1}" for i in range(len(done.new))])
    if done.new and done.base:
        again_base = load_results(list(done.base),
                                  labels=[f"again_base{i + 1}" for i in range(len(done.base))])
    return confirm_regressions(base, new, screened, again, th, again_base)


@dataclass
class Remeasurement:
    """What ``compare --confirm``'s re-measurement brought back: the new code's result files
    (one per run), the base code's (run alternating with them; empty where the base was not
    re-measured) and, where it was not, why."""

    new: list
    base: list = field(default_factory=list)
    base_note: str | None = None


def confirm_regressions(base: pd.DataFrame, new: pd.DataFrame, table: pd.DataFrame,
                        again: pd.DataFrame | None, th: Thresholds = Thresholds(),
                        again_base: pd.DataFrame | None = None) -> pd.DataFrame:
    """``table`` (``compare_runs`` of ``base`` and ``new``, best with ``screen``) with each
    regression decided again on ``again``, a re-measurement of the flagged cases on the new
    code (one or more runs). A time regression stays one only when ``confirm_time`` holds: the
    re-measurement alone is flagged again, and the new and re-measured rounds pooled regress
    beyond ``Thresholds.confirm_limit`` (the between-run spread is the first comparison's,
    which the few re-measured cases cannot estimate); a memory regression when the
    re-measurement's memory regresses too. Its status becomes *unchanged* (note: not
    confirmed) otherwise. A case ``again`` lacks (or ``again`` None: nothing re-measured) is
    decided as measured, by the plain limit (``time_limit``). ``again_base``: the base code
    re-measured in runs alternating with ``again``'s; a case both re-measured is decided by
    ``confirm_alternated`` (the new code's re-measurement against the base code's) instead,
    its memory by the two re-measurements' too. Adds ``confirm_change`` (the re-measurement
    alone; alternated: against the base code's), ``pooled_change``, ``confirm_limit``,
    ``confirm_against`` and ``confirmed``."""
    b_cases, n_cases = _cases(base), _cases(new)
    a_cases = _cases(again) if again is not None else {}
    ab_cases = _cases(again_base) if again_base is not None else {}
    table = table.copy()
    for col in ("confirm_change", "pooled_change", "confirm_limit"):
        table[col] = math.nan
    table["confirm_against"] = pd.Series([None] * len(table), index=table.index, dtype=object)
    table["confirmed"] = pd.Series([None] * len(table), index=table.index, dtype=object)
    table["note"] = table["note"].astype(object)
    table["time_verdict"] = table["time_verdict"].astype(object)
    for i, row in table[table["status"] == Kind.REGRESSION].iterrows():
        key = tuple(row[k] for k in KEY)
        a, b, n = a_cases.get(key), b_cases.get(key), n_cases.get(key)
        on = row["basis"]
        time_flag = row["time_verdict"] == Kind.REGRESSION
        mem_flag = row["memory_verdict"] == Kind.REGRESSION
        if a is None or b is None or n is None or any(
                side.get(on) is None for side in (a, b, n)):
            # Decided as measured: a slowdown counts beyond the plain limit only.
            plain = time_flag and row["time_change"] >= row["time_limit"]
            if time_flag and not plain:
                table.loc[i, "time_verdict"] = Kind.UNCHANGED
            if plain or mem_flag:
                table.loc[i, "note"] = "not re-measured: decided as measured"
            else:
                table.loc[i, ["status", "note"]] = [
                    Kind.UNCHANGED, "flagged for re-measurement, not re-measured; within the "
                    "plain limit"]
            continue
        ab = ab_cases.get(key)
        alternated = ab is not None and ab.get(on) is not None
        time_held = mem_held = False
        if time_flag:
            if alternated:
                time_held, change, limit = confirm_alternated(
                    ab["levels"][on], a["levels"][on], th, row["spread"], row["spread_cases"],
                    b["records"])
                pooled = math.nan
            else:
                time_held, change, pooled, limit = confirm_time(
                    b[on], n[on], a[on], th, row["spread"], row["spread_cases"],
                    (b["records"], n["records"], a["records"]),
                    own_spread(on, row["spread"], row["spread_cases"], b, n, a)[0])
            table.loc[i, ["confirm_change", "pooled_change", "confirm_limit"]] = [
                change, pooled, limit]
            if not time_held:
                table.loc[i, "time_verdict"] = Kind.UNCHANGED
        table.loc[i, "confirm_against"] = ALTERNATED if alternated else "base run"
        mem_base = ab if alternated else b
        if mem_flag and mem_base["kinds"] == a["kinds"]:
            mem_held = memory_verdict(mem_base["memory"], a["memory"], th)[0] == Kind.REGRESSION
        held = time_held or mem_held
        table.loc[i, "confirmed"] = held
        if not held:
            table.loc[i, ["status", "note"]] = [Kind.UNCHANGED, "regression not confirmed "
                                                "by a re-measurement"]
        else:
            table.loc[i, "note"] = "confirmed by a re-measurement"
    return table


def machine_of(path: str | Path) -> dict:
    """The machine of a result file (``gpubench.measure.provenance.recorded_machine``)."""
    from gpubench.measure.provenance import recorded_machine

    return recorded_machine(read_benchmark_json(path).get("machine_info"))


def across_machines(base: pd.DataFrame, new: pd.DataFrame, prices=(None, None)) -> pd.DataFrame:
    """Two machines' runs, case by case: each machine's speedup over its own FP32 baseline
    (``results.with_baseline_ratios``), each one's samples/s and the new machine's throughput
    over the base's; with ``prices`` (a ``cost.Price`` per side, or None), each side's cost
    per million samples (and tokens). No regression is called: the machines differ."""
    from gpubench.analysis.cost import with_cost
    from gpubench.analysis.results import with_baseline_ratios

    sides = []
    for df, price in zip((base, new), prices, strict=True):
        steps = with_baseline_ratios(_steps(df).dropna(subset=["step_time_s"]))
        if price is not None:
            steps = with_cost(steps, price)
        cols = ["speedup", "samples_per_s", "cost_per_m_samples", "cost_per_m_tokens"]
        steps = steps.reindex(columns=[*KEY, *cols])
        sides.append(steps.groupby(list(KEY), sort=False)[cols].median())
    table = sides[0].merge(sides[1], left_index=True, right_index=True, how="inner",
                           suffixes=("_base", "_new"))
    table["throughput_ratio"] = table["samples_per_s_new"] / table["samples_per_s_base"]
    return table.reset_index()


def across_markdown(table: pd.DataFrame, names: tuple[str, str], prices=(None, None)) -> str:
    from gpubench.analysis.cost import cost_headers
    from gpubench.util.tables import markdown_table

    a, b = names
    rows = []
    for _, r in table.iterrows():
        row = {"case": r["case_id"], "speedup vs own FP32 on A": f"{r['speedup_base']:.2f}x",
               "speedup vs own FP32 on B": f"{r['speedup_new']:.2f}x",
               "samples/s on A": f"{r['samples_per_s_base']:.1f}",
               "samples/s on B": f"{r['samples_per_s_new']:.1f}",
               "throughput B / A": f"{r['throughput_ratio']:.2f}x"}
        for side, price, label in (("base", prices[0], "A"), ("new", prices[1], "B")):
            if price is not None:
                samples, tokens = cost_headers(price)
                row[f"{samples} on {label}"] = f"{r[f'cost_per_m_samples_{side}']:.4g}"
                tok = r[f"cost_per_m_tokens_{side}"]
                row[f"{tokens} on {label}"] = "-" if pd.isna(tok) else f"{tok:.4g}"
        rows.append(row)
    return f"A (base): {a}\nB (new): {b}\n\n" + markdown_table(rows)


def _prices(args: argparse.Namespace, sides: int):
    """One ``cost.Price`` per side from ``--price-per-hour`` (one for all, or one per file)."""
    from gpubench.analysis.cost import Price

    try:  # parsed by the command line's argument type; text from a caller parsed here
        given = [p if isinstance(p, Price) else Price.parse(p)
                 for p in (getattr(args, "price_per_hour", None) or [])]
    except ValueError as err:
        raise ValueError(f"--price-per-hour: {err}") from None
    if not given:
        return [None] * sides
    if len(given) == 1:
        return given * sides
    if len(given) != sides:
        raise ValueError(f"--price-per-hour given {len(given)} times: give it once (every "
                         f"machine) or once per file ({sides})")
    return given


def compare_main(args: argparse.Namespace, remeasure=None) -> int:
    """Print the table; exit 1 on a significant regression (0 with --report-only) and 2 when
    NEW holds no case comparable with BASE. With ``--confirm``, slowdowns are flagged beyond
    the lower first-stage limit (``compare_runs(screen=True)``), ``remeasure(new_file, rows,
    base_file)`` (the command line's: ``gpubench run`` of those cases alone, ``--confirm-runs``
    times, alternating with the base code's where it can be checked out) re-measures them and
    returns a ``Remeasurement`` (or the new code's result file(s) alone), and only those that
    regress again count (``confirm_regressions``)."""
    th = Thresholds(time=args.time_threshold, memory=args.memory_threshold, alpha=args.alpha,
                    noise_sigmas=args.noise_sigmas,
                    screen_sigmas=getattr(args, "screen_sigmas", SCREEN_SIGMAS),
                    confirm_sigmas=getattr(args, "confirm_sigmas", CONFIRM_SIGMAS))
    bases, new_file = split_files(args)
    labels = ["base"] if len(bases) == 1 else [f"base{i + 1}" for i in range(len(bases))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = load_results(bases, labels=labels)
        new = load_results([new_file], labels=["new"])
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for base_file in bases:
        prefix = f"{base_file} vs {new_file}: " if len(bases) > 1 else ""
        for msg in environment_warnings(base_file, new_file):
            print(f"warning: the runs come from different environments: {prefix}{msg}",
                  file=sys.stderr)
    prices = _prices(args, len(bases) + 1)
    machines = [machine_of(f) for f in [*bases, new_file]]
    if len({m["id"] for m in machines}) > 1:
        # Two machines: per case, each one's speedup over its own FP32 and the throughput
        # across them; a difference of machines is not a regression.
        across = across_machines(base, new, (prices[0], prices[-1]))
        names = (machines[0]["name"], machines[-1]["name"])
        print("gpubench compare: the runs come from different machines; comparing each "
              "case across them, no regression is called", file=sys.stderr)
        text = across_markdown(across, names, (prices[0], prices[-1]))
        print(text)
        if args.markdown:
            atomic.write_text(args.markdown, text + "\n")
        if across.empty:
            print(f"gpubench compare: {new_file} holds no case comparable with the base",
                  file=sys.stderr)
            return 2
        print(f"\ncompared {len(across)} case(s) across two machines")
        return 0
    confirming = bool(getattr(args, "confirm", False)) and remeasure is not None
    table = compare_runs(base, new, th, basis="normalized" if args.normalized else args.basis,
                         screen=confirming)
    if args.new_only:
        table = table[table["status"] != "removed"]
    flagged = table[table["status"] == Kind.REGRESSION]
    if confirming and len(flagged):
        print(f"gpubench compare: re-measuring {len(flagged)} flagged case(s) to confirm "
              "them", file=sys.stderr, flush=True)
        done = _remeasured(remeasure(new_file, flagged, bases[-1]))
        if done.new:
            print(f"gpubench compare: re-measured in {', '.join(map(str, done.new))}",
                  file=sys.stderr)
        else:
            print("warning: the re-measurement measured none of the flagged cases; they are "
                  "decided as measured", file=sys.stderr)
        if done.new and done.base:
            print(f"gpubench compare: the base code re-measured in "
                  f"{', '.join(map(str, done.base))}", file=sys.stderr)
        elif done.base_note:
            print(f"warning: the base code was not re-measured ({done.base_note}); the "
                  "re-measurement is compared with the base run", file=sys.stderr)
        screened, table = table, _confirmed(base, new, table, done, th)
        for _ in range(CONFIRM_EXTRA_PAIRS if done.new and done.base else 0):
            # A case confirmed against the base code gets one more pair of runs, and stays
            # confirmed only if it still is with them (``CONFIRM_EXTRA_PAIRS``).
            pending = table[(table["confirmed"] == True)  # noqa: E712
                            & (table["confirm_against"] == ALTERNATED)]
            if pending.empty:
                break
            print(f"gpubench compare: {len(pending)} case(s) confirmed against the base code; "
                  "one more pair of runs (base, new) to settle them", file=sys.stderr,
                  flush=True)
            more = _remeasured(remeasure(new_file, pending, bases[-1], runs=1))
            if not (more.new and more.base):
                break
            done.new += more.new
            done.base += more.base
            table = _confirmed(base, new, screened, done, th)
    shift = common_shift(table, th)
    if shift:
        print(f"warning: {shift}", file=sys.stderr)
    text = compare_markdown(table)
    if prices[-1] is not None:
        from gpubench.analysis.cost import cost_markdown

        text += "\n\n" + cost_markdown(new, prices[-1])
    print(text)
    limits = noise_line(table)
    if limits:
        print(f"\n{limits}")
    counts = table["status"].value_counts().to_dict()
    compared = sum(counts.get(s, 0) for s in COMPARED)
    print(f"\ncompared {compared} case(s): "
          + (", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"))
    if args.markdown:
        atomic.write_text(args.markdown, text + "\n")
    if args.github_json and not _steps(new).dropna(subset=["step_time_s"]).empty:
        write_github_json(new, args.github_json)
    if not compared:
        print(f"gpubench compare: {new_file} holds no case comparable with the base (same "
              "model, profile, device and case id, measured on both sides)", file=sys.stderr)
        return 2
    regressions = counts.get(Kind.REGRESSION, 0)
    if regressions and not args.report_only:
        print(f"gpubench compare: {regressions} significant regression(s)", file=sys.stderr)
        return 1
    return 0
