"""The profiles: every per-profile figure of the suite in one table.

A profile is a problem size and a time budget: the built-in models it runs and how long each
case is timed, how many samples the on-disk datasets hold, how long convergence parity trains.
The built-in models' shapes per profile are the models' own (``gpubench.workloads.builtin``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    models: tuple[str, ...]
    """The built-in models its run measures (``--model`` replaces them)."""
    rounds: int
    """Timed rounds per case (one optimizer step per round)."""
    warmup: int
    """Most untimed warm-up rounds per case: warm-up stops once two steps in a row agree
    within 10% (``gpubench.measure.protocol.warm_up``)."""
    max_time_s: float
    """Seconds of timed rounds per case; slower cases run fewer rounds (at least 6)."""
    min_time_s: float
    """Seconds of timed rounds a fast case runs at least: more rounds (up to 4 times
    ``rounds``), each paired with a baseline round. On the CPU profile a 15 ms step gets 40
    rounds instead of 12, which halves how far its paired speedup moves from run to run, for
    0.4 s more of timed rounds per side."""
    dataset_size: int
    """Samples on disk of the built-in on-disk datasets (``LoaderConfig.dataset_size``
    overrides it; at least what the loader cases read)."""
    parity_steps: int
    """Optimizer steps per technique of convergence parity (``--steps`` overrides it)."""
    target_width: float
    """The paired speedup's 95% interval, as a relative half-width, at which a case's timed
    rounds stop (``StoppingRule``; 0: a fixed count, ``rounds``); ``max_time_s`` and 4 times
    ``rounds`` cap them, 6 is the least."""
    energy_block_s: float
    """Seconds of a paired case's energy block, and as long of its baseline's, after its
    timed rounds, where the devices count energy (NVML on CUDA; nothing runs on the CPU):
    each side's joules per step and power from its own rounds back to back. A second or more
    covers NVML's power average and counter updates."""


PROFILE_TABLE: dict[str, Profile] = {p.name: p for p in (
    Profile("smoke", "tests and CI: tiny shapes, every code path of the step", ("resnet18", "bert"),
            rounds=3, warmup=1, max_time_s=2.0, min_time_s=0.0, dataset_size=64,
            parity_steps=120, target_width=0.0, energy_block_s=0.5),
    Profile("cpu", "a 2-core laptop's scale", ("resnet18", "bert", "gpt2"),
            rounds=12, warmup=4, max_time_s=1.0, min_time_s=0.6, dataset_size=512,
            parity_steps=300, target_width=0.02, energy_block_s=2.0),
    Profile("gpu-small", "one GPU, real shapes, the questions users ask first",
            ("resnet50", "bert", "gpt2"), rounds=30, warmup=10, max_time_s=5.0, min_time_s=0.0,
            dataset_size=4096, parity_steps=300, target_width=0.01, energy_block_s=2.0),
    Profile("gpu-full", "gpu-small's models and every case", ("resnet50", "bert", "gpt2"),
            rounds=30, warmup=10, max_time_s=10.0, min_time_s=0.0, dataset_size=8192,
            parity_steps=300, target_width=0.01, energy_block_s=3.0),
)}
"""Every profile, by name."""

PROFILES = tuple(PROFILE_TABLE)


def profile(name: str) -> Profile:
    """The profile ``name``; a one-line ``ValueError`` naming the valid ones."""
    if name not in PROFILE_TABLE:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {name!r}")
    return PROFILE_TABLE[name]


DEFAULT_PROFILES = {"cpu": "cpu", "cuda": "gpu-small"}
"""The profile ``--profile auto`` takes on each device."""


def default_profile(device: str) -> str:
    return DEFAULT_PROFILES[device]
