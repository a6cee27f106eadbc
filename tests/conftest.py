import os
import signal
import subprocess
import sys

import pytest
import torch

_SESSION_DIR = None
_THREADS = 2
"""torch threads of a test (``_threads``): 2 for the 2-core machine, a worker's share of the
cores under pytest-xdist."""


def pytest_configure(config):
    """Before the test modules are imported (some copy ``os.environ`` for the commands they
    start): the workload facts cache and the matmul peaks file in a folder of this session's
    own, never the user's ``~/.cache/gpubench``."""
    global _SESSION_DIR
    import tempfile

    from gpubench.measure.flops import PEAKS_ENV

    # Where the suite's time goes, after every session: its slowest tests (5 s or more), unless
    # --durations was given.
    if config.option.durations is None:
        config.option.durations, config.option.durations_min = 30, 5.0
    # Under pytest-xdist (``pytest -n 2``) a worker's environment names it a worker; the commands
    # the tests start are not (pytest-benchmark would disable every benchmark of a ``pytest
    # benchmarks/`` they start).
    for name in [k for k in os.environ if k.startswith("PYTEST_XDIST_")]:
        del os.environ[name]
    global _THREADS
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        # The workers share the machine's cores: each worker's torch, and every command it
        # starts, takes its share (two workers on two cores: one thread each), not a thread
        # per core each, whose spinning OpenMP threads would slow every step several times.
        _THREADS = max(1, min(2, (os.cpu_count() or 1) // workers))
        os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))  # unless set already
    torch.set_num_threads(_THREADS)  # before the session fixtures (the matmul peaks) run
    shared = os.environ.get(SHARED_DIR_ENV) if workers else None
    if shared and os.path.isdir(shared):
        # pytest-xdist's workers inherit the controller's folder: one facts cache (each probe
        # build once, not once per worker) and one peaks file; the controller removes it.
        os.environ["GPUBENCH_CACHE_DIR"] = os.path.join(shared, "cache")
        os.environ[PEAKS_ENV] = os.path.join(shared, "peaks.json")
        return
    _SESSION_DIR = tempfile.mkdtemp(prefix="gpubench-tests-")
    os.environ[SHARED_DIR_ENV] = _SESSION_DIR
    os.environ["GPUBENCH_CACHE_DIR"] = os.path.join(_SESSION_DIR, "cache")
    os.environ[PEAKS_ENV] = os.path.join(_SESSION_DIR, "peaks.json")


SHARED_DIR_ENV = "GPUBENCH_TESTS_SESSION_DIR"
"""The session's folder (facts cache, matmul peaks), set by the process that made it: the
pytest-xdist controller hands it to its workers."""


def pytest_unconfigure(config):
    import shutil

    if _SESSION_DIR:  # the process that made it
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _matmul_peaks_measured_once():
    """The CPU's matmul peaks, measured once for the session and handed to every command the
    tests start (``GPUBENCH_MATMUL_PEAKS``, as ``scripts/gpu_check.sh`` hands them to its
    steps): each command would otherwise spend seconds measuring them again. The session
    measures them itself (``test_flops`` checks the measurement): under pytest-xdist the first
    worker to get here, the others read its file."""
    from filelock import FileLock

    from gpubench.measure.flops import PEAKS_ENV

    path = os.environ[PEAKS_ENV]
    with FileLock(path + ".lock"):  # pytest-xdist's workers: the first measures them
        if not os.path.exists(path):
            _measure_peaks(path)


def _measure_peaks(path: str) -> None:
    import json

    from gpubench.measure.flops import PEAKS_ENV, _fp8_peak, _matmul_peak, fp8_peak_flops
    from gpubench.measure.machine import measured_peaks_tflops
    from gpubench.util import atomic

    del os.environ[PEAKS_ENV]  # measured here, not read
    try:
        _matmul_peak.cache_clear()
        _fp8_peak.cache_clear()
        peaks = {p: v for p, v in measured_peaks_tflops("cpu").items()
                 if not p.startswith("fp8")}
        fp8 = fp8_peak_flops("cpu")
    finally:
        os.environ[PEAKS_ENV] = path
    atomic.write_text(path, json.dumps({"device": "cpu", "device_name": "cpu",
                                        "peak_tflops": peaks,
                                        "fp8_tflops": None if fp8 is None else fp8 / 1e12}))


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
    torch.set_num_threads(_THREADS)


def pytest_collection_modifyitems(items):
    """A test that reads the shared smoke run is slow: the run takes minutes."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, request):
    """One real ``gpubench run --profile smoke`` (every model, group and parallel form, three
    rounds) for every test that reads a run's files: (its results folder, its stdout). Under
    pytest-xdist the workers share it: the first to ask makes it (under a file lock), the
    others read it."""
    if not hasattr(request.config, "workerinput"):
        return _smoke_run(tmp_path_factory.mktemp("smoke"), tmp_path_factory.mktemp("data"))
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's
    stdout, failed = root / "smoke-stdout.txt", root / "smoke-failed.txt"
    with FileLock(str(root / "smoke.lock")):
        if failed.exists():  # another worker's run failed: the same failure, not a second run
            pytest.fail(failed.read_text(), pytrace=False)
        if not stdout.exists():
            try:
                _, text = _smoke_run(root / "smoke", root / "smoke-data")
            except AssertionError as err:
                failed.write_text(f"the shared smoke run failed:\n{err}")
                raise
            stdout.write_text(text)
    return root / "smoke", stdout.read_text()


def _smoke_run(out, data):
    proc = subprocess.run(
        [sys.executable, "-m", "gpubench", "run", "--profile", "smoke", "--out", str(out),
         "--rounds", "3", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout
