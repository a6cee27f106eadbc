"""Precision policies: FP32, TF32, AMP fp16 with gradient scaling, AMP bf16, and FP8 (bf16
autocast around linears trained in float8: ``gpubench.train.implementations.Float8`` converts
them).

A policy is used the same way whatever the precision; its "off" parts are no-ops
(autocast disabled, ``GradScaler(enabled=False)``), so the training step has no branches on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16,
                    "fp8": torch.bfloat16, "fp8-rowwise": torch.bfloat16}
"""The autocast dtype of each reduced precision; FP8 training runs the rest of the model in bf16
(torchao's float8 recipes are made for bf16 autocast or bf16 weights)."""


class Precision:
    def __init__(self, name: str, device_type: str, sharded: bool = False):
        self.name = name
        self.device_type = device_type
        self.autocast_dtype = _AUTOCAST_DTYPES.get(name)
        # Only fp16 needs loss scaling: its narrow exponent underflows small gradients.
        if sharded and name == "fp16":
            # Gradients sharded over ranks (FSDP): each rank sees only its shard, so the
            # overflow check must be agreed on by all ranks, or some would skip a step the
            # others take.
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device_type)
        else:
            self.scaler = torch.amp.GradScaler(device_type, enabled=name == "fp16")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            # Entering a disabled torch.autocast still toggles global state; skip it entirely.
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()

    def math_settings(self) -> dict:
        """The global math settings ``math_mode`` applies (one home: the tuner's snippet prints
        the same): float32 matmuls in TF32 ("high") only for tf32, IEEE ("highest") otherwise;
        cuDNN's TF32 likewise (PyTorch's default is on, which would make "fp32" convolutions
        TF32); cuDNN benchmark mode for CUDA cases."""
        tf32 = self.name == "tf32"
        return {"float32_matmul_precision": "high" if tf32 else "highest",
                "cudnn_allow_tf32": tf32, "cudnn_benchmark": cudnn_benchmark(self.device_type)}

    @contextlib.contextmanager
    def math_mode(self) -> Iterator[None]:
        """Set the float32 matmul/convolution mode for this policy, restoring it afterwards.

        fp32 means IEEE float32 everywhere: PyTorch enables TF32 for cuDNN convolutions by
        default, so it is switched off here, or "fp32" ResNet timings on Ampere+ would be TF32.

        cuDNN benchmark mode is on for CUDA cases (``cudnn_benchmark``), as real training
        scripts set it: each new convolution shape is autotuned once (in the check and warm-up
        steps, before the timed rounds) and the fastest algorithm is kept.
        """
        settings = self.math_settings()
        saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
                 torch.backends.cudnn.benchmark)
        torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
        torch.backends.cudnn.allow_tf32 = settings["cudnn_allow_tf32"]
        torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(saved[0])
            torch.backends.cudnn.allow_tf32 = saved[1]
            torch.backends.cudnn.benchmark = saved[2]


@contextlib.contextmanager
def ieee_fp32() -> Iterator[None]:
    """IEEE float32 matmuls and convolutions (TF32 off for cuBLAS and cuDNN) inside, whatever
    the case around it set: the training check's FP32 reference runs in it, so that a tf32
    case is compared with FP32, not with itself."""
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]


def import_float8():
    """torchao's ``float8`` module (an optional dependency: ``gpubench[fp8]``)."""
    import torchao.float8

    return torchao.float8


def fp8_reason() -> str | None:
    """Why FP8 training cannot be set up here (torchao missing or too old), or None."""
    try:
        float8 = import_float8()
        float8.Float8LinearConfig, float8.convert_to_float8_training  # noqa: B018
    except (ImportError, AttributeError) as err:
        return (f"fp8 trains with torchao's float8 ({err}): pip install 'gpubench[fp8]' "
                "(torchao)")
    return None


def fp8_units(device_type: str) -> bool:
    """Whether the device multiplies FP8 matrices in hardware (CUDA compute capability 8.9+:
    Ada, Hopper, Blackwell); elsewhere FP8 training is emulated in higher precision."""
    return device_type == "cuda" and torch.cuda.get_device_capability() >= (8, 9)


def cudnn_benchmark(device_type: str) -> bool:
    """Whether ``Precision.math_mode`` turns cuDNN benchmark mode on: for CUDA cases."""
    return device_type == "cuda"


def unsupported_reason(name: str, device_type: str) -> str | None:
    """Why ``name`` cannot run on this device, or None when it can."""
    if name == "tf32" and device_type == "cuda":
        if torch.cuda.get_device_capability()[0] < 8:
            return "tf32 needs an Ampere or newer GPU (compute capability >= 8.0)"
    if name in ("bf16", "fp8", "fp8-rowwise") and device_type == "cuda" \
            and not torch.cuda.is_bf16_supported():
        return f"{name} needs bf16, which this GPU does not support"
    if name.startswith("fp8"):
        reason = fp8_reason()
        if reason:
            return reason
    dtype = _AUTOCAST_DTYPES.get(name)
    if dtype is not None and not torch.amp.is_autocast_available(device_type):
        return f"autocast is not available on {device_type}"
    if dtype is not None:
        try:
            with torch.autocast(device_type, dtype=dtype):
                torch.ones(2, 2, device=device_type) @ torch.ones(2, 2, device=device_type)
        except (RuntimeError, AssertionError) as err:
            return f"{name} autocast does not run on {device_type} with this torch: {err}"
    return None
