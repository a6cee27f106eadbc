"""The one training step. Techniques arrive as objects; there are no branches on them here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from gpubench.data import Batch
from gpubench.precision import Precision


def no_sync_off(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Single-device strategy: there is no gradient all-reduce to skip."""
    return contextlib.nullcontext()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Batch],
    *,
    precision: Precision,
    accum_steps: int = 1,
    set_to_none: bool = True,
    after_step: Callable[[], None] = lambda: None,
    no_sync: Callable[[nn.Module, bool], contextlib.AbstractContextManager] = no_sync_off,
) -> torch.Tensor:
    """Forward and backward ``accum_steps`` micro-batches, then one optimizer step.

    Returns the mean micro-batch loss as a detached device tensor (reading it would synchronize).
    """
    total = None
    for i in range(accum_steps):
        inputs, targets = next(batches)
        # no_sync must wrap backward: DDP all-reduces gradients during backward.
        with no_sync(model, i < accum_steps - 1):
            with precision.autocast():
                loss = model(inputs, targets)
                if accum_steps > 1:
                    # Dividing by k makes k accumulated micro-batches equal one batch k times
                    # larger (skipped at k=1: an extra op in forward and backward for nothing).
                    loss = loss / accum_steps
            precision.backward(loss)
        total = loss.detach() if total is None else total + loss.detach()
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=set_to_none)
    after_step()
    return total
