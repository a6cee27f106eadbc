"""Process helpers of the tests: how their rank groups start, and for those that start
``gpubench`` in a session of its own, what it leaves behind (imported as ``processes``: the
tests folder is on sys.path)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gpubench.launchers.workers import start_method

FORKED = start_method("cpu")
"""How a test's rank group starts where how ranks start is not what it tests: as a CPU case's
do, forked from the fork server that imported torch once (Linux), where a spawned rank imports
torch and the test's module afresh (about 3.6 s of CPU each)."""


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def wait_gone(sid: int, within_s: float) -> list[int]:
    """The processes of session ``sid`` still alive after waiting up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_session(sid: int) -> None:
    for pid in session_processes(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
