import pytest
import torch

from gpubench.build import build
from gpubench.config import RunConfig
from gpubench.memory import cpu_peak_supported, read_peak, reset_peak, state_breakdown


def _step_memory(micro_batch: int) -> dict:
    case = build(RunConfig(model="resnet18", profile="smoke", micro_batch=micro_batch))
    case.step()  # optimizer state exists before the window opens
    start = reset_peak(case.device)
    for _ in range(2):
        case.step()
    return read_peak(case.device, start)


@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux /proc/self/clear_refs")
def test_peak_memory_grows_with_batch_size():
    small = _step_memory(2)
    large = _step_memory(128)
    assert small["peak_memory_method"].startswith("process VmHWM")
    # 128 images of 3x16x16 through ResNet-18 keep tens of MiB of activations; 2 keep little.
    assert large["step_memory_bytes"] > small["step_memory_bytes"] + 8 * 2**20
    assert large["peak_memory_bytes"] > small["peak_memory_bytes"]


def test_state_breakdown_is_exact():
    model = torch.nn.Linear(10, 4)  # 44 float32 parameters
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 10)).sum().backward()
    opt.step()
    sizes = state_breakdown(model, opt)
    assert sizes["param_bytes"] == 44 * 4
    assert sizes["grad_bytes"] == 44 * 4
    # exp_avg and exp_avg_sq per parameter, plus one scalar step counter per parameter tensor.
    assert sizes["optimizer_state_bytes"] == 2 * 44 * 4 + 2 * 4
