"""Does the technique still train? Checked inside every benchmark case, outside the timed region."""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch

from gpubench.train.build import Case
from gpubench.train.precision import ieee_fp32

LOSS_RTOL = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 4e-2, "fp8": 5e-2,
             "fp8-rowwise": 5e-2}
"""Relative tolerance of the first step's loss against the FP32 reference of the same weights and
batches. fp32 still differs from the reference in summation order (channels_last, checkpointing,
compile, DDP's bucketed all-reduce); bf16 keeps 8 mantissa bits, fp16 11."""

GRAD_TOL = {"fp32": (1e-4, 1e-3), "tf32": (2e-3, 2e-2), "fp16": (0.1, 0.1),
            "bf16": (0.15, 0.15), "fp8": (0.05, 0.1),
            "fp8-rowwise": (0.05, 0.1)}
"""(1 - cosine similarity, relative norm difference) allowed between the first optimizer step's
gradient and the plain FP32 gradient of the same samples, and between the parameter update and
the update the same optimizer makes from the FP32 gradient. A gradient not divided by k, divided
twice, or from the last micro-batch only is off by a factor of k or in direction, far outside.
Autocast's bounds are wide because a randomly initialised network with BatchNorm over few values
per channel amplifies rounding: ResNet-18 at 32 px, batch 8, bf16 reaches cosine 0.906 (norm
ratio 0.986) against FP32 at the first step; BERT and GPT-2 reach 0.99999. FP8 (e4m3 forward,
3 mantissa bits; e5m2 output gradients, 2) on BERT's linears, emulated: cosine 0.9984
(tensorwise) and 0.9992 (rowwise), norm ratio 0.997; unscaled casts (scale 1) flush its small
gradients to zero, far outside."""

CHECK_STEPS = 3
"""Optimizer steps on one fixed set of micro-batches; the loss must fall over them (the first
step's gradient and update are compared with the FP32 reference's)."""

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
    grad_cosine: float | None = None
    """Cosine similarity of the first step's gradient with the plain FP32 gradient."""
    grad_norm_ratio: float | None = None
    """Norm of the first step's gradient over the FP32 gradient's."""
    update_cosine: float | None = None
    """Cosine similarity of the first parameter update with the FP32 reference update."""
    update_norm_ratio: float | None = None
    first_step_s: float | None = None
    """Seconds of the first training step (with ``torch.compile``: the compilation too)."""
    step_times_s: list[float] = field(default_factory=list)
    """Seconds of each of the check's training steps, the device synchronized after each
    (fp16 steps GradScaler skipped included): with ``torch.compile`` the first compiles, and
    under reduce-overhead the next records the CUDA graphs (``compile_steps``)."""


def check_precision(cfg) -> str:
    """The precision whose tolerances apply: FSDP's mixed precision computes in bf16."""
    return "bf16" if cfg.fsdp_mixed_precision else cfg.precision


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded one (FSDP's DTensors: gathered from every rank, a
    collective), the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _micro_objective(model, inputs, targets, chunks: int) -> torch.Tensor:
    """Plain FP32 loss of ``model`` on one micro-batch, averaged over its chunks as the step
    averages it (each chunk normalizes its own)."""
    return torch.stack([
        model(x, y).float()
        for x, y in (zip(inputs.chunk(chunks), targets.chunk(chunks), strict=True)
                     if chunks > 1 else [(inputs, targets)])
    ]).mean()


def _reference_objective(model, fixed: list, chunks: int) -> torch.Tensor:
    """Plain FP32 loss of ``model`` on ``fixed`` averaged as the step averages it: over
    micro-batches, and over chunks within each micro-batch."""
    return torch.stack([_micro_objective(model, x, y, chunks) for x, y in fixed]).mean()


def reference_loss(case: Case, fixed: list) -> float | None:
    """Plain FP32 loss of the untrained model on ``fixed``, averaged as the step averages it."""
    if case.reference_model is None:
        return None
    with torch.no_grad():
        return _reference_objective(case.reference_model, fixed,
                                    case.strategy.reference_chunks()).item()


