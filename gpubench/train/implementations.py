"""What a declared technique does to a case: its implementation object.

A technique whose declaration (``gpubench.train.techniques``) names an ``implementation`` gets
one object of that class for every case whose value differs from the technique's default.
``gpubench.train.build`` calls its hooks; each hook's default does nothing, so an object
overrides only what its technique changes:

- ``unsupported()``: why this machine cannot run the case (it is skipped with the reason);
- ``wrap(model)``: the model as trained (after the parallel strategy, before ``torch.compile``);
- ``forward()``: a context entered around each micro-batch's forward and backward;
- ``after_step()``: called after each optimizer step;
- ``facts()``: record fields saying what it did to the case (the layers FP8 converted).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gpubench.train.techniques import TECHNIQUES

if TYPE_CHECKING:
    from gpubench.train.config import RunConfig


class Unsupported(Exception):
    """This machine cannot run the case; the message says why (benchmarks skip with it)."""


class Implementation:
    """A technique's effect on one case: ``value`` is the case's value of the technique's field,
    ``cfg`` the whole case."""

    technique: Any = None
    """Its declaration (``gpubench.train.techniques.Technique``), set by ``implementations``."""

    def __init__(self, value: Any, cfg: RunConfig) -> None:
        self.value = value
        self.cfg = cfg

    def unsupported(self) -> str | None:
        """Why this machine cannot run the case, or None."""
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model the case trains (the parallel strategy's wrapper, not yet compiled)."""
        return model

    def forward(self) -> contextlib.AbstractContextManager:
        """A context around each micro-batch's forward and backward."""
        return contextlib.nullcontext()

    def after_step(self) -> None:
        """Called after every optimizer step."""

    def facts(self) -> dict:
        """Record fields that say what the technique did to this case (after ``wrap``)."""
        return {}


class EmptyCache(Implementation):
    """``torch.cuda.empty_cache()`` after every step: the caching allocator returns its unused
    blocks to the driver (the CPU allocator keeps no cache: nothing to do there)."""

    def after_step(self) -> None:
        if self.cfg.device == "cuda":
            torch.cuda.empty_cache()


class ExpandableSegments(Implementation):
    """The allocator option itself is set in the case's worker process before CUDA starts
    (``RunConfig.worker_env``); ``build`` refuses to build the case where it is missing."""

    def unsupported(self) -> str | None:
        if self.cfg.device != "cuda":
            return ("expandable_segments configures the CUDA caching allocator; the CPU "
                    "allocator has no segments")
        return None


class ActivationOffload:
    """The tensors autograd saves in a forward go to host memory, and come back in its
    backward: run the forward under ``saved_tensors()``. The ``offload`` technique's hooks,
    importable as they are measured (``gpubench tune``'s snippet does: ``offload =
    ActivationOffload("cuda")`` once, then ``with offload.saved_tensors():`` around each
    forward).

    On CUDA the hooks are gpubench's own rather than ``torch.autograd.graph.save_on_cpu``,
    whose packing changed between releases (torch 2.11's copies to pinned memory with a
    *blocking* device-to-host copy, so the forward waits for every copy; later releases copy
    with ``non_blocking``), which would make the time, and the offload verdict, depend on the
    torch version. Here, on every version: each saved tensor is copied into page-locked host
    memory on a side stream (after the work that produced it), ``non_blocking``, so the copies
    overlap the forward; the device tensor is kept from reuse until its copy has run
    (``record_stream``); the backward's stream waits for the copy's event before copying it
    back, ``non_blocking``. On the CPU: ``save_on_cpu`` (the activations already live in host
    memory)."""

    def __init__(self, device: str) -> None:
        self.device = str(device)
        self._stream = None

    def saved_tensors(self) -> contextlib.AbstractContextManager:
        """The context to run a forward in (its backward may run outside it)."""
        if not self.device.startswith("cuda"):
            return torch.autograd.graph.save_on_cpu(pin_memory=False)
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor):
        if not tensor.is_cuda or tensor.is_sparse:
            return tensor.device, tensor, None
        if self._stream is None:
            self._stream = torch.cuda.Stream(tensor.device)
        stream = self._stream
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                           pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        tensor.record_stream(stream)
        return tensor.device, host, done

    @staticmethod
    def _unpack(packed) -> torch.Tensor:
        device, host, done = packed
        if done is None:
            return host
        torch.cuda.current_stream(device).wait_event(done)
        return host.to(device, non_blocking=True)


