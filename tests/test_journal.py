"""Nothing measured is lost: every finished case is in ``<out>/`` the moment it finishes
(``gpubench.measure.journal``), whatever stops the run (SIGKILL of either process or both, Ctrl-C
once or twice, a full disk), on any filesystem; ``--resume`` continues a stopped run; one run per
folder; failed cases are results too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import kill_session, session_processes, wait_gone  # tests/ on sys.path

from gpubench.cli import main as cli
from gpubench.measure.journal import (
    Journal,
    JournalError,
    RunLock,
    failures_beside,
    journal_path,
    one_line,
    read_journal,
)

ROOT = Path(__file__).resolve().parents[1]
FAILING = f"{ROOT / 'tests' / 'data' / 'failing_workload.py'}:workload"
# Seven in-process bert cases of the smoke profile (a second or two each; the claims pairs,
# harness checks and no_grad/del measurement left out): long enough to stop in the middle.
SEVEN = ["--profile", "smoke", "--models", "bert", "--groups",
         "precision,accumulation,optimizer,memory", "--no-hygiene", "-k", "test_step",
         "--no-charts"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


# -- the journal itself -----------------------------------------------------------------------

def _write_journal(path: Path, *lines) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_line_cut_short_by_a_kill_is_ignored_and_the_last_outcome_counts(tmp_path):
    path = tmp_path / "cases.jsonl"
    _write_journal(path, {"type": "run", "key": {"profile": "smoke"}},
                   {"type": "case", "outcome": "failed", "nodeid": "a", "reason": "boom"},
                   {"type": "case", "outcome": "passed", "nodeid": "b", "record": {"name": "b"}},
                   {"type": "case", "outcome": "passed", "nodeid": "a", "record": {"name": "a"}})
    with open(path, "a") as f:
        f.write('{"type": "case", "outcome": "passed", "nodeid": "c", "rec')  # killed here
    contents = read_journal(path)
    assert contents.header["key"] == {"profile": "smoke"}
    assert [r["name"] for r in contents.records] == ["b", "a"]
    assert contents.failed == {}  # a failed, then passed on --resume
    assert read_journal(tmp_path / "absent.jsonl").header is None


def test_the_journal_sits_beside_its_result_file(tmp_path):
    assert journal_path(tmp_path / "benchmark.json") == tmp_path / "cases.jsonl"
    assert journal_path(tmp_path / "ci.json") == tmp_path / "ci.cases.jsonl"


def test_resuming_another_run_is_refused_naming_the_difference(tmp_path):
    json_path = tmp_path / "benchmark.json"
    _write_journal(journal_path(json_path),
                   {"type": "run", "key": {"profile": "smoke", "models": ["bert"]}})
    journal = Journal(None, json_path, {"profile": "smoke", "models": ["bert", "gpt2"]},
                      resume=True)
    with pytest.raises(JournalError, match=r"models \['bert'\] there, \['bert', 'gpt2'\] now"):
        journal.start()
    journal.close()
    same = Journal(None, json_path, {"profile": "smoke", "models": ["bert"]}, resume=True)
    same.start()
    same.close()


def test_a_second_run_into_the_same_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    held = RunLock(out / "benchmark.json").acquire()
    try:
        assert cli.main(["run", *SEVEN, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"gpubench: another gpubench run (pid {os.getpid()}) is writing {out}/; "
                       "wait for it to finish or write elsewhere"]
    finally:
        held.release()
    assert not (out / ".benchmark.json.lock").exists()


def test_resume_without_a_run_to_continue_is_one_line(tmp_path, capsys):
    assert cli.main(["run", *SEVEN, "--out", str(tmp_path / "none"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no run to continue" in err[0]


def test_one_line_picks_the_exception_line():
    text = "Traceback (most recent call last):\n  File x\nRuntimeError: bad\n\nshape (2, 3)"
    assert one_line(text) == "RuntimeError: bad"
    assert one_line("x" * 400).endswith("...") and len(one_line("x" * 400)) == 300


# -- real runs --------------------------------------------------------------------------------

def _cases_in(out: Path) -> int:
    try:
        return len(read_journal(journal_path(out / "benchmark.json")).passed)
    except JournalError:
        return 0


def _pytest_child(parent: int) -> int:
    for pid in session_processes(parent):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pytest" in cmdline and pid != parent:
            return pid
    raise AssertionError("no pytest child")


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            cwd=ROOT, start_new_session=True)


def _wait_for_cases(proc: subprocess.Popen, out: Path, n: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while _cases_in(out) < n:
        assert proc.poll() is None, f"ended before {n} cases: {proc.stderr.read()[-2000:]!r}"
        assert time.monotonic() < deadline, f"fewer than {n} cases after {timeout_s} s"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen) -> tuple[int, str, list[int]]:
    try:
        _, err = proc.communicate(timeout=90)
        return proc.returncode, err.decode(), wait_gone(proc.pid, 60)
    finally:
        kill_session(proc.pid)
        proc.kill()
        proc.wait()


def _summary_cases(out: Path) -> list[str]:
    """The cases ``gpubench summary <out>`` (a results folder) shows."""
    text = subprocess.run([sys.executable, "-m", "gpubench", "summary", str(out)],
                          capture_output=True, text=True,
                          env=ENV, cwd=ROOT, check=True).stdout
    return [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| bert-")]


def _gpubench_run(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gpubench", "run", *SEVEN, "--out", str(out), *extra]


def test_a_killed_childs_file_in_progress_is_removed_when_it_ends(tmp_path, monkeypatch):
    """SIGKILL of the pytest child while it rewrote F leaves its hidden temporary beside F:
    gpubench run removes it once the child has ended (the owner is dead), not only at the
    next run's start."""
    from gpubench.util import atomic

    out = tmp_path / "out"
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = out / f".benchmark.json.{dead.pid}-{atomic.HOST_ID}.abcd1234.tmp.json"

    def killed_child(args, state, json_path, resume):
        left.write_text("{")  # the child died half-way through a rewrite of F
        return -signal.SIGKILL, None

    monkeypatch.setattr(cli, "_run_pytest_child", killed_child)
    code = cli.main(["run", "--profile", "smoke", "--models", "bert", "--out", str(out),
                     "--no-charts", "--data-dir", str(tmp_path / "data")])
    assert code != 0
    assert not left.exists()


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["child", "parent", "both"])
def test_sigkill_loses_no_finished_case(tmp_path, victim):
    """SIGKILL (the out-of-memory killer) of gpubench run, of its pytest child or of both
    after two cases: both are in <out>/ and gpubench summary shows them; no process is left.
    A case ends by its record in F, then its journal line: a kill between the two (a fast
    case's) leaves F one case ahead of the journal, which is what the run and summary report."""
    out = tmp_path / "out"
    proc = _start(_gpubench_run(out))
    _wait_for_cases(proc, out, 2)
    child = _pytest_child(proc.pid)
    if victim in ("child", "both"):
        os.kill(child, signal.SIGKILL)
    if victim in ("parent", "both"):
        os.kill(proc.pid, signal.SIGKILL)
    code, err, left = _finish(proc)
    assert not left, f"processes left 60 s after: {left}"
    kept = cli._records_in(out / "benchmark.json")
    assert kept >= 2 and _cases_in(out) in (kept, kept - 1)
    assert len(_summary_cases(out)) == kept
    hidden = [p.name for p in out.iterdir() if p.name.startswith(".")]
    if victim == "both":  # a file the child was writing, with nobody left to remove it: the
        # next run in <out> does (``remove_stale_temporaries``); F itself is whole
        from gpubench.util.atomic import is_temp_file_name

        hidden = [n for n in hidden if not is_temp_file_name(n)]
    assert hidden in ([], [".benchmark.json.lock"])  # no result held in a hidden file
    if victim == "child":  # the parent lives on, says what happened, writes the summary
        assert code == 1, err
        assert (f"gpubench: the benchmark process was killed by SIGKILL (out of memory?); "
                f"{kept} finished case(s) kept in {out / 'benchmark.json'}") in err
        assert "Traceback" not in err
        assert (out / "summary.md").is_file()
    else:
        assert code == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_keeps_the_finished_cases_and_resume_runs_the_rest(tmp_path, presses):
    """SIGINT to the whole foreground process group, as a terminal's Ctrl-C sends it, once or
    twice: exit 130, one line naming the kept cases; --resume then measures only the rest."""
    out = tmp_path / "out"
    proc = _start(_gpubench_run(out))
    _wait_for_cases(proc, out, 2)
    for _ in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
    code, err, left = _finish(proc)
    assert code == 130, err
    assert not left
    kept = _cases_in(out)
    lines = err.strip().splitlines()
    assert lines == [f"gpubench: interrupted (SIGINT) while running the cases; {kept} finished "
                     f"case(s) kept in {out}/benchmark.json (the same command with --resume "
                     "runs the rest)"], err
    before = _summary_cases(out)
    assert len(before) == kept >= 2
    if presses == 2:
        return
    done = subprocess.run(_gpubench_run(out, "--resume"), capture_output=True, text=True,
                          env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"resuming: {kept} finished case(s)" in done.stdout
    journal = [json.loads(line) for line in journal_path(out / "benchmark.json").open()]
    runs = [line["nodeid"] for line in journal if line.get("type") == "case"]
    assert len(runs) == len(set(runs)), "a case was measured twice"
    after = _summary_cases(out)
    assert sorted(after) == sorted(["bert-fp32", "bert-fp16", "bert-bf16",
                                    "bert-fp32-accum2-mb2", "bert-fp32-adamw_fused",
                                    "bert-fp32-zerofill", "bert-fp32-ckpt"])
    assert set(before) <= set(after)


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or 'not root'}")


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(name: str, size: str = "64m") -> Path:
        where = tmp_path / name
        _mount_tmpfs(where, size)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


