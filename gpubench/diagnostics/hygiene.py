"""Memory hygiene of the training loop, measured: what ``torch.no_grad()`` and
``torch.inference_mode()`` save in an evaluation pass, and what ``del`` frees of a tensor the loop
keeps, on a workload's own model and batches.

Each measurement is an A/B of two loops on the same model (``build_train_module``, the
baseline's fp32 configuration) and the same batches (``Workload.make_batch``):

- ``evaluation``: one forward on a batch, as a validation pass, with autograd on (``grad``),
  under ``torch.no_grad()`` and under ``torch.inference_mode()``;
- ``kept_graph``: a loss computed with autograd on and kept by the loop (for logging, say) while
  the next training step (forward and backward) runs, against the loop that deletes it first:
  the kept loss, a few bytes itself, holds its whole graph, with every activation autograd
  saved for a backward that never comes;
- ``kept_outputs``: the previous step's outputs and loss still referenced during the next step
  (the variables are rebound only when the next forward returns), against ``del outputs, loss``
  after ``backward()``: backward has already freed their graph, so what ``del`` frees is the
  outputs' own storage.

Figures, exact on any device: ``saved_bytes``, the bytes autograd saved for backward in the
window, and ``held_saved_bytes``, the most of them held at one time
(``gpubench.measure.memory.SavedActivations``: counted by storage, parameters left out);
``kept_bytes``,
the storage of the tensors the loop kept (what stays alive besides their graph); their sum
``held_bytes``. On CUDA also ``peak_bytes``: the allocator's peak (``max_memory_allocated``) above
what was allocated when the window began.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from gpubench.measure.memory import SavedActivations
from gpubench.workloads.api import TrainModule, build_train_module, call_model
from gpubench.workloads.registry import resolve

EVAL_MODES = ("grad", "no_grad", "inference_mode")
"""How an evaluation pass runs: autograd on (the forgotten ``no_grad``), ``torch.no_grad()``,
``torch.inference_mode()``."""

_CONTEXTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "grad": contextlib.nullcontext, "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


@dataclass(frozen=True)
class Measurement:
    """One loop's memory figures (bytes; see the module doc)."""

    name: str
    saved_bytes: int
    """Bytes autograd saved for backward in the window (exact)."""
    held_saved_bytes: int
    """The most saved bytes held alive at one time in the window (exact)."""
    kept_bytes: int
    """Storage of the tensors the loop kept referenced through the window (exact)."""
    peak_bytes: int | None
    """CUDA: the allocator's peak above what was allocated at the window's start; None
    elsewhere."""

    @property
    def held_bytes(self) -> int:
        """Saved activations held at their peak plus the tensors kept: what the loop keeps
        alive that the device must hold (exact)."""
        return self.held_saved_bytes + self.kept_bytes


@dataclass
class Setup:
    """A workload's model and two batches on one device."""

    module: TrainModule
    batches: list[tuple[Any, Any]]
    device: torch.device
    micro_batch: int


def _to(device: torch.device):
    return lambda x: x.to(device) if isinstance(x, torch.Tensor) else x


def setup(spec: str, profile: str, device: str = "cpu", micro_batch: int | None = None,
          seed: int = 0) -> Setup:
    """The workload ``spec``'s model (seeded, dropout off, fp32) and two of its batches of
    ``micro_batch`` samples (default: the workload's) on ``device``."""
    workload = resolve(spec, profile)
    torch.manual_seed(seed)
    dev = torch.device(device)
    module = build_train_module(workload).to(dev).train()
    n = micro_batch or workload.micro_batch
    batches = [tree_map(_to(dev), workload.sample_batch(n, seed + i)) for i in range(2)]
    return Setup(module, batches, dev, n)


