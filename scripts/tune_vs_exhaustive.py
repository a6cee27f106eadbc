"""The tuner against an exhaustive sweep of the same space, measured the same way, per model:
each one's winner and measured seconds (what ``tests/test_tune.py`` checks for BERT).

    python scripts/tune_vs_exhaustive.py [MODEL ...]     (default: bert gpt2)
"""

from __future__ import annotations

import sys
import tempfile

from gpubench.diagnostics.tune import Tuner, exhaustive

DIMS = ("precision", "micro_batch", "optimizer_impl", "checkpointing")


def main(models: list[str]) -> None:
    print("| model | configurations | tuner (s) | sweep (s) | share | tuner's winner | "
          "sweep's winner |")
    print("|---|---|---|---|---|---|---|")
    for spec in models:
        with tempfile.TemporaryDirectory() as out:
            result = Tuner(spec, "smoke", "cpu", out, dims=DIMS, ablate=False,
                           progress=lambda line: None).run()
        sweep = exhaustive(spec, "smoke", "cpu", dims=DIMS, progress=lambda line: None)
        w, b = result.winner, sweep["winner"]
        print(f"| {spec} | {len(result.candidates)} | {result.measured_s:.1f} | "
              f"{sweep['measured_s']:.1f} | {result.measured_s / sweep['measured_s']:.0%} | "
              f"{w['case_id']} {w['speedup']:.3f} | {b['case_id']} {b['speedup']:.3f} "
              f"[{b['low']:.2f}-{b['high']:.2f}] |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["bert", "gpt2"])
