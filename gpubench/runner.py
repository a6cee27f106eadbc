"""How to measure: run one case under a pytest-benchmark fixture and record every metric.

The fixture is used through ``pedantic`` (explicit warm-up and rounds, one step per round), so the
raw per-round times are pytest-benchmark's own and land in its JSON. Each round is one complete,
device-synchronized training step including the wait for its batches.
"""

from __future__ import annotations

import math
import statistics

from gpubench.build import build, unsupported_reason
from gpubench.checks import check_case
from gpubench.config import RunConfig
from gpubench.flops import count_flops, step_peak_flops
from gpubench.machine import device_name
from gpubench.memory import read_peak, reset_peak, state_breakdown


class Unsupported(Exception):
    """This machine cannot run the case; the message says why (benchmarks skip with it)."""


def run_case(benchmark, cfg: RunConfig, *, rounds: int, warmup_rounds: int) -> dict:
    """Check, count, time and measure ``cfg``; fill and return ``benchmark.extra_info``."""
    reason = unsupported_reason(cfg)
    if reason:
        raise Unsupported(reason)
    case = build(cfg)
    with case.precision.math_mode():
        check = check_case(case)
        flops = count_flops(case.step)
        start_bytes = reset_peak(case.device)
        last_loss = benchmark.pedantic(
            case.synced_step, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1
        )
        memory = read_peak(case.device, start_bytes)
    if not math.isfinite(last_loss.item()):
        raise AssertionError(f"{cfg.id}: non-finite loss in the timed steps")
    rounds_s = list(benchmark.stats.stats.data)
    step_time_s = statistics.median(rounds_s)
    q1, _, q3 = statistics.quantiles(rounds_s, n=4) if len(rounds_s) > 1 else (0, 0, 0)
    achieved = flops / step_time_s
    peak = step_peak_flops(cfg.device, cfg.precision)
    info = {
        "kind": "step",
        **cfg.flatten(),
        "case_id": cfg.id,
        "is_baseline": cfg.is_baseline,
        "micro_batch": case.micro_batch,
        "global_batch": case.global_batch,
        "input_shape": case.input_shape,
        "device_name": device_name(case.device),
        "step_time_s": step_time_s,
        "step_time_iqr_s": q3 - q1,
        "samples_per_s": case.global_batch / step_time_s,
        **memory,
        **state_breakdown(case.eager_model, case.optimizer),
        "flops_per_step": flops,
        "tflops": achieved / 1e12,
        "peak_tflops": peak / 1e12,
        "mfu": achieved / peak,
        "loss_reference": check.reference_loss,
        "loss_first": check.first_loss,
        "loss_rtol": check.rtol,
        "check_losses": check.losses,
        "check_skipped_steps": check.skipped_steps,
        "note": case.precision.note,
    }
    benchmark.extra_info.update(info)
    return info
