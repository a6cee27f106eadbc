"""How to measure: run one case under a pytest-benchmark fixture and record every metric.

The fixture is used through ``pedantic`` (explicit warm-up and rounds, one step per round), so the
raw per-round times are pytest-benchmark's own and land in its JSON. Each round is one complete,
device-synchronized training step including the wait for its batches; for multi-process cases a
round ends when every rank has finished the step (the slowest rank's time, plus the cost of the
command round trip, which the ``workers`` benchmark reports on its own).
"""

from __future__ import annotations

import contextlib
import math
import statistics

import torch

from gpubench.launchers.distributed import backend_for
from gpubench.launchers.workers import DEFAULT_TIMEOUT_S, WorkerGroup, start_method
from gpubench.measure.flops import fp8_peak_flops, step_peak_flops
from gpubench.measure.machine import device_name
from gpubench.measure.protocol import (
    MIN_ROUNDS,
    STEADY_TOLERANCE,
    CaseProgram,
    InProcess,
    Phases,
    budget_rounds,
    measure,
    relative_half_width,
)
from gpubench.measure.trace import trace_case
from gpubench.train.build import Unsupported, check_world_size, unsupported_reason
from gpubench.train.config import FP8_PRECISIONS, RunConfig

__all__ = ["MIN_ROUNDS", "RankPool", "budget_rounds", "launcher", "record", "run_case"]


class RankPool:
    """Rank processes kept from one multi-process case to the next: a run's DDP, FSDP and
    pipeline cases of a model come one after another, and each would otherwise start its ranks
    afresh (spawn, import torch, join the process group: about 3 s per case on a 2-core
    machine, more than its timed rounds). A case whose world size, backend, worker environment
    and timeout match the running ranks' rebuilds its program in them
    (``WorkerGroup.rebuild``); any other case, or a failure, stops them first. Between cases
    the ranks hold no program (its loader workers stopped, its memory freed)."""

    def __init__(self):
        self.group: WorkerGroup | None = None
        self.key: tuple | None = None
        self.started = 0
        """Rank groups started so far (the rest of the cases reused one)."""

    @staticmethod
    def key_of(cfg: RunConfig, timeout_s: float) -> tuple:
        return (cfg.world_size, backend_for(cfg.device), tuple(sorted(cfg.worker_env().items())),
                timeout_s)

    def matches(self, cfg: RunConfig, timeout_s: float) -> bool:
        """Whether ``cfg`` would run in the ranks running now."""
        return (self.group is not None and self.group.alive
                and self.key == self.key_of(cfg, timeout_s))

    @contextlib.contextmanager
    def lease(self, cfg: RunConfig, timeout_s: float):
        """The ranks of ``cfg`` with its program built, as a launcher for ``measure``."""
        check_world_size(cfg)
        if not self.matches(cfg, timeout_s):
            self.close()
        try:
            if self.group is None:
                self.group = WorkerGroup(cfg.world_size, CaseProgram, (cfg,),
                                         backend=backend_for(cfg.device), timeout_s=timeout_s,
                                         env=cfg.worker_env(),
                                         start_method=start_method(cfg.device, cfg.worker_env()))
                self.key = self.key_of(cfg, timeout_s)
                self.started += 1
            else:
                self.group.rebuild(CaseProgram, (cfg,))
            yield self.group
            self.group.rebuild(_no_program)  # the case's loader workers and memory go now
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.group is not None:
            group, self.group, self.key = self.group, None, None
            group.close(graceful=group.alive)


def _no_program(rank: int, world_size: int) -> None:
    """What a pooled rank holds between cases: nothing."""
    return None


def forked_imports(configs) -> set[str]:
    """The modules (``Workload.imports``) of the configurations among ``configs`` whose
    processes fork from the fork server (``start_method``): what the server imports once
    (``gpubench.launchers.workers.preload_workload_imports``) instead of each rank."""
    return {m for cfg in configs
            if cfg.in_workers and start_method(cfg.device, cfg.worker_env()) == "forkserver"
            for m in cfg.workload.imports}


