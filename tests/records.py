"""Small purpose-built results for the tests: a gpubench step record as pytest-benchmark stores
it, made for the question a test asks, and a results file of a few of them. Tests that need
what a whole real run holds read the frozen run ``tests/data/cpu-run.json`` instead."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

BASELINE = {
    "kind": "step", "case_id": "bert-fp32", "model": "bert", "profile": "smoke",
    "device": "cpu", "precision": "fp32", "accum_steps": 1, "micro_batch": 8,
    "global_batch": 8, "optimizer": "sgd", "parallel": "single", "world_size": 1,
    "input_shape": [8, 16], "is_baseline": True, "peak_memory_bytes": 1000,
    "flops_per_step": 10**9, "tflops": 0.01, "mfu": 0.01, "prefetch_factor": None,
}
"""The fields of every record the results reader requires, as a bert FP32 baseline of the
smoke profile has them (``step_time_s`` and ``samples_per_s`` come from the rounds)."""

MACHINE = {
    "node": "host", "machine": "x86_64", "python_version": "3.11.7",
    "cpu": {"brand_raw": "AMD EPYC", "flags": ["avx2", "fma", "avx512f", "avx512bw"]},
    "gpubench": {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_capability": "AVX512",
                 "device_name": "AMD EPYC", "transformers": "5.24.0"},
}
"""A machine_info block of a CPU machine."""


def stats(rounds) -> dict:
    """pytest-benchmark's ``stats`` of ``rounds`` (seconds), raw rounds kept."""
    data = [float(r) for r in rounds]
    q1, _, q3 = statistics.quantiles(data, n=4) if len(data) > 1 else (data[0],) * 3
    return {"min": min(data), "max": max(data), "mean": statistics.fmean(data),
            "stddev": statistics.stdev(data) if len(data) > 1 else 0.0,
            "median": statistics.median(data), "iqr": q3 - q1, "q1": q1, "q3": q3,
            "rounds": len(data), "data": data}


def step_record(case_id: str = "bert-fp32", rounds=(0.09, 0.1, 0.12), *,
                name: str | None = None, group: str | None = None, **fields) -> dict:
    """One step record: ``BASELINE``'s fields, the median of ``rounds`` as its step time and
    the global batch over it as its throughput, then ``fields`` over them."""
    info = {**BASELINE, "case_id": case_id}
    median = statistics.median(float(r) for r in rounds)
    info.update(step_time_s=median, samples_per_s=info["global_batch"] / median)
    info.update(fields)
    return {"name": name or f"test_step[{case_id}]", "group": group or info["model"],
            "stats": stats(rounds), "extra_info": info}


def results_file(path: Path, *records: dict, machine: dict | None = None) -> Path:
    """A pytest-benchmark JSON file of ``records`` at ``path``."""
    path.write_text(json.dumps({"benchmarks": list(records), "machine_info": machine or MACHINE,
                                "version": "5.1.0", "datetime": "2026-01-01T00:00:00"}))
    return path
