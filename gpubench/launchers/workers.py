"""Worker processes for multi-process cases: one per rank, driven by commands over pipes.

The parent hosts the rendezvous store on a port the OS picks, so two suites started at once
never collide. The store listens on the loopback address only (a socket bound to 127.0.0.1
whose descriptor the store takes over), and the ranks pin gloo and NCCL to the loopback
interface: a single-host case opens no port to the network. (Multi-node jobs under
``torchrun``, ``gpubench dist``, use the interfaces the user configures.)

A rank that raises reports its traceback and the whole group fails at once; a rank that does
not answer within the timeout fails the group too; a rank that dies is reported with its exit
status or signal. Ranks die with their parent (parent-death signal plus a watchdog, armed
before the rank imports torch), so no worker process outlives the group, whatever kills it.
"""

from __future__ import annotations

import datetime
import multiprocessing.connection as mpc
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from gpubench.util.signals import describe_exit, guarded_call

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a command may take on every rank before the group is declared hung."""

START_TIMEOUT_S = 180.0
"""Seconds for workers to start (import torch, build the model, join the process group)."""

REPORT_GRACE_S = 5.0
"""Seconds (at most half the timeout) the host waits past a command's timeout for the ranks'
reports: a rank whose collective timed out (the process group has the same timeout) then says
so, and the message names the ranks it waited for (the hung ones), not every rank."""

LOOPBACK = "127.0.0.1"

STAGES = {
    "spawning": "starting (Python, importing torch and the rank program)",
    "joining": "joining the process group",
    "building": "building its program (model, data, optimizer)",
}
"""Start-up stages a rank reports, in order, with what it is doing in each."""


REBUILD = "__rebuild__"
"""The command that replaces a rank's program (``WorkerGroup.rebuild``)."""


START_METHODS = ("spawn", "forkserver")
"""How a ``WorkerGroup`` starts its processes (``start_method``)."""

SERVER_PRELOAD = ("gpubench.launchers.server", "torch", "torch._dynamo", "torchvision",
                  "transformers", "gpubench.measure.protocol")
