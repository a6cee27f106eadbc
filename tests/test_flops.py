import torch

from gpubench.flops import count_flops, matmul_peak_flops


def test_count_flops_of_linear_forward_and_backward():
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64, requires_grad=True)

    def step():
        layer(x).sum().backward()

    # forward 2*16*64*32; backward: grad wrt input and wrt weight, each as large.
    assert count_flops(step) == 3 * 2 * 16 * 64 * 32


def test_measured_matmul_peak_is_positive_and_cached():
    first = matmul_peak_flops("cpu", "fp32")
    assert first > 1e8
    assert matmul_peak_flops("cpu", "fp32") == first
