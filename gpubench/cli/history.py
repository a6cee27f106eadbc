"""``gpubench history DIR``: the series of a history folder, its change points and pages."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpubench.util.argtypes import bounded, non_negative, positive_int
from gpubench.util.verdicts import COMPARE_BASES, MEMORY_THRESHOLD, TIME_THRESHOLD

CHANGE_ALPHA = 0.01  # gpubench.analysis.history.CHANGE_ALPHA (not imported: --help stays fast)
PERSISTENCE = 2


def add_history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", metavar="DIR",
                   help="a history folder (gpubench run --history DIR) or a pytest-benchmark "
                   "storage folder (.benchmarks, --benchmark-autosave)")
    p.add_argument("--add", action="append", default=[], metavar="FILE",
                   help="first append this result file (or results folder) to DIR "
                   "(repeatable); its commit is the file's commit_info, else this checkout's")
    p.add_argument("-o", "--out", help="folder for history.md and history.html (default: DIR)")
    p.add_argument("--basis", choices=COMPARE_BASES, default="auto",
                   help="what a case's time is followed as, as in compare: auto (default) "
                   "over its paired baseline rounds where every run has them, else as it is")
    p.add_argument("--since", help="first commit of the window: a date (ISO) or commit id")
    p.add_argument("--until", help="last commit of the window: a date (ISO) or commit id")
    p.add_argument("--case", metavar="REGEX",
                   help="only cases whose id (or 'model case id') matches this expression")
    p.add_argument("--alpha", type=bounded(float, low=0, high=1, open_low=True,
                                           open_high=True), default=CHANGE_ALPHA,
                   help=f"significance level of a change point (default {CHANGE_ALPHA})")
    p.add_argument("--time-threshold", type=non_negative, default=TIME_THRESHOLD,
                   help=f"minimum relative step of time that counts (default {TIME_THRESHOLD})")
    p.add_argument("--memory-threshold", type=non_negative, default=MEMORY_THRESHOLD,
                   help="minimum relative step of training memory that counts "
                   f"(default {MEMORY_THRESHOLD})")
    p.add_argument("--persistence", type=positive_int, default=PERSISTENCE,
                   help="runs a new level must hold to count as a change; a step in fewer "
                   f"(the latest runs) is listed as pending (default {PERSISTENCE})")


def add_results(files: list[str], folder: str | Path) -> list[Path]:
    """Append result files to the history ``folder``; a file without ``commit_info`` takes
    this checkout's commit (pytest-benchmark's ``get_commit_info``)."""
    from gpubench.analysis.history import save_run
    from gpubench.analysis.results import read_benchmark_json

    saved = []
    for f in files:
        path = Path(f) / "benchmark.json" if Path(f).is_dir() else Path(f)
        commit = None
        if not isinstance(read_benchmark_json(path).get("commit_info"), dict):
            from pytest_benchmark.utils import get_commit_info

            commit = get_commit_info()
        saved.append(save_run(path, folder, commit=commit))
    return saved


def history_main(args: argparse.Namespace) -> int:
    from gpubench.analysis.history import (
        detect,
        history_series,
        latest_table,
        machine_changes,
        read_history,
    )
    from gpubench.report.history import write_history_page

    for path in add_results(args.add, args.folder):
        print(f"gpubench history: added {path}")
    start = time.perf_counter()
    history = read_history(args.folder, since=args.since, until=args.until, cases=args.case)
    read_s = time.perf_counter() - start
    series = history_series(history, basis=args.basis)
    changes = detect(series, time_magnitude=args.time_threshold,
                     memory_magnitude=args.memory_threshold, alpha=args.alpha,
                     persistence=args.persistence)
    latest = latest_table(series, changes)
    lines = machine_changes(history)
    out = Path(args.out or args.folder)
    written = write_history_page(out, history, series, changes, latest, lines, args.basis)
    print(written[0].read_text())
    for skipped in history.skipped:
        print(f"gpubench history: warning: {skipped}", file=sys.stderr)
    held = int(changes["persistent"].sum()) if len(changes) else 0
    print(f"gpubench history: read {len(history.runs)} runs ({len(history.cases)} case rows) "
          f"in {read_s:.2f} s; {held} change point(s), {len(changes) - held} pending; wrote "
          + ", ".join(map(str, written)))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from gpubench.util.paths import check_output

    if args.out:
        check_output("-o/--out", args.out)
    return history_main(args)


def save_to_history(args: argparse.Namespace, json_path: Path) -> None:
    """``gpubench run --history DIR``: append the finished run to DIR (said in one line; a
    failure to save is said and leaves the run's results as they are)."""
    folder = getattr(args, "history", None)
    if not folder:
        return
    try:
        saved = add_results([str(json_path)], folder)
    except (OSError, ValueError) as err:
        print(f"gpubench: could not add the run to the history {folder}: {err}",
              file=sys.stderr)
        return
    print(f"gpubench: run added to the history: {saved[0]}")


def add_history_option(run: argparse.ArgumentParser) -> None:
    """``gpubench run --history DIR``."""
    run.add_argument("--history", metavar="DIR",
                     help="also append the run to this history folder (one small file per "
                     "run, as pytest-benchmark's --benchmark-storage; gpubench history DIR "
                     "reads it)")


def add_history_parser(sub) -> None:
    p = sub.add_parser("history", help="series of a history of runs: change points with their "
                       "commit, latest values and trends, history.md and history.html")
    add_history_arguments(p)
    p.set_defaults(func=cmd_history)
