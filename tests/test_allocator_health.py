"""The CUDA allocator's health per case, from a ``torch.cuda.memory_stats()``-shaped dict (no GPU
needed): retries and out-of-memory errors of the window, the active peak and fragmentation, null
on the CPU, and carried into the record."""

from __future__ import annotations

import pytest
import torch

from gpubench.analysis.results import EXTRA_SCHEMA
from gpubench.measure.memory import ALLOCATOR_FIELDS, allocator_health, read_peak, reset_peak
from gpubench.measure.protocol import combine

MIB = 2**20

# What torch.cuda.memory_stats(device) returns after a window's steps (a subset of its keys,
# spelled as torch 2.14 spells them; every value a non-negative integer).
STATS = {
    "num_alloc_retries": 7,
    "num_ooms": 1,
    "num_sync_all_streams": 0,
    "allocated_bytes.all.current": 300 * MIB,
    "allocated_bytes.all.peak": 768 * MIB,
    "active_bytes.all.current": 310 * MIB,
    "active_bytes.all.peak": 800 * MIB,
    "reserved_bytes.all.current": 1024 * MIB,
    "reserved_bytes.all.peak": 1024 * MIB,
    "inactive_split_bytes.all.peak": 96 * MIB,
    "allocated_bytes.large_pool.peak": 760 * MIB,
    "reserved_bytes.large_pool.peak": 1000 * MIB,
}


def test_memory_stats_keys_are_torch_s():
    doc = torch.cuda.memory_stats.__doc__
    for key in ("num_alloc_retries", "num_ooms"):
        assert f'"{key}"' in doc
    for stat in ("allocated_bytes", "active_bytes", "reserved_bytes"):
        assert f'"{stat}.{{all,large_pool,small_pool}}.{{current,peak,allocated,freed}}"' in doc


def test_health_of_a_window():
    start = {"num_alloc_retries": 4, "num_ooms": 1}  # allocator_counters at the window's start
    assert allocator_health(STATS, start) == {
        "alloc_retries": 3,  # 7 since the process started, 4 before the window
        "alloc_ooms": 0,
        "peak_active_bytes": 800 * MIB,
        "fragmentation": pytest.approx(0.25),  # 1 - 768 / 1024 MiB at the peaks
    }
    # Without the start: counted from the process's start.
    assert allocator_health(STATS)["alloc_retries"] == 7
    assert allocator_health(STATS)["alloc_ooms"] == 1


def test_health_without_statistics_is_null():
    # The CPU, and CUDA before it starts (torch.cuda.memory_stats returns {}).
    assert allocator_health(None) == dict.fromkeys(ALLOCATOR_FIELDS)
    assert allocator_health({}) == dict.fromkeys(ALLOCATOR_FIELDS)
    nothing_reserved = {**STATS, "reserved_bytes.all.peak": 0}
    assert allocator_health(nothing_reserved)["fragmentation"] is None


def test_cpu_peak_carries_the_fields_as_null():
    device = torch.device("cpu")
    figures = read_peak(device, reset_peak(device))
    assert {k: figures[k] for k in ALLOCATOR_FIELDS} == dict.fromkeys(ALLOCATOR_FIELDS)
    assert "peak_reserved_bytes" in figures  # the reserved peak keeps its existing name


def test_fields_reach_the_record_with_a_known_type():
    device = {"peak_memory_bytes": 768 * MIB, "step_memory_bytes": 500 * MIB,
              "peak_reserved_bytes": 1024 * MIB,
              "peak_memory_method": "torch.cuda.max_memory_allocated",
              **allocator_health(STATS, {"num_alloc_retries": 4, "num_ooms": 1})}
    memory = {"devices": [device], "param_bytes": 1, "grad_bytes": 1,
              "optimizer_state_bytes": 1, "rank_step_time_s": 0.1, "loader_wait_s": 0.0,
              "loader_stall_fraction": 0.0, "last_loss": 1.0}
    check = {"first_loss": 1.0, "reference_loss": 1.0, "rtol": 1e-4, "losses": [1.0],
             "skipped_steps": 0}
    count = {"flops": 10, "uncounted_ops": [], "activation_bytes": 0}
    info = combine([{}], [check], [count], [memory])
    assert info["alloc_retries"] == 3 and info["alloc_ooms"] == 0
    assert info["peak_active_bytes"] == 800 * MIB
    assert info["peak_reserved_bytes"] == 1024 * MIB
    assert info["fragmentation"] == pytest.approx(0.25)
    assert EXTRA_SCHEMA["alloc_retries"] == EXTRA_SCHEMA["alloc_ooms"] == ("int", ">=0")
    assert EXTRA_SCHEMA["peak_active_bytes"] == ("int", ">=0")
    assert EXTRA_SCHEMA["fragmentation"] == ("float", ">=0")
    assert EXTRA_SCHEMA["expandable_segments"] == ("bool", "any")
