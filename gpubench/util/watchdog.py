"""Time limits for work done in this process: an in-process case's commands (its build, data,
check, steps) and a workload's validation are bounded like a rank's commands, by ``--timeout``.

A call that hangs in the main thread cannot, in general, be interrupted from Python: a signal's
Python handler runs only between the main thread's bytecodes, so a call blocked in C code that
retries after the signal (a C++ condition variable, a library's socket read) or that spins while
holding the GIL never returns to it. ``time_limit`` therefore stops in three stages:

1. at the limit, SIGALRM (``setitimer``; again from the watchdog thread to the main thread a
   moment later, should the process have handed the first to another thread, or the block
   swallowed the exception) runs a handler in the main thread that raises ``error`` with one
   line naming what hung and the limit. A sleep, a lock, ``Event.wait``, a queue, a
   socket read in Python, a Python loop, a DataLoader waiting for its workers: all end here,
   the case fails with that line and the run goes on;
2. ``grace_s`` later, if the main thread is still inside the block (it could not be interrupted,
   or it swallowed the exception), a watchdog thread writes that line and every thread's stack
   to the terminal and ends the process with status ``EXIT_HUNG`` (124): a process that cannot
   be unblocked is better ended than left hanging (its rank and loader processes die with it;
   the results of the cases that finished are on disk already);
3. a C-level ``faulthandler`` timer, armed further out, does the same (its stacks, exit status
   1) where even the watchdog thread cannot run: C code that blocks while holding the GIL.

A limit costs two ``setitimer`` calls and a signal handler swap (about 10 us); the faulthandler
timer is re-armed only when its deadline comes near (its thread costs ~0.2 ms to start) and is
cancelled once no limit has been active for a moment. Limits apply in the main thread only
(elsewhere the block runs unbounded) and do not nest (an inner one runs under the outer one's).
A ``faulthandler_timeout`` of pytest's own would be cancelled by stage 3's timer.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import stat
import sys
import threading
import time

try:  # the C function under signal.signal, without its enum conversions (~10 us a call)
    from _signal import signal as _set_handler
except ImportError:  # pragma: no cover - not CPython
    _set_handler = signal.signal

EXIT_HUNG = 124
"""Exit status of a process ended by stage 2 (the convention of ``timeout(1)``)."""

GRACE_S = 10.0
"""Seconds between the soft stop (the exception) and the hard one (the process ends)."""

FAULT_MARGIN_S = 5.0
"""Seconds the faulthandler timer (stage 3) leaves after stage 2 and after a limit ends."""

POLL_S = 0.25
"""How often the watchdog thread looks at the active limit."""

IDLE_CANCEL_S = 1.0
"""Seconds without an active limit after which the faulthandler timer is cancelled."""


class Hung(TimeoutError):
    """A block under ``time_limit`` ran past its limit (the default ``error``)."""


class _Limit:
    __slots__ = ("deadline", "done", "grace_s", "kicked", "message")

    def __init__(self, deadline: float, message: str, grace_s: float):
        self.deadline, self.message, self.grace_s = deadline, message, grace_s
        self.done = self.kicked = False


_lock = threading.Lock()
_active: _Limit | None = None
_last_end = 0.0
_fault_until = 0.0  # monotonic time at which the faulthandler timer fires; 0: not armed
_watcher: threading.Thread | None = None
_report_fd: int | None = None


def _captured(fd: int) -> bool:
    """Whether ``fd`` is a deleted regular file (pytest's capture of stdout/stderr): what is
    written there is lost when the process ends abruptly."""
    try:
        st = os.fstat(fd)
    except OSError:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 0


def keep_stderr() -> None:
    """Keep a copy of this process's stderr while it is the terminal (or a log), for the
    messages of stages 2 and 3: under pytest, file descriptor 2 is a capture file during a
    test, whose content an ended process loses. Called on the first ``time_limit`` (under
    pytest that is the workloads' validation, at configure time, before any capture)."""
    global _report_fd
    if _report_fd is None and not _captured(2):
        try:
            _report_fd = os.dup(2)
        except OSError:
            pass


def _fd() -> int:
    return _report_fd if _report_fd is not None else 2


def _write(text: str) -> None:
    try:
        os.write(_fd(), text.encode(errors="replace"))
    except OSError:
        pass


def _hard_stop(limit: _Limit) -> None:
    """Stage 2: the line, every thread's stack, and the end of this process."""
    _write(f"gpubench: {limit.message}; it could not be interrupted (blocked outside Python?), "
           f"so this process stops now (exit status {EXIT_HUNG}); the stacks of its threads "
           "follow\n")
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(file=_fd(), all_threads=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_HUNG)


def _watch() -> None:
    global _fault_until
    while True:
        time.sleep(POLL_S)
        limit, now = _active, time.monotonic()
        if limit is not None and not limit.done and now > limit.deadline + limit.grace_s:
            _hard_stop(limit)
        if limit is not None and not limit.done and not limit.kicked \
                and now > limit.deadline + POLL_S:
            # The timer's SIGALRM went to the process, which may hand it to another thread:
            # this one goes to the main thread, whose blocked call it interrupts.
            limit.kicked = True
            with contextlib.suppress(Exception):
                signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
        if _fault_until and _active is None and now - _last_end > IDLE_CANCEL_S:
            with _lock:
                if _active is None and _fault_until:  # no limit began meanwhile
                    faulthandler.cancel_dump_traceback_later()
                    _fault_until = 0.0


def _ensure_watcher() -> None:
    global _watcher
    if _watcher is None or not _watcher.is_alive():
        _watcher = threading.Thread(target=_watch, name="gpubench-watchdog", daemon=True)
        _watcher.start()


def _ensure_fault_timer(span: float, now: float) -> None:
    """Stage 3 fires no sooner than ``span`` seconds from ``now`` (at most 2 ``span``): it is
    re-armed only when it would fire sooner. Call with ``_lock`` held."""
    global _fault_until
    if _fault_until < now + span:
        faulthandler.dump_traceback_later(2 * span, exit=True, file=_fd())
        _fault_until = now + 2 * span


def is_time_limit(err: BaseException) -> bool:
    """Whether ``err`` is the stop of a ``time_limit`` (which code that turns other errors into
    its own must let through)."""
    return getattr(err, "gpubench_time_limit", False) is True


@contextlib.contextmanager
def time_limit(seconds: float | None, message: str, *, error: type[BaseException] = Hung,
               grace_s: float | None = None):
    """Run the block within ``seconds`` (None or 0: no limit): past it, ``error(message)`` is
    raised in the block, and ``grace_s`` (default ``GRACE_S``) later this process ends if the
    block is still running (see the module docstring). ``message`` is one line saying what
    did not finish in time."""
    global _active, _last_end
    if (not seconds or _active is not None or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    grace = GRACE_S if grace_s is None else grace_s
    keep_stderr()
    start = time.monotonic()
    limit = _Limit(start + seconds, message, grace)

    def on_alarm(signum, frame):
        # A late signal (the watchdog's, meant for a limit that ended) finds a later deadline.
        if not limit.done and time.monotonic() >= limit.deadline - 0.01:
            stop = error(message)
            stop.gpubench_time_limit = True  # what ``is_time_limit`` looks for
            raise stop

    previous = _set_handler(signal.SIGALRM, on_alarm)
    _active, earlier = limit, 0.0
    try:
        with _lock:
            _ensure_fault_timer(seconds + 2 * grace + FAULT_MARGIN_S, start)
        _ensure_watcher()
        earlier, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            limit.done = True
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        limit.done = True
        _active = None
        _set_handler(signal.SIGALRM, previous)
        now = _last_end = time.monotonic()
        if earlier:  # someone else's alarm was pending: it keeps what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, earlier - (now - start)))
        if _fault_until and _fault_until - now < FAULT_MARGIN_S:
            with _lock:  # the unbounded code that follows gets its margin too
                _ensure_fault_timer(FAULT_MARGIN_S, now)


@contextlib.contextmanager
def exit_after(seconds: float, message, *, code: int = EXIT_HUNG):
    """End this process with ``code`` if the block is still running ``seconds`` from now,
    after writing ``message()`` (one line, computed then) to stderr: for a call blocked in C
    code that no exception can reach (a socket read inside a library), in any thread."""
    done = threading.Event()
    # Held by the watch from its last look at ``done`` to the end of the process, and taken
    # by the block's end to set ``done``: one of the two reports, never both (a block that
    # fails just as the watch wakes waits here for the process to end with the watch's line).
    reporting = threading.Lock()
    keep_stderr()

    def watch() -> None:
        if done.wait(seconds):
            return
        try:
            text = message()
        except Exception as err:  # noqa: BLE001 - the process ends either way
            text = f"gpubench: stopped after {seconds:g} s ({type(err).__name__}: {err})"
        reporting.acquire()  # never released: the process ends here, or the block reports
        if done.is_set():
            return
        _write(text.rstrip("\n") + "\n")
        os._exit(code)

    threading.Thread(target=watch, name="gpubench-exit-after", daemon=True).start()
    try:
        yield
    finally:
        with reporting:
            done.set()
