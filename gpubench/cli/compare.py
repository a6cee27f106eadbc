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

CONFIRM_AGAINST = ("base", "run")
"""``compare --confirm-against``: what the new code's re-measurement is compared with."""

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
                   "spreads, re-measure the flagged cases (gpubench run of those cases alone) "
                   "on the new code in this checkout and on the base's code (see "
                   "--confirm-against), alternating, and keep a regression only if the new "
                   "code's re-measurement is slower than the base code's by more than "
                   "--confirm-sigmas standard deviations of that change, run by run. Simulated "
                   "at the defaults (140 cases whose changes between runs spread by 2.4%%, "
                   "Gaussian): two runs of one commit fail in none of 2,000 pairs (plain: "
                   "19%%; against the base run, --confirm-against run: 0.6%%), a 10%% slowdown "
                   "is caught 73%% of the time with one base file, 80%% with two (against the "
                   "base run: 74%% and 93%%; docs: Tracking over time)")
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
    p.add_argument("--confirm-against", choices=CONFIRM_AGAINST, default="base",
                   help="with --confirm: base (default): re-measure the base's code too, in "
                   "runs alternating with the new code's (base, new, new, base), and confirm a "
                   "flag by the one against the other, so that a machine that changed speed "
                   "since the base run does not confirm it (the base's commit is checked out "
                   "in a git worktree; where it cannot be, a base with uncommitted changes or "
                   "from another repository, the gate says so and falls back to run); run: "
                   "compare the new code's re-measurement with the base run")
    p.add_argument("--confirm-args", default="", metavar="ARGS",
                   help="extra gpubench run options for the re-measurement, as one string "
                   "(e.g. \"--rounds 10\"; default: the profile's own, at NEW's torch "
                   "threads)")


def remeasure_cases(args: argparse.Namespace):
    """The re-measurement ``compare --confirm`` runs: a function of (NEW file, the flagged
    rows, the last base file) that runs ``gpubench run`` on those cases alone (same profile,
    device and workload per model, and NEW's torch threads unless ``--confirm-args`` sets them;
    ``-k`` by their test names), ``--confirm-runs`` times (or ``runs``), into a temporary
    folder beside NEW.
    With ``--confirm-against base`` (the default) the base's code is run too, where its commit
    can be checked out (``base_checkout``): as many runs, alternating with the new code's
    (base, new, new, base, ...; one run: base, new), each with the base run's own workloads.
    Returns a
    ``Remeasurement``: one result file per run that measured any of the cases, per side."""

    def remeasure(new_file, rows, base_file=None, runs=None):
        import json
        import shlex
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        from gpubench.analysis.compare import Remeasurement

        extra = shlex.split(args.confirm_args or "")
        # Absolute: the base code's runs start in its checkout, and a relative --out would
        # land there (removed with it), not here.
        out = Path(tempfile.mkdtemp(prefix="confirm-", dir=Path(new_file).resolve().parent))
        data = json.loads(Path(new_file).read_text())
        threads = ((data.get("machine_info") or {}).get("gpubench") or {}).get("torch_threads")
        if isinstance(threads, int) and threads > 0 and not any(
                a == "--threads" or a.startswith("--threads=") for a in extra):
            # at NEW's torch threads: a run at --threads 1 re-measured at the default would
            # compare two settings (on a 2-core VM, two host levels apart)
            extra = ["--threads", str(threads), *extra]
        runs = runs or getattr(args, "confirm_runs", 1) or 1
        sides = {"new": (Path.cwd(), _test_names(data))}
        note = None
        if base_file is not None and getattr(args, "confirm_against", "base") == "base":
            base_data = json.loads(Path(base_file).read_text())
            tree, note = base_checkout(base_data.get("commit_info"), out / "base-code")
            if tree is not None:
                sides["base"] = (tree, _test_names(base_data))
        order = (["new"] * runs if "base" not in sides else
                 [("base", "new", "new", "base")[i % 4] for i in range(2 * runs)])
        results: dict[str, list] = {"new": [], "base": []}
        try:
            for i, side in enumerate(order):
                cwd, names = sides[side]
                run = order[:i + 1].count(side)  # numbered by attempt, measured or not
                label = f"{side}{run}" if (runs > 1 or "base" in sides) else ""
                files = []
                for (profile, device), group in rows.groupby(["profile", "device"]):
                    tests, workloads = [], []
                    for _, r in group.iterrows():
                        name, workload = names.get((r["model"], r["case_id"]),
                                                   (f"test_step[{r['case_id']}]", r["model"]))
                        tests.append(name[name.index("["):] if "[" in name else name)
                        workloads.append(workload or r["model"])
                    dest = out / "-".join(x for x in (label, profile, device) if x)
                    cmd = [sys.executable, "-m", "gpubench", "run", "--profile", profile,
                           "--device", device, "--models", ",".join(dict.fromkeys(workloads)),
                           "-k", " or ".join(tests), "--no-charts", "--no-hygiene",
                           "--out", str(dest), *extra]
                    where = "" if side == "new" else f" (the base code, in {cwd})"
                    print(f"gpubench compare: {shlex.join(cmd)}{where}", file=sys.stderr,
                          flush=True)
                    subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, check=False)
                    if (dest / "benchmark.json").is_file():
                        files.append(dest / "benchmark.json")
                if len(files) > 1:  # one file per re-measurement run
                    merged = json.loads(files[0].read_text())
                    for f in files[1:]:
                        merged["benchmarks"] += json.loads(f.read_text())["benchmarks"]
                    target = out / f"{label or 'benchmark'}.json"
                    target.write_text(json.dumps(merged))
                    files = [target]
                results[side] += files
        finally:
            if "base" in sides and sides["base"][0] != Path.cwd():
                remove_checkout(out / "base-code")
        if "base" in sides and not results["base"]:
            note = "its runs, in a checkout of its commit, measured none of the flagged cases"
        # empty: nothing re-measured, decided as they were
        return Remeasurement(new=results["new"], base=results["base"], base_note=note)

    return remeasure


