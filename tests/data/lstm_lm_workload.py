"""A small LSTM language model, a family gpubench does not ship: token embedding, a 2-layer
``nn.LSTM`` and a linear head over the vocabulary, next-token cross-entropy."""

from __future__ import annotations

import torch
from torch import nn

from gpubench import Workload

VOCAB, EMBED, HIDDEN, LAYERS, SEQ = 200, 32, 48, 2, 16


class LSTMLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.lstm = nn.LSTM(EMBED, HIDDEN, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def make_batch(n: int, g: torch.Generator):
    ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def next_token_loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def model_flops_per_step(batch: int) -> int:
    """What the step must count, by hand: per token, 2 FLOPs per multiply-add of each LSTM
    layer's input-hidden and hidden-hidden matrices (4 gates) and of the head, forward; the
    backward twice the forward (the data and the weight gradients; the fused LSTM kernel also
    takes the first layer's input gradient, toward the embedding)."""
    tokens = batch * SEQ
    lstm = sum(4 * HIDDEN * ((EMBED if layer == 0 else HIDDEN) + HIDDEN)
               for layer in range(LAYERS))
    head = HIDDEN * VOCAB
    forward = 2 * tokens * (lstm + head)
    # the head's backward: its input and weight gradients; the LSTM's: twice its forward
    return forward + 2 * 2 * tokens * head + 2 * 2 * tokens * lstm


def workload(profile: str = "smoke") -> Workload:
    return Workload(name="lstmlm", build_model=LSTMLanguageModel, make_batch=make_batch,
                    micro_batch=4, loss_fn=next_token_loss)
