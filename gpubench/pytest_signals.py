"""pytest plugin that ``gpubench run`` loads into its pytest child (``-p gpubench.pytest_signals``,
with ``GPUBENCH_PARENT_PID`` set); inert otherwise.

- SIGTERM stops pytest like Ctrl-C (``KeyboardInterrupt``), so that the cases that finished are
  still written by pytest-benchmark instead of being lost with the process.
- Once the session is finishing (pytest-benchmark measuring the machine and writing its JSON),
  SIGINT and SIGTERM are held until it is done: an interrupt then cannot lose the results.
- pytest follows the death of ``gpubench run`` (SIGTERM, then SIGKILL if it lingers).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from gpubench.signals import PARENT_PID_ENV, die_with_parent, signal_name


def _active() -> bool:
    return (os.environ.get(PARENT_PID_ENV, "").isdigit()
            and threading.current_thread() is threading.main_thread())


def _terminate_as_interrupt(signum, frame):
    raise KeyboardInterrupt(f"gpubench: stopping on {signal_name(signum)}")


def pytest_configure(config) -> None:
    if not _active():
        return
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    die_with_parent(int(os.environ[PARENT_PID_ENV]), signal.SIGTERM)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    if not _active():
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
