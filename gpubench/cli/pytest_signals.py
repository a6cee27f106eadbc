"""pytest plugin that ``gpubench run`` loads into its pytest child (``-p
gpubench.cli.pytest_signals``,
with ``GPUBENCH_PARENT_PID`` set); inert otherwise.

- SIGTERM stops pytest like Ctrl-C (``KeyboardInterrupt``): the running case's ranks and workers
  are stopped in order (the cases that finished are on disk already, ``gpubench.measure.journal``).
- Once the session is finishing (pytest-benchmark measuring the machine and writing its JSON),
  SIGINT and SIGTERM are held until pytest exits: an interrupt then cannot lose the results, nor
  interrupt pytest's own clean-up with a traceback (``gpubench run``, which received the signal,
  still reports it and keeps the finished cases).
- pytest follows the death of ``gpubench run`` at once (SIGKILL: nothing is left to save, and
  nobody is left to read a traceback; its ranks and workers follow it).
- pytest-benchmark's own notes on stderr (where it wrote the JSON, that it saved nothing) are
  left out: ``gpubench run`` reports the outcome in one line; so is a traceback of pytest's own
  failing to describe where the interrupt landed.
"""

from __future__ import annotations

import os
import signal
import threading
import warnings

import pytest

from gpubench.util.signals import PARENT_PID_ENV, die_with_parent


def _active() -> bool:
    return (os.environ.get(PARENT_PID_ENV, "").isdigit()
            and threading.current_thread() is threading.main_thread())


def _terminate_as_interrupt(signum, frame):
    raise KeyboardInterrupt("gpubench run is stopping")


_CONFIG = None
"""This session's pytest config (``pytest_configure``), for its terminal reporter."""


def pytest_configure(config) -> None:
    global _CONFIG
    if not _active():
        return
    _CONFIG = config
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    die_with_parent(int(os.environ[PARENT_PID_ENV]), signal.SIGKILL)
    # gpubench run says itself what was written and kept: pytest-benchmark's "Wrote benchmark
    # data in: <hidden staging folder>" and "Not saving anything, no benchmarks have been run!"
    # (an interrupt before any case finished) would be stray lines on its stderr.
    warnings.filterwarnings("ignore", message="Not saving anything, no benchmarks have been run")


@pytest.hookimpl(wrapper=True)
def pytest_keyboard_interrupt(excinfo):
    """pytest describes the interrupt's traceback for its summary; a signal that lands inside an
    import (torch's config modules) leaves a frame without a line number, on which pytest's
    description fails (``TypeError``) and a two-part traceback reaches stderr. Here that
    description is skipped: ``gpubench run`` reports the interrupt in its one line. pytest's
    terminal reporter, left without the description, would assert at the session's end that it
    has one (another traceback): its report of the interrupt is switched off too."""
    try:
        return (yield)
    except Exception:  # noqa: BLE001 - pytest's repr of an odd traceback, nothing to report
        if not _active():
            raise
        reporter = (None if _CONFIG is None
                    else _CONFIG.pluginmanager.get_plugin("terminalreporter"))
        if reporter is not None and hasattr(reporter, "_report_keyboardinterrupt"):
            reporter._report_keyboardinterrupt = lambda: None
        return None


def pytest_sessionstart(session) -> None:
    """pytest-benchmark's info lines off (see the module docstring); its table stays."""
    if not _active():
        return
    logger = getattr(getattr(session.config, "_benchmarksession", None), "logger", None)
    if logger is not None and hasattr(logger, "QUIET"):
        logger.level = logger.QUIET


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    if not _active():
        yield
        return
    held: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):  # held until pytest exits: an interrupt during
        signal.signal(s, lambda signum, frame: held.append(signum))  # unconfigure was a traceback
    yield
