"""False-alarm and detection rates of ``gpubench compare``'s gate, plain and with ``--confirm``.

Simulated pairs of runs of CASES cases compared over their paired baseline rounds: each run
moves each case by its own factor, which its rounds do not show (the between-run noise: 1.5%,
Gaussian, or Student-t with 5 or 3 degrees of freedom scaled to the same median absolute
deviation, so the gate measures the same spread), and each case has 10 rounds spread by 2%
within the run; the changes between two runs then spread by about 2.4%. The base is one run
or several pooled (``compare OLD1 OLD2 NEW``), the re-measurement of the flagged cases one run
or several. Counts the same-commit pairs in which any case fails the gate, and, in pairs where
one case's new code is 10% slower (SLOW), how often that case fails it; 95% Wilson intervals.
"Alternated" is ``--confirm`` as it runs where the base's code can be checked out: the base code
re-measured as often as the new code, a flag decided by the one against the other run by run
(``confirm_alternated``), and a confirmed one again after each of ``CONFIRM_EXTRA_PAIRS`` more
pairs of runs. ``--drift S`` adds what a shared machine does between runs: a factor
per case (log spread S) that the new run and every re-measurement share and the base run does
not (the host moved to another speed since the base ran, for minutes).

The decisions are the gate's own (``Thresholds``' limits, ``robust_spread``, ``flag_time``,
``time_verdict``, ``confirm_time``), applied to the simulated rounds as ``compare_runs`` and
``confirm_regressions`` apply them (``tests/test_history_gate.py`` checks that they agree).
"Before" is the confirmation this gate replaced: the plain limit on the first comparison and
again on the re-measurement alone.

    python scripts/gate_false_alarms.py [--pairs 20000] [--slowed 2000] [--cases 140]
        [--drift 0.03]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import stats

from gpubench.analysis.compare import (
    Thresholds,
    case_limits,
    change_spread,
    confirm_alternated,
    confirm_time,
    flag_time,
    own_spread,
    time_verdict,
)
from gpubench.util.stats import robust_spread
from gpubench.util.verdicts import CONFIRM_EXTRA_PAIRS, Kind

ROUNDS = 10
"""Rounds per case per run."""
BETWEEN = 0.015
"""Spread of a case's own factor per run (log), which its rounds do not show."""
WITHIN = 0.02
"""Spread of a case's rounds within a run (log)."""
NOISES = ("gaussian", "t5", "t3")


def own_factors(rng: np.random.Generator, shape: tuple, noise: str) -> np.ndarray:
    """Each run's factor per case (log): Gaussian, or Student-t ("t5", "t3") scaled to the
    Gaussian's median absolute deviation."""
    if noise == "gaussian":
        return rng.normal(0, BETWEEN, shape)
    dof = int(noise[1:])
    scale = BETWEEN * stats.norm.ppf(0.75) / stats.t(dof).ppf(0.75)
    return scale * rng.standard_t(dof, shape)


def runs(rng: np.random.Generator, pairs: int, cases: int, count: int, noise: str,
         noisy: float = 1.0) -> np.ndarray:
    """(pairs, cases, count x ROUNDS) per-round times over their paired baseline rounds of
    ``count`` runs pooled; case 1's between-run factor ``noisy`` times the others' (a case
    whose level moves between processes, as an emulated precision's does)."""
    own = own_factors(rng, (pairs, cases, count, 1), noise)
    own[:, 1] *= noisy
    rounds = np.exp(own + rng.normal(0, WITHIN, (pairs, cases, count, ROUNDS)))
    return rounds.reshape(pairs, cases, count * ROUNDS)


