"""The ``gpubench`` command: run the benchmark profile, list cases, summarize, report, compare."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gpubench.cli.bisect import add_bisect_parser
from gpubench.cli.compare import PRICE_HELP, price_per_hour
from gpubench.cli.history import add_history_option, add_history_parser
from gpubench.cli.options import (
    SESSION_OPTIONS,
    SPEC_HELP,
    add_session_arguments,
    add_target_arguments,
    resolve_target,
    session_pytest_args,
)
from gpubench.cli.submit import add_submit_parser
from gpubench.suite.cases import GROUPS, profile_cases
from gpubench.util import atomic
from gpubench.util.argtypes import (
    BYTE_SIZE_HELP,
    OneLineParser,
    byte_size,
    non_negative,
    non_negative_int,
    positive,
    positive_int,
)
from gpubench.util.paths import check_output, folder_problem, is_run_output


def load_results(*args, **kwargs):
    """``gpubench.analysis.results.load_results``, imported when used (pandas): ``--help``
    stays fast."""
    from gpubench.analysis.results import load_results as load

    return load(*args, **kwargs)


def summary_markdown(df):
    from gpubench.report.summary import summary_markdown as markdown

    return markdown(df)


def default_device() -> str:
    from gpubench.measure.machine import default_device as detect

    return detect()


def model_specs(args: argparse.Namespace) -> tuple[str, ...]:
    """The workload specs of ``--models a,b`` and repeated ``--model SPEC``, in order."""
    specs = [m.strip() for m in (getattr(args, "models", "") or "").split(",") if m.strip()]
    specs += list(getattr(args, "model_list", None) or [])
    return tuple(dict.fromkeys(specs))


def check_specs(specs: tuple[str, ...], profile: str,
                timeout_s: float | None = None) -> tuple[str, ...]:
    """Resolve and validate every spec before anything runs, within ``timeout_s`` (a command's
    ``--timeout``): a bad one is a one-line error. The profiles' own built-in models need
    neither (nor torch's import, 3 s here: the cases' process resolves them)."""
    from gpubench.workloads.profiles import PROFILE_TABLE

    builtin = {m for p in PROFILE_TABLE.values() for m in p.models}
    for spec in specs:
        if spec not in builtin:
            from gpubench.workloads.api import set_probe_timeout
            from gpubench.workloads.registry import checked

            if timeout_s:
                set_probe_timeout(timeout_s)
            checked(spec, profile)
    return specs


def group_list(text: str) -> tuple[str, ...]:
    groups = tuple(g.strip() for g in (text or "").split(",") if g.strip())
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise ValueError(f"--groups must be from {', '.join(GROUPS)}; got {', '.join(bad)}")
    return groups


def find_benchmarks_dir() -> Path:
    """The suite's ``benchmarks/`` folder: in the working directory, else beside the package."""
    beside_package = Path(__file__).resolve().parents[2] / "benchmarks"
    for candidate in (Path.cwd() / "benchmarks", beside_package):
        if (candidate / "conftest.py").is_file():
            return candidate
    raise SystemExit(
        "gpubench: cannot find the benchmarks/ folder; run from a gpubench checkout "
        "installed with 'pip install -e .'"
    )


def pytest_command(args: argparse.Namespace, json_path: Path) -> list[str]:
    device, profile = resolve_target(args.device, args.profile)
    cmd = [
        sys.executable, "-m", "pytest", str(find_benchmarks_dir()), "-v", "-p", "no:cacheprovider",
        # Hypothesis's pytest plugin, where installed, costs every run about 0.9 s to load;
        # the benchmarks use none of it.
        "-p", "no:hypothesispytest",
        f"--rootdir={find_benchmarks_dir().parent}",
        f"--benchmark-json={json_path}",
        "--benchmark-columns=median,iqr,rounds",
        "--benchmark-sort=name",
        *session_pytest_args(args, device=device, profile=profile),
    ]
    specs = model_specs(args)
    if specs:
        cmd.append(f"--gpubench-models={','.join(specs)}")
    if getattr(args, "trace", False):  # traces beside the results: <out>/traces/
        from gpubench.measure.trace import TRACES_DIR_NAME

        cmd.append(f"--gpubench-trace={json_path.parent / TRACES_DIR_NAME}")
    if args.k:
        cmd += ["-k", args.k]
    if not getattr(args, "no_hygiene", False):
        from gpubench.cli.memory import HYGIENE_FILE

        cmd.append(f"--gpubench-hygiene={json_path.parent / HYGIENE_FILE}")
    return cmd


PREVIOUS_DIR = "previous"
"""Where a new run (not ``--resume``) moves the earlier run's files it finds in ``--out``."""


def _is_ours(entry: os.DirEntry) -> bool:
    """Whether ``entry`` of a results folder is what a run writes (results, journal, tables,
    charts, report; ``traces/``, ``logs/``) or a tune beside them (``tune-*/``), by name
    (``gpubench.util.paths.is_run_output``): what a new run moves aside. Anything else there
    is the user's and stays where it is (moved aside, the run after next would delete it)."""
    if entry.name.startswith("."):
        return False
    is_dir = entry.is_dir(follow_symlinks=False)
    if not is_dir and not entry.is_file(follow_symlinks=False):
        return False
    return is_run_output(entry.name, is_dir)


