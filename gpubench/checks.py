"""Does the technique still train? Checked inside every benchmark case, outside the timed region."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpubench.build import Case

LOSS_RTOL = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 4e-2}
"""Relative tolerance of the first loss against the FP32 reference of the same weights and batch.
fp32 still differs from the reference in summation order (channels_last, checkpointing,
compile); bf16 keeps 8 mantissa bits, fp16 11."""

CHECK_STEPS = 4
"""Optimizer steps on one fixed batch; the loss must fall over them."""


MAX_SKIPPED_STEPS = 24
"""fp16 steps GradScaler may skip while halving its initial scale of 2**16 to a workable one."""


class TrainingCheckError(AssertionError):
    """The technique no longer trains correctly."""


@dataclass(frozen=True)
class CheckResult:
    reference_loss: float
    first_loss: float
    rtol: float
    losses: list[float]
    skipped_steps: int


def check_case(case: Case, steps: int = CHECK_STEPS) -> CheckResult:
    """Assert the case matches its FP32 reference and that its loss falls on a fixed batch.

    1. On the first fixed micro-batch, the loss under the case's precision (and compiled model)
       must equal the plain FP32 eager loss within ``LOSS_RTOL``.
    2. ``steps`` training steps on the fixed micro-batches must give finite losses whose last is
       below the first.
    """
    fixed = case.fixed_batches()
    inputs, targets = next(fixed)
    with torch.no_grad():
        reference = case.eager_model(inputs, targets).float().item()
        with case.precision.autocast():
            first = case.model(inputs, targets).float().item()
    rtol = LOSS_RTOL[case.cfg.precision]
    if not math.isfinite(first) or abs(first - reference) > rtol * max(1.0, abs(reference)):
        raise TrainingCheckError(
            f"{case.cfg.id}: loss {first:.6g} differs from the FP32 reference {reference:.6g} "
            f"by more than rtol {rtol}"
        )
    losses, skipped = [], 0
    scaler = case.precision.scaler
    # fp16: GradScaler skips the steps whose gradients overflow while it calibrates its scale;
    # those steps leave the weights untouched, so they are retried rather than counted.
    while len(losses) < steps and skipped <= MAX_SKIPPED_STEPS:
        scale = scaler.get_scale() if scaler.is_enabled() else None
        loss = case.step(fixed).float().item()
        if scale is not None and scaler.get_scale() < scale:
            skipped += 1
            continue
        losses.append(loss)
    if len(losses) < steps:
        raise TrainingCheckError(
            f"{case.cfg.id}: GradScaler skipped {skipped} steps in a row (gradients overflow)"
        )
    if not all(math.isfinite(x) for x in losses):
        raise TrainingCheckError(f"{case.cfg.id}: non-finite loss while training: {losses}")
    if not losses[-1] < losses[0]:
        raise TrainingCheckError(f"{case.cfg.id}: loss did not fall over {steps} steps: {losses}")
    return CheckResult(reference, first, rtol, losses, skipped)
