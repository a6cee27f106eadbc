"""The OOM frontier: the largest micro-batch that fits, per set of techniques.

On CUDA the limit is the device: a try that runs out of device memory does not fit (its memory
is released before the next try). Out of memory is ``torch.OutOfMemoryError`` (the caching
allocator) and also the errors libraries raise when their own allocations fail at large batches
(``CUBLAS_STATUS_ALLOC_FAILED`` creating a cuBLAS handle or workspace,
``CUDNN_STATUS_ALLOC_FAILED``, ``CUDA error: out of memory``): see ``is_out_of_memory``. On the
CPU, where running out of memory means the kernel killing the process, a memory budget stands
in for the device: a try fits when the measured peak of two training steps stays within it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpubench.measure.protocol import CaseProgram
from gpubench.train.config import RunConfig

OUT_OF_MEMORY_MESSAGES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                          "CUDNN_STATUS_ALLOC_FAILED")
"""Parts of the messages of the ``RuntimeError``s (``torch.AcceleratorError`` included) that
libraries raise when an allocation of their own fails: running out of device memory too."""


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` means the device ran out of memory: ``torch.OutOfMemoryError``, or a
    ``RuntimeError`` whose message names a failed cuBLAS/cuDNN/CUDA allocation."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    if not isinstance(err, RuntimeError):
        return False
    message = str(err)
    return any(m.lower() in message.lower() for m in OUT_OF_MEMORY_MESSAGES)


def release_device_memory() -> None:
    """Free what a failed try left: collect the garbage its frames held, then hand the CUDA
    caching allocator's free blocks back to the device and the pinned host blocks (an
    offloading try's) back to the system."""
    from gpubench.train.implementations import release_pinned_memory

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        release_pinned_memory()


@dataclass(frozen=True)
class Try:
    batch: int
    fits: bool
    peak_memory_bytes: int | None
    """The measured peak (None when the try ran out of memory)."""
    error: str | None = None
    """The first line of the out-of-memory error that ended the try, if one did."""


@dataclass
class Frontier:
    cfg_id: str
    max_batch: int
    """Largest batch that fits (0: not even batch 1)."""
    tries: list[Try] = field(default_factory=list)
    capped: bool = False
    """True when the search stopped at its upper limit without a failure."""


def search_max_batch(fits: Callable[[int], bool], limit: int = 4096,
                     start: int = 1) -> tuple[int, bool]:
    """Largest ``b`` in ``start``..``limit`` with ``fits(b)``, assuming fitting is monotone:
    doubling until a failure, then bisecting. Returns (batch, capped); batch 0 when even
    ``start`` does not fit."""
    if not fits(start):
        return 0, False
    good, bad = start, None
    while bad is None:
        probe = min(good * 2, limit)
        if probe == good:
            return good, True
        if fits(probe):
            good = probe
        else:
            bad = probe
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, False


def try_batch(cfg: RunConfig, batch: int, budget_bytes: int | None,
              steps: int = 2) -> Try:
    """Run ``steps`` training steps at micro-batch ``batch``; does it fit? Running out of
    memory (``is_out_of_memory``) anywhere in the try means it does not; other errors
    propagate."""
    program = None
    result = None
    try:
        # The measurement protocol's own commands, as for every case.
        program = CaseProgram(0, 1, cfg.with_(micro_batch=batch))
        program.reset_peak()
        for _ in range(steps):
            program.step()
        peak = max((d["peak_memory_bytes"] or 0) for d in program.read_peak()["devices"])
        fits = budget_bytes is None or peak <= budget_bytes
        result = Try(batch, fits, peak)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        result = Try(batch, False, None, (str(err).strip().splitlines() or [""])[0][:300])
    finally:
        if program is not None:
            program.close()
        del program
    # Outside the handler: the error's traceback, and the tensors its frames held, are gone.
    release_device_memory()
    return result


def find_frontier(cfg: RunConfig, budget_bytes: int | None = None,
                  limit: int = 4096) -> Frontier:
    """The largest micro-batch of ``cfg`` that fits the device (CUDA) or ``budget_bytes``."""
    if cfg.device == "cpu" and budget_bytes is None:
        raise ValueError("on the CPU the OOM frontier needs a memory budget (e.g. '2GiB'); "
                         "running out of memory there kills the process instead of raising")
    frontier = Frontier(cfg.id, 0)

    def fits(batch: int) -> bool:
        result = try_batch(cfg, batch, budget_bytes)
        frontier.tries.append(result)
        return result.fits

    # BatchNorm needs more than one sample per channel in training.
    start = cfg.workload.min_batch
    frontier.max_batch, frontier.capped = search_max_batch(fits, limit, start)
    return frontier


