"""Measuring outside pytest: a stand-in for the pytest-benchmark fixture and a writer of the same
JSON, so results from ``torchrun ... -m gpubench dist`` load, chart and compare like the rest."""

from __future__ import annotations

import datetime
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import pytest_benchmark
from pytest_benchmark.stats import Stats

from gpubench.measure.version import SCHEMA_VERSION
from gpubench.util import atomic


class StandaloneBenchmark:
    """The part of pytest-benchmark's fixture that ``run_case`` uses: ``pedantic`` (or
    ``record_rounds``), ``stats`` and ``extra_info``; rounds are timed with
    ``time.perf_counter`` like pytest-benchmark."""

    def __init__(self, name: str, group: str | None = None):
        self.name, self.group = name, group
        self.extra_info: dict = {"schema": SCHEMA_VERSION}
        self.stats = None

    def pedantic(self, target, args=(), kwargs=None, setup=None, rounds=1, warmup_rounds=0,
                 iterations=1):
        kwargs = kwargs or {}
        for _ in range(warmup_rounds):
            if setup:
                setup()
            target(*args, **kwargs)
        stats, result = Stats(), None
        for _ in range(rounds):
            if setup:
                setup()  # untimed, as in pytest-benchmark
            start = time.perf_counter()
            result = target(*args, **kwargs)
            stats.update(time.perf_counter() - start)
        self.stats = SimpleNamespace(stats=stats)
        return result

    def record_rounds(self, times) -> None:
        """Rounds timed by the caller (``gpubench.measure.protocol.record_rounds``)."""
        stats = Stats()
        for t in times:
            stats.update(t)
        self.stats = SimpleNamespace(stats=stats)

    def as_json(self) -> dict:
        stats = self.stats.stats
        return {
            "group": self.group,
            "name": self.name,
            "fullname": self.name,
            "params": None,
            "param": None,
            "extra_info": self.extra_info,
            "options": {"timer": "perf_counter"},
            "stats": {**stats.as_dict(), "data": list(stats.data), "iterations": 1},
        }


def write_benchmark_json(path: str | Path, benchmarks: list[StandaloneBenchmark],
                         machine: dict, commit_info: dict | None = None) -> None:
    """pytest-benchmark's JSON layout, written atomically (``commit_info``: pytest-benchmark's
    ``get_commit_info()``, as a ``gpubench run`` records it)."""
    data = {
        "machine_info": {"node": platform.node(), "processor": platform.processor(),
                         "machine": platform.machine(),
                         "python_version": platform.python_version(), "gpubench": machine},
        "commit_info": commit_info or {},
        "benchmarks": [b.as_json() for b in benchmarks],
        "datetime": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": pytest_benchmark.__version__,
    }
    atomic.write_json(path, data, indent=1)
