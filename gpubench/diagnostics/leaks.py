"""Leak detection: memory growth per step over many steps, and the classic leaky training loops
next to their fixed forms, so the detector can be seen to flag the one and pass the other.

Memory is read after every step: ``torch.cuda.memory_allocated`` on CUDA, the process's
anonymous resident memory (``RssAnon``: its heap and other private allocations, where a leak's
tensors live) on the CPU. File-backed resident pages (the libraries' code, mapped data files)
are left out: the kernel drops them when memory is needed elsewhere and reads them back as the
code runs again, so they move with the machine's memory pressure, not with the loop. The growth
per step is the least-squares slope over the steps after a warm-up; a loop leaks when the slope
exceeds a threshold (default 256 KiB per step on CUDA, 1 MiB on the CPU, where the resident
size also moves with the allocator).

On a big model a leaky loop runs out of memory before the steps are done: a loop that ran at
least one step and then ran out of memory (``gpubench.diagnostics.frontier.is_out_of_memory``, or,
where a
``budget_bytes`` stands in for the device as on the CPU, memory in use above it) leaks; the check
reports it so, with the growth over the steps it ran, and releases its memory instead of
crashing. A loop that runs out of memory in its very first step does not fit at all: reported
as out of memory, not as a leak.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from gpubench.measure.memory import (
    cpu_peak_supported,
    release_free_memory,
    status_bytes,
    steady_malloc,
    track_large_allocations,
)
from gpubench.train.build import Case
from gpubench.util.verdicts import Kind

MIB = 2**20


def memory_in_use(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    if cpu_peak_supported():
        try:
            return status_bytes("RssAnon")  # Linux 4.5 on
        except RuntimeError:
            return status_bytes("VmRSS")
    raise RuntimeError("leak detection on the CPU needs Linux /proc/self/status")


@dataclass(frozen=True)
class LeakResult:
    name: str
    growth_bytes_per_step: float
    threshold_bytes_per_step: float
    memory_bytes: list[int]
    out_of_memory_after: int | None = None
    """Steps completed before the loop ran out of memory (None: it did not)."""
    error: str | None = None
    """The first line of the out-of-memory error (or the budget exceeded)."""

    @property
    def out_of_memory(self) -> bool:
        return self.out_of_memory_after is not None

    @property
    def sustained_growth_bytes_per_step(self) -> float:
        """The smaller of the growth fitted over the first and over the second half of the
        measured steps: a loop that leaks grows in both; a one-off allocation (a buffer created
        lazily, the heap extended once) raises the fit over all steps, but only one half, or
        neither where it falls between them."""
        m = self.memory_bytes
        if len(m) < 4:
            return self.growth_bytes_per_step
        half = len(m) // 2
        return min(_slope(m[:half]), _slope(m[half:]))

    @property
    def leaks(self) -> bool:
        if self.out_of_memory:
            return self.out_of_memory_after > 0  # it ran, then memory ran out: it grew
        return min(self.growth_bytes_per_step,
                   self.sustained_growth_bytes_per_step) > self.threshold_bytes_per_step

    @property
    def kind(self) -> Kind:
        """The verdict's word: leaks, no leak, or does not fit."""
        if self.out_of_memory and not self.leaks:
            return Kind.DOES_NOT_FIT
        return Kind.LEAKS if self.leaks else Kind.NO_LEAK

    @property
    def verdict(self) -> str:
        """The verdict's word, with how memory ran out where it did."""
        if self.out_of_memory and not self.leaks:
            return f"{Kind.DOES_NOT_FIT} (out of memory in its first step)"
        if self.out_of_memory:
            return f"{Kind.LEAKS} (out of memory after {self.out_of_memory_after} steps)"
        return str(self.kind)


class _OverBudget(Exception):
    """Memory in use above the budget standing in for the device (CPU)."""


def default_threshold(device: torch.device) -> float:
    return 256 * 2**10 if device.type == "cuda" else 1 * MIB


def _slope(samples: list[int]) -> float:
    if len(samples) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(samples)), np.asarray(samples, dtype=float), 1)[0])


def detect_leak(name: str, step: Callable[[], object], device: torch.device, *,
                steps: int = 12, warmup: int = 3, threshold: float | None = None,
                budget_bytes: int | None = None) -> LeakResult:
    """Run ``step`` ``warmup + steps`` times and fit memory in use against the step number.

    Running out of memory (or, with ``budget_bytes``, memory in use above it) ends the loop
    early: the result then says after how many steps (``out_of_memory_after``), with the
    growth per step fitted over every step it ran, warm-up included."""
    from gpubench.diagnostics.frontier import is_out_of_memory, release_device_memory

    threshold = threshold or default_threshold(device)
    samples: list[int] = []  # after each step, warm-up included
    completed, error = 0, None
    try:
        samples.append(memory_in_use(device))  # before the first step
        for _ in range(warmup + steps):
            step()
            samples.append(memory_in_use(device))
            if budget_bytes is not None and samples[-1] > budget_bytes:
                raise _OverBudget(f"{samples[-1] / MIB:,.0f} MiB in use after step "
                                  f"{completed + 1}, over the budget of "
                                  f"{budget_bytes / MIB:,.0f} MiB")
            completed += 1  # steps that ran within memory
    except (torch.OutOfMemoryError, RuntimeError, _OverBudget) as err:
        if not isinstance(err, _OverBudget) and not is_out_of_memory(err):
            raise
        error = (str(err).strip().splitlines() or [""])[0][:300]
    if error is None:
        measured = samples[-steps:]
        return LeakResult(name, _slope(measured), threshold, measured)
    # Outside the handler, so that the tensors the error's frames held can go.
    release_device_memory()
    return LeakResult(name, _slope(samples), threshold, samples, completed, error)


