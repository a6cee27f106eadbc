"""A small MLP workload with a slowdown that can be planted in one case: with
``GPUBENCH_PLANTED_SLOW_S`` set, every forward under CPU bfloat16 autocast (the bf16 case and
its variants) sleeps that many seconds more. Used to show that ``gpubench compare --confirm``
passes two runs of one commit and still catches a planted slowdown
(``scripts/confirm_gate_trials.sh``), and by ``gpubench bisect``'s tests.

    gpubench run --profile cpu --model scripts/planted_slowdown_workload.py:workload ...

``bert`` is the built-in bert (named ``bert``, its cases' ids unchanged) whose model's forward
sleeps the same way: ``--models resnet18,scripts/planted_slowdown_workload.py:bert,gpt2``
stands in for the cpu profile's models in a run with one slowed case (``bert-bf16``) among all
of theirs.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from gpubench import Workload

WIDTH, CLASSES = 256, 10


class PlantedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH),
                                  nn.ReLU(), nn.Linear(WIDTH, CLASSES))

    def forward(self, x):
        _planted(float(os.environ.get("GPUBENCH_PLANTED_SLOW_S") or 0))
        return self.body(x)


def make_batch(n: int, g: torch.Generator):
    return torch.randn(n, WIDTH, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def workload(profile: str = "cpu") -> Workload:
    return Workload(name="planted", build_model=PlantedMLP, make_batch=make_batch,
                    micro_batch=32, loss_fn=F.cross_entropy)


def _planted(slow_s: float) -> None:
    if slow_s and torch.is_autocast_enabled("cpu") and \
            torch.get_autocast_dtype("cpu") == torch.bfloat16:
        time.sleep(slow_s)


def bert(profile: str = "cpu") -> Workload:
    """The built-in bert whose forward under CPU bfloat16 autocast sleeps
    ``GPUBENCH_PLANTED_SLOW_S`` seconds more. Its model is an instance of a subclass of the
    transformers class (same modules, parameters and config), so every technique treats it as
    it treats the built-in's."""
    from dataclasses import replace

    from gpubench.workloads.builtin import BUILTIN

    builtin = BUILTIN["bert"](profile)
    build = builtin.build_model

    def build_model():
        model = build()
        cls = type(model)

        def forward(self, *args, **kwargs):
            _planted(float(os.environ.get("GPUBENCH_PLANTED_SLOW_S") or 0))
            return cls.forward(self, *args, **kwargs)

        model.__class__ = type(f"Planted{cls.__name__}", (cls,), {"forward": forward})
        return model

    return replace(builtin, build_model=build_model)
