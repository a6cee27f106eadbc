"""A small LSTM classifier, a workload of a family gpubench does not ship (its recurrent
kernel, ``aten.mkldnn_rnn_layer`` on the CPU, is counted by gpubench's own FLOP formula)."""

from __future__ import annotations

import torch
from torch import nn

from gpubench import Workload


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def workload(profile: str = "smoke") -> Workload:
    return Workload(name="lstm", build_model=LSTMClassifier,
                    make_batch=lambda n, g: (torch.randn(n, 12, 16, generator=g),
                                             torch.randint(0, 4, (n,), generator=g)),
                    micro_batch=4, loss_fn=nn.functional.cross_entropy)
