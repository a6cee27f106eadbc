"""``gpubench bisect GOOD BAD --case ID``: the first commit at which a case got slower.

Each commit measured gets its own git worktree (``git worktree add --detach``), the user's own
install command run in it (``--install``, e.g. ``pip install -e .``), then the case alone
(``gpubench run -k``, in the worktree, so a workload file given by a relative path is that
commit's). GOOD and BAD are measured first and must differ (the compare test and threshold);
then a binary search over the commits between them (``git rev-list --ancestry-path``): a
commit whose median lies nearer BAD's than GOOD's (on a log scale) is bad. A commit that
lands in the middle third is measured again, its rounds pooled. The search stops when one
good and one bad commit are adjacent: log2(n) measurements for n commits, not n.
"""

from __future__ import annotations

import argparse
import math
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpubench.cli.options import add_target_arguments
from gpubench.util.argtypes import non_negative, non_negative_int

AMBIGUOUS = (1 / 3, 2 / 3)
"""A commit whose median lies within this share of the way from GOOD's to BAD's is measured
again."""


def add_bisect_parser(sub) -> None:
    p = sub.add_parser("bisect", help="the first commit between GOOD and BAD at which a case "
                       "got slower (a git worktree per commit measured)")
    p.add_argument("good", metavar="GOOD", help="a commit where the case was fast")
    p.add_argument("bad", metavar="BAD", help="a later commit where it is slow")
    p.add_argument("--case", required=True, metavar="ID", help="the case id (gpubench list)")
    add_target_arguments(p)
    p.add_argument("--model", default="", metavar="SPEC",
                   help="the case's workload (default: the model its id starts with); a file "
                   "path is taken inside each commit's worktree")
    p.add_argument("--install", default="", metavar="CMD",
                   help="shell command run in each worktree before measuring (e.g. "
                   "\"pip install -e .\"; default: none)")
    p.add_argument("--run-args", default="", metavar="ARGS",
                   help="extra gpubench run options, as one string (e.g. \"--rounds 10\")")
    p.add_argument("--repo", default=".", help="the git repository (default: here)")
    p.add_argument("--time-threshold", type=non_negative, default=0.07,
                   help="minimum relative change between GOOD and BAD to bisect (default 0.07)")
    p.add_argument("--retries", type=non_negative_int, default=2,
                   help="extra measurements of a commit that lands between GOOD and BAD "
                   "(default 2)")
    p.set_defaults(func=bisect_main)


def git(repo: str | Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout.strip()


def commits_between(repo: str | Path, good: str, bad: str) -> list[str]:
    """[GOOD, the commits after it on the way to BAD, ..., BAD] as full ids."""
    good_id = git(repo, "rev-parse", "--verify", f"{good}^{{commit}}")
    bad_id = git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good_id, bad_id],
                      capture_output=True).returncode:
        raise ValueError(f"GOOD {good} is not an ancestor of BAD {bad}")
    between = git(repo, "rev-list", "--reverse", "--ancestry-path", f"{good_id}..{bad_id}")
    return [good_id, *between.split()]


@dataclass
class Bisection:
    """The commits in order, the rounds measured at each (pooled), the first bad commit."""

    commits: list[str]
    rounds: dict[str, list[float]] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)
    first_bad: str | None = None
    note: str = ""


def _median(values) -> float:
    values = sorted(values)
    n = len(values)
    return (values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2) if n \
        else math.nan


def bisect(commits: list[str], measure: Callable[[str], list[float]], *,
           threshold: float = 0.07, retries: int = 2) -> Bisection:
    """Binary search for the first commit whose ``measure`` (per-round values, larger is
    slower) sits nearer BAD's median than GOOD's (module docstring)."""
    from gpubench.analysis.compare import Thresholds, time_verdict
    from gpubench.util.verdicts import Kind

    out = Bisection(commits)

    def take(commit: str) -> float:
        out.rounds.setdefault(commit, []).extend(measure(commit))
        return math.log(_median(out.rounds[commit]))

    good, bad = take(commits[0]), take(commits[-1])
    kind, change, p = time_verdict(out.rounds[commits[0]], out.rounds[commits[-1]],
                                   Thresholds(time=threshold))
    out.verdicts[commits[0]], out.verdicts[commits[-1]] = "good", "bad"
    if kind != Kind.REGRESSION:
        out.note = (f"GOOD and BAD do not differ by a significant slowdown ({change:+.1%}, "
                    f"p {p:.3f}, {kind}): nothing to bisect")
        return out
    lo, hi = 0, len(commits) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        share = (take(commits[mid]) - good) / (bad - good)
        for _ in range(retries):
            if not AMBIGUOUS[0] < share < AMBIGUOUS[1]:
                break
            share = (take(commits[mid]) - good) / (bad - good)
        is_bad = share >= 0.5
        out.verdicts[commits[mid]] = "bad" if is_bad else "good"
        if AMBIGUOUS[0] < share < AMBIGUOUS[1]:
            out.verdicts[commits[mid]] += " (between GOOD and BAD: a partial slowdown?)"
        lo, hi = (lo, mid) if is_bad else (mid, hi)
    out.first_bad = commits[hi]
    return out


