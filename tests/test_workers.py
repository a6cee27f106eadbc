"""Worker groups under faults: loopback-only sockets, ranks that die with their parent, and
messages that name the rank at fault with its real exit status."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from processes import FORKED, session_processes, wait_gone  # the tests folder is on sys.path

from gpubench.launchers.workers import (
    WorkerError,
    WorkerGroup,
    WorkerTimeout,
    start_method,
)
from gpubench.util.signals import describe_exit

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class Program:
    def __init__(self, rank, world_size):
        self.rank = rank

    def allreduce(self):
        t = torch.ones(3)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def hang(self):
        time.sleep(60)

    def rank1_hangs_in_allreduce(self):
        if self.rank == 1:
            time.sleep(60)
        return self.allreduce()


class LateBuilder(Program):
    """Rank 1 builds 3 s after rank 0, and the build ends in a collective (as DDP's first
    broadcast does)."""

    def __init__(self, rank, world_size):
        super().__init__(rank, world_size)
        if rank == 1:
            time.sleep(3)
        torch.distributed.barrier()


class HangingBuilder(Program):
    """Rank 1 hangs in its build while rank 0's build waits for it in a collective."""

    def __init__(self, rank, world_size):
        super().__init__(rank, world_size)
        if rank == 1:
            time.sleep(600)
        torch.distributed.barrier()


# -- helpers reading /proc ------------------------------------------------------------------

def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])  # /proc/net/tcp: host byte order
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
    addr = ipaddress.IPv6Address(b"".join(words))
    return addr.ipv4_mapped or addr


def listening_sockets(pids) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes = set().union(*(_socket_inodes(p) for p in pids))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                addr, port = local.split(":")
                found.append((str(_address(addr)), int(port, 16)))
    return found


def _alive(pids):
    return [p for p in pids if os.path.exists(f"/proc/{p}") and
            Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]


# -- sockets ----------------------------------------------------------------------------------

def test_store_and_gloo_listen_on_loopback_only():
    with WorkerGroup(2, Program, start_method=FORKED) as group:
        assert group.call("allreduce") == [[2.0] * 3] * 2
        sockets = listening_sockets([os.getpid(), *group.pids])
    assert any(port == group.store.port for _, port in sockets), sockets  # the store was seen
    exposed = [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]
    assert not exposed, f"listening beyond the loopback interface: {exposed}"


# -- messages ---------------------------------------------------------------------------------

def test_describe_exit():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(None) == "is still running"


def test_killed_rank_reports_its_signal_not_code_none():
    group = WorkerGroup(2, Program, start_method=FORKED)
    pids = group.pids
    threading.Timer(0.5, os.kill, (pids[1], signal.SIGKILL)).start()
    with pytest.raises(WorkerError, match=r"rank 1 was killed by SIGKILL during 'hang'"):
        group.call("hang")
    assert not _alive(pids)


@pytest.mark.parametrize("method", ["spawn", FORKED])
def test_rank_killed_while_starting_is_named_with_its_signal(monkeypatch, method):
    ctx = mp.get_context(method)
    start = ctx.Process.start

    def start_and_kill_rank1(self):
        start(self)
        if self.name == "gpubench-rank1":
            os.kill(self.pid, signal.SIGKILL)

    monkeypatch.setattr(ctx.Process, "start", start_and_kill_rank1)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 was killed by SIGKILL during 'start'"):
        WorkerGroup(2, Program, timeout_s=30, start_method=method)
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_start_up_hang_names_the_rank_that_did_not_start(monkeypatch):
    """Rank 1 stopped before it joins: rank 0 gives up waiting in the process group (as long
    as the start may take, not the commands' shorter collective timeout), and the message
    blames rank 1, not the healthy rank 0."""
    ctx = mp.get_context("spawn")
    start = ctx.Process.start
    stopped = []

    def start_and_stop_rank1(self):
        start(self)
        if self.name == "gpubench-rank1":
            os.kill(self.pid, signal.SIGSTOP)
            stopped.append(self.pid)

    monkeypatch.setattr(ctx.Process, "start", start_and_stop_rank1)
    with pytest.raises(WorkerTimeout) as err:
        WorkerGroup(2, Program, timeout_s=1, start_timeout_s=6)
    message = str(err.value)
    assert message.startswith("rank(s) 1 did not start"), message
    # rank 0's join and the host's start end together: whichever speaks first, rank 0 is
    # named as the one that waited
    assert "rank 0 gave up waiting" in message or "rank(s) 0 waited for it" in message, message
    assert not _alive(stopped)