# The loops. Each takes a built case and returns (step function, cleanup). Leaky and fixed forms
# differ only in the line the seeds warn about.

def _train(case: Case):
    inputs, targets = next(case.batches)
    loss = case.model(inputs, targets)
    return inputs, targets, loss


def eval_loss_as_tensor(case: Case, fixed: bool):
    """Track a validation loss every step. Leaky: without ``torch.no_grad`` and summed as a
    tensor, so every evaluation's graph (with its saved activations) stays alive.
    Fixed: under ``no_grad``, accumulated with ``.item()``."""
    total = [0.0]

    def step():
        inputs, targets, loss = _train(case)
        loss.backward()
        case.optimizer.step()
        case.optimizer.zero_grad(set_to_none=True)
        if fixed:
            with torch.no_grad():
                total[0] += case.model(inputs, targets).item()
        else:
            total[0] = total[0] + case.model(inputs, targets)

    return step


def history_with_graph(case: Case, fixed: bool):
    """Keep the loss history for logging. Leaky: ``backward(retain_graph=True)`` and the loss
    tensor appended, so each step's graph and activations are kept. Fixed: a plain backward and
    ``loss.item()`` in the history."""
    history = []

    def step():
        _, _, loss = _train(case)
        loss.backward(retain_graph=not fixed)
        case.optimizer.step()
        case.optimizer.zero_grad(set_to_none=True)
        history.append(loss.item() if fixed else loss)

    return step


class _Record:
    def __init__(self, activations: torch.Tensor):
        self.activations = activations
        self.me = self  # the cycle


def reference_cycle(case: Case, fixed: bool):
    """Per-step records that hold tensors. Leaky: each record refers to itself (a reference
    cycle), which only the cyclic garbage collector frees, and the loop runs with it disabled
    (as throughput-tuned loops sometimes do). Fixed: no cycle, so reference counting frees
    each record at once."""

    def step():
        inputs, targets, loss = _train(case)
        loss.backward()
        case.optimizer.step()
        case.optimizer.zero_grad(set_to_none=True)
        # The record keeps a copy of the step's batch, enlarged to a few MiB, for "later".
        first = tree_flatten(inputs)[0][0]
        copies = max(1, (4 << 20) // max(1, first.numel() * first.element_size()))
        record = _Record(first.detach().repeat(copies, *[1] * (first.dim() - 1)))
        if fixed:
            record.me = None

    return step


LOOPS = {
    "eval-loss-as-tensor": eval_loss_as_tensor,
    "loss-history-with-graph": history_with_graph,
    "reference-cycle": reference_cycle,
}


def check_loops(build_case: Callable[[], Case], steps: int = 12,
                budget_bytes: int | None = None) -> list[LeakResult]:
    """Every shipped loop, leaky and fixed, each on a freshly built case; the cyclic garbage
    collector is off while they run (so a cycle is a leak) and on again afterwards. A loop
    that runs out of memory (or above ``budget_bytes``) is reported, its memory released, and
    the next loop runs."""
    from gpubench.diagnostics.frontier import release_device_memory

    results = []
    track_large_allocations()
    enabled = gc.isenabled()
    try:
        for name, loop in LOOPS.items():
            for fixed in (False, True):
                # The case's math mode for the loop; its loader closed after it.
                with build_case() as case:
                    release_free_memory()
                    gc.disable()
                    try:
                        results.append(detect_leak(f"{name} ({'fixed' if fixed else 'leaky'})",
                                                   loop(case, fixed), case.device, steps=steps,
                                                   budget_bytes=budget_bytes))
                    finally:
                        gc.enable()
                del case
                release_device_memory()  # gc.collect, then the CUDA cache
    finally:
        if not enabled:
            gc.disable()
        steady_malloc()  # the measuring settings again, for cases after it in this process
    return results


def allocator_stats(device: torch.device) -> dict:
    """CUDA caching-allocator figures: allocated vs reserved and how fragmented the reserve is.
    The CPU allocator keeps no such cache: the figures are then absent (None)."""
    if device.type != "cuda":
        return {"allocated_bytes": None, "reserved_bytes": None, "fragmentation": None,
                "alloc_retries": None}
    stats = torch.cuda.memory_stats(device)
    allocated = stats.get("allocated_bytes.all.current", 0)
    reserved = stats.get("reserved_bytes.all.current", 0)
    return {
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        # Reserved but unallocated memory, as a share of the reserve: space the allocator holds
        # that this process's tensors do not use (fragments and cached free blocks).
        "fragmentation": 1 - allocated / reserved if reserved else 0.0,
        "alloc_retries": stats.get("num_alloc_retries", 0),
    }
