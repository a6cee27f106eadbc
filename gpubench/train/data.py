"""Where batches come from: a dataset, a real ``DataLoader`` over it, and the copy to the device."""

from __future__ import annotations

import collections
import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.data import DataLoader, Dataset, Sampler

from gpubench.train.config import LoaderConfig

Batch = tuple[object, object]
"""(inputs, targets): tensors, or tuples/dicts of tensors (see ``gpubench.Workload``)."""


def seed_worker(worker_id: int, *, base_seed: int, rank: int) -> None:
    """``worker_init_fn``: a distinct, reproducible seed per rank and loader worker, so that
    random augmentations differ between workers and ranks but repeat between runs."""
    seed = base_seed + 1000 * rank + worker_id
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_loader(
    dataset: Dataset,
    cfg: LoaderConfig,
    batch_size: int,
    seed: int,
    *,
    sampler: Sampler | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
) -> DataLoader:
    """A shuffling DataLoader with a seeded generator, so the batch order is reproducible
    (with ``sampler``, e.g. a ``DistributedSampler``, the sampler shuffles). Its workers are
    started as ``worker_context`` says."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        worker_init_fn=worker_init_fn,
        drop_last=True,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory,
        prefetch_factor=cfg.prefetch_factor,
        persistent_workers=cfg.persistent_workers,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context=worker_context() if cfg.num_workers else None,
    )


DEFAULT_PREFETCH_FACTOR = 2
"""Batches each DataLoader worker loads ahead when ``prefetch_factor`` is not given (torch's)."""


def shared_memory_need(cfg) -> int:
    """Bytes of shared memory (``/dev/shm``) the loader of ``cfg`` (a ``RunConfig``) holds at
    once: each worker process sends its batches through it, so every rank's workers x their
    prefetched batches, plus the batch each rank's step is using, of ``micro_batch`` samples of
    the workload's size (its ``make_batch``'s; the workload's own dataset yields the same
    tensors). 0 without workers. E.g. 32 workers of 256 images of 224 px: 65 x 154 MB, 10 GB."""
    loader = cfg.loader
    if not loader.num_workers:
        return 0
    in_flight = loader.num_workers * (loader.prefetch_factor or DEFAULT_PREFETCH_FACTOR) + 1
    batch = cfg.resolved_micro_batch * cfg.workload.facts.sample_bytes
    return cfg.parallelism.processes * in_flight * batch


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


SHARED_MEMORY = "/dev/shm"
"""Where DataLoader workers put the batches they send (Linux: torch shares tensors between
processes through ``shm_open`` files there; Docker gives it 64 MiB unless ``--shm-size``)."""


def shared_memory_free_bytes(path: str = SHARED_MEMORY) -> int | None:
    """Free bytes of the shared-memory filesystem, or None where there is none (macOS,
    Windows: tensors are shared otherwise there)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shared_memory_reason(cfg, free_bytes: int | None = None) -> str | None:
    """Why the loader of ``cfg`` would run out of shared memory here (``shared_memory_need``
    against what ``/dev/shm`` has free, or ``free_bytes``), or None. Docker gives a container
    64 MiB of it unless told otherwise; the workers would die of it in the case's first
    batches with a DataLoader traceback."""
    need = shared_memory_need(cfg)
    if not need:
        return None
    if free_bytes is None:
        free_bytes, where = shared_memory_free_bytes(), SHARED_MEMORY
    else:
        where = "/dev/shm"
    if free_bytes is None or need <= free_bytes:
        return None
    loader = cfg.loader
    ranks = cfg.parallelism.processes
    per_batch = cfg.resolved_micro_batch * cfg.workload.facts.sample_bytes
    prefetch = loader.prefetch_factor or DEFAULT_PREFETCH_FACTOR
    suggest = max(1, -(-2 * need // 2**30))  # GiB, twice the need, rounded up
    return (f"its loader needs about {_size(need)} of shared memory "
            f"({f'{ranks} ranks x ' if ranks > 1 else ''}({loader.num_workers} workers x "
            f"{prefetch} prefetched batches + 1) x {_size(per_batch)} a batch) and {where} has "
            f"{_size(free_bytes)} free (Docker's default is 64 MiB: run the container with "
            f"--shm-size={suggest}g or --ipc=host)")


def worker_context() -> str | None:
    """How DataLoader workers start: forked on Linux, as in a training script started by
    ``python`` or ``torchrun`` there (elsewhere the platform's default). Stated rather than
    inherited because a process started by ``multiprocessing``'s spawn (gpubench's rank
    workers) defaults to spawn, whose loader workers each import torch again: 5 to 6 s to a
    DDP rank's first batch on a 2-core machine instead of 0.07 s, a cost real training never
    pays."""
    return "fork" if sys.platform.startswith("linux") else None


def endless(loader: DataLoader, before_epoch: Callable[[], None] | None = None
            ) -> Iterator[Batch]:
    """Batches forever, starting a new epoch whenever one ends (telling a distributed sampler
    the epoch, so each epoch is shuffled anew). ``before_epoch`` runs before each epoch's
    iterator starts, so before its workers read anything (a cold case drops the files from the
    page cache there)."""
    set_epoch = getattr(loader.sampler, "set_epoch", lambda epoch: None)
    for epoch in itertools.count():
        set_epoch(epoch)
        if before_epoch is not None:
            before_epoch()
        yield from loader


class WaitTimer:
    """Batches from ``inner`` placed on the device, recording how long each ``next`` blocked
    (waiting for the loader plus the host-to-device copy call): the loader stall."""

    def __init__(self, inner: Iterator[Batch], place: Callable[[Batch], Batch],
                 keep: int = 100_000):
        self.inner, self.place = inner, place
        self.waits: collections.deque[float] = collections.deque(maxlen=keep)

    def __iter__(self) -> WaitTimer:
        return self

    def __next__(self) -> Batch:
        start = time.perf_counter()
        batch = self.place(next(self.inner))
        self.waits.append(time.perf_counter() - start)
        return batch

    def close(self) -> None:
        """Stop the underlying loader iteration (its worker processes shut down)."""
        close = getattr(self.inner, "close", None)
        if close:
            close()


RESIDENT_CHUNK_SAMPLES = 256
"""Samples a device-resident batch is made of on the host at a time (``resident_batches``)."""


def resident_batches(workload, micro_batch: int, accum_steps: int, seed: int,
                     placement: Placement, replica: int = 0,
                     chunk: int | None = None) -> list[Batch]:
    """One optimizer step of device-resident micro-batches: ``accum_steps`` batches of
    ``micro_batch`` samples from ``workload.sample_batch``, made ``chunk`` samples at a time
    on the host and copied into buffers on the device, so host memory does not grow with the
    batch (an OOM frontier's try at batch 16384 of 224-pixel images would otherwise make
    9.8 GB of them on the host first). Each replica of a data-parallel case gets its own
    samples; every sample is one ``make_batch`` made (distinct seeds per chunk). ``chunk``:
    default ``RESIDENT_CHUNK_SAMPLES``."""
    chunk = chunk or RESIDENT_CHUNK_SAMPLES
    chunks = -(-micro_batch // chunk)
    out = []
    for step in range(accum_steps):
        buffers, spec, made = None, None, 0
        for c in range(chunks):
            n = min(chunk, micro_batch - made)
            index = (replica * accum_steps + step) * chunks + c
            placed = placement(workload.sample_batch(n, seed + 7919 * index))
            leaves, spec = tree_flatten(placed)
            if buffers is None:
                buffers = [_batch_buffer(leaf, micro_batch) for leaf in leaves]
            for buffer, leaf in zip(buffers, leaves, strict=True):
                buffer[made:made + n].copy_(leaf)
            made += n
        out.append(tree_unflatten(buffers, spec))
    return out


def _batch_buffer(leaf: torch.Tensor, batch: int) -> torch.Tensor:
    """An empty tensor like ``leaf`` (a placed chunk) with ``batch`` rows, in its layout."""
    fmt = (torch.channels_last if leaf.dim() == 4 and not leaf.is_contiguous()
           and leaf.is_contiguous(memory_format=torch.channels_last)
           else torch.contiguous_format)
    return torch.empty((batch, *leaf.shape[1:]), dtype=leaf.dtype, device=leaf.device,
                       memory_format=fmt)


LOADER_PROBE_FIELDS = ("time_to_first_batch_s", "loader_samples_per_s", "epoch_restart_s")
"""What ``measure_loader`` returns (null for a case without a loader)."""


def measure_loader(loader: DataLoader, batches: int,
                   before_epoch: Callable[[], None] | None = None) -> dict[str, float]:
    """The loader alone, no model: time to the first batch of a fresh iterator (worker start-up
    included), samples/s over the next ``batches``, and time to the first batch of the next
    epoch (what ``persistent_workers`` saves). ``before_epoch`` runs before each iterator
    starts, outside the timings (see ``endless``)."""
    before_epoch = before_epoch or (lambda: None)
    before_epoch()
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, batches))
    elapsed = time.perf_counter() - first
    del it
    before_epoch()
    restart = time.perf_counter()
    it = iter(loader)
    next(it)
    restart_s = time.perf_counter() - restart
    del it
    return {
        "time_to_first_batch_s": first - start,
        "loader_samples_per_s": n * loader.batch_size / elapsed if n else None,  # one batch
        "epoch_restart_s": restart_s,
    }


class Placement:
    """Moves a host batch to the device: the copy settings and the memory format in one place."""

    def __init__(self, device: torch.device, *, non_blocking: bool, channels_last: bool):
        self.device = device
        self.non_blocking = non_blocking
        self.memory_format = torch.channels_last if channels_last else torch.preserve_format

    def __call__(self, batch: Batch) -> Batch:
        inputs, targets = batch
        inputs = tree_map(self._move, inputs)
        if isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=self.memory_format)
        return inputs, tree_map(self._move, targets)

    def _move(self, value):
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=self.non_blocking)
        return value
