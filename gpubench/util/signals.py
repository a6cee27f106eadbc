"""Process lifetimes: children that die with their parent, and signals forwarded to a child.

Light on purpose (no torch, no pandas): a rank imports this module first thing after it is
spawned, so that it follows its parent's death even while it is still importing torch.

- ``die_with_parent`` makes the calling process exit soon after ``parent_pid`` exits: the
  kernel's parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``) plus a watchdog thread that
  polls ``os.getppid()`` (other systems, and a second line of defence).
- ``run_forwarding_signals`` runs a command in its own process group, forwards SIGINT and
  SIGTERM to it, waits for it and kills whatever is left of its group.
- ``exit_despite_stray_threads`` keeps a thread the run left behind (a workload's non-daemon
  thread) from holding the process alive once the run is over.
- ``gpubench.cli.pytest_signals`` is the pytest side of ``gpubench run``.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "GPUBENCH_PARENT_PID"
"""Set by ``gpubench run`` for its pytest child: the pid whose death ends the pytest run."""

FORWARDED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; ``exit_code`` is the shell convention 128 + signal number.

    A ``BaseException``, as ``KeyboardInterrupt`` is: raised by a signal handler wherever the
    main thread happens to be, it must pass through code that handles ``Exception`` (matplotlib
    imports its 3-D axes inside ``except Exception`` and turns any error there into a
    warning)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


def exception_chain(err: BaseException | None):
    """``err``, then the exceptions it was raised from or while handling (``__cause__``, else
    ``__context__``), each once."""
    seen = set()
    while err is not None and id(err) not in seen:
        yield err
        seen.add(id(err))
        err = err.__cause__ or err.__context__


def interruption(err: BaseException) -> Interrupted | None:
    """The ``Interrupted`` that ``err`` is, or that caused it: Python wraps an exception raised
    while a class is made in a ``RuntimeError`` ("Error calling __set_name__", 3.11), and a
    library may raise its own error from one, so a signal that landed there reaches the
    command as another exception with the interruption as its cause or context."""
    return next((e for e in exception_chain(err) if isinstance(e, Interrupted)), None)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(code: int | None) -> str:
    """A process exit code (``Popen.returncode``/``Process.exitcode``) in words."""
    if code is None:
        return "is still running"
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    return f"exited with status {code}"


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL, *, poll_s: float = 0.25,
                    use_pdeathsig: bool = True, grace_s: float = 10.0,
                    host_pid: int | None = None) -> None:
    """Make this process receive ``sig`` as soon as ``parent_pid`` (its parent) dies, and
    ``host_pid`` too where given (the process this one works for, when its parent is another:
    a fork server).

    Call it first thing in the child. The kernel signal (Linux) fires even while the child is
    busy in C code; note that it follows the parent *thread* that started the child, so pass
    ``use_pdeathsig=False`` when that thread may end before the parent process. The watchdog
    thread notices a re-parenting, or the host's end, within ``poll_s``; if ``sig`` was caught
    and the process is still alive ``grace_s`` later, it is killed outright."""
    if use_pdeathsig:
        _set_pdeathsig(sig)
    host_fd = None  # a pidfd of the host, readable once it has ended; None: polled by pid
    if host_pid is not None:
        try:
            host_fd = os.pidfd_open(host_pid)
        except ProcessLookupError:
            os.kill(os.getpid(), sig)
        except (AttributeError, OSError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os.kill(os.getpid(), sig)

    def host_alive() -> bool:
        if host_pid is None:
            return True
        if host_fd is not None:
            return not select.select([host_fd], [], [], 0)[0]
        try:
            os.kill(host_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def watch() -> None:
        while os.getppid() == parent_pid and host_alive():
            time.sleep(poll_s)
        os.kill(os.getpid(), sig)
        time.sleep(grace_s)
        os._exit(128 + int(sig))

    threading.Thread(target=watch, name="gpubench-parent-watchdog", daemon=True).start()


def leave_fork_server() -> None:
    """In a process forked from ``multiprocessing``'s fork server: close its copy of the
    server's "alive" pipe, which the server waits on to exit once no process that may use it is
    left: the server then exits with the process that started it, and a process whose
    parent-death signal follows the server (``die_with_parent``) dies with it."""
    from multiprocessing import forkserver

    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        forkserver._forkserver._forkserver_alive_fd = None
        try:
            os.close(fd)
        except OSError:
            pass


def guarded_call(parent_pid: int, use_pdeathsig: bool, target: str, *args,
                 env: dict[str, str] | None = None, state: dict | None = None) -> None:
    """Spawned-process entry point: SIGINT ignored (the parent answers a Ctrl-C and stops it),
    ``die_with_parent(parent_pid)`` (SIGKILL), then set ``env`` in ``os.environ``, then import
    ``target`` ("module:function") and call it with ``args``. Passing this function as a
    ``multiprocessing`` target keeps heavy imports after the parent-death watch is armed, and
    after ``env`` is in place: settings read when torch is imported or CUDA starts
    (``PYTORCH_CUDA_ALLOC_CONF``) see it.

    ``state``, for a process forked from a fork server started earlier (whose environment and
    standard output and error it would otherwise have): ``host`` (the pid of the process that
    started this one, which it dies with too), ``environ`` (that process's ``os.environ``
    when it started this one) and ``stdout``/``stderr`` (descriptors of its standard output and
    error then, made this process's). ``multiprocessing`` itself gives it the starting
    process's ``sys.path`` and working directory."""
    # A terminal's Ctrl-C reaches every process of its group: the parent, which stops its
    # workers and says so in one line, answers it; a worker's own traceback would be noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid, signal.SIGKILL, use_pdeathsig=use_pdeathsig,
                    host_pid=None if state is None else state["host"])
    if state is not None:
        leave_fork_server()  # after the signal is armed: the server may exit from here on
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(state[name], fd)
            os.close(state[name])
        os.environ.clear()
        os.environ.update(state["environ"])
    os.environ.update(env or {})
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)(*args)


