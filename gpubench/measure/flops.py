"""FLOPs of a step (counted, not estimated) and the device's measured matmul peak per precision.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add, forward,
backward and recompute: *hardware* FLOPs; *model* FLOPs leave the recomputation out, see
``FlopCount.model_total``), with formulas added for ops it has none for but that do heavy work in
the built-in workloads: the CPU attention kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, counted as torch counts
the GPU attention kernels (``sdpa_flop_count``, ``sdpa_backward_flop_count``: the full score
matrix even for causal attention, and the backward with its recompute of the scores), and the
fused recurrent layers (LSTM, GRU, RNN: ``aten.mkldnn_rnn_layer`` on the CPU, ``aten._cudnn_rnn``
on CUDA, and their backwards), whose cells are matmuls counted as the unfused cell's
``aten.addmm``/``aten.mm`` would be.
``count_flops_detailed`` also names the heavy ops that ran and were counted as zero, so that a
count that misses work says so.

MFU here is achieved FLOP/s divided by the *measured* throughput of a large matmul at the step's
precision on this very device, not a datasheet figure: it says how close the step comes to what
this machine's matmul path actually delivers.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from gpubench.train.precision import Precision, fp8_units
from gpubench.train.techniques import FP8_PRECISIONS

aten = torch.ops.aten


def _cpu_attention_flop(query_shape, key_shape, value_shape, *args, out_shape=None,
                        **kwargs) -> int:
    """``_scaled_dot_product_flash_attention_for_cpu(query, key, value, ...)``."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args,
                                 out_shape=None, **kwargs) -> int:
    """``_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value,
    ...)``."""
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape,
                                                 value_shape)


def _tokens(input_shape) -> int:
    """Time steps x batch of a recurrent layer's input ((T, B, I), (B, T, I), or packed
    (sum of lengths, I)): the positions each of its weight matrices multiplies."""
    n = 1
    for d in input_shape[:-1]:
        n *= int(d)
    return n


def _matrices(weights) -> int:
    """Multiply-adds per position of a recurrent layer's weights: the sum of the sizes of its
    matrices (input-hidden, hidden-hidden, LSTM projection; biases are additions)."""
    return sum(int(w[0]) * int(w[1]) for w in weights if w is not None and len(w) == 2)


