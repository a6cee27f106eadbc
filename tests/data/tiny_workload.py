"""The smallest workload that trains: a two-layer MLP on random features. Tests whose question is
the plumbing (a launcher, a compilation cache), not a model, run it: a rank or benchmark process
that builds it imports neither transformers nor torchvision (about 2 s of a core each)."""

from __future__ import annotations

import torch
from torch import nn

from gpubench import Workload


def workload(profile: str = "smoke") -> Workload:
    return Workload(name="tinymlp", build_model=lambda: nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
        make_batch=lambda n, g: (torch.randn(n, 8, generator=g),
                                 torch.randint(0, 2, (n,), generator=g)),
        micro_batch=4, loss_fn=nn.functional.cross_entropy)