"""Modules the fork server imports once, where this process has imported them (the first
always), with the transformers models this process has imported: each process forked from it
then starts with them imported. Started afresh, a rank spends 2-3 s of CPU importing torch on a
2-core machine, 2 s more on ``torch._dynamo`` (``import_lazy_modules``) and 2-3 s more on
transformers' BERT: more than a smoke case's whole measurement."""

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Variables torch reads once, as it is imported (the second, where set, wins): kept out of the
fork server's environment, so that a process forked from it starts with torch's own thread
count, and given to it by ``torch.set_num_threads`` where the starting process has them set
(``_rank_main``)."""

_SERVER_LOCK = threading.Lock()


def start_method(device: str, env: dict[str, str] | None = None) -> str:
    """How the processes of a case on ``device`` start: forked from a fork server that has
    imported torch (``forkserver``, ``SERVER_PRELOAD``) for CPU cases with no environment of
    their own on Linux; spawned (a fresh interpreter that imports torch itself) for CUDA
    cases, whose processes start CUDA after settings they may have to have in place before
    torch is imported (``RunConfig.worker_env``), and wherever there is no fork server."""
    if (device == "cpu" and not env and sys.platform.startswith("linux")
            and "forkserver" in mp.get_all_start_methods()):
        return "forkserver"
    return "spawn"


_WORKLOAD_IMPORTS: set[str] = set()
"""Modules the fork server imports besides ``_preload``'s, whether this process has imported
them or not (``preload_workload_imports``): named to it in ``SERVER_IMPORTS_ENV``, imported by
its first module (``gpubench.launchers.server``), where one that fails, however, is skipped
(the preload's own imports stop the server at any error but ImportError)."""

SERVER_IMPORTS_ENV = "GPUBENCH_SERVER_IMPORTS"
"""The variable that names ``_WORKLOAD_IMPORTS`` to a fork server as it starts (comma-separated;
not passed on to the processes it forks)."""


def preload_workload_imports(modules) -> None:
    """Have the fork server, when it starts, import ``modules`` too (a run's workloads'
    ``Workload.imports`` for the cases it will run in forked ranks): each rank then starts
    with its model's library imported, where this process had not imported it yet when the
    server started (BERT's DDP cases after ResNet's started it). A server running already
    keeps its modules."""
    _WORKLOAD_IMPORTS.update(modules)


def _preload() -> list[str]:
    models = sorted(m for m in sys.modules
                    if m.startswith("transformers.models.") and ".modeling_" in m)
    return [SERVER_PRELOAD[0], *(m for m in SERVER_PRELOAD[1:] if m in sys.modules), *models]


def _server_ready() -> None:
    """What the fork server's first process runs: nothing (``_ensure_server``)."""


def _ensure_server(ctx, timeout_s: float) -> int | None:
    """The pid of the fork server, started now where it is not running (with ``_preload``'s
    modules and without ``THREAD_VARS`` in its environment) and ready: its first process,
    which waits for its imports, ended within ``timeout_s``. None where it did not (the server
    is stopped; the caller spawns its processes instead)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    with _SERVER_LOCK:
        pid = getattr(server, "_forkserver_pid", None)
        if pid is not None and _running(pid):
            return pid
        ctx.set_forkserver_preload(_preload())
        saved = {k: os.environ.pop(k) for k in (*THREAD_VARS, "PYTHONPATH") if k in os.environ}
        # The server imports the preload from this process's path (Python 3.11's server does
        # not take it), so that it has this process's gpubench, not another one installed.
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        os.environ[SERVER_IMPORTS_ENV] = ",".join(sorted(_WORKLOAD_IMPORTS))
        try:
            server.ensure_running()
        finally:
            os.environ.pop("PYTHONPATH")
            os.environ.pop(SERVER_IMPORTS_ENV)
            os.environ.update(saved)
        pid = server._forkserver_pid
        first = ctx.Process(target=_server_ready, name="gpubench-fork-server-ready")
        waiter = threading.Thread(target=lambda: (first.start(), first.join()), daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        if waiter.is_alive() or first.exitcode != 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return None
        return pid


def _running(pid: int) -> bool:
    """Whether child process ``pid`` is running, leaving it to be reaped where it has ended
    (by ``ensure_running``, which restarts the server then)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


class InheritedFd:
    """A file descriptor of this process, given to a process forked from the fork server as a
    descriptor of its own (pickled while it starts; an ``int`` there)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return _detach_fd, (DupFd(self.fd),)


def _detach_fd(dup) -> int:
    return dup.detach()


class WorkerError(RuntimeError):
    """A rank failed; the message carries its traceback."""


class WorkerTimeout(WorkerError):
    """A rank did not answer in time."""


def _is_timeout(error_line: str) -> bool:
    """Whether a rank's last error line is a collective or store that timed out (gloo "Timed
    out waiting ...", NCCL's watchdog "... timeout", c10d's ``DistStoreError``)."""
    text = error_line.lower()
    return "timed out" in text or "timeout" in text


def loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return next((n for n in names if n.startswith("lo")), "lo")


def pin_to_loopback() -> None:
    """Make gloo and NCCL in this process use the loopback interface only (single host)."""
    iface = loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    os.environ["NCCL_SOCKET_IFNAME"] = iface


def loopback_store(timeout_s: float) -> dist.TCPStore:
    """A master ``TCPStore`` on a free port that listens on 127.0.0.1 only (``TCPStore`` on
    its own binds every interface)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(128)
        store = dist.TCPStore(LOOPBACK, sock.getsockname()[1], is_master=True,
                              wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s),
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns and closes the descriptor now
    return store


def rank_device(backend: str, rank: int) -> dict:
    """A spawned NCCL rank's own GPU (ranks of one machine: rank ``r`` on ``cuda:r``), made the
    current device *before* its process group forms and given to ``init_process_group`` as
    ``device_id``: NCCL's communicator is then bound to that device (formed eagerly on it)
    instead of guessing one from the current device, cuda:0 for every rank, which puts all of
    their contexts on one GPU. Gloo (CPU) ranks: nothing."""
    if backend != "nccl":
        return {}
    import torch

    torch.cuda.set_device(rank)
    return {"device_id": torch.device("cuda", rank)}


def set_run_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` here and in every worker process started after
    (``OMP_NUM_THREADS``, which torch reads as it starts): a multi-process case's paired
    baseline worker, a case in a process of its own. A multi-process case's ranks split the
    machine's cores instead (``CaseProgram``)."""
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


_COMMANDED = False
"""True in a ``WorkerGroup``'s rank process: it runs the commands its host sends, and the host
runs the timed rounds (``commanded``)."""


def commanded() -> bool:
    """Whether this process is a ``WorkerGroup`` rank, stepped by its host (the rounds, their
    stopping rule and statistics run there, not here)."""
    return _COMMANDED


def _collective_timeout_setter() -> Callable[[datetime.timedelta], None] | None:
    """torch's setter of the default process group's timeout for the collectives to come
    (``torch.distributed.set_timeout``; ``_set_pg_timeout`` before it was public), or None
    where this torch has neither."""
    return (getattr(dist, "set_timeout", None)
            or getattr(dist.distributed_c10d, "_set_pg_timeout", None))


def _rank_main(conn, payload: bytes) -> None:
    """A rank, once ``guarded_call`` has armed its parent-death watch: join the process group,
    build ``factory(rank, world_size, *args)``, then run commands until "stop"."""
    global _COMMANDED
    _COMMANDED = True
    try:
        (rank, world_size, port, backend, factory, args, timeout_s, start_timeout_s,
         forked) = pickle.loads(payload)
        if forked:  # from the fork server, whose torch was imported without THREAD_VARS
            threads = os.environ.get("MKL_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
            if threads and threads.strip().isdigit() and int(threads) > 0:
                import torch

                torch.set_num_threads(int(threads))
        pin_to_loopback()
        conn.send(("stage", "joining"))
        # Joining and building (DDP's first broadcast, FSDP's sharding) wait for the slowest
        # rank's start, which the host bounds by ``start_timeout_s``: a spawned rank that
        # imports torch seconds after the others must not fail the group at a short
        # ``timeout_s``, which bounds the commands' collectives from then on.
        shorten = _collective_timeout_setter()
        join_s = max(timeout_s, start_timeout_s) if shorten else timeout_s
        store = dist.TCPStore(LOOPBACK, port, is_master=False,
                              timeout=datetime.timedelta(seconds=join_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=join_s),
                                **rank_device(backend, rank))
        conn.send(("stage", "building"))
        handler = factory(rank, world_size, *args)
        if join_s != timeout_s:
            shorten(datetime.timedelta(seconds=timeout_s))
            store.set_timeout(datetime.timedelta(seconds=timeout_s))
        conn.send(("ok", None))
        while True:
            command, payload = conn.recv()
            if command == "stop":
                break
            if command == REBUILD:  # a new program in this rank (WorkerGroup.rebuild)
                close = getattr(handler, "close", None)
                handler = None
                if close is not None:
                    close()
                factory, args = payload
                handler = factory(rank, world_size, *args)
                conn.send(("ok", None))
                continue
            conn.send(("ok", getattr(handler, command)(*payload)))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
        os._exit(1)  # skip teardown that could block on peers that are gone


class WorkerGroup:
    """``world_size`` processes, each running ``factory(rank, world_size, *args)``, the object
    whose methods ``call`` invokes on every rank.

    ``factory`` and ``args`` must pickle (the ranks are not forked from this process).
    ``env``: variables set in each rank before it imports torch (``guarded_call``), e.g. the
    CUDA allocator's settings (``RunConfig.worker_env``); this process's environment is left as
    it is. ``start_method`` (``START_METHODS``, see ``start_method``): "spawn", a fresh
    interpreter per rank; "forkserver", each rank forked from a server that imported torch
    once, given this process's environment, ``sys.path`` and working directory (and no
    ``env``: what torch reads as it is imported was read in the server)."""

    def __init__(self, world_size: int, factory: Callable[..., Any], args: tuple = (), *,
                 backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
                 start_timeout_s: float = START_TIMEOUT_S, env: dict[str, str] | None = None,
                 start_method: str = "spawn"):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer; got {world_size!r}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}; "
                             f"got {start_method!r}")
        if start_method == "forkserver" and env:
            raise ValueError("a forked rank cannot take variables torch reads as it is "
                             f"imported ({', '.join(sorted(env))}): start it with spawn")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.start_method = start_method
        self.conns, self.procs = [], []
        self.stages: list[str] = []
        self.store = loopback_store(timeout_s)
        try:
            server = None
            if start_method == "forkserver":
                server = _ensure_server(mp.get_context("forkserver"), start_timeout_s)
                self.start_method = start_method = "forkserver" if server else "spawn"
            ctx = mp.get_context(start_method)
            forked = server is not None
            # The kernel's parent-death signal follows the thread that starts the child: only
            # use it when that thread lives as long as the process (a forked rank's parent is
            # the fork server's only thread; it watches this process too).
            main_thread = forked or threading.current_thread() is threading.main_thread()
            state = None
            if forked:
                state = {"host": os.getpid(), "environ": dict(os.environ),
                         "stdout": InheritedFd(1), "stderr": InheritedFd(2)}
            for rank in range(world_size):
                parent, child = ctx.Pipe()
                payload = pickle.dumps((rank, world_size, self.store.port, backend, factory,
                                        args, timeout_s, start_timeout_s, forked))
                proc = ctx.Process(
                    target=guarded_call,
                    args=(server if forked else os.getpid(), main_thread,
                          f"{__name__}:_rank_main", child, payload),
                    kwargs={"env": dict(env or {}), "state": state},
                    name=f"gpubench-rank{rank}",
                )
                # Tracked before it starts: an interrupt right after start() must not leave
                # an untracked rank for multiprocessing's exit handler to wait on forever.
                self.conns.append(parent)
                self.procs.append(proc)
                self.stages.append("spawning")
                # Spawned with SIGINT blocked (the mask survives fork and exec): a Ctrl-C while
                # the rank's interpreter starts, before guarded_call ignores it, would print
                # Python's fatal start-up error. The parent answers the Ctrl-C: blocked in this
                # thread for the spawn only, it stays pending and is not lost. (A forked rank
                # has the fork server's SIGINT, ignored: ``gpubench.launchers.server``.)
                mask = None if forked else signal.pthread_sigmask(signal.SIG_BLOCK,
                                                                  {signal.SIGINT})
                try:
                    proc.start()
                finally:
                    if mask is not None:
                        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                child.close()
            # the grace: a rank whose build's collective timed out waiting for another says so
            self._collect("start", start_timeout_s,
                          grace_s=min(REPORT_GRACE_S, 0.5 * start_timeout_s))
        except BaseException:
            self.close(graceful=False)
            raise

    def call(self, command: str, *payload: Any, timeout_s: float | None = None) -> list[Any]:
        """Run ``command`` on every rank; return the results in rank order."""
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((command, payload))
            except (BrokenPipeError, OSError):
                self._fail_dead_rank(rank, command)
        limit = self.timeout_s if timeout_s is None else timeout_s
        return self._collect(command, limit, grace_s=min(REPORT_GRACE_S, 0.5 * limit))

    def rebuild(self, factory: Callable[..., Any], args: tuple = ()) -> None:
        """Close each rank's program (its ``close``, if any) and build
        ``factory(rank, world_size, *args)`` in its place, in the same processes and process
        group: the next case of a run without starting, importing and joining again (about 3
        s per case on a 2-core machine)."""
        self.call(REBUILD, factory, args)

    @property
    def alive(self) -> bool:
        """Whether the ranks are running (a failure or ``close`` stops them all)."""
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def _exit_status(self, rank: int) -> str:
        proc = self.procs[rank]
        proc.join(5)  # the pipe closes a moment before the exit status is known
        status = describe_exit(proc.exitcode)
        if self.start_method == "forkserver" and proc.exitcode == 255:
            status += " (or the fork server it came from ended, which leaves it unknown)"
        return status

    def _fail_dead_rank(self, rank: int, command: str):
        status = self._exit_status(rank)
        self.close(graceful=False)
        raise WorkerError(f"rank {rank} {status} during {command!r} without a report") from None

    def _start_culprits(self, pending: dict) -> list[int]:
        """The pending ranks at the earliest start-up stage: those the others wait for."""
        order = list(STAGES)
        earliest = min(order.index(self.stages[r]) for r in pending)
        return [r for r in sorted(pending) if order.index(self.stages[r]) == earliest]

    def _collect(self, command: str, timeout_s: float, grace_s: float = 0.0) -> list[Any]:
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s + grace_s
        pending = dict(enumerate(self.conns))
        while pending:
            remaining = deadline - time.monotonic()
            ready = mpc.wait(list(pending.values()), timeout=max(0.0, remaining))
            if not ready:
                raise self._timeout(command, timeout_s, pending)
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    self._fail_dead_rank(rank, command)
                if status == "stage":
                    self.stages[rank] = value
                    continue
                if status == "error":
                    raise self._failure(command, rank, value, pending)
                results[rank] = value
                del pending[rank]
        return [results[r] for r in range(self.world_size)]

    def _timeout(self, command: str, timeout_s: float, pending: dict) -> WorkerTimeout:
        self.close(graceful=False)
        if command != "start":
            return WorkerTimeout(
                f"rank(s) {', '.join(map(str, sorted(pending)))} did not finish "
                f"{command!r} within {timeout_s:g} s (hung?); all workers stopped"
            )
        culprits = self._start_culprits(pending)
        waiting = [r for r in sorted(pending) if r not in culprits]
        stage = STAGES[self.stages[culprits[0]]] if culprits else "?"
        msg = (f"rank(s) {', '.join(map(str, culprits))} did not start within {timeout_s:g} s "
               f"(stuck {stage}; hung?)")
        if waiting:
            msg += f"; rank(s) {', '.join(map(str, waiting))} waited for it"
        return WorkerTimeout(msg + "; all workers stopped")

    def _failure(self, command: str, rank: int, tb: str, pending: dict) -> WorkerError:
        culprits = self._start_culprits(pending) if command == "start" else []
        self.close(graceful=False)
        last = tb.strip().splitlines()[-1] if tb.strip() else ""
        if command == "start" and self.stages[rank] == "joining" and rank not in culprits:
            # A healthy rank gave up waiting in the process group for one that never came.
            lagging = ", ".join(map(str, culprits))
            return WorkerTimeout(
                f"rank(s) {lagging} did not start (stuck {STAGES[self.stages[culprits[0]]]}); "
                f"rank {rank} gave up waiting for it to join the process group: {last}"
            )
        silent = [r for r in sorted(pending) if r != rank]
        if silent and _is_timeout(last):
            # A collective timed out on this rank while others had not answered: they hung
            # (stopped, deadlocked; in the start, in their build, which DDP's first broadcast
            # waits for), this rank only gave up waiting for them.
            what = (f"did not start (stuck {STAGES[self.stages[silent[0]]]}; hung?)"
                    if command == "start" else f"did not finish {command!r} (hung?)")
            return WorkerTimeout(
                f"rank(s) {', '.join(map(str, silent))} {what}; "
                f"rank {rank} gave up waiting for it in a collective: {last}")
        return WorkerError(f"rank {rank} failed during {command!r}:\n{tb}")

    def close(self, graceful: bool = True) -> None:
        """Stop every worker: ask politely (``graceful``), then terminate, then kill."""
        started = [(c, p) for c, p in zip(self.conns, self.procs, strict=False)
                   if p.pid is not None]  # an interrupt can come between tracking and start
        procs = [p for _, p in started]
        for conn, proc in started:
            if graceful and proc.is_alive():
                try:
                    conn.send(("stop", ()))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + (5 if graceful else 0)
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(10)  # a forked rank's status comes from the fork server
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(graceful=exc_type is None)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]