def launcher(cfg: RunConfig, timeout_s: float = DEFAULT_TIMEOUT_S,
             ranks: RankPool | None = None, program: type = CaseProgram,
             args: tuple | None = None):
    """The launcher of ``cfg``: worker processes per rank for DDP, FSDP and pipeline cases
    (from ``ranks`` when given, see ``RankPool``); one worker process for a case whose CUDA
    allocator settings must be in place before CUDA starts (``expandable_segments``: the
    process is started with ``cfg.worker_env()``); this process otherwise (a context manager
    whose ``call`` runs the measurement commands, each within ``timeout_s`` too). Each process
    runs ``program(rank, world_size, *args)`` (default: the measurement protocol's
    ``CaseProgram`` of ``cfg``; convergence parity's ``ParityProgram`` is another)."""
    args = (cfg,) if args is None else args
    if cfg.multiprocess:
        if ranks is not None and program is CaseProgram:
            return ranks.lease(cfg, timeout_s)
        check_world_size(cfg)
        return WorkerGroup(cfg.world_size, program, args, backend=backend_for(cfg.device),
                           timeout_s=timeout_s, env=cfg.worker_env(),
                           start_method=start_method(cfg.device, cfg.worker_env()))
    if cfg.in_workers:  # one process, its own CUDA allocator; no collectives: gloo
        return WorkerGroup(1, program, args, backend="gloo", timeout_s=timeout_s,
                           env=cfg.worker_env(),
                           start_method=start_method(cfg.device, cfg.worker_env()))
    return InProcess(cfg, timeout_s=timeout_s,
                     **({} if program is CaseProgram else {"program": program, "args": args}))


def run_case(benchmark, cfg: RunConfig, *, rounds: int, warmup_rounds: int,
             timeout_s: float = DEFAULT_TIMEOUT_S, max_time_s: float | None = None,
             group=None, baseline=None, trace_dir=None, ranks: RankPool | None = None,
             min_time_s: float | None = None, energy_block_s: float = 0.0,
             target_width: float = 0.0) -> dict:
    """Check, count, time and measure ``cfg``; fill and return ``benchmark.extra_info``.

    ``rounds`` shrinks for slow steps so the timed rounds take about ``max_time_s`` (never below
    ``MIN_ROUNDS``), and grows for fast ones until they take ``min_time_s``
    (``budget_rounds``). Multi-process cases start their own worker processes, unless ``group`` (the
    ranks of an existing job, see ``LocalRanks``) is given. ``baseline`` (a ``PairedBaseline``
    of ``cfg.baseline``) pairs every timed round with a baseline round (drift-robust speedup).
    With ``trace_dir``, a few more steps are profiled after the timed rounds
    (``gpubench.measure.trace``: a trace per case and rank in that folder, ``top_ops`` in the
    record). ``ranks`` (a ``RankPool``) lends a multi-process case rank processes kept from the
    previous case. ``energy_block_s``: seconds of each side's energy block of a paired case
    (``measure``). ``target_width``: the timed rounds stop once the paired speedup's interval
    is this tight (relative half-width; 0: a fixed count; ``StoppingRule``)."""
    reason = unsupported_reason(cfg, check_devices=group is None)
    if reason:
        raise Unsupported(reason)
    phases = Phases()
    if group is not None:
        measured = measure(benchmark, cfg, group, rounds, warmup_rounds, max_time_s, baseline,
                           phases, min_time_s, energy_block_s, target_width)
        measured["peak_flops_per_device"] = _shared_peak(cfg)
        if trace_dir:
            measured.update(trace_case(group, cfg, trace_dir))
            phases.lap("trace")
    else:
        with launcher(cfg, timeout_s, ranks) as own:
            phases.lap("build")
            measured = measure(benchmark, cfg, own, rounds, warmup_rounds, max_time_s,
                               baseline, phases, min_time_s, energy_block_s, target_width)
            if trace_dir:
                measured.update(trace_case(own, cfg, trace_dir))
                phases.lap("trace")
        phases.lap("close")
    measured["harness_s"] = phases.seconds
    return record(benchmark, cfg, measured)


