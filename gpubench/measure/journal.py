"""Results that survive: every finished case is on disk the moment it finishes.

pytest-benchmark writes ``--benchmark-json=F`` once, at the end of the session, so a killed
process (the out-of-memory killer's SIGKILL, a lost machine) used to lose every case. The
``Journal`` plugin (registered by ``benchmarks/conftest.py`` whenever ``--benchmark-json`` is
given, under ``gpubench run`` and plain ``pytest`` alike) writes, after each test:

- one line of the **journal**, ``cases.jsonl`` beside F when F is ``benchmark.json``, else
  ``<stem>.cases.jsonl`` (appended, flushed and fsynced): the first line describes the run (its
  key: profile, device, models and options, which ``--resume`` checks), every other line one
  test: a passed case with its whole pytest-benchmark record, a failed one with its one-line
  reason and its traceback's log file (``logs/<case>.log``, ``<stem>.logs/`` beside another F),
  or a skipped one with pytest's reason (the report lists them, grouped by reason);
- **F itself**, rewritten atomically: valid pytest-benchmark JSON with every record that has
  finished so far. pytest-benchmark's own write at the end is replaced by the same atomic write.

A kill at any moment therefore loses at most the case that was running; a journal line cut short
by the kill is ignored on reading. With ``--gpubench-resume`` the session appends to an existing
journal of the same run, and the cases it lists as passed are deselected.

One writer per F: the plugin holds an exclusive ``flock`` on ``.<F name>.lock`` beside F for the
whole session (``gpubench run`` holds it itself, for its whole run, and tells its pytest child so
through ``LOCK_ENV``); a second run into the same F is refused with one line.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpubench.util import atomic

SCHEMA = 1
"""Version of the journal's line format."""

LOCK_ENV = "GPUBENCH_LOCK_HELD"
"""Set by ``gpubench run`` for its pytest child: the lock file the parent holds for it."""


class JournalError(ValueError):
    """A journal that cannot be used: locked by another run, of another run, unreadable."""


def journal_path(json_path: str | os.PathLike) -> Path:
    """The journal beside the result file ``json_path``."""
    path = Path(json_path)
    return path.with_name("cases.jsonl" if path.name == "benchmark.json"
                          else f"{path.stem}.cases.jsonl")


def logs_dir(json_path: str | os.PathLike) -> Path:
    """The folder of the failed tests' tracebacks beside the result file ``json_path``."""
    path = Path(json_path)
    return path.with_name("logs" if path.name == "benchmark.json" else f"{path.stem}.logs")


def lock_path(json_path: str | os.PathLike) -> Path:
    path = Path(json_path)
    return path.with_name(f".{path.name}.lock")


class RunLock:
    """An exclusive, non-blocking ``flock`` of ``lock_path(json_path)``, released when the
    holder exits, however it exits (the kernel drops the lock with the file descriptor)."""

    def __init__(self, json_path: str | os.PathLike):
        self.path = lock_path(json_path)
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_dir() or self.path.is_symlink() and not self.path.exists():
            raise JournalError(f"the run lock {self.path} is a folder or a dangling link, not "
                               "a file; remove it (gpubench creates it) or write elsewhere")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as err:
            raise JournalError(f"cannot open the run lock {self.path}: "
                               f"{err.strerror or err}; write elsewhere") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise JournalError(
                f"another gpubench run (pid {holder}) is writing {self.path.parent}/; wait for "
                "it to finish or write elsewhere") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        """Unlock, and remove the lock file (while still holding it: a run starting now either
        sees the lock held, or creates a new file)."""
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


@dataclass
class JournalContents:
    """What a journal holds: the run's header and its tests, last outcome per test."""

    header: dict | None = None
    passed: dict[str, dict] = field(default_factory=dict)
    """nodeid -> the pytest-benchmark record, in the order they finished."""
    failed: dict[str, dict] = field(default_factory=dict)
    """nodeid -> the failure line (``case_id``, ``reason``, ``log``, ``phase``)."""
    skipped: dict[str, dict] = field(default_factory=dict)
    """nodeid -> the skip line (``case_id``, ``reason``, ``model``, ``group``): what the run did
    not measure, and why."""

    @property
    def records(self) -> list[dict]:
        return list(self.passed.values())


def read_journal(path: str | os.PathLike) -> JournalContents:
    """Parse a journal; a line cut short by a kill (or otherwise not JSON) is skipped. A test
    that failed and later passed (``--resume``) counts as passed, and the other way round."""
    contents = JournalContents()
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return contents
    except OSError as err:
        raise JournalError(f"{path}: cannot read ({err.strerror or err})") from None
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("type") == "run":
            contents.header = entry
        elif entry.get("type") == "case" and isinstance(entry.get("nodeid"), str):
            nodeid = entry["nodeid"]
            contents.passed.pop(nodeid, None)
            contents.failed.pop(nodeid, None)
            contents.skipped.pop(nodeid, None)
            if entry.get("outcome") == "passed" and isinstance(entry.get("record"), dict):
                contents.passed[nodeid] = entry["record"]
            elif entry.get("outcome") == "failed":
                contents.failed[nodeid] = entry
            elif entry.get("outcome") == "skipped":
                contents.skipped[nodeid] = entry
    return contents