# -- parent death -----------------------------------------------------------------------------

HOST = textwrap.dedent("""
    import faulthandler
    import signal
    import time

    faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks if the host hangs
    # A process started in the background of a non-interactive shell inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: the host would not see it.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Spin:
        def __init__(self, rank, world_size):
            pass
        def spin(self):
            while True:
                time.sleep(0.05)

    if __name__ == "__main__":  # heavy imports here: spawned ranks re-import this module
        import torch.multiprocessing as mp
        from gpubench.launchers.workers import WorkerGroup

        ctx = mp.get_context("METHOD")
        start = ctx.Process.start
        def start_and_tell(self):
            start(self)
            if self.name.startswith("gpubench-rank"):  # not the fork server's first process
                print("spawned", self.pid, flush=True)
        ctx.Process.start = start_and_tell
        with WorkerGroup(2, Spin, timeout_s=120, start_method="METHOD") as group:
            print("ready", flush=True)
            group.call("spin")
""")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("phase", ["start-up", pytest.param("mid-case", marks=pytest.mark.slow)])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_ranks_exit_within_seconds_when_their_host_dies(tmp_path, sig, phase, method):
    """Forked from the fork server, a rank's parent is the server, which outlives the host for
    as long as a process holds its "alive" pipe: the ranks let go of it, so the server and
    then they die with the host."""
    host = tmp_path / "host.py"
    host.write_text(HOST.replace("METHOD", method))
    err = (tmp_path / "host.err").open("w")
    proc = subprocess.Popen([sys.executable, str(host)], stdout=subprocess.PIPE, text=True,
                            stderr=err, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        ranks = []
        for line in proc.stdout:
            if line.startswith("spawned"):
                ranks.append(int(line.split()[1]))
            if (phase == "start-up" and len(ranks) == 2) or line.startswith("ready"):
                break
        assert len(ranks) == 2, "the host did not start its ranks"
        if phase == "mid-case":
            time.sleep(0.5)
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack
            time.sleep(2)
            err.flush()
            raise AssertionError(f"the host did not exit within 30 s of {sig.name} ({phase}); "
                                 f"its stderr:\n{(tmp_path / 'host.err').read_text()}") from None
        left = wait_gone(proc.pid, within_s=30)
        assert not left, f"processes left 30 s after the host died ({sig.name}, {phase}): {left}"
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        err.close()


@pytest.mark.slow
def test_collective_timeout_names_the_rank_that_hung_not_the_one_that_waited():
    """Rank 1 hangs while rank 0 waits for it in an all-reduce: rank 0's gloo timeout used to be
    reported as "rank 0 failed", blaming the healthy rank (fault campaign: a rank stopped with
    SIGSTOP in `gpubench case --parallel ddp`)."""
    with WorkerGroup(2, Program, timeout_s=3, start_timeout_s=120,
                     start_method=FORKED) as group:
        with pytest.raises(WorkerTimeout) as err:
            group.call("rank1_hangs_in_allreduce", timeout_s=60)
    message = str(err.value)
    assert message.startswith("rank(s) 1 did not finish 'rank1_hangs_in_allreduce' (hung?)"), \
        message
    assert "rank 0 gave up waiting" in message and "\n" not in message


@pytest.mark.slow
def test_a_rank_that_builds_later_than_the_collective_timeout_still_joins():
    """Joining and building wait for the slowest rank as long as the start may take: a 1 s
    ``timeout_s`` bounds the commands' collectives only (a rank that hangs in one is named
    within seconds, not after the start's 60)."""
    with WorkerGroup(2, LateBuilder, timeout_s=1, start_timeout_s=60,
                     start_method=FORKED) as group:
        assert group.call("allreduce") == [[2.0] * 3] * 2
        start = time.monotonic()
        with pytest.raises(WorkerTimeout) as err:
            group.call("rank1_hangs_in_allreduce", timeout_s=60)
    assert str(err.value).startswith("rank(s) 1 did not finish"), str(err.value)
    assert time.monotonic() - start < 30  # rank 0's 1 s collective timeout, not the start's


@pytest.mark.slow
def test_a_rank_that_hangs_in_its_build_is_named_not_the_one_that_waited():
    """Both ranks were building when the start's bound ran out, so both were named ("rank(s)
    0, 1 did not start"; fault campaign: rank 1 of `gpubench case --parallel ddp` stopped
    with SIGSTOP before its build finished). The host now waits a grace period for rank 0's
    report of its collective's timeout."""
    with pytest.raises(WorkerTimeout) as err:
        WorkerGroup(2, HangingBuilder, timeout_s=1, start_timeout_s=6, start_method=FORKED)
    message = str(err.value)
    assert message.startswith("rank(s) 1 did not start (stuck building"), message
    assert "rank 0 gave up waiting for it in a collective" in message, message


@pytest.mark.slow
def test_rank_that_hangs_is_named_when_the_host_times_out_too():
    """The same hang with the host's own deadline equal to the process group's timeout: the
    host used to give up first and name every rank ("rank(s) 0, 1 did not finish"); it now
    waits a grace period for rank 0's report (fault campaign: SIGSTOP of a rank mid-step)."""
    with WorkerGroup(2, Program, timeout_s=3, start_timeout_s=120,
                     start_method=FORKED) as group:
        with pytest.raises(WorkerTimeout) as err:
            group.call("rank1_hangs_in_allreduce")
    assert str(err.value).startswith("rank(s) 1 did not finish"), str(err.value)


class LoaderStart:
    """A rank that reports how its DataLoader workers would start."""

    def __init__(self, rank, world_size):
        pass

    def methods(self):
        import multiprocessing

        from gpubench.train.config import LoaderConfig
        from gpubench.train.data import build_loader

        loader = build_loader(list(range(8)), LoaderConfig(dataset="synthetic", num_workers=1),
                              2, seed=0)
        return multiprocessing.get_start_method(), loader.multiprocessing_context.get_start_method()


def test_a_ranks_loader_workers_are_forked_as_under_torchrun():
    # A spawned rank defaults to spawn, whose loader workers re-import torch (seconds each);
    # a training script's ranks on Linux fork them.
    with WorkerGroup(1, LoaderStart) as group:
        assert group.call("methods") == [("spawn", "fork")]


def test_a_spawned_nccl_rank_sets_its_device_before_its_process_group(monkeypatch):
    """NCCL ranks: the rank's own GPU is current before init_process_group, and passed as its
    device_id; gloo ranks get nothing."""
    import torch

    from gpubench.launchers.workers import rank_device

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(d))
    assert rank_device("gloo", 1) == {} and calls == []
    assert rank_device("nccl", 1) == {"device_id": torch.device("cuda", 1)}
    assert calls == [1]


