import os
import signal
import subprocess
import sys

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _facts_cache(tmp_path_factory):
    """Workload facts cached in the test session's own folder (and its subprocesses', which
    inherit the variable), never in the user's ``~/.cache/gpubench``."""
    os.environ["GPUBENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_reaches_the_commands():
    """A shell without job control starts a background command (``pytest ... &``) with SIGINT
    ignored, and every process it starts inherits that: the tests' commands would not see the
    Ctrl-C those tests send. Caught here, SIGINT is back to its default in each command (exec
    resets a caught signal)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _threads():
    # Two cores: pin threads so tests do not oversubscribe the machine.
    torch.set_num_threads(2)


def pytest_collection_modifyitems(items):
    """A test that reads the shared smoke run is slow: the run takes minutes."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One real ``gpubench run --profile smoke`` (every model, group and parallel form, three
    rounds) for every test that reads a run's files: (its results folder, its stdout)."""
    out = tmp_path_factory.mktemp("smoke")
    proc = subprocess.run(
        [sys.executable, "-m", "gpubench", "run", "--profile", "smoke", "--out", str(out),
         "--rounds", "3", "--data-dir", str(tmp_path_factory.mktemp("data"))],
        capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout
