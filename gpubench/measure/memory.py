"""Peak memory of the measured steps, and an exact breakdown of what the model state holds.

CUDA: ``reset_peak_memory_stats`` then ``max_memory_allocated`` / ``max_memory_reserved``, and
the caching allocator's health over the window (retries, out-of-memory errors, active peak,
fragmentation) from ``torch.cuda.memory_stats``.
CPU (Linux): the process high-water mark. Writing ``5`` to ``/proc/self/clear_refs`` resets
``VmHWM`` to the current resident size; after the steps ``VmHWM`` is the peak resident size. Freed
heap is first handed back to the OS (``malloc_trim``) so an earlier, larger case does not leave
resident pages that this case would reuse without raising the mark. The CPU figure therefore is
the whole process's resident peak (interpreter, libraries and model included), not tensors alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from pathlib import Path

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


_LIBC = _libc()


def cpu_peak_supported() -> bool:
    return _STATUS.exists() and _CLEAR_REFS.exists()


def status_bytes(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{key} not found in {_STATUS}")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def track_large_allocations() -> None:
    """Make the resident size follow large allocations closely (glibc): blocks over 128 KiB are
    always mapped and unmapped on their own, instead of glibc raising that threshold as it sees
    large frees and then keeping freed blocks in the heap. Used by leak detection on the CPU
    (``steady_malloc`` restores the measuring settings after it)."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
        _LIBC.mallopt(M_TRIM_THRESHOLD, 128 * 1024)


STEADY_MMAP_THRESHOLD = 32 * 2**20
"""glibc's largest fixed mmap threshold (``HEAP_MAX_SIZE / 2`` on 64-bit): allocations up to it
come from the heap."""
STEADY_TRIM_THRESHOLD = 1 << 30
"""Free memory at the heap's top kept rather than handed back after each step (``reset_peak``
still hands it back, ``malloc_trim``, before each memory window)."""
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(STEADY_MMAP_THRESHOLD),
              "MALLOC_TRIM_THRESHOLD_": str(STEADY_TRIM_THRESHOLD)}
"""The same settings for processes started from this one (glibc reads them at start)."""


def steady_malloc() -> dict:
    """Fix glibc's malloc thresholds in this process (``mallopt``) and in the processes it
    starts (``MALLOC_ENV``), unless the user set them (their ``MALLOC_*`` variables win);
    returns what holds, for the record.

    Why: by default glibc serves an allocation above its mmap threshold (128 KiB at first)
    with a fresh mapping and unmaps it when freed, and raises the threshold to the size of each
    such block freed. A CPU step's time then depends on what the process allocated before: the
    cpu profile's GPT-2 bf16 step alone in a fresh process took 1,456 page faults a step
    (25.5 ms); after an FP32 GPT-2 had run in that process, 13 (21.8 ms). The same step read
    19-25 ms from process to process, and a speedup measured beside another model differed by
    about 10% from each configuration run alone. With the thresholds fixed, allocations up to
    ``STEADY_MMAP_THRESHOLD`` come from the heap in every process, whatever ran before. A
    training loop can do the same (``MALLOC_MMAP_THRESHOLD_``, or jemalloc/tcmalloc)."""
    import os

    user = any(k in os.environ and os.environ[k] != v for k, v in MALLOC_ENV.items())
    if not user and _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
        _LIBC.mallopt(M_TRIM_THRESHOLD, STEADY_TRIM_THRESHOLD)
        os.environ.update(MALLOC_ENV)
    return malloc_settings()


def malloc_settings() -> dict:
    """The malloc thresholds this process's cases run with (``steady_malloc``), for the
    record."""
    import os

    if _LIBC is None or not hasattr(_LIBC, "mallopt"):
        return {"malloc_thresholds": "not glibc: the allocator's own"}
    found = {k: os.environ[k] for k in MALLOC_ENV if k in os.environ}
    if found == MALLOC_ENV:
        return {"malloc_thresholds": "fixed by gpubench", **found}
    if found:
        return {"malloc_thresholds": "set by the environment", **found}
    return {"malloc_thresholds": "glibc's dynamic defaults"}


_FROZEN_FOR: object = None
"""The key of the last ``freeze_long_lived`` in this process (None: none yet; keys are never
None)."""


def freeze_long_lived(key: object) -> None:
    """Collect garbage, then move every object alive now (modules, classes, the test session,
    the workload's initial weights: about half a million of them with torch, torchvision and
    transformers imported) into the collector's permanent generation (``gc.freeze``): once
    per process, after its imports and the workload's first build, and again whenever ``key``
    (the workload whose initial weights the process holds) changes. A full collection then
    scans only what cases create: 0.26 s per ``gc.collect()`` on the 2-core CI machine with
    nothing frozen, about a millisecond after; the automatic collections that would land
    inside timed rounds shrink alike. A workload's first build imports its model's modules
    (BERT through transformers: about 2,000 modules and 100,000 objects, which left frozen
    only before it made every collection take 50 ms, four of them a case), hence the key.
    Objects frozen here that later become cyclic garbage are never collected, which is why it
    runs before the case is built; a workload's cached initial module, dropped when the next
    workload's replaces it, is freed by its reference count (no cycles)."""
    global _FROZEN_FOR
    if key != _FROZEN_FOR:
        gc.collect()
        gc.freeze()
        _FROZEN_FOR = key


def release_free_memory() -> None:
    """Collect garbage and hand freed heap back to the OS, so that the resident size reflects
    live memory and a later measurement is not absorbed by free space left by earlier work."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def reset_peak(device: torch.device) -> int | None:
    """Start a new peak-memory window; return the memory in use at its start (bytes). On CUDA
    the caching allocator's free blocks are released first (after garbage collection and a
    synchronize), so that the window's ``peak_reserved_bytes`` is what its own steps reserve,
    not what an earlier case (in this process, or in a reused rank) left cached."""
    release_free_memory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    if cpu_peak_supported():
        _CLEAR_REFS.write_text("5")
        return status_bytes("VmRSS")
    return None


ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_ooms")
"""Event counters of ``torch.cuda.memory_stats`` that only grow (``reset_peak_memory_stats``
leaves them alone): a window's figure is their change since its start."""

ALLOCATOR_FIELDS = ("alloc_retries", "alloc_ooms", "peak_active_bytes", "fragmentation")
"""The allocator-health fields ``read_peak`` adds to a device's figures (None on the CPU)."""


def allocator_counters(device: torch.device) -> dict[str, int] | None:
    """The allocator's event counters now (``ALLOCATOR_COUNTERS``), at a window's start for
    ``read_peak``; None on the CPU."""
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTERS}


def allocator_health(stats: dict | None,
                     start: dict | None = None) -> dict[str, int | float | None]:
    """The record's allocator-health fields from ``torch.cuda.memory_stats(device)`` read at the
    end of a window whose peaks were reset at its start (``start``: ``allocator_counters`` then;
    without it the counters count from the process's start):

    - ``alloc_retries``: ``cudaMalloc`` calls that failed, freed the cache and retried
      (``num_alloc_retries``: each one a synchronising stall), in the window;
    - ``alloc_ooms``: out-of-memory errors the allocator raised (``num_ooms``), in the window;
    - ``peak_active_bytes``: the most bytes in blocks in use (``active_bytes.all.peak``:
      allocations rounded up to the blocks that hold them);
    - ``fragmentation``: ``1 - allocated_bytes.all.peak / reserved_bytes.all.peak``, the share
      of the reserve at its peak that the tensors at theirs left unused (cached free blocks
      and fragments of split ones).

    All None without statistics (the CPU, or CUDA not initialised: an empty dict)."""
    if not stats:
        return dict.fromkeys(ALLOCATOR_FIELDS)
    start = start or {}
    allocated = stats.get("allocated_bytes.all.peak", 0)
    reserved = stats.get("reserved_bytes.all.peak", 0)
    return {
        "alloc_retries": max(0, stats.get("num_alloc_retries", 0)
                             - start.get("num_alloc_retries", 0)),
        "alloc_ooms": max(0, stats.get("num_ooms", 0) - start.get("num_ooms", 0)),
        "peak_active_bytes": stats.get("active_bytes.all.peak"),
        "fragmentation": max(0.0, 1 - allocated / reserved) if reserved else None,
    }


def resident_base(device_type: str) -> int | None:
    """The process's resident size before a case builds its model (CPU, Linux; None
    elsewhere), freed heap handed back first: the interpreter, the libraries imported and what
    earlier work left resident. The CPU training peak is the high-water mark above it
    (``peak_above_base_bytes``), the figure a user's own loop compares with under the same
    definition (its resident size before it builds the model, and its peak after)."""
    if device_type != "cpu" or not cpu_peak_supported():
        return None
    release_free_memory()
    return status_bytes("VmRSS")


def read_peak(device: torch.device, start_bytes: int | None,
              start_counters: dict | None = None,
              base_bytes: int | None = None) -> dict[str, int | float | str | None]:
    """Peak memory since ``reset_peak`` (which returned ``start_bytes``), read while the case
    still holds its memory (right after its steps, nothing freed).

    ``peak_memory_bytes`` is the high-water mark; ``step_memory_bytes`` is how far the steps
    raised it above the memory held at the start (model, gradients kept, optimizer state):
    activations, temporaries and freshly allocated gradients. On CUDA also the allocator's
    health over the window (``allocator_health``; ``start_counters``: ``allocator_counters`` at
    the window's start), None on the CPU. On the CPU, with ``base_bytes`` (``resident_base``),
    ``resident_base_bytes`` and ``peak_above_base_bytes``, the peak less that base.
    """
    stats = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        stats = torch.cuda.memory_stats(device)
        peak = stats.get("allocated_bytes.all.peak", 0)  # torch.cuda.max_memory_allocated
        reserved = stats.get("reserved_bytes.all.peak", 0)  # torch.cuda.max_memory_reserved
        method = "torch.cuda.max_memory_allocated"
    elif cpu_peak_supported():
        peak, reserved = status_bytes("VmHWM"), None
        method = "process VmHWM (resident high-water mark)"
    else:
        peak = reserved = None
        method = "none"
    return {
        "peak_memory_bytes": peak,
        "step_memory_bytes": None if peak is None else max(0, peak - start_bytes),
        "peak_reserved_bytes": reserved,
        "peak_memory_method": method,
        "resident_base_bytes": base_bytes if device.type == "cpu" else None,
        "peak_above_base_bytes": (max(0, peak - base_bytes) if device.type == "cpu"
                                  and peak is not None and base_bytes is not None else None),
        **allocator_health(stats, start_counters),
    }


class _Saved:
    """What the pack hook hands autograd in place of a saved tensor: the tensor (detached), and
    a note to the counter when autograd drops it (after the backward that used it, or with its
    graph)."""

    __slots__ = ("tensor", "key", "owner")

    def __init__(self, tensor: torch.Tensor, key: int, owner: SavedActivations):
        self.tensor, self.key, self.owner = tensor, key, owner

    def __del__(self) -> None:
        try:
            self.owner._release(self.key)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to count
            pass


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter or a view of one, also one the model did not hold when the counter started:
    FSDP's parameters gathered for a block's forward (saved by reference; FSDP frees and
    gathers them again for backward)."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)