def failures_beside(files: Iterable[str | os.PathLike]) -> list[dict]:
    """The failed tests recorded in the journals beside result files (``case_id``, ``reason``,
    ``log``; ``model`` and ``group`` for a case), those that later passed left out."""
    failures = []
    for file in files:
        contents = read_journal(journal_path(file))
        failures += [{**f, "file": str(file)} for f in contents.failed.values()]
    return failures


def skipped_beside(files: Iterable[str | os.PathLike]) -> list[dict]:
    """The skipped tests recorded in the journals beside result files (``case_id``,
    ``reason``; ``model`` and ``group`` for a case), those that later ran left out."""
    skipped = []
    for file in files:
        contents = read_journal(journal_path(file))
        skipped += [{**s, "file": str(file)} for s in contents.skipped.values()]
    return skipped


def key_mismatch(old: dict, new: dict) -> str | None:
    """How the run keys ``old`` (a journal's) and ``new`` differ, in words, or None."""
    diffs = [f"{k} {old.get(k)!r} there, {new.get(k)!r} now"
             for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(diffs) or None


def one_line(text: str, limit: int = 300) -> str:
    """The last meaningful line of an error text (an exception's message), shortened."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    picked = next((ln for ln in reversed(lines) if re.match(r"^[\w.]*(Error|Exception|"
                   r"Interrupt|Exit|Failed|Skipped)\b", ln)), lines[-1] if lines else "")
    picked = " ".join(picked.split())
    return picked if len(picked) <= limit else picked[:limit - 3] + "..."


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:150] or "test"


class Journal:
    """The pytest plugin (see the module docstring). ``run_key`` identifies the run for
    ``--resume``; ``case_info(item)`` gives a failed item's ``case_id``/``model``/``group``."""

    def __init__(self, config, json_path: str | os.PathLike, run_key: dict, *,
                 resume: bool = False, case_info=None):
        self.config = config
        self.json_path = Path(json_path)
        self.path = journal_path(self.json_path)
        self.logs = logs_dir(self.json_path)
        self.run_key = run_key
        self.resume = resume
        self.case_info = case_info or (lambda item: {})
        self.contents = JournalContents()
        self.lock: RunLock | None = None
        self._machine_info = None
        self._commit_info = None
        self.broken: str | None = None
        """Why the journal cannot be written any more (a full disk): the run stops."""

    # -- session ---------------------------------------------------------------------------

    def start(self) -> None:
        """Take the lock, then read (``resume``) or start the journal. ``JournalError`` when
        another run holds the lock or the journal is of another run."""
        held = os.environ.get(LOCK_ENV)
        if not held or Path(held) != lock_path(self.json_path):
            self.lock = RunLock(self.json_path).acquire()
        if self.resume:
            self.contents = read_journal(self.path)
            header = self.contents.header
            if header is None:
                raise JournalError(f"--resume: {self.path} holds no run to continue")
            diff = key_mismatch(header.get("key") or {}, self.run_key)
            if diff:
                raise JournalError(f"--resume: {self.path} is of another run ({diff}); "
                                   "run without --resume to start afresh")
            return
        header = {"type": "run", "schema": SCHEMA, "key": self.run_key, "pid": os.getpid(),
                  "started": datetime.datetime.now(datetime.UTC).isoformat()}
        atomic.write_text(self.path, json.dumps(header) + "\n")

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # -- pytest hooks ----------------------------------------------------------------------

    def pytest_collection_modifyitems(self, session, config, items):
        """With ``--resume``: the tests that passed in the journal are deselected."""
        if not self.contents.passed:
            return
        done = [item for item in items if item.nodeid in self.contents.passed]
        if done:
            items[:] = [item for item in items if item.nodeid not in self.contents.passed]
            config.hook.pytest_deselected(items=done)
            print(f"gpubench: resuming: {len(done)} finished case(s) in {self.path} are kept "
                  "and not run again", flush=True)

    def pytest_sessionstart(self, session):
        bs = getattr(self.config, "_benchmarksession", None)
        if bs is not None:
            bs.json = None  # written here, atomically, after each case and at the end

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        try:
            report = outcome.get_result()
        except BaseException:  # noqa: BLE001 - another plugin's error: pytest reports it
            return
        self.record_report(item, report, call)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.finish(session)  # before pytest-benchmark's own session end
        yield
        self.close()

    def record_report(self, item, report, call=None) -> None:
        """Journal the outcome of one phase of ``item`` (pytest's ``TestReport``; ``call``,
        its ``CallInfo``, gives the whole traceback whatever ``--tb`` says)."""
        if self.broken:
            return
        if report.when == "call" and report.passed:
            fixture = getattr(item, "funcargs", {}).get("benchmark")
            meta = getattr(fixture, "stats", None)
            if meta is None or getattr(fixture, "has_error", False) or not _has_rounds(meta):
                return
            record = json.loads(atomic.json_text(meta.as_dict(include_data=True)))
            # F first, then the journal: a record is never in the journal without being in F
            # (a kill between the two leaves F one case ahead; --resume reruns that case).
            if not self._write_json(item, {**self.contents.passed, item.nodeid: record}):
                return
            self.contents.passed[item.nodeid] = record
            self.contents.failed.pop(item.nodeid, None)
            self._append({"type": "case", "outcome": "passed", "nodeid": item.nodeid,
                          "record": record}, item)
        elif report.skipped and report.when in ("setup", "call"):
            info = self.case_info(item) or {}
            entry = {"type": "case", "outcome": "skipped", "nodeid": item.nodeid,
                     "reason": one_line(_skip_reason(report)),
                     **{"case_id": item.name, **info}}
            self._append(entry, item)
            self.contents.skipped[item.nodeid] = entry
        elif report.failed and report.when in ("setup", "call"):
            info = self.case_info(item) or {}
            name = info.get("case_id") or item.name
            log = self.logs / f"{_safe_name(name)}.log"
            entry = {"type": "case", "outcome": "failed", "nodeid": item.nodeid,
                     "phase": report.when, "reason": one_line(_crash_message(report)),
                     "log": str(log.relative_to(self.json_path.parent)), **info}
            try:
                atomic.write_text(log, f"{item.nodeid} failed ({report.when})\n\n"
                                  f"{_traceback(report, call)}\n")
            except OSError as err:
                self._broke(item, log, err)
                return
            self._append(entry, item)
            self.contents.failed[item.nodeid] = entry

    def finish(self, session) -> None:
        """Session end: pytest-benchmark's record of an interrupted test (no rounds) is
        dropped (its own end-of-session code fails on it). Each case's end wrote F already;
        only a resumed session that ran no case (all had finished) writes it here, should F
        be missing."""
        bs = getattr(self.config, "_benchmarksession", None)
        if bs is not None:
            bs.benchmarks[:] = [b for b in bs.benchmarks if _has_rounds(b)]
        if self.contents.passed and not self.broken and not self.json_path.exists():
            try:
                self._write_json(None)
            except OSError as err:
                print(f"gpubench: cannot write {self.json_path}: {err.strerror or err}",
                      file=sys.stderr)

    # -- writing ---------------------------------------------------------------------------

    def _append(self, entry: dict, item) -> None:
        line = atomic.json_text(entry) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            self._broke(item, self.path, err)

    def _write_json(self, item, passed: dict | None = None) -> bool:
        """Write F with the records of ``passed`` (default: those journaled); False (and the
        run stops) when it cannot be written, F then unchanged."""
        from pytest_benchmark.utils import safe_dumps

        passed = self.contents.passed if passed is None else passed

        if self._machine_info is None:
            bs = self.config._benchmarksession
            self._machine_info = bs.get_machine_info()
            hook = self.config.hook
            self._commit_info = hook.pytest_benchmark_generate_commit_info(config=self.config)
            hook.pytest_benchmark_update_commit_info(config=self.config,
                                                     commit_info=self._commit_info)
        output = self.config.hook.pytest_benchmark_generate_json(
            config=self.config, benchmarks=[], include_data=True,
            machine_info=self._machine_info, commit_info=self._commit_info)
        output["benchmarks"] = list(passed.values())
        try:
            atomic.write_text(self.json_path, safe_dumps(output, ensure_ascii=True, indent=4))
        except OSError as err:
            if item is None:
                raise
            self._broke(item, self.json_path, err)
            return False
        return True

    def _broke(self, item, path: Path, err: OSError) -> None:
        """A write failed (a full disk): say so in one line and stop the session after this
        test; what was written before stays whole."""
        self.broken = (f"cannot write {path}: {err.strerror or err}; the run stops "
                       f"({len(self.contents.passed)} finished case(s) kept in "
                       f"{self.json_path})")
        print(f"gpubench: {self.broken}", file=sys.stderr, flush=True)
        item.session.shouldstop = self.broken


def _has_rounds(meta) -> bool:
    stats = getattr(meta, "stats", None)
    return bool(getattr(stats, "data", None))


def _traceback(report, call) -> str:
    excinfo = getattr(call, "excinfo", None)
    if excinfo is not None:
        try:
            return str(excinfo.getrepr(style="long"))
        except Exception:  # noqa: BLE001 - fall back to pytest's own text
            pass
    return report.longreprtext


def _skip_reason(report) -> str:
    """The reason pytest gives for a skip (``longrepr``: path, line, "Skipped: reason")."""
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "skipped")


def _crash_message(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return crash.message
    return report.longreprtext or "failed"
