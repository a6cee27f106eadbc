"""A small MLP workload with a slowdown that can be planted in one case: with
``GPUBENCH_PLANTED_SLOW_S`` set, every forward under CPU bfloat16 autocast (the bf16 case and
its variants) sleeps that many seconds more. Used to show that ``gpubench compare --confirm``
passes two runs of one commit and still catches a planted slowdown
(``scripts/confirm_gate_trials.sh``), and by ``gpubench bisect``'s tests.

    gpubench run --profile cpu --model scripts/planted_slowdown_workload.py:workload ...
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
        slow = float(os.environ.get("GPUBENCH_PLANTED_SLOW_S") or 0)
        if slow and torch.is_autocast_enabled("cpu") and \
                torch.get_autocast_dtype("cpu") == torch.bfloat16:
            time.sleep(slow)
        return self.body(x)


def make_batch(n: int, g: torch.Generator):
    return torch.randn(n, WIDTH, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def workload(profile: str = "cpu") -> Workload:
    return Workload(name="planted", build_model=PlantedMLP, make_batch=make_batch,
                    micro_batch=32, loss_fn=F.cross_entropy)
