"""How to measure: run one case under a pytest-benchmark fixture and record every metric.

The fixture is used through ``pedantic`` (explicit warm-up and rounds, one step per round), so the
raw per-round times are pytest-benchmark's own and land in its JSON. Each round is one complete,
device-synchronized training step including the wait for its batches; for multi-process cases a
round ends when every rank has finished the step (the slowest rank's time, plus the cost of the
command round trip, which the ``workers`` benchmark reports on its own).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from gpubench.build import (
    Case,
    Unsupported,
    build,
    check_world_size,
    resolve_micro_batch,
    unsupported_reason,
)
from gpubench.checks import check_case
from gpubench.config import RunConfig
from gpubench.data import measure_loader
from gpubench.distributed import RankProgram, backend_for, combine_ranks
from gpubench.flops import count_flops, step_peak_flops
from gpubench.machine import device_name
from gpubench.memory import SavedActivations, read_peak, reset_peak, state_breakdown
from gpubench.models import input_shape
from gpubench.workers import DEFAULT_TIMEOUT_S, WorkerGroup

LOADER_PROBE_BATCHES = 10
"""Batches the loader-only measurement reads after its first one."""

MIN_ROUNDS = 5
"""Timed rounds a case keeps however slow its step (the statistics need a sample)."""


def budget_rounds(rounds: int, step_time_s: float, max_time_s: float | None) -> int:
    """``rounds``, reduced (to no fewer than ``MIN_ROUNDS``) so that the timed rounds of a slow
    case take about ``max_time_s`` (like pytest-benchmark's --benchmark-max-time)."""
    if not max_time_s or step_time_s <= 0:
        return rounds
    return max(min(rounds, MIN_ROUNDS), min(rounds, int(max_time_s / step_time_s)))


def _time_one(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _measure_single(benchmark, case: Case, rounds: int, warmup_rounds: int,
                    max_time_s: float | None) -> dict:
    try:
        if case.cfg.loader.cached:
            # Steady state of a cache: one epoch fills it (where the loading process survives
            # the epoch: no workers, or persistent workers), then it serves the timed steps.
            for _ in case.loader:
                pass
        # The loader alone, before training starts iterating it.
        loader_only = measure_loader(case.loader, LOADER_PROBE_BATCHES)
        with case.precision.math_mode():
            check = check_case(case)
            with SavedActivations(case.model) as saved:
                flops = count_flops(case.step)
            rounds = budget_rounds(rounds, _time_one(case.synced_step), max_time_s)
            starts = [reset_peak(d) for d in case.devices]
            last_loss = benchmark.pedantic(
                case.synced_step, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1
            )
            per_device = [read_peak(d, s) for d, s in zip(case.devices, starts, strict=True)]
            # Several devices (dp, model parallel on CUDA): the fullest one, and each.
            memory = max(per_device, key=lambda m: m["peak_memory_bytes"] or 0)
            if len(per_device) > 1:
                memory["device_peak_memory_bytes"] = [m["peak_memory_bytes"] for m in per_device]
    finally:
        case.close()
    # Each timed round drew accum_steps batches: the last rounds*k waits are the timed ones.
    waits = list(case.batches.waits)[-rounds * case.cfg.accum_steps:]
    rounds_s = benchmark.stats.stats.data
    return {
        # Saved for backward per micro-batch (each is freed by its own backward).
        "activation_bytes": saved.total_bytes // case.cfg.accum_steps,
        **loader_only,
        "loader_wait_s": sum(waits) / rounds,
        "loader_stall_fraction": sum(waits) / sum(rounds_s),
        **memory,
        **state_breakdown(case.model, case.optimizer),
        "flops_per_step": flops,
        "loss_reference": check.reference_loss,
        "loss_first": check.first_loss,
        "loss_rtol": check.rtol,
        "check_losses": check.losses,
        "check_skipped_steps": check.skipped_steps,
        "last_loss": last_loss.float().item(),
    }


def measure_ranks(benchmark, cfg: RunConfig, group, rounds: int, warmup_rounds: int,
                  max_time_s: float | None = None) -> dict:
    """Check, count, time and measure a multi-process case through ``group.call`` (worker
    processes, or the ranks of a torchrun job), combining the ranks' figures."""
    checks = group.call("check")
    flops = group.call("flops")
    rounds = budget_rounds(rounds, _time_one(lambda: group.call("step")), max_time_s)
    group.call("reset_peak")
    benchmark.pedantic(group.call, args=("step",), rounds=rounds,
                       warmup_rounds=warmup_rounds, iterations=1)
    memories = group.call("read_peak")
    info = combine_ranks(checks, flops, memories)
    if cfg.parallel == "ddp":
        allreduce_s = max(group.call("allreduce_probe"))
        syncs = 1 if cfg.ddp_no_sync else cfg.accum_steps
        info["allreduce_time_s"] = allreduce_s
        info["comm_time_s"] = allreduce_s * syncs
    return info


def _measure_multiprocess(benchmark, cfg: RunConfig, rounds: int, warmup_rounds: int,
                          timeout_s: float, max_time_s: float | None) -> dict:
    with WorkerGroup(cfg.world_size, RankProgram, (cfg,), backend=backend_for(cfg.device),
                     timeout_s=timeout_s) as group:
        return measure_ranks(benchmark, cfg, group, rounds, warmup_rounds, max_time_s)


def run_case(benchmark, cfg: RunConfig, *, rounds: int, warmup_rounds: int,
             timeout_s: float = DEFAULT_TIMEOUT_S, max_time_s: float | None = None,
             group=None) -> dict:
    """Check, count, time and measure ``cfg``; fill and return ``benchmark.extra_info``.

    ``rounds`` shrinks for slow steps so the timed rounds take about ``max_time_s`` (never below
    ``MIN_ROUNDS``). Multi-process cases start their own worker processes, unless ``group`` (the
    ranks of an existing job, see ``LocalRanks``) is given."""
    reason = unsupported_reason(cfg, check_devices=group is None)
    if reason:
        raise Unsupported(reason)
    if group is not None:
        measured = measure_ranks(benchmark, cfg, group, rounds, warmup_rounds, max_time_s)
    elif cfg.multiprocess:
        check_world_size(cfg)
        measured = _measure_multiprocess(benchmark, cfg, rounds, warmup_rounds, timeout_s,
                                         max_time_s)
    else:
        measured = _measure_single(benchmark, build(cfg), rounds, warmup_rounds, max_time_s)
    return record(benchmark, cfg, measured)


def record(benchmark, cfg: RunConfig, measured: dict) -> dict:
    """The case's full record from its measured figures and ``benchmark``'s rounds."""
    if measured["last_loss"] is None or not math.isfinite(measured["last_loss"]):
        raise AssertionError(f"{cfg.id}: non-finite loss in the timed steps")
    rounds_s = list(benchmark.stats.stats.data)
    step_time_s = statistics.median(rounds_s)
    q1, _, q3 = statistics.quantiles(rounds_s, n=4) if len(rounds_s) > 1 else (0, 0, 0)
    micro_batch = resolve_micro_batch(cfg)
    replicas = cfg.world_size if cfg.parallel == "ddp" else 1
    global_batch = micro_batch * cfg.accum_steps * replicas
    devices = cfg.world_size if cfg.parallel != "single" else 1
    achieved = measured["flops_per_step"] / step_time_s
    # MFU of a multi-device case: against the peak of all the devices it occupies.
    peak = step_peak_flops(str(_device(cfg)), cfg.precision) * devices
    info = {
        "kind": "step",
        **cfg.flatten(),
        "case_id": cfg.id,
        "is_baseline": cfg.is_baseline,
        "micro_batch": micro_batch,
        "global_batch": global_batch,
        "input_shape": input_shape(cfg.model, cfg.profile, micro_batch),
        "device_name": device_name(_device(cfg)),
        "step_time_s": step_time_s,
        "step_time_iqr_s": q3 - q1,
        "samples_per_s": global_batch / step_time_s,
        **measured,
        "tflops": achieved / 1e12,
        "peak_tflops": peak / 1e12,
        "mfu": achieved / peak,
        "note": _note(cfg),
    }
    if cfg.parallel != "single":
        single = cfg.with_(parallel="single", world_size=1, ddp_no_sync=False, chunks=1,
                           schedule="gpipe")
        info["single_case_id"] = single.id  # what scaling efficiency compares with
    if "comm_time_s" in info:
        info["comm_fraction"] = min(1.0, info["comm_time_s"] / step_time_s)
    benchmark.extra_info.update(info)
    return info


def _device(cfg: RunConfig) -> torch.device:
    return torch.device("cuda", 0) if cfg.device == "cuda" else torch.device("cpu")


def _note(cfg: RunConfig) -> str:
    notes = [f"no effect here: {t}" for t in cfg.inert_techniques]
    if cfg.device == "cpu" and cfg.parallel != "single":
        notes.append(f"{cfg.parallel} on the CPU: all ranks/stages share this machine's cores")
    return "; ".join(n for n in notes if n)
