"""Turn a ``RunConfig`` into runnable objects: the one place strings become objects."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from gpubench.config import RunConfig
from gpubench.data import Batch, Placement, SyntheticDataset, build_loader, endless
from gpubench.models import build_model, input_shape, model_size
from gpubench.precision import Precision
from gpubench.precision import unsupported_reason as precision_reason
from gpubench.step import train_step

LEARNING_RATES = {"sgd": 0.01, "adam": 1e-3, "adamw": 1e-3}
"""Chosen so that every model's loss falls within a few steps on a fixed batch."""

EPOCH_STEPS = 4
"""The synthetic dataset holds this many optimizer steps of samples; the loader then re-iterates."""


def build_optimizer(
    name: str, impl: str, params: list[nn.Parameter]
) -> torch.optim.Optimizer:
    impl_kwargs = {} if impl == "default" else {impl: True}
    lr = LEARNING_RATES[name]
    match name:
        case "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=0.9, **impl_kwargs)
        case "adam":
            return torch.optim.Adam(params, lr=lr, **impl_kwargs)
        case "adamw":
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, **impl_kwargs)
    raise ValueError(f"unknown optimizer {name!r}")


def resolve_micro_batch(cfg: RunConfig) -> int:
    return cfg.micro_batch or model_size(cfg.model, cfg.profile).micro_batch


def unsupported_reason(cfg: RunConfig) -> str | None:
    """Why this machine cannot run ``cfg`` (the case is then skipped with it), or None."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA device; none is available"
    reason = precision_reason(cfg.precision, cfg.device)
    if reason:
        return reason
    if cfg.optimizer_impl != "default":
        try:
            probe = nn.Parameter(torch.zeros(2, device=cfg.device))
            opt = build_optimizer(cfg.optimizer, cfg.optimizer_impl, [probe])
            probe.grad = torch.zeros_like(probe)
            opt.step()
        except RuntimeError as err:
            return f"{cfg.optimizer} {cfg.optimizer_impl} is not supported on {cfg.device}: {err}"
    return None


@dataclass
class Case:
    """Everything one benchmark case runs, built and ready."""

    cfg: RunConfig
    device: torch.device
    eager_model: nn.Module
    model: nn.Module
    """``eager_model``, or its ``torch.compile`` wrapper."""
    optimizer: torch.optim.Optimizer
    precision: Precision
    batches: Iterator[Batch]
    placement: Placement
    after_step: Callable[[], None]
    micro_batch: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.cfg.accum_steps * self.cfg.world_size

    @property
    def input_shape(self) -> list[int]:
        return input_shape(self.cfg.model, self.cfg.profile, self.micro_batch)

    def step(self, batches: Iterator[Batch] | None = None) -> torch.Tensor:
        """One training step on the next batches from the loader (or on ``batches``)."""
        return train_step(
            self.model,
            self.optimizer,
            self.batches if batches is None else batches,
            precision=self.precision,
            accum_steps=self.cfg.accum_steps,
            set_to_none=self.cfg.zero_grad_set_to_none,
            after_step=self.after_step,
        )

    def synced_step(self) -> torch.Tensor:
        """A step whose device work has finished when it returns: what a timer may measure."""
        loss = self.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return loss

    def fixed_batches(self) -> Iterator[Batch]:
        """The same ``accum_steps`` micro-batches over and over, already on the device."""
        first = list(itertools.islice(self.batches, self.cfg.accum_steps))
        return itertools.cycle(first)


def _empty_cache(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.empty_cache
    return lambda: None  # the CPU allocator has no cache to release


def build(cfg: RunConfig) -> Case:
    """Build the model, optimizer, precision policy and data stream for ``cfg``."""
    device = torch.device(cfg.device)
    micro_batch = resolve_micro_batch(cfg)
    torch.manual_seed(cfg.seed)
    eager = build_model(cfg.model, cfg.profile, checkpointing=cfg.checkpointing)
    memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
    eager = eager.to(device=device, memory_format=memory_format).train()
    model = torch.compile(eager) if cfg.compile else eager
    optimizer = build_optimizer(cfg.optimizer, cfg.optimizer_impl, list(eager.parameters()))
    size = model_size(cfg.model, cfg.profile)
    dataset = SyntheticDataset(
        size, eager.kind, micro_batch * cfg.accum_steps * EPOCH_STEPS, cfg.seed
    )
    loader = build_loader(dataset, cfg.loader, micro_batch, cfg.seed)
    placement = Placement(
        device, non_blocking=cfg.loader.non_blocking, channels_last=cfg.channels_last
    )
    return Case(
        cfg=cfg,
        device=device,
        eager_model=eager,
        model=model,
        optimizer=optimizer,
        precision=Precision(cfg.precision, device.type),
        batches=map(placement, endless(loader)),
        placement=placement,
        after_step=_empty_cache(device) if cfg.empty_cache else (lambda: None),
        micro_batch=micro_batch,
    )