def record(benchmark, cfg: RunConfig, measured: dict) -> dict:
    """The case's full record from its measured figures and ``benchmark``'s rounds."""
    if measured["last_loss"] is None or not math.isfinite(measured["last_loss"]):
        raise AssertionError(f"{cfg.id}: non-finite loss in the timed steps")
    if getattr(benchmark, "stats", None) is None:  # --benchmark-disable: checked, not timed
        info = {"kind": "step", **cfg.flatten(), "model": cfg.name, "workload": cfg.model,
                "case_id": cfg.id, "timed": False,
                **{k: v for k, v in measured.items() if k.startswith(("loss_", "check_"))}}
        benchmark.extra_info.update(info)
        return info
    stats = benchmark.stats.stats  # pytest-benchmark's Stats: its median and IQR, as it prints
    rounds_s = list(stats.data)
    step_time_s = stats.median
    micro_batch = cfg.resolved_micro_batch
    global_batch = cfg.global_batch
    # MFU by the published convention (model FLOPs: no recomputation), HFU from what the
    # kernels did (hardware FLOPs: checkpointing's re-run forward, attention's recompute).
    achieved = measured.get("model_flops_per_step", measured["flops_per_step"]) / step_time_s
    hardware = measured["flops_per_step"] / step_time_s
    # MFU of a multi-device case: against the peak of all the devices it occupies.
    per_device = (measured.pop("peak_flops_per_device", None)
                  or step_peak_flops(str(_device(cfg)), cfg.precision))
    peak = per_device * cfg.parallelism.devices
    info = {
        "kind": "step",
        **cfg.flatten(),
        "model": cfg.name,
        "workload": cfg.model,
        "workload_datasets": list(cfg.workload.dataset_names),
        "uses_sdpa": cfg.workload.facts.uses_sdpa,
        "hf_attention": cfg.workload.facts.hf_attention,
        "case_id": cfg.id,
        "is_baseline": cfg.is_baseline,
        "micro_batch": micro_batch,
        "global_batch": global_batch,
        "input_shape": cfg.workload.input_shape(micro_batch),
        "device_name": device_name(_device(cfg)),
        "cudnn_benchmark": cfg.device == "cuda",  # Precision.math_mode turns it on for CUDA
        "dynamo_recompiles": (sum(map(len, torch._dynamo.utils.guard_failures.values()))
                              if cfg.compile and not cfg.in_workers else None),
        "step_time_s": step_time_s,
        "step_time_iqr_s": stats.iqr,
        "samples_per_s": global_batch / step_time_s,
        **measured,
        # A compiled case is counted on its eager model: the kernels named are the eager ones.
        "attention_kernels_from": "eager model" if cfg.compile else "step",
        "tflops": achieved / 1e12,
        "hardware_tflops": hardware / 1e12,
        "peak_tflops": peak / 1e12,
        "mfu": achieved / peak,
        "hfu": hardware / peak,
        "note": _note(cfg, measured),
    }
    if measured.get("uncounted_ops"):
        # The count left out heavy work (an op with no FLOP formula): any FLOP rate from it
        # would be a silent low number. Null, and ``uncounted_ops`` says why.
        info.update(tflops=None, hardware_tflops=None, mfu=None, hfu=None)
    if cfg.precision in FP8_PRECISIONS:
        # The field has no agreed ceiling for FP8 MFU: against bf16's (``mfu``, what the rest
        # of the step runs in) and the float8 matmul's (None without FP8 units).
        fp8 = fp8_peak_flops(str(_device(cfg)))
        info["fp8_peak_tflops"] = None if fp8 is None else fp8 * cfg.parallelism.devices / 1e12
        info["mfu_fp8"] = (None if fp8 is None or info["mfu"] is None
                           else achieved / (fp8 * cfg.parallelism.devices))
    if cfg.parallel != "single":
        single = cfg.with_(parallel="single", world_size=1, ddp_no_sync=False, chunks=1,
                           schedule="gpipe", fsdp_mixed_precision=False)
        info["single_case_id"] = single.id  # what scaling efficiency compares with
    info.update(paired_speedup(cfg, rounds_s, measured.get("paired_baseline_rounds_s"),
                               measured.get("paired_worker_offset"),
                               measured.get("paired_worker_offset_width")))
    if cfg.compile:
        info.update(compile_cost(info, cfg))
    if "comm_time_s" in info:
        info["comm_fraction"] = min(1.0, info["comm_time_s"] / step_time_s)
    benchmark.extra_info.update(info)
    return info


def compile_seconds(step_times_s: list[float], step_time_s: float,
                    tolerance: float = STEADY_TOLERANCE) -> tuple[float, int]:
    """(seconds, steps) compiling took: the leading steps of the check slower than a steady
    step of ``step_time_s`` by more than ``tolerance`` (``is_steady``'s; the first always
    counts), each less a steady step. The first step traces and compiles forward and
    backward (with max-autotune, autotunes); under reduce-overhead the second records the
    CUDA graphs of both (the first only warms them up) and the third replays them; a guard
    that fails on the second step's state recompiles there. A step within the tolerance ends
    the count: what follows is the steady step."""
    seconds, steps = 0.0, 0
    for i, t in enumerate(step_times_s):
        if i and t <= step_time_s * (1 + tolerance):
            break
        seconds += max(0.0, t - step_time_s)
        steps += 1
    return seconds, steps