def simulate(rng: np.random.Generator, pairs: int, cases: int, *, noise: str = "gaussian",
             base_runs: int = 1, again_runs: int = 1, slow: float = 1.0, noisy: float = 1.0,
             drift: float = 0.0):
    """(base, new, again, again_base, again_more) rounds of ``pairs`` comparisons: the base
    run(s), the new run, the new code's ``again_runs`` re-measurements, the base code's
    ``again_runs + CONFIRM_EXTRA_PAIRS`` and the new code's ``CONFIRM_EXTRA_PAIRS`` more
    (the extra pairs); case 0 of the new code ``slow`` times slower; case 1 ``noisy``
    (``runs``); each case moved by a factor of log spread ``drift`` in everything after the
    base run."""
    base = runs(rng, pairs, cases, base_runs, noise, noisy)
    new, again, again_base, again_more = (
        runs(rng, pairs, cases, k, noise, noisy)
        for k in (1, again_runs, again_runs + CONFIRM_EXTRA_PAIRS, CONFIRM_EXTRA_PAIRS))
    for side in (new, again, again_more):
        side[:, 0] *= slow
    if drift:
        moved = np.exp(rng.normal(0, drift, (pairs, cases, 1)))
        new, again, again_base, again_more = (x * moved for x in (new, again, again_base,
                                                                  again_more))
    return base, new, again, again_base, again_more


def _side(rounds: np.ndarray, count: int) -> dict:
    """One side of a case as ``compare``'s ``_cases`` holds it: its level in each of its
    ``count`` runs (their rounds in order) and how many runs."""
    levels = np.median(rounds.reshape(count, -1), axis=1)
    return {"levels": {"paired": levels.tolist()}, "records": count}


def levels(rounds: np.ndarray, count: int) -> list[float]:
    """Each of ``count`` runs' level (the median of its rounds, in order)."""
    return np.median(rounds.reshape(count, -1), axis=1).tolist()


def decide(base: np.ndarray, new: np.ndarray, again: np.ndarray, again_base: np.ndarray,
           again_more: np.ndarray, th: Thresholds, base_runs: int, again_runs: int,
           extra_pairs: int = CONFIRM_EXTRA_PAIRS) -> dict[str, np.ndarray]:
    """Per (pair, case): "plain" (the gate without --confirm fails it), "flagged" (re-measured
    under --confirm), "confirmed" (--confirm against the base run fails it), "alternated"
    (--confirm against the base code re-measured fails it: after ``again_runs`` runs a side
    and each of ``extra_pairs`` more), "before" (the previous confirmation fails it)."""
    pairs, cases, _ = base.shape
    changes = np.median(new, axis=2) / np.median(base, axis=2) - 1
    out = {k: np.zeros((pairs, cases), bool) for k in ("plain", "flagged", "confirmed",
                                                        "alternated", "before")}
    for p in range(pairs):
        spread = robust_spread(changes[p])
        plain = th.time_limit(spread, cases)
        screen = th.screen_limit(spread, cases)
        for c in np.flatnonzero(changes[p] >= min(plain, screen)):
            b, n, a = base[p, c], new[p, c], again[p, c]
            sides = [_side(x, k) for x, k in ((b, base_runs), (n, 1), (a, again_runs))]
            own = own_spread("paired", spread, cases, *sides[:2])[0]
            case_plain, case_screen, _ = case_limits(th, plain, screen,
                                                     change_spread(own, base_runs, 1))
            if time_verdict(b, n, th, case_plain)[0] == Kind.REGRESSION:
                out["plain"][p, c] = True
                out["before"][p, c] = time_verdict(b, a, th, case_plain)[0] == Kind.REGRESSION
            if flag_time(b, n, th, case_plain, case_screen)[0] == Kind.REGRESSION:
                out["flagged"][p, c] = True
                own = own_spread("paired", spread, cases, *sides)[0]
                out["confirmed"][p, c] = confirm_time(
                    b, n, a, th, spread, cases, (base_runs, 1, again_runs), own)[0]
                runs_b = levels(again_base[p, c], again_runs + CONFIRM_EXTRA_PAIRS)
                runs_n = [*levels(a, again_runs), *levels(again_more[p, c],
                                                          CONFIRM_EXTRA_PAIRS)]
                held = False
                for k in range(again_runs, again_runs + extra_pairs + 1):
                    held = confirm_alternated(runs_b[:k], runs_n[:k], th, spread, cases,
                                              base_runs)[0]
                    if not held:
                        break
                out["alternated"][p, c] = held
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of the rate k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def rate(k: int, n: int) -> str:
    low, high = wilson(k, n)
    return f"{k / n:.2%} ({low:.2%}-{high:.2%})"