def _rnn_layer_flop(input_shape, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
    """``mkldnn_rnn_layer(input, w_ih, w_hh, b_ih, b_hh, ...)``: one direction of one layer of
    an LSTM or GRU on the CPU. Each time step of each sequence multiplies the input by
    ``w_ih`` (gates x hidden, input) and the previous hidden state by ``w_hh`` (gates x hidden,
    hidden): 2 FLOPs per multiply-add, as torch counts ``aten.mm`` (the gates' elementwise
    work is not counted, as for every other layer)."""
    return 2 * _tokens(input_shape) * _matrices([w_ih, w_hh])


def _rnn_layer_backward_flop(input_shape, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
    """``mkldnn_rnn_layer_backward``: the gradients of the input and hidden state (the
    forward's matmuls transposed) and of the weights (as many again): twice the forward."""
    return 2 * _rnn_layer_flop(input_shape, w_ih, w_hh)


def _cudnn_rnn_flop(input_shape, weight, *args, out_shape=None, **kwargs) -> int:
    """``_cudnn_rnn(input, weight, ...)`` (and ``miopen_rnn``): every layer and direction of an
    RNN, LSTM or GRU at once; ``weight`` holds each one's matrices (and biases). Each matrix
    multiplies every position once per direction (a deeper layer's input is the layer below's
    output, at the same positions)."""
    return 2 * _tokens(input_shape) * _matrices(weight)


def _cudnn_rnn_backward_flop(input_shape, weight, *args, out_shape=None, **kwargs) -> int:
    """``_cudnn_rnn_backward(..., output_mask)``: the data gradients (input, hx, cx: the
    forward's matmuls transposed) where any is asked for, and the weights' where asked for."""
    mask = args[-1] if args and isinstance(args[-1], list | tuple) else (True,) * 4
    forward = _cudnn_rnn_flop(input_shape, weight)
    return forward * (int(any(mask[:3])) + int(bool(mask[3])))


def _extra_formulas() -> dict:
    """Formulas for ops torch's flop registry lacks (those this torch has are left to torch)."""
    wanted = {
        "_scaled_dot_product_flash_attention_for_cpu": _cpu_attention_flop,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_attention_backward_flop,
        "mkldnn_rnn_layer": _rnn_layer_flop,
        "mkldnn_rnn_layer_backward": _rnn_layer_backward_flop,
        "_cudnn_rnn": _cudnn_rnn_flop,
        "_cudnn_rnn_backward": _cudnn_rnn_backward_flop,
        "miopen_rnn": _cudnn_rnn_flop,
        "miopen_rnn_backward": _cudnn_rnn_backward_flop,
    }
    out = {}
    for name, formula in wanted.items():
        op = getattr(aten, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            out[op] = formula
    return out


EXTRA_FLOP_FORMULAS = _extra_formulas()
"""The formulas gpubench adds to ``FlopCounterMode``'s (``custom_mapping``)."""

_HEAVY_TOKENS = {
    "mm", "bmm", "matmul", "mv", "dot", "vdot", "ger", "outer", "addr", "addmm", "addbmm",
    "baddbmm", "addmv", "einsum", "tensordot", "linear", "bilinear", "cdist", "lstm", "gru",
    "rnn", "attention", "attn", "sdpa", "fft", "ifft", "rfft", "irfft", "hfft",
}


def is_heavy_op(name: str) -> bool:
    """Whether an op (``"aten.mm"``, ``"mkldnn._convolution_pointwise"``) is heavy work by its
    name: a matrix product, a convolution, attention, einsum, a recurrent layer, an FFT.
    Interpolation (``upsample_bilinear2d``) and conversions (``_convert_...``) are not."""
    base = name.rsplit(".", 1)[-1].lower()
    if "upsample" in base or "interp" in base:
        return False
    tokens = [t for t in base.split("_") if t]
    for token in tokens:
        stripped = re.sub(r"\d+[a-z]?$", "", token)  # conv2d -> conv, int8pack -> int, fft2
        if token in _HEAVY_TOKENS or stripped in _HEAVY_TOKENS:
            return True
        if token.startswith("conv") and not token.startswith("convert"):
            return True
        if token.endswith("mm") or "attention" in token:
            return True
    return False


@dataclass(frozen=True)
class FlopCount:
    """What ``count_flops_detailed`` counted.

    ``uncounted_ops``: the ops that ran (after ``FlopCounterMode``'s decompositions, e.g.
    ``aten.linear`` into ``aten.mm``), have no FLOP formula and are heavy by name
    (``is_heavy_op``): work the total misses. Elementwise ops, norms, softmax, embedding and
    losses are not counted by design (as in every FLOP/MFU convention) and are not listed.
    ``no_formula_ops`` lists every op that ran without a formula, heavy or not."""

    total: int
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted_ops: list[str] = field(default_factory=list)
    no_formula_ops: list[str] = field(default_factory=list)
    recomputed: int = 0
    """FLOPs of recomputation inside ``total``: the forward of checkpointed blocks run again
    in backward (``torch.utils.checkpoint``), and the fused attention backward's recompute of
    its score matrix (one of its five matmuls)."""

    @property
    def model_total(self) -> int:
        """Model FLOPs: what the model needs (``total`` without recomputation, attention in
        full), the convention of published MFU figures (PaLM's appendix B; nanoGPT's
        6N + 12LHQT per token)."""
        return self.total - self.recomputed

    @property
    def attention_kernels(self) -> list[str]:
        """The fused attention kernels that ran (``ATTENTION_KERNELS``: what
        ``scaled_dot_product_attention`` dispatched to, seen by the counter as its op), empty
        where none did (the math path runs as plain matmuls)."""
        found = (next((name for prefix, name in ATTENTION_KERNELS.items()
                       if op.removeprefix("aten.").startswith(prefix)), None)
                 for op in self.by_op)
        return sorted({name for name in found if name})

    @property
    def fp8_flops(self) -> int:
        """FLOPs of the float8 matmuls (``torch._scaled_mm``, what torchao's float8 linears
        run): the GEMM work that ran in FP8."""
        return sum(n for op, n in self.by_op.items() if op.startswith("aten._scaled_mm"))

    @property
    def gemm_flops(self) -> int:
        """FLOPs of the matrix multiplications (``GEMM_OPS``), float8 ones included: the
        work an FP8 recipe could run in float8, what ``fp8_flops`` is a share of."""
        return sum(n for op, n in self.by_op.items()
                   if op.removeprefix("aten.").split(".")[0] in GEMM_OPS)


GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_scaled_grouped_mm", "_grouped_mm",
            "_int_mm")
"""The matrix multiplications (GEMMs) as the FLOP counter names them after its decompositions
(a linear layer is ``addmm`` or ``mm``; the math attention path's products are ``bmm``), float8
and integer ones included. Convolutions and the fused attention kernels are not among them."""


def fp8_gemm_fraction(counts: list[dict]) -> float | None:
    """The share of a step's GEMM FLOPs that ran in FP8 (``fp8_flops`` over ``gemm_flops``,
    summed over the processes' ``counts``); None where the step ran no GEMM."""
    gemm = sum(c.get("gemm_flops", 0) for c in counts)
    return sum(c.get("fp8_flops", 0) for c in counts) / gemm if gemm else None


ATTENTION_KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_flash_attention_forward": "flash",
    "_efficient_attention_forward": "efficient",
}
"""Op name prefix -> the attention kernel it is (the backward ops share the forward's prefix).
The first matching prefix wins: the CPU's flash op is listed before the CUDA one it starts
with."""

ATTENTION_BACKWARD_RECOMPUTE = 1 / 5
"""Share of a fused attention backward's counted FLOPs that recompute the scores (QK^T): torch's
``sdpa_backward_flop_count`` adds that matmul to the four of the gradients (dV, dP, dQ, dK), all
of one size when queries and values have the same head size."""


def _attention_recompute(by_op: dict[str, int]) -> int:
    return int(sum(n for op, n in by_op.items() if op.endswith("attention_backward")
                   or op.endswith("attention_for_cpu_backward"))
               * ATTENTION_BACKWARD_RECOMPUTE)


class _Recomputation:
    """FLOPs that ``counter`` counts while ``torch.utils.checkpoint`` recomputes a forward in
    backward: its non-reentrant recomputation runs inside a ``_recomputation_hook`` context,
    whose entry and exit are wrapped while the count runs (where this torch has it;
    ``supported`` says so)."""

    def __init__(self, counter: FlopCounterMode):
        import torch.utils.checkpoint as ckpt

        self.counter, self.flops, self._depth, self._start = counter, 0, 0, 0
        self._hook = getattr(ckpt, "_recomputation_hook", None)
        self.supported = self._hook is not None and hasattr(self._hook, "__enter__")
        self._saved = None

    def __enter__(self):
        if not self.supported:
            return self
        hook, tracker = self._hook, self
        enter, leave = hook.__enter__, hook.__exit__
        self._saved = (enter, leave)

        def entered(h):
            if tracker._depth == 0:
                tracker._start = tracker.counter.get_total_flops()
            tracker._depth += 1
            return enter(h)

        def left(h, *exc):
            try:
                return leave(h, *exc)
            finally:
                tracker._depth -= 1
                if tracker._depth == 0:
                    tracker.flops += tracker.counter.get_total_flops() - tracker._start

        hook.__enter__, hook.__exit__ = entered, left
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            self._hook.__enter__, self._hook.__exit__ = self._saved
            self._saved = None


class _Counter(FlopCounterMode):
    """``FlopCounterMode`` with gpubench's formulas, noting the ops it has no formula for."""

    def __init__(self, custom_mapping: dict | None = None):
        super().__init__(display=False, custom_mapping=custom_mapping)
        self.no_formula: set[str] = set()

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet not in self.flop_registry:
            self.no_formula.add(str(func_packet))
        return super()._count_flops(func_packet, out, args, kwargs)


class counting_flops:
    """``with counting_flops() as counted: ...``: the FLOPs of what the block runs, in
    ``counted.result`` (a ``FlopCount``) once it ends. ``custom_mapping`` replaces gpubench's
    extra formulas (``{}``: torch's registry alone)."""

    def __init__(self, custom_mapping: dict | None = None):
        self._counter = _Counter(EXTRA_FLOP_FORMULAS if custom_mapping is None
                                 else custom_mapping)
        self.result: FlopCount | None = None

    def __enter__(self) -> counting_flops:
        self._counter.__enter__()
        self._recomputation = _Recomputation(self._counter).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        counter = self._counter
        self._recomputation.__exit__(*exc)
        counter.__exit__(*exc)
        by_op = {str(op): int(n)
                 for op, n in counter.get_flop_counts().get("Global", {}).items()}
        no_formula = sorted(counter.no_formula)
        recomputed = self._recomputation.flops + _attention_recompute(by_op)
        self.result = FlopCount(int(counter.get_total_flops()), by_op,
                                [op for op in no_formula if is_heavy_op(op)], no_formula,
                                int(recomputed))


def count_flops_detailed(fn: Callable[[], object],
                         custom_mapping: dict | None = None) -> FlopCount:
    """FLOPs of what ``fn`` runs (forward, backward and recompute), per op, and the heavy ops
    counted as zero (``counting_flops`` around a call of ``fn``)."""
    with counting_flops(custom_mapping) as counted:
        fn()
    return counted.result


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matmuls, convolutions and attention ``fn`` runs (forward, backward and
    recompute); ``count_flops_detailed`` says also which heavy ops went uncounted."""
    return count_flops_detailed(fn).total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_peak_flops(device_str: str, precision: str) -> float:
    """The ceiling MFU divides by: the matmul peak of the step's precision. Under autocast some
    ops stay in float32, so the ceiling is the faster of the autocast dtype's and fp32's peaks
    (on a CPU without fp16 units, fp32 is the faster path and autocast uses it for many ops)."""
    peak = matmul_peak_flops(device_str, precision)
    if precision in ("fp16", "bf16", *FP8_PRECISIONS):
        peak = max(peak, matmul_peak_flops(device_str, "fp32"))
    return peak


PEAKS_ENV = "GPUBENCH_MATMUL_PEAKS"
"""A JSON file of peaks measured earlier on this very device (``{"device": "cuda",
"device_name": ..., "peak_tflops": {precision: TFLOP/s}, "fp8_tflops": ...}``), used instead of
measuring them again: ``scripts/gpu_check.sh`` measures the peaks once and passes them on to
its later steps. A file for another device, or without the precision, is not used."""


def device_key(device_str: str, current: int | None = None) -> str:
    """One name per device: ``cuda`` is ``cuda:<current device>`` (``current``, default
    ``torch.cuda.current_device()``), so that a peak is measured and cached once whichever way
    the device is written."""
    device = torch.device(device_str)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if current is None
                              else current)
    return str(device)


def given_peak(device_str: str, precision: str, path: str | None = None) -> float | None:
    """The peak (FLOP/s) ``PEAKS_ENV``'s file (or ``path``) holds for ``device_str`` and
    ``precision`` ("fp8": the float8 matmul's), or None."""
    import json
    import os

    path = path or os.environ.get(PEAKS_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    device = torch.device(device_str)
    if not isinstance(data, dict) or data.get("device") != device.type:
        return None
    if device.type == "cuda" and data.get("device_name") != torch.cuda.get_device_name(device):
        return None
    value = (data.get("fp8_tflops") if precision == "fp8"
             else (data.get("peak_tflops") or {}).get(precision))
    return float(value) * 1e12 if isinstance(value, (int, float)) and value > 0 else None


def matmul_peak_flops(device_str: str, precision: str) -> float:
    """Best FLOP/s of a square matmul at ``precision`` on ``device``, measured once per process
    and device (``device_key``), or taken from ``PEAKS_ENV``'s file.

    The side grows until one matmul takes >= 20 ms (or a cap is hit), so slow paths (fp16 on a
    CPU without half-precision units) stay quick to measure and fast ones reach their plateau.
    The fp8 precisions compute their linears in float8 and the rest in bf16: their peak here is
    bf16's (``fp8_peak_flops`` is the float8 matmul's).
    """
    if precision in FP8_PRECISIONS:
        precision = "bf16"
    return _matmul_peak(device_key(device_str), precision)


@functools.cache
def _matmul_peak(device_str: str, precision: str) -> float:
    given = given_peak(device_str, precision)
    if given is not None:
        return given
    device = torch.device(device_str)
    policy = Precision(precision, device.type)
    dtype = policy.autocast_dtype or torch.float32

    def matmul(n: int) -> Callable[[], object]:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        return lambda: a @ b

    with policy.math_mode():
        return _best_flops(matmul, device, 8192 if device.type == "cuda" else 2048)


def fp8_peak_flops(device_str: str) -> float | None:
    """Best FLOP/s of a square float8 (e4m3) matmul with per-tensor scales and a bf16 output
    (``torch._scaled_mm``, what torchao's float8 linears run), measured once per process and
    device (or taken from ``PEAKS_ENV``'s file); None on a device without FP8 units
    (``gpubench.train.precision.fp8_units``), where FP8 is emulated and has no peak of its
    own."""
    return _fp8_peak(device_key(device_str))


@functools.cache
def _fp8_peak(device_str: str) -> float | None:
    device = torch.device(device_str)
    if not fp8_units(device.type):
        return None
    given = given_peak(device_str, "fp8")
    if given is not None:
        return given

    def matmul(n: int) -> Callable[[], object]:
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)

    return _best_flops(matmul, device, 16384)


def loop_seconds(run: Callable[[], object], device: torch.device, reps: int) -> float:
    """Seconds per call of ``reps`` back-to-back calls of ``run``: on CUDA between two CUDA
    events recorded around the loop (the device's own clock, no host synchronisation between
    the calls, so no launch gap is counted), elsewhere by the wall clock around the loop."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps  # elapsed_time is in milliseconds
    begin = time.perf_counter()
    for _ in range(reps):
        run()
    _sync(device)
    return (time.perf_counter() - begin) / reps


def _best_flops(matmul: Callable[[int], Callable[[], object]], device: torch.device,
                cap: int) -> float:
    """FLOP/s of the fastest of three loops of square matmuls ``matmul(n)()`` (``loop_seconds``,
    about 0.1 s each, at least one matmul), the side ``n`` doubled from 256 until one takes
    >= 20 ms or reaches ``cap``."""
    n = 256
    while True:
        run = matmul(n)
        run()  # warm-up: kernel selection, allocator
        _sync(device)
        elapsed = loop_seconds(run, device, 1)
        if elapsed >= 0.02 or n >= cap:
            break
        n *= 2
    # Loops of about 0.1 s, at least one matmul: a matmul that alone takes longer (the cap's
    # side on a CPU) is timed once per loop, not three times.
    reps = max(1, min(50, int(0.1 / max(elapsed, 1e-6))))
    best = min(loop_seconds(run, device, reps) for _ in range(3))
    return 2 * n**3 / best
