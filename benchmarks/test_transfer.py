"""Host-to-device copy bandwidth of one batch: pageable vs pinned memory, blocking vs
``non_blocking``. CUDA only: on the CPU there is no copy to measure."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten

from gpubench.cases import baseline


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["sync", "nonblocking"])
def test_host_to_device_copy(benchmark, options, pinned, non_blocking):
    if options.device != "cuda" or not torch.cuda.is_available():
        pytest.skip("host-to-device copies need a CUDA device")
    cfg = baseline(options.models[0], options.profile, "cuda")
    # One micro-batch of the first workload's inputs (its first tensor, with its dtype).
    inputs, _ = cfg.workload.sample_batch(cfg.resolved_micro_batch)
    host = tree_flatten(inputs)[0][0].contiguous()
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
