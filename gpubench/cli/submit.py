"""``gpubench submit``: a ``gpubench dist`` job sent to Slurm through submitit (the ``cluster``
extra), waited for within a deadline of its own, its rank-0 results brought back to ``--out``.

    gpubench submit --nodes 2 --gpus-per-node 8 --partition gpu --time 30 \\
        --model bert --device cuda --parallel ddp fsdp --out results/bert-2x8.json
    gpubench submit --executor local --tasks-per-node 2 --model bert --profile smoke --out x.json
    gpubench submit --emit-sbatch --nodes 2 --gpus-per-node 8 --model bert --out x.json > job.sh

One task per GPU: each task is one rank of ``gpubench dist``, which derives its rank, world
size and master address from Slurm's variables (``gpubench.launchers.slurm``). Without an
accounting daemon ``sacct`` does not answer, and submitit alone would wait forever for a task that
died: the job is also over when it leaves ``squeue``, and past ``--deadline`` it is cancelled.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpubench.cli.torchrun import add_dist_arguments
from gpubench.util.argtypes import non_negative_int, positive, positive_int

DEFAULT_DEADLINE_S = 3600.0
POLL_S = 1.0


def add_submit_parser(sub) -> None:
    """``gpubench submit``'s parser, added to the subcommands (``gpubench.cli.main``)."""
    p = sub.add_parser("submit", help="a gpubench dist job on Slurm (or this machine) through "
                       "submitit, its results brought back; or its sbatch script")
    add_submit_arguments(p)
    p.set_defaults(func=submit_main)


def add_submit_arguments(p: argparse.ArgumentParser) -> None:
    add_dist_arguments(p)
    g = p.add_argument_group("the job")
    g.add_argument("--executor", choices=("slurm", "local"), default="slurm",
                   help="slurm: sbatch through submitit; local: submitit's local executor, the "
                   "same path as processes on this machine (default: slurm)")
    g.add_argument("--nodes", type=positive_int, default=1)
    g.add_argument("--gpus-per-node", type=non_negative_int, default=0,
                   help="GPUs per node, one task (rank) per GPU (default 0: a CPU job)")
    g.add_argument("--tasks-per-node", type=positive_int, default=None,
                   help="ranks per node (default: --gpus-per-node, else 1)")
    g.add_argument("--partition", default=None)
    g.add_argument("--account", default=None)
    g.add_argument("--time", type=positive_int, default=60, metavar="MINUTES",
                   help="the job's time limit in minutes (default 60)")
    g.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                   help="another sbatch option (--sbatch qos=high --sbatch constraint=h200); "
                   "repeatable")
    g.add_argument("--folder", default=None,
                   help="submitit's folder: the job's scripts, task logs and rank 0's results "
                   "(default: a folder beside --out); on a cluster, one every node can reach")
    g.add_argument("--deadline", type=positive, default=None, metavar="SECONDS",
                   help="seconds to wait for the job, queueing included, before it is "
                   f"cancelled (default: --time's, at most {DEFAULT_DEADLINE_S:g} s more)")
    g.add_argument("--emit-sbatch", action="store_true",
                   help="print a ready sbatch script of this job instead of submitting it")


def dist_argv(args: argparse.Namespace, out: str) -> list[str]:
    """The ``gpubench dist`` arguments of ``args`` (those that differ from their defaults),
    with ``--out`` replaced by ``out``."""
    parser = argparse.ArgumentParser(add_help=False)
    add_dist_arguments(parser)
    argv: list[str] = []
    for action in parser._actions:
        if action.dest in ("out", "help"):
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return [*argv, "--out", out]


def sbatch_options(args: argparse.Namespace) -> dict[str, str]:
    """Extra sbatch options from ``--sbatch KEY=VALUE`` (a bad one is a ``ValueError``)."""
    extra = {}
    for item in args.sbatch:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise ValueError(f"--sbatch {item!r}: expected KEY=VALUE, e.g. --sbatch qos=high")
        extra[key.replace("-", "_")] = value
    return extra


def tasks_per_node(args: argparse.Namespace) -> int:
    tasks = args.tasks_per_node or args.gpus_per_node or 1
    if args.gpus_per_node and tasks != args.gpus_per_node:
        raise ValueError(f"--tasks-per-node {tasks} with --gpus-per-node {args.gpus_per_node}: "
                         "one task per GPU (leave out --tasks-per-node)")
    return tasks