ONE_CASE = ["run", "--profile", "smoke", "--models", "bert", "-k", "bert-fp32-zerofill",
            "--no-charts", "--no-hygiene"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mount point", "symlink"])
def test_out_on_another_filesystem_works(tmp_path, tmpfs, kind):
    """A Docker volume, an NFS folder or a symlink to another disk: the results land there,
    and the earlier run there is set aside whole."""
    disk = tmpfs("disk")
    out = disk if kind == "mount point" else tmp_path / "link"
    if kind == "symlink":
        out.symlink_to(disk)
    (disk / "benchmark.json").write_text("{}")  # an earlier run
    # Started as from inside a pytest-xdist worker (a test suite run with ``pytest -n``): the
    # cases' pytest child is not handed the worker's variables, which would disable them.
    env = {**ENV, "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
    done = subprocess.run([sys.executable, "-m", "gpubench", *ONE_CASE, "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert _cases_in(out) == 1 and (disk / "summary.md").is_file()
    assert not (disk / "memory.json").exists()  # --no-hygiene: no no_grad/del measurement
    # The one case it ran reads generated data: no storage probe, though -k left out cases
    # of the profile that read files.
    machine = json.loads((disk / "benchmark.json").read_text())["machine_info"]["gpubench"]
    assert "storage" not in machine
    assert (disk / "previous" / "benchmark.json").read_text() == "{}"
    assert out.is_symlink() == (kind == "symlink")


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_keeping_what_was_written(tmpfs):
    out = tmpfs("small", "48k")  # room for two or three cases' records
    done = subprocess.run([sys.executable, "-m", "gpubench", "run", *SEVEN[:-1], "--no-charts",
                           "--out", str(out)], capture_output=True, text=True, env=ENV,
                          cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    first = done.stderr.strip().splitlines()[0]
    assert first.startswith(f"gpubench: cannot write {out}/") and "No space left" in first
    records = json.loads((out / "benchmark.json").read_text())["benchmarks"]  # valid JSON
    assert 1 <= len(records) < 7


@pytest.mark.slow
def test_failed_cases_are_results_with_their_reason(tmp_path):
    """A model that fails under autocast: its fp16 and bf16 cases are kept as failed with one
    line each (summary, advice, gpubench summary), the traceback in logs/, not on screen."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "gpubench", "run", "--profile", "smoke",
                           "--model", FAILING, "--groups", "precision", "--no-charts",
                           "--out", str(out)], capture_output=True, text=True, env=ENV,
                          cwd=ROOT)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    # On screen before the failures' table: pytest's one-line summary per failed case at most.
    shown = [line for line in done.stdout.split("### Failed cases")[0].splitlines()
             if "this model cannot run under autocast" in line]
    assert all(line.startswith("FAILED ") for line in shown), shown
    failures = failures_beside([out / "benchmark.json"])
    assert sorted(f["case_id"] for f in failures) == ["fails-amp-bf16", "fails-amp-fp16"]
    for f in failures:
        assert f["reason"] == "RuntimeError: this model cannot run under autocast"
        log = (out / f["log"]).read_text()
        assert "raise RuntimeError" in log and "failing_workload.py" in log
    for name in ("summary.md", "advice.md"):
        text = (out / name).read_text()
        assert "| fails-amp-bf16 | fails-amp | RuntimeError: this model cannot run under " \
               "autocast | logs/fails-amp-bf16.log |" in text, name
    assert "| **case failed** | fails-amp-bf16 failed: RuntimeError" in " ".join(
        (out / "advice.md").read_text().split())  # the AMP claim says so, not "not measured"
    shown = subprocess.run([sys.executable, "-m", "gpubench", "summary",
                            str(out / "benchmark.json")], capture_output=True, text=True,
                           env=ENV, cwd=ROOT).stdout
    assert "### Failed cases" in shown and "fails-amp-fp16" in shown


@pytest.mark.slow
def test_plain_pytest_keeps_its_json_current_case_by_case(tmp_path):
    """pytest benchmarks/ --benchmark-json=F, killed with SIGKILL after a case: F is valid
    pytest-benchmark JSON holding the finished cases; --gpubench-resume completes it."""
    json_path = tmp_path / "ci.json"
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
           "--gpubench-profile=smoke", "--gpubench-models=bert", "-k",
           "bert-fp32-zerofill or bert-bf16 or bert-fp16 or bert-fp32-ckpt",
           f"--benchmark-json={json_path}"]
    proc = _start(cmd)
    deadline = time.monotonic() + 240
    while not json_path.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    _finish(proc)
    kept = json.loads(json_path.read_text())["benchmarks"]
    assert kept and all(b["stats"]["data"] for b in kept)
    assert (tmp_path / "ci.cases.jsonl").is_file()
    done = subprocess.run([*cmd, "--gpubench-resume"], capture_output=True, text=True,
                          env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:]
    names = [b["name"] for b in json.loads(json_path.read_text())["benchmarks"]]
    assert len(names) == len(set(names)) == 4
    assert {b["name"] for b in kept} <= set(names)
