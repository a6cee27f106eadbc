"""OOM frontier search, the leak detector on the shipped loops, memory sizes."""

from __future__ import annotations

import pytest

from gpubench.build import build
from gpubench.config import RunConfig
from gpubench.frontier import find_frontier, parse_bytes, search_max_batch
from gpubench.leaks import LOOPS, check_loops
from gpubench.memory import cpu_peak_supported


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


@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux /proc/self/status")
def test_leak_detector_flags_the_leaky_loops_and_passes_the_fixed_ones():
    results = {r.name: r for r in check_loops(
        lambda: build(RunConfig(model="resnet18", profile="smoke")))}
    assert len(results) == 2 * len(LOOPS)
    for name in LOOPS:
        leaky, fixed = results[f"{name} (leaky)"], results[f"{name} (fixed)"]
        print(f"{name}: leaky {leaky.growth_bytes_per_step / 2**20:.2f} MiB/step, "
              f"fixed {fixed.growth_bytes_per_step / 2**20:.2f} MiB/step")
        assert leaky.leaks, name
        assert not fixed.leaks, name
