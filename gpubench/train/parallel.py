"""Parallel strategies: how one training step is spread over devices and processes.

A strategy wraps the model, places the loss computation, and says how to skip gradient
synchronization; the single-device strategy's forms are no-ops, so ``train_step`` is the same
function for every strategy.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils._pytree import tree_map

from gpubench.train.precision import Precision


class Single:
    """One device, one process.

    Besides wrapping the model and running its forward and backward, a strategy holds the
    facts the training check needs about it (``gpubench.train.checks``): which model the FP32
    reference is, how the step splits a micro-batch for the loss, how the reference's
    gradients are paired with the trained parameters and averaged, and whether this rank
    computes the loss."""

    rank = 0
    world_size = 1
    computes_loss = True
    """This rank computes the loss (a pipeline's last stage only)."""
    averages_gradients = False
    """The ranks' gradients are averaged (data-parallel replicas): so is the reference's."""
    keeps_reference = True
    """The FP32 reference model stays alive after the check (False: it would inflate this
    stage's or shard's peak memory, and is dropped)."""

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def reference(self, eager: nn.Module, wrapped: nn.Module) -> nn.Module | None:
        """The plain FP32 model the check compares with: the unwrapped model by default."""
        return eager

    def reference_chunks(self) -> int:
        """How the step splits each micro-batch for the loss (pipeline chunks, DataParallel
        replicas), so that the reference normalizes the same way (BatchNorm statistics per
        chunk)."""
        return 1

    def pair_parameters(self, reference: nn.Module, trained: list[nn.Parameter]
                        ) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(trained parameters the reference shares, the reference's own for each): the same
        tensors where the reference is the trained model unwrapped."""
        shared = {id(p) for p in reference.parameters()}
        params = [p for p in trained if id(p) in shared and p.requires_grad]
        return params, params

    def input_device(self, device: torch.device) -> torch.device:
        """Where a batch is placed for the step."""
        return device

    def count_module(self, model: nn.Module) -> nn.Module | None:
        """The module whose step counts this case's FLOPs and saved activations in the
        calling thread, where the trained model runs parts of its step in other threads
        (None: the trained model itself)."""
        return None

    def no_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def forward_backward(
        self, model: nn.Module, inputs, targets, precision: Precision, accum_steps: int
    ) -> torch.Tensor | None:
        """Forward and backward one micro-batch; return its (scaled) loss, detached."""
        with precision.autocast():
            loss = model(inputs, targets)
            if accum_steps > 1:
                # Dividing by k makes k accumulated micro-batches equal one batch k times
                # larger (skipped at k=1: an extra op in forward and backward for nothing).
                loss = loss / accum_steps
        precision.backward(loss)
        return loss.detach()


def autocast_state(device_type: str) -> tuple[bool, torch.dtype, bool]:
    """This thread's autocast state for ``device_type``: (enabled, dtype, weight-cast cache)."""
    return (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type),
            torch.is_autocast_cache_enabled())


class ReplicaUnderAutocast:
    """A replica called under an autocast state captured in another thread.

    Autocast state is thread-local, and ``nn.DataParallel`` runs each replica's forward in a
    thread of its own (``parallel_apply``), which re-enters autocast with the enabled flag
    only: the replica then gets the device's *default* autocast dtype (float16 on CUDA), so a
    bf16 case would train in fp16. Called through this, the replica runs with the caller's
    dtype and cache setting."""

    def __init__(self, replica: nn.Module, device_type: str,
                 state: tuple[bool, torch.dtype, bool]):
        self.replica, self.device_type, self.state = replica, device_type, state

    def __call__(self, *args, **kwargs):
        enabled, dtype, cache = self.state
        if not enabled:  # parallel_apply has already disabled it in the thread
            return self.replica(*args, **kwargs)
        with torch.autocast(self.device_type, dtype=dtype, cache_enabled=cache):
            return self.replica(*args, **kwargs)


class _DataParallel(nn.DataParallel):
    """``nn.DataParallel`` whose replica threads run under the calling thread's autocast
    state (dtype included), see ``ReplicaUnderAutocast``."""

    def parallel_apply(self, replicas, inputs, kwargs):
        device_type = self.src_device_obj.type
        state = autocast_state(device_type)
        wrapped = [ReplicaUnderAutocast(r, device_type, state) for r in replicas]
        return super().parallel_apply(wrapped, inputs, kwargs)


class DataParallelLoss(nn.Module):
    """``nn.DataParallel`` over a module returning a scalar loss: replicas return one loss each,
    gathered into a vector on the first device; their mean is the batch loss. ``.dp.module`` is
    the model. Each replica runs under the precision's autocast (the caller's: the step enters
    it around this forward), bf16 staying bf16 in the replica threads.

    Replica forwards run in threads, which ``FlopCounterMode`` and ``saved_tensors_hooks`` (both
    thread-local) do not see: ``CaseProgram.count`` counts the unwrapped ``.dp.module``."""

    def __init__(self, model: nn.Module, device_ids: list[int]):
        super().__init__()
        self.dp = _DataParallel(model, device_ids=device_ids)

    def forward(self, inputs, targets):
        return self.dp(inputs, targets).mean()


class DataParallel(Single):
    def __init__(self, world_size: int):
        self.world_size = world_size

    def wrap(self, model: nn.Module) -> nn.Module:
        return DataParallelLoss(model, list(range(self.world_size)))

    def reference_chunks(self) -> int:
        return self.world_size  # one chunk of the micro-batch per replica

    def count_module(self, model: nn.Module) -> nn.Module:
        """The unwrapped model: replica forwards run in threads of their own, which the
        thread-local counters do not see, and compute its function on shards of the
        micro-batch."""
        return getattr(model, "_orig_mod", model).dp.module  # torch.compile: _orig_mod


class DistributedDataParallel(Single):
    """One replica per process; gradients all-reduced during backward."""

    averages_gradients = True

    def __init__(self, rank: int, world_size: int, device: torch.device, no_sync: bool):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.skip_sync = no_sync

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DDP(model, device_ids=ids)

    def no_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        # no_sync defers the all-reduce: gradients accumulate locally until the last micro-batch.
        return model.no_sync() if enabled and self.skip_sync else contextlib.nullcontext()


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards (and gathers) one at a time: every child holding parameters of
    the model's ``nn.ModuleList`` / ``nn.Sequential`` containers (transformer layers, ResNet
    blocks), outermost first, none inside another; the rest stays with the root."""
    units: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or not isinstance(module, nn.ModuleList | nn.Sequential):
            continue
        for child in module.children():
            if id(child) not in inside and any(True for _ in child.parameters()):
                units.append(child)
                inside.update(id(m) for m in child.modules())
    return units


class FSDP(Single):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): one data-parallel replica per process
    whose parameters, gradients and optimizer state are sharded over the ranks. Each block
    (``shard_units``) is its own unit: its parameters are all-gathered before its forward and
    backward and freed after; gradients are reduce-scattered to their shards. With accumulation,
    gradients are reduced on the last micro-batch only (``set_requires_gradient_sync``).

    ``mixed_precision``: FSDP's ``MixedPrecisionPolicy`` (bf16 parameters gathered for compute,
    fp32 gradient reduction, fp32 shards for the optimizer). Normalization layers with running
    statistics (BatchNorm) are units of their own kept in fp32 (bf16 output), since their fp32
    buffers do not mix with bf16 parameters."""

    averages_gradients = True
    keeps_reference = False

    def __init__(self, rank: int, world_size: int, device: torch.device,
                 mixed_precision: bool = False):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.mixed_precision = mixed_precision
        self.module: nn.Module | None = None
        self.unsharded: nn.Module | None = None

    def reference(self, eager: nn.Module, wrapped: nn.Module) -> nn.Module | None:
        """The unsharded copy of the initial model ``wrap`` kept (FSDP shards the model in
        place and it cannot be copied after), handed over: the strategy keeps no reference."""
        unsharded, self.unsharded = self.unsharded, None
        return unsharded

    def pair_parameters(self, reference, trained):
        """FSDP trains sharded parameters of its own (DTensors): paired with the unsharded
        reference's by name."""
        by_name = dict(reference.named_parameters())
        named = [(p, by_name.get(n)) for n, p in self.module.named_parameters()]
        own = {id(p): r for p, r in named if r is not None}
        params = [p for p in trained if id(p) in own and p.requires_grad]
        return params, [own[id(p)] for p in params]

    def wrap(self, model: nn.Module) -> nn.Module:
        import copy

        self.unsharded = copy.deepcopy(model)  # the check's reference, dropped after it
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.nn.modules.batchnorm import _BatchNorm

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = MixedPrecisionPolicy()
        if self.mixed_precision:
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                        output_dtype=torch.bfloat16)
            for norm in [m for m in model.modules() if isinstance(m, _BatchNorm)]:
                fully_shard(norm, mesh=mesh, mp_policy=fp32)
        for unit in shard_units(getattr(model, "net", model)):
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        self.module = fully_shard(model, mesh=mesh, mp_policy=policy)
        return self.module

    def no_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        # Set before each micro-batch's backward: reduce on the last one only, gradients of the
        # others accumulating unsharded on each rank.
        self.module.set_requires_gradient_sync(not enabled)
        return contextlib.nullcontext()


