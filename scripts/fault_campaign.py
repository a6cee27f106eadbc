#!/usr/bin/env python3
"""Fault campaign of gpubench: bad input, signals, results that survive kills and full disks,
output paths, malformed result files, the CI gate, leftovers, configuration types, messages and
the network, against the installed ``gpubench`` command and the Python API.

    . .venv/bin/activate && python scripts/fault_campaign.py [--out results/fault_campaign.txt]
        [--skip-slow] [--configs N] [--files N] [--seed S] [--only PART,...]

Every scenario has an explicit pass criterion (exit status in the expected set, exactly one
stderr line naming the bad value where a one-line error is promised, no "Traceback", no
process left in the command's session, no socket listening outside 127.0.0.0/8 and ::1 during a
DDP case, the earlier results whole (in ``<out>/previous/`` once a new run has set them aside,
else in place), no hidden temporary left (the run lock ``.benchmark.json.lock`` excepted: it
may outlive a SIGKILL)).

"One-line failures" (``--only oneline``) holds, as real commands, the scenarios that used to
end in a traceback wall, a hang past ``--timeout``, a silent success or a misleading message:
fp16 on an LSTM on this CPU, a step's allocation refused under ``ulimit -v``, a ``make_batch``
that ignores ``n``, blocks or returns one tensor, a full data folder, tune's baseline failing,
Ctrl-C on ``case``, ``parity`` (in-process and while its DDP ranks start), ``memory`` and tune's
baseline, a run lock that is a folder, a factory calling ``sys.exit(0)`` under ``case``, ``run``
and ``tune``, ``tune --time 0.001``, ``tune --resume`` of a truncated ``tune.json``, ``compare
F F`` and a resumed run's shares. Each asserts: one stderr line (none on a success), no
traceback, an exit status of the documented table, done within the ``--timeout`` plus
``Campaign.GRACE_S`` (else ``Campaign.UNBOUNDED_S``), nothing left running, and every JSON file
the command wrote (``*.json``, each line of ``*.jsonl``) accepted by a strict parser; after a
Ctrl-C, what finished kept.

"Results survive" runs real ``gpubench run`` sessions of a few bert smoke cases and stops them
after N cases are in ``<out>/cases.jsonl``: SIGKILL of the pytest child, of ``gpubench run`` or
of both, Ctrl-C as a terminal sends it (SIGINT to the process group) once and twice followed by
``--resume``, SIGTERM while the charts are drawn, ``--out`` on a tmpfs mount point or through a
symlink, a tmpfs that fills during the cases, during the charts and under ``gpubench report -o``,
failing cases, two runs into one folder, and plain ``pytest --benchmark-json`` killed; what
finished must be in ``<out>/benchmark.json`` and shown by ``gpubench summary``. The tmpfs
scenarios need ``mount`` (root); where it fails they are skipped with a note.

The generated part builds ``RunConfig``/``LoaderConfig`` with random field values of every
type (only ``ValueError`` may be raised; accepted values must have the declared types) and reads
randomly damaged result files through ``gpubench.analysis.results`` (only ``ResultsError`` may be
raised; an accepted file must summarize). Everything is written under temporary folders; the summary
goes to ``--out``.

The result-file matrix (every damaged file through summary, report, compare as NEW and as BASE,
export and advise) runs in child Python processes that call ``gpubench.cli.main.main(argv)`` exactly
as the console script does (``sys.exit(main())``: an escaping exception prints its traceback
and exits 1), one child per command, so that ~300 invocations do not each pay for importing
pandas; a control row runs the same damaged file through the real ``gpubench`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import ipaddress
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "gpubench"
GPUBENCH = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "gpubench"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("GPUBENCH_DEBUG", None)
ENV.pop("COLUMNS", None)
sys.path.insert(0, str(ROOT / "tests"))
from processes import kill_session, session_processes, wait_gone  # noqa: E402

# -- outcome records ----------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    category: str
    name: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0


@dataclasses.dataclass
class Proc:
    """A finished command: exit status, output, processes left in its session."""

    argv: list[str]
    rc: int
    out: str
    err: str
    left: list[int] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def run_cmd(args: list[str], *, env: dict | None = None, timeout: float = 180,
            cwd: Path | None = None, prefix: list[str] | None = None) -> Proc:
    """Run ``gpubench ARGS`` (or ``prefix + ARGS``) in a session of its own; count what it
    leaves behind in that session for up to 10 s after it exits."""
    argv = [*(GPUBENCH if prefix is None else prefix), *args]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env or ENV, cwd=cwd or ROOT, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        return Proc(argv, -999, out.decode(errors="replace"),
                    err.decode(errors="replace") + f"\n[campaign: timed out after {timeout} s]",
                    [], time.monotonic() - start)
    left = wait_gone(proc.pid, 10)
    kill_session(proc.pid)
    return Proc(argv, proc.returncode, out.decode(errors="replace"),
                err.decode(errors="replace"), left, time.monotonic() - start)


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def check(p: Proc, codes, *, one_line: bool = False, names=(), traceback_ok: bool = False,
          quiet_or_one_line: bool = False) -> list[str]:
    """What is wrong with ``p``: the exit status not in ``codes``; with ``one_line``, stderr not
    exactly one line or not containing every string of ``names``; a traceback; leftovers."""
    problems = []
    if p.rc not in set(codes):
        problems.append(f"exit {p.rc}, expected {'/'.join(map(str, sorted(set(codes))))}")
    lines = stderr_lines(p.err)
    if one_line and len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines")
    if quiet_or_one_line and p.rc != 0 and len(lines) != 1:
        problems.append(f"exit {p.rc} with {len(lines)} stderr lines")
    for name in names:
        if name not in p.err:
            problems.append(f"stderr does not name {name!r}")
    if not traceback_ok and ("Traceback" in p.err or "Traceback" in p.out):
        problems.append("traceback")
    if p.left:
        problems.append(f"processes left: {p.left}")
    if problems:
        shown = lines if len(lines) <= 3 else [*lines[:2], "...", lines[-1]]
        tail = " | ".join(line.strip()[:160] for line in shown) or "(stderr empty)"
        problems.append(f"stderr: {tail}")
    return problems


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()} if folder.exists() else {}


def hidden_entries(folder: Path, allowed: set[str] = frozenset()) -> list[str]:
    """Hidden names anywhere under ``folder`` (temporaries), except ``allowed``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            if name.startswith(".") and name not in allowed:
                found.append(os.path.relpath(os.path.join(dirpath, name), folder))
    return found


LOCK_NAMES = frozenset({".benchmark.json.lock"})
"""The run lock in ``--out``: it exists while a run holds the folder and may remain after a
SIGKILL of ``gpubench run`` (empty, or holding a pid); not a temporary."""

KEPT = re.compile(r"(\d+) finished case\(s\)")


def earlier_results_whole(out: Path, before: dict[str, bytes]) -> list[str]:
    """The earlier run's files byte for byte: in ``<out>/previous/`` when a run set them aside,
    else in ``<out>`` itself (and then nothing else there but the lock)."""
    previous = out / "previous"
    if previous.is_dir():
        after, where = snapshot(previous), "out/previous"
    else:
        after = {k: v for k, v in snapshot(out).items() if k not in LOCK_NAMES}
        where = "out"
    if after == before:
        return []
    changed = sorted(set(after) ^ set(before)) or sorted(k for k in before
                                                         if after.get(k) != before[k])
    return [f"earlier results not whole in {where}: {changed[:6]}"]


def result_records(json_path: Path) -> tuple[list[dict] | None, str]:
    """The records of a pytest-benchmark file, or None and why not."""
    try:
        data = json.loads(json_path.read_text())
    except FileNotFoundError:
        return None, f"{json_path.name} missing"
    except (OSError, ValueError) as err:
        return None, f"{json_path.name} not valid JSON: {str(err)[:80]}"
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list) \
            or "machine_info" not in data:
        return None, f"{json_path.name} is not a pytest-benchmark file"
    bad = [b.get("name") for b in data["benchmarks"]
           if not isinstance(b, dict) or not (b.get("stats") or {}).get("data")]
    if bad:
        return None, f"{json_path.name}: records without rounds: {bad[:3]}"
    return data["benchmarks"], ""


def kept_as_said(out: Path, err: str, at_least: int = 0) -> list[str]:
    """What the run's stderr says was kept ("N finished case(s)") is in ``<out>/benchmark.json``
    (exactly N records), and at least ``at_least`` cases were kept (a line that says the run
    was stopped after its results were written names no count: the file must hold them)."""
    said = [int(n) for n in KEPT.findall(err)]
    if not said and not at_least:
        return []
    records, why = result_records(out / "benchmark.json")
    if records is None:
        return [f"says {said[-1] if said else 'the results were'} kept, but {why}"]
    problems = []
    if said and len(records) != said[-1]:
        problems.append(f"says {said[-1]} kept, benchmark.json holds {len(records)}")
    if not said and "after the results were written" not in err:
        problems.append("stderr does not say how many cases were kept")
    if len(records) < at_least:
        problems.append(f"{len(records)} case(s) kept, expected >= {at_least}")
    return problems


def read_strict(path: Path):
    """``path`` parsed as strict JSON (no NaN or Infinity token), or None where it is missing
    or not strict JSON."""
    try:
        return json.loads(path.read_text(), parse_constant=_refuse_constant)
    except (OSError, ValueError):
        return None


def _refuse_constant(token: str):
    raise ValueError(f"non-standard JSON token {token}")


def strict_json_files(folder: Path) -> list[str]:
    """Every ``*.json`` file under ``folder``, and every line of its ``*.jsonl`` files, that a
    strict parser (no NaN or Infinity token) refuses."""
    problems = []
    for path in sorted(folder.rglob("*.json*")) if folder.exists() else ():
        if not path.is_file() or path.suffix not in (".json", ".jsonl"):
            continue
        texts = (path.read_text(errors="replace").splitlines() if path.suffix == ".jsonl"
                 else [path.read_text(errors="replace")])
        for text in texts:
            try:
                json.loads(text, parse_constant=_refuse_constant)
            except ValueError as err:
                problems.append(f"{path.relative_to(folder)} not strict JSON: {err}"[:160])
                break
    return problems


def journal_of(json_path: Path) -> Path:
    """The journal beside a result file (as ``gpubench.measure.journal.journal_path``)."""
    return json_path.with_name("cases.jsonl" if json_path.name == "benchmark.json"
                               else f"{json_path.stem}.cases.jsonl")


def journal_entries(path: Path) -> list[dict]:
    """The parsed lines of a journal (a line cut short by a kill is skipped, as gpubench
    does)."""
    entries = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return entries
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def journal_cases(path: Path) -> list[dict]:
    return [e for e in journal_entries(path) if e.get("type") == "case"]


def journal_passed(path: Path) -> dict[str, dict]:
    """nodeid -> record of the cases a journal lists as passed (the last outcome counts)."""
    passed: dict[str, dict] = {}
    for e in journal_cases(path):
        passed.pop(e.get("nodeid"), None)
        if e.get("outcome") == "passed" and isinstance(e.get("record"), dict):
            passed[e["nodeid"]] = e["record"]
    return passed


def pytest_child(sid: int, leader: int) -> int | None:
    """The pytest process of ``gpubench run`` (session ``sid``, itself ``leader``)."""
    for pid in session_processes(sid):
        if pid == leader:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pytest" in cmdline:
            return pid
    return None


