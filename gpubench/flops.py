"""FLOPs of a step (counted, not estimated) and the device's measured matmul peak per precision.

MFU here is achieved FLOP/s divided by the *measured* throughput of a large matmul at the step's
precision on this very device, not a datasheet figure: it says how close the step comes to what
this machine's matmul path actually delivers.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpubench.precision import Precision


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matmuls and convolutions ``fn`` runs (forward, backward and recompute)."""
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_peak_flops(device_str: str, precision: str) -> float:
    """The ceiling MFU divides by: the matmul peak of the step's precision. Under autocast some
    ops stay in float32, so the ceiling is the faster of the autocast dtype's and fp32's peaks
    (on a CPU without fp16 units, fp32 is the faster path and autocast uses it for many ops)."""
    peak = matmul_peak_flops(device_str, precision)
    if precision in ("fp16", "bf16"):
        peak = max(peak, matmul_peak_flops(device_str, "fp32"))
    return peak


@functools.cache
def matmul_peak_flops(device_str: str, precision: str) -> float:
    """Best FLOP/s of a square matmul at ``precision`` on ``device``, measured once per process.

    The side grows until one matmul takes >= 20 ms (or a cap is hit), so slow paths (fp16 on a
    CPU without half-precision units) stay quick to measure and fast ones reach their plateau.
    """
    device = torch.device(device_str)
    policy = Precision(precision, device.type)
    dtype = policy.autocast_dtype or torch.float32
    cap = 8192 if device.type == "cuda" else 2048
    n, elapsed = 256, 0.0
    with policy.math_mode():
        while True:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            a @ b  # warm-up: kernel selection, allocator
            _sync(device)
            start = time.perf_counter()
            a @ b
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= 0.02 or n >= cap:
                break
            n *= 2
        reps = max(3, min(50, int(0.3 / max(elapsed, 1e-6))))
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            a @ b
            _sync(device)
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
