"""Global CUDA modes a case sets while it runs: cuDNN benchmark mode (on for CUDA cases, as
real training scripts set it) next to the TF32 switches, restored afterwards."""

from __future__ import annotations

import pytest
import torch

from gpubench.train.precision import Precision, cudnn_benchmark


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_math_mode_sets_cudnn_benchmark_for_cuda_cases_and_restores_it(device_type):
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        with Precision("fp32", device_type).math_mode():
            assert torch.backends.cudnn.benchmark is (device_type == "cuda")
            assert torch.backends.cudnn.benchmark is cudnn_benchmark(device_type)
        assert torch.backends.cudnn.benchmark is False
        torch.backends.cudnn.benchmark = True  # a user's own setting survives a cpu case too
        with Precision("bf16", device_type).math_mode():
            assert torch.backends.cudnn.benchmark is (device_type == "cuda")
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = saved
