"""The paired speedup gpubench prints against each configuration run alone in its own process.

For each case: the speedup a user gets by switching configuration, measured as each side run
alone (``gpubench case`` in a fresh process, the baseline's and the variant's alternated
``--repeats`` times, the order swapped each time; the median of the per-pair ratios of median
step times, times the ratio of global batches), and the paired figure of a run (``run_case``
with a ``PairedBaseline``, the profile's target width and caps: what ``gpubench run`` records
as ``speedup_paired``), measured in one process for all cases as a run does, in
``--paired-processes`` fresh processes. Both figures are replicated over processes because a
process is itself a source of error: on a shared VM the same configuration runs several percent
faster or slower for a process's whole life, differently for different kernels (bf16's and
fp32's), which no pairing inside one process can see. The two methods are interleaved in
time (paired process i, then separate pair i of each case), so both sample the same stretch of
the machine's drift. Writes a markdown table with each method's median, its spread over
processes, the difference of the medians, and the difference repetition by repetition (the
median over i of paired figure i / separate pair i), in which drift between repetitions
cancels.

    python scripts/paired_vs_separate.py [--profile cpu] [--repeats 3] [--rounds 20]
        [--paired-processes 3] [--cases resnet18-fp32-adam,...] [--threads N]
        [--out results/cpu/paired_vs_separate.md]

``--threads N`` runs every process at N torch threads (``OMP_NUM_THREADS``). On a VM whose
host runs two-thread steps at two speeds from one process to the next
(``scripts/host_modes.py``), a separate-process figure at two threads samples those speeds;
at one thread it does not.
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
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if done.returncode:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{done.stderr[-2000:]}")
    info = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    return info["step_time_s"]


def separate_pair(cfg, rounds: int, i: int, tmp: Path) -> float:
    """One alternation: baseline step / case step (per sample), each alone in a fresh
    process, the baseline first on even ``i`` and second on odd."""
    batches = cfg.global_batch / cfg.baseline.global_batch
    order = (cfg.baseline, cfg) if i % 2 == 0 else (cfg, cfg.baseline)
    times = {c.id: separate_step_s(c, rounds, tmp) for c in order}
    ratio = times[cfg.baseline.id] / times[cfg.id] * batches
    print(f"  separate {cfg.id} pair {i + 1}: {ratio:.3f}", flush=True)
    return ratio


ENV = dict(os.environ)
"""The environment of the processes this script starts (``--threads`` sets their threads)."""


def paired_speedup(cfg, profile, partner: str = "process") -> dict:
    """The run's paired figure of ``cfg`` (``run_case`` as ``gpubench run`` calls it, with
    its ``--partner``)."""
    from gpubench.measure.protocol import PairedBaseline
    from gpubench.measure.runner import run_case
    from gpubench.measure.standalone import StandaloneBenchmark

    baseline = PairedBaseline(cfg, timeout_s=600, in_process=partner == "process")
    try:
        return run_case(StandaloneBenchmark(cfg.id), cfg, rounds=profile.rounds,
                        warmup_rounds=profile.warmup, max_time_s=profile.max_time_s,
                        min_time_s=profile.min_time_s, baseline=baseline,
                        target_width=profile.target_width)
    finally:
        baseline.close()


PAIRED_FIELDS = ("speedup_paired", "speedup_paired_low", "speedup_paired_high", "rounds_stop",
                 "paired_baseline_rounds_s")


def paired_in_fresh_process(args, wanted: list[str], tmp: Path, i: int) -> dict[str, dict]:
    """The paired figures of ``wanted``, all measured in one fresh process (this script with
    ``--paired-only``), as ``gpubench run`` measures them."""
    out = tmp / f"paired-{i}.json"
    cmd = [sys.executable, __file__, "--profile", args.profile, "--device", args.device,
           "--cases", ",".join(wanted), "--partner", args.partner, "--paired-only", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if done.returncode:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(out.read_text())


def read_separate(path: Path) -> dict[str, tuple[float, list[float]]]:
    """The separate figures of a table this script wrote: case -> (median, pairs)."""
    found = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or "(" not in cells[1]:
            continue
        median, pairs = cells[1].split("(", 1)
        try:
            found[cells[0]] = (float(median), [float(x) for x in pairs.rstrip(")").split(",")])
        except ValueError:  # the header
            continue
    return found


def local_difference(infos: list[dict], ratios: list[float]) -> float | None:
    """Median over repetitions i of paired figure i / separate pair i - 1: the two methods
    compared within the same stretch of time (paired process i ran just before separate pair
    i), so drift between repetitions cancels; None with fewer than two repetitions of both."""
    diffs = [info["speedup_paired"] / r - 1 for info, r in zip(infos, ratios, strict=False)]
    return statistics.median(diffs) if len(diffs) >= 2 else None


def spread(values: list[float]) -> str:
    """The range of ``values`` over their median, as +-%."""
    mid = statistics.median(values)
    return f"{(max(values) - min(values)) / 2 / mid:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20,
                        help="timed rounds of each separate process (default 20)")
    parser.add_argument("--paired-processes", type=int, default=3,
                        help="fresh processes measuring the paired figures (default 3)")
    parser.add_argument("--partner", default="process", choices=("process", "worker"),
                        help="where the paired baseline runs, as gpubench run --partner")
    parser.add_argument("--separate", type=Path, default=None,
                        help="a table this script wrote: take its separate figures instead of "
                             "measuring them again")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of every process started (OMP_NUM_THREADS; "
                             "default: torch's)")
    parser.add_argument("--paired-only", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="markdown table (default: stdout only)")
    args = parser.parse_args()
    for name in ("repeats", "rounds", "paired_processes", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1; got {value}")
    if args.threads is not None:
        ENV["OMP_NUM_THREADS"] = str(args.threads)
    from gpubench.suite.cases import profile_cases
    from gpubench.workloads.profiles import profile

    budget = profile(args.profile)
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    models = tuple(dict.fromkeys(c.split("-")[0] for c in wanted))
    try:
        cases = {c.id: c.cfg for c in profile_cases(args.profile, args.device, models, None)}
    except ValueError as err:  # an unknown model or profile (WorkloadError is one)
        parser.error(f"--cases: {str(err).splitlines()[0]}")
    bad = [c for c in wanted if c not in cases]
    if bad:
        raise SystemExit(f"--cases: unknown case {', '.join(bad)}; valid: {', '.join(cases)}")
    if args.paired_only:  # a child of the script: this process's paired figures
        found = {}
        for cid in wanted:
            info = paired_speedup(cases[cid], budget, args.partner)
            found[cid] = {k: info.get(k) for k in PAIRED_FIELDS}
        Path(args.paired_only).write_text(json.dumps(found))
        return
    started = time.time()
    earlier = read_separate(args.separate) if args.separate else {}
    paired: dict[str, list[dict]] = {cid: [] for cid in wanted}
    ratios: dict[str, list[float]] = {cid: list(earlier[cid][1]) if cid in earlier else []
                                      for cid in wanted}
    with tempfile.TemporaryDirectory() as tmp:
        # Interleaved in time: paired process i, then separate pair i of every case, so both
        # methods sample the same stretch of the machine's drift (``local_difference``).
        for i in range(max(args.paired_processes, args.repeats)):
            if i < args.paired_processes:
                for cid, info in paired_in_fresh_process(args, wanted, Path(tmp), i).items():
                    paired[cid].append(info)
                    print(f"  paired {cid} process {i + 1}: {info['speedup_paired']:.3f} "
                          f"[{info['speedup_paired_low']:.3f}-"
                          f"{info['speedup_paired_high']:.3f}] "
                          f"{len(info['paired_baseline_rounds_s'])} rounds, stopped by "
                          f"{info['rounds_stop']}", flush=True)
            for cid in wanted:
                if cid not in earlier and i < args.repeats:
                    ratios[cid].append(separate_pair(cases[cid], args.rounds, i, Path(tmp)))
    rows = [(cid, statistics.median(ratios[cid]), ratios[cid], paired[cid],
             None if cid in earlier else local_difference(paired[cid], ratios[cid]))
            for cid in wanted]
    load = os.getloadavg()
    lines = [
        f"# Paired speedup against separate processes ({args.profile}, {args.device})",
        "",
        "Separate: each configuration alone in a fresh `gpubench case` process "
        f"(`--rounds {args.rounds}`), baseline and variant alternated {args.repeats} times "
        "(order swapped each time), median of the per-pair ratios of median step times. "
        "Paired: `speedup_paired` of `run_case` with the run's paired baseline and the "
        f"profile's stopping rule (target width {budget.target_width}), all cases in one "
        f"process as in `gpubench run` (`--partner {args.partner}`), in "
        f"{args.paired_processes} fresh processes. Threads per process: "
        f"{args.threads or 'torch default'}. "
        "Spread: half the range over the processes (pairs), over the median.",
        "",
        "| case | separate (pairs) | spread | paired (processes) | spread | "
        "one process's interval (median half-width) | difference | "
        "difference, repetition by repetition |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for cid, sep, pairs, infos, local in rows:
        figures = [i["speedup_paired"] for i in infos]
        mid = statistics.median(figures)
        width = statistics.median(
            (i["speedup_paired_high"] - i["speedup_paired_low"]) / 2 / i["speedup_paired"]
            for i in infos)
        diff = mid / sep - 1
        worst = max(worst, abs(diff))
        lines.append(
            f"| {cid} | {sep:.3f} ({', '.join(f'{r:.3f}' for r in pairs)}) | "
            f"{spread(pairs)} | {mid:.3f} ({', '.join(f'{f:.3f}' for f in figures)}) | "
            f"{spread(figures)} | {width:.1%} | {diff:+.1%} | "
            f"{'-' if local is None else format(local, '+.1%')} |")
    lines += ["", f"Largest difference: {worst:.1%}. Took {time.time() - started:.0f} s; "
              f"load average at the end {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on "
              f"{os.cpu_count()} cores.", "",
              "Made with: `python scripts/paired_vs_separate.py " + " ".join(sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