class SavedActivations:
    """Counts the bytes autograd saves for backward (activations), exactly and on any device,
    through ``torch.autograd.graph.saved_tensors_hooks``.

    A storage counts once per micro-batch however many ops save it (or views of it), and the
    model's own parameters (saved by reference, not copied; also those FSDP gathers) not at
    all. Storages are told apart
    by identity, not by address: the counter holds a weak reference to each storage it has seen,
    so a storage freed by one micro-batch's backward and an other allocated at the same address
    by the next micro-batch are two storages.

    A *micro-batch* is one forward and its backward: it starts with the first tensor saved and
    ends when autograd has released everything saved (backward without ``retain_graph`` frees
    each saved tensor once used), so ``with SavedActivations(model) as saved: step()`` around a
    step of k accumulated micro-batches sees k micro-batches, with no help from the step. Call
    ``new_micro_batch()`` to mark a boundary yourself (``auto_split=False``: only there). A
    pipeline schedule with several chunks in flight at once (GPipe) is one span until they are
    all released, which is what it holds.

    Figures:

    - ``per_micro_batch_bytes``: the largest micro-batch's saved bytes (the largest, since the
      memory a step needs is set by its largest micro-batch; equal micro-batches give the same);
    - ``micro_batch_bytes``: each micro-batch's, in order;
    - ``total_bytes``: their sum, what the whole window saved (k times the above for k equal
      micro-batches; no longer a figure to divide by k, but it still gives the same answer);
    - ``peak_bytes``: the most saved bytes held at any one time (memory autograd kept alive).
    """

    def __init__(self, model: nn.Module, auto_split: bool = True):
        self.model = model
        self.auto_split = auto_split
        self.micro_batch_bytes: list[int] = []
        self.peak_bytes = 0
        self._params: dict[int, StorageWeakRef] = {}
        self._live: dict[int, list[int]] = {}  # storage key -> [nbytes, live handles]
        self._live_bytes = 0
        self._handles = 0
        self._seen: dict[int, StorageWeakRef] = {}  # storages of the current micro-batch
        self._current = 0
        self._open = False

    def __enter__(self) -> SavedActivations:
        self._params = {}
        for p in self.model.parameters():
            storage = p.untyped_storage()
            self._params[storage._cdata] = StorageWeakRef(storage)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor):
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no plain storage (e.g. a wrapper subclass)
            self._begin()
            self._current += t.numel() * t.element_size()
            return t
        key = storage._cdata
        nbytes = storage.nbytes()
        if key in self._params or nbytes == 0 or _is_parameter(t):
            return t
        self._begin()
        if key not in self._seen:
            self._seen[key] = StorageWeakRef(storage)
            self._current += nbytes
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [nbytes, 1]
            self._live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self._live_bytes)
        else:
            entry[1] += 1
        self._handles += 1
        # Detached (the same storage and version counter): an op that saves its own output
        # would otherwise hold, through the packed tensor's grad_fn, the node that holds the
        # packed tensor, a reference cycle that a graph never backpropagated (a loss kept for
        # logging) leaves to the garbage collector.
        return _Saved(t.detach(), key, self)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _begin(self) -> None:
        self._open = True

    def _release(self, key: int) -> None:
        entry = self._live[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[key]
            self._live_bytes -= entry[0]
        self._handles -= 1
        if self._handles == 0 and self.auto_split:
            self.new_micro_batch()

    def new_micro_batch(self) -> None:
        """End the current micro-batch (if anything was saved in it); the next save starts one."""
        if self._open:
            self.micro_batch_bytes.append(self._current)
        self._seen, self._current, self._open = {}, 0, False

    def _all(self) -> list[int]:
        return self.micro_batch_bytes + ([self._current] if self._open else [])

    @property
    def micro_batches(self) -> int:
        return len(self._all())

    @property
    def per_micro_batch_bytes(self) -> int:
        return max(self._all(), default=0)

    @property
    def total_bytes(self) -> int:
        return sum(self._all())


def _nbytes(t: torch.Tensor) -> int:
    """Bytes this process holds of ``t``: of a sharded tensor (FSDP's DTensors), its local
    shard."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def state_breakdown(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Exact bytes of parameters, their gradients (as allocated during backward) and optimizer
    state (momentum, Adam moments) held by this process: with FSDP, its shards of each."""
    params = [p for p in model.parameters()]
    state = [
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    return {
        "param_bytes": sum(_nbytes(p) for p in params),
        "grad_bytes": sum(_nbytes(p) for p in params if p.requires_grad),
        "optimizer_state_bytes": sum(_nbytes(v) for v in state),
    }
