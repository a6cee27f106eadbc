"""OOM frontier search, the leak detector on the shipped loops, memory sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gpubench.diagnostics import frontier
from gpubench.diagnostics.frontier import find_frontier, search_max_batch
from gpubench.diagnostics.leaks import LOOPS, MIB
from gpubench.measure.memory import (
    cpu_peak_supported,
)
from gpubench.measure.protocol import CaseProgram
from gpubench.train.build import build
from gpubench.train.config import RunConfig
from gpubench.util.argtypes import parse_bytes


def test_search_finds_the_largest_fitting_batch_in_few_tries():
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= 37  # a fake budget

    assert search_max_batch(fits, limit=4096) == (37, False)
    assert len(tried) <= 2 * 12
    assert search_max_batch(lambda b: True, limit=100) == (100, True)
    assert search_max_batch(lambda b: False) == (0, False)
    assert search_max_batch(lambda b: b <= 5, start=2) == (5, False)


@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux /proc/self/status")
@pytest.mark.slow
def test_frontier_against_a_cpu_budget_grows_with_the_budget():
    cfg = RunConfig(model="bert", profile="smoke")
    small = find_frontier(cfg, budget_bytes=1, limit=64)
    assert small.max_batch == 0 and not small.tries[0].fits
    large = find_frontier(cfg, budget_bytes=parse_bytes("64GiB"), limit=64)
    assert large.max_batch == 64 and large.capped
    with pytest.raises(ValueError, match="needs a memory budget"):
        find_frontier(cfg)


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("1.5 MB") == 1_500_000
    with pytest.raises(ValueError, match="'lots'"):
        parse_bytes("lots")


LEAK_PROGRAM = """
import json
from gpubench.train.build import build
from gpubench.train.config import RunConfig
from gpubench.diagnostics.leaks import check_loops
results = check_loops(lambda: build(RunConfig(model="resnet18", profile="smoke")))
print(json.dumps({r.name: [r.leaks, r.growth_bytes_per_step] for r in results}))
"""


@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux /proc/self/status")
@pytest.mark.slow
def test_leak_detector_flags_the_leaky_loops_and_passes_the_fixed_ones():
    # In a fresh process: the detector reads the resident size, and a long test process holds
    # freed heap that a leak can fill without raising it.
    proc = subprocess.run([sys.executable, "-c", LEAK_PROGRAM], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * len(LOOPS)
    for name in LOOPS:
        (leaky, leaky_growth), (fixed, fixed_growth) = (results[f"{name} (leaky)"],
                                                        results[f"{name} (fixed)"])
        print(f"{name}: leaky {leaky_growth / 2**20:.2f} MiB/step, "
              f"fixed {fixed_growth / 2**20:.2f} MiB/step")
        assert leaky, name
        assert not fixed, name


_PAGES_AND_TENSOR = """
import mmap, sys
from pathlib import Path
import torch
from gpubench.diagnostics.leaks import MIB, memory_in_use
from gpubench.measure.memory import status_bytes, track_large_allocations

