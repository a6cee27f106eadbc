"""Host-to-device copies of 64 and 256 MB: pageable vs pinned memory, blocking vs
``non_blocking``, timed with CUDA events over a loop of copies. CUDA only: on the CPU there is
no copy to measure.

Each round copies ``COPY_BYTES_PER_ROUND`` (a loop of copies into one preallocated device
buffer) while a burst of matmuls, sized to last about as long as the copies, runs on the
default stream: what a training step's compute does while the next batch is copied.

- blocking (``sync``): ``copy_(host)`` on the default stream, as a plain ``x.to("cuda")`` in a
  training loop: the copies queue behind the matmuls (and the host waits for them);
- ``nonblocking``: ``copy_(host, non_blocking=True)`` on a side stream, as a prefetcher does:
  the copies can overlap the matmuls, which only pinned memory allows the DMA engine to do
  without the host staging the data.

The record holds the copy bandwidth measured alone (``bandwidth_gb_s``, CUDA events), the
matmul burst alone and the round with both (``copy_time_s``, ``matmul_time_s``,
``overlapped_time_s``) and the share of the shorter of the two hidden by overlap
(``overlap_fraction``: 0 = serialized, 1 = fully hidden).
"""

from __future__ import annotations

import statistics

import pytest
import torch

MB = 2**20
SIZES_MB = (64, 256)
COPY_BYTES_PER_ROUND = 1024 * MB
"""Bytes copied per round: 16 copies of 64 MB, 4 of 256 MB."""
ROUNDS, WARMUP_ROUNDS = 10, 2
MATMUL_SIDE = 4096


def _event_seconds(fn, repeats: int = 5) -> float:
    """Median seconds of ``fn``'s device work on the current stream, by CUDA events (``fn``
    may use other streams, joined back before it returns)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


@pytest.fixture
def transfer_device(request) -> str:
    """The suite's ``--gpubench-device``; run on its own (``pytest --noconftest
    benchmarks/test_transfer.py``, as ``scripts/gpu_check.sh`` does, so that no workload is
    built and validated first), CUDA where there is one."""
    opts = getattr(request.config, "gpubench", None)
    if opts is not None:
        return opts.device
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("size_mb", SIZES_MB, ids=[f"{s}MB" for s in SIZES_MB])
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["sync", "nonblocking"])
def test_host_to_device_copy(benchmark, transfer_device, pinned, non_blocking, size_mb):
    if transfer_device != "cuda" or not torch.cuda.is_available():
        pytest.skip("host-to-device copies need a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    nbytes = size_mb * MB
    copies = max(1, COPY_BYTES_PER_ROUND // nbytes)
    host = torch.ones(nbytes, dtype=torch.uint8)  # touched: no first-use page faults timed
    if pinned:
        host = host.pin_memory()
    dest = torch.empty(nbytes, dtype=torch.uint8, device=device)
    side = torch.cuda.Stream(device)
    a = torch.randn(MATMUL_SIDE, MATMUL_SIDE, device=device)
    b = torch.randn(MATMUL_SIDE, MATMUL_SIDE, device=device)
    main = torch.cuda.current_stream(device)

    def copies_after(ready: torch.cuda.Event):
        if non_blocking:
            # On the side stream, from ``ready`` on: not behind the matmuls queued on main.
            side.wait_event(ready)
            with torch.cuda.stream(side):
                for _ in range(copies):
                    dest.copy_(host, non_blocking=True)
            main.wait_stream(side)  # the round ends when the copies have landed
        else:
            for _ in range(copies):
                dest.copy_(host)

    def now() -> torch.cuda.Event:
        ready = torch.cuda.Event()
        ready.record(main)
        return ready

    def copy_loop():
        copies_after(now())

    matmuls = [1]

    def matmul_burst():
        for _ in range(matmuls[0]):
            torch.mm(a, b)

    copy_loop()  # warm-up: pinned staging buffers, cuBLAS handle, kernels
    matmul_burst()
    torch.cuda.synchronize(device)
    copy_s = _event_seconds(copy_loop)
    one_matmul_s = _event_seconds(matmul_burst)
    matmuls[0] = max(1, round(copy_s / one_matmul_s))  # a burst about as long as the copies
    matmul_s = _event_seconds(matmul_burst)

    def both():
        start = now()
        matmul_burst()  # queued on the default stream; the host goes on at once
        copies_after(start)

    overlapped_s = _event_seconds(both)

    def round_():
        both()
        torch.cuda.synchronize(device)  # the copies and the matmuls have finished

    benchmark.group = "h2d-copy"
    benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    hidden = copy_s + matmul_s - overlapped_s
    benchmark.extra_info.update(
        kind="transfer",
        case_id=f"h2d-{size_mb}MB-{'pinned' if pinned else 'pageable'}-"
        f"{'nonblocking' if non_blocking else 'sync'}",
        device=transfer_device,
        bytes=nbytes,
        copies_per_round=copies,
        pin_memory=pinned,
        non_blocking=non_blocking,
        bandwidth_gb_s=copies * nbytes / copy_s / 1e9,
        copy_time_s=copy_s,
        matmul_time_s=matmul_s,
        matmuls_per_round=matmuls[0],
        overlapped_time_s=overlapped_s,
        overlap_fraction=min(1.0, max(0.0, hidden / min(copy_s, matmul_s))),
        note="copy bandwidth by CUDA events over the loop of copies alone; benchmark time is "
        "a round of the copies with a matmul burst of similar length on the default stream",
    )
