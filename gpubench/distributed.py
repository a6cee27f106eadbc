"""The rank program of multi-process cases (DDP replicas, pipeline stages), and how the
figures of all ranks combine into one record."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

import torch
import torch.distributed as dist

from gpubench.build import build
from gpubench.checks import check_case
from gpubench.config import RunConfig
from gpubench.flops import count_flops
from gpubench.memory import SavedActivations, read_peak, reset_peak, state_breakdown


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


class RankProgram:
    """One rank of a case; each method is a command the parent sends to every rank at once."""

    def __init__(self, rank: int, world_size: int, cfg: RunConfig,
                 local_rank: int | None = None, local_world_size: int | None = None):
        local_rank = rank if local_rank is None else local_rank
        if cfg.device == "cuda":
            torch.cuda.set_device(local_rank)
        else:
            # Ranks share the CPU: split its cores instead of oversubscribing them.
            per_machine = local_world_size or world_size
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_machine))
        self.rank = rank
        self.case = build(cfg, rank, local_rank)
        self.start_bytes = None
        self.times: list[float] = []
        self.last_loss = None

    def check(self) -> dict:
        with self.case.precision.math_mode():
            return dataclasses.asdict(check_case(self.case))

    def flops(self) -> dict:
        """FLOPs of one step and the activations it saves per micro-batch, on this rank."""
        with self.case.precision.math_mode(), SavedActivations(self.case.model) as saved:
            flops = count_flops(self.case.step)
        return {"flops": flops, "activation_bytes": saved.total_bytes // self.case.cfg.accum_steps}

    def reset_peak(self) -> None:
        self.times = []
        self.start_bytes = reset_peak(self.case.device)

    def step(self) -> float:
        with self.case.precision.math_mode():
            start = time.perf_counter()
            loss = self.case.synced_step()
            elapsed = time.perf_counter() - start
        self.times.append(elapsed)
        self.last_loss = loss
        return elapsed

    def read_peak(self) -> dict:
        loss = None if self.last_loss is None else self.last_loss.float().item()
        return {
            **read_peak(self.case.device, self.start_bytes),
            **state_breakdown(self.case.model, self.case.optimizer),
            "rank_step_time_s": statistics.median(self.times) if self.times else None,
            "last_loss": loss,
        }

    def allreduce_probe(self, repeats: int = 5) -> float:
        """Median seconds of one all-reduce of a buffer the size of this rank's gradients: the
        communication one synchronized DDP backward performs (measured in isolation)."""
        numel = sum(p.numel() for p in self.case.model.parameters() if p.requires_grad)
        buf = torch.zeros(numel, device=self.case.device)
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            if buf.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])  # the first includes connection setup

    def noop(self) -> None:
        """Nothing: timing it measures gpubench's per-step process-management cost."""


class LocalRanks:
    """The ``WorkerGroup.call`` interface for a process that *is* one rank (under torchrun):
    run the command here, then gather every rank's result, so every rank gets the list."""

    def __init__(self, program: RankProgram):
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


def combine_ranks(checks: list[dict], counts: list[dict], memories: list[dict]) -> dict:
    """One record from all ranks. Time is measured by the parent (a step ends when the slowest
    rank has finished it); memory is per rank plus the max; the breakdown is of the rank with
    the highest peak; FLOPs add up over ranks, saved activations are the largest rank's; the
    training check is the loss-computing rank's."""
    flops = [c["flops"] for c in counts]
    peaks = [m["peak_memory_bytes"] for m in memories]
    top = max(range(len(memories)), key=lambda r: peaks[r] or 0)
    with_loss = [c for c in checks if c["first_loss"] is not None]
    check = with_loss[-1]
    last_losses = [m["last_loss"] for m in memories if m["last_loss"] is not None]
    return {
        "peak_memory_bytes": memories[top]["peak_memory_bytes"],
        "step_memory_bytes": memories[top]["step_memory_bytes"],
        "peak_reserved_bytes": memories[top]["peak_reserved_bytes"],
        "peak_memory_method": memories[top]["peak_memory_method"],
        "param_bytes": memories[top]["param_bytes"],
        "grad_bytes": memories[top]["grad_bytes"],
        "optimizer_state_bytes": memories[top]["optimizer_state_bytes"],
        "rank_peak_memory_bytes": peaks,
        "rank_step_memory_bytes": [m["step_memory_bytes"] for m in memories],
        "rank_step_time_s": [m["rank_step_time_s"] for m in memories],
        "rank_flops_per_step": flops,
        "flops_per_step": sum(flops),
        "activation_bytes": max(c["activation_bytes"] for c in counts),
        "loss_reference": check["reference_loss"],
        "loss_first": check["first_loss"],
        "loss_rtol": check["rtol"],
        "check_losses": check["losses"],
        "check_skipped_steps": check["skipped_steps"],
        "last_loss": last_losses[-1] if last_losses else None,
    }