class Started:
    """A command started in a session of its own, stdout and stderr to files (no pipe to keep
    reading while waiting for it)."""

    def __init__(self, argv: list[str], folder: Path, env: dict, tag: str = "cmd"):
        self.argv = argv
        self.stdout = folder / f"{tag}.stdout"
        self.stderr = folder / f"{tag}.stderr"
        self.start = time.monotonic()
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT,
                                         start_new_session=True, stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid

    def err_text(self) -> str:
        return self.stderr.read_text(errors="replace")

    def wait_for(self, ready: Callable[[], bool], timeout: float = 240) -> str | None:
        """Poll ``ready`` every 50 ms; why it never became true, or None."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                return (f"ended (exit {self.proc.returncode}) before it was ready: "
                        f"{self.err_text()[-300:]!r}")
            if time.monotonic() > deadline:
                return f"not ready after {timeout:.0f} s"
            time.sleep(0.05)
        return None

    def wait_cases(self, journal: Path, n: int, timeout: float = 240) -> str | None:
        why = self.wait_for(lambda: len(journal_cases(journal)) >= n, timeout)
        return None if why is None else f"{n} case lines in {journal.name}: {why}"

    def finish(self, timeout: float = 120) -> Proc:
        """Wait for it to exit; count what is left in its session for up to 10 s."""
        problems = ""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            problems = f"\n[campaign: did not exit within {timeout:.0f} s]"
        left = wait_gone(self.pid, 10)
        kill_session(self.pid)
        self.proc.kill()
        rc = self.proc.wait() if not problems else -999
        return Proc(self.argv, rc, self.stdout.read_text(errors="replace"),
                    self.err_text() + problems, left, time.monotonic() - self.start)


# -- result files ------------------------------------------------------------------------------


def synthetic_bench(name: str, baseline: bool, step: float) -> dict:
    info = {"kind": "step", "case_id": name, "model": "bert", "profile": "smoke",
            "device": "cpu", "precision": "fp32", "accum_steps": 1, "micro_batch": 8,
            "global_batch": 8, "optimizer": "sgd", "parallel": "single", "world_size": 1,
            "input_shape": [8, 16], "is_baseline": baseline, "step_time_s": step,
            "samples_per_s": 8 / step, "peak_memory_bytes": 10**8, "flops_per_step": 10**9,
            "tflops": 0.1, "mfu": 0.01, "workload": "bert"}
    data = [step * f for f in (0.95, 0.98, 1.0, 1.01, 1.03, 1.05)]
    return {"name": f"test_step[{name}]", "group": "bert-smoke-cpu", "fullname": name,
            "params": None, "param": name, "options": {},
            "stats": {"min": min(data), "max": max(data), "mean": sum(data) / 6,
                      "stddev": step * 0.03, "median": step, "iqr": step * 0.03,
                      "q1": step * 0.98, "q3": step * 1.01, "rounds": 6, "data": data},
            "extra_info": info}


def base_results() -> dict:
    """A small valid result file: the bert records of results/cpu (real records), else
    synthetic ones."""
    path = ROOT / "results" / "cpu" / "benchmark.json"
    try:
        data = json.loads(path.read_text())
        benches = [b for b in data["benchmarks"]
                   if (b.get("extra_info") or {}).get("model") == "bert"
                   and (b.get("extra_info") or {}).get("group") in ("precision", "memory")]
        benches.sort(key=lambda b: not b["extra_info"].get("is_baseline"))
        if benches and benches[0]["extra_info"].get("is_baseline"):
            return {**data, "benchmarks": benches[:4]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return {"machine_info": {"node": "campaign", "cpu": {"brand_raw": "x"}},
            "datetime": "2026-01-01T00:00:00", "version": "5.1.0",
            "benchmarks": [synthetic_bench("bert-fp32", True, 0.01),
                           synthetic_bench("bert-fp32-zerofill", False, 0.011)]}


def _set_extra(i: int, key: str, value):
    def mutate(d):
        d["benchmarks"][i]["extra_info"][key] = value
        return d
    return mutate


def _set_stat(i: int, key: str, value):
    def mutate(d):
        d["benchmarks"][i]["stats"][key] = value
        return d
    return mutate


def _set(path: tuple, value):
    def mutate(d):
        target = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return d
    return mutate


def _delete(path: tuple):
    def mutate(d):
        target = d
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return d
    return mutate


def _all_extra(key: str, value):
    def mutate(d):
        for b in d["benchmarks"]:
            b["extra_info"][key] = value
        return d
    return mutate


BAD = "bad"   # a one-line error (exit 2) naming the file
ODD = "odd"   # valid but unusual: exit 0, or a one-line error (exit 2)
GOOD = "good"  # exit 0

# (name, mutation of the parsed base file or raw text, expectation)
RESULT_FILES: list[tuple[str, object, str]] = [
    ("control: the valid file", None, GOOD),
    ("not JSON", "{not json", BAD),
    ("empty file", "", BAD),
    ("binary", b"\xff\xfe\x00garbage", BAD),
    ("truncated JSON", "TRUNCATE", BAD),
    ("top level a list", "[]", BAD),
    ("top level null", "null", BAD),
    ("top level a number", "42", BAD),
    ("a 5000-digit integer", '{"benchmarks": [' + "9" * 5000 + "]}", BAD),
    ("nested 100000 deep", "[" * 100000 + "]" * 100000, BAD),
    ("benchmarks missing", _delete(("benchmarks",)), BAD),
    ("benchmarks null", _set(("benchmarks",), None), BAD),
    ("benchmarks an object", _set(("benchmarks",), {}), BAD),
    ("benchmarks empty", _set(("benchmarks",), []), BAD),
    ("null entry", _set(("benchmarks", 1), None), BAD),
    ("entry a number", _set(("benchmarks", 0), 5), BAD),
    ("extra_info null", _set(("benchmarks", 0, "extra_info"), None), BAD),
    ("extra_info a list", _set(("benchmarks", 0, "extra_info"), [1, 2]), BAD),
    ("extra_info a string", _set(("benchmarks", 1, "extra_info"), "fast"), BAD),
    ("stats missing", _delete(("benchmarks", 0, "stats")), BAD),
    ("stats null", _set(("benchmarks", 0, "stats"), None), BAD),
    ("median a string", _set_stat(0, "median", "fast"), BAD),
    ("median NaN", _set_stat(0, "median", float("nan")), BAD),
    ("median Infinity", _set_stat(1, "median", float("inf")), BAD),
    ("median negative", _set_stat(1, "median", -0.01), BAD),
    ("median zero", _set_stat(1, "median", 0), BAD),
    ("median a huge integer", _set_stat(1, "median", 10**30), BAD),
    ("round time zero", _set_stat(1, "data", [0.01, 0.0, 0.01]), BAD),
    ("round time negative", _set_stat(0, "data", [0.01, -0.01, 0.01]), BAD),
    ("round time NaN", _set_stat(0, "data", [0.01, float("nan"), 0.01]), BAD),
    ("rounds zero", _set_stat(0, "rounds", 0), BAD),
    ("step_time_s a string", _set_extra(0, "step_time_s", "0.1"), BAD),
    ("step_time_s NaN", _set_extra(1, "step_time_s", float("nan")), BAD),
    ("step_time_s negative", _set_extra(1, "step_time_s", -1.0), BAD),
    ("step_time_s zero", _set_extra(0, "step_time_s", 0), BAD),
    ("step_time_s a huge integer", _set_extra(0, "step_time_s", 10**40), BAD),
    ("samples_per_s null", _set_extra(0, "samples_per_s", None), BAD),
    ("model null", _set_extra(0, "model", None), BAD),
    ("model a number", _set_extra(1, "model", 7), BAD),
    # documented: a record lacking a required field loads with a warning (older or foreign
    # files), and charts and tables skip it
    ("model missing", _delete(("benchmarks", 0, "extra_info", "model")), ODD),
    ("accum_steps true", _set_extra(0, "accum_steps", True), BAD),
    ("accum_steps 2.5", _set_extra(1, "accum_steps", 2.5), BAD),
    ("accum_steps zero", _set_extra(1, "accum_steps", 0), BAD),
    ("accum_steps a string", _set_extra(1, "accum_steps", "4"), BAD),
    ("is_baseline a string", _set_extra(0, "is_baseline", "yes"), BAD),
    ("input_shape a string", _set_extra(0, "input_shape", "8x16"), BAD),
    ("input_shape negative", _set_extra(0, "input_shape", [8, -1]), BAD),
    ("peak memory a huge integer", _set_extra(0, "peak_memory_bytes", 10**40), BAD),
    ("unknown field a huge integer", _set_extra(0, "zzz_field", 10**40), BAD),
    ("precision a number", _set_extra(1, "precision", 16), BAD),
    ("kind unknown", _set_extra(1, "kind", "mystery"), BAD),
    ("machine_info a list", _set(("machine_info",), [1]), BAD),
    ("name missing", _delete(("benchmarks", 0, "name")), BAD),
    ("unknown model", _all_extra("model", "nosuchmodel"), ODD),
    ("unknown workload spec", _all_extra("workload", "nosuch.py:factory"), ODD),
    ("unknown fields", _all_extra("zzz_note", "hello"), GOOD),
    ("no baseline record", lambda d: {**d, "benchmarks": d["benchmarks"][1:]}, ODD),
    ("a record twice", lambda d: {**d, "benchmarks": d["benchmarks"] + d["benchmarks"][:1]},
     ODD),
    ("machine_info missing", _delete(("machine_info",)), ODD),
    ("pytest record without extra_info",
     lambda d: {**d, "benchmarks": d["benchmarks"] + [
         {k: v for k, v in d["benchmarks"][0].items() if k != "extra_info"}]}, ODD),
]


def write_result_file(folder: Path, index: int, name: str, mutation, base: dict) -> Path:
    path = folder / f"r{index:02d}.json"
    if mutation is None:
        path.write_text(json.dumps(base))
    elif mutation == "TRUNCATE":
        path.write_text(json.dumps(base)[:300])
    elif isinstance(mutation, bytes):
        path.write_bytes(mutation)
    elif isinstance(mutation, str):
        path.write_text(mutation)
    else:
        path.write_text(json.dumps(mutation(copy.deepcopy(base))))
    return path


# -- in-process driver: gpubench.cli.main.main as the console script calls it ----------------------


def drive(jobs_file: str) -> None:
    """Child mode: run each argv of ``jobs_file`` through ``gpubench.cli.main.main`` as
    ``sys.exit(main())`` would, output and stderr captured; print one JSON line per job."""
    import warnings

    from gpubench.cli import main as cli

    saved_filters = warnings.filters[:]
    results = []
    for argv in json.loads(Path(jobs_file).read_text()):
        out, err = io.StringIO(), io.StringIO()
        warnings.filters[:] = saved_filters
        warnings._filters_mutated()  # a fresh "once" registry: each call sees its warnings
        start = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(argv)
                rc = 0 if rc is None else rc
            except SystemExit as exit_:
                code = exit_.code
                if code is None or isinstance(code, int):
                    rc = code or 0
                else:
                    print(code, file=sys.stderr)
                    rc = 1
            except BaseException:  # what the interpreter would print
                traceback.print_exc()
                rc = 1
        results.append({"argv": argv, "rc": rc, "out": out.getvalue()[-4000:],
                        "err": err.getvalue()[-4000:], "seconds": time.monotonic() - start})
    print(json.dumps(results))


def run_driver(jobs: list[list[str]], work: Path, tag: str) -> list[Proc]:
    jobs_file = work / f"jobs-{tag}.json"
    jobs_file.write_text(json.dumps(jobs))
    p = run_cmd(["--drive", str(jobs_file)], prefix=[sys.executable, str(Path(__file__))],
                timeout=600)
    try:
        rows = json.loads(p.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [Proc(j, -998, "", f"[campaign: driver failed rc {p.rc}: {p.err[-300:]}]")
                for j in jobs]
    procs = [Proc(r["argv"], r["rc"], r["out"], r["err"], [], r["seconds"]) for r in rows]
    if p.left and procs:
        procs[-1].left = p.left
    return procs


# -- the scenarios ------------------------------------------------------------------------------


class Campaign:
    def __init__(self, work: Path, args: argparse.Namespace):
        self.work = work
        self.args = args
        self.outcomes: list[Outcome] = []
        self.generated: dict[str, list] = {}
        self.counter = 0
        self.mounts: list[Path] = []
        self.notes: list[str] = []
        self.before_charts: dict[Path, int] | None = None

    def tmp(self, tag: str) -> Path:
        self.counter += 1
        path = self.work / f"{self.counter:03d}-{tag}"
        path.mkdir(parents=True)
        return path

    def record(self, category: str, name: str, problems: list[str], seconds: float = 0.0):
        outcome = Outcome(category, name, not problems, "; ".join(problems), seconds)
        self.outcomes.append(outcome)
        mark = "ok  " if outcome.ok else "FAIL"
        print(f"  {mark} [{category}] {name}" + ("" if outcome.ok else f": {outcome.detail}"),
              flush=True)

    def cli_scenarios(self, category: str, rows: list[tuple]) -> None:
        """(name, argv, codes, names, env, one_line) rows. The first row of each command, and
        every row with its own environment, runs as the real ``gpubench`` command (two at a
        time); the others run through ``gpubench.cli.main.main`` in one child process (``drive``),
        which saves a Python start and the torch import per row."""
        seen: set[str] = set()
        real, driven = [], []
        for row in rows:
            command = row[1][0] if row[1] else ""
            (real if row[4] is not None or command not in seen else driven).append(row)
            seen.add(command)

        def one(row):
            return run_cmd(row[1], env=row[4], timeout=90)

        with ThreadPoolExecutor(2) as pool:
            results = dict(zip(map(id, real), pool.map(one, real), strict=True))
        if driven:
            procs = run_driver([row[1] for row in driven], self.work, f"{category[:4]}{len(rows)}")
            results.update(zip(map(id, driven), procs, strict=True))
        for row in rows:
            name, _, codes, names, _, one_line = row
            p = results[id(row)]
            how = "" if row in driven else " (real command)"
            self.record(category, name + how,
                        check(p, codes, one_line=one_line, names=names), p.seconds)

    # -- arguments ------------------------------------------------------------------------------

    def arguments(self, valid: Path) -> None:
        print("arguments", flush=True)
        out = self.tmp("args")
        dist_env = {**ENV, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "29599"}
        memory = ["memory", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                  "--no-leaks", "--no-hygiene", "--out", str(out / "mem")]
        rows = []

        def row(name, argv, names, codes=(2,), env=None, one_line=True):
            rows.append((name, argv, codes, names, env, one_line))

        for budget in ("foo", "0", "-1GiB", "nan", "inf", "1e400"):
            row(f"advise --budget {budget}",
                ["advise", "--results", str(valid), "--budget", budget, "--out", str(out)],
                [budget])
            row(f"memory --budget {budget}", [*memory, "--budget", budget], [budget])
        row("memory --techniques bogus", [*memory, "--techniques", "bogus", "--budget", "1G"],
            ["bogus"])
        row("memory --techniques fp32,,nope", [*memory, "--techniques", "fp32,nope",
                                               "--budget", "1G"], ["nope"])
        for value in ("0", "-1", "foo"):
            row(f"memory --max-batch {value}", [*memory, "--max-batch", value,
                                                "--budget", "1G"], [value])
        row("list --models bogus", ["list", "--profile", "smoke", "--models", "bogus"],
            ["bogus"])
        row("list --groups bogus", ["list", "--profile", "smoke", "--groups", "bogus"],
            ["bogus"])
        row("list --profile bogus", ["list", "--profile", "bogus"], ["bogus"])
        row("list --model missing.py:f", ["list", "--profile", "smoke", "--model",
                                         "missing.py:f"], ["missing.py"])
        for var, value in (("RANK", "foo"), ("RANK", "-1"), ("RANK", "5"),
                           ("WORLD_SIZE", "0"), ("WORLD_SIZE", "x"), ("LOCAL_RANK", "-3")):
            env = {**dist_env, "RANK": "0", var: value}
            row(f"dist with {var}={value}",
                ["dist", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                 "--out", str(out / "d.json")], [value], env=env)
        env = {**dist_env, "RANK": "0"}
        for flag, value in (("--accum-steps", "0"), ("--rounds", "0"), ("--warmup", "-1"),
                            ("--chunks", "0"), ("--micro-batch", "-4")):
            row(f"dist {flag} {value}",
                ["dist", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                 flag, value, "--out", str(out / "d.json")], [value], env=env)
        row("dist --model bogus", ["dist", "--model", "bogus", "--profile", "smoke",
                                   "--device", "cpu", "--out", str(out / "d.json")],
            ["bogus"], env=env)
        run = ["run", "--profile", "smoke", "--models", "bert", "--no-charts",
               "--out", str(out / "run")]
        for flag, value in (("--threads", "-1"), ("--threads", "x"), ("--rounds", "-1"),
                            ("--rounds", "1.5"), ("--rounds", "nan"), ("--warmup", "-2"),
                            ("--max-time", "-1"), ("--max-time", "nan"), ("--timeout", "0"),
                            ("--timeout", "inf"), ("--groups", "bogus"), ("--models", "bogus"),
                            ("--profile", "huge"), ("--device", "tpu")):
            row(f"run {flag} {value}", [*run, flag, value], [value])
        case = ["case", "--model", "bert", "--profile", "smoke", "-o", str(out / "c.json")]
        for flag, value in (("--rounds", "0"), ("--accum-steps", "0"), ("--micro-batch", "-1"),
                            ("--precision", "fp4"), ("--num-workers", "-1"),
                            ("--world-size", "0"), ("--timeout", "-5"), ("--seed", "-1"),
                            ("--seed", "x")):
            row(f"case {flag} {value}", [*case, flag, value], [value])
        row("case --model bogus", ["case", "--model", "bogus", "--profile", "smoke",
                                   "-o", str(out / "c.json")], ["bogus"])
        row("case --parallel single --world-size 2",
            [*case, "--parallel", "single", "--world-size", "2"], ["world_size"])
        row("case --prefetch-factor 2 without workers",
            [*case, "--dataset", "synthetic", "--prefetch-factor", "2"], ["prefetch_factor"])
        cmp_ = ["compare", str(valid), str(valid)]
        for flag, value in (("--alpha", "nan"), ("--alpha", "0"), ("--alpha", "1"),
                            ("--alpha", "x"), ("--time-threshold", "-1"),
                            ("--time-threshold", "nan"), ("--memory-threshold", "inf")):
            row(f"compare {flag} {value}", [*cmp_, flag, value], [value])
        row("compare with one file", ["compare", str(valid)], ["compare"])
        row("compare --base B with two NEW",
            ["compare", "--base", str(valid), str(valid), str(valid)], ["NEW"])
        row("export missing file", ["export", str(out / "nope.json"), "--github-json",
                                    str(out / "gh")], ["nope.json"])
        row("summary missing file", ["summary", str(out / "nope.json")], ["nope.json"])
        row("advise without --model or --results", ["advise", "--out", str(out)],
            ["--model"])
        row("advise --results with unknown --model",
            ["advise", "--results", str(valid), "--model", "gpt2", "--out", str(out)],
            ["gpt2"])
        row("no command", [], ["command"])
        row("unknown command", ["frobnicate"], ["frobnicate"])
        self.cli_scenarios("arguments", rows)
        # --rounds 0 / --threads 0: accepted only where they mean something documented
        p = run_cmd(["run", "--help"])
        problems = check(p, (0,))
        text = " ".join(p.out.split())
        for flag in ("--rounds", "--threads"):
            if f"{flag} " not in text or "or 0:" not in text.split(flag, 2)[-1][:200]:
                problems.append(f"{flag} 0 not documented in run --help")
        self.record("arguments", "run --rounds 0 / --threads 0 documented", problems, p.seconds)

    # -- output paths ---------------------------------------------------------------------------

    def output_paths(self, valid: Path) -> None:
        print("output paths", flush=True)
        base = self.tmp("paths")
        a_file = base / "a-file"
        a_file.write_text("keep me")
        unwritable = Path("/proc/gpubench-campaign-out")  # writable for no one, root included
        if os.geteuid() != 0:
            (base / "ro").mkdir()
            (base / "ro").chmod(0o555)
            unwritable = base / "ro" / "out"
        a_folder = base / "a-folder"
        a_folder.mkdir()
        folders = {"a file": (a_file, "is a file"),
                   "under a file": (a_file / "sub", "lies under"),
                   "read-only": (unwritable, "not writable")}
        files = {"a folder": (a_folder, "folder"),
                 "under a file": (a_file / "sub" / "x.out", "lies under"),
                 "read-only": (unwritable / "x.out", "not writable")}
        dist_env = {**ENV, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29598"}
        run = ["run", "--profile", "smoke", "--models", "bert", "--no-charts", "-k", "zerofill"]
        takes_folder = {
            "run --out": lambda p: [*run, "--out", p],
            "run --data-dir": lambda p: [*run, "--out", str(base / "o"), "--data-dir", p],
            "report -o": lambda p: ["report", str(valid), "-o", p],
            "export --github-json": lambda p: ["export", str(valid), "--github-json", p],
            "advise --out": lambda p: ["advise", "--results", str(valid), "--out", p],
            "compare --github-json": lambda p: ["compare", str(valid), str(valid),
                                                "--github-json", p],
            "memory --out": lambda p: ["memory", "--model", "bert", "--profile", "smoke",
                                       "--budget", "2G", "--techniques", "fp32", "--no-leaks",
                                       "--no-hygiene", "--out", p],
        }
        takes_file = {
            "compare --markdown": lambda p: ["compare", str(valid), str(valid), "--markdown", p],
            "case -o": lambda p: ["case", "--model", "bert", "--profile", "smoke", "--rounds",
                                  "6", "-o", p],
            "dist --out": lambda p: ["dist", "--model", "bert", "--profile", "smoke",
                                     "--device", "cpu", "--out", p],
        }
        rows = []
        for options, bad in ((takes_folder, folders), (takes_file, files)):
            for option, argv in options.items():
                for what, (path, words) in bad.items():
                    names = [str(path), words] if option == "run --out" else [str(path)]
                    env = dist_env if option.startswith("dist") else None
                    rows.append((f"{option} {what}", argv(str(path)), (2,), names, env, True))
        started = time.monotonic()
        self.cli_scenarios("output paths", rows)
        problems = [] if a_file.read_text() == "keep me" else ["the file given as --out changed"]
        left = hidden_entries(base)
        if left:
            problems.append(f"hidden temporaries left: {left}")
        self.record("output paths", "nothing written beside the bad paths", problems,
                    time.monotonic() - started)

    # -- result files ---------------------------------------------------------------------------

    def result_files(self, base: dict) -> None:
        print("malformed result files", flush=True)
        folder = self.tmp("files")
        valid = write_result_file(folder, 99, "valid", None, base)
        files = [(name, write_result_file(folder, i, name, mutation, base), expect)
                 for i, (name, mutation, expect) in enumerate(RESULT_FILES)]
        (folder / "a-directory.json").mkdir()
        files.append(("a directory", folder / "a-directory.json", BAD))
        files.append(("a missing file", folder / "missing.json", BAD))
        commands: dict[str, Callable[[Path, Path], list[str]]] = {
            "summary": lambda f, o: ["summary", str(f)],
            "summary --csv": lambda f, o: ["summary", "--csv", str(f)],
            "report": lambda f, o: ["report", str(f), "-o", str(o)],
            "compare (as NEW)": lambda f, o: ["compare", str(valid), str(f)],
            "compare (as BASE)": lambda f, o: ["compare", str(f), str(valid)],
            "export": lambda f, o: ["export", str(f), "--github-json", str(o)],
            "advise": lambda f, o: ["advise", "--results", str(f), "--out", str(o)],
        }
        jobs = {c: [] for c in commands}
        for c, make in commands.items():
            for k, (_, path, _) in enumerate(files):
                jobs[c].append(make(path, folder / f"out-{c.split()[0]}-{k}"))
        with ThreadPoolExecutor(2) as pool:
            done = dict(zip(commands, pool.map(
                lambda c: run_driver(jobs[c], self.work, c.split()[0] + str(len(c))), commands),
                strict=True))
        for c in commands:
            for (name, path, expect), p in zip(files, done[c], strict=True):
                codes = {GOOD: (0,), BAD: (2,), ODD: (0, 2)}[expect]
                if c.startswith("compare") and expect == ODD:
                    codes = (0, 1, 2)
                names = [path.name] if expect == BAD else []
                problems = check(p, codes, one_line=expect == BAD, names=names,
                                 quiet_or_one_line=expect == ODD and not c.startswith("compare"))
                self.record(f"result files: {c}", name, problems, p.seconds)
        # control: the same kinds through the real command
        for name, path, _ in [f for f in files if f[0] in ("null entry", "median zero",
                                                                "extra_info a list")]:
            p = run_cmd(["summary", str(path)])
            self.record("result files: summary (real command)", name,
                        check(p, (2,), one_line=True, names=[path.name]), p.seconds)
        # NaN / negative / zero times never silently accepted (the control file reads fine)
        self.record("result files", "controls read back unchanged",
                    [] if json.loads(valid.read_text()) == base else ["valid file changed"])

    # -- the CI gate ----------------------------------------------------------------------------

    def ci_gate(self, base: dict) -> None:
        print("CI gate", flush=True)
        folder = self.tmp("gate")
        valid = folder / "base.json"
        valid.write_text(json.dumps(base))
        empty = folder / "empty.json"
        empty.write_text(json.dumps({**base, "benchmarks": []}))
        other = folder / "other.json"
        changed = copy.deepcopy(base)
        for b in changed["benchmarks"]:
            b["extra_info"]["model"] = "othermodel"
            b["extra_info"]["workload"] = "othermodel"
            b["extra_info"]["case_id"] = b["extra_info"]["case_id"].replace("bert", "other")
        other.write_text(json.dumps(changed))
        slow = folder / "slower.json"
        slower = copy.deepcopy(base)
        for b in slower["benchmarks"]:
            b["stats"] = {k: (v * 3 if isinstance(v, float) else
                              [x * 3 for x in v] if k == "data" else v)
                          for k, v in b["stats"].items()}
            b["extra_info"]["step_time_s"] *= 3
            b["extra_info"]["samples_per_s"] /= 3
        slow.write_text(json.dumps(slower))
        rows = [
            ("compare BASE EMPTY", ["compare", str(valid), str(empty)], (2,), ["empty.json"],
             None, True),
            ("compare --report-only BASE EMPTY",
             ["compare", "--report-only", str(valid), str(empty)], (2,), ["empty.json"], None,
             True),
            ("compare BASE NEW-without-common-case", ["compare", str(valid), str(other)], (2,),
             ["other.json"], None, True),
            ("compare --new-only BASE NEW-without-common-case",
             ["compare", "--new-only", str(valid), str(other)], (2,), ["other.json"], None,
             True),
            ("compare --alpha nan", ["compare", "--alpha", "nan", str(valid), str(valid)], (2,),
             ["nan"], None, True),
        ]
        self.cli_scenarios("CI gate", rows)
        p = run_cmd(["compare", str(valid), str(valid)])
        problems = check(p, (0,))
        n = len(base["benchmarks"])
        if f"compared {n} case(s)" not in p.out:
            problems.append(f"does not say it compared {n} cases")
        self.record("CI gate", "compare BASE BASE: exit 0 and the count", problems, p.seconds)
        p = run_cmd(["compare", str(valid), str(slow)])
        problems = check(p, (1,))
        if "regression" not in p.err:
            problems.append("regression not named on stderr")
        self.record("CI gate", "compare BASE 3x-slower: exit 1", problems, p.seconds)

    # -- configuration types (explicit) -----------------------------------------------------------

    def types(self) -> None:
        print("configuration types", flush=True)
        from gpubench.train.config import LoaderConfig, RunConfig

        class Truthy:
            def __bool__(self):
                return True

        try:
            import numpy as np
            extra = [np.bool_(True), np.int64(2), np.float64(1.0)]
        except ImportError:
            extra = []
        bool_fields = [f.name for f in dataclasses.fields(RunConfig) if f.type == "bool"]
        loader_bools = [f.name for f in dataclasses.fields(LoaderConfig) if f.type == "bool"]
        started = time.monotonic()
        for name in bool_fields:
            for value in (1, 0, "yes", "", None, 1.0, [], Truthy(), *extra[:1]):
                self._expect_value_error(f"RunConfig {name}={value!r}", RunConfig,
                                         {"model": "bert", "profile": "smoke", name: value})
        for name in loader_bools:
            for value in (1, 0, "true", None, *extra[:1]):
                self._expect_value_error(f"LoaderConfig {name}={value!r}", LoaderConfig,
                                         {"dataset": "synthetic", name: value})
        for value in (None, "1", 1.5, True, -1, float("nan"), *extra[1:2]):
            self._expect_value_error(f"RunConfig seed={value!r}", RunConfig,
                                     {"model": "bert", "profile": "smoke", "seed": value})
        for field, values in (("accum_steps", (True, 2.0, "2", 0, None, *extra[1:2])),
                              ("world_size", (False, 2.0, -1)),
                              ("micro_batch", (0, True, 4.0, "8")),
                              ("chunks", (0, 1.0)),
                              ("model", (None, 5, "", "bogus")),
                              ("profile", (None, "SMOKE", 1)),
                              ("loader", (None, {}, "synthetic"))):
            for value in values:
                self._expect_value_error(f"RunConfig {field}={value!r}", RunConfig,
                                         {"model": "bert", "profile": "smoke", field: value})
        for field, values in (("num_workers", (-1, True, 1.0, "2", None)),
                              ("prefetch_factor", (0, True, 2.0)),
                              ("dataset_size", (0, -5, 1.5, True)),
                              ("cache_items", (0, False)),
                              ("dataset", (None, "", 3))):
            for value in values:
                self._expect_value_error(f"LoaderConfig {field}={value!r}", LoaderConfig,
                                         {"dataset": "synthetic", field: value})
        print(f"  ({time.monotonic() - started:.1f} s)")

    def _expect_value_error(self, name: str, cls, kwargs: dict) -> None:
        try:
            cls(**kwargs)
        except ValueError as err:
            text = str(err)
            problems = [] if "\n" not in text.strip() else ["message over several lines"]
            self.record("types", name, problems)
            return
        except Exception as err:  # noqa: BLE001 - the criterion: nothing but ValueError
            self.record("types", name, [f"{type(err).__name__}: {err}"[:200]])
            return
        self.record("types", name, ["accepted"])

    # -- generated configurations -------------------------------------------------------------

    def generated_configs(self, n: int, seed: int) -> None:
        print(f"generated configurations ({n})", flush=True)
        from gpubench.train.config import (
            OPTIMIZER_IMPLS,
            OPTIMIZERS,
            PARALLELS,
            PRECISIONS,
            SCHEDULES,
            LoaderConfig,
            RunConfig,
        )

        rng = random.Random(seed)

        class Odd:
            pass

        try:
            import numpy as np
            numpy_values = [np.int64(2), np.bool_(False), np.float32(1.0), np.array([1])]
        except ImportError:
            numpy_values = []
        pool = [None, True, False, 0, 1, 2, -1, 7, 2**70, -(2**70), 0.0, 1.0, 2.5, -0.5,
                float("nan"), float("inf"), "", "1", "fp32", "bert", "bogus", "ddp", "x" * 300,
                b"bytes", [], [1], {}, {"a": 1}, (1,), Odd(), object(), 1j, range(3),
                *numpy_values]
        valid_run = {
            "model": ["bert", "resnet18", "gpt2"], "profile": ["smoke"], "device": ["cpu"],
            "precision": list(PRECISIONS), "accum_steps": [1, 2, 4],
            "micro_batch": [None, 1, 4, 8], "optimizer": list(OPTIMIZERS),
            "optimizer_impl": list(OPTIMIZER_IMPLS), "parallel": list(PARALLELS),
            "world_size": [1, 2, 4], "chunks": [1, 2, 4], "schedule": list(SCHEDULES),
            "seed": [0, 1, 12345, 2**31], "loader": [None],
        }
        valid_loader = {
            "dataset": ["device-resident", "synthetic", "tokens-mmap", "images-jpeg"],
            "dataset_size": [None, 16, 256], "cache_items": [None, 1, 64],
            "num_workers": [0, 1, 2], "prefetch_factor": [None, 2, 4],
        }
        run_fields = {f.name: f.type for f in dataclasses.fields(RunConfig)}
        loader_fields = {f.name: f.type for f in dataclasses.fields(LoaderConfig)}

        def draw(name, ftype, valid):
            if rng.random() < 0.75:  # mostly plausible values, so that some are accepted
                if ftype == "bool":
                    return rng.random() < 0.5
                if name in valid:
                    return rng.choice(valid[name])
            return rng.choice(pool)

        def type_ok(value, ftype: str) -> bool:
            if ftype == "bool":
                return type(value) is bool
            if ftype == "int":
                return type(value) is int
            if ftype == "int | None":
                return value is None or type(value) is int
            if ftype == "str":
                return type(value) is str
            if ftype == "LoaderConfig":
                return type(value) is LoaderConfig
            return True

        stats = {"RunConfig": [0, 0, 0, []], "LoaderConfig": [0, 0, 0, []]}
        started = time.monotonic()
        for i in range(n):
            loader_kwargs = {k: draw(k, t, valid_loader) for k, t in loader_fields.items()
                             if rng.random() < 0.6}
            cls, kwargs, ftypes = LoaderConfig, loader_kwargs, loader_fields
            if i % 2 == 0:
                kwargs = {k: draw(k, t, valid_run) for k, t in run_fields.items()
                          if k == "model" or rng.random() < 0.5}
                if kwargs.get("loader", "absent") is None or rng.random() < 0.3:
                    try:
                        kwargs["loader"] = LoaderConfig(**loader_kwargs)
                    except ValueError:
                        kwargs["loader"] = LoaderConfig()
                cls, ftypes = RunConfig, run_fields
            s = stats[cls.__name__]
            s[0] += 1
            try:
                with warnings_off():
                    cfg = cls(**kwargs)
            except ValueError:
                s[1] += 1  # rejected as it should be
                continue
            except Exception as err:  # noqa: BLE001
                s[3].append(f"{cls.__name__}({_short(kwargs)}) raised "
                            f"{type(err).__name__}: {str(err)[:120]}")
                continue
            bad = [k for k, t in ftypes.items() if not type_ok(getattr(cfg, k), t)]
            if bad:
                shown = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in bad)
                s[3].append(f"{cls.__name__} accepted {shown}")
                continue
            try:
                hash(cfg)
                if cls is RunConfig:
                    cfg.id, cfg.global_batch  # noqa: B018 - derived values must work
            except Exception as err:  # noqa: BLE001
                s[3].append(f"accepted {cls.__name__}({_short(kwargs)}) fails later: "
                            f"{type(err).__name__}: {str(err)[:120]}")
                continue
            s[2] += 1  # accepted, declared types
        self.generated["configs"] = [stats, time.monotonic() - started]
        for name, (tried, rejected, accepted, failures) in stats.items():
            print(f"  {name}: {tried} tried, {rejected} rejected with ValueError, "
                  f"{accepted} accepted with the declared types, {len(failures)} failed")
            for line in failures[:5]:
                print(f"    FAIL {line}")

    # -- generated result files ---------------------------------------------------------------

    def generated_files(self, base: dict, n: int, seed: int) -> None:
        print(f"generated result files ({n})", flush=True)
        from gpubench.analysis.results import ResultsError, load_results
        from gpubench.report.summary import summary_markdown

        rng = random.Random(seed + 1)
        folder = self.tmp("genfiles")
        values = [None, True, False, 0, -1, 1, 3, 2**63, 2**64, 10**30, 0.0, -0.0, 1e-300,
                  1e300, 0.5, -2.5, float("nan"), float("inf"), float("-inf"), "", "x", "bert",
                  "fp32", [], [1, 2], [0.1, float("nan")], [-1], {}, {"a": None}]
        tried = passed = accepted = 0
        failures = []
        started = time.monotonic()
        for i in range(n):
            data = copy.deepcopy(base)
            for _ in range(rng.choice((1, 1, 2, 3))):
                bench = rng.choice(data["benchmarks"])
                where = rng.choice(("extra_info", "extra_info", "stats", "bench", "top"))
                if where == "top":
                    data[rng.choice(("benchmarks", "machine_info", "datetime", "version"))] = \
                        rng.choice(values)
                elif where == "bench" and isinstance(bench, dict):
                    bench[rng.choice(("name", "group", "stats", "extra_info"))] = \
                        rng.choice(values)
                elif isinstance(bench, dict) and isinstance(bench.get(where), dict):
                    target = bench[where]
                    key = rng.choice(list(target) + ["zzz_new"])
                    target[key] = rng.choice(values)
                if not isinstance(data.get("benchmarks"), list):
                    break
            path = folder / f"g{i:04d}.json"
            path.write_text(json.dumps(data))
            tried += 1
            try:
                with warnings_off():
                    df = load_results([path])
                    summary_markdown(df)
                accepted += 1
                passed += 1
            except ResultsError as err:
                if "\n" in str(err).strip() or path.name not in str(err):
                    failures.append(f"{path.name}: message not one line naming the file: "
                                    f"{str(err)[:120]}")
                else:
                    passed += 1
            except Exception as err:  # noqa: BLE001
                failures.append(f"{path.name}: {type(err).__name__}: {str(err)[:150]}")
            path.unlink()
        self.generated["files"] = [tried, passed, accepted, failures,
                                   time.monotonic() - started]
        print(f"  {tried} tried, {passed} passed ({accepted} accepted and summarized), "
              f"{len(failures)} failed")
        for line in failures[:5]:
            print(f"    FAIL {line}")

    # -- signals, leftovers, sockets, messages: real runs ---------------------------------------

    def _previous(self, folder: Path, name: str = "results") -> tuple[Path, dict]:
        """An earlier run's results in ``folder/name`` and their snapshot."""
        out = folder / name
        out.mkdir(exist_ok=True)
        (out / "benchmark.json").write_text(json.dumps(base_results()))
        (out / "speedup.png").write_bytes(b"old chart")
        return out, snapshot(out)

    def _signalled_run(self, name: str, sig: int, trigger: str, after_s: float, extra: list,
                       *, sockets: bool = False, charts: bool = False,
                       keeps_cases: bool = False, next_run: bool = False) -> None:
        """``gpubench run`` into a folder holding an earlier run, ``sig`` sent ``after_s``
        after ``trigger`` appears on its stdout. Pass: the exit status of the signal, one
        stderr line naming it (not for SIGKILL), the earlier results whole (in ``previous/``
        when the run set them aside, else in place), the finished cases the line names in
        ``<out>/benchmark.json`` (``keeps_cases``: at least one), no process or hidden
        temporary left (the lock excepted)."""
        folder = self.tmp("sig")
        out, before = self._previous(folder)
        env = {**ENV, "GPUBENCH_DATA_DIR": str(folder / "data")}
        argv = [*GPUBENCH, "run", "--profile", "smoke", "--models", "bert", "--out", str(out),
                *([] if charts else ["--no-charts"]), *extra]
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL)
        problems, listening = [], set()
        try:
            seen = b""
            deadline = time.monotonic() + 240
            while trigger.encode() not in seen and time.monotonic() < deadline:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
            if trigger.encode() not in seen:
                problems.append(f"never saw {trigger!r}: {seen[-300:]!r}")
            end = time.monotonic() + after_s
            while time.monotonic() < end:
                if sockets:
                    listening |= listening_sockets(proc.pid)
                time.sleep(0.2)
            if sockets:
                listening |= listening_sockets(proc.pid)
            proc.send_signal(sig)
            rest, err = proc.communicate(timeout=90)
            out_text = (seen + rest).decode(errors="replace")
            err = err.decode(errors="replace")
        except subprocess.TimeoutExpired:
            problems.append("did not exit within 90 s of the signal")
            out_text, err = "", ""
        left = wait_gone(proc.pid, 10)
        kill_session(proc.pid)
        proc.kill()
        proc.wait()
        p = Proc(argv, proc.returncode, out_text, err, left, time.monotonic() - start)
        one_line = sig != signal.SIGKILL
        names = [f"gpubench: interrupted ({signal.Signals(sig).name})"] if one_line else []
        problems += check(p, (128 + sig if one_line else -signal.SIGKILL,),
                          one_line=one_line, names=names)
        problems += earlier_results_whole(out, before)
        problems += kept_as_said(out, p.err, at_least=1 if keeps_cases else 0)
        if next_run:  # what SIGKILL left goes when the next run starts; the earlier run stays
            nxt = run_cmd(["run", "--profile", "smoke", "--models", "bert", "-k", "nosuchcase",
                           "--no-charts", "--out", str(out)], env=env)
            problems += [f"next run: {x}" for x in check(nxt, (1, 5))]
            problems += [f"after the next run: {x}" for x in earlier_results_whole(out, before)]
        hidden = hidden_entries(folder, LOCK_NAMES)
        if hidden:
            problems.append(f"hidden temporaries left: {hidden[:4]}")
        self.record("signals", name, problems, p.seconds)
        if sockets:
            exposed = sorted(f"{a}:{port}" for a, port in listening
                             if not ipaddress.ip_address(a).is_loopback)
            sock_problems = [f"listening beyond loopback: {exposed}"] if exposed else []
            if not listening:
                sock_problems.append("no listening socket seen (the DDP case was not running?)")
            self.record("network", f"listening sockets during a DDP case ({len(listening)} "
                        "seen)", sock_problems, p.seconds)

    def signals(self) -> None:
        print("signals (real runs; slow)", flush=True)
        start_up = ("gpubench: profile", 0.5, ["-k", "zerofill"])
        ddp = ("::test_step[", 4.0, ["-k", "ddp2", "--rounds", "1000"])
        self._signalled_run("SIGTERM to gpubench run at start-up", signal.SIGTERM, *start_up)
        self._signalled_run("SIGINT to gpubench run at start-up", signal.SIGINT, *start_up)
        self._signalled_run("SIGINT to gpubench run mid-DDP-case", signal.SIGINT, *ddp,
                            sockets=True)
        self._signalled_run("SIGTERM to gpubench run mid-DDP-case", signal.SIGTERM, *ddp)
        self._signalled_run("SIGKILL to gpubench run mid-DDP-case: no orphans; after the next "
                            "run the earlier results are whole", signal.SIGKILL, *ddp,
                            next_run=True)
        one_case = ["-k", "zerofill", "--rounds", "6", "--warmup", "0"]
        self._signalled_run("SIGTERM as pytest finishes (its clean-up): the case kept",
                            signal.SIGTERM, "passed, ", 0.0, one_case, keeps_cases=True)
        self._signalled_run("SIGTERM while summary and charts are written: the case kept in "
                            "out/benchmark.json", signal.SIGTERM, "passed, ", 1.5, one_case,
                            charts=True, keeps_cases=True)

    # -- results survive: real runs -----------------------------------------------------------

    SURVIVE = ["--profile", "smoke", "--models", "bert", "--groups",
               "precision,accumulation,optimizer,memory", "--no-charts"]
    """Seven in-process bert step cases (a second or two each), then the claims and harness
    checks (12 cases on this machine): long enough to stop in the middle."""
    SEVEN_STEP_CASES = {"bert-fp32", "bert-fp16", "bert-bf16", "bert-fp32-accum2-mb2",
                        "bert-fp32-adamw_fused", "bert-fp32-zerofill", "bert-fp32-ckpt"}
    ONE_CASE = ["--profile", "smoke", "--models", "bert", "-k", "bert-fp32-zerofill",
                "--no-charts"]
    FAILING = f"{ROOT / 'tests' / 'data' / 'failing_workload.py'}:workload"
    DERIVED = {"benchmark.json", "cases.jsonl", "summary.md", "memory.json", "advice.md"}

    def stopped_in_charts(self, out: Path, p: Proc, before: dict) -> list[str]:
        """What is wrong with ``out`` after a run stopped while drawing its charts: the cases
        not kept as its line says or not shown by gpubench summary, a chart or report
        half-written, a hidden file left, the earlier results not whole."""
        problems = kept_as_said(out, p.err, at_least=1)
        problems += self.summary_shows_journal(out / "benchmark.json")
        partial = sorted(q.name for q in out.iterdir() if q.name not in self.DERIVED
                         and q.suffix in (".png", ".svg", ".md", ".html"))
        if partial:
            problems.append(f"charts or report half-written: {partial[:4]}")
        hidden = hidden_entries(out, LOCK_NAMES)
        if hidden:
            problems.append(f"hidden files left: {hidden[:4]}")
        return problems + earlier_results_whole(out, before)
    """What ``gpubench run`` writes before the charts."""

    def _env(self) -> dict:
        return {**ENV, "GPUBENCH_DATA_DIR": str(self.work / "survive-data")}

    def mount_tmpfs(self, where: Path, size: str) -> str | None:
        """Mount a tmpfs of ``size`` on ``where`` (unmounted when the campaign ends); why it
        could not be mounted, or None."""
        where.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                   str(where)], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as err:
            return str(err)
        if done.returncode != 0:
            return done.stderr.strip() or f"mount exited {done.returncode}"
        self.mounts.append(where)
        return None

    def unmount_all(self) -> None:
        for where in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        self.mounts.clear()

    def skip(self, category: str, name: str, why: str) -> None:
        self.notes.append(f"[{category}] {name}: skipped: {why}")
        print(f"  skip [{category}] {name}: {why}", flush=True)

    def summary_shows_journal(self, json_path: Path) -> list[str]:
        """``json_path`` is valid pytest-benchmark JSON holding every case the journal beside
        it lists as passed (at most one more: the file is written before the journal line),
        and ``gpubench summary json_path`` shows each of them (the claims, which it does not
        tabulate, in the file only)."""
        passed = journal_passed(journal_of(json_path))
        records, why = result_records(json_path)
        if records is None:
            return [why]
        problems = []
        if not passed:
            problems.append(f"{journal_of(json_path).name} lists no passed case")
        in_file = {r.get("fullname") for r in records}
        missing = [n.split("::")[-1] for n, r in passed.items()
                   if r.get("fullname") not in in_file]
        if missing:
            problems.append(f"journal's cases not in {json_path.name}: {missing[:3]}")
        if len(records) > len(passed) + 1:
            problems.append(f"{json_path.name} holds {len(records)} records, the journal "
                            f"{len(passed)}")
        p = run_cmd(["summary", str(json_path)], env=self._env())
        problems += [f"gpubench summary: {x}" for x in check(p, (0,))]
        hidden = [cid for r in passed.values()
                  if (cid := (r.get("extra_info") or {}).get("case_id"))
                  and (r.get("extra_info") or {}).get("kind") != "claim"
                  and f"| {cid} " not in p.out]
        if hidden:
            problems.append(f"gpubench summary does not show {hidden[:4]}")
        return problems

    def _sigkill_after_two(self, victim: str) -> None:
        folder = self.tmp("kill")
        out, before = self._previous(folder)
        run = Started([*GPUBENCH, "run", *self.SURVIVE, "--out", str(out)], folder, self._env())
        problems = []
        why = run.wait_cases(out / "cases.jsonl", 2)
        child = None if why else pytest_child(run.pid, run.pid)
        if why:
            problems.append(why)
        elif child is None:
            problems.append("no pytest child found")
        else:
            if victim in ("child", "both"):
                os.kill(child, signal.SIGKILL)
            if victim in ("parent", "both"):
                os.kill(run.pid, signal.SIGKILL)
        p = run.finish()
        if victim == "child":  # the parent lives on: one line, then the summary of what finished
            records = result_records(out / "benchmark.json")[0] or []
            line = (f"gpubench: the benchmark process was killed by SIGKILL (out of memory?); "
                    f"{len(records)} finished case(s) kept in {out / 'benchmark.json'}")
            problems += check(p, (1,), names=[line])
            if not (out / "summary.md").is_file():
                problems.append("no summary.md of the finished cases")
        else:
            problems += check(p, (-signal.SIGKILL,))
        problems += self.summary_shows_journal(out / "benchmark.json")
        if len(journal_passed(out / "cases.jsonl")) < 2:
            problems.append("fewer than 2 cases kept")
        hidden = hidden_entries(out, LOCK_NAMES)
        if hidden:
            problems.append(f"hidden files left: {hidden[:4]}")
        problems += earlier_results_whole(out, before)
        what = {"child": "the pytest child", "parent": "gpubench run",
                "both": "gpubench run and its pytest child"}[victim]
        self.record("results survive", f"SIGKILL of {what} after 2 cases: gpubench summary "
                    "shows every journaled case, no process or hidden file left", problems,
                    p.seconds)

    def _ctrl_c(self, presses: int) -> None:
        folder = self.tmp("ctrlc")
        out, before = self._previous(folder)
        argv = ["run", *self.SURVIVE, "--out", str(out)]
        run = Started([*GPUBENCH, *argv], folder, self._env())
        problems = []
        why = run.wait_cases(out / "cases.jsonl", 2)
        if why:
            problems.append(why)
        else:
            for _ in range(presses):  # a terminal's Ctrl-C: SIGINT to the foreground group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.pid, signal.SIGINT)
                time.sleep(0.3)
        p = run.finish()
        records = result_records(out / "benchmark.json")[0] or []
        line = (f"gpubench: interrupted (SIGINT) while running the cases; {len(records)} "
                f"finished case(s) kept in {out}/benchmark.json (the same command with "
                "--resume runs the rest)")
        problems += check(p, (130,), one_line=True, names=[line])
        if len(records) < 2:
            problems.append(f"{len(records)} case(s) kept, expected >= 2")
        problems += self.summary_shows_journal(out / "benchmark.json")
        problems += earlier_results_whole(out, before)
        hidden = hidden_entries(out, LOCK_NAMES)
        if hidden:
            problems.append(f"hidden files left: {hidden[:4]}")
        kept = journal_passed(out / "cases.jsonl")
        self.record("results survive", f"Ctrl-C {'twice' if presses == 2 else 'once'} "
                    "(SIGINT to the process group) after 2 cases: exit 130, one line naming "
                    "the kept cases", problems, p.seconds)
        # --resume with the same options: only the rest is measured
        r = run_cmd([*argv, "--resume"], env=self._env(), timeout=400)
        problems = check(r, (0,))
        if f"resuming: {len(kept)} finished case(s)" not in r.out:
            problems.append(f"does not say it resumes {len(kept)} finished case(s)")
        cases = journal_cases(out / "cases.jsonl")
        nodeids = [e.get("nodeid") for e in cases]
        twice = sorted({n.split("::")[-1] for n in nodeids if nodeids.count(n) > 1})
        if twice:
            problems.append(f"measured twice: {twice[:4]}")
        failed = [e.get("nodeid", "?").split("::")[-1] for e in cases
                  if e.get("outcome") == "failed"]  # skipped: CUDA-only cases on the CPU
        if failed:
            problems.append(f"failed: {failed[:4]}")
        after = journal_passed(out / "cases.jsonl")
        if not set(kept) <= set(after):
            problems.append("cases kept before the resume are gone")
        ids = {(r.get("extra_info") or {}).get("case_id") for r in after.values()}
        if not self.SEVEN_STEP_CASES <= ids:
            problems.append(f"missing after the resume: {sorted(self.SEVEN_STEP_CASES - ids)}")
        problems += self.summary_shows_journal(out / "benchmark.json")
        times = "twice" if presses == 2 else "once"
        self.record("results survive", f"--resume after Ctrl-C {times}: exit 0, measures only "
                    "the rest (no case twice)", problems, r.seconds)

    def _sigterm_in_charts(self) -> None:
        folder = self.tmp("charts")
        out, before = self._previous(folder)
        argv = [*GPUBENCH, "run", "--profile", "smoke", "--models", "bert", "--groups",
                "precision", "--out", str(out)]
        run = Started(argv, folder, self._env())
        problems = []
        why = run.wait_for(lambda: (out / "advice.md").exists(), 300)  # charts come next
        if why:
            problems.append(f"advice.md: {why}")
        else:
            sizes = {p.relative_to(out): p.stat().st_size for p in out.rglob("*")
                     if p.is_file()}
            os.kill(run.pid, signal.SIGTERM)
            self.before_charts = sizes
        p = run.finish()
        records = result_records(out / "benchmark.json")[0] or []
        line = (f"gpubench: interrupted (SIGTERM) while writing the summary and charts; the "
                f"{len(records)} finished case(s) are in {out}/benchmark.json")
        problems += check(p, (143,), one_line=True, names=[line])
        problems += self.stopped_in_charts(out, p, before)
        self.record("results survive", "SIGTERM while the charts are drawn: the finished "
                    "cases stay in out/benchmark.json, one line, no chart half-written",
                    problems, p.seconds)

    def _other_filesystem(self, symlink: bool) -> None:
        folder = self.tmp("tmpfs")
        disk = folder / "disk"
        name = (f"--out {'a symlink to a tmpfs' if symlink else 'a tmpfs mount point'}: "
                "exit 0, results there, the earlier run in previous/")
        why = self.mount_tmpfs(disk, "64m")
        if why:
            self.skip("results survive", name, f"cannot mount a tmpfs: {why}")
            return
        out = folder / "link" if symlink else disk
        if symlink:
            out.symlink_to(disk)
        _, before = self._previous(disk, ".")
        p = run_cmd(["run", *self.ONE_CASE, "--out", str(out)], env=self._env(), timeout=300)
        problems = check(p, (0,))
        records, why = result_records(disk / "benchmark.json")
        if records is None or len(records) != 1:
            problems.append(why or f"{len(records)} records, expected 1")
        if not (disk / "summary.md").is_file():
            problems.append("no summary.md")
        problems += earlier_results_whole(disk, before)
        if out.is_symlink() != symlink:
            problems.append("the symlink was replaced" if symlink else "became a symlink")
        hidden = hidden_entries(disk, LOCK_NAMES)
        if hidden:
            problems.append(f"hidden files left: {hidden[:4]}")
        self.record("results survive", name, problems, p.seconds)

    def _full_during_cases(self) -> None:
        folder = self.tmp("full")
        out = folder / "small"
        name = ("a full tmpfs (48k) during the cases: exit 1, first line 'cannot write <file>: "
                "No space left on device', benchmark.json valid with the cases written before")
        why = self.mount_tmpfs(out, "48k")
        if why:
            self.skip("results survive", name, f"cannot mount a tmpfs: {why}")
            return
        p = run_cmd(["run", *self.SURVIVE, "--out", str(out)], env=self._env(), timeout=300)
        problems = check(p, (1,))
        lines = stderr_lines(p.err)
        first = lines[0] if lines else ""
        if not (first.startswith(f"gpubench: cannot write {out}/")
                and ": No space left on device; " in first):
            problems.append(f"first stderr line: {first[:160]!r}")
        records, why = result_records(out / "benchmark.json")
        if records is None:
            problems.append(why)
        else:
            said = {int(n) for n in KEPT.findall(p.err)}
            if said != {len(records)}:
                problems.append(f"stderr says {sorted(said)} kept, the file holds "
                                f"{len(records)}")
            if not 1 <= len(records) < 12:
                problems.append(f"{len(records)} records (expected some, not all)")
        stray = [q for q in lines if not q.startswith("gpubench: ")]
        if stray:
            problems.append(f"{len(stray)} stderr lines not gpubench's: {stray[0][:100]!r}")
        hidden = hidden_entries(out, LOCK_NAMES)
        if hidden:
            problems.append(f"hidden files left: {hidden[:4]}")
        self.record("results survive", name, problems, p.seconds)

    def _full_during_charts(self) -> None:
        name = ("a tmpfs that fills while the charts are drawn: exit 1, one line, the cases "
                "kept, no chart half-written")
        sizes = getattr(self, "before_charts", None)
        if sizes:  # what the same run wrote before its charts, in 4 KiB pages, + a rewrite
            pages = sum(-(-s // 4096) for s in sizes.values())
            bench = -(-sizes.get(Path("benchmark.json"), 60_000) // 4096)
            kib = 4 * (pages + bench) + 96
        else:
            kib = 400
        tried = []
        for _attempt in range(3):
            folder = self.tmp("fullcharts")
            out = folder / "disk"
            why = self.mount_tmpfs(out, f"{kib}k")
            if why:
                self.skip("results survive", name, f"cannot mount a tmpfs: {why}")
                return
            _, before = self._previous(out, ".")
            p = run_cmd(["run", "--profile", "smoke", "--models", "bert", "--groups",
                         "precision", "--out", str(out)], env=self._env(), timeout=400)
            named = re.search(r"cannot write (\S+?): ", p.err)
            file = Path(named.group(1)) if named else None
            if p.rc == 0:
                tried.append(f"{kib}k: everything fit")
                kib = max(64, kib * 2 // 3)
                continue
            if file is not None and file.name in self.DERIVED:
                tried.append(f"{kib}k: full before the charts ({file.name})")
                kib += 128
                continue
            break
        else:
            self.record("results survive", name, [f"did not hit the charts phase: "
                                                   f"{'; '.join(tried)}"])
            return
        problems = check(p, (1,), one_line=True, names=["No space left on device"])
        if file is None or file.suffix not in (".png", ".svg", ".md", ".html"):
            problems.append(f"the line names no chart or report file: {p.err.strip()[:160]!r}")
        problems += self.stopped_in_charts(out, p, before)
        if tried and problems:
            problems.append(f"sizes tried before: {'; '.join(tried)}")
        self.record("results survive", f"{name} ({kib}k)", problems, p.seconds)

    def _report_full(self) -> None:
        folder = self.tmp("reportfull")
        out = folder / "disk"
        name = ("gpubench report FILE -o a full tmpfs: non-zero, one line, nothing new in the "
                "folder")
        why = self.mount_tmpfs(out, "48k")
        if why:
            self.skip("results survive", name, f"cannot mount a tmpfs: {why}")
            return
        src = folder / "r.json"
        src.write_text(json.dumps(base_results()))
        (out / "keep.txt").write_text("an earlier file\n")
        before = snapshot(out)
        p = run_cmd(["report", str(src), "-o", str(out)], env=self._env())
        problems = check(p, set(range(1, 126)), one_line=True,
                         names=["No space left on device"])
        after = snapshot(out)
        if after != before:
            problems.append(f"the -o folder changed: {sorted(set(after) ^ set(before))[:4]}")
        self.record("results survive", name, problems, p.seconds)

    def _all_failing(self) -> None:
        folder = self.tmp("allfail")
        out, before = self._previous(folder)
        p = run_cmd(["run", "--profile", "smoke", "--model", self.FAILING, "--groups",
                     "precision", "-k", "fp16 or bf16", "--no-charts", "--out", str(out)],
                    env=self._env(), timeout=300)
        problems = check(p, set(range(1, 126)))
        lines = stderr_lines(p.err)
        if not lines or len(lines) > 2 or any(not q.startswith("gpubench: ") for q in lines):
            problems.append(f"{len(lines)} stderr lines, expected one or two of gpubench's")
        elif "failed" not in lines[-1]:
            problems.append(f"last line does not say the cases failed: {lines[-1][:120]!r}")
        for bad in ("internal error", "benchmarks: empty", "not a "):
            if bad in p.err:
                problems.append(f"says {bad!r}")
        failed = [e for e in journal_cases(out / "cases.jsonl") if e.get("outcome") == "failed"]
        ids = sorted(e.get("case_id", "?") for e in failed)
        if ids != ["fails-amp-bf16", "fails-amp-fp16"]:
            problems.append(f"failures in cases.jsonl: {ids}")
        for e in failed:
            if "RuntimeError" not in str(e.get("reason")):
                problems.append(f"reason {str(e.get('reason'))[:80]!r}")
            if not (out / str(e.get("log"))).is_file():
                problems.append(f"no log {e.get('log')}")
        problems += earlier_results_whole(out, before)
        self.record("results survive", "every selected case failing: one line ending, exit "
                    "non-zero, the failures in cases.jsonl", problems, p.seconds)

    def _failing_among_passing(self) -> None:
        folder = self.tmp("somefail")
        out = folder / "out"
        p = run_cmd(["run", "--profile", "smoke", "--model", self.FAILING, "--groups",
                     "precision", "--no-charts", "--out", str(out)], env=self._env(),
                    timeout=300)
        problems = check(p, (1,))  # check: no traceback on stdout or stderr
        stray = [q for q in stderr_lines(p.err) if not q.startswith("gpubench: ")]
        if stray:
            problems.append(f"{len(stray)} stderr lines not gpubench's: {stray[0][:100]!r}")
        if "cannot run under autocast" in p.out.split("### Failed cases")[0]:
            problems.append("the failure's message on the terminal outside the summary table")
        summary = (out / "summary.md").read_text() if (out / "summary.md").is_file() else ""
        table = summary.split("### Failed cases", 1)[-1] if "### Failed cases" in summary else ""
        if not table:
            problems.append("summary.md has no '### Failed cases' table")
        for case in ("fails-amp-fp16", "fails-amp-bf16"):
            if f"| {case} |" not in table:
                problems.append(f"{case} not in the failed cases table")
            log = out / "logs" / f"{case}.log"
            text = log.read_text(errors="replace") if log.is_file() else ""
            if "raise RuntimeError" not in text or "failing_workload.py" not in text:
                problems.append(f"logs/{case}.log holds no traceback")
        advice = (out / "advice.md").read_text() if (out / "advice.md").is_file() else ""
        if "**case failed**" not in advice:
            problems.append("advice.md does not say **case failed**")
        records = result_records(out / "benchmark.json")[0] or []
        if not any((r.get("extra_info") or {}).get("case_id") == "fails-amp-fp32"
                   for r in records):
            problems.append("the passing fp32 case is not in benchmark.json")
        self.record("results survive", "a failing case among passing ones: no traceback on "
                    "the terminal, summary.md's failed cases, logs/<case>.log, advice 'case "
                    "failed'", problems, p.seconds)

    def _two_runs_at_once(self) -> None:
        folder = self.tmp("twice")
        out, before = self._previous(folder)
        argv = ["run", *self.ONE_CASE, "--out", str(out)]
        first = Started([*GPUBENCH, *argv], folder, self._env(), "first")
        lock = out / ".benchmark.json.lock"

        def holds() -> bool:
            with contextlib.suppress(OSError):
                return lock.read_text().strip() == str(first.pid)
            return False

        problems = []
        why = first.wait_for(holds, 120)
        second = None
        if why:
            problems.append(f"the first run's lock: {why}")
        else:
            second = run_cmd(argv, env=self._env())
            problems += [f"second: {x}" for x in check(second, (2,), one_line=True,
                                                       names=[f"pid {first.pid}", str(out)])]
            if first.proc.poll() is not None:
                problems.append("the first had ended before the second was refused")
        p = first.finish(300)
        problems += [f"first: {x}" for x in check(p, (0,))]
        records, why = result_records(out / "benchmark.json")
        if records is None or len(records) != 1:
            problems.append(f"first: {why or f'{len(records)} records, expected 1'}")
        problems += earlier_results_whole(out, before)
        if lock.exists():
            problems.append("lock left after both ended")
        self.record("results survive", "two runs into the same --out at once: the second "
                    "refused in one line naming the pid (exit 2), the first finishes",
                    problems, p.seconds + (second.seconds if second else 0))

    def _plain_pytest_killed(self) -> None:
        folder = self.tmp("plain")
        json_path = folder / "ci.json"
        cmd = [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
               "--gpubench-profile=smoke", "--gpubench-models=bert", "-k",
               "bert-fp32-zerofill or bert-bf16 or bert-fp16 or bert-fp32-ckpt",
               f"--benchmark-json={json_path}"]
        run = Started(cmd, folder, self._env())
        journal = journal_of(json_path)
        problems = []
        why = run.wait_cases(journal, 1)
        if why:
            problems.append(why)
        else:
            os.kill(run.pid, signal.SIGKILL)
        p = run.finish()
        problems += check(p, (-signal.SIGKILL,))
        records, why = result_records(json_path)
        if records is None:
            problems.append(why)
        elif not 1 <= len(records) < 4:
            problems.append(f"{len(records)} records in ci.json, expected 1 to 3")
        problems += self.summary_shows_journal(json_path)
        hidden = hidden_entries(folder, {".ci.json.lock"})
        if hidden:
            problems.append(f"hidden files left: {hidden[:4]}")
        self.record("results survive", "plain pytest --benchmark-json=F SIGKILLed after its "
                    "first case: F valid pytest-benchmark JSON with the finished cases",
                    problems, p.seconds)

    def results_survive(self) -> None:
        print("results survive (real runs; slow)", flush=True)
        for victim in ("child", "parent", "both"):
            self._sigkill_after_two(victim)
        for presses in (1, 2):
            self._ctrl_c(presses)
        self._sigterm_in_charts()
        self._full_during_charts()  # sized from what the run above wrote before its charts
        for symlink in (False, True):
            self._other_filesystem(symlink)
        self._full_during_cases()
        self._report_full()
        self._all_failing()
        self._failing_among_passing()
        self._two_runs_at_once()
        self._plain_pytest_killed()

    # -- workload faults, hangs and the rendezvous: real runs ----------------------------------

    WORKLOADS = '''"""Workloads of the fault campaign: a stray thread, a build or a batch that
raises, and images big enough that two loader workers need more shared memory than a small
/dev/shm."""

import threading
import time

import torch
from torch import nn

from gpubench import Workload


def _batch(n, g):
    return torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)


def stray_thread(profile="smoke"):
    """build_model leaves a non-daemon thread running (a user's poller)."""
    def build():
        threading.Thread(target=time.sleep, args=(600,), name="user-poller").start()
        return nn.Linear(4, 2)

    return Workload(name="stray", build_model=build, make_batch=_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


def raising_build(profile="smoke"):
    def build():
        raise RuntimeError("cannot allocate\\nthe embedding table")

    return Workload(name="badbuild", build_model=build, make_batch=_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


def raising_batch(profile="smoke"):
    def make_batch(n, g):
        raise KeyError("images")

    return Workload(name="badbatch", build_model=lambda: nn.Linear(4, 2),
                    make_batch=make_batch, micro_batch=4, loss_fn=nn.functional.cross_entropy)


def blocking_batch(profile="smoke"):
    """make_batch blocks for more samples than the validation's two."""
    def make_batch(n, g):
        if n > 2:
            threading.Event().wait()
        return _batch(n, g)

    return Workload(name="blockbatch", build_model=lambda: nn.Linear(4, 2),
                    make_batch=make_batch, micro_batch=4, loss_fn=nn.functional.cross_entropy)


def shm_images(profile="smoke"):
    """3 x 64 x 64 float32 images, 256 a batch: 12.6 MB a batch, (2 x 2 + 1) batches for two
    workers."""
    return Workload(name="shmimg", build_model=lambda: nn.Sequential(
                        nn.Flatten(1), nn.Linear(3 * 64 * 64, 2)),
                    make_batch=lambda n, g: (torch.randn(n, 3, 64, 64, generator=g),
                                             torch.randint(0, 2, (n,), generator=g)),
                    micro_batch=256, loss_fn=nn.functional.cross_entropy)
'''

    def _workloads(self) -> str:
        """The campaign's workload file (written once); specs are ``<file>:<factory>``."""
        path = self.work / "campaign_workloads.py"
        if not path.exists():
            path.write_text(self.WORKLOADS)
        return str(path)

    def workload_faults(self) -> None:
        print("workload faults, hangs, rendezvous (real runs)", flush=True)
        cat = "workload faults and hangs"
        spec = self._workloads() + ":"
        env = self._env()
        # a workload's stray non-daemon thread does not keep the run alive
        folder = self.tmp("stray")
        run = Started([*GPUBENCH, "run", "--profile", "smoke", "--model", spec + "stray_thread",
                       "-k", "stray-fp32-zerofill", "--no-charts", "--out", str(folder / "out")],
                      folder, env)
        stuck = []
        if run.wait_for(lambda: False, 120) == "not ready after 120 s":  # still running
            for pid in session_processes(run.pid):  # who is alive, and its threads
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    what = "pytest" if b"pytest" in argv else (
                        "gpubench run" if pid == run.pid else argv[0].decode()[-30:])
                    threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
                    stuck.append(f"{what} pid {pid} ({threads} threads)")
        p = run.finish(5)
        problems = check(p, (0,)) if not stuck else []
        if stuck:
            done = ("after writing its results" if (folder / "out" / "summary.md").is_file()
                    else "results not written")
            problems.append(f"still running after 120 s ({done}): {'; '.join(stuck)}")
        warned = [q for q in stderr_lines(p.err) if "non-daemon" in q and "'user-poller'" in q]
        if not warned:
            problems.append("no warning naming the 'user-poller' thread")
        self.record(cat, "gpubench run of a workload whose build_model leaves a non-daemon "
                    "thread: exits 0 within 120 s, the thread named in a warning", problems,
                    p.seconds)
        p = run_cmd(["benchmarks/test_training_step.py", "-q", "-p", "no:cacheprovider",
                     "--gpubench-profile=smoke", f"--gpubench-models={spec}stray_thread",
                     "-k", "stray-fp32-zerofill", "--benchmark-disable"],
                    prefix=[sys.executable, "-m", "pytest"], env=env, timeout=150)
        problems = check(p, (0,))
        warned = [q for q in stderr_lines(p.err) if "non-daemon" in q]
        if len(warned) != 1 or "'user-poller'" not in warned[0]:
            problems.append(f"{len(warned)} warnings naming a non-daemon thread")
        if "1 passed" not in p.out:
            problems.append("pytest does not say '1 passed'")
        if p.seconds > 60:
            problems.append(f"took {p.seconds:.0f} s")
        self.record(cat, "plain pytest of that workload: ends with pytest's status within 60 s, "
                    "one warning naming the thread", problems, p.seconds)
        # an in-process case whose make_batch blocks: bounded by --timeout
        folder = self.tmp("block")
        p = run_cmd(["case", "--model", spec + "blocking_batch", "--profile", "smoke",
                     "--timeout", "2", "-o", str(folder / "one.json")], env=env, timeout=120)
        hung = ("checking it (build_model, make_batch, one forward) did not finish within 2 s "
                "(hung?)")
        problems = check(p, (2,), one_line=True, names=["blocking_batch", hung])
        if (folder / "one.json").exists():
            problems.append("one.json written")
        if p.seconds > 40:
            problems.append(f"took {p.seconds:.0f} s")
        self.record(cat, "gpubench case of a workload whose make_batch blocks, --timeout 2: "
                    "the workload check (make_batch at micro_batch) stops it: one line naming "
                    "the workload and phase, exit 2, in time, nothing written", problems,
                    p.seconds)
        out = folder / "out"
        p = run_cmd(["run", "--profile", "smoke", "--model", spec + "blocking_batch", "-k",
                     "blockbatch-fp32-zerofill", "--timeout", "2", "--no-charts", "--out",
                     str(out)], env=env, timeout=180)
        problems = check(p, (2,), one_line=True, names=["blocking_batch", hung])
        if out.exists():
            problems.append(f"{out.name} created: {[q.name for q in out.iterdir()]}")
        if p.seconds > 40:
            problems.append(f"took {p.seconds:.0f} s")
        self.record(cat, "gpubench run of that workload, --timeout 2: stopped by the workload "
                    "check before any case, one line, exit 2, in time, nothing written",
                    problems, p.seconds)
        # gpubench report on a file without a model's FP32 baseline
        folder = self.tmp("nobase")
        try:
            data = json.loads((ROOT / "results" / "cpu" / "benchmark.json").read_text())
        except (OSError, ValueError) as err:
            data = None
            self.skip(cat, "gpubench report without a baseline", f"results/cpu: {err}")
        if data is not None:
            data["benchmarks"] = [b for b in data["benchmarks"]
                                  if b["extra_info"].get("model") == "resnet18"
                                  and b["extra_info"].get("group") == "accumulation"
                                  and not b["extra_info"].get("is_baseline")]
            src = folder / "partial.json"
            src.write_text(json.dumps(data))
            p = run_cmd(["report", str(src), "-o", str(folder / "report")], env=env)
            problems = check(p, (0,))
            if p.err.strip():
                problems.append(f"stderr: {p.err.strip()[:160]!r}")
            md = folder / "report" / "report.md"
            text = md.read_text() if md.is_file() else ""
            if "no fp32 baseline record of model resnet18 in partial.json" not in text:
                problems.append("report.md does not name the missing baseline")
            if "- accumulation: not drawn: no FP32 baseline record" not in text:
                problems.append("report.md does not say why the accumulation chart is missing")
            if not (folder / "report" / "report.html").is_file():
                problems.append("no report.html")
            self.record(cat, "gpubench report of resnet18's accumulation records without their "
                        "FP32 baseline: exit 0, says what is missing", problems, p.seconds)
        # a non-zero rank whose rendezvous cannot be reached
        import socket

        for what, listening, words in (("another service there", True,
                                        "accepted the connection but never answered"),
                                       ("nobody listening", False, "nothing listens there")):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                if listening:
                    sock.listen()
                port = sock.getsockname()[1]
                denv = {**env, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}
                p = run_cmd(["dist", "--model", "resnet18", "--profile", "smoke", "--device",
                             "cpu", "--timeout", "2", "--out", str(self.tmp("dist") / "o.json")],
                            env=denv, timeout=90)
            problems = check(p, (1,), one_line=True,
                             names=[f"gpubench dist: rank 1 could not join the rendezvous at "
                                    f"127.0.0.1:{port} within 2 s:", words])
            if p.seconds > 40:
                problems.append(f"took {p.seconds:.0f} s")
            self.record(cat, f"gpubench dist rank 1, MASTER_PORT {what}: one line naming the "
                        "address within --timeout, exit 1", problems, p.seconds)
        # a workload's own code raising: the documented one-line error, exit 2, nothing run
        for factory, message in (
                ("raising_build", "build_model() raised RuntimeError: cannot allocate the "
                                  "embedding table"),
                ("raising_batch", "make_batch(2, generator) raised KeyError: 'images'")):
            line = f"gpubench: workload {spec}{factory}: {message}"
            for command in (["run", "--no-charts"], ["list"], ["case"]):
                folder = self.tmp("wlerr")
                extra = {"run": ["--out", str(folder / "out")],
                         "case": ["-o", str(folder / "one.json")]}.get(command[0], [])
                p = run_cmd([*command, "--profile", "smoke", "--model", spec + factory, *extra],
                            env=env, timeout=120)
                problems = check(p, (2,), one_line=True, names=[line])
                if list(folder.iterdir()):
                    problems.append(f"wrote {[q.name for q in folder.iterdir()]}")
                self.record(cat, f"gpubench {command[0]} of a workload whose "
                            f"{factory.split('_')[1]} raises: one line, exit 2, nothing written",
                            problems, p.seconds)
        # checkpointing a model with no blocks: gpubench list says so; the case skips
        lstm = str(ROOT / "tests" / "data" / "lstm_workload.py") + ":workload"
        p = run_cmd(["list", "--profile", "smoke", "--model", lstm, "--groups", "memory"],
                    env=env)
        problems = check(p, (0,))
        rows = {q.split()[0]: q for q in p.out.splitlines() if q.strip()}
        if "skips here: activation checkpointing of lstm: no nn.ModuleList/nn.Sequential" \
                not in rows.get("lstm-fp32-ckpt", ""):
            problems.append(f"lstm-fp32-ckpt row: {rows.get('lstm-fp32-ckpt', '(none)')!r}")
        if "skips" in rows.get("lstm-fp32-zerofill", "skips"):
            problems.append("lstm-fp32-zerofill missing or skipping")
        self.record(cat, "gpubench list of an LSTM: its checkpointing case skips, with the "
                    "reason", problems, p.seconds)
        folder = self.tmp("lstm")
        p = run_cmd(["run", "--profile", "smoke", "--model", lstm, "--groups", "memory", "-k",
                     "ckpt", "--no-charts", "--out", str(folder / "out")], env=env, timeout=200)
        problems = check(p, (1, 5), one_line=True, names=["no case ran"])
        if "test_step[lstm-fp32-ckpt] SKIPPED" not in p.out:
            problems.append("lstm-fp32-ckpt not SKIPPED")
        self.record(cat, "gpubench run of the LSTM's checkpointing case: skipped, one line "
                    "(no case ran), no traceback", problems, p.seconds)
        # a small /dev/shm (Docker's default), in a mount namespace of its own
        shm = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh", *GPUBENCH]
        probe = run_cmd(["--version"], prefix=shm)
        if probe.rc != 0:
            self.skip(cat, "a 16 MiB /dev/shm", f"no private mount namespace: "
                      f"{probe.err.strip()[-160:] or probe.rc}")
            return
        p = run_cmd(["list", "--profile", "smoke", "--model", spec + "shm_images", "--groups",
                     "loader"], prefix=shm, env=env)
        problems = check(p, (0,))
        rows = {q.split()[0]: q for q in p.out.splitlines() if q.strip()}
        w2 = rows.get("shmimg-fp32-synthetic-w2", "")
        if "skips here: its loader needs about" not in w2 or "/dev/shm has" not in w2:
            problems.append(f"shmimg-fp32-synthetic-w2 row: {w2[:160]!r}")
        if "skips" in rows.get("shmimg-fp32-synthetic", "skips"):
            problems.append("shmimg-fp32-synthetic (no workers) missing or skipping")
        self.record(cat, "gpubench list under a 16 MiB /dev/shm: the loader cases with workers "
                    "skip, naming the need and /dev/shm", problems, p.seconds)
        folder = self.tmp("shm")
        p = run_cmd(["run", "--profile", "smoke", "--model", spec + "shm_images", "--groups",
                     "loader", "-k", "synthetic-w2", "--no-charts", "--out",
                     str(folder / "out")], prefix=shm, env=env, timeout=300)
        problems = check(p, (1, 5), one_line=True, names=["no case ran"])
        if "test_step[shmimg-fp32-synthetic-w2] SKIPPED" not in p.out:
            problems.append("shmimg-fp32-synthetic-w2 not SKIPPED")
        self.record(cat, "gpubench run of a loader case with workers under a 16 MiB /dev/shm: "
                    "skipped before it runs (no shared-memory traceback), one line", problems,
                    p.seconds)

    # -- one-line failures: every command ends in one line, in time, with valid files ----------

    ONE_LINE = "one-line failures"
    GRACE_S = 30.0
    """Seconds a command may take beyond its ``--timeout``: the Python start and gpubench's
    imports on a loaded 2-core machine (about 10 s) and the watchdog's grace (10 s)."""
    UNBOUNDED_S = 150.0
    """Where no ``--timeout`` is given: a failure must still be said within this."""

    def _fails_in_one_line(self, name: str, p: Proc, codes, folder: Path, *, names=(),
                           within: float | None = None, extra: list[str] = ()) -> None:
        """Record ``p`` against what every scenario of the category asserts: an exit status in
        ``codes`` and in the documented table (``gpubench.cli.failure.EXIT_CODES``), exactly one
        stderr line (none on a success) naming ``names``, no traceback, nothing left running,
        done ``within`` seconds, and every JSON file under ``folder`` strict."""
        from gpubench.cli.failure import EXIT_CODES

        problems = check(p, codes, names=names, quiet_or_one_line=True)
        if p.rc not in EXIT_CODES and p.rc in codes:
            problems.append(f"exit {p.rc} not in the documented table")
        limit = self.UNBOUNDED_S if within is None else within
        if p.seconds > limit:
            problems.append(f"took {p.seconds:.0f} s, over {limit:.0f} s")
        problems += strict_json_files(folder)
        self.record(self.ONE_LINE, name, [*extra, *problems], p.seconds)

    def _interrupt(self, argv: list[str], folder: Path, env: dict, ready: Callable[[], bool],
                   settle_s: float = 0.0, timeout: float = 240) -> tuple[Proc, str | None]:
        """Start ``gpubench ARGV``; once ``ready()``, and ``settle_s`` later, send SIGINT to its
        process group as a terminal's Ctrl-C does; the finished command and why it was never
        ready (None when it was)."""
        run = Started([*GPUBENCH, *argv], folder, env)
        why = run.wait_for(ready, timeout)
        if why is None:
            time.sleep(settle_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGINT)
        return run.finish(90), why

    def one_line_failures(self, valid: Path) -> None:
        print("one-line failures: every command fails in one line, in time, files strict",
              flush=True)
        faults = str(ROOT / "tests" / "data" / "fault_workloads.py") + ":"
        lstm = str(ROOT / "tests" / "data" / "lstm_workload.py") + ":workload"
        env = self._env()
        smoke = ["--profile", "smoke", "--device", "cpu"]
        grace = self.GRACE_S

        def case(model, folder, *more):
            return ["case", "--model", model, *smoke, *more, "-o", str(folder / "c.json")]

        def tune(model, folder, *more):
            return ["tune", "--model", model, *smoke, *more, "--out", str(folder / "t")]

        def run(model, folder, *more):
            return ["run", *smoke, "--model", model, "--no-charts", *more,
                    "--out", str(folder / "out")]

        # (name, argv, codes, names, within, env, prefix, folder): plain runs, two at a time
        rows = []

        def row(name, argv_of, codes, names=(), within=None, env_=None, prefix=None):
            """``argv_of`` and (where callable) ``names`` of the scenario's own folder."""
            folder = self.tmp("line")
            rows.append((name, argv_of(folder), codes, names(folder) if callable(names)
                         else names, within, env_ or env, prefix, folder))
            return folder

        row("gpubench case of fp16 on an LSTM on this CPU: one line naming the case, exit 1 "
            "or 3", lambda f: case(lstm, f, "--precision", "fp16", "--rounds", "2"), (0, 1, 3),
            ["lstm-fp16"])
        limit_kib = 6 * 2**20
        row(f"gpubench case whose step allocates 8 GiB under ulimit -v {limit_kib // 2**20} "
            "GiB: one line 'ran out of memory', exit 1",
            lambda f: case(faults + "allocates", f, "--rounds", "2"), (1,),
            ["allocates-fp32: ran out of memory", "traceback in"],
            prefix=["sh", "-c", f'ulimit -v {limit_kib} && exec "$@"', "sh", *GPUBENCH])
        row("gpubench case of a make_batch that ignores n: one line naming the contract, "
            "exit 2", lambda f: case(faults + "ignores_n", f), (2,),
            ["must return 4 samples", "ignore n"])
        row("gpubench tune whose baseline's make_batch ignores n: one line, exit 2",
            lambda f: tune(faults + "ignores_n", f), (2,), ["must return 4 samples"])
        row("gpubench tune whose baseline's step raises: one line naming the error, exit 1",
            lambda f: tune(faults + "step_fails", f), (1,),
            ["RuntimeError: mat1 and mat2 shapes cannot be multiplied"])
        row("gpubench case of a make_batch that returns one tensor: one line naming the "
            "(inputs, targets) contract, exit 2", lambda f: case(faults + "one_tensor", f),
            (2,), ["must return a pair (inputs, targets)"])
        for command, argv_of in (("case", lambda f: case(faults + "blocking", f,
                                                         "--timeout", "5")),
                                 ("run", lambda f: run(faults + "blocking", f,
                                                       "--timeout", "5"))):
            row(f"gpubench {command} --timeout 5 of a make_batch that blocks: one line 'did not "
                f"finish within 5 s', exit 2, within 5 s + {grace:.0f} s", argv_of, (2,),
                ["did not finish within 5 s"], within=5 + grace)
        for command, argv_of in (("case", lambda f: case(faults + "exits", f)),
                                 ("run", lambda f: run(faults + "exits", f)),
                                 ("tune", lambda f: tune(faults + "exits", f))):
            row(f"gpubench {command} of a factory calling sys.exit(0): one line, exit 2 (a "
                "workload breaking the contract) or 1, never 0", argv_of, (1, 2), ["sys.exit(0)"])
        for_tune = row("gpubench tune --time 0.001 (bert): a strict tune.json, no 'nan' printed",
                       lambda f: tune("bert", f, "--time", "0.001"), (0, 1, 2))
        trunc = row("gpubench tune --resume of a truncated tune.json: one line naming the "
                    "file, exit 2", lambda f: tune("bert", f, "--resume"), (2,),
                    lambda f: [str(f / "t" / "tune.json"), "not valid JSON"])
        (trunc / "t").mkdir()
        (trunc / "t" / "tune.json").write_text('{"identity": {"version"')
        locked = row("gpubench run into a folder whose lock path is a folder: one line naming "
                     "it, exit 2", lambda f: run(faults + "slow_in_autocast", f,
                                                  "-k", "zerofill"), (2,), ["is a folder"])
        (locked / "out").mkdir()
        (locked / "out" / ".benchmark.json.lock").mkdir()
        row("gpubench compare F F: exit 0, one line saying BASE and NEW are the same file",
            lambda f: ["compare", str(valid), str(valid)], (0,),
            ["BASE and NEW are the same file"])

        def one(r):
            return run_cmd(r[1], env=r[5], prefix=r[6], timeout=max(r[4] or 0, 240))

        with ThreadPoolExecutor(2) as pool:
            procs = list(pool.map(one, rows))
        for (name, _, codes, names, within, _, _, folder), p in zip(rows, procs, strict=True):
            extra = []
            if folder is for_tune:
                if re.search(r"\bnan(x|\b)", p.out, re.IGNORECASE):
                    extra.append("prints nan")
                if p.rc == 0 and not (folder / "t" / "tune.json").is_file():
                    extra.append("exit 0 without tune.json")
            if name.startswith("gpubench case of fp16") and p.rc == 0:
                self.skip(self.ONE_LINE, name, "this CPU trains an fp16 LSTM")
                continue
            if folder is trunc:  # the truncated file is the input, not a result
                (folder / "t" / "tune.json").unlink()
            self._fails_in_one_line(name, p, codes, folder, names=names, within=within,
                                    extra=extra)
        self._full_data_folder(case)
        self._interrupted_commands(faults, env, smoke)
        self._resumed_run_shares(faults, env, smoke)

    def _full_data_folder(self, case) -> None:
        folder = self.tmp("fulldata")
        name = ("gpubench case reading its JPEG files from a full data folder (tmpfs 256k): "
                "one line 'No space left on device', exit 1")
        why = self.mount_tmpfs(folder / "data", "256k")
        if why:
            self.skip(self.ONE_LINE, name, f"cannot mount a tmpfs: {why}")
            return
        p = run_cmd(case("resnet18", folder, "--dataset", "images-jpeg", "--rounds", "1",
                         "--data-dir", str(folder / "data")), env=self._env(), timeout=240)
        self._fails_in_one_line(name, p, (1,), folder, names=["No space left on device"])

    def _interrupted_commands(self, faults: str, env: dict, smoke: list[str]) -> None:
        """Ctrl-C (SIGINT to the process group) mid-command: exit 130, one line, what finished
        kept (strict JSON), no tune.json named that is not there."""
        folder = self.tmp("intcase")
        p, why = self._interrupt(
            ["case", "--model", faults + "slow_step", *smoke, "--rounds", "1000", "-o",
             str(folder / "c.json")], folder, env,
            lambda: "gpubench case:" in (folder / "cmd.stdout").read_text(), settle_s=3)
        extra = [why] if why else []
        if (folder / "c.json").exists():
            extra.append("c.json written")
        self._fails_in_one_line("Ctrl-C mid gpubench case: one line, exit 130", p, (130,),
                                folder, names=["interrupted (SIGINT)"], extra=extra)
        # parity: FP32 finished (the workload marks the first bf16 step), then Ctrl-C
        folder = self.tmp("intpar")
        mark = folder / "mark"
        p, why = self._interrupt(
            ["parity", "--model", faults + "slow_in_autocast", *smoke, "--techniques",
             "fp32,bf16", "--steps", "40", "--no-chart", "--out", str(folder / "p")], folder,
            {**env, "GPUBENCH_FAULT_MARK": str(mark)}, mark.exists, settle_s=1)
        extra = [why] if why else []
        report = read_strict(folder / "p" / "parity.json")
        trained = [r.get("technique") for r in report.get("techniques", [])] if isinstance(
            report, dict) else []
        if trained != ["fp32"] or "bf16" not in (report or {}).get("left_out", {}):
            extra.append(f"parity.json: trained {trained}, left out "
                         f"{list((report or {}).get('left_out', {}))}")
        self._fails_in_one_line("Ctrl-C mid gpubench parity after FP32 finished (in-process "
                                "bf16): one line, exit 130, parity.json keeps FP32", p, (130,),
                                folder, names=["interrupted (SIGINT)"], extra=extra)
        # parity: Ctrl-C while the DDP ranks start
        folder = self.tmp("intddp")
        holder: dict = {}

        def ranks_up() -> bool:
            run_pid = holder.get("pid")
            return bool(run_pid and rank_pids(run_pid))

        run = Started([*GPUBENCH, "parity", "--model", faults + "slow_in_autocast", *smoke,
                       "--techniques", "fp32,ddp2", "--steps", "4", "--no-chart", "--out",
                       str(folder / "p")], folder, env)
        holder["pid"] = run.pid
        why = run.wait_for(ranks_up, 240)
        if why is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGINT)
        p = run.finish(90)
        extra = [why] if why else []
        report = read_strict(folder / "p" / "parity.json")
        if not isinstance(report, dict) or "ddp2" not in report.get("left_out", {}):
            extra.append("parity.json does not keep FP32 with ddp2 left out")
        self._fails_in_one_line("Ctrl-C while gpubench parity starts its DDP ranks: one line, "
                                "exit 130, parity.json keeps FP32, no rank left", p, (130,),
                                folder, names=["interrupted (SIGINT)"], extra=extra)
        # memory: the fp32 frontier finished, Ctrl-C in bf16's
        folder = self.tmp("intmem")
        mark = folder / "mark"
        p, why = self._interrupt(
            ["memory", "--model", faults + "slow_in_autocast", *smoke, "--techniques",
             "fp32,bf16", "--budget", "8G", "--max-batch", "16", "--no-leaks", "--no-hygiene",
             "--out", str(folder / "m")], folder, {**env, "GPUBENCH_FAULT_MARK": str(mark)},
            mark.exists, settle_s=1)
        extra = [why] if why else []
        report = read_strict(folder / "m" / "memory.json")
        searched = [f.get("technique") for f in report.get("frontier", [])] if isinstance(
            report, dict) else []
        if searched != ["fp32"] or not report.get("interrupted"):
            extra.append(f"memory.json: frontier of {searched}")
        self._fails_in_one_line("Ctrl-C mid gpubench memory after the fp32 frontier: one line, "
                                "exit 130, memory.json keeps it", p, (130,), folder,
                                names=["interrupted (SIGINT)"], extra=extra)
        # tune: Ctrl-C during the baseline's diagnosis names no tune.json that is not there
        folder = self.tmp("inttune")
        out = folder / "t"
        p, why = self._interrupt(
            ["tune", "--model", faults + "slow_step", *smoke, "--out", str(out)], folder, env,
            lambda: bool((folder / "cmd.stdout").read_text().strip()), settle_s=2)
        extra = [why] if why else []
        named = f"{out}/tune.json" in p.err
        if named and not (out / "tune.json").is_file():
            extra.append("names a tune.json that was not written")
        if not named and "no tune.json was written" not in p.err:
            extra.append("neither names tune.json nor says none was written")
        self._fails_in_one_line("Ctrl-C during gpubench tune's baseline: one line, exit 130, "
                                "--resume suggested only with a tune.json", p, (130,), folder,
                                names=["interrupted (SIGINT)"], extra=extra)

    def _resumed_run_shares(self, faults: str, env: dict, smoke: list[str]) -> None:
        folder = self.tmp("resshare")
        out = folder / "out"
        argv = ["run", *smoke, "--model", faults + "slow_step", "--groups", "memory,optimizer",
                "--no-charts", "--out", str(out)]
        p, why = self._interrupt(argv, folder, env,
                                 lambda: len(journal_cases(out / "cases.jsonl")) >= 1)
        extra = [why] if why else []
        extra += check(p, (130,))
        r = run_cmd([*argv, "--resume"], env=env, timeout=400)
        over = [line.strip() for line in r.out.splitlines() if "rounds" in line
                and any(float(x) > 100 for x in re.findall(r"(\d+(?:\.\d+)?)%", line))]
        if over:
            extra.append(f"a share over 100%: {over[0][:120]!r}")
        self._fails_in_one_line("gpubench run --resume after Ctrl-C: no share over 100% "
                                "printed, exit 0, results strict", r, (0,), folder,
                                extra=extra, within=400)

    def rank_faults(self) -> None:
        print("rank faults and messages (real runs; slow)", flush=True)
        for sig, words in ((signal.SIGKILL, ["rank 1 ", "SIGKILL"]),
                           (signal.SIGSTOP, ["rank(s) 1 ", "hung"])):
            folder = self.tmp("rank")
            argv = [*GPUBENCH, "case", "--model", "bert", "--profile", "smoke", "--parallel",
                    "ddp", "--world-size", "2", "--rounds", "1000", "--timeout", "8",
                    "-o", str(folder / "ddp.json")]
            start = time.monotonic()
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={**ENV, "GPUBENCH_DATA_DIR": str(folder / "data")},
                                    cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL)
            problems = []
            ranks = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                ranks = rank_pids(proc.pid)
                if len(ranks) == 2 and all(established(r) >= 2 for r in ranks):
                    break  # both joined the process group: store and peer connections
                time.sleep(0.3)
            time.sleep(4)  # the ranks are in their training check or rounds, or still building
            if len(ranks) == 2:
                os.kill(max(ranks), sig)  # spawned in rank order: the higher pid is rank 1
            else:
                problems.append(f"ranks not found: {ranks}")
            # A rank stopped while it still builds (a loaded machine) is named when the start's
            # own bound runs out (START_TIMEOUT_S; the build waits for the slowest rank's start
            # that long), not --timeout's 8 s: "rank(s) 1 did not start ... hung?".
            from gpubench.launchers.workers import START_TIMEOUT_S

            within_s = START_TIMEOUT_S + 60
            try:
                out, err = proc.communicate(timeout=within_s)
            except subprocess.TimeoutExpired:
                problems.append(f"gpubench case did not end within {within_s:g} s")
                kill_session(proc.pid)
                out, err = proc.communicate()
            left = wait_gone(proc.pid, 10)
            kill_session(proc.pid)
            p = Proc(argv, proc.returncode, out.decode(errors="replace"),
                     err.decode(errors="replace"), left, time.monotonic() - start)
            problems += check(p, (1, 2, 3, 4), names=words)
            if "code None" in p.err:
                problems.append("says 'code None'")
            what = "killed (SIGKILL)" if sig == signal.SIGKILL else "stopped (SIGSTOP: hangs)"
            self.record("messages", f"DDP rank 1 {what} mid-case: named, status, no orphans",
                        problems, p.seconds)

    def cudaless(self) -> None:
        print("CUDA-less machine", flush=True)
        import torch

        if torch.cuda.is_available():
            self.record("messages", "CUDA-less run (skipped: CUDA present)", [])
            return
        folder = self.tmp("nocuda")
        out, before = self._previous(folder)
        p = run_cmd(["run", "--device", "cuda", "--profile", "smoke", "--models", "bert",
                     "-k", "zerofill", "--no-charts", "--out", str(out)],
                    env={**ENV, "GPUBENCH_DATA_DIR": str(folder / "data")})
        problems = check(p, (1, 2, 3), one_line=True, names=["CUDA"])
        if "pytest exit code" in p.err:
            problems.append("reports a pytest exit code")
        if snapshot(out) != before:
            problems.append("previous results changed")
        self.record("messages", "gpubench run --device cuda without CUDA", problems, p.seconds)
        p = run_cmd(["case", "--device", "cuda", "--model", "bert", "--profile", "smoke",
                     "-o", str(folder / "c.json")])
        self.record("messages", "gpubench case --device cuda without CUDA",
                    check(p, (2, 3), one_line=True, names=["CUDA"]), p.seconds)

    def leftovers(self) -> None:
        print("leftovers (dataset generation killed; file permissions)", flush=True)
        folder = self.tmp("left")
        data = folder / "data"
        data.mkdir()
        code = ("import sys; from pathlib import Path; "
                "from gpubench.workloads.datasets import ensure_image_folder; "
                "ensure_image_folder(Path(sys.argv[1]), 'images-jpeg', 20000, 64, 10, processes=2)")
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", code, str(data)], env=ENV, cwd=ROOT,
                                start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        problems = []
        partial = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            partial = [p for p in data.iterdir() if p.name.startswith(".") and p.is_dir()]
            if partial and sum(1 for _ in partial[0].iterdir()) > 20:
                break
            time.sleep(0.2)
        if not partial:
            problems.append(f"no partial folder seen (rc {proc.poll()}, "
                            f"{proc.stderr.read().decode()[-200:] if proc.poll() else ''})")
        with contextlib.suppress(ProcessLookupError):  # the generator only: its pool follows
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = wait_gone(proc.pid, 10)
        kill_session(proc.pid)
        if left:
            problems.append(f"generation workers outlived the killed generator: {left}")
        out = folder / "out"
        p = run_cmd(["run", "--profile", "smoke", "--models", "bert", "-k", "nosuchcase",
                     "--no-charts", "--out", str(out), "--data-dir", str(data)])
        problems += check(p, (1, 2, 4, 5), traceback_ok=False)
        still = [q.name for q in data.iterdir() if q.name.startswith(".")]
        if still:
            problems.append(f"partial dataset folder left after the next run started: {still}")
        self.record("leftovers", "kill during dataset generation; the next run cleans up",
                    problems, time.monotonic() - start)
        # permissions: result files follow the umask, not owner-only
        base = folder / "perm"
        base.mkdir()
        src = base / "r.json"
        src.write_text(json.dumps(base_results()))
        old = os.umask(0o022)
        try:
            p1 = run_cmd(["export", str(src), "--github-json", str(base / "gh")])
            p2 = run_cmd(["compare", str(src), str(src), "--markdown", str(base / "cmp.md")])
            p3 = run_cmd(["advise", "--results", str(src), "--out", str(base / "adv")])
        finally:
            os.umask(old)
        problems = check(p1, (0,)) + check(p2, (0,)) + check(p3, (0,))
        modes = {str(f.relative_to(base)): oct(f.stat().st_mode & 0o777)
                 for f in base.rglob("*") if f.is_file() and f != src}
        closed = {k: v for k, v in modes.items() if int(v, 8) & 0o044 != 0o044}
        if closed:
            problems.append(f"owner-only under umask 022: {closed}")
        if not modes:
            problems.append("nothing written")
        self.record("leftovers", "written files follow the umask (022: world-readable)",
                    problems, p1.seconds + p2.seconds + p3.seconds)


class warnings_off(contextlib.AbstractContextManager):
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def _short(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}"[:40] for k, v in kwargs.items())[:200]


def rank_pids(sid: int) -> list[int]:
    """Rank processes of a session: spawned ones (``spawn_main`` on their command line, not the
    resource tracker) and the children of its fork server (a CPU case's ranks on Linux are
    forked from it, and carry its command line)."""
    cmdlines, parents = {}, {}
    for pid in session_processes(sid):
        try:
            cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        parents[pid] = int(stat[stat.rindex(")") + 2:].split()[1])
    servers = {pid for pid, line in cmdlines.items()  # not its children, which share the line
               if "forkserver" in line and "forkserver" not in cmdlines.get(parents.get(pid), "")}
    return sorted(pid for pid, line in cmdlines.items()
                  if ("spawn_main" in line and "resource_tracker" not in line)
                  or parents.get(pid) in servers)


def established(pid: int) -> int:
    """TCP connections of ``pid`` in state ESTABLISHED."""
    import psutil

    try:
        return sum(c.status == psutil.CONN_ESTABLISHED
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except (psutil.Error, OSError):
        return 0


def listening_sockets(sid: int) -> set[tuple[str, int]]:
    """(address, port) of TCP sockets listening in any process of session ``sid``."""
    import psutil

    found = set()
    for pid in session_processes(sid):
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.Error, OSError):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr:
                found.add((c.laddr.ip.split("%")[0], c.laddr.port))
    return found


# -- summary ------------------------------------------------------------------------------------


def summary_text(c: Campaign, wall_s: float, command: str) -> str:
    tried = len(c.outcomes)
    passed = sum(o.ok for o in c.outcomes)
    lines = [
        "# gpubench fault campaign",
        "",
        f"command: {command}",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wall time {wall_s:.0f} s",
        "",
        f"scenarios: {tried} tried, {passed} passed, {tried - passed} failed",
    ]
    if "configs" in c.generated:
        stats, secs = c.generated["configs"]
        g_tried = sum(s[0] for s in stats.values())
        g_passed = sum(s[1] + s[2] for s in stats.values())
        lines.append(f"generated configurations: {g_tried} tried, {g_passed} passed, "
                     f"{g_tried - g_passed} failed ("
                     + "; ".join(f"{k}: {s[0]} tried, {s[1]} rejected with ValueError, "
                                 f"{s[2]} accepted with the declared types"
                                 for k, s in stats.items()) + f"; {secs:.0f} s)")
    if "files" in c.generated:
        f_tried, f_passed, f_accepted, _, secs = c.generated["files"]
        lines.append(f"generated result files: {f_tried} tried, {f_passed} passed, "
                     f"{f_tried - f_passed} failed ({f_accepted} accepted and summarized, the "
                     f"rest refused with a one-line ResultsError naming the file; {secs:.0f} s)")
    lines += ["", "## per category", ""]
    cats: dict[str, list[Outcome]] = {}
    for o in c.outcomes:
        cats.setdefault(o.category, []).append(o)
    for cat, outs in cats.items():
        lines.append(f"- {cat}: {len(outs)} tried, {sum(o.ok for o in outs)} passed")
    failed = [o for o in c.outcomes if not o.ok]
    lines += ["", f"## failed scenarios ({len(failed)})", ""]
    lines += [f"- [{o.category}] {o.name}: {o.detail}" for o in failed] or ["none"]
    gen_failures = []
    if "configs" in c.generated:
        for stats in c.generated["configs"][0].values():
            gen_failures += stats[3]
    if "files" in c.generated:
        gen_failures += c.generated["files"][3]
    lines += ["", f"## skipped ({len(c.notes)})", ""]
    lines += [f"- {n}" for n in c.notes] or ["none"]
    lines += ["", f"## failed generated inputs ({len(gen_failures)})", ""]
    lines += [f"- {f}" for f in gen_failures[:50]] or ["none"]
    if len(gen_failures) > 50:
        lines.append(f"- ... and {len(gen_failures) - 50} more")
    lines += ["", "## every scenario", ""]
    lines += [f"- {'pass' if o.ok else 'FAIL'} [{o.category}] {o.name}" for o in c.outcomes]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "fault_campaign.txt"))
    parser.add_argument("--skip-slow", action="store_true",
                        help="skip the scenarios that run cases (signals, ranks, leftovers)")
    parser.add_argument("--configs", type=int, default=8000,
                        help="generated RunConfig/LoaderConfig constructions")
    parser.add_argument("--files", type=int, default=600, help="generated result files")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--only", default="", metavar="PART[,PART]",
                        help="run only these parts: arguments, paths, files, gate, types, "
                        "configs, genfiles, signals, ranks, cuda, leftovers, survive, workload "
                        "(workload faults and hangs), oneline (one-line failures)")
    parser.add_argument("--drive", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args.drive)
        return 0
    if not sys.platform.startswith("linux"):
        print("the campaign reads /proc: Linux only", file=sys.stderr)
        return 2
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background of a shell (``cmd &``): SIGINT is ignored, and an ignored
        # signal stays ignored in every command started from here, so that the scenarios'
        # Ctrl-C would reach commands deaf to it. A handler is reset to the default on exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    base = base_results()
    with tempfile.TemporaryDirectory(prefix="gpubench-campaign-") as tmp:
        work = Path(tmp)
        c = Campaign(work, args)
        valid = work / "valid.json"
        valid.write_text(json.dumps(base))
        parts = {
            "arguments": lambda: c.arguments(valid),
            "paths": lambda: c.output_paths(valid),
            "files": lambda: c.result_files(base),
            "gate": lambda: c.ci_gate(base),
            "types": c.types,
            "configs": lambda: c.generated_configs(args.configs, args.seed),
            "genfiles": lambda: c.generated_files(base, args.files, args.seed),
            "signals": c.signals,
            "ranks": c.rank_faults,
            "cuda": c.cudaless,
            "leftovers": c.leftovers,
            "survive": c.results_survive,
            "workload": c.workload_faults,
            "oneline": lambda: c.one_line_failures(valid),
        }
        slow = {"signals", "ranks", "leftovers", "cuda", "survive", "workload", "oneline"}
        only = {p for p in args.only.split(",") if p}
        if only - set(parts):
            print(f"--only: unknown part(s) {', '.join(sorted(only - set(parts)))}; the parts: "
                  f"{', '.join(parts)}", file=sys.stderr)
            return 2
        try:
            for name, part in parts.items():
                if (only and name not in only) or (args.skip_slow and name in slow):
                    continue
                t = time.monotonic()
                try:
                    part()
                except Exception:  # noqa: BLE001 - a campaign bug is a failed scenario
                    c.record("campaign", f"part {name} crashed",
                             [traceback.format_exc().strip().splitlines()[-1]])
                print(f"  [{name}: {time.monotonic() - t:.0f} s]", flush=True)
        finally:
            c.unmount_all()  # before the temporary folder that holds the mount points goes
        command = " ".join(["python", "scripts/fault_campaign.py", *sys.argv[1:]])
        text = summary_text(c, time.monotonic() - started, command)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    head = text.split("## every scenario")[0]
    print("\n" + head)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
