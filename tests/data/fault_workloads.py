"""Workloads that break the contract in the ways a user's do: a ``make_batch`` that ignores
its ``n``, one that blocks, one that returns a single tensor, a factory that calls
``sys.exit(0)``, a ``build_model`` that exits, a step that runs out of memory (raised, or
an allocation ``ulimit -v`` refuses), techniques interrupted after FP32 finished."""

from __future__ import annotations

import sys
import threading

import torch
from torch import nn

from gpubench import Workload


def _batch(n, g):
    return torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)


def _workload(name, **kwargs) -> Workload:
    fields = {"build_model": lambda: nn.Linear(4, 2), "make_batch": _batch, "micro_batch": 4,
              "loss_fn": nn.functional.cross_entropy, **kwargs}
    return Workload(name=name, **fields)


def ignores_n(profile="smoke"):
    return _workload("ignoresn", make_batch=lambda n, g: _batch(2, g))


def blocking(profile="smoke"):
    def make_batch(n, g):
        threading.Event().wait()

    return _workload("blocking", make_batch=make_batch)


def one_tensor(profile="smoke"):
    return _workload("onetensor", make_batch=lambda n, g: torch.randn(n, 4, generator=g))


def exits(profile="smoke"):
    sys.exit(0)


def exits_in_build(profile="smoke"):
    def build():
        sys.exit(0)

    return _workload("exitbuild", build_model=build)


class _Hungry(nn.Module):
    """Asks for an impossible allocation on its first training forward (validation runs in
    ``no_grad``-free mode too, so only a step of batch > 2 asks)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB")
        return self.fc(x)


def out_of_memory(profile="smoke"):
    return _workload("hungry", build_model=_Hungry)


def interrupted(profile="smoke"):
    """A forward past validation that stops as Ctrl-C would (KeyboardInterrupt)."""

    class Stops(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.shape[0] > 2:
                raise KeyboardInterrupt
            return self.fc(x)

    return _workload("stops", build_model=Stops)


def slow_step(profile="smoke"):
    """Each training step (a batch larger than validation's) takes 0.2 s: time to press
    Ctrl-C mid-case."""
    import time

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.shape[0] > 2:
                time.sleep(0.2)
            return self.fc(x)

    return _workload("slowstep", build_model=Slow)


def allocates(profile="smoke"):
    """A training forward that asks the host allocator for 2 GiB per sample (8 GiB at the
    micro-batch): under ``ulimit -v`` the allocation itself fails, as a model too large for the
    machine does."""

    class Big(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.shape[0] > 2:
                ballast = torch.ones(x.shape[0] << 31, dtype=torch.uint8)
                x = x + ballast[:1].float()
            return self.fc(x)

    return _workload("allocates", build_model=Big)


def _in_autocast() -> bool:
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


def stops_in_autocast(profile="smoke"):
    """FP32 trains; a technique under autocast (bf16, fp16) stops as Ctrl-C would: the FP32
    results finished before it."""

    class Stops(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if _in_autocast():
                raise KeyboardInterrupt
            return self.fc(x)

    return _workload("stopsamp", build_model=Stops)


def slow_in_autocast(profile="smoke"):
    """FP32 trains at full speed; under autocast each forward touches the file named by
    ``$GPUBENCH_FAULT_MARK`` (the FP32 part has finished) and takes 0.5 s: time to press
    Ctrl-C with finished results to keep."""
    import os
    import time
    from pathlib import Path

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if _in_autocast():
                mark = os.environ.get("GPUBENCH_FAULT_MARK")
                if mark:
                    Path(mark).touch()
                time.sleep(0.5)
            return self.fc(x)

    return _workload("slowamp", build_model=Slow)


def step_fails(profile="smoke"):
    """A training forward past validation's that raises (a user's shape bug)."""

    class Breaks(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.shape[0] > 2:
                raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({x.shape[0]}x4 "
                                   "and 3x2)")
            return self.fc(x)

    return _workload("stepfails", build_model=Breaks)
