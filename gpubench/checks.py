"""Does the technique still train? Checked inside every benchmark case, outside the timed region."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from gpubench.build import Case

LOSS_RTOL = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 4e-2}
"""Relative tolerance of the first step's loss against the FP32 reference of the same weights and
batches. fp32 still differs from the reference in summation order (channels_last, checkpointing,
compile, DDP's bucketed all-reduce); bf16 keeps 8 mantissa bits, fp16 11."""

CHECK_STEPS = 4
"""Optimizer steps on one fixed set of micro-batches; the loss must fall over them."""

MAX_SKIPPED_STEPS = 24
"""fp16 steps GradScaler may skip while halving its initial scale of 2**16 to a workable one."""


class TrainingCheckError(AssertionError):
    """The technique no longer trains correctly."""


@dataclass(frozen=True)
class CheckResult:
    reference_loss: float | None
    first_loss: float | None
    rtol: float
    losses: list[float]
    skipped_steps: int


def reference_loss(case: Case, fixed: list) -> float | None:
    """Plain FP32 loss of the untrained model on ``fixed``, averaged as the step averages it:
    over micro-batches, and over pipeline chunks (each chunk normalizes its own batch)."""
    if case.reference_model is None:
        return None
    chunks = case.cfg.chunks
    with torch.no_grad():
        per_micro = [
            torch.stack([
                case.reference_model(x, y).float()
                for x, y in (zip(inputs.chunk(chunks), targets.chunk(chunks), strict=True)
                             if chunks > 1 else [(inputs, targets)])
            ]).mean()
            for inputs, targets in fixed
        ]
    return torch.stack(per_micro).mean().item()


def check_case(case: Case, steps: int = CHECK_STEPS) -> CheckResult:
    """Assert the case matches its FP32 reference and that its loss falls on fixed batches.

    1. The first training step's loss (computed at the initial weights, under the case's
       precision, strategy and compilation) must equal the plain FP32 loss within ``LOSS_RTOL``.
    2. ``steps`` training steps on the same micro-batches must give finite losses whose last is
       below the first.

    On a pipeline rank that does not compute the loss, only the steps run (returns no losses).
    """
    fixed = case.fixed_batches()
    reference = reference_loss(case, fixed)
    losses, skipped = [], 0
    scaler = case.precision.scaler
    # fp16: GradScaler skips the steps whose gradients overflow while it calibrates its scale;
    # those steps leave the weights untouched, so they are retried rather than counted.
    while len(losses) < steps and skipped <= MAX_SKIPPED_STEPS:
        scale = scaler.get_scale() if scaler.is_enabled() else None
        loss = case.step(itertools.cycle(fixed))
        if scale is not None and scaler.get_scale() < scale:
            skipped += 1
            continue
        losses.append(None if loss is None else loss.float().item())
    rtol = case.workload.tolerances.get(case.cfg.precision, LOSS_RTOL[case.cfg.precision])
    cid = case.cfg.id
    if len(losses) < steps:
        raise TrainingCheckError(f"{cid}: GradScaler skipped {skipped} steps (gradients overflow)")
    if losses[0] is None:
        return CheckResult(None, None, rtol, [], skipped)
    first = losses[0]
    if not all(math.isfinite(x) for x in losses):
        raise TrainingCheckError(f"{cid}: non-finite loss while training: {losses}")
    if reference is not None and abs(first - reference) > rtol * max(1.0, abs(reference)):
        raise TrainingCheckError(
            f"{cid}: loss {first:.6g} differs from the FP32 reference {reference:.6g} "
            f"by more than rtol {rtol}"
        )
    if not losses[-1] < losses[0]:
        raise TrainingCheckError(f"{cid}: loss did not fall over {steps} steps: {losses}")
    return CheckResult(reference, first, rtol, losses, skipped)