class SplitModel(nn.Module):
    """Model parallelism in one process: stage i on device i, activations copied between them.
    Behaves like the ``TrainModule`` it was split from: ``forward(inputs, targets) -> loss``."""

    def __init__(self, stages: list[nn.Module], devices: list[torch.device], loss_fn):
        super().__init__()
        self.stages = nn.ModuleList(s.to(d) for s, d in zip(stages, devices, strict=True))
        self.devices = devices
        self.loss_fn = loss_fn

    def forward(self, inputs: torch.Tensor, targets) -> torch.Tensor:
        x = inputs
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.to(device, non_blocking=True))
        return self.loss_fn(x, tree_map(lambda t: t.to(self.devices[-1]), targets))


class ModelParallel(Single):
    """The workload's stages over devices in one process (on the CPU they share it)."""

    def __init__(self, devices: list[torch.device], stages_fn, loss_fn):
        self.devices = devices
        self.world_size = len(devices)
        self.stages_fn, self.loss_fn = stages_fn, loss_fn

    def wrap(self, model: nn.Module) -> nn.Module:
        return SplitModel(self.stages_fn(model.net, self.world_size), self.devices, self.loss_fn)

    def reference(self, eager: nn.Module, wrapped: nn.Module) -> nn.Module:
        return wrapped  # the split model computes exactly the unsplit function

    def input_device(self, device: torch.device) -> torch.device:
        return self.devices[0]  # the first stage's