# -- ranks forked from the fork server -------------------------------------------------------

class Surroundings:
    def __init__(self, rank, world_size):
        pass

    def read(self):
        return {"var": os.environ.get("GPUBENCH_TEST_VAR"), "path": list(sys.path),
                "cwd": os.getcwd(), "threads": torch.get_num_threads()}


def test_a_forked_rank_has_this_processs_environment_path_directory_and_threads(
        tmp_path, monkeypatch):
    """The fork server started earlier, with another environment, path and directory; a rank
    forked from it now has what a spawned rank would have: this process's, as they are now,
    and the thread count of ``OMP_NUM_THREADS`` (read by torch as it is imported, in the
    server), or torch's own without it."""
    with WorkerGroup(1, Surroundings, start_method="forkserver"):
        pass  # the server runs from here on
    monkeypatch.setenv("GPUBENCH_TEST_VAR", "now")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    seen = {}
    for method in ("spawn", "forkserver"):
        with WorkerGroup(1, Surroundings, start_method=method) as group:
            seen[method] = group.call("read")[0]
    for method, got in seen.items():
        assert got["var"] == "now" and got["cwd"] == str(tmp_path), method
        assert got["path"][0] == str(tmp_path) and got["threads"] == 1, method
    monkeypatch.delenv("OMP_NUM_THREADS")
    for method in ("spawn", "forkserver"):
        with WorkerGroup(1, Surroundings, start_method=method) as group:
            seen[method] = group.call("read")[0]
    assert seen["forkserver"]["threads"] == seen["spawn"]["threads"]