def run_forwarding_signals(cmd: Sequence[str], *, env: dict | None = None,
                           grace_s: float = 30.0,
                           forward_as: int | None = None) -> tuple[int, int | None]:
    """Run ``cmd`` in its own process group and wait for it; return ``(returncode, signum)``.

    The first SIGINT or SIGTERM received meanwhile goes to the child (only the child: it stops
    its own children), as ``forward_as`` if given (a child that turns SIGTERM into an orderly
    stop, and dies silently from it while still starting, prints no traceback for a Ctrl-C
    that comes while it imports); ``signum`` is the signal received, else None. A second
    signal, or the child
    still running ``grace_s`` after the first, kills the whole group. When the child has exited,
    anything left in its group (orphaned grandchildren) is killed."""
    received: list[int] = []
    proc = subprocess.Popen(cmd, env=env, process_group=0)

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def handler(signum, frame) -> None:
        received.append(signum)
        if len(received) == 1:
            try:
                os.kill(proc.pid, forward_as or signum)
            except ProcessLookupError:
                pass
        else:
            kill_group()

    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED}
    try:
        _wait_unreaped(proc.pid, lambda: bool(received), grace_s, kill_group)
        kill_group()  # leftovers; the unreaped child keeps its group id from being reused
        returncode = proc.wait()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return returncode, (received[0] if received else None)


def _wait_unreaped(pid: int, interrupted, grace_s: float, kill_group) -> None:
    """Wait until ``pid`` exits without reaping it; kill its group ``grace_s`` after
    ``interrupted()`` first turns true."""
    deadline = None
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return
        if info is not None:
            return
        if interrupted():
            deadline = deadline or time.monotonic() + grace_s
            if time.monotonic() > deadline:
                kill_group()
        time.sleep(0.05)


STRAY_GRACE_S = 2.0
"""Seconds the interpreter's own shutdown may spend joining threads before the stray ones are
named and the process ends anyway."""


def stray_threads() -> list[threading.Thread]:
    """The non-daemon threads running besides the main thread and the caller: each one keeps
    the interpreter from exiting until it ends."""
    skip = (threading.main_thread(), threading.current_thread())
    return [t for t in threading.enumerate()
            if t.is_alive() and not t.daemon and t not in skip]


def exit_despite_stray_threads(exit_code: int, *, grace_s: float = STRAY_GRACE_S,
                               what: str = "the run") -> None:
    """Call when ``what`` is over (pytest's ``pytest_unconfigure``): if non-daemon threads are
    still running, a daemon thread waits until the interpreter shuts down (the main thread is
    done), gives them ``grace_s`` to end (a thread pool joined at exit ends there), then names
    the ones left in one warning line on stderr and ends the process with ``exit_code``
    (skipping the rest of the interpreter's shutdown, which would wait for them forever).
    Without such threads it does nothing."""
    if not stray_threads():
        return
    main = threading.main_thread()

    def guard() -> None:
        while main.is_alive():  # the interpreter's shutdown marks the main thread done
            time.sleep(0.05)
        deadline = time.monotonic() + grace_s
        while stray_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = stray_threads()
        if not left:
            return
        counts: dict[str, int] = {}
        for t in left:
            counts[t.name] = counts.get(t.name, 0) + 1
        names = ", ".join(repr(n) + (f" (x{k})" if k > 1 else "") for n, k in counts.items())
        message = (f"gpubench: warning: {what} is over but {len(left)} non-daemon thread(s) "
                   f"it started still run: {names} (a workload's thread?); exiting without "
                   "waiting for them\n")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            os.write(2, message.encode(errors="replace"))
        except OSError:
            pass
        os._exit(exit_code)

    threading.Thread(target=guard, name="gpubench-exit-guard", daemon=True).start()
