"""The advice's judges of parallelism: DDP, no_sync, sharding (FSDP), DataParallel vs DDP."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpubench.analysis.advice.cases import Verdict, _Cases, _missing
from gpubench.analysis.speed import (
    compare_speed,
    judge_memory,
)
from gpubench.suite.claims import CLAIMS
from gpubench.util.verdicts import Kind, combine_parts


def check_ddp(c: _Cases) -> list[Verdict]:
    """S4: the scaling efficiency of the largest fp32 DDP case (samples/s over devices x the
    single-device case's); testable only with one GPU per rank."""
    spec = CLAIMS["ddp"]
    claim = spec.text
    base = c.find()
    # The baseline's configuration over DDP ranks: nothing else differs from the single device.
    rows = [] if base is None else c.where(
        c.like(base, vary=("parallel", "world_size")) & c.is_("parallel", "ddp"))
    if not rows:
        return [_missing(c.model, claim, "scaling.png", "DDP cases")]
    row = max(rows, key=lambda r: r["world_size"])
    eff = row.get("scaling_efficiency")
    measured = f"{row['case_id']}: scaling efficiency {eff:.0%}" if pd.notna(eff) else "-"
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, measured, Kind.NOT_TESTABLE,
                        f"needs {int(row['world_size'])} GPUs: on the CPU the ranks share the same "
                        "cores, so no speedup is possible; the figure shows the cost of gloo "
                        "communication only", "scaling.png")]
    least = spec.parts["efficiency"][0]
    verdict = Kind.HOLDS if eff >= least else Kind.DOES_NOT_HOLD
    return [Verdict(c.model, claim, measured, verdict,
                    f"efficiency >= {least:.0%} counts as time cut to ~1/N", "scaling.png")]


def check_no_sync(c: _Cases) -> list[Verdict]:
    """S4: DDP accumulation with ``no_sync`` on the non-final micro-batches against without,
    with the estimated all-reduce time per step."""
    spec = CLAIMS["no-sync"]
    claim = spec.text
    rows = {False: c.claim_case(spec.key, "base"), True: c.claim_case(spec.key)}
    if rows[False] is None or rows[True] is None:
        return [_missing(c.model, claim, "scaling.png", "DDP accumulation with and without "
                         "no_sync")]
    speed = compare_speed(rows[False], rows[True])
    why = "separate cases"
    if pd.notna(rows[True].get("comm_time_s")):
        why += (f"; estimated all-reduce time per step {rows[False]['comm_time_s'] * 1e3:.1f} ms "
               f"-> {rows[True]['comm_time_s'] * 1e3:.1f} ms")
    return [Verdict(c.model, claim, speed.describe(), speed.decide(), why, "scaling.png")]


def check_sharding(c: _Cases) -> list[Verdict]:
    """S4: per-rank model state of DDP and FSDP at 2 ranks against one device's (exact bytes:
    testable on any device). DDP keeps a full replica of the parameters, gradients and
    optimizer state on every rank; FSDP shards all three."""
    spec = CLAIMS["sharding"]
    claim = spec.text
    base, ddp = c.find(), c.find(parallel="ddp", world_size=2)
    fsdp = c.find(parallel="fsdp", world_size=2)
    if base is None or ddp is None or not base["optimizer_state_bytes"]:
        return [_missing(c.model, claim, "memory.png", "the fp32 baseline and ddp2 cases")]

    def ratios(row: pd.Series) -> tuple[float, float]:
        model = row["param_bytes"] + row["grad_bytes"]
        return (row["optimizer_state_bytes"] / base["optimizer_state_bytes"],
                model / (base["param_bytes"] + base["grad_bytes"]))

    ddp_opt, ddp_model = ratios(ddp)
    verdict = judge_memory(ddp_opt, spec.parts["memory"])
    measured = (f"optimizer state per rank: DDP x{ddp_opt:.2f} of one device's "
                f"({ddp['optimizer_state_bytes'] / 2**20:,.2f} MiB)")
    why = (f"DDP replicates the optimizer state on every rank, like the parameters and "
           f"gradients (x{ddp_model:.2f}: gradients are all-reduced, not split)")
    if fsdp is not None:
        fsdp_opt, fsdp_model = ratios(fsdp)
        measured += (f", FSDP x{fsdp_opt:.2f} "
                     f"({fsdp['optimizer_state_bytes'] / 2**20:,.2f} MiB)")
        why += (f"; FSDP shards it: x{fsdp_opt:.2f} per rank at 2 ranks (parameters + "
                f"gradients x{fsdp_model:.2f})")
    else:
        why += "; FSDP, which shards it, not measured (fsdp2 case)"
    return [Verdict(c.model, claim, measured, verdict, why, "memory.png")]