SERVER_HOST = textwrap.dedent("""
    import json
    import os
    import signal
    import sys

    class Probe:
        def __init__(self, rank, world_size):
            pass
        def read(self):
            import torch

            import gpubench
            os.write(2, b"a rank's stderr\\n")
            return {"threads": torch.get_num_threads(), "gpubench": gpubench.__file__,
                    "preloaded": "tabnanny" in sys.modules}

    if __name__ == "__main__":  # not in a rank, which imports this module again
        os.environ["OMP_NUM_THREADS"] = "1"  # as torch is imported, and the fork server starts
        from multiprocessing import forkserver

        import gpubench
        from gpubench.launchers.workers import WorkerGroup, preload_workload_imports

        # A module nothing here imports, and one whose import fails (not an ImportError).
        preload_workload_imports(["tabnanny", "broken_library"])
        with WorkerGroup(1, Probe, start_method="forkserver") as group:
            first = {**group.call("read")[0], "start_method": group.start_method}
        assert "tabnanny" not in sys.modules
        server = forkserver._forkserver._forkserver_pid
        with open(f"/proc/{server}/status") as status:
            ignored = int(next(l for l in status if l.startswith("SigIgn")).split()[1], 16)
        del os.environ["OMP_NUM_THREADS"]
        os.dup2(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT), 2)
        with WorkerGroup(1, Probe, start_method="forkserver") as group:
            forked = group.call("read")[0]
        with WorkerGroup(1, Probe, start_method="spawn") as group:
            spawned = group.call("read")[0]
        print(json.dumps({"first": first, "forked": forked, "spawned": spawned,
                          "server_ignores_sigint": bool(ignored >> (signal.SIGINT - 1) & 1),
                          "gpubench": gpubench.__file__}))
""")


def test_the_fork_server_gives_its_ranks_this_processs_threads_stderr_and_package(tmp_path):
    """The server starts while ``OMP_NUM_THREADS`` is 1, and a rank forked then has 1 thread;
    with the variable gone, a rank forked from the same server has torch's own count, as a
    spawned one has (the server was started without it); a rank forked after this process
    moved its stderr writes to the new one; the server and so every rank ignore SIGINT from
    their start; the ranks run this process's gpubench; the modules a run's workloads declare
    (``preload_workload_imports``) are imported by the server, not by this process, and are
    there in each rank forked from it; one whose import raises is skipped."""
    host = tmp_path / "host.py"
    host.write_text(SERVER_HOST)
    (tmp_path / "broken_library.py").write_text('raise RuntimeError("built for another torch")\n')
    err = tmp_path / "stderr.txt"
    done = subprocess.run([sys.executable, str(host), str(err)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["first"]["threads"] == 1
    assert got["forked"]["threads"] == got["spawned"]["threads"]
    assert err.read_text().count("a rank's stderr") == 2  # the forked rank's and the spawned's
    assert got["server_ignores_sigint"]
    assert got["forked"]["gpubench"] == got["spawned"]["gpubench"] == got["gpubench"]
    # A workload's declared imports: made once in the server, there in each forked rank; one
    # that fails to import is skipped, and the server still serves.
    assert got["first"]["start_method"] == "forkserver"
    assert got["first"]["preloaded"] and got["forked"]["preloaded"]
    assert not got["spawned"]["preloaded"]


def test_a_group_after_the_fork_server_died_starts_another():
    from multiprocessing import forkserver

    with WorkerGroup(1, Surroundings, start_method="forkserver"):
        pass
    dead = forkserver._forkserver._forkserver_pid
    os.kill(dead, signal.SIGKILL)
    os.waitid(os.P_PID, dead, os.WEXITED | os.WNOWAIT)  # ended, not reaped
    with WorkerGroup(1, Surroundings, start_method="forkserver") as group:
        assert group.start_method == "forkserver" and group.call("read")[0]["var"] is None
    assert forkserver._forkserver._forkserver_pid not in (None, dead)


def test_cpu_cases_fork_their_ranks_cuda_cases_and_worker_environments_spawn_them():
    assert start_method("cpu") == "forkserver"
    assert start_method("cpu", {}) == "forkserver"
    assert start_method("cuda") == "spawn"
    assert start_method("cpu", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == "spawn"
    with pytest.raises(ValueError, match="start it with spawn"):
        WorkerGroup(1, Surroundings, start_method="forkserver", env={"X": "1"})
    with pytest.raises(ValueError, match="spawn, forkserver; got 'fork'"):
        WorkerGroup(1, Surroundings, start_method="fork")
