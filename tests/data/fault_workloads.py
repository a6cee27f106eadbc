"""Workloads that break the contract in the ways a user's do: a ``make_batch`` that ignores
its ``n``, one that blocks, one that returns a single tensor, a factory that calls
``sys.exit(0)``, a ``build_model`` that exits, a step that runs out of memory."""

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