def _test_names(data: dict) -> dict:
    """(model, case id) -> (test name, workload spec) of a results file's records."""
    return {(b["extra_info"].get("model"), b["extra_info"].get("case_id")):
            (b.get("name"), b["extra_info"].get("workload")) for b in data["benchmarks"]
            if isinstance(b.get("extra_info"), dict)}


def base_checkout(commit: dict | None, where):
    """(folder, None) to run the base run's code in, or (None, why not): this checkout's
    folder where the base's commit is the checkout's and neither has uncommitted changes, else
    a git worktree of the commit at ``where`` (the same folder below its top as this one is,
    so relative workload paths hold). A base whose commit is not recorded, had uncommitted
    changes or is not in this repository cannot be run again."""
    import subprocess
    from pathlib import Path

    from pytest_benchmark.utils import get_commit_info

    commit = commit if isinstance(commit, dict) else {}
    rev = str(commit.get("id") or "")
    if not rev or rev in ("unversioned", "unknown"):
        return None, "the base run records no commit"
    if commit.get("dirty"):
        return None, f"the base run had uncommitted changes to {rev[:12]}"
    here = get_commit_info()
    if here.get("id") == rev and not here.get("dirty"):
        return Path.cwd(), None
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                         text=True)
    known = top.returncode == 0 and subprocess.run(
        ["git", "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True).returncode == 0
    if not known:
        return None, f"its commit {rev[:12]} is not in this repository"
    top_dir = Path(top.stdout.strip())
    added = subprocess.run(["git", "-C", str(top_dir), "worktree", "add", "--detach",
                            str(where), rev], capture_output=True, text=True)
    if added.returncode:
        return None, f"git worktree add {rev[:12]} failed: {added.stderr.strip()[-200:]}"
    return Path(where) / Path.cwd().resolve().relative_to(top_dir.resolve()), None


def remove_checkout(where) -> None:
    """Remove the worktree ``base_checkout`` made (nothing where it made none)."""
    import shutil
    import subprocess
    from pathlib import Path

    if Path(where).exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(where)],
                       capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], capture_output=True)