cpu = torch.device("cpu")
path = Path(sys.argv[1])
path.write_bytes(b"x" * (64 * MIB))
with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
    rss, before = status_bytes("VmRSS"), memory_in_use(cpu)
    assert sum(pages[i] for i in range(0, len(pages), 4096)) == 120 * (64 * MIB // 4096)
    print(status_bytes("VmRSS") - rss, memory_in_use(cpu) - before)
track_large_allocations()
before = memory_in_use(cpu)
held = torch.ones(16 * MIB)  # 64 MiB, written
print(memory_in_use(cpu) - before)
"""


@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux /proc/self/status")
def test_cpu_memory_in_use_counts_allocations_not_file_pages(tmp_path):
    """A file read through a mapping raises the resident size but is no allocation of the loop
    (the kernel drops and re-reads such pages as the machine needs memory): the leak
    detector's CPU figure leaves it out, and counts a tensor's 64 MiB. In a fresh process: a
    long test session's heap may hand the tensor pages it already holds."""
    done = subprocess.run([sys.executable, "-c", _PAGES_AND_TENSOR, str(tmp_path / "pages")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    (resident, in_use), (tensor,) = (map(int, line.split()) for line in
                                     done.stdout.split("\n")[:2])
    assert resident > 48 * MIB  # the file's pages are resident now
    assert abs(in_use) < 8 * MIB
    assert tensor > 56 * MIB


def test_allocation_failures_of_libraries_count_as_out_of_memory():
    from gpubench.diagnostics.frontier import is_out_of_memory

    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_out_of_memory(RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert is_out_of_memory(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not a runtime failure


class _CublasFailsAbove(CaseProgram):
    """A case program whose step fails as cuBLAS does when it cannot allocate its workspace,
    above a batch size (a simulated device limit: the frontier's error handling on the CPU)."""

    LIMIT = 12

    def step(self):
        if self.case.micro_batch > self.LIMIT:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                               "`cublasCreate(handle)`")
        return super().step()


@pytest.mark.slow
def test_frontier_treats_a_cublas_allocation_failure_as_does_not_fit(monkeypatch):
    monkeypatch.setattr(frontier, "CaseProgram", _CublasFailsAbove)
    cfg = RunConfig(model="bert", profile="smoke")
    found = find_frontier(cfg, budget_bytes=parse_bytes("64GiB"), limit=64)
    assert found.max_batch == _CublasFailsAbove.LIMIT and not found.capped
    failed = [t for t in found.tries if not t.fits]
    assert failed and all("CUBLAS_STATUS_ALLOC_FAILED" in t.error for t in failed)

    class Broken(CaseProgram):
        def step(self):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(frontier, "CaseProgram", Broken)  # a real bug still surfaces
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        find_frontier(cfg, budget_bytes=parse_bytes("64GiB"), limit=64)


def test_memory_report_searches_up_to_an_h200_on_cuda():
    from gpubench.cli.memory import MAX_BATCH

    assert MAX_BATCH["cuda"] >= 65536 and MAX_BATCH["cpu"] == 1024


OUT_OF_MEMORY_PROGRAM = """
import gc
import torch
from gpubench.diagnostics.leaks import LOOPS, MIB, check_loops, detect_leak, reference_cycle
from gpubench.measure.memory import release_free_memory, track_large_allocations
from gpubench.train.build import build
from gpubench.train.config import RunConfig

cfg = RunConfig(model="resnet18", profile="smoke")
device = torch.device("cpu")
track_large_allocations()

def run(loop, fixed, budget=None, steps=8):
    case = build(cfg)
    release_free_memory()
    gc.disable()  # as check_loops runs them
    try:
        return detect_leak("loop", loop(case, fixed), device, steps=steps, warmup=2,
                           budget_bytes=budget)
    finally:
        case.close()
        gc.enable()
        gc.collect()

steady = run(reference_cycle, fixed=True)
assert not steady.out_of_memory and not steady.leaks
# The budget: what the fixed loop held, with room for the movement measured in it (the
# allocator's noise here) and 32 MiB (8 steps of the leaky loop) above that.
noise = max(steady.memory_bytes) - min(steady.memory_bytes)
budget = max(steady.memory_bytes) + noise + 32 * MIB
leaky = run(reference_cycle, fixed=False, budget=budget, steps=60)  # 4 MiB a step
assert leaky.out_of_memory and leaky.leaks and leaky.out_of_memory_after > 0
# It grew by 2 MiB a step at least until it passed the budget.
assert leaky.out_of_memory_after <= (budget - leaky.memory_bytes[0]) // (2 * MIB) + 1
assert "over the budget" in leaky.error and leaky.verdict.startswith("LEAKS")
assert leaky.growth_bytes_per_step > 2 * MIB
fixed = run(reference_cycle, fixed=True, budget=budget)
assert not fixed.out_of_memory and not fixed.leaks
too_small = run(reference_cycle, fixed=True, budget=1)  # the first step cannot fit
assert too_small.out_of_memory_after == 0 and not too_small.leaks
assert too_small.verdict.startswith("does not fit")
# check_loops passes the budget to every loop and carries on after one ran out.
results = {r.name: r for r in check_loops(lambda: build(cfg), steps=3, budget_bytes=1)}
assert len(results) == 2 * len(LOOPS)
assert all(r.out_of_memory_after == 0 for r in results.values())
"""


@pytest.mark.slow
@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux /proc/self/status")
def test_leaky_loop_that_runs_out_of_memory_is_reported_as_leaking():
    """A CPU budget stands in for the device: memory in use above it is running out of memory.
    In a fresh process: a long test process's other threads and freed heap move the memory in
    use that the budget is set from."""
    proc = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY_PROGRAM], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_one_off_allocation_is_not_a_leak_but_steady_growth_is():
    from gpubench.diagnostics.leaks import LeakResult

    mib = 2**20
    # One 8 MiB jump in 4 measured steps (a lazily created buffer): the fit over all steps reads
    # 3.4 MiB per step, but the two halves grow by 0.12 and 0.5 MiB.
    one_off = LeakResult("loop", 3.4 * mib, mib, [0, int(0.12 * mib), int(8.2 * mib),
                                                     int(8.7 * mib)])
    assert one_off.sustained_growth_bytes_per_step < mib and not one_off.leaks
    steady = LeakResult("loop", 4 * mib, mib, [i * 4 * mib for i in range(6)])
    assert steady.sustained_growth_bytes_per_step == pytest.approx(4 * mib) and steady.leaks
    # CUDA-like staircase: a 2 MiB segment every 4 steps is 0.5 MiB per step, in both halves
    stairs = LeakResult("loop", 0.5 * mib, 256 * 2**10, [(i // 4) * 2 * mib for i in range(16)])
    assert stairs.leaks


def test_a_frontier_try_makes_its_batch_on_the_device_a_chunk_at_a_time(monkeypatch):
    from gpubench.train import data
    from gpubench.workloads.api import Workload

    made = []
    sample_batch = Workload.sample_batch

    def recorded(self, batch_size, seed=0):
        made.append(batch_size)
        return sample_batch(self, batch_size, seed)

    monkeypatch.setattr(Workload, "sample_batch", recorded)
    monkeypatch.setattr(data, "RESIDENT_CHUNK_SAMPLES", 16)
    cfg = RunConfig(model="resnet18", profile="smoke", channels_last=True)
    result = frontier.try_batch(cfg, 40, None, steps=1)
    assert result.fits
    # 40 samples from the host in chunks of at most 16: the host never held the whole batch
    assert max(made) <= 16 and made.count(16) >= 2 and 8 in made
    case = build(cfg.with_(micro_batch=40))
    inputs, targets = case.fixed_batches()[0]
    assert inputs.shape[0] == 40 and targets.shape == (40,)
    assert inputs.is_contiguous(memory_format=torch.channels_last)
    assert case.loader is None  # device-resident data has no loader


def test_each_replica_gets_its_own_resident_samples():
    from gpubench.train.data import Placement, resident_batches
    from gpubench.workloads.registry import resolve

    workload = resolve("bert", "smoke")
    place = Placement(torch.device("cpu"), non_blocking=False, channels_last=False)
    one = resident_batches(workload, 10, 2, 0, place, replica=0, chunk=4)
    again = resident_batches(workload, 10, 2, 0, place, replica=0, chunk=4)
    other = resident_batches(workload, 10, 2, 0, place, replica=1, chunk=4)
    assert len(one) == 2 and one[0][0].shape[0] == 10
    assert torch.equal(one[0][0], again[0][0])  # seeded
    assert not torch.equal(one[0][0], other[0][0]) and not torch.equal(one[0][0], one[1][0])