def worktree_measure(args: argparse.Namespace, repo: Path, scratch: Path):
    """A ``measure(commit)`` that checks the commit out in its own worktree under
    ``scratch``, runs ``--install`` there, then ``gpubench run`` of the case alone (this
    Python's gpubench, in the worktree) and returns the case's round times."""
    import json

    def measure(commit: str) -> list[float]:
        tree = scratch / commit[:12]
        if not tree.exists():
            git(repo, "worktree", "add", "--detach", str(tree), commit)
            if args.install:
                done = subprocess.run(args.install, shell=True, cwd=tree)
                if done.returncode:
                    raise ValueError(f"--install {args.install!r} failed at {commit[:12]} "
                                     f"(exit {done.returncode})")
        out = tree / ".gpubench-bisect" / f"run{len(list(tree.glob('.gpubench-bisect/*')))}"
        model = args.model or args.case.split("-")[0]
        cmd = [sys.executable, "-m", "gpubench", "run", "--model", model, "-k",
               f"test_step[{args.case}]", "--no-charts", "--no-hygiene",
               "--out", str(out), *shlex.split(args.run_args or "")]
        for option in ("profile", "device"):
            if getattr(args, option, None):
                cmd += [f"--{option}", getattr(args, option)]
        print(f"gpubench bisect: {commit[:12]}: {shlex.join(cmd)}", file=sys.stderr,
              flush=True)
        subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL, check=False)
        try:
            records = json.loads((out / "benchmark.json").read_text())["benchmarks"]
        except (OSError, ValueError, KeyError):
            records = []
        for b in records:
            if (b.get("extra_info") or {}).get("case_id") == args.case:
                return [float(x) for x in b["stats"]["data"]]
        raise ValueError(f"--case {args.case}: not measured at {commit[:12]} (gpubench list "
                         f"--model {model} shows the cases; the run's output is in {out})")

    return measure


def bisection_markdown(result: Bisection, repo: str | Path) -> str:
    from gpubench.util.tables import markdown_table

    good = result.rounds.get(result.commits[0])
    rows = []
    for i, c in enumerate(result.commits):
        rounds = result.rounds.get(c)
        subject = git(repo, "log", "-1", "--format=%s", c)
        rows.append({"#": i, "commit": c[:12], "subject": subject[:60],
                     "median step (ms)": f"{_median(rounds) * 1e3:.2f}" if rounds else "-",
                     "vs GOOD": f"{_median(rounds) / _median(good) - 1:+.1%}"
                     if rounds and good else "-",
                     "rounds": len(rounds) if rounds else "-",
                     "verdict": result.verdicts.get(c, "not measured")})
    return markdown_table(rows)


def bisect_main(args: argparse.Namespace) -> int:
    repo = Path(git(args.repo, "rev-parse", "--show-toplevel"))
    commits = commits_between(repo, args.good, args.bad)
    print(f"gpubench bisect: {len(commits) - 2} commit(s) between {args.good} and {args.bad}; "
          f"about {max(0, math.ceil(math.log2(max(1, len(commits) - 1))))} to measure after "
          "the two ends", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="gpubench-bisect-") as scratch:
        try:
            result = bisect(commits, worktree_measure(args, repo, Path(scratch)),
                            threshold=args.time_threshold, retries=args.retries)
        finally:
            for tree in Path(scratch).iterdir():
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force",
                                str(tree)], capture_output=True)
    print(bisection_markdown(result, repo))
    if result.first_bad is None:
        print(f"gpubench bisect: {result.note}", file=sys.stderr)
        return 2
    subject = git(repo, "log", "-1", "--format=%s", result.first_bad)
    print(f"\nfirst bad commit: {result.first_bad} {subject}")
    return 0
