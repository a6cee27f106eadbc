"""Nothing keeps a finished run alive, and a rank that cannot reach its rendezvous says so in
time: a workload's stray non-daemon thread is named and the process exits with pytest's status
(``gpubench.util.signals.exit_despite_stray_threads``); ``gpubench dist`` names the address it could
not join within ``--timeout``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from gpubench import Workload

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, timeout: float = 60, env: dict | None = None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


STRAY = ("import sys, threading, time\n"
         "from gpubench.util.signals import exit_despite_stray_threads\n"
         "threading.Thread(target=time.sleep, args=({sleep},), name='poller').start()\n"
         "exit_despite_stray_threads(3, grace_s={grace})\n"
         "print('done', flush=True)\n"
         "sys.exit(3)\n")


def test_a_stray_thread_is_named_and_the_process_exits():
    start = time.monotonic()
    proc = _python(STRAY.format(sleep=60, grace=0.3))
    assert time.monotonic() - start < 15
    assert proc.returncode == 3
    assert proc.stdout == "done\n"
    assert proc.stderr.splitlines() == [
        "gpubench: warning: the run is over but 1 non-daemon thread(s) it started still run: "
        "'poller' (a workload's thread?); exiting without waiting for them"]


def test_a_thread_that_ends_in_time_is_waited_for_and_not_named():
    # a grace far longer than the thread (the wait ends when it does), however loaded the
    # machine
    proc = _python(STRAY.format(sleep=0.1, grace=30))
    assert (proc.returncode, proc.stderr) == (3, "")


def test_without_stray_threads_nothing_happens():
    proc = _python("from gpubench.util.signals import exit_despite_stray_threads\n"
                   "exit_despite_stray_threads(5)\nimport threading\n"
                   "assert [t.name for t in threading.enumerate()] == ['MainThread']\n")
    assert (proc.returncode, proc.stderr) == (0, "")


def stray_thread():
    """A workload whose build_model leaves a non-daemon thread running."""
    def build():
        threading.Thread(target=time.sleep, args=(600,), name="user-poller").start()
        return nn.Linear(4, 2)

    return Workload(name="stray", build_model=build, micro_batch=4,
                    make_batch=lambda n, g: (torch.randn(n, 4, generator=g),
                                             torch.randint(0, 2, (n,), generator=g)),
                    loss_fn=nn.functional.cross_entropy)


@pytest.mark.slow
def test_the_benchmark_session_ends_despite_a_workload_thread(tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "benchmarks" / "test_training_step.py"),
         "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "--gpubench-profile=smoke",
         f"--gpubench-models={Path(__file__).resolve()}:stray_thread",
         "-k", "stray-fp32-zerofill", "--benchmark-disable"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    warning = [line for line in proc.stderr.splitlines() if "non-daemon" in line]
    assert len(warning) == 1 and "'user-poller'" in warning[0], proc.stderr
    assert time.monotonic() - start < 300  # not held by the thread's 600 s


def _dist(port: int, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpubench", "dist", "--model", "resnet18",
                           "--profile", "smoke", "--device", "cpu", "--timeout", "2",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("service, reason", [
    ("listening", "accepted the connection but never answered"),  # another service
    ("refusing", "nothing listens there"),  # bound, not listening: connections are refused
])
@pytest.mark.slow
def test_dist_rank_names_a_rendezvous_it_cannot_join(tmp_path, service, reason):
    """Something on MASTER_PORT that never answers as a store, or nothing listening there."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        if service == "listening":
            server.listen()
        port = server.getsockname()[1]
        proc, took = _dist(port, tmp_path / "out.json")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"gpubench dist: rank 1 could not join the rendezvous at "
                               f"127.0.0.1:{port} within 2 s:")
    assert reason in lines[0]
    assert took < 40


def test_the_gpubench_command_is_not_kept_alive_by_a_workloads_thread():
    """The command validates each workload (a build and a step) in its own process: a thread
    that build leaves running is named in one warning and the command exits with its status."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpubench", "list", "--profile", "smoke",
                           "--model", f"{Path(__file__).resolve()}:stray_thread",
                           "--groups", "precision"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert time.monotonic() - start < 300  # not held by the thread's 600 s
    assert proc.returncode == 0, proc.stderr
    assert "stray-fp32" in proc.stdout
    assert [line for line in proc.stderr.splitlines() if "user-poller" in line], proc.stderr
