"""False-alarm and detection rates of the history's change points (``change_points``).

Series of per-run values with heavy-tailed noise (Student-t, 3 degrees of freedom, scaled to a
between-run spread), N without a change and N/2 with a STEP (default 10%) two thirds of the way
along; counts the series with a (persistent) change point, with a pending one, and how often the
step is found, and found alone at its exact run.

    python scripts/history_false_alarms.py [--series 400] [--step 0.10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpubench.analysis.history import change_points


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--series", type=int, default=400)
    p.add_argument("--step", type=float, default=0.10)
    args = p.parse_args()
    rng = np.random.default_rng(1)

    def noise(n: int, sigma: float) -> np.ndarray:
        return np.exp(sigma * rng.standard_t(3, n) / np.sqrt(3))

    print("| runs | spread | false change point | the test alone (no minimum magnitude) | "
          "pending flag | step found | found alone at its run | ms per series |")
    print("|---|---|---|---|---|---|---|---|")
    for n, sigma in ((30, 0.03), (30, 0.05), (100, 0.03)):
        start = time.perf_counter()
        false = pending = test_alone = 0
        for i in range(args.series):
            x = noise(n, sigma)
            cps = change_points(x, seed=i)
            false += any(c.persistent for c in cps)
            pending += any(not c.persistent for c in cps)
            test_alone += any(c.persistent for c in change_points(x, seed=i, min_magnitude=0))
        found = exact = 0
        for i in range(args.series // 2):
            x = noise(n, sigma)
            k = 2 * n // 3
            x[k:] *= 1 + args.step
            cps = [c for c in change_points(x, seed=i) if c.persistent]
            found += bool(cps)
            exact += len(cps) == 1 and cps[0].at == k
        ms = (time.perf_counter() - start) / (1.5 * args.series) * 1e3
        half = args.series // 2
        print(f"| {n} | {sigma:.0%} | {false} of {args.series} | {test_alone} of {args.series} | "
              f"{pending} of {args.series} | "
              f"{found} of {half} | {exact} of {half} | {ms:.0f} |")


if __name__ == "__main__":
    main()