def emit_sbatch(args: argparse.Namespace) -> str:
    """A ready sbatch script of the job: one task per GPU, each a rank of ``gpubench dist``."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=gpubench-dist", f"#SBATCH --nodes={args.nodes}",
             f"#SBATCH --ntasks-per-node={tasks_per_node(args)}"]
    if args.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={args.gpus_per_node}")
    for key, value in (("partition", args.partition), ("account", args.account)):
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    lines += [f"#SBATCH --time={args.time}", "#SBATCH --output=gpubench-dist-%j.log"]
    lines += [f"#SBATCH --{k.replace('_', '-')}={v}" for k, v in sbatch_options(args).items()]
    command = [sys.executable, "-m", "gpubench", "dist", *dist_argv(args, args.out)]
    lines += ["", "# One task per GPU; each derives its rank, world size and master address",
              "# (the first node) from Slurm's variables. --kill-on-bad-exit: a rank that dies",
              "# ends the others at once instead of leaving them waiting in a collective.",
              "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
              f"cd {shlex.quote(os.getcwd())}",
              "srun --kill-on-bad-exit=1 " + shlex.join(command)]
    return "\n".join(lines) + "\n"


def run_dist_task(argv: list[str]) -> int:
    """What each task of the job runs: ``gpubench dist`` in this process (a rank)."""
    from gpubench.cli.torchrun import dist_main

    parser = argparse.ArgumentParser(prog="gpubench dist")
    add_dist_arguments(parser)
    code = dist_main(parser.parse_args(argv))  # a ValueError is the task's one-line error
    if code:
        raise RuntimeError(f"gpubench dist exited with status {code}")
    return code


class JobFailed(RuntimeError):
    """The job failed or ran past its deadline; the message is one line."""


def _in_queue(job_id: str) -> bool | None:
    """Whether Slurm still lists the job (None: squeue did not answer)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode:
        return False if "Invalid job id" in out.stderr else None
    return bool(out.stdout.strip())


def _task_outcome(job, task: int) -> tuple[str, str] | None:
    """("success"|"error", text) of a task that wrote its result, else None."""
    from submitit.core import utils

    sub = job.task(task) if job.num_tasks > 1 else job
    if not sub.paths.result_pickle.exists():
        return None
    try:
        outcome, result = utils.pickle_load(sub.paths.result_pickle)
    except (EOFError, OSError):
        return None  # still being written
    return outcome, str(result)


def wait_for(job, executor: str, deadline_s: float) -> None:
    """Until every task wrote its result; ``JobFailed`` (one line naming the job, what ended it
    and a task's log) when a task failed, ended without a result, or the deadline passed (the
    job then cancelled)."""
    start = time.monotonic()
    gone_since = None

    def over() -> bool:
        return job.done() if executor == "local" else _in_queue(str(job.job_id)) is False

    while True:
        outcomes = [_task_outcome(job, t) for t in range(job.num_tasks)]
        if any(o and o[0] == "error" for o in outcomes):
            # The others end at once (srun --kill-on-bad-exit): wait for that, to tell a task
            # that died (no result: the cause) from those that failed because it did.
            settle = min(time.monotonic() + 30.0, start + deadline_s)
            while time.monotonic() < settle and not over():
                time.sleep(POLL_S)
            outcomes = [_task_outcome(job, t) for t in range(job.num_tasks)]
            _cancel(job)
            raise JobFailed(_failure(job, outcomes))
        if all(outcomes):
            return
        if over():
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > 5 * POLL_S:  # results land a moment after
                raise JobFailed(_failure(job, [_task_outcome(job, t)
                                               for t in range(job.num_tasks)]))
        if time.monotonic() - start > deadline_s:
            _cancel(job)
            task = next(t for t, o in enumerate(outcomes) if o is None)
            raise JobFailed(f"job {job.job_id} not finished within --deadline {deadline_s:g} s "
                            f"(cancelled); log: {_log(job, task)}")
        time.sleep(POLL_S)