def _storage_bytes(obj: Any) -> int:
    """Bytes of the distinct storages of the tensors in ``obj`` (nested tuples, lists, dicts)."""
    seen: dict[int, int] = {}
    for t in tree_flatten(obj)[0]:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def _window(s: Setup, name: str, body: Callable[[], Any]) -> Measurement:
    """Run ``body`` with saved activations counted (and the CUDA peak measured); what it
    returns is what the loop kept through the window."""
    s.module.zero_grad(set_to_none=True)
    cuda = s.device.type == "cuda"
    start = 0
    if cuda:
        torch.cuda.synchronize(s.device)
        torch.cuda.reset_peak_memory_stats(s.device)
        start = torch.cuda.memory_allocated(s.device)
    # Micro-batches split where autograd has released everything saved (a deleted graph, a
    # backward): a storage freed there and another at its address later count as two.
    with SavedActivations(s.module) as saved:
        kept = body()
    peak = None
    if cuda:
        torch.cuda.synchronize(s.device)
        peak = max(0, torch.cuda.max_memory_allocated(s.device) - start)
    result = Measurement(name, saved.total_bytes, saved.peak_bytes, _storage_bytes(kept), peak)
    del kept
    s.module.zero_grad(set_to_none=True)
    return result


def evaluation(s: Setup, mode: str = "grad") -> Measurement:
    """One evaluation forward (``model.eval()``) of the first batch with autograd on
    (``grad``), under ``torch.no_grad()`` or under ``torch.inference_mode()``; the validation
    loss is kept, as a loop keeps it until it reads ``.item()``."""
    if mode not in _CONTEXTS:
        raise ValueError(f"mode must be one of {', '.join(EVAL_MODES)}; got {mode!r}")
    s.module.eval()
    try:
        def body():
            with _CONTEXTS[mode]():
                return s.module(*s.batches[0])
        return _window(s, f"evaluation ({mode})", body)
    finally:
        s.module.train()


def kept_graph(s: Setup, keep: bool) -> Measurement:
    """A training step (forward and backward of the second batch) while the loop still holds a
    loss computed with autograd on from the first batch (``keep``), or after ``del`` of it."""
    def body():
        logged = s.module(*s.batches[0])  # e.g. kept for logging, not as logged.item()
        if not keep:
            del logged
            logged = None
        loss = s.module(*s.batches[1])
        loss.backward()
        return logged
    return _window(s, "kept loss with its graph" if keep else "loss deleted (del)", body)


def _forward(s: Setup, batch: tuple[Any, Any]) -> tuple[Any, torch.Tensor]:
    """(outputs, loss) of one batch: the network's outputs, then the workload's loss."""
    inputs, targets = batch
    if s.module.loss_fn is None:  # the model computes its loss itself
        loss = s.module(inputs, targets)
        return loss, loss
    outputs = call_model(s.module.net, inputs)
    return outputs, s.module.loss_fn(outputs, targets)


def kept_outputs(s: Setup, keep: bool) -> Measurement:
    """Two training steps; in the second the loop still references the first step's outputs
    and loss (``keep``: the names are rebound only when the next forward returns), or they were
    deleted after the first step's ``backward()`` (``del outputs, loss``)."""
    def body():
        outputs, loss = _forward(s, s.batches[0])
        loss.backward()
        if not keep:
            del outputs, loss
            outputs = loss = None
        new_outputs, new_loss = _forward(s, s.batches[1])
        new_loss.backward()
        del new_outputs, new_loss
        return (outputs, loss)
    return _window(s, "outputs kept after backward" if keep else "outputs deleted (del)", body)


def measure(spec: str, profile: str, device: str = "cpu",
            micro_batch: int | None = None) -> dict:
    """Every A/B of this module on the workload ``spec``, as plain data (``gpubench memory``
    writes it into ``memory.json`` under ``hygiene``; ``gpubench.analysis.advice`` judges it)."""
    s = setup(spec, profile, device, micro_batch)
    try:
        return {
            "micro_batch": s.micro_batch,
            "device": s.device.type,
            "evaluation": {m: _plain(evaluation(s, m)) for m in EVAL_MODES},
            "kept_graph": {"kept": _plain(kept_graph(s, True)),
                           "deleted": _plain(kept_graph(s, False))},
            "kept_outputs": {"kept": _plain(kept_outputs(s, True)),
                             "deleted": _plain(kept_outputs(s, False))},
        }
    finally:
        del s
        if device == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()


def _plain(m: Measurement) -> dict:
    return {**asdict(m), "held_bytes": m.held_bytes}
