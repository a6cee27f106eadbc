"""Peak memory of the measured steps, and an exact breakdown of what the model state holds.

CUDA: ``reset_peak_memory_stats`` then ``max_memory_allocated`` / ``max_memory_reserved``.
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
    large frees and then keeping freed blocks in the heap. Used by leak detection on the CPU."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
        _LIBC.mallopt(M_TRIM_THRESHOLD, 128 * 1024)


def release_free_memory() -> None:
    """Collect garbage and hand freed heap back to the OS, so that the resident size reflects
    live memory and a later measurement is not absorbed by free space left by earlier work."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def reset_peak(device: torch.device) -> int | None:
    """Start a new peak-memory window; return the memory in use at its start (bytes)."""
    release_free_memory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    if cpu_peak_supported():
        _CLEAR_REFS.write_text("5")
        return status_bytes("VmRSS")
    return None


def read_peak(device: torch.device, start_bytes: int | None) -> dict[str, int | str | None]:
    """Peak memory since ``reset_peak`` (which returned ``start_bytes``).

    ``peak_memory_bytes`` is the high-water mark; ``step_memory_bytes`` is how far the steps
    raised it above the memory held at the start (model, gradients kept, optimizer state):
    activations, temporaries and freshly allocated gradients.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        reserved = torch.cuda.max_memory_reserved(device)
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
    }


class SavedActivations:
    """Counts the bytes autograd saves for backward (activations), exactly and on any device,
    through ``torch.autograd.graph.saved_tensors_hooks``; each storage counts once, and the
    model's own parameters (saved by reference, not copied) not at all."""

    def __init__(self, model: nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}

    def __enter__(self) -> SavedActivations:
        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in self.params:
                self.storages[storage.data_ptr()] = storage.nbytes()
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total_bytes(self) -> int:
        return sum(self.storages.values())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def state_breakdown(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Exact bytes of parameters, their gradients (as allocated during backward) and optimizer
    state (momentum, Adam moments)."""
    params = [p for p in model.parameters()]
    state = [
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    return {
        "param_bytes": sum(_nbytes(p) for p in params),
        "grad_bytes": sum(_nbytes(p) for p in params if p.requires_grad),
        "optimizer_state_bytes": sum(_nbytes(v) for v in state),
    }
