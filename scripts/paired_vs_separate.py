"""The paired speedup gpubench prints against each configuration run alone in its own process.

For each case: the speedup a user gets by switching configuration, measured as each side run
alone (``gpubench case`` in a fresh process, the baseline's and the variant's alternated
``--repeats`` times, the order swapped each time; the median of the per-pair ratios of median
step times, times the ratio of global batches), and the paired figure of a run (``run_case``
with a ``PairedBaseline``, the profile's target width and caps: what ``gpubench run`` records
as ``speedup_paired``), measured in one process for all cases as a run does. Writes a markdown
table with the difference.

    python scripts/paired_vs_separate.py [--profile cpu] [--repeats 3] [--rounds 20]
        [--cases resnet18-fp32-adam,...] [--out results/cpu/paired_vs_separate.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

DEFAULT_CASES = ("resnet18-fp32-adam", "resnet18-fp32-cl", "resnet18-bf16",
                 "bert-bf16-sdpa_flash", "gpt2-fp32-attn_eager", "gpt2-bf16")
"""Optimizers, layout, precision, attention, across the three models."""


def case_flags(cfg) -> list[str]:
    """``gpubench case`` flags that rebuild ``cfg``: one per field that differs from its
    default (``gpubench.cli.case``: a flag per RunConfig and LoaderConfig field)."""
    from gpubench.train.config import LoaderConfig, RunConfig

    out = ["--model", cfg.model, "--profile", cfg.profile, "--device", cfg.device]
    for obj, cls in ((cfg, RunConfig), (cfg.loader, LoaderConfig)):
        default = cls(model=cfg.model) if cls is RunConfig else cls()
        for f in fields(cls):
            if f.name in ("model", "profile", "device", "loader"):
                continue
            value = getattr(obj, f.name)
            if value == getattr(default, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                out += [flag, str(value)]
    return out


def separate_step_s(cfg, rounds: int, tmp: Path) -> float:
    """Median step seconds of ``cfg`` alone in a fresh ``gpubench case`` process."""
    out = tmp / f"{cfg.id}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "gpubench", "case", *case_flags(cfg), "--rounds", str(rounds),
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{done.stderr[-2000:]}")
    info = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    return info["step_time_s"]


def separate_speedup(cfg, rounds: int, repeats: int, tmp: Path) -> tuple[float, list[float]]:
    """Median over ``repeats`` alternations of baseline step / case step (per sample)."""
    ratios = []
    batches = cfg.global_batch / cfg.baseline.global_batch
    for i in range(repeats):
        order = (cfg.baseline, cfg) if i % 2 == 0 else (cfg, cfg.baseline)
        times = {c.id: separate_step_s(c, rounds, tmp) for c in order}
        ratios.append(times[cfg.baseline.id] / times[cfg.id] * batches)
        print(f"  separate {cfg.id} pair {i + 1}: {ratios[-1]:.3f}", flush=True)
    return statistics.median(ratios), ratios


def paired_speedup(cfg, profile) -> dict:
    """The run's paired figure of ``cfg`` (``run_case`` as ``gpubench run`` calls it)."""
    from gpubench.measure.protocol import PairedBaseline
    from gpubench.measure.runner import run_case
    from gpubench.measure.standalone import StandaloneBenchmark

    baseline = PairedBaseline(cfg, timeout_s=600)
    try:
        return run_case(StandaloneBenchmark(cfg.id), cfg, rounds=profile.rounds,
                        warmup_rounds=profile.warmup, max_time_s=profile.max_time_s,
                        min_time_s=profile.min_time_s, baseline=baseline,
                        target_width=profile.target_width)
    finally:
        baseline.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20,
                        help="timed rounds of each separate process (default 20)")
    parser.add_argument("--out", default=None, help="markdown table (default: stdout only)")
    args = parser.parse_args()
    from gpubench.suite.cases import profile_cases
    from gpubench.workloads.profiles import profile

    budget = profile(args.profile)
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    models = tuple(dict.fromkeys(c.split("-")[0] for c in wanted))
    cases = {c.id: c.cfg for c in profile_cases(args.profile, args.device, models, None)}
    bad = [c for c in wanted if c not in cases]
    if bad:
        raise SystemExit(f"--cases: unknown case {', '.join(bad)}; valid: {', '.join(cases)}")
    rows = []
    started = time.time()
    paired = {}
    for cid in wanted:  # one process for all paired cases, as a run measures them
        info = paired_speedup(cases[cid], budget)
        paired[cid] = info
        print(f"  paired {cid}: {info['speedup_paired']:.3f} "
              f"[{info['speedup_paired_low']:.3f}-{info['speedup_paired_high']:.3f}] "
              f"{len(info['paired_baseline_rounds_s'])} rounds, stopped by "
              f"{info.get('rounds_stop')}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for cid in wanted:
            sep, ratios = separate_speedup(cases[cid], args.rounds, args.repeats, Path(tmp))
            info = paired[cid]
            rows.append((cid, sep, ratios, info))
    load = os.getloadavg()
    lines = [
        f"# Paired speedup against separate processes ({args.profile}, {args.device})",
        "",
        "Separate: each configuration alone in a fresh `gpubench case` process "
        f"(`--rounds {args.rounds}`), baseline and variant alternated {args.repeats} times "
        "(order swapped each time), median of the per-pair ratios of median step times. "
        "Paired: `speedup_paired` of `run_case` with the run's paired baseline and the "
        f"profile's stopping rule (target width {budget.target_width}), all cases in one "
        "process as in `gpubench run`.",
        "",
        "| case | separate (pairs) | paired [95% interval] | rounds, stop | difference |",
        "|---|---|---|---|---|",
    ]
    for cid, sep, ratios, info in rows:
        diff = info["speedup_paired"] / sep - 1
        lines.append(
            f"| {cid} | {sep:.3f} ({', '.join(f'{r:.3f}' for r in ratios)}) | "
            f"{info['speedup_paired']:.3f} [{info['speedup_paired_low']:.3f}-"
            f"{info['speedup_paired_high']:.3f}] | {len(info['paired_baseline_rounds_s'])}, "
            f"{info.get('rounds_stop')} | {diff:+.1%} |")
    worst = max(abs(info["speedup_paired"] / sep - 1) for _, sep, _, info in rows)
    lines += ["", f"Largest difference: {worst:.1%}. Took {time.time() - started:.0f} s; "
              f"load average at the end {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on "
              f"{os.cpu_count()} cores (other jobs shared the machine).", "",
              "Made with: `python scripts/paired_vs_separate.py " + " ".join(sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