def compile_cost(info: dict, cfg: RunConfig | None = None,
                 uncompiled_step_s: float | None = None) -> dict:
    """What ``torch.compile`` cost a case: ``compile_time_s``, the seconds its first steps took
    beyond steady ones until the step was steady (``compile_seconds``: the compilation, the
    autotuning of max-autotune, the CUDA-graph capture of reduce-overhead; ``compile_steps``
    of them), each case compiling into a fresh cache (``gpubench.train.compilecache``), and
    ``break_even_steps``, the steps after which it has paid off: that
    time over the seconds each step saves against the *same configuration uncompiled*
    (``break_even_against``): ``uncompiled_step_s`` where its step time is known, else the
    paired baseline when that is the same configuration uncompiled (an fp32 compiled case
    against fp32 eager), else None here (a bf16 compiled case against the fp32 baseline would
    credit bf16's saving to compiling): the run's records are read together afterwards, and
    ``gpubench.analysis.results.with_compile_break_even`` takes the twin's step time from
    them where it was measured. None also where the compiled step saves nothing."""
    first, step = info.get("first_step_s"), info["step_time_s"]
    if first is None:
        return {}
    compile_s, steps = compile_seconds(info.get("check_step_times_s") or [first], step)
    out = {"compile_time_s": compile_s, "compile_steps": steps, "break_even_steps": None,
           "break_even_against": None}
    twin = cfg.with_(compile=False, compile_mode="default") if cfg is not None else None
    if uncompiled_step_s is not None:
        saved = uncompiled_step_s - step
        out["break_even_against"] = twin.id if twin is not None else "uncompiled"
    elif (twin is not None and twin == cfg.baseline and info.get("speedup_paired")
          and info.get("baseline_step_time_s") is not None):
        # The paired baseline is the same configuration uncompiled: its seconds per step, in
        # the case's batch (speedup_paired carries the ratio of global batches).
        saved = step * info["speedup_paired"] - step
        out["break_even_against"] = twin.id
    else:
        return out
    if saved > 0:
        out["break_even_steps"] = compile_s / saved
    return out


def paired_speedup(cfg: RunConfig, rounds_s: list[float],
                   baseline_rounds_s: list[float] | None, worker_offset: float | None = None,
                   worker_offset_width: float | None = None) -> dict:
    """Throughput relative to the baseline from rounds measured in alternation: the median of
    the per-round ratios baseline time / case time, times the ratio of global batches, with a
    bootstrap interval over the round pairs and a Wilcoxon test (``gpubench.util.stats``).

    ``worker_offset``: a case paired with the baseline's worker process, whose own speed
    against the benchmark process's was measured when it started (``paired_worker_offset``,
    the benchmark process's baseline step over the worker's). The worker's rounds are scaled
    by it, so the ratio, its interval and its test are against the baseline as it runs where
    the baseline case ran; the interval then also carries the offset's own
    (``worker_offset_width``, its relative half-width; each side's relative distance from
    the ratio added to it in quadrature)."""
    if not baseline_rounds_s or len(baseline_rounds_s) != len(rounds_s):
        return {}
    from gpubench.util.stats import compare_paired

    batches = cfg.global_batch / cfg.baseline.global_batch
    base = [b * (worker_offset or 1.0) for b in baseline_rounds_s]
    est = compare_paired(base, rounds_s)
    low, high = est.low, est.high
    if worker_offset and worker_offset_width and math.isfinite(worker_offset_width):
        low = est.ratio * (1 - math.hypot(1 - low / est.ratio, worker_offset_width))
        high = est.ratio * (1 + math.hypot(high / est.ratio - 1, worker_offset_width))
    return {
        "speedup_paired": est.ratio * batches,
        "speedup_paired_low": low * batches,
        "speedup_paired_high": high * batches,
        "speedup_paired_p": est.p_value,
        "speedup_paired_test": est.test,
        "baseline_step_time_s": statistics.median(baseline_rounds_s),
        # the interval's half-width over the speedup (0.02: +-2%)
        "speedup_paired_width": relative_half_width(low, high, est.ratio),
    }


def _device(cfg: RunConfig) -> torch.device:
    """This process's device (a torchrun rank's own GPU, set before its process group)."""
    if cfg.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _shared_peak(cfg: RunConfig) -> float:
    """The matmul peak MFU divides by, for the ranks of a job (``LocalRanks``): measured once,
    by rank 0 on its own device while the others wait, then broadcast, so that no two ranks
    measure at the same time (a contended peak) or on the same GPU."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return step_peak_flops(str(_device(cfg)), cfg.precision)
    peak = [step_peak_flops(str(_device(cfg)), cfg.precision) if dist.get_rank() == 0
            else None]
    dist.broadcast_object_list(peak, src=0)
    return float(peak[0])


def _note(cfg: RunConfig, measured: dict) -> str:
    notes = [f"no effect here: {t}" for t in cfg.inert_techniques]
    if measured.get("uncounted_ops"):
        notes.append("FLOPs leave out " + ", ".join(measured["uncounted_ops"]))
    if cfg.device == "cpu" and cfg.parallel != "single":
        notes.append(f"{cfg.parallel} on the CPU: all ranks/stages share this machine's cores")
    return "; ".join(n for n in notes if n)