class Offload(Implementation):
    """Every tensor autograd saves in the micro-batch's forward goes to host memory, and comes
    back in its backward (``ActivationOffload``: on CUDA pinned copies on a side stream,
    ``non_blocking``, the same on every torch version). Inside an activation-checkpointed
    block, checkpointing's own hooks apply (what it keeps are the block's inputs, offloaded by
    this outside it). The pinned blocks the case used are handed back at its end
    (``release_pinned_memory``)."""

    def __init__(self, value: Any, cfg: RunConfig) -> None:
        super().__init__(value, cfg)
        self._offload = ActivationOffload(cfg.device)

    def forward(self) -> contextlib.AbstractContextManager:
        return self._offload.saved_tensors()


def release_pinned_memory() -> bool:
    """Hand the page-locked host blocks the CUDA caching host allocator keeps back to the
    system (``torch._C._host_emptyCache``): an offload case's saved activations (tens of GB at
    the GPU shapes) stay pinned in its cache otherwise, for the rest of the process. Returns
    whether it ran (CUDA initialised, and the binding exists in this torch)."""
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is None or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    torch.cuda.synchronize()  # no copy still reads a block being freed
    empty()
    return True


class AttentionBackend(Implementation):
    """``scaled_dot_product_attention`` pinned to one kernel around each forward and backward
    (the backward runs the kernel its forward chose)."""

    BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                "cudnn": "CUDNN_ATTENTION", "math": "MATH"}

    def _backend(self):
        from torch.nn.attention import SDPBackend

        return getattr(SDPBackend, self.BACKENDS[self.value])

    def unsupported(self) -> str | None:
        if not self.cfg.workload.facts.uses_sdpa:
            return (f"attention {self.value}: {self.cfg.name}'s forward calls no "
                    "scaled_dot_product_attention")
        return sdpa_reason(self.value, self.cfg.device, self.cfg.precision)

    def forward(self) -> contextlib.AbstractContextManager:
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self._backend())


class AttnImplementation(Implementation):
    """The attention code of the workload's Hugging Face transformers model, switched
    (``set_attn_implementation``) in a structural copy of the model with a config of its own,
    so the check's FP32 reference keeps the model's default attention."""

    def unsupported(self) -> str | None:
        if self.cfg.workload.facts.hf_attention is None:
            return (f"attn_implementation {self.value}: {self.cfg.name} is not a Hugging Face "
                    "transformers model")
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        from gpubench.workloads.api import hf_model

        if self.value == "default":
            return model
        config = hf_model(model).config
        clone, own = structural_copy(model), copy.deepcopy(config)
        for module in clone.modules():
            if getattr(module, "config", None) is config:
                module.config = own
        hf_model(clone).set_attn_implementation(self.value)
        return clone


