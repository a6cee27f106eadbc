"""How long ``gpubench history`` takes on a large history: RUNS runs of CASES cases each.

Builds the history from one real result file (its step cases repeated under new ids up to
CASES, every figure jittered per run) with ``save_run`` for the first run and copies of its
index for the others (saving is not what is timed), then times reading it
(``read_history``), building its series and finding the change points, and prints the sizes.

    python scripts/history_read_time.py [RESULT_FILE] [--runs 500] [--cases 100]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from gpubench.analysis.history import detect, history_series, read_history, save_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("result", nargs="?", default="tests/data/cpu-run.json")
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--cases", type=int, default=100)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "history"
        first = save_run(args.result, folder)
        index = json.loads(first.read_text())
        cases = index["cases"]
        n = len(cases["case_id"])
        reps = -(-args.cases // n)
        cases = {k: (v * reps)[:args.cases] for k, v in cases.items()}
        cases["case_id"] = [f"{c}-v{i // n}" if i >= n else c
                            for i, c in enumerate(cases["case_id"])]
        first.unlink()
        for run in range(args.runs):
            jitter = np.exp(rng.normal(0, 0.02, args.cases))
            copy = dict(index, cases={**cases, **{
                k: [None if v is None else v * j for v, j in zip(cases[k], jitter, strict=True)]
                for k in ("step_time_s", "paired")}})
            copy["commit"] = {**index["commit"], "id": f"{run:08x}" + "0" * 32,
                              "time": f"2026-{1 + run // 250:02d}-{1 + run % 250 // 10:02d}"
                                      f"T{run % 10:02d}:00:00+00:00"}
            (first.parent / f"{run + 1:04d}_{run:08x}_x.json").write_text(json.dumps(copy))
        size = sum(f.stat().st_size for f in first.parent.glob("*.json"))
        start = time.perf_counter()
        history = read_history(folder)
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        series = history_series(history)
        series_s = time.perf_counter() - start
        start = time.perf_counter()
        changes = detect(series)
        detect_s = time.perf_counter() - start
        print(f"{len(history.runs)} runs x {args.cases} cases ({len(history.cases)} case rows, "
              f"indexes {size / 2**20:.1f} MiB, {size / args.runs / 1024:.1f} KiB per run): "
              f"read {read_s:.2f} s, series {series_s:.2f} s, change points {detect_s:.2f} s "
              f"over {series.groupby(['case_id', 'metric']).ngroups} series "
              f"({len(changes)} found)")


if __name__ == "__main__":
    main()