def _fp32_gradient(case: Case, fixed: list, ref_params: list
                   ) -> tuple[float, list[torch.Tensor]]:
    """(loss, gradient): the plain FP32 loss of the reference model on ``fixed`` and its
    gradient (the mean over micro-batches as the step takes it), averaged over the ranks where
    the strategy averages gradients (the loss is this rank's, as ``reference_loss``'s)."""
    # One micro-batch's graph at a time, its gradient summed (the mean over micro-batches
    # as the step takes it): all k graphs at once would hold k micro-batches of FP32
    # activations (about 90 GB for ResNet-50 accum4 at gpu-small's batch).
    chunks = case.strategy.reference_chunks()
    grads = [torch.zeros_like(p, dtype=torch.float32) for p in ref_params]
    loss = torch.zeros((), dtype=torch.float64)
    for inputs, targets in fixed:
        term = _micro_objective(case.reference_model, inputs, targets, chunks) / len(fixed)
        loss += term.detach().double().cpu()
        for total, g in zip(grads, torch.autograd.grad(term, ref_params, allow_unused=True),
                            strict=True):
            if g is not None:
                total += g.detach().float()
    if case.strategy.averages_gradients and torch.distributed.is_initialized():
        flat = torch.cat([g.flatten() for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= torch.distributed.get_world_size()
        grads = [g.view_as(p) for g, p in zip(
            flat.split([g.numel() for g in grads]), ref_params, strict=True)]
    return loss.item(), grads


def _digest(tensors) -> str:
    """A hash of the values, shapes and dtypes of the tensors in ``tensors`` (any nesting)."""
    import hashlib

    from torch.utils._pytree import tree_leaves

    h = hashlib.blake2b(digest_size=16)
    for t in tree_leaves(tensors):
        if isinstance(t, torch.Tensor):
            t = t.detach().contiguous().cpu()
            h.update(f"{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(t).encode())
    return h.hexdigest()


@dataclass
class ReferenceEntry:
    """One FP32 reference: its loss and gradient, and the first update each optimizer (by
    name, default implementation) makes from that gradient, kept for CPU cases only
    (``_Reference``)."""

    loss: float
    grads: list[torch.Tensor]
    updates: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.grads, *(t for u in self.updates.values() for t in u)]


class ReferenceCache:
    """The FP32 reference gradient and loss of the training check, computed once per model,
    weights, batches and layout in a process and reused by every case that shares them (a run's
    cases of a model differ in precision, optimizer, memory and loader knobs, not in the FP32
    gradient of the same samples at the same weights), with the first update each optimizer
    makes from it (``ReferenceEntry``).

    The key holds everything the reference depends on: the reference model's type and each
    parameter's shape, strides (channels_last), dtype, device and a fingerprint of its values
    (float64 sum and sum of squares), the micro-batches' contents (a hash), how each
    micro-batch is chunked and the precision's loss (``reference_chunks``). Multi-process cases
    are not cached (their gradients are all-reduced: every rank must compute). The last
    ``size`` entries are kept."""

    def __init__(self, size: int = 2):
        from collections import OrderedDict

        self.size = size
        self.entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def key(case: Case, fixed: list, ref_params: list) -> tuple:
        with torch.no_grad():  # float64 sums without a float64 copy of each parameter
            moments = torch.stack([torch.stack([torch.sum(p, dtype=torch.float64),
                                                torch.sum(p * p, dtype=torch.float64)])
                                   for p in (q.detach() for q in ref_params)]
                                  ).cpu() if ref_params else None
        layout = tuple((tuple(p.shape), tuple(p.stride()), str(p.dtype), str(p.device))
                       for p in ref_params)
        return (type(case.reference_model).__qualname__, layout,
                None if moments is None else moments.numpy().tobytes(),
                case.strategy.reference_chunks(), _digest(fixed))

    def lookup(self, case: Case, fixed: list, ref_params: list) -> ReferenceEntry:
        """The reference's entry for ``fixed`` (``_fp32_gradient``), cached; a multi-process
        case's is computed afresh and not kept."""
        if torch.distributed.is_initialized():
            return ReferenceEntry(*_fp32_gradient(case, fixed, ref_params))
        key = self.key(case, fixed, ref_params)
        if key in self.entries:
            self.hits += 1
            self.entries.move_to_end(key)
            return self.entries[key]
        self.misses += 1
        found = ReferenceEntry(*_fp32_gradient(case, fixed, ref_params))
        self.entries[key] = found
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return found

    def clear(self) -> None:
        self.entries.clear()

    def nbytes(self) -> int:
        """Bytes the cached gradients and updates hold (a case's memory figures leave them
        out)."""
        return sum(t.numel() * t.element_size()
                   for entry in self.entries.values() for t in entry.tensors() if t is not None)


REFERENCE_GRADIENTS = ReferenceCache()
"""This process's cache of FP32 reference gradients (``ReferenceCache``)."""


class _Reference:
    """The plain FP32 gradient of the same samples at the initial weights, and the update the
    same optimizer (default implementation, same hyper-parameters) makes from it, for every
    trained parameter the reference model shares (DDP, FSDP: averaged over the ranks, as they
    do).

    FSDP trains sharded parameters of its own (DTensors) and keeps an unsharded copy of the
    initial model as the reference: parameters are paired by name, and the trained side's
    gradients and updates are compared whole (``_full``: gathered from all ranks)."""

    def __init__(self, case: Case, fixed: list):
        trained = [p for g in case.optimizer.param_groups for p in g["params"]]
        self.params, ref_params = case.strategy.pair_parameters(case.reference_model, trained)
        entry = REFERENCE_GRADIENTS.lookup(case, fixed, ref_params)
        self.loss, self.grads = entry.loss, entry.grads
        self.before = [p.detach().float().clone() for p in ref_params]
        # The same optimizer's update from the same gradient at the same weights is the same
        # for every case that shares the entry: made once per optimizer and kept where it
        # costs no case's figures. On the CPU the kept tensors join the resident base the
        # training peak is taken above (``CaseProgram.check``); on CUDA every case's peak is
        # the device's whole high-water mark, which up to three updates of the model's size
        # held for the run would raise: there it is made per case and dropped.
        self.updates = entry.updates.get(case.cfg.optimizer)
        if self.updates is None:
            from gpubench.train.build import build_optimizer

            copies = [b.clone().requires_grad_() for b in self.before]
            opt = build_optimizer(case.cfg.optimizer, "default", copies)
            for c, g in zip(copies, self.grads, strict=True):
                c.grad = g.clone()
            opt.step()
            self.updates = [c.detach() - b for c, b in zip(copies, self.before, strict=True)]
            if case.device.type == "cpu":
                entry.updates[case.cfg.optimizer] = self.updates
        self.seen_grads: list[torch.Tensor] | None = None
        self.seen_updates: list[torch.Tensor] | None = None

    def before_step(self, optimizer, args, kwargs) -> None:
        if self.seen_grads is None:
            self.seen_grads = [torch.zeros_like(b) if p.grad is None
                               else _full(p.grad.detach()).float().clone()
                               for p, b in zip(self.params, self.before, strict=True)]

    def after_step(self, optimizer, args, kwargs) -> None:
        if self.seen_updates is None:
            self.seen_updates = [_full(p.detach()).float() - b
                                 for p, b in zip(self.params, self.before, strict=True)]


def _agreement(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float]:
    """(cosine similarity, norm ratio) of two lists of tensors taken as one vector each. The
    sums run per tensor in float64 (``torch.sum(..., dtype=float64)``) rather than over a
    float64 copy of the whole vector: 0.1 s less per check of an 11M-parameter model."""
    sums = torch.zeros(3, dtype=torch.float64)
    for a, b in zip(got, want, strict=True):
        a, b = a.flatten(), b.flatten()
        sums += torch.stack([torch.sum(a * b, dtype=torch.float64),
                             torch.sum(a * a, dtype=torch.float64),
                             torch.sum(b * b, dtype=torch.float64)]).cpu()
    dot, na, nb = sums[0].item(), math.sqrt(sums[1].item()), math.sqrt(sums[2].item())
    if nb == 0:
        return (1.0 if na == 0 else 0.0), (1.0 if na == 0 else math.inf)
    return dot / max(na * nb, 1e-300), na / nb


def check_case(case: Case, steps: int = CHECK_STEPS,
               around_first_step: Callable[[], AbstractContextManager] | None = None
               ) -> CheckResult:
    """Assert the case matches its FP32 reference and that its loss falls on fixed batches.

    1. The first optimizer step's gradient (as the optimizer sees it: accumulated, unscaled,
       all-reduced) and the parameter update it makes must equal, by cosine similarity and
       relative norm within ``GRAD_TOL``, the plain FP32 gradient of the same samples at the
       same weights and the update the same optimizer makes from it.
    2. The first training step's loss (at the initial weights, under the case's precision,
       strategy and compilation) must equal the plain FP32 loss within ``LOSS_RTOL``.
    3. ``steps`` training steps on the same micro-batches must give finite losses whose last is
       below the first.

    On a pipeline rank that does not compute the loss, the gradient check covers its stage and
    no losses are returned. ``around_first_step``: a context (made anew) the first training
    step runs in, e.g. one that counts its FLOPs and saved activations.
    """
    cid = case.cfg.id
    fixed = case.fixed_batches()
    computes_loss = case.strategy.computes_loss
    with ieee_fp32():  # the reference is IEEE FP32 even inside a tf32 case's math mode
        grad_ref = _Reference(case, fixed) if case.reference_model is not None else None
        # the loss of the gradient's own forward (``_fp32_gradient``): no second forward
        reference = (None if not computes_loss else
                     grad_ref.loss if grad_ref is not None and grad_ref.params else
                     reference_loss(case, fixed))
    hooks = [] if grad_ref is None else [
        case.optimizer.register_step_pre_hook(grad_ref.before_step),
        case.optimizer.register_step_post_hook(grad_ref.after_step),
    ]
    losses, skipped = [], 0
    step_times: list[float] = []
    scaler = case.precision.scaler
    try:
        # fp16: GradScaler skips the steps whose gradients overflow while it calibrates its
        # scale; those leave the weights untouched (the optimizer is not called), so they are
        # retried rather than counted.
        while len(losses) < steps and skipped <= MAX_SKIPPED_STEPS:
            scale = scaler.get_scale() if scaler.is_enabled() else None
            first = around_first_step is not None and not losses and not skipped
            start = time.perf_counter()
            with around_first_step() if first else contextlib.nullcontext():
                loss = case.step(itertools.cycle(fixed))
            case.synchronize()
            step_times.append(time.perf_counter() - start)
            if scale is not None and scaler.get_scale() < scale:
                skipped += 1
                continue
            losses.append(None if loss is None else loss.float().item())
    finally:
        for hook in hooks:
            hook.remove()
    if not case.strategy.keeps_reference:
        # The full model would inflate this stage's (this shard's) peak memory.
        case.reference_model = None
    precision = check_precision(case.cfg)
    rtol = case.workload.tolerances.get(precision, LOSS_RTOL[precision])
    if len(losses) < steps:
        raise TrainingCheckError(f"{cid}: GradScaler skipped {skipped} steps (gradients overflow)")
    agreement = {}
    if grad_ref is not None and grad_ref.params:
        if grad_ref.seen_grads is None or grad_ref.seen_updates is None:
            raise TrainingCheckError(f"{cid}: the optimizer never stepped")
        cos_tol, norm_tol = GRAD_TOL[precision]
        for what, got, want in (("gradient", grad_ref.seen_grads, grad_ref.grads),
                                ("update", grad_ref.seen_updates, grad_ref.updates)):
            cosine, ratio = _agreement(got, want)
            agreement[what] = (cosine, ratio)
            if not (cosine >= 1 - cos_tol and abs(ratio - 1) <= norm_tol):
                raise TrainingCheckError(
                    f"{cid}: the first step's {what} differs from plain FP32 training on the "
                    f"same samples: cosine {cosine:.6f} (needs >= {1 - cos_tol:g}), norm ratio "
                    f"{ratio:.4f} (needs 1 +- {norm_tol:g})"
                )
    grad_cos, grad_ratio = agreement.get("gradient", (None, None))
    upd_cos, upd_ratio = agreement.get("update", (None, None))
    first_step_s = step_times[0] if step_times else None
    if losses[0] is None:
        return CheckResult(None, None, rtol, [], skipped, grad_cos, grad_ratio, upd_cos,
                           upd_ratio, first_step_s, step_times)
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
    return CheckResult(reference, first, rtol, losses, skipped, grad_cos, grad_ratio, upd_cos,
                       upd_ratio, first_step_s, step_times)
