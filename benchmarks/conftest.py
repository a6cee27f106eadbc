"""pytest-benchmark wiring: options that choose the cases, and the machine info of every run."""

from __future__ import annotations

import os

import pytest
import torch

from gpubench.cases import PROFILE_MODELS, default_profile, profile_cases
from gpubench.config import DEVICES, MODELS, PROFILES
from gpubench.machine import default_device
from gpubench.machine import machine_info as describe_machine
from gpubench.workers import DEFAULT_TIMEOUT_S

ROUNDS = {"smoke": (3, 1), "cpu": (10, 1), "gpu-small": (30, 5), "gpu-full": (30, 5)}
"""Timed rounds and warm-up rounds per profile (one optimizer step per round)."""

MAX_TIME_S = {"smoke": 2.0, "cpu": 4.0, "gpu-small": 5.0, "gpu-full": 10.0}
"""Seconds of timed rounds per case; slower cases run fewer rounds (at least 5)."""


def pytest_addoption(parser):
    group = parser.getgroup("gpubench")
    group.addoption("--gpubench-profile", default="auto",
                    help=f"problem size: auto (cpu, or gpu-small with CUDA), {', '.join(PROFILES)}")
    group.addoption("--gpubench-device", default="auto",
                    help=f"auto (cuda if available), {', '.join(DEVICES)}")
    group.addoption("--gpubench-models", default="",
                    help=f"comma-separated subset of {', '.join(MODELS)} (default: the profile's)")
    group.addoption("--gpubench-rounds", type=int, default=0,
                    help="timed rounds per case (default: per profile)")
    group.addoption("--gpubench-warmup", type=int, default=-1,
                    help="untimed warm-up rounds per case (default: per profile)")
    group.addoption("--gpubench-max-time", type=float, default=-1,
                    help="seconds of timed rounds per case: slow cases run fewer rounds, at "
                    "least 5 (default per profile; 0: always the full rounds)")
    group.addoption("--gpubench-slow", action="store_true",
                    help="also run slow cases (torch.compile)")
    group.addoption("--gpubench-threads", type=int, default=0,
                    help="torch.set_num_threads for the run (default: torch's choice)")
    group.addoption("--gpubench-data-dir", default="",
                    help="folder for generated on-disk datasets (default: $GPUBENCH_DATA_DIR "
                    "or ~/.cache/gpubench/data)")
    group.addoption("--gpubench-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds a multi-process case's rank may take per command before the "
                    f"case fails as hung (default {DEFAULT_TIMEOUT_S:g})")


class Options:
    """The resolved command-line choices of a benchmark session."""

    def __init__(self, config: pytest.Config):
        device = config.getoption("--gpubench-device")
        self.device = default_device() if device == "auto" else device
        if self.device not in DEVICES:
            raise pytest.UsageError(
                f"--gpubench-device must be auto or one of {', '.join(DEVICES)}; got {device!r}"
            )
        profile = config.getoption("--gpubench-profile")
        self.profile = default_profile(self.device) if profile == "auto" else profile
        if self.profile not in PROFILES:
            raise pytest.UsageError(
                f"--gpubench-profile must be auto or one of {', '.join(PROFILES)}; got {profile!r}"
            )
        names = tuple(m for m in config.getoption("--gpubench-models").split(",") if m)
        bad = [m for m in names if m not in MODELS]
        if bad:
            raise pytest.UsageError(
                f"--gpubench-models must name models from {', '.join(MODELS)}; got {', '.join(bad)}"
            )
        self.models = names or PROFILE_MODELS[self.profile]
        rounds, warmup = ROUNDS[self.profile]
        self.rounds = config.getoption("--gpubench-rounds") or rounds
        w = config.getoption("--gpubench-warmup")
        self.warmup = warmup if w < 0 else w
        max_time = config.getoption("--gpubench-max-time")
        self.max_time_s = MAX_TIME_S[self.profile] if max_time < 0 else max_time
        self.slow = config.getoption("--gpubench-slow")
        self.threads = config.getoption("--gpubench-threads")
        self.timeout_s = config.getoption("--gpubench-timeout")


def pytest_configure(config):
    config.gpubench = Options(config)
    data_dir = config.getoption("--gpubench-data-dir")
    if data_dir:
        os.environ["GPUBENCH_DATA_DIR"] = data_dir  # inherited by worker processes
    if config.gpubench.threads:
        torch.set_num_threads(config.gpubench.threads)
    # Keep the raw per-round times in the JSON: comparisons use a statistical test on them.
    if hasattr(config.option, "benchmark_save_data"):
        config.option.benchmark_save_data = True


def pytest_generate_tests(metafunc):
    if "bench_case" in metafunc.fixturenames:
        opts = metafunc.config.gpubench
        cases = profile_cases(opts.profile, opts.device, opts.models)
        params = [
            pytest.param(
                c,
                id=c.id,
                marks=[pytest.mark.slow] if c.slow else [],
            )
            for c in cases
        ]
        metafunc.parametrize("bench_case", params)


@pytest.fixture
def options(request) -> Options:
    return request.config.gpubench


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["gpubench"] = describe_machine(config.gpubench.device)
