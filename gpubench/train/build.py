"""Turn a ``RunConfig`` into runnable objects: the one place strings become objects."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from gpubench.train import implementations
from gpubench.train.compilecache import CompileCache
from gpubench.train.config import ALLOC_CONF_VARS, GENERATED_DATASETS, RunConfig
from gpubench.train.data import (
    Batch,
    Placement,
    WaitTimer,
    build_loader,
    endless,
    resident_batches,
    seed_worker,
    shared_memory_reason,
)
from gpubench.train.implementations import Unsupported  # noqa: F401 - for every caller
from gpubench.train.parallel import (
    FSDP,
    DataParallel,
    DistributedDataParallel,
    ModelParallel,
    Pipeline,
    Single,
)
from gpubench.train.precision import Precision
from gpubench.train.precision import unsupported_reason as precision_reason
from gpubench.train.step import train_step
from gpubench.workloads.api import (
    BatchDataset,
    DataRequest,
    TrainModule,
    Workload,
    build_train_module,
    initial_train_module,
)
from gpubench.workloads.datasets import CachedDataset, default_data_dir
from gpubench.workloads.profiles import profile
from gpubench.workloads.storage import Evictor, dataset_files, eviction_unsupported_reason

LEARNING_RATES = {"sgd": 0.01, "adam": 1e-3, "adamw": 1e-3}
"""Chosen so that every model's loss falls within a few steps on a fixed batch."""

EPOCH_STEPS = 4
"""The synthetic dataset holds this many optimizer steps of samples; the loader then re-iterates."""


