"""Multi-process plumbing beside the measurement protocol (``gpubench.measure.protocol``): the
process
group backend, the launcher for a process that is one rank of a torchrun job, and a no-op rank
for timing the worker machinery."""

from __future__ import annotations

import torch.distributed as dist


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


class LocalRanks:
    """The ``WorkerGroup.call`` interface for a process that *is* one rank (under torchrun):
    run the command here, then gather every rank's result, so every rank gets the list."""

    def __init__(self, program):
        self.program = program

    def call(self, command: str, *payload) -> list:
        result = getattr(self.program, command)(*payload)
        gathered = [None] * dist.get_world_size()
        # The gather also makes a timed round end only when the slowest rank has finished.
        dist.all_gather_object(gathered, result)
        return gathered


class NoopProgram:
    """A rank that does nothing, for timing the worker machinery alone."""

    def __init__(self, rank: int, world_size: int):
        pass

    def noop(self) -> None:
        pass