def _set_aside_previous(out: Path) -> int:
    """Move the earlier run's files in ``out`` into ``out/previous/`` (an older
    ``previous/`` is replaced), so that the new run writes into a clean folder and the earlier
    results stay whole; other files are left where they are. Renames inside ``out``: the same
    filesystem, whatever ``out`` is (a mount point, a symlink). Returns how many were moved."""
    import shutil

    previous = out / PREVIOUS_DIR
    if previous.is_symlink() or (previous.exists() and not previous.is_dir()):
        raise ValueError(f"--out {out}: {previous} is not a folder; the earlier results "
                         "cannot be moved there (move it away, or use --resume)")
    if previous.is_dir() and not (out / "benchmark.json").exists():
        # A run killed before any case finished (its journal, failed cases' logs): no
        # measurement to keep, and not worth the earlier results it set aside.
        for entry in os.scandir(out):
            if _is_ours(entry):
                (shutil.rmtree if entry.is_dir(follow_symlinks=False) else os.unlink)(entry.path)
        _restore_previous(out)
    entries = [e for e in os.scandir(out) if _is_ours(e)]
    if not entries:
        return 0
    if previous.exists():  # the older generation: renamed to a hidden name, then removed
        doomed = Path(tempfile.mkdtemp(prefix=atomic.temp_prefix(PREVIOUS_DIR), suffix=".tmp",
                                       dir=out))
        os.rename(previous, doomed / PREVIOUS_DIR)
        shutil.rmtree(doomed, ignore_errors=True)
    previous.mkdir()
    for entry in sorted(entries, key=lambda e: e.name != "benchmark.json"):  # results first
        os.rename(entry.path, previous / entry.name)
    return len(entries)