def build_optimizer(name: str, impl: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
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


def check_world_size(cfg: RunConfig) -> None:
    """Raise before any process starts when the machine has too few devices for ``cfg``."""
    need = cfg.parallelism.devices_needed(cfg.device)
    have = torch.cuda.device_count() if cfg.device == "cuda" else 0
    if need > have:
        raise ValueError(
            f"world_size {cfg.world_size} with parallel {cfg.parallel!r} needs {need} CUDA "
            f"devices; this machine has {have}"
        )


@functools.cache
def _stage_error(spec: str, profile: str, n: int) -> str | None:
    """Why the workload cannot be split into ``n`` stages (its ``stages`` raised), or None."""
    from gpubench.workloads.registry import resolve

    workload = resolve(spec, profile)
    try:
        workload.stages(build_train_module(workload).net, n)
    except ValueError as err:
        return f"{workload.name} cannot be split into {n} stages: {err}"
    return None


def unsupported_reason(cfg: RunConfig, *, check_devices: bool = True) -> str | None:
    """Why this machine cannot run ``cfg`` (the case is then skipped with it), or None.
    ``check_devices=False`` leaves out the device count (a torchrun job spans machines)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA device; none is available"
    if cfg.parallel == "dp" and cfg.device != "cuda":
        return "DataParallel needs CUDA devices"
    reason = implementations.unsupported(cfg) or shared_memory_reason(cfg)
    if reason:
        return reason
    if cfg.loader.cold and eviction_unsupported_reason():
        return eviction_unsupported_reason()
    try:
        if check_devices:
            check_world_size(cfg)
    except ValueError as err:
        return str(err)
    if cfg.parallel == "pipeline":
        if cfg.precision == "fp16":
            return "fp16 GradScaler is not wired into pipelining schedules; use bf16"
        if not cfg.workload.facts.single_tensor_input:
            return "pipeline stages take one input tensor; this workload's inputs are not one"
        if cfg.resolved_micro_batch % cfg.chunks:
            return f"micro_batch {cfg.resolved_micro_batch} does not split into {cfg.chunks} chunks"
    if cfg.checkpointing and cfg.workload.checkpointing is None and not cfg.workload.facts.blocks:
        from gpubench.workloads.api import NO_BLOCKS

        return f"activation checkpointing of {cfg.name}: {NO_BLOCKS}"
    if cfg.parallelism.splits_model:
        reason = _stage_error(cfg.model, cfg.profile, cfg.world_size)
        if reason:
            return reason
    reason = precision_reason(cfg.precision, cfg.device)
    if reason:
        return reason
    if cfg.compile_mode == "reduce-overhead" and cfg.device != "cuda":
        return "compile_mode reduce-overhead records CUDA graphs: it needs a CUDA device"
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
    """Everything one benchmark case (or one rank of it) runs, built and ready. Use it as a
    context manager: it enters the precision's math mode and closes the loader on exit."""

    cfg: RunConfig
    workload: Workload
    device: torch.device
    """This process's (first) device."""
    devices: list[torch.device]
    """Every device this process's step runs on (several for dp and model parallelism)."""
    reference_model: nn.Module | None
    """The plain FP32 model the check compares with (None on pipeline ranks without the loss;
    FSDP: an unsharded copy of the initial model)."""
    model: nn.Module
    """The model as trained: wrapped by the parallel strategy, possibly compiled."""
    optimizer: torch.optim.Optimizer
    precision: Precision
    strategy: Single
    batches: WaitTimer
    """Placed batches; ``batches.waits`` holds how long each one took to arrive."""
    loader: DataLoader | None
    """The DataLoader (None for device-resident data, which has none)."""
    after_step: Callable[[], None]
    """The techniques' ``after_step`` hooks, in one function."""
    micro_batch: int
    evictor: Evictor | None = None
    """Cold cases (``LoaderConfig.cold``): drops the dataset's files from the page cache
    before each epoch."""
    forward: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """The techniques' ``forward`` contexts, entered around each micro-batch's forward and
    backward."""
    facts: dict = field(default_factory=dict)
    """Record fields the techniques report of this case (``Implementation.facts``)."""
    counted_forward: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """The same of the counted techniques only: the step whose FLOPs and saved activations
    are counted leaves out the contexts of techniques that change neither (activation
    offloading's hooks would hide the saved tensors from the counter's)."""
    compile_cache: CompileCache | None = None
    """A compiled case's own Inductor and Triton cache folder (removed at ``close``)."""

    def __enter__(self) -> Case:
        self._math = self.precision.math_mode()
        self._math.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._math.__exit__(*exc)
        finally:
            self.close()

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks (pipeline stages share one batch)."""
        return self.cfg.global_batch

    @property
    def input_shape(self) -> list[int]:
        return self.workload.input_shape(self.micro_batch)

    def step(self, batches: Iterator[Batch] | None = None) -> torch.Tensor | None:
        """One training step on the next batches from the loader (or on ``batches``)."""
        return train_step(
            self.model,
            self.optimizer,
            self.batches if batches is None else batches,
            precision=self.precision,
            accum_steps=self.cfg.accum_steps,
            set_to_none=self.cfg.zero_grad_set_to_none,
            after_step=self.after_step,
            strategy=self.strategy,
            forward=self.forward,
        )

    def synchronize(self) -> None:
        """Wait until every device of this process has finished its queued work."""
        if self.device.type == "cuda":
            for device in self.devices:
                torch.cuda.synchronize(device)

    def synced_step(self) -> torch.Tensor | None:
        """A step whose device work has finished when it returns: what a timer may measure."""
        loss = self.step()
        self.synchronize()
        return loss

    def close(self) -> None:
        """End the loader's iteration so its worker processes exit with the case."""
        self.batches.close()
        iterator = getattr(self.loader, "_iterator", None)  # persistent workers live here
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        if self.cfg.offload:  # its saved activations' pinned host blocks, tens of GB
            implementations.release_pinned_memory()
        if self.compile_cache is not None:
            self.compile_cache.close()

    def fixed_batches(self) -> list[Batch]:
        """The next ``accum_steps`` micro-batches, already on the device, to train on repeatedly."""
        return list(itertools.islice(self.batches, self.cfg.accum_steps))


def _strategy(cfg: RunConfig, rank: int, devices: list[torch.device],
              precision: Precision) -> Single:
    workload = cfg.workload
    match cfg.parallel:
        case "single":
            return Single()
        case "dp":
            return DataParallel(cfg.world_size)
        case "ddp":
            return DistributedDataParallel(rank, cfg.world_size, devices[0], cfg.ddp_no_sync)
        case "fsdp":
            return FSDP(rank, cfg.world_size, devices[0], cfg.fsdp_mixed_precision)
        case "model":
            if cfg.device != "cuda":  # the stages share the CPU
                devices = devices * cfg.world_size
            return ModelParallel(devices, workload.stages, workload.loss_fn)
        case "pipeline":
            return Pipeline(rank, cfg.world_size, devices[0], cfg.chunks, cfg.schedule,
                            precision, cfg.accum_steps, workload.stages, workload.loss_fn)
    raise ValueError(f"unknown parallel {cfg.parallel!r}")


def build_dataset(cfg: RunConfig, length: int, data_dir: Path | None) -> Dataset:
    """The dataset of ``cfg.loader``: ``length`` samples from ``make_batch``, or the
    workload's own dataset (generated into ``data_dir`` on first use)."""
    loader = cfg.loader
    if loader.dataset in GENERATED_DATASETS:
        return BatchDataset(cfg.workload, length, cfg.seed)
    size = loader.dataset_size or max(profile(cfg.profile).dataset_size, length)
    request = DataRequest(root=data_dir or default_data_dir(), size=size, seed=cfg.seed)
    dataset = cfg.workload.dataset_factory(loader.dataset)(request)
    if loader.cached:
        return CachedDataset(dataset, loader.cache_items or len(dataset))
    return dataset


def build(cfg: RunConfig, rank: int = 0, local_rank: int | None = None,
          data_dir: Path | None = None) -> Case:
    """Build the model, optimizer, precision policy, strategy and data stream for ``cfg`` (as
    ``rank`` of a multi-process case, on the machine's device ``local_rank`` (default: rank);
    its process group must already be initialised). On-disk datasets live in ``data_dir``
    (default ``$GPUBENCH_DATA_DIR`` or ``~/.cache/gpubench/data``)."""
    workload = cfg.workload
    if cfg.expandable_segments and cfg.device == "cuda" and not any(
            "expandable_segments:True" in os.environ.get(v, "") for v in ALLOC_CONF_VARS):
        # The allocator took its settings when CUDA started; building here would measure the
        # default allocator under this case's name.
        raise RuntimeError(f"{cfg.id}: expandable_segments needs PYTORCH_CUDA_ALLOC_CONF="
                           "expandable_segments:True before CUDA starts: run it in a worker "
                           "process started with it (gpubench.measure.runner.launcher)")
    local = rank if local_rank is None else local_rank
    devices = [torch.device(d) for d in cfg.parallelism.process_devices(cfg.device, local)]
    device = devices[0]
    micro_batch = cfg.resolved_micro_batch
    precision = Precision(cfg.precision, device.type, sharded=cfg.parallel == "fsdp")
    strategy = _strategy(cfg, rank, devices, precision)
    # Every rank and case of a model starts from the same weights (initialised once).
    eager: TrainModule = initial_train_module(workload, cfg.seed, cfg.checkpointing)
    memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
    eager = eager.to(device=device, memory_format=memory_format).train()
    wrapped = strategy.wrap(eager)
    reference = strategy.reference(eager, wrapped)
    impls = implementations.implementations(cfg)
    for impl in impls:
        wrapped = impl.wrap(wrapped)
    forward = implementations.forward_context(impls)
    counted = [i for i in impls if i.technique.counted]
    compile_cache = None
    if cfg.compile:
        # A fresh dynamo per compiled case: no compiled code, cache-size limit or recompile
        # record (``guard_failures``, read into the record as ``dynamo_recompiles``) carried over;
        # and a fresh Inductor/Triton cache on disk: nothing compiled by an earlier case or run.
        torch._dynamo.reset()
        compile_cache = CompileCache.open()
    model = torch.compile(wrapped, mode=cfg.compile_mode) if cfg.compile else wrapped
    optimizer = build_optimizer(cfg.optimizer, cfg.optimizer_impl, list(wrapped.parameters()))
    replicas = cfg.parallelism.replicas
    placement = Placement(
        strategy.input_device(device), non_blocking=cfg.loader.non_blocking,
        channels_last=cfg.channels_last,
    )
    loader, evictor = None, None
    if cfg.loader.dataset == "device-resident":
        # One optimizer step of micro-batches, made on the device once and reused every step:
        # no loader, collation or host-to-device copy in a timed round (and, held across the
        # step, as little extra device memory as one step's inputs).
        resident = resident_batches(workload, micro_batch, cfg.accum_steps, cfg.seed,
                                    placement, replica=rank if replicas > 1 else 0)
        batches = WaitTimer(itertools.cycle(resident), lambda batch: batch)
    else:
        dataset = build_dataset(cfg, micro_batch * cfg.accum_steps * EPOCH_STEPS * replicas,
                                data_dir)
        evictor = (Evictor(dataset_files(dataset, data_dir or default_data_dir()))
                   if cfg.loader.cold else None)
        sampler = None
        if replicas > 1:
            # Each replica reads its own shard; the seed makes the shuffle agree across ranks.
            sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank,
                                         shuffle=True, seed=cfg.seed, drop_last=True)
        loader = build_loader(
            dataset, cfg.loader, micro_batch, cfg.seed, sampler=sampler,
            worker_init_fn=functools.partial(seed_worker, base_seed=cfg.seed, rank=rank),
        )
        batches = WaitTimer(endless(loader, evictor), placement)
    return Case(
        cfg=cfg,
        workload=workload,
        device=device,
        devices=devices,
        reference_model=reference,
        model=model,
        optimizer=optimizer,
        precision=precision,
        strategy=strategy,
        batches=batches,
        loader=loader,
        after_step=implementations.after_step(impls),
        micro_batch=micro_batch,
        evictor=evictor,
        forward=forward,
        facts=implementations.facts(impls),
        counted_forward=forward if len(counted) == len(impls)
        else implementations.forward_context(counted),
        compile_cache=compile_cache,
    )
