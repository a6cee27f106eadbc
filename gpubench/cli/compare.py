"""The ``gpubench compare`` arguments, in a module light enough for the command line's --help."""

from __future__ import annotations

import argparse

from gpubench.util.argtypes import bounded, non_negative, positive_int
from gpubench.util.verdicts import (
    ALPHA,
    COMPARE_BASES,
    CONFIRM_RUNS,
    CONFIRM_SIGMAS,
    MEMORY_THRESHOLD,
    NOISE_SIGMAS,
    SCREEN_SIGMAS,
    SCREEN_THRESHOLD_SHARE,
    TIME_THRESHOLD,
)

PRICE_HELP = ("price per hour of the whole machine (2.5 or 2.5/machine) or of each GPU a case "
              "uses (2.5/gpu): adds the cost per million samples (and tokens, for language "
              "models)")


def price_per_hour(text: str):
    """The argparse type of ``--price-per-hour`` (summary, compare, tune): a
    ``gpubench.analysis.cost.Price``; a bad value is argparse's one-line error, exit 2."""
    from gpubench.analysis.cost import Price

    try:
        return Price.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


price_per_hour.__name__ = "price per hour"

_alpha = bounded(float, low=0, high=1, open_low=True, open_high=True)
_threshold = non_negative


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="BASE [BASE ...] NEW: baseline pytest-benchmark JSON file(s), then the "
                   "new one (several base files pool their rounds per case); with --base, "
                   "only NEW")
    p.add_argument("--base", action="append", default=[], metavar="BASE",
                   help="a baseline file (repeatable); the positional FILE is then NEW alone")
    p.add_argument("--time-threshold", type=_threshold, default=TIME_THRESHOLD,
                   help="minimum relative change of median time that counts (default 0.07)")
    p.add_argument("--memory-threshold", type=_threshold, default=MEMORY_THRESHOLD,
                   help="minimum relative change of training memory that counts "
                   "(default 0.02)")
    p.add_argument("--alpha", type=_alpha, default=ALPHA,
                   help="significance level of the Mann-Whitney U test, in (0, 1) "
                   "(default 0.05)")
    p.add_argument("--basis", choices=COMPARE_BASES, default="auto",
                   help="what a case's rounds are compared as: auto (default) over its paired "
                   "baseline rounds where both runs have them, else as they are; raw: as "
                   "they are; normalized: every case over its own run's FP32 baseline")
    p.add_argument("--normalized", action="store_true",
                   help="the same as --basis normalized")
    p.add_argument("--noise-sigmas", type=_threshold, default=NOISE_SIGMAS,
                   help="a time change must also exceed this many between-run spreads of its "
                   "basis, estimated from the changes of all compared cases when there are "
                   "at least 8 (default 3; 0: the time threshold alone)")
    p.add_argument("--new-only", action="store_true",
                   help="only cases NEW ran (a partial run): do not list the others as removed")
    p.add_argument("--report-only", action="store_true",
                   help="exit 0 despite regressions (for noisy shared machines); a NEW run "
                   "without any comparable case still fails")
    p.add_argument("--markdown", help="also write the table as Markdown to this file")
    p.add_argument("--github-json", metavar="DIR",
                   help="write NEW's figures for github-action-benchmark into DIR: "
                   "smaller_is_better.json (time, memory) and bigger_is_better.json "
                   "(throughput, MFU)")
    p.add_argument("--price-per-hour", action="append", type=price_per_hour, metavar="PRICE",
                   help=PRICE_HELP + "; once for every file, or once per file in order")
    p.add_argument("--confirm", action="store_true",
                   help="a two-stage gate: flag slowdowns beyond --screen-sigmas between-run "
                   "spreads, re-measure the flagged cases on the new code (gpubench run of "
                   "those cases alone, in this checkout), and keep a regression only if the "
                   "re-measurement is flagged again and the new and re-measured rounds pooled "
                   "exceed --confirm-sigmas standard deviations of their change. Simulated at the "
                   "defaults (140 cases whose changes between runs spread by 2.4%%, Gaussian): two "
                   "runs of one "
                   "commit fail 0.6%% of the time (plain: 19%%; heavier-tailed noise fails "
                   "more), a 10%% slowdown is caught 77%% of the time with one base file, 93%% "
                   "with two (docs: Tracking over time; scripts/gate_false_alarms.py)")
    p.add_argument("--screen-sigmas", type=_threshold, default=SCREEN_SIGMAS,
                   help="with --confirm: a slowdown beyond this many between-run spreads "
                   f"(and {SCREEN_THRESHOLD_SHARE * 100:g}%% of --time-threshold; never more "
                   f"than the plain limit) is re-measured (default {SCREEN_SIGMAS:g})")
    p.add_argument("--confirm-sigmas", type=_threshold, default=CONFIRM_SIGMAS,
                   help="with --confirm: the pooled change must exceed --time-threshold and "
                   "this many of its standard deviations, the between-run spread scaled for "
                   "the runs pooled on each side (default "
                   f"{CONFIRM_SIGMAS:g}; 0: the time threshold alone)")
    p.add_argument("--confirm-runs", type=positive_int, default=CONFIRM_RUNS, metavar="N",
                   help="with --confirm: re-measure the flagged cases N times, pooled "
                   f"(default {CONFIRM_RUNS})")
    p.add_argument("--confirm-args", default="", metavar="ARGS",
                   help="extra gpubench run options for the re-measurement, as one string "
                   "(e.g. \"--rounds 10\"; default: the profile's own, at NEW's torch "
                   "threads)")