def measure(rng, pairs: int, slowed: int, cases: int, noise: str, base_runs: int,
            again_runs: int, slow: float, th: Thresholds | None = None, chunk: int = 500,
            noisy: float = 1.0, drift: float = 0.0) -> dict:
    """Counts over ``pairs`` same-commit pairs and ``slowed`` pairs with case 0 slower (case
    1 ``noisy``, ``runs``)."""
    th = th or Thresholds()
    failed = {"plain": 0, "before": 0, "confirmed": 0, "alternated": 0}
    flagged = 0
    for start in range(0, pairs, chunk):
        size = min(chunk, pairs - start)
        sides = simulate(rng, size, cases, noise=noise, base_runs=base_runs,
                         again_runs=again_runs, noisy=noisy, drift=drift)
        out = decide(*sides, th, base_runs, again_runs)
        for k in failed:
            failed[k] += int(out[k].any(axis=1).sum())
        flagged += int(out["flagged"].sum())
    caught = {"plain": 0, "before": 0, "confirmed": 0, "alternated": 0}
    for start in range(0, slowed, chunk):
        size = min(chunk, slowed - start)
        sides = simulate(rng, size, cases, noise=noise, base_runs=base_runs,
                         again_runs=again_runs, slow=slow, noisy=noisy, drift=drift)
        out = decide(*sides, th, base_runs, again_runs)
        for k in caught:
            caught[k] += int(out[k][:, 0].sum())
    return {"failed": failed, "caught": caught, "flagged": flagged, "pairs": pairs,
            "slowed": slowed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=20000,
                   help="same-commit pairs per row (Gaussian; a quarter for the t rows)")
    p.add_argument("--slowed", type=int, default=2000, help="pairs with a slower case per row")
    p.add_argument("--cases", type=int, default=140)
    p.add_argument("--slow", type=float, default=0.10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--noisy", type=float, default=1.0, metavar="FACTOR",
                   help="case 1's between-run spread, times the others' (default 1: none "
                   "stands out; 10: an emulated precision's case)")
    p.add_argument("--drift", type=float, default=0.0, metavar="S",
                   help="log spread of a per-case factor the new run and the re-measurements "
                   "share and the base run does not (default 0: runs independent)")
    p.add_argument("--noises", default=",".join(NOISES),
                   help=f"which between-run noises, comma-separated (default {','.join(NOISES)})")
    args = p.parse_args()
    bad = [n for n in args.noises.split(",") if n not in NOISES]
    if bad:
        p.error(f"--noises: {', '.join(map(repr, bad))} not one of {', '.join(NOISES)}")
    rng = np.random.default_rng(args.seed)
    th = Thresholds()
    print(f"{args.cases} cases; limits: plain {th.noise_sigmas:g} spreads; --confirm flags "
          f"beyond {th.screen_sigmas:g} spreads, confirms beyond {th.confirm_sigmas:g} standard "
          f"deviations of the pooled change; time threshold {th.time:.0%}; case 1's "
          f"between-run spread {args.noisy:g} times the others'; drift after the base run "
          f"{args.drift:.1%}\n")
    print(f"| between-run noise | base runs | re-measurements | same-commit pairs that fail: "
          f"plain | before | --confirm against the base run | alternated | cases re-measured "
          f"per pair | {args.slow:.0%} slowdown caught: plain | before | --confirm against the "
          "base run | alternated |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for noise in args.noises.split(","):
        pairs = args.pairs if noise == "gaussian" else max(1, args.pairs // 4)
        for base_runs, again_runs in ((1, 1), (1, 2), (2, 2), (3, 2)):
            start = time.perf_counter()
            m = measure(rng, pairs, args.slowed, args.cases, noise, base_runs, again_runs,
                        1 + args.slow, th, noisy=args.noisy, drift=args.drift)
            f, c = m["failed"], m["caught"]
            print(f"| {noise} | {base_runs} | {again_runs} | "
                  + " | ".join(rate(f[k], pairs) for k in ("plain", "before", "confirmed",
                                                           "alternated"))
                  + f" | {m['flagged'] / pairs:.2f} | "
                  + " | ".join(rate(c[k], args.slowed) for k in ("plain", "before",
                                                                   "confirmed", "alternated"))
                  + " |", flush=True)
            print(f"<!-- {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
