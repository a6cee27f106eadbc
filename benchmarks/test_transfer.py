"""Host-to-device copy bandwidth of one batch: pageable vs pinned memory, blocking vs
``non_blocking``. CUDA only: on the CPU there is no copy to measure."""

from __future__ import annotations

import pytest
import torch

from gpubench.build import resolve_micro_batch
from gpubench.cases import baseline
from gpubench.models import input_shape


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["sync", "nonblocking"])
def test_host_to_device_copy(benchmark, options, pinned, non_blocking):
    if options.device != "cuda" or not torch.cuda.is_available():
        pytest.skip("host-to-device copies need a CUDA device")
    model = "resnet50" if "resnet50" in options.models else options.models[0]
    cfg = baseline(model, options.profile, "cuda")
    shape = input_shape(model, options.profile, resolve_micro_batch(cfg))
    # Images are float pixels; token batches are int64 ids.
    host = torch.randn(shape) if len(shape) == 4 else torch.randint(0, 1000, shape)
    if pinned:
        host = host.pin_memory()
    device = torch.device("cuda")

    def copy():
        out = host.to(device, non_blocking=non_blocking)
        torch.cuda.synchronize()  # the copy must have landed before the round ends
        return out

    benchmark.group = "h2d-copy"
    benchmark.pedantic(copy, rounds=50, warmup_rounds=5)
    median = benchmark.stats.stats.median
    nbytes = host.numel() * host.element_size()
    benchmark.extra_info.update(
        kind="transfer", case_id=f"h2d-{'pinned' if pinned else 'pageable'}-"
        f"{'nonblocking' if non_blocking else 'sync'}", bytes=nbytes,
        pin_memory=pinned, non_blocking=non_blocking, bandwidth_gb_s=nbytes / median / 1e9,
    )