def remeasure_cases(args: argparse.Namespace):
    """The re-measurement ``compare --confirm`` runs: a function of (NEW file, the flagged
    rows) that runs ``gpubench run`` on those cases alone (same profile, device and workload
    per model, and NEW's torch threads unless ``--confirm-args`` sets them; ``-k`` by their
    test names), ``--confirm-runs`` times, into a temporary folder
    beside NEW, and returns one result file per run that measured any of them (none: an empty
    list)."""

    def remeasure(new_file, rows):
        import json
        import shlex
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        extra = shlex.split(args.confirm_args or "")
        out = Path(tempfile.mkdtemp(prefix="confirm-", dir=Path(new_file).parent))
        data = json.loads(Path(new_file).read_text())
        records = data["benchmarks"]
        threads = ((data.get("machine_info") or {}).get("gpubench") or {}).get("torch_threads")
        if isinstance(threads, int) and threads > 0 and not any(
                a == "--threads" or a.startswith("--threads=") for a in extra):
            # at NEW's torch threads: a run at --threads 1 re-measured at the default would
            # compare two settings (on a 2-core VM, two host levels apart)
            extra = ["--threads", str(threads), *extra]
        names = {(b["extra_info"].get("model"), b["extra_info"].get("case_id")):
                 (b.get("name"), b["extra_info"].get("workload")) for b in records
                 if isinstance(b.get("extra_info"), dict)}
        runs = getattr(args, "confirm_runs", 1) or 1
        results = []
        for run in range(1, runs + 1):
            files = []
            for (profile, device), group in rows.groupby(["profile", "device"]):
                tests, workloads = [], []
                for _, r in group.iterrows():
                    name, workload = names.get((r["model"], r["case_id"]),
                                               (f"test_step[{r['case_id']}]", r["model"]))
                    tests.append(name[name.index("["):] if "[" in name else name)
                    workloads.append(workload or r["model"])
                dest = out / (f"{profile}-{device}" if runs == 1
                              else f"run{run}-{profile}-{device}")
                cmd = [sys.executable, "-m", "gpubench", "run", "--profile", profile,
                       "--device", device, "--models", ",".join(dict.fromkeys(workloads)),
                       "-k", " or ".join(tests), "--no-charts", "--no-hygiene",
                       "--out", str(dest), *extra]
                print(f"gpubench compare: {shlex.join(cmd)}", file=sys.stderr, flush=True)
                subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
                if (dest / "benchmark.json").is_file():
                    files.append(dest / "benchmark.json")
            if len(files) > 1:  # one file per re-measurement run
                merged = json.loads(files[0].read_text())
                for f in files[1:]:
                    merged["benchmarks"] += json.loads(f.read_text())["benchmarks"]
                target = out / (f"run{run}.json" if runs > 1 else "benchmark.json")
                target.write_text(json.dumps(merged))
                files = [target]
            results += files
        return results  # empty: nothing re-measured, decided as they were

    return remeasure
