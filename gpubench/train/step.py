"""The one training step. Techniques arrive as objects; there are no branches on them here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from gpubench.train.data import Batch
from gpubench.train.parallel import Single
from gpubench.train.precision import Precision

SINGLE = Single()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Batch],
    *,
    precision: Precision,
    accum_steps: int = 1,
    set_to_none: bool = True,
    after_step: Callable[[], None] = lambda: None,
    strategy: Single = SINGLE,
    forward: Callable[[], AbstractContextManager] = nullcontext,
) -> torch.Tensor | None:
    """Forward and backward ``accum_steps`` micro-batches, then one optimizer step.

    ``forward`` makes the context the techniques' implementation objects enter around each
    micro-batch's forward and backward. Returns the mean micro-batch loss as a detached device
    tensor (reading it would synchronize), or None on a pipeline rank that does not compute the
    loss.
    """
    total = None
    for i in range(accum_steps):
        inputs, targets = next(batches)
        # no_sync must wrap backward: DDP all-reduces gradients during backward.
        with strategy.no_sync(model, i < accum_steps - 1), forward():
            loss = strategy.forward_backward(model, inputs, targets, precision, accum_steps)
        if loss is not None:
            total = loss if total is None else total + loss
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=set_to_none)
    after_step()
    return total
