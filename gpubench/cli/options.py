"""Options the commands share, declared once: ``--model`` (a workload spec), ``--profile`` and
``--device``, whose "auto" is resolved in one place (``resolve_target``)."""

from __future__ import annotations

import argparse

from gpubench.train.config import DEVICES, PROFILES

SPEC_HELP = ("workload: a built-in name (resnet18, resnet50, bert, gpt2), FILE.py:FACTORY, "
             "MODULE:FACTORY, torchvision:NAME or transformers:TYPE[?key=value&...]")
PROFILE_HELP = "problem size (default: cpu, or gpu-small when CUDA is present)"
DEVICE_HELP = "where the cases run (default: cuda when present, else cpu)"


def add_target_arguments(p: argparse.ArgumentParser, *, model: bool = False) -> None:
    """``--profile`` and ``--device``, both "auto" by default; with ``model``, a required
    ``--model`` before them (a command about one workload)."""
    if model:
        p.add_argument("--model", required=True, help=SPEC_HELP)
    p.add_argument("--profile", default="auto", choices=("auto", *PROFILES), help=PROFILE_HELP)
    p.add_argument("--device", default="auto", choices=("auto", *DEVICES), help=DEVICE_HELP)


def resolve_target(device: str, profile: str) -> tuple[str, str]:
    """``(device, profile)`` with "auto" resolved: CUDA where present, and the device's default
    profile (``gpubench.suite.cases.default_profile``). Imports torch only for "auto"."""
    from gpubench.suite.cases import default_profile

    if device == "auto":
        from gpubench.measure.machine import default_device

        device = default_device()
    return device, default_profile(device) if profile == "auto" else profile