def _records_in(json_path: Path) -> int:
    """How many records the result file holds (0 when there is none, or it is unreadable)."""
    try:
        return len(json.loads(json_path.read_text())["benchmarks"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _restore_previous(out: Path) -> None:
    """Undo ``_set_aside_previous`` for a run that produced nothing: the earlier run's files
    go back into ``out`` (the new run's empty journal is dropped)."""
    previous = out / PREVIOUS_DIR
    if not previous.is_dir():
        return
    from gpubench.measure.journal import journal_path

    journal_path(out / "benchmark.json").unlink(missing_ok=True)
    for entry in os.scandir(previous):
        if not (out / entry.name).exists():
            os.rename(entry.path, out / entry.name)
    try:
        previous.rmdir()
    except OSError:
        pass


def _raise_interrupted(signum, frame):  # a signal handler
    from gpubench.util.signals import Interrupted

    raise Interrupted(signum)


def _interrupted_message(sig, state: dict) -> str:
    stage, out, kept = state["stage"], state["out"], state["kept"]
    if stage == "starting":
        return f"gpubench: interrupted ({sig}) while starting; nothing was run"
    if stage == "after the results were written":
        return f"gpubench: interrupted ({sig}) {stage} to {out}/"
    if stage == "running the cases":
        if not kept:
            return (f"gpubench: interrupted ({sig}) while running the cases; no case had "
                    f"finished")
        return (f"gpubench: interrupted ({sig}) while running the cases; {kept} finished "
                f"case(s) kept in {out}/benchmark.json (the same command with --resume runs "
                "the rest)")
    return (f"gpubench: interrupted ({sig}) while {stage}; the {kept} finished case(s) are "
            f"in {out}/benchmark.json (gpubench report {out}/benchmark.json -o {out} draws "
            "the charts)")


def cmd_run(args: argparse.Namespace) -> int:
    """Run the cases in a pytest child, which writes every case into ``--out`` the moment it
    finishes (``gpubench.measure.journal``), then write summary, advice and charts beside them.
    SIGINT/SIGTERM go to the child; the run then ends with one line and 130/143, the finished
    cases kept (``--resume`` continues the run)."""
    import signal

    from gpubench.util.signals import interruption

    state = {"stage": "starting", "out": None, "kept": 0}
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run_cases(args, state)
    except BaseException as err:
        sig = interruption(err)
        if sig is None:
            raise
        if state["out"] is not None:  # the child's hand-over, not yet taken: not a result
            _drop_hygiene_file(state["out"])
        print(_interrupted_message(sig, state), file=sys.stderr)
        return sig.exit_code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        lock = state.get("lock")
        if lock is not None:
            lock.release()


def _run_cases(args: argparse.Namespace, state: dict) -> int:
    """``cmd_run`` with its SIGINT/SIGTERM handlers installed; ``state`` tells it how far the
    run got: inputs checked, ``--out`` prepared, the cases run in a pytest child, then the
    derived files written from what finished."""
    from gpubench.measure.journal import journal_path, read_journal
    from gpubench.util.signals import Interrupted

    device, profile = resolve_target(args.device, args.profile)
    out = Path(args.out or f"results/{profile}")
    problem = _run_input_problem(args, device, profile, out)
    if problem:
        print(f"gpubench: {problem}", file=sys.stderr)
        return 2
    state["out"] = out
    json_path = out / "benchmark.json"
    resume = getattr(args, "resume", False)
    moved = _prepare_out(args, state, out, resume)
    print(f"gpubench: profile {profile} on {device}; results go to {out}/"
          + (" (resuming)" if resume else ""), flush=True)
    started = time.monotonic()
    state["stage"] = "running the cases"
    code, signum = _run_pytest_child(args, state, json_path, resume)
    atomic.remove_stale_temporaries(out)  # a killed child's file in progress, if any
    if code == 4:  # pytest's usage error (a --resume of another run): its one line is said
        if moved:
            _restore_previous(out)
        return 2
    kept, failed = _records_in(json_path), len(read_journal(journal_path(json_path)).failed)
    state["kept"] = kept
    if not kept and not failed and moved:
        _restore_previous(out)  # nothing new: the folder as it was
    if signum is not None:
        raise Interrupted(signum)
    _say_abnormal_end(code, kept, json_path)
    if not kept:
        print(f"gpubench: {_nothing_kept_reason(code, failed, json_path)}", file=sys.stderr)
        return (code if code > 0 else 1) or 1
    return _finish_run(args, state, code, failed, json_path, profile, device, started)


def _run_input_problem(args: argparse.Namespace, device: str, profile: str,
                       out: Path) -> str | None:
    """What makes ``gpubench run``'s inputs unusable (one line; exit 2, nothing run), or None:
    CUDA asked where there is none, a bad workload spec or group, an unusable ``--out`` or data
    folder, a ``--resume`` of no run."""
    from gpubench.measure.journal import journal_path, read_journal
    from gpubench.workloads.datacache import default_data_dir

    if device == "cuda" and default_device() != "cuda":
        return ("--device cuda, but no CUDA device is available here "
                "(torch.cuda.is_available() is False); nothing was run")
    # a bad workload spec: one line, nothing run
    check_specs(model_specs(args), profile, getattr(args, "timeout", None))
    group_list(args.groups)
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    data_option = "--data-dir" if args.data_dir else "the data folder"
    for option, folder in (("--out", out), (data_option, data_dir)):
        problem = folder_problem(folder)
        if problem:
            return f"{option} {folder} {problem}; nothing was run"
    if out.resolve().parent == out.resolve():
        return f"--out {out} cannot be a filesystem root"
    journal = journal_path(out / "benchmark.json")
    if getattr(args, "resume", False) and read_journal(journal).header is None:
        return f"--resume: {journal} holds no run to continue; nothing was run"
    return None


def _prepare_out(args: argparse.Namespace, state: dict, out: Path, resume: bool) -> int:
    """Create ``out``, take its run lock (one run per folder; ``JournalError``: exit 2), clear
    what killed runs left there and in the data folder, and (not ``--resume``) set the earlier
    run aside as a whole. Returns how many earlier entries were moved."""
    import signal

    from gpubench.measure.journal import RunLock
    from gpubench.workloads.datacache import default_data_dir, remove_stale_partials

    out.mkdir(parents=True, exist_ok=True)
    state["lock"] = RunLock(out / "benchmark.json").acquire()
    atomic.remove_stale_temporaries(out)  # what killed runs left: temporary files in out
    _drop_hygiene_file(out)  # and a killed child's hygiene hand-over, never this run's
    remove_stale_partials(Path(args.data_dir) if args.data_dir else default_data_dir())
    if resume:
        return 0
    signals = (signal.SIGINT, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # the earlier run moved as a whole
    try:
        moved = _set_aside_previous(out)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    if moved:
        print(f"gpubench: the earlier results in {out}/ are now in {out / PREVIOUS_DIR}/",
              flush=True)
    return moved


def _drop_hygiene_file(out: Path) -> None:
    """Remove the no_grad / del measurements a pytest child leaves in ``out`` for the run to
    take (``HYGIENE_FILE``): an interrupted run never takes them, and a later run must not
    read another run's as its own."""
    from gpubench.cli.memory import HYGIENE_FILE

    with contextlib.suppress(OSError):
        (out / HYGIENE_FILE).unlink(missing_ok=True)


def child_environment() -> dict[str, str]:
    """This process's environment for the cases' pytest child, less pytest-xdist's worker
    variables (``PYTEST_XDIST_*``): a ``gpubench run`` started inside an xdist worker (a test
    suite run with ``pytest -n``) would otherwise hand them on, and pytest-benchmark, seeing
    them, disables every benchmark, so no case would run."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}


def _run_pytest_child(args: argparse.Namespace, state: dict, json_path: Path,
                      resume: bool) -> tuple[int, int | None]:
    """Run the cases in a pytest child; SIGINT too is forwarded as SIGTERM, which the plugin
    turns into an orderly stop. Returns the child's exit code and the signal received, if any
    (a ``--resume`` that found every case finished counts as success)."""
    import signal

    from gpubench.measure.journal import LOCK_ENV
    from gpubench.util.signals import PARENT_PID_ENV, run_forwarding_signals

    # The plugins the cases need, named; no other installed plugin is loaded (hypothesis,
    # anyio, a coverage plugin: a second or more of imports each, and hooks of their own).
    cmd = [*pytest_command(args, json_path), "-p", "pytest_benchmark.plugin",
           "-p", "gpubench.cli.pytest_signals", "--tb=no"]
    if resume:
        cmd.append("--gpubench-resume")
    code, signum = run_forwarding_signals(
        cmd, env={**child_environment(), PARENT_PID_ENV: str(os.getpid()),
                  LOCK_ENV: str(state["lock"].path), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        forward_as=signal.SIGTERM)
    if resume and code == 5:  # every case had finished: nothing left to run
        code = 0
    return code, signum


def _say_abnormal_end(code: int, kept: int, json_path: Path) -> None:
    """One line for a child the watchdog ended (124) or a signal killed (code < 0)."""
    import signal

    from gpubench.util.signals import signal_name

    if code == 124:  # gpubench.util.watchdog ended it: a call no exception could reach hung
        print(f"gpubench: an in-process case hung past --timeout in code no exception reaches "
              f"(its stacks are above); {kept} finished case(s) kept in {json_path} (the same "
              "command with --resume runs the rest)", file=sys.stderr, flush=True)
    if code < 0:
        why = " (out of memory?)" if -code == signal.SIGKILL else ""
        print(f"gpubench: the benchmark process was killed by {signal_name(-code)}{why}; "
              f"{kept} finished case(s) kept in {json_path}", file=sys.stderr, flush=True)


def _nothing_kept_reason(code: int, failed: int, json_path: Path) -> str:
    """Why a run kept no case, on one line."""
    from gpubench.measure.journal import logs_dir

    if failed:
        return f"no case finished: {failed} failed (tracebacks in {logs_dir(json_path)}/)"
    if code in (0, 5):
        return ("no case ran: every selected case was skipped or none was selected "
                "(gpubench list shows which skip here, and why)")
    return f"the benchmark run wrote no results (pytest exit code {code})"


def _finish_run(args: argparse.Namespace, state: dict, code: int, failed: int, json_path: Path,
                profile: str, device: str, started: float) -> int:
    """Write the derived files from the finished cases and end the run: its last line and exit
    code (1 for a child killed or hung, or stopped early; pytest's code otherwise)."""
    from gpubench.measure.journal import logs_dir

    out, kept = json_path.parent, state["kept"]
    try:
        _write_derived(args, state, out, json_path, profile, device, started)
    except (OSError, ValueError) as err:
        if isinstance(err, ValueError):
            print(f"gpubench: {err}; the {kept} finished case(s) are in {json_path}",
                  file=sys.stderr)
            return 2
        where = f"{err.filename}: " if getattr(err, "filename", None) else ""
        print(f"gpubench: cannot write {where}{err.strerror or err}; the {kept} finished "
              f"case(s) are in {json_path}", file=sys.stderr)
        return 1
    state["stage"] = "after the results were written"
    failures = (f"; {failed} failed (one line each in summary.md, tracebacks in "
                f"{logs_dir(json_path)}/)" if failed else "")
    from gpubench.cli.history import save_to_history

    save_to_history(args, json_path)
    print(f"gpubench: {kept} finished case(s) in {json_path}{failures}",
          file=sys.stderr if failed or code else sys.stdout)
    if code < 0 or code == 124:
        return 1
    if code == 2:  # pytest stopped the session early (a result it could not write)
        print("gpubench: the run stopped before its last case (pytest exit code 2)",
              file=sys.stderr)
        return 1
    if code != 0:
        print(f"gpubench: some cases failed (pytest exit code {code})", file=sys.stderr)
    return code


def _write_derived(args, state: dict, out: Path, json_path: Path, profile: str, device: str,
                   started: float) -> None:
    """summary.md, memory.json (no_grad / del), parity (opt-in), advice.md, charts and report
    from the finished cases, each written atomically into ``out``."""
    from gpubench.analysis.failures import failures_markdown
    from gpubench.measure.journal import failures_beside

    state["stage"] = "writing the summary and charts"
    df = load_results([json_path], labels=[profile])
    failures = failures_beside([json_path])
    text = summary_markdown(df) + failures_markdown(failures)
    atomic.write_text(out / "summary.md", f"# gpubench {profile} on {device}\n\n{text}")
    from gpubench.analysis.advice import advice_markdown
    from gpubench.analysis.answer import tune_reports_beside

    named = df[df["model"].notna()]  # records of no model (loader workers' overhead)
    models = dict(zip(named["model"], named["workload"].fillna(named["model"]), strict=True))
    reports = None
    if not getattr(args, "no_hygiene", False):
        from gpubench.cli.memory import run_hygiene

        state["stage"] = "measuring no_grad and del"
        reports = run_hygiene(models, out, profile, device)
        atomic.write_json(out / "memory.json", reports, indent=1)
    state["stage"] = "writing the summary and charts"
    parity = None
    if getattr(args, "parity", False):  # opt-in: N training steps per technique and model
        from gpubench.analysis.parity import load_parity_reports
        from gpubench.cli.parity import run_parity_for

        state["stage"] = "training for convergence parity"
        run_parity_for(list(models.values()), profile, device, out, chart=not args.no_charts)
        parity = load_parity_reports([out / "parity.json"])
        state["stage"] = "writing the summary and charts"
    atomic.write_text(out / "advice.md", "# gpubench advice\n\n"
                      + advice_markdown(df, memory_reports=reports, parity_reports=parity,
                                        failures=failures,
                                        tunes=tune_reports_beside([json_path])))
    if not args.no_charts:
        from gpubench.report.page import write_report

        write_report([json_path], out, labels=[profile])
    print("\n" + text)
    from gpubench.analysis.answer import answer_markdown

    answer = answer_markdown(df, tune_reports_beside([json_path]), base=out)
    if answer:
        print("## The answer: what to train with\n\n" + answer)
    print(f"gpubench: {_run_cost_line(df, time.monotonic() - started)}")
    print(f"gpubench: verdicts on the common speed-up claims in {out}/advice.md")
    if not args.no_charts:
        print(f"gpubench: charts and report in {out}/")


def _run_cost_line(df, wall_s: float) -> str:
    """How long the run took and how much of it was timed rounds (the step cases' and their
    paired baseline's, the claims pairs' and the harness checks' rounds)."""
    from gpubench.report.summary import timed_seconds

    timed = sum(timed_seconds(df))
    minutes, seconds = divmod(round(wall_s), 60)  # 779.6 s is 13:00, not 12:60
    if timed > wall_s:  # a resumed run: its kept cases' rounds were timed in an earlier one
        return (f"this session took {minutes}:{seconds:02d}; the results' timed rounds total "
                f"{timed:.0f} s, partly measured before --resume (where it went: summary.md)")
    return (f"the run took {minutes}:{seconds:02d}, of which timed rounds "
            f"{timed:.0f} s ({timed / wall_s:.0%}; where the rest went: summary.md)")


def cmd_list(args: argparse.Namespace) -> int:
    device, profile = resolve_target(args.device, args.profile)
    models = check_specs(model_specs(args), profile) or None
    for case in profile_cases(profile, device, models, group_list(args.groups) or None):
        reason = case.skip_reason()
        extra = " (slow)" if case.slow else ""
        extra += f"  skips here: {reason}" if reason else ""
        print(f"{case.id:42s} {case.group:13s}{extra}")
    return 0


def result_files(paths) -> list[Path]:
    """Result files as given; a results folder (``gpubench run --out``) stands for its
    ``benchmark.json``."""
    return [Path(p) / "benchmark.json" if Path(p).is_dir() and (Path(p) / "benchmark.json")
            .is_file() else Path(p) for p in paths]


def cmd_summary(args: argparse.Namespace) -> int:
    from gpubench.analysis.failures import failures_markdown
    from gpubench.measure.journal import failures_beside

    files = result_files(args.files)
    df = load_results(files)
    if args.csv:
        from gpubench.report.summary import summary_frame

        summary_frame(df).to_csv(sys.stdout, index=False)
    else:
        print(summary_markdown(df) + failures_markdown(failures_beside(files)))
        if args.price_per_hour:
            from gpubench.analysis.cost import cost_markdown

            print("\n### Cost\n\n" + cost_markdown(df, args.price_per_hour))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gpubench.report.page import write_report

    out = check_output("-o/--out", args.out)
    try:
        written = write_report(result_files(args.files), out)
    except OSError as err:  # a full disk: the folder is left as it was (drawn aside, renamed)
        print(f"gpubench: cannot write the report into {out}: {err.strerror or err}; {out} "
              "is unchanged", file=sys.stderr)
        return 1
    print("\n".join(str(p) for p in written))
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    from gpubench.analysis.advice import advice_markdown
    from gpubench.util.argtypes import parse_bytes

    budget = parse_bytes(args.budget) if args.budget else None
    if args.results:
        files = result_files([args.results])
        out = Path(args.out or files[0].parent)
        check_output("--out", out)
    else:
        if not args.model:
            raise ValueError("advise needs --model SPEC (to run its cases) or --results FILE")
        device, profile = resolve_target(args.device, args.profile)
        check_specs((args.model,), profile)
        from gpubench.workloads.registry import resolve

        name = resolve(args.model, profile).name
        out = Path(args.out or f"results/advise-{name}-{profile}")
        run_args = build_parser().parse_args(
            ["run", "--profile", profile, "--device", device, "--model", args.model,
             "--out", str(out)])
        code = cmd_run(run_args)
        if not (out / "benchmark.json").exists():
            return code or 1
        files = [out / "benchmark.json"]
    df = load_results(files)
    if args.model:
        spec = df["workload"] if "workload" in df else df["model"]
        df = df[(df["model"] == args.model) | (spec == args.model)]
    if df.empty:
        from gpubench.analysis.results import ResultsError

        raise ResultsError(f"no cases of model {args.model!r} in {', '.join(map(str, files))}")
    recs = None
    if not args.results:
        from gpubench.analysis.recommend import confirm, recommend

        print("gpubench: confirming the recommendation in alternating rounds ...", flush=True)
        recs = [confirm(r, df) for r in recommend(df, budget)]
    from gpubench.analysis.answer import tune_reports_beside
    from gpubench.measure.journal import failures_beside

    text = advice_markdown(df, budget, recs, memory_reports(args, files),
                           parity_reports(args, files), failures_beside(files),
                           tune_reports_beside(files))
    atomic.write_text(out / "advice.md", "# gpubench advice\n\n" + text)
    print(text)
    print(f"gpubench: verdicts written to {out / 'advice.md'}")
    return 0


def memory_reports(args: argparse.Namespace, files: list[Path]) -> list[dict]:
    """The ``gpubench memory`` reports the advice judges: ``--memory`` files, else a
    ``memory.json`` beside the results."""
    from gpubench.report.memory import load_memory_reports, memory_reports_beside

    paths = list(getattr(args, "memory", None) or [])
    return load_memory_reports(paths) if paths else memory_reports_beside(files)


def parity_reports(args: argparse.Namespace, files: list[Path]) -> list[dict]:
    """The ``gpubench parity`` reports the advice judges: ``--parity`` files, else a
    ``parity.json`` beside the results."""
    from gpubench.analysis.parity import load_parity_reports

    paths = list(getattr(args, "parity", None) or [])
    if not paths:
        paths = [p for p in (f.parent / "parity.json" for f in files) if p.is_file()]
    return load_parity_reports(paths)


def cmd_case(args: argparse.Namespace) -> int:
    """Run one configuration, given field by field, and write pytest-benchmark JSON."""
    from gpubench.cli.case import config_from_args
    from gpubench.launchers.workers import WorkerError
    from gpubench.measure.machine import machine_info
    from gpubench.measure.runner import run_case
    from gpubench.measure.standalone import StandaloneBenchmark, write_benchmark_json
    from gpubench.train.build import Unsupported
    from gpubench.train.config import GENERATED_DATASETS
    from gpubench.workloads.datasets import default_data_dir

    device, profile = resolve_target(args.device, args.profile)
    if args.data_dir:
        os.environ["GPUBENCH_DATA_DIR"] = args.data_dir  # inherited by worker processes
    check_specs((args.model,), profile)
    cfg = config_from_args(args, profile=profile, device=device)
    args.subject = cfg.id  # what a failure's one line names
    out = check_output("-o/--out", args.out, is_file=True)  # before the case runs
    bench = StandaloneBenchmark(f"case[{cfg.id}]", f"{cfg.name}-{profile}-{device}")
    bench.extra_info["group"] = "case"
    print(f"gpubench case: {cfg.id} ({profile}, {device}) ...", flush=True)
    from gpubench.util.progress import with_progress

    try:  # a live "case: round i/n" line on stderr, where that is a terminal
        run_case(with_progress(bench, cfg.id), cfg, rounds=args.rounds,
                 warmup_rounds=args.warmup, timeout_s=args.timeout, max_time_s=args.max_time)
    except Unsupported as why:
        print(f"gpubench case: {cfg.id} cannot run here: {why}", file=sys.stderr)
        return 3
    except WorkerError as err:  # a rank died or hung: which, and how, on one line
        if os.environ.get("GPUBENCH_DEBUG"):
            raise
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        cause = f" ... {lines[-1]}" if len(lines) > 1 else ""  # a rank's own traceback
        print(f"gpubench case: {cfg.id} failed: {lines[0] if lines else err}{cause}",
              file=sys.stderr)
        return 1
    # The storage probe of the data folder, for a case that reads the workload's own files.
    on_disk = cfg.loader.dataset not in GENERATED_DATASETS
    write_benchmark_json(out, [bench], machine_info(
        device, storage_dir=default_data_dir() if on_disk else None))
    info = bench.extra_info
    print(f"gpubench case: {cfg.id}: median step {info['step_time_s'] * 1e3:.2f} ms, "
          f"{info['samples_per_s']:.1f} samples/s, peak memory "
          f"{(info['peak_memory_bytes'] or 0) / 2**20:.1f} MiB"
          + ("" if info.get("peak_above_base_bytes") is None else
             f" (training peak {info['peak_above_base_bytes'] / 2**20:.1f} MiB above the "
             f"{info['resident_base_bytes'] / 2**20:.0f} MiB resident before the model)")
          + f"; wrote {out}")
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    from gpubench.cli.memory import memory_main

    check_specs((args.model,), resolve_target(args.device, args.profile)[1])  # its contract
    if args.out:
        check_output("--out", args.out)
    return memory_main(args)


def cmd_parity(args: argparse.Namespace) -> int:
    from gpubench.cli.parity import parity_main

    return parity_main(args)


def cmd_tune(args: argparse.Namespace) -> int:
    from gpubench.cli.tune import tune_main

    check_specs((args.model,), resolve_target(args.device, args.profile)[1])  # its contract
    if args.out:
        check_output("--out", args.out)
    return tune_main(args)


def cmd_export(args: argparse.Namespace) -> int:
    from gpubench.analysis.compare import write_github_json

    check_output("--github-json", args.github_json)
    for path in write_github_json(load_results(result_files([args.file])), args.github_json):
        print(path)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from gpubench.analysis.compare import compare_main, split_files

    bases, new = split_files(args)
    if args.markdown:  # bad output paths first: their one line alone, before any warning
        check_output("--markdown", args.markdown, is_file=True)
    if args.github_json:
        check_output("--github-json", args.github_json)
    same = [b for b in bases if _same_file(b, new)]
    if same:
        print(f"gpubench compare: warning: BASE and NEW are the same file ({new}): every case "
              "is compared with itself, which shows no change whatever the code does",
              file=sys.stderr)
    from gpubench.cli.compare import remeasure_cases

    return compare_main(args, remeasure=remeasure_cases(args))


def _same_file(a, b) -> bool:
    """Whether two result paths (a results folder stands for its benchmark.json) are one file."""
    try:
        return os.path.samefile(*result_files([a, b]))
    except OSError:
        return False


def _add_run_selection(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("--models", default="",
                   help="comma-separated workloads (default: the profile's built-in models); "
                   "each a " + SPEC_HELP)
    p.add_argument("--model", dest="model_list", action="append", metavar="SPEC",
                   help="a workload to run (repeatable): " + SPEC_HELP)
    add_session_arguments(p.add_argument, skip=tuple(o.name for o in SESSION_OPTIONS
                                                     if o.name != "groups"))


def _add_run_parser(sub) -> None:
    run = sub.add_parser("run", help="run a benchmark profile; write JSON, summary and charts")
    _add_run_selection(run)
    run.add_argument("--out", help="results folder (default: results/<profile>)")
    add_session_arguments(run.add_argument, skip=("profile", "device", "groups"))
    run.add_argument("-k", help="pytest -k expression selecting cases by id")
    run.add_argument("--trace", action="store_true",
                     help="after each case's timed rounds, profile a few steps: a Chrome trace "
                     "per case (and rank) in <out>/traces/ and its top operators in the record")
    run.add_argument("--parity", action="store_true",
                     help="also train each model's techniques for convergence parity (gpubench "
                     "parity's default techniques and steps: minutes per model on a CPU): "
                     "parity.json and a chart per model, and the accuracy verdict in the advice")
    run.add_argument("--no-charts", action="store_true", help="skip the charts and report")
    run.add_argument("--no-hygiene", action="store_true",
                     help="skip the no_grad / del measurement of each model after the cases "
                     "(a few seconds per model; the advice then has no verdict on them)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out that stopped (interrupted, killed, a "
                     "failing machine): its finished cases are kept and not run again; "
                     "refused when that run had another profile, device, models or options")
    run.set_defaults(func=cmd_run)
    add_history_option(run)


def _add_list_parser(sub) -> None:
    lst = sub.add_parser("list", help="list the cases of a profile")
    _add_run_selection(lst)
    lst.set_defaults(func=cmd_list)


def _add_summary_parser(sub) -> None:
    summ = sub.add_parser("summary", help="print the summary table of result files")
    summ.add_argument("files", nargs="+", help="benchmark JSON files, or results folders")
    summ.add_argument("--csv", action="store_true", help="CSV instead of Markdown")
    summ.add_argument("--price-per-hour", type=price_per_hour, metavar="PRICE", help=PRICE_HELP)
    summ.set_defaults(func=cmd_summary)


def _add_report_parser(sub) -> None:
    rep = sub.add_parser("report", help="charts and a Markdown/HTML report from result files")
    rep.add_argument("files", nargs="+", help="benchmark JSON files, or results folders")
    rep.add_argument("-o", "--out", required=True, help="folder for charts and report")
    rep.set_defaults(func=cmd_report)


def _add_compare_parser(sub) -> None:
    from gpubench.cli.compare import add_compare_arguments

    cmp_ = sub.add_parser("compare", help="regression check of NEW against BASE")
    add_compare_arguments(cmp_)
    cmp_.set_defaults(func=cmd_compare)


def _add_advise_parser(sub) -> None:
    adv = sub.add_parser("advise", help="verdicts on common speed-up claims, measured here")
    adv.add_argument("--model", default="",
                     help="workload to check (runs its cases unless --results is given): "
                     + SPEC_HELP)
    adv.add_argument("--results", help="use this benchmark JSON instead of running")
    add_target_arguments(adv)
    adv.add_argument("--budget", type=byte_size,
                     help="memory budget for the recommendation, e.g. 8G; " + BYTE_SIZE_HELP)
    adv.add_argument("--memory", action="append", metavar="FILE",
                     help="a memory.json of gpubench memory (repeatable): its OOM frontier and "
                     "no_grad / del measurements answer the memory claims (default: a "
                     "memory.json beside the results, if any)")
    adv.add_argument("--parity", action="append", metavar="FILE",
                     help="a parity.json of gpubench parity (repeatable): its loss curves answer "
                     "whether AMP, DDP and accumulation leave training accuracy unaffected "
                     "(default: a parity.json beside the results, if any)")
    adv.add_argument("--out", help="folder for advice.md (default: beside the results)")
    adv.set_defaults(func=cmd_advise)


def _add_case_parser(sub) -> None:
    from gpubench.cli.case import add_config_arguments

    case = sub.add_parser(
        "case", help="run one configuration given field by field; write pytest-benchmark JSON",
        description="Run any single configuration (one flag per RunConfig/LoaderConfig field) "
        "and write the same JSON as 'gpubench run' (summary, report and compare read it).")
    add_config_arguments(case)
    case.add_argument("--rounds", type=positive_int, default=10,
                      help="timed rounds (default 10)")
    case.add_argument("--warmup", type=non_negative_int, default=1,
                      help="untimed warm-up rounds (default 1)")
    case.add_argument("--max-time", type=non_negative, default=None,
                      help="seconds of timed rounds; slower steps run fewer rounds, at least 6")
    case.add_argument("--timeout", type=positive, default=300.0,
                      help="seconds each command of the case (build, data, check, steps; in "
                      "this process or in a rank) may take before it fails as hung (default 300)")
    case.add_argument("--data-dir", help="folder for generated on-disk datasets "
                      "(default: $GPUBENCH_DATA_DIR or ~/.cache/gpubench/data)")
    case.add_argument("-o", "--out", required=True, help="pytest-benchmark JSON file to write")
    case.set_defaults(func=cmd_case)


def _add_memory_parser(sub) -> None:
    from gpubench.cli.memory import add_memory_arguments

    mem = sub.add_parser("memory", help="OOM frontier, leak check and allocator figures")
    add_memory_arguments(mem)
    mem.set_defaults(func=cmd_memory)


def _add_parity_parser(sub) -> None:
    from gpubench.cli.parity import add_parity_arguments

    par = sub.add_parser("parity", help="convergence parity: loss curves of AMP, DDP and "
                         "accumulation against FP32 from the same weights and data")
    add_parity_arguments(par)
    par.set_defaults(func=cmd_parity)


def _add_tune_parser(sub) -> None:
    from gpubench.cli.tune import add_tune_arguments

    tun = sub.add_parser("tune", help="search the fastest configuration that keeps the global "
                         "batch, fits the memory budget and still trains")
    add_tune_arguments(tun)
    tun.set_defaults(func=cmd_tune)


def _add_export_parser(sub) -> None:
    exp = sub.add_parser("export", help="a result file's figures for github-action-benchmark")
    exp.add_argument("file")
    exp.add_argument("--github-json", required=True, metavar="DIR",
                     help="writes smaller_is_better.json and bigger_is_better.json into DIR")
    exp.set_defaults(func=cmd_export)


def _add_dist_parser(sub) -> None:
    from gpubench.cli.torchrun import add_dist_arguments, dist_main

    dst = sub.add_parser("dist", help="DDP/FSDP/pipeline cases as a rank of a torchrun or srun job")
    add_dist_arguments(dst)
    dst.set_defaults(func=dist_main)


COMMANDS = (_add_run_parser, _add_list_parser, _add_summary_parser, _add_report_parser,
            _add_compare_parser, _add_advise_parser, _add_case_parser, _add_memory_parser,
            _add_parity_parser, _add_tune_parser, _add_export_parser, add_history_parser,
            add_bisect_parser, _add_dist_parser, add_submit_parser)
"""The subcommands, in ``gpubench --help``'s order: each adds its parser to the subparsers
action and sets its ``func``. A new command is a function here and an entry in this tuple."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(  # errors on one line; its subcommand parsers are OneLineParsers
        prog="gpubench", description="Benchmark PyTorch training acceleration techniques."
    )
    from gpubench import __version__

    parser.add_argument("--version", action="version", version=f"gpubench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(sub)
    return parser


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` for the command line: one line, without the source line
    Python prints under a warning (``gpubench: warning: <message>``; where the warning is not
    gpubench's own ``UserWarning``, its category and origin too)."""
    text = " ".join(str(message).split())
    if category is UserWarning:
        return f"gpubench: warning: {text}\n"
    return f"gpubench: {category.__name__}: {text} ({Path(filename).name}:{lineno})\n"


def _call_command(args: argparse.Namespace) -> int:
    """``args.func(args)``, ending as ``gpubench.cli.failure`` says whatever happens: bad input
    one line and 2; Ctrl-C 130; any other error (out of memory, a workload's ``sys.exit``) one
    line naming the log with its traceback, and 1 (a ``sys.exit(N)``: N, 0 being 1). A
    command's own ``SystemExit`` with a message passes. ``GPUBENCH_DEBUG=1``: errors raise."""
    from gpubench.cli import failure

    subject = getattr(args, "model", None) or None
    bounded = bool(getattr(args, "timeout", None)) and args.command != "run"  # run: check_specs
    if bounded:
        from gpubench.workloads.api import set_probe_timeout  # (torch: 3 s)

        set_probe_timeout(args.timeout)  # workload validation and probe builds within it too
    try:
        return args.func(args)
    except ValueError as err:  # bad input: results files, workload specs, configurations
        if os.environ.get("GPUBENCH_DEBUG"):
            raise
        print(f"gpubench: {err}", file=sys.stderr)
        return failure.EXIT_USAGE
    except KeyboardInterrupt:
        if os.environ.get("GPUBENCH_DEBUG"):
            raise
        return failure.interrupted(args.command, getattr(args, "subject", subject))
    except SystemExit as err:
        if isinstance(err.code, str):
            raise  # the command's own one-line message
        if os.environ.get("GPUBENCH_DEBUG"):
            raise
        return failure.command_failed(args.command, getattr(args, "subject", subject), err)
    except Exception as err:  # noqa: BLE001 - one line and the log, never a traceback wall
        if os.environ.get("GPUBENCH_DEBUG"):
            raise
        return failure.command_failed(args.command, getattr(args, "subject", subject), err)
    finally:
        if bounded:  # a caller of main() in this process gets the default back
            set_probe_timeout(None)


def main(argv: list[str] | None = None) -> int:
    import warnings

    args = build_parser().parse_args(argv)
    previous, warnings.formatwarning = warnings.formatwarning, one_line_warning
    try:
        code = _call_command(args)
    finally:
        warnings.formatwarning = previous
    if argv is None:  # the command line, not a caller of main(): a workload's stray thread
        from gpubench.util.signals import exit_despite_stray_threads  # does not keep it alive

        exit_despite_stray_threads(code, what="gpubench")
    return code


if __name__ == "__main__":
    sys.exit(main())
