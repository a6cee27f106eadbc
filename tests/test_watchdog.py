"""Nothing in this process hangs past its limit: an in-process case's build, data and steps end
with a one-line ``CaseTimeout`` (``gpubench.util.watchdog``), and a call that cannot be interrupted
ends the process instead."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from gpubench import Workload
from gpubench.measure.protocol import CaseTimeout, InProcess
from gpubench.train.config import LoaderConfig, RunConfig
from gpubench.util import watchdog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fail_instead_of_hanging(request):
    """Should the watchdog break, these tests would hang: the test process is ended with a
    line naming the test instead (by a thread of its own, not the watchdog under test)."""
    done = threading.Event()

    def guard():
        if not done.wait(60):
            os.write(2, f"\n{request.node.nodeid} hung: the time limit did not stop it\n".encode())
            os._exit(1)

    threading.Thread(target=guard, daemon=True).start()
    yield
    done.set()


@pytest.mark.parametrize("block", [
    lambda: threading.Event().wait(),
    lambda: time.sleep(60),
    lambda: queue.Queue().get(),
    lambda: [None for _ in iter(int, 1)],  # a Python loop that never ends
], ids=["event", "sleep", "queue", "loop"])
def test_a_blocked_call_ends_at_its_limit(block):
    start = time.monotonic()
    with pytest.raises(watchdog.Hung, match="x did not finish"):
        with watchdog.time_limit(0.3, "x did not finish within 0.3 s"):
            block()
    # ended by the soft stop (the exception), not the hard one GRACE_S later
    assert time.monotonic() - start < watchdog.GRACE_S
    time.sleep(0.4)  # no alarm is left behind


def test_a_swallowed_stop_comes_again_before_the_process_is_ended():
    """The watchdog thread signals the main thread once more (also where the process handed
    the timer's signal to another thread)."""
    start = time.monotonic()
    with pytest.raises(watchdog.Hung):
        with watchdog.time_limit(0.3, "x", grace_s=30):
            try:
                time.sleep(60)
            except watchdog.Hung:
                pass
            time.sleep(60)
    assert time.monotonic() - start < 15  # the second stop, not the 30 s grace's end


def test_a_limit_leaves_fast_work_and_other_alarms_alone():
    with watchdog.time_limit(5, "x"):
        pass
    fired = []
    import signal

    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 60)
        with watchdog.time_limit(5, "x"):
            time.sleep(0.1)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 30  # still pending, not lost
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # and it still fires
        deadline = time.monotonic() + 30
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_child(code: str) -> subprocess.CompletedProcess:
    prelude = ("import ctypes, signal, sys, threading, time\n"
               "from gpubench.util import watchdog\nwatchdog.FAULT_MARGIN_S = 0.5\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_a_call_that_swallows_the_timeout_ends_the_process():
    start = time.monotonic()
    proc = _in_child(
        "with watchdog.time_limit(0.3, 'x: a training step did not finish within 0.3 s',"
        " grace_s=0.3):\n"
        "    while True:\n"
        "        try:\n"
        "            time.sleep(60)\n"
        "        except Exception:\n"
        "            pass\n")
    assert proc.returncode == watchdog.EXIT_HUNG, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("gpubench: x: a training step did not finish within 0.3 s; it "
                            "could not be interrupted")
    assert 'File "<string>", line 7 in <module>' in proc.stderr  # the main thread's stack
    assert time.monotonic() - start < 15


def test_a_call_blocked_holding_the_gil_ends_the_process():
    """C code that ignores the signal and never releases the GIL: only faulthandler's own
    thread can run, and it ends the process."""
    start = time.monotonic()
    proc = _in_child(
        "with watchdog.time_limit(0.3, 'x', grace_s=0.3):\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
        "    ctypes.PyDLL(None).sleep(60)\n")  # PyDLL: the GIL stays held
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Timeout ("), proc.stderr
    assert time.monotonic() - start < 15


def test_exit_after_reports_once_when_the_block_fails_as_its_watch_wakes():
    """The watch is writing its line when the block ends with its own report: the block's end
    waits for the process to end, so one line is written, not two."""
    proc = _in_child(
        "import threading\n"
        "writing = threading.Event()\n"
        "write = watchdog._write\n"
        "def slow_write(text):\n"
        "    writing.set()\n"
        "    time.sleep(0.5)\n"
        "    write(text)\n"
        "watchdog._write = slow_write\n"
        "try:\n"
        "    with watchdog.exit_after(0.1, lambda: 'the watch', code=3):\n"
        "        writing.wait(30)\n"
        "        raise RuntimeError\n"
        "except RuntimeError:\n"
        "    sys.stderr.write('the block\\n')\n")
    assert (proc.returncode, proc.stderr) == (3, "the watch\n")


def _net():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _batch(n, g):
    return torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)


def blocking_batch():
    """make_batch blocks for more samples than the validation's two."""
    def make_batch(n, g):
        if n > 2:
            threading.Event().wait()
        return _batch(n, g)

    return Workload(name="wdbatch", build_model=_net, make_batch=make_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


def blocking_after_check():
    """make_batch answers the workload check (seed 0), then blocks on the second micro-batch
    of an accumulated step (its own seed) while the case is built."""
    def make_batch(n, g):
        if g.initial_seed() != 0:
            threading.Event().wait()
        return _batch(n, g)

    return Workload(name="wdbatch", build_model=_net, make_batch=make_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


class Stuck(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(60)


def blocking_dataset():
    return Workload(name="wddata", build_model=_net, make_batch=_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy, dataset=lambda request: Stuck())


def plain():
    return Workload(name="wdplain", build_model=_net, make_batch=_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


SPEC = f"{Path(__file__).resolve()}:"


def test_a_build_whose_make_batch_blocks_fails_the_case_in_time():
    start = time.monotonic()
    with pytest.raises(CaseTimeout, match=r"^wdbatch-fp32: building the case \(model, data, "
                       r"optimizer\) did not finish within 1 s \(hung\?\)"):
        InProcess(RunConfig(model=SPEC + "blocking_batch", profile="smoke"), timeout_s=1)
    assert time.monotonic() - start < watchdog.GRACE_S  # the soft stop, not the hard


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_that_never_come_fail_the_case_in_time(workers):
    cfg = RunConfig(model=SPEC + "blocking_dataset", profile="smoke",
                    loader=LoaderConfig(dataset="files", num_workers=workers))
    def live_children() -> set[int]:
        return {c.pid for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE}

    earlier = live_children()  # an earlier test's worker may still be closing: not this one's
    with pytest.raises(CaseTimeout, match="preparing its data .* within 1 s"):
        with InProcess(cfg, timeout_s=60) as case:
            case.timeout_s = 1  # the preparation's limit; the build's was the start's
            start = time.monotonic()
            case.call("prepare")
    # the stuck worker did not cost torch's 5 s join on top of the 1 s limit
    assert time.monotonic() - start < 1 + 4.5
    assert not live_children() - earlier  # its loader workers are gone


def test_a_step_that_hangs_fails_the_case_in_time(monkeypatch):
    with InProcess(RunConfig(model=SPEC + "plain", profile="smoke"), timeout_s=60) as case:
        case.call("step")
        case.timeout_s = 1  # the hanging step's limit
        monkeypatch.setattr(case.program.case, "synced_step", lambda: time.sleep(60))
        start = time.monotonic()
        with pytest.raises(CaseTimeout, match="wdplain-fp32: a training step did not finish"):
            case.call("step")
        assert time.monotonic() - start < watchdog.GRACE_S  # the soft stop, not the hard


def test_the_timed_rounds_arm_one_limit_and_a_hung_round_still_fails(monkeypatch):
    """Arming a limit costs ~25 us, which the case's rounds (timed from outside the step)
    would carry and its paired baseline's (timed inside) would not: the rounds run under
    one limit of their own, and a round that hangs still fails the case in time."""
    import gpubench.measure.protocol as measure

    armed = []
    plain = measure.time_limit

    def counting(seconds, message, **kwargs):
        armed.append(message)
        return plain(seconds, message, **kwargs)

    with InProcess(RunConfig(model=SPEC + "plain", profile="smoke"), timeout_s=60) as case:
        case.timeout_s = 1  # each step's limit from here (the build's was 60 s)
        monkeypatch.setattr(measure, "time_limit", counting)
        with case.timed_rounds(2):
            for _ in range(5):
                case.call("step")
        assert len(armed) == 1 and "timed rounds" in armed[0]
        case.call("step")  # outside the rounds: a limit of its own again
        assert len(armed) == 2
        monkeypatch.setattr(case.program.case, "synced_step", lambda: time.sleep(60))
        start = time.monotonic()
        with pytest.raises(CaseTimeout, match="its timed rounds did not finish within 2 s"):
            with case.timed_rounds(2):
                case.call("step")
        assert time.monotonic() - start < watchdog.GRACE_S  # the soft stop, not the hard


def test_gpubench_case_reports_the_hang_on_one_line(tmp_path, capsys):
    from gpubench.cli import main as cli

    code = cli.main(["case", "--model", SPEC + "blocking_after_check", "--profile", "smoke",
                     "--accum-steps", "2", "--timeout", "1", "-o", str(tmp_path / "out.json")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.splitlines() == [
        "gpubench case: wdbatch-fp32-accum2 failed: wdbatch-fp32-accum2: building the case "
        "(model, data, optimizer) did not finish within 1 s (hung?); --timeout sets the limit"]
    assert not (tmp_path / "out.json").exists()
    assert os.getpid()  # this process is fine
    from gpubench.workloads.api import VALIDATE_TIMEOUT_S, probe_timeout_s

    assert probe_timeout_s() == VALIDATE_TIMEOUT_S  # --timeout bounded that command only