@functools.cache
def sdpa_reason(backend: str, device: str, precision: str) -> str | None:
    """Why the ``backend`` kernel cannot run forward and backward here at the precision's
    compute dtype (a tiny attention tried under it), or None."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device == "cuda" and not torch.cuda.is_available():
        return None  # the case is skipped for its device already
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    q = torch.randn(1, 2, 16, 16, device=device, dtype=dtype, requires_grad=True)
    try:
        with sdpa_kernel(getattr(SDPBackend, AttentionBackend.BACKENDS[backend])):
            torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"attention {backend} has no kernel for {precision} on {device}: {first}"
    return None


class Float8(Implementation):
    """FP8 training (the fp8 precisions; others pass through): the model's linears that
    ``fp8_layers`` picks become torchao ``Float8Linear``s, whose matmuls cast their inputs,
    weights and output gradients to float8 with dynamic scales (per tensor for ``fp8``, per row
    for ``fp8-rowwise``) and run ``torch._scaled_mm``; the rest of the step runs in bf16
    autocast (``gpubench.train.precision``). On a device without FP8 units the same casts and
    scales are emulated (torchao's ``emulate``), so the training check and the FLOP count are
    those of the real recipe, and its speed is not FP8's.

    The conversion swaps modules in a structural copy of the model whose parameters are the
    model's own, so the check's FP32 reference (the unconverted model) is left as it was."""

    def _active(self) -> bool:
        from gpubench.train.techniques import FP8_PRECISIONS

        return self.value in FP8_PRECISIONS

    def unsupported(self) -> str | None:
        if not self._active():
            return None
        from gpubench.train.precision import fp8_reason

        if fp8_reason():
            return fp8_reason()
        if self.cfg.parallel != "single":
            return (f"{self.value} cases run on one device: torchao converts the linears before "
                    f"DDP or FSDP wraps the model, which parallel {self.cfg.parallel!r} does "
                    "here after")
        keeps = self.keeps()
        if not any(keeps(nn.Linear(i, o, device="meta"), name)
                   for name, o, i in self.cfg.workload.facts.linears):
            return self._none_kept()
        return None

    def _none_kept(self) -> str:
        return (f"{self.value}: none of {self.cfg.name}'s "
                f"{len(self.cfg.workload.facts.linears)} nn.Linear layers passes the fp8_layers "
                f"{self.cfg.fp8_layers!r} filter ("
                + ("torchao's thresholds, measured on an H100: try fp8_layers 'all'"
                   if self.cfg.fp8_layers == "auto" else "dimensions multiples of 16") + ")")

    def config(self):
        """torchao's ``Float8LinearConfig`` of the case's recipe, emulated without FP8 units."""
        import dataclasses

        from gpubench.train.precision import fp8_units, import_float8
        from gpubench.train.techniques import FP8_PRECISIONS

        recipe = import_float8().Float8LinearConfig.from_recipe_name(FP8_PRECISIONS[self.value])
        return dataclasses.replace(recipe, emulate=not fp8_units(self.cfg.device))

    def keeps(self):
        """The filter ``(module, fqn) -> bool`` of the linears to convert."""
        from gpubench.train.techniques import FP8_PRECISIONS

        if self.cfg.fp8_layers == "auto":
            from gpubench.train.precision import import_float8

            return import_float8()._auto_filter_for_recipe(FP8_PRECISIONS[self.value],
                                                           filter_fqns=[])

        def multiples_of_16(module: nn.Module, fqn: str) -> bool:
            out_features, in_features = module.weight.shape
            return out_features % 16 == 0 and in_features % 16 == 0

        return multiples_of_16

    def wrap(self, model: nn.Module) -> nn.Module:
        if not self._active():
            return model
        from gpubench.train.precision import import_float8

        keeps, converted = self.keeps(), []

        def chosen(module: nn.Module, fqn: str) -> bool:
            if keeps(module, fqn):
                converted.append(fqn)
                return True
            return False

        model = import_float8().convert_to_float8_training(
            structural_copy(model), config=self.config(), module_filter_fn=chosen)
        if not converted:
            raise Unsupported(self._none_kept())
        self.converted = converted
        return model

    def facts(self) -> dict:
        if not self._active():
            return {}
        return {"fp8_converted": list(getattr(self, "converted", [])),
                "fp8_emulated": self.config().emulate}


def structural_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module``'s tree of modules that shares its parameters and buffers: modules
    swapped in the copy (a conversion) leave the original's tree as it was."""
    clone = copy.copy(module)
    clone._modules = {name: None if child is None else structural_copy(child)
                      for name, child in module._modules.items()}
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


@functools.cache
def _load(path: str) -> type[Implementation]:
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Implementation)):
        raise TypeError(f"{path} is not a gpubench.train.implementations.Implementation")
    return cls


def implementations(cfg: RunConfig) -> list[Implementation]:
    """The implementation objects of ``cfg``'s techniques that differ from their defaults, in
    declaration order."""
    found = []
    for t in TECHNIQUES:
        if t.implementation is None:
            continue
        value = getattr(cfg.loader if t.loader else cfg, t.field)
        if value != t.default:
            impl = _load(t.implementation)(value, cfg)
            impl.technique = t
            found.append(impl)
    return found


def unsupported(cfg: RunConfig) -> str | None:
    """The first reason one of ``cfg``'s implementation objects gives, or None."""
    for impl in implementations(cfg):
        reason = impl.unsupported()
        if reason:
            return reason
    return None


def facts(impls: list[Implementation]) -> dict:
    """Every object's ``facts()``, in one mapping."""
    out: dict = {}
    for impl in impls:
        out.update(impl.facts())
    return out


def forward_context(impls: list[Implementation]) -> Callable[[], contextlib.ExitStack]:
    """A function that enters every object's ``forward()`` context (a fresh stack per call)."""

    def enter() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for impl in impls:
            stack.enter_context(impl.forward())
        return stack

    return enter


def after_step(impls: list[Implementation]) -> Callable[[], None]:
    """One function calling every object's ``after_step`` in turn."""
    hooks = [impl.after_step for impl in impls
             if type(impl).after_step is not Implementation.after_step]

    def run() -> None:
        for hook in hooks:
            hook()

    return run