def _bytes(n: float) -> str:
    if n >= 2**20:
        return f"{n / 2**20:,.2f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:,.1f} KiB"
    return f"{int(n)} B"


def _device_imbalance(row: pd.Series) -> float:
    """Max over min of a case's per-device peaks (``device_peak_memory_bytes``), NaN without
    two of them."""
    peaks = row.get("device_peak_memory_bytes")
    if not isinstance(peaks, list | tuple | np.ndarray):
        return float("nan")
    peaks = [float(p) for p in peaks if p is not None and p == p]
    if len(peaks) < 2 or min(peaks) <= 0:
        return float("nan")
    return max(peaks) / min(peaks)


def check_dp_vs_ddp(c: _Cases) -> list[Verdict]:
    """S4, S0: DDP against DataParallel over 2 GPUs, per sample, and the memory of their GPUs."""
    spec = CLAIMS["dp-vs-ddp"]
    claim = spec.text
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, "-", Kind.NOT_TESTABLE,
                        "needs 2 GPUs: DataParallel runs on CUDA only (its cases skip on the "
                        "CPU), and DDP ranks on a CPU share its cores", "scaling.png")]
    base = c.find()
    ddp, dp = c.claim_case(spec.key), c.claim_case(spec.key, "base")
    same_batch = dp is not None
    if dp is None and base is not None:  # DataParallel at the baseline's micro-batch
        dp = c.find(parallel="dp", world_size=2, micro_batch=int(base["micro_batch"]))
    if dp is None or ddp is None:
        return [_missing(c.model, claim, "scaling.png", "the fp32 dp2 and ddp2 cases")]
    speed = compare_speed(dp, ddp)  # per sample: the global batches may differ
    dp_imb, ddp_imb = _device_imbalance(dp), _device_imbalance(ddp)
    peak = float(ddp["peak_memory_bytes"]) / float(dp["peak_memory_bytes"])
    parts = {"time": speed.judge(spec.parts["time"]),
             "imbalance": judge_memory(ddp_imb / dp_imb, spec.parts["imbalance"])}
    why = ("separate cases, per sample; DataParallel is one process that every step copies the "
           "module to each GPU, scatters the batch from GPU 0, gathers the outputs and reduces "
           "the gradients on GPU 0, its threads sharing one GIL; DDP runs a process per GPU, "
           "each with its own micro-batch, and all-reduces gradients during backward")
    if same_batch:
        parts["peak"] = judge_memory(peak, spec.parts["peak"])
        why += (f"; both at global batch {int(ddp['global_batch'])}, "
                f"{int(ddp['micro_batch'])} samples per GPU")
    else:
        why += (f"; busiest-GPU memory not judged: {dp['case_id']} puts "
                f"{int(dp['micro_batch']) // 2} samples on each GPU, DDP "
                f"{int(ddp['micro_batch'])} (DataParallel at twice the micro-batch not measured)")
    measured = (f"DDP vs DataParallel {speed.describe()}; busiest GPU "
                f"{_bytes(float(dp['peak_memory_bytes']))} (DP), "
                f"{_bytes(float(ddp['peak_memory_bytes']))} (DDP), x{peak:.2f}; GPUs' peaks "
                f"apart x{dp_imb:.2f} (DP), x{ddp_imb:.2f} (DDP)")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "scaling.png")]
