"""Options the commands share, declared once: ``--model`` (a workload spec), ``--profile`` and
``--device``, whose "auto" is resolved in one place (``resolve_target``), and the options of a
benchmark session (``SESSION_OPTIONS``: ``gpubench run``'s and the pytest plugin's)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpubench.train.config import DEVICES, PROFILES
from gpubench.util.argtypes import non_negative, non_negative_int, positive

SPEC_HELP = ("workload: a built-in name (resnet18, resnet50, bert, gpt2), FILE.py:FACTORY, "
             "MODULE:FACTORY, torchvision:NAME, timm:NAME or "
             "transformers:TYPE[?key=value&...]")
PROFILE_HELP = "problem size (default: cpu, or gpu-small when CUDA is present)"
DEVICE_HELP = "where the cases run (default: cuda when present, else cpu)"


def add_target_arguments(p: argparse.ArgumentParser, *, model: bool = False) -> None:
    """``--profile`` and ``--device``, both "auto" by default; with ``model``, a required
    ``--model`` before them (a command about one workload)."""
    if model:
        p.add_argument("--model", required=True, help=SPEC_HELP)
    p.add_argument("--profile", default="auto", choices=("auto", *PROFILES), help=PROFILE_HELP)
    p.add_argument("--device", default="auto", choices=("auto", *DEVICES), help=DEVICE_HELP)


ACCELERATOR_NODES = ("/dev/nvidia*", "/dev/dxg", "/dev/kfd", "/dev/nvhost-*", "/dev/nvgpu",
                     "/dev/nvmap", "/proc/driver/nvidia")
"""The device files a CUDA device needs on Linux (NVIDIA; WSL 2's GPU; ROCm's HIP; Jetson's
integrated GPU), and the NVIDIA driver's own folder."""


def no_accelerator_nodes() -> bool:
    """Linux without any of ``ACCELERATOR_NODES``: ``torch.cuda.is_available()`` would be False,
    known without importing torch (3 s here). False elsewhere (then torch decides)."""
    import glob
    import sys

    return sys.platform == "linux" and not any(glob.glob(p) for p in ACCELERATOR_NODES)


def resolve_target(device: str, profile: str) -> tuple[str, str]:
    """``(device, profile)`` with "auto" resolved: CUDA where present, and the device's default
    profile (``gpubench.workloads.profiles.default_profile``). Imports torch only for
    "auto", and not where the machine has no accelerator's device files."""
    from gpubench.workloads.profiles import default_profile

    if device == "auto":
        if no_accelerator_nodes():
            device = "cpu"
        else:
            from gpubench.measure.machine import default_device

            device = default_device()
    return device, default_profile(device) if profile == "auto" else profile


@dataclass(frozen=True)
class SessionOption:
    """An option of a benchmark session, declared once: ``gpubench run --NAME`` and the pytest
    plugin's ``--gpubench-NAME`` (``benchmarks/conftest.py``) are both made from it, and
    ``gpubench run`` hands its value to the pytest child under the second form."""

    name: str
    """The attribute (``max_time``: ``--max-time`` and ``--gpubench-max-time``)."""
    help: str
    """Help text; ``{rounds}`` stands for the rounds option in the same command's spelling."""
    type: Callable[[str], Any] | None = None
    default: Any = None
    flag: bool = False
    """A switch (``store_true``)."""
    choices: tuple | None = None
    metavar: str | None = None

    def cli_flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def pytest_flag(self) -> str:
        return "--gpubench-" + self.name.replace("_", "-")

    def add(self, add_argument: Callable, flag: str, rounds: str) -> None:
        """Declare it with ``add_argument`` (argparse's, or pytest's ``addoption``) as
        ``flag``."""
        kwargs: dict[str, Any] = {"help": self.help.format(rounds=rounds)}
        if self.flag:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = self.default
            for key in ("type", "choices", "metavar"):
                if getattr(self, key) is not None:
                    kwargs[key] = getattr(self, key)
        add_argument(flag, **kwargs)

    def pytest_args(self, value: Any) -> list[str]:
        """The pytest child's arguments for this option's ``gpubench run`` value."""
        if self.flag:
            return [self.pytest_flag()] if value else []
        if value is None or value == self.default:
            return []
        return [f"{self.pytest_flag()}={value}"]


