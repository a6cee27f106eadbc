"""``gpubench memory --snapshot PATH``: a CUDA memory snapshot of the OOM frontier.

The CUDA caching allocator can record every allocation and free with its stack trace
(``torch.cuda.memory._record_memory_history``) and dump them with the memory state as a pickle
(``torch.cuda.memory._dump_snapshot``) that https://pytorch.org/memory_viz draws as a timeline.
``frontier_with_snapshot`` searches the first technique's frontier with ``find_frontier``, then
records the search's first try that ran out of memory (its history ends in the out-of-memory
event) and one training step of the case at the largest micro-batch that fits, and dumps both
into one file. The CPU allocator keeps no such history: on the CPU the command
says so and exits 2 before running anything.
"""

from __future__ import annotations

from pathlib import Path

from gpubench.diagnostics.frontier import Frontier, find_frontier, try_batch
from gpubench.train.config import RunConfig

MAX_ENTRIES = 100_000
"""Alloc/free events the allocator keeps (a ring buffer: the last ones)."""

CPU_MESSAGE = "memory snapshots need CUDA: the CPU allocator keeps no allocation history"


def _record(enabled: bool, clear: bool = False) -> None:
    import torch

    if not enabled:
        torch.cuda.memory._record_memory_history(enabled=None)
        return
    try:
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, clear_history=clear)
    except TypeError:  # torch before clear_history
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)


def one_step(cfg: RunConfig, batch: int) -> None:
    """One training step of ``cfg`` at micro-batch ``batch`` (the protocol's own commands)."""
    from gpubench.diagnostics.frontier import release_device_memory
    from gpubench.measure.protocol import CaseProgram

    program = CaseProgram(0, 1, cfg.with_(micro_batch=batch))
    try:
        program.step()
    finally:
        program.close()
        del program
        release_device_memory()


def frontier_with_snapshot(cfg: RunConfig, budget_bytes: int | None, limit: int,
                           path: str | Path) -> tuple[Frontier, str]:
    """``find_frontier(cfg, ...)``, then the memory snapshot ``path``: the allocator's history
    of the search's first try that ran out of memory (run again, recorded from a fresh history)
    and of one step at the largest micro-batch that fits. Recording only these two keeps the
    ring buffer's ``MAX_ENTRIES`` for them, whatever the search's length. Returns the frontier
    and a line saying what the snapshot holds."""
    import torch

    frontier = find_frontier(cfg, budget_bytes, limit=limit)
    failed = next((t.batch for t in frontier.tries if not t.fits), None)
    _record(True, clear=True)
    try:
        if failed is not None:
            try_batch(cfg, failed, budget_bytes)
        if frontier.max_batch:
            one_step(cfg, frontier.max_batch)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        _record(False)
    held = (f"the first try that ran out of memory, micro-batch {failed}" if failed is not None
            else "no try ran out of memory (the search stopped at its limit)")
    if frontier.max_batch:
        held += f"; then one step at micro-batch {frontier.max_batch}, the largest that fits"
    return frontier, (f"memory snapshot of {cfg.id}: {path} ({held}); open it at "
                      "https://pytorch.org/memory_viz")
