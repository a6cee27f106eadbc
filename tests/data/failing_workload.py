"""A workload whose model fails under autocast (as an LSTM's oneDNN kernel fails in fp16): its
bf16 and fp16 cases fail while its fp32 cases pass."""

from __future__ import annotations

import torch
from torch import nn

from gpubench import Workload


class FailsUnderAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        if torch.is_autocast_enabled(x.device.type):
            raise RuntimeError("this model cannot run under autocast")
        return self.net(x)


def workload(profile: str = "smoke") -> Workload:
    return Workload(name="fails-amp", build_model=FailsUnderAutocast,
                    make_batch=lambda n, g: (torch.randn(n, 8, generator=g),
                                             torch.randint(0, 3, (n,), generator=g)),
                    micro_batch=4, loss_fn=nn.functional.cross_entropy)