def _failure(job, outcomes: list) -> str:
    """One line: the tasks that ended without a result (killed, out of time or memory), then
    those that failed, each with the last line of its error; the log of the first named."""
    dead = [t for t, o in enumerate(outcomes) if o is None]
    failed = [(t, o[1]) for t, o in enumerate(outcomes) if o and o[0] == "error"]
    parts = []
    if dead:
        parts.append(f"task{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} ended "
                     "without a result (killed, or out of time or memory)")
    for task, trace in failed[:2]:
        last = ([ln.strip() for ln in trace.splitlines() if ln.strip()] or ["?"])[-1]
        parts.append(f"task {task} failed ({' '.join(last.split())[:200]})")
    first = dead[0] if dead else failed[0][0] if failed else 0
    return f"job {job.job_id}: {'; '.join(parts)}; log: {_log(job, first)}"


def _cancel(job) -> None:
    try:
        job.cancel(check=False)
    except (OSError, subprocess.SubprocessError):
        pass


def _log(job, task: int) -> Path:
    sub = job.task(task) if job.num_tasks > 1 else job
    paths = sub.paths
    return paths.stderr if paths.stderr.exists() or not paths.stdout.exists() else paths.stdout


def submit_main(args: argparse.Namespace) -> int:
    tasks = tasks_per_node(args)
    if args.emit_sbatch:
        sys.stdout.write(emit_sbatch(args))
        return 0
    try:
        import submitit
    except ImportError:
        print("gpubench submit: needs submitit (pip install 'gpubench[cluster]')",
              file=sys.stderr)
        return 2
    if args.executor == "local" and args.nodes != 1:
        raise ValueError(f"--executor local runs on this machine: --nodes {args.nodes} needs "
                         "--executor slurm")
    if args.executor == "slurm" and shutil.which("sbatch") is None:
        print("gpubench submit: sbatch not found (no Slurm here: --executor local runs the "
              "job on this machine, --emit-sbatch prints its script)", file=sys.stderr)
        return 2
    out = Path(args.out)
    from gpubench.util.paths import check_output

    check_output("--out", args.out, is_file=True)
    folder = Path(args.folder or out.with_name(out.stem + "-jobs"))
    if args.executor == "local":
        ex = submitit.LocalExecutor(folder=folder / "%j")
        ex.update_parameters(tasks_per_node=tasks, timeout_min=args.time,
                             gpus_per_node=args.gpus_per_node)
    else:
        ex = submitit.SlurmExecutor(folder=folder / "%j")
        params = dict(nodes=args.nodes, ntasks_per_node=tasks, time=args.time,
                      job_name="gpubench-dist", srun_args=["--kill-on-bad-exit=1"],
                      additional_parameters=sbatch_options(args))
        for key in ("partition", "account"):
            if getattr(args, key):
                params[key] = getattr(args, key)
        if args.gpus_per_node:
            params["gpus_per_node"] = args.gpus_per_node
        ex.update_parameters(**params)
    remote = (folder / "results" / out.name).resolve()
    remote.parent.mkdir(parents=True, exist_ok=True)
    remote.unlink(missing_ok=True)
    job = ex.submit(run_dist_task, dist_argv(args, str(remote)))
    print(f"gpubench submit: job {job.job_id} ({args.executor}, {args.nodes} node(s) x "
          f"{tasks} task(s)); logs in {folder / str(job.job_id)}", flush=True)
    deadline = args.deadline or args.time * 60 + DEFAULT_DEADLINE_S
    try:
        wait_for(job, args.executor, deadline)
    except JobFailed as err:
        kept = _bring_back(remote, out)
        print(f"gpubench submit: {err}" + (f"; kept {kept} finished case(s) in {out}"
                                           if kept else ""), file=sys.stderr)
        return 1
    if not _bring_back(remote, out):
        print(f"gpubench submit: job {job.job_id} finished but wrote no results at {remote}; "
              f"log: {_log(job, 0)}", file=sys.stderr)
        return 1
    print(f"gpubench submit: job {job.job_id} done; wrote {out}")
    return 0


def _bring_back(remote: Path, out: Path) -> int:
    """Rank 0's results copied to ``out``; the number of cases (0: none written)."""
    import json

    from gpubench.util import atomic

    try:
        text = remote.read_text()
        count = len(json.loads(text)["benchmarks"])
    except (OSError, ValueError, KeyError):
        return 0
    if str(remote) != str(out.resolve()):
        atomic.write_text(out, text)
    return count