SESSION_OPTIONS = (
    SessionOption("profile", PROFILE_HELP, default="auto", choices=("auto", *PROFILES)),
    SessionOption("device", DEVICE_HELP, default="auto", choices=("auto", *DEVICES)),
    SessionOption("groups", "comma-separated case groups from {groups} (default: all)",
                  default=""),
    SessionOption("rounds", "timed rounds per case (default, or 0: per profile)",
                  type=non_negative_int, default=0),
    SessionOption("warmup", "most untimed warm-up rounds per case: warm-up stops once two "
                  "steps in a row agree within 10%%, or one agrees with the training check's "
                  "last (default: per profile)",
                  type=non_negative_int),
    SessionOption("target_width", "stop a case's timed rounds once the 95%% interval of its "
                  "paired speedup (unpaired: of its median step time) is this tight, as a "
                  "relative half-width (0.02: +-2%%), after at least 6 rounds, or at its time "
                  "cap (--max-time) or 4 times {rounds} rounds, whichever comes first "
                  "(default: per profile, cpu 0.02; 0: a fixed count of rounds, as when "
                  "{rounds} is given)", type=non_negative),
    SessionOption("max_time", "seconds of timed rounds per case; slower cases run fewer "
                  "rounds, at least 6 (default: per profile; 0: always the full rounds)",
                  type=non_negative),
    SessionOption("min_time", "seconds of timed rounds a fast case runs at least: more rounds, "
                  "up to 4 times {rounds} (default: cpu 0.6, other profiles 0; 0 when "
                  "{rounds} is given)", type=non_negative),
    SessionOption("energy_block", "seconds of a paired case's rounds back to back after its "
                  "timed rounds, then as long of its baseline's, for each side's energy and "
                  "power where the GPUs count energy (NVML; nothing runs on the CPU; default: "
                  "per profile, 2 on gpu-small; 0: off, energy then from the paired rounds)",
                  type=non_negative),
    SessionOption("timeout", "seconds each command of a case (its build, data, check, steps; "
                  "in this process or in a rank) may take before the case fails as hung "
                  "(default 300)", type=positive),
    SessionOption("threads", "torch.set_num_threads for the run (default, or 0: torch's "
                  "choice)", type=non_negative_int, default=0),
    SessionOption("unpaired", "no paired baseline round before each timed round (faster; "
                  "speedups then compare cases measured minutes apart)", flag=True),
    SessionOption("partner", "where a case's paired baseline runs: process (built for the "
                  "case in the benchmark process, where the baseline case ran) or worker (a "
                  "process of its own, kept across the model's cases, its speed against the "
                  "benchmark process's measured when it starts) (default: process)",
                  default="process",
                  choices=("process", "worker")),
    SessionOption("slow", "include slow cases (torch.compile)", flag=True),
    SessionOption("data_dir", "folder for generated on-disk datasets (default: "
                  "$GPUBENCH_DATA_DIR or ~/.cache/gpubench/data)"),
    SessionOption("no_storage_probe", "skip the read-throughput probe of the data folder's "
                  "disk (64 MB written, read back cold; about a second; run once when the cases "
                  "read on-disk data)", flag=True),
)
"""The options ``gpubench run`` and the pytest plugin share. Where they differ, each command
declares its own: the workloads (``gpubench run --model``/``--models``, pytest
``--gpubench-models``), traces (``gpubench run --trace``: into the results folder; pytest
``--gpubench-trace DIR``) and resuming (a results folder, or the journal beside
``--benchmark-json``)."""

BY_NAME = {o.name: o for o in SESSION_OPTIONS}


def add_session_arguments(add_argument: Callable, *, pytest: bool = False,
                          skip: tuple[str, ...] = ()) -> None:
    """Declare every ``SESSION_OPTIONS`` entry but those named in ``skip`` with
    ``add_argument``: ``gpubench run``'s spelling, or (``pytest``) the plugin's ``--gpubench-``
    one."""
    from gpubench.suite.cases import GROUPS

    for option in SESSION_OPTIONS:
        if option.name in skip:
            continue
        if option.name == "groups":
            option = replace(option, help=option.help.replace("{groups}", ", ".join(GROUPS)))
        rounds = BY_NAME["rounds"].pytest_flag() if pytest else BY_NAME["rounds"].cli_flag()
        flag = option.pytest_flag() if pytest else option.cli_flag()
        option.add(add_argument, flag, rounds)


def session_pytest_args(args: argparse.Namespace, *, device: str, profile: str) -> list[str]:
    """The pytest plugin's arguments for ``gpubench run``'s parsed ``args`` (``device`` and
    ``profile`` already resolved, handed on as they are)."""
    out = [f"--gpubench-profile={profile}", f"--gpubench-device={device}"]
    for option in SESSION_OPTIONS:
        if option.name not in ("profile", "device"):
            out += option.pytest_args(getattr(args, option.name, None))
    return out