class AutocastStage(nn.Module):
    """A pipeline stage under the precision policy's autocast (schedules call stages directly)."""

    def __init__(self, stage: nn.Module, precision: Precision):
        super().__init__()
        self.stage = stage
        self.precision = precision

    def forward(self, x):
        with self.precision.autocast():
            out = self.stage(x)
        # Activations cross to the next stage by point-to-point sends, which need contiguous
        # tensors (a transpose in the user's model must not break the pipeline).
        return out.contiguous() if isinstance(out, torch.Tensor) else out


class Pipeline(Single):
    """One stage per process, fed ``chunks`` micro-batches per batch by a pipelining schedule
    (GPipe: all forwards then all backwards; 1F1B: interleaved, less activation memory)."""

    def __init__(self, rank: int, world_size: int, device: torch.device, chunks: int,
                 schedule: str, precision: Precision, accum_steps: int, stages_fn, loss_fn):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.chunks, self.schedule_name = chunks, schedule
        self.precision, self.accum_steps = precision, accum_steps
        self.stages_fn, self.loss_fn = stages_fn, loss_fn
        self.schedule = None

    keeps_reference = False

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1

    @property
    def computes_loss(self) -> bool:
        return self.is_last

    def reference(self, eager: nn.Module, wrapped: nn.Module) -> nn.Module:
        return eager  # every rank checks its stage's gradients

    def reference_chunks(self) -> int:
        return self.chunks

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage = self.stages_fn(model.net, self.world_size)[self.rank].to(self.device)
        module = AutocastStage(stage, self.precision)
        pipe_stage = PipelineStage(module, self.rank, self.world_size, self.device)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.schedule_name]
        accum, loss_fn = self.accum_steps, self.loss_fn

        chunks = self.chunks

        def chunk_loss(output, target):
            # The mean over chunks and accumulated micro-batches, as in the single-device step,
            # taken here: with scale_grads (the default) the schedule would divide *all* of the
            # stage's gradients by the chunk count after every step, the ones accumulated from
            # earlier micro-batches too (k micro-batches: the first divided k times).
            return loss_fn(output, target) / (chunks * accum)

        self.schedule = cls(pipe_stage, n_microbatches=chunks, loss_fn=chunk_loss,
                            scale_grads=False)
        return module

    def forward_backward(self, model, inputs, targets, precision, accum_steps):
        if self.rank == 0:
            self.schedule.step(inputs)
            return None
        if not self.is_last:
            self.schedule.step()
            return None
        losses: list[torch.Tensor] = []
        self.schedule.step(target=targets, losses=losses)
        # Chunk losses are means over equal chunks divided by chunks * k: their sum is the
        # micro-batch's loss divided by k, as the single-device step returns it.
        return torch.stack([x.detach() for x in losses]).sum()
