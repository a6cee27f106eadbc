"""``gpubench run`` under signals and bad folders: one line, exit 2 / 130 / 143, the earlier
results kept whole (in ``<out>/previous/``), the finished cases kept in ``<out>/``, no process
and no temporary left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from processes import kill_session, wait_gone  # the tests folder is on sys.path
from records import step_record

from gpubench.cli import main as cli
from gpubench.measure.journal import lock_path
from gpubench.util import atomic
from gpubench.util import signals as gsignals

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "--profile", "smoke", "--models", "bert", "-k", "zerofill", "--no-charts"]


def _bench(name: str, extra: dict | None = None) -> dict:
    bench = step_record(name, (0.009, 0.01, 0.012), group="bert-smoke-cpu", tflops=0.1)
    return bench if extra is None else {**bench, "extra_info": extra}


def _results(*benches) -> str:
    return json.dumps({"machine_info": {"node": "x"}, "benchmarks": list(benches),
                       "datetime": "2026-01-01T00:00:00", "version": "5.1.0"})


@pytest.fixture
def previous(tmp_path):
    """A results folder from an earlier run, and a snapshot of it."""
    out = tmp_path / "results"
    out.mkdir()
    (out / "benchmark.json").write_text(_results(_bench("old")))
    (out / "speedup.png").write_bytes(b"old chart")
    return out, {p.name: p.read_bytes() for p in out.iterdir()}


def _snapshot(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in out.iterdir()}


def _earlier_kept(out: Path, before: dict) -> bool:
    """The earlier run whole: in ``out/previous/`` once a case of the new run finished, else
    still in ``out`` (a run that produced nothing puts it back)."""
    previous = out / "previous"
    return _snapshot(previous if previous.is_dir() else out) == before


@pytest.fixture
def fake_pytest(monkeypatch, tmp_path):
    """Replace the pytest child: ``fake_pytest(json_text, code, signum)`` sets what it writes
    and returns; light summary and advice so the test exercises cmd_run only."""
    plan = {}

    def run(cmd, **kwargs):
        json_path = Path(next(a for a in cmd if a.startswith("--benchmark-json="))
                         .split("=", 1)[1])
        if plan.get("json") is not None:
            json_path.write_text(plan["json"])
        hygiene = [a.split("=", 1)[1] for a in cmd if a.startswith("--gpubench-hygiene=")]
        if plan.get("hygiene") is not None and hygiene:  # the child's hand-over of no_grad/del
            Path(hygiene[0]).write_text(json.dumps(plan["hygiene"]))
        plan["cmd"] = cmd
        return plan.get("code", 0), plan.get("signum")

    monkeypatch.setattr(gsignals, "run_forwarding_signals", run)
    monkeypatch.setattr(cli, "summary_markdown", lambda df: "summary")
    import gpubench.analysis.advice

    monkeypatch.setattr(gpubench.analysis.advice, "advice_markdown", lambda df, *a, **k: "advice")
    monkeypatch.setenv("GPUBENCH_DATA_DIR", str(tmp_path / "data"))

    def configure(json_text=None, code=0, signum=None, hygiene=None):
        plan.update(json=json_text, code=code, signum=signum, hygiene=hygiene)
        return plan

    return configure


def _no_hidden_left(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


# -- folders validated before anything runs ---------------------------------------------------

def _bad_out_cases(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    unwritable = Path("/proc/gpubench-results") if os.geteuid() == 0 else tmp_path / "ro" / "out"
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
    return {"is a file": (a_file, "is a file"),
            "under a file": (a_file / "sub", "lies under"),
            "not writable": (unwritable, "is not writable")}


@pytest.mark.parametrize("case", ["is a file", "under a file", "not writable"])
def test_unusable_out_is_one_line_exit_2_before_anything_runs(tmp_path, fake_pytest, capsys,
                                                               case):
    plan = fake_pytest(_results(_bench("new")))
    out, expected = _bad_out_cases(tmp_path)[case]
    assert cli.main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpubench: --out {out} ") and expected in err, err
    assert len(err.splitlines()) == 1
    assert "cmd" not in plan  # pytest never started
    assert (tmp_path / "a-file").read_text() == "keep me"


def test_unusable_data_dir_is_one_line_exit_2(tmp_path, fake_pytest, capsys, previous):
    out, before = previous
    plan = fake_pytest(_results(_bench("new")))
    (tmp_path / "data-file").write_text("")
    code = cli.main([*RUN, "--out", str(out), "--data-dir", str(tmp_path / "data-file")])
    assert code == 2
    assert "gpubench: --data-dir" in capsys.readouterr().err
    assert "cmd" not in plan and _snapshot(out) == before


# -- interrupts -------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_keeps_the_earlier_results_and_the_finished_cases(
        fake_pytest, previous, capsys, sig):
    out, before = previous
    fake_pytest(_results(_bench("done")), code=2, signum=sig)
    assert cli.main([*RUN, "--out", str(out)]) == 128 + sig
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpubench: interrupted ({sig.name}) while running the cases; 1 finished "
                   f"case(s) kept in {out}/benchmark.json (the same command with --resume "
                   "runs the rest)"]
    assert _snapshot(out / "previous") == before
    kept = json.loads((out / "benchmark.json").read_text())
    assert [b["name"] for b in kept["benchmarks"]] == ["test_step[done]"]
    assert not _no_hidden_left(out.parent) and not _no_hidden_left(out)


def test_interrupt_while_writing_charts_keeps_the_finished_cases(
        fake_pytest, previous, capsys, monkeypatch):
    out, before = previous
    fake_pytest(_results(_bench("new")))
    import gpubench.report.page

    def killed_mid_charts(files, folder, labels=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here

    monkeypatch.setattr(gpubench.report.page, "write_report", killed_mid_charts)
    args = [a for a in RUN if a != "--no-charts"]
    assert cli.main([*args, "--out", str(out)]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpubench: interrupted (SIGTERM) while writing the summary and charts; "
                   f"the 1 finished case(s) are in {out}/benchmark.json (gpubench report "
                   f"{out}/benchmark.json -o {out} draws the charts)"]
    assert "test_step[new]" in (out / "benchmark.json").read_text()
    assert _snapshot(out / "previous") == before
    assert not _no_hidden_left(out.parent)


class _SetsName:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here


def _in_broad_except():
    """matplotlib imports mpl_toolkits' Axes3D inside ``except Exception`` and warns ("Unable
    to import Axes3D"): a SIGTERM that landed there was swallowed, and the run went on to exit
    0 with that warning as its only line."""
    import warnings

    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here
    except Exception:  # noqa: BLE001 - what the library does
        warnings.warn("Unable to import Axes3D", stacklevel=1)


def _in_class_body():
    """matplotlib makes classes as it imports; Python 3.11 wraps an exception raised by a
    ``__set_name__`` in a RuntimeError ("Error calling __set_name__"): the run ended as
    "failed", exit 1."""
    type("Axes", (), {"get_xticklines": _SetsName()})


@pytest.mark.parametrize("where", [_in_broad_except, _in_class_body],
                         ids=["broad-except", "class-body"])
def test_interrupt_inside_library_code_still_ends_the_run(fake_pytest, previous, capsys,
                                                          monkeypatch, where):
    out, _ = previous
    fake_pytest(_results(_bench("new")))
    import gpubench.report.page

    monkeypatch.setattr(gpubench.report.page, "write_report", lambda *a, **k: where())
    args = [a for a in RUN if a != "--no-charts"]
    assert cli.main([*args, "--out", str(out)]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpubench: interrupted (SIGTERM) while writing")
    assert "test_step[new]" in (out / "benchmark.json").read_text()


def test_an_error_raised_from_an_interruption_is_the_interruption(capsys):
    from gpubench.cli.failure import command_failed
    from gpubench.util.signals import Interrupted, interruption

    try:
        try:
            raise Interrupted(signal.SIGINT)
        except Interrupted as sig:
            raise RuntimeError("Error calling __set_name__") from sig
    except RuntimeError as err:
        wrapped = err
    assert interruption(wrapped).signum == signal.SIGINT
    assert interruption(RuntimeError("a real failure")) is None
    assert command_failed("tune", "bert", wrapped) == 130
    assert capsys.readouterr().err.splitlines() == [
        "gpubench tune: bert: interrupted (SIGINT); nothing more was written"]
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("Error calling __set_name__")  # noqa: B904 - its context
    except RuntimeError as err:
        assert command_failed("memory", "bert", err) == 130
    assert capsys.readouterr().err.splitlines() == [
        "gpubench memory: bert: interrupted (SIGINT); results already written are kept, "
        "nothing more was written"]


def test_a_failure_after_the_cases_is_one_line_and_keeps_them(fake_pytest, previous, capsys,
                                                             monkeypatch):
    """A full disk while the summary is written: the cases stay, the line names the file."""
    out, _ = previous
    fake_pytest(_results(_bench("new")))
    import errno

    import gpubench.cli.memory

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "memory.json"))

    monkeypatch.setattr(gpubench.cli.memory, "hygiene_reports", full)
    assert cli.main([*RUN, "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpubench: cannot write {out / 'memory.json'}: No space left on device; the 1 "
        f"finished case(s) are in {out}/benchmark.json"]
    assert "test_step[new]" in (out / "benchmark.json").read_text()


def test_a_new_run_sets_the_earlier_one_aside_whole(fake_pytest, previous, capsys):
    out, before = previous
    fake_pytest(_results(_bench("new")))
    assert cli.main([*RUN, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["advice.md", "benchmark.json",
                                                    "memory.json", "previous", "summary.md"]
    assert "test_step[new]" in (out / "benchmark.json").read_text()
    assert _snapshot(out / "previous") == before  # the old chart with its own results
    assert f"{out}/previous/" in capsys.readouterr().out
    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():
        if path.is_file():
            assert path.stat().st_mode & 0o777 & ~umask == 0o666 & ~umask
    assert not _no_hidden_left(out.parent)


def test_records_of_no_model_get_no_memory_measurement(fake_pytest, previous, capsys):
    out, _ = previous
    workers = {"kind": "overhead", "case_id": "overhead-workers2", "step_time_s": 0.001}
    fake_pytest(_results(_bench("new"), _bench("workers", extra=workers)))
    assert cli.main([*RUN, "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert [r["model"] for r in json.loads((out / "memory.json").read_text())] == ["bert"]


def test_other_files_in_the_folder_stay_where_they_are(fake_pytest, previous):
    out, _ = previous
    (out / "notes").mkdir()
    (out / "notes.txt").write_text("mine")
    fake_pytest(_results(_bench("new")))
    assert cli.main([*RUN, "--out", str(out)]) == 0
    assert (out / "notes").is_dir() and (out / "notes.txt").read_text() == "mine"
    assert (out / "summary.md").read_text().endswith("summary")


def test_stale_temporaries_of_killed_runs_are_removed_on_start(fake_pytest, previous):
    out, _ = previous
    dead = subprocess.Popen(["true"])
    dead.wait()
    own = f"{dead.pid}-{atomic.HOST_ID}"
    stale_file = out / f".benchmark.json.{own}.abcd1234.tmp.json"
    stale_file.write_text("half")
    alive = out / f".summary.md.{os.getppid()}-{atomic.HOST_ID}.efgh5678.tmp.md"
    alive.write_text("a concurrent writer's")  # kept
    fake_pytest(None, code=4)  # pytest wrote nothing (a usage error)
    assert cli.main([*RUN, "--out", str(out)]) == 2
    assert not stale_file.exists()
    assert alive.exists()


def test_interrupted_run_leaves_no_hygiene_hand_over(fake_pytest, previous, capsys):
    """The pytest child writes its no_grad / del measurements for the run to take; a run
    interrupted before it takes them left the file in the results folder."""
    out, _ = previous
    from gpubench.cli.memory import HYGIENE_FILE

    hygiene = [{"model": "bert", "hygiene": {}}]
    plan = fake_pytest(_results(_bench("new")), code=2, signum=signal.SIGTERM, hygiene=hygiene)
    assert cli.main([*RUN, "--out", str(out)]) == 143
    assert any(a.startswith("--gpubench-hygiene=") for a in plan["cmd"])
    assert not (out / HYGIENE_FILE).exists()
    assert "interrupted (SIGTERM)" in capsys.readouterr().err


def test_a_killed_runs_hygiene_hand_over_is_removed_on_start(fake_pytest, previous):
    out, _ = previous
    from gpubench.cli.memory import HYGIENE_FILE

    (out / HYGIENE_FILE).write_text(json.dumps([{"model": "bert", "hygiene": "stale"}]))
    fake_pytest(None, code=4)  # pytest wrote nothing (a usage error)
    assert cli.main([*RUN, "--out", str(out)]) == 2
    assert not (out / HYGIENE_FILE).exists()


# -- the real thing: signals to `gpubench run` and its pytest child ---------------------------

def _run_and_signal(tmp_path, sig, trigger: str, after_s: float, extra=()):
    out = tmp_path / "results"
    out.mkdir()
    (out / "benchmark.json").write_text(_results(_bench("old")))
    before = _snapshot(out)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPUBENCH_DATA_DIR": str(tmp_path / "data")}
    cmd = [sys.executable, "-m", "gpubench", "run", "--profile", "smoke", "--models", "bert",
           "--out", str(out), "--no-charts", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT, start_new_session=True)
    try:
        seen = b""
        while trigger.encode() not in seen:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"gpubench ended before {trigger!r}: {seen[-2000:]!r}"
            seen += chunk
        time.sleep(after_s)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        return proc.returncode, stderr.decode(), wait_gone(proc.pid, 60), out, before
    finally:
        kill_session(proc.pid)
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["start-up", "mid-case (DDP)"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_gpubench_run_interrupted(tmp_path, sig, phase):
    if phase == "start-up":
        trigger, after, extra = "gpubench: profile", 0.5, ["-k", "zerofill"]
    else:  # the ranks of a DDP case are busy when the signal comes
        trigger, after, extra = "::test_step[", 3.0, ["-k", "ddp2", "--rounds", "1000"]
    code, stderr, left, out, before = _run_and_signal(tmp_path, sig, trigger, after, extra)
    assert code == 128 + sig, stderr
    ours = [line for line in stderr.splitlines() if line.startswith("gpubench:")]
    assert len(ours) == 1 and ours[0].startswith(f"gpubench: interrupted ({sig.name})"), stderr
    assert "Traceback" not in stderr, stderr
    assert not left, f"processes left 60 s after gpubench exited: {left}"
    assert _earlier_kept(out, before)


@pytest.mark.slow
def test_gpubench_killed_mid_case_leaves_no_process(tmp_path):
    code, _, left, out, before = _run_and_signal(
        tmp_path, signal.SIGKILL, "::test_step[", 3.0, ["-k", "ddp2", "--rounds", "1000"])
    assert code == -signal.SIGKILL
    assert not left, f"pytest or ranks outlived gpubench by 10 s: {left}"
    assert _earlier_kept(out, before)


def test_interrupt_while_starting_is_one_line(fake_pytest, previous, capsys, monkeypatch):
    out, before = previous
    plan = fake_pytest(_results(_bench("new")))

    def interrupted_cleanup(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)

    import gpubench.workloads.datacache

    monkeypatch.setattr(gpubench.workloads.datacache, "remove_stale_partials",
                        interrupted_cleanup)
    assert cli.main([*RUN, "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "gpubench: interrupted (SIGINT) while starting; nothing was run"]
    assert "cmd" not in plan and _snapshot(out) == before


# -- fault campaign (scripts/fault_campaign.py): the whole of stderr is one line ---------------

@pytest.mark.slow
@pytest.mark.parametrize(("trigger", "after"), [
    ("::test_step[", 0.5),  # the case is being built: nothing finished
    ("passed, ", 0.0),  # pytest's summary line: its clean-up (unconfigure) is running
])
def test_sigterm_leaves_exactly_one_line_on_stderr(tmp_path, trigger, after):
    """Before: pytest-benchmark's "Not saving anything, no benchmarks have been run!" warning
    (2 lines) or "Wrote benchmark data in: <staging folder>", and a KeyboardInterrupt
    traceback from pytest's unconfigure, around gpubench's own line."""
    code, stderr, left, out, before = _run_and_signal(
        tmp_path, signal.SIGTERM, trigger, after,
        ["-k", "zerofill", "--rounds", "6", "--warmup", "0"])
    assert code == 143, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: interrupted (SIGTERM)"), stderr
    assert not left and _earlier_kept(out, before)
    lock = lock_path(out / "benchmark.json").name  # released, the file stays
    assert [n for n in _no_hidden_left(out) if n != lock] == []


def test_run_on_cuda_without_cuda_is_one_line_before_anything_runs(fake_pytest, previous,
                                                                 capsys, monkeypatch):
    """Before: pytest skipped every case and gpubench said "wrote no results (pytest exit
    code 0)", with pytest-benchmark's warning, exit 1."""
    out, before = previous
    plan = fake_pytest(None)
    monkeypatch.setattr(cli, "default_device", lambda: "cpu")
    assert cli.main([*RUN, "--device", "cuda", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "pytest" not in lines[0]
    assert "cmd" not in plan and _snapshot(out) == before


def test_run_where_no_case_ran_says_so(fake_pytest, previous, capsys):
    out, before = previous
    fake_pytest(None, code=5)  # pytest: nothing collected / selected
    assert cli.main([*RUN, "--out", str(out)]) == 5
    err = capsys.readouterr().err
    assert "no case ran" in err and "exit code" not in err and _snapshot(out) == before


def test_a_failing_description_of_the_interrupt_is_not_a_traceback(monkeypatch):
    """A SIGTERM that lands inside an import leaves a traceback frame without a line number;
    pytest's description of it raises TypeError, which in gpubench run's child would put a
    two-part traceback on stderr beside gpubench's one line. The child's plugin drops it; in
    any other pytest the error stays."""
    from gpubench.cli import pytest_signals
    from gpubench.util.signals import PARENT_PID_ENV

    def describe(failure):
        hook = pytest_signals.pytest_keyboard_interrupt(excinfo=None)
        next(hook)
        with pytest.raises(StopIteration) as stop:
            hook.throw(failure)
        return stop.value.value

    class Reporter:  # pytest's TerminalReporter: at the session's end it asserts a description
        memo = None

        def _report_keyboardinterrupt(self):
            assert self.memo is not None

    reporter = Reporter()
    config = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(
        get_plugin=lambda name: reporter if name == "terminalreporter" else None))
    monkeypatch.setattr(pytest_signals, "_CONFIG", config)
    monkeypatch.setenv(PARENT_PID_ENV, str(os.getpid()))
    assert describe(TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")) is None
    reporter._report_keyboardinterrupt()  # switched off: no AssertionError at the session's end
    monkeypatch.delenv(PARENT_PID_ENV)
    with pytest.raises(TypeError):
        describe(TypeError("elsewhere"))
    with pytest.raises(AssertionError):
        Reporter()._report_keyboardinterrupt()


WATCHER = """
import os, sys, time
from gpubench.util.signals import die_with_parent
if sys.argv[2] == "by-pid":
    del os.pidfd_open  # a platform without pidfds: the host is polled by its pid
die_with_parent(os.getppid(), host_pid=int(sys.argv[1]), poll_s=0.05)
print("armed", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["pidfd", "by-pid"])
def test_a_process_dies_with_the_host_it_works_for_when_its_parent_is_another(how):
    """A rank forked from the fork server has the server as its parent and watches the run's
    process (its host) too: the host's end kills it, by pidfd or, without pidfds, by pid."""
    host = subprocess.Popen(["sleep", "60"])
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(host.pid), how],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert watcher.stdout.readline().strip() == "armed"
        host.kill()
        host.wait()
        assert watcher.wait(timeout=10) == -signal.SIGKILL
    finally:
        host.kill()
        watcher.kill()
        watcher.wait()
        host.wait()
