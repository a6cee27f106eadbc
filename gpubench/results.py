"""Load pytest-benchmark JSON files into one tidy DataFrame: one row per case and run."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

REQUIRED_FIELDS = (
    "model", "profile", "device", "precision", "accum_steps", "micro_batch", "global_batch",
    "optimizer", "parallel", "world_size", "input_shape", "case_id", "is_baseline",
    "step_time_s", "samples_per_s", "peak_memory_bytes", "flops_per_step", "tflops", "mfu",
)
"""Fields every gpubench record carries in ``extra_info``; older or foreign files may lack some."""

STAT_FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "rounds")


class ResultsError(ValueError):
    """A file that is not pytest-benchmark JSON."""


def read_benchmark_json(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ResultsError(
            f"{path}: not pytest-benchmark JSON (expected an object with a 'benchmarks' list)"
        )
    return data


def _row(bench: dict, run: str, path: Path, data: dict) -> dict:
    stats = bench.get("stats") or {}
    extra = bench.get("extra_info") or {}
    machine = data.get("machine_info") or {}
    gpubench_machine = machine.get("gpubench") or {}
    row = {
        "run": run,
        "file": str(path),
        "datetime": data.get("datetime"),
        "name": bench.get("name"),
        "bench_group": bench.get("group"),
        **{f"time_{k}": stats.get(k) for k in STAT_FIELDS},
        "rounds_s": stats.get("data"),
        "machine_node": machine.get("node"),
        "machine_cpu": gpubench_machine.get("cpu") or (machine.get("cpu") or {}).get("brand_raw"),
        "torch_version": gpubench_machine.get("torch"),
        "matmul_peak_tflops": gpubench_machine.get("matmul_peak_tflops"),
        "pytest_benchmark_version": data.get("version"),
    }
    row.update(extra)
    row.setdefault("case_id", bench.get("name"))
    return row


def load_results(paths: Iterable[str | Path], labels: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per benchmark and file. ``run`` is the label (default: the file's stem, made
    unique). Records lacking gpubench fields load with a warning naming file and fields."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ResultsError("no result files given")
    labels = list(labels) if labels is not None else _unique_stems(paths)
    rows = []
    for path, run in zip(paths, labels, strict=True):
        data = read_benchmark_json(path)
        if not data["benchmarks"]:
            warnings.warn(f"{path}: holds no benchmarks", stacklevel=2)
        missing = set()
        for bench in data["benchmarks"]:
            row = _row(bench, run, path, data)
            if row.get("kind", "step") == "step":
                missing.update(f for f in REQUIRED_FIELDS if f not in row)
            rows.append(row)
        if missing:
            warnings.warn(
                f"{path}: records lack {', '.join(sorted(missing))} "
                "(written by another gpubench version, or not by gpubench); "
                "charts and tables that need them skip those records",
                stacklevel=2,
            )
    df = pd.DataFrame(rows)
    for col in REQUIRED_FIELDS:
        if col not in df:
            df[col] = None
    return df


def _unique_stems(paths: list[Path]) -> list[str]:
    stems = [p.stem for p in paths]
    if len(set(stems)) == len(stems):
        return stems
    return [str(p.with_suffix("")) for p in paths]


def training_memory(df: pd.DataFrame) -> pd.Series:
    """The memory techniques change, comparable across cases: on CUDA the allocator's peak; on
    the CPU, whose process peak is dominated by the runtime and moved by the allocator, the
    exact sum of parameters, gradients, optimizer state and the activations autograd saves per
    micro-batch (per device or rank; unknown, not mixed with the process peak, when a record
    lacks them)."""
    exact = sum(df[c].astype(float) if c in df else float("nan")
                for c in ("param_bytes", "grad_bytes", "optimizer_state_bytes",
                          "activation_bytes"))
    peak = df["peak_memory_bytes"].astype(float)
    return peak.where(df["device"] == "cuda", pd.Series(exact, index=df.index))


def with_baseline_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``speedup`` and ``memory_ratio`` against the FP32 single-device baseline of the same
    run, model, profile and device.

    ``speedup`` is the ratio of throughputs (samples/s of the global batch): for cases with the
    baseline's global batch it equals baseline step time / step time, and it stays fair for
    cases that process more samples per step (accumulation at constant micro-batch, DDP).
    ``memory_ratio`` compares ``training_memory_bytes`` (see ``training_memory``)."""
    df = df.copy()
    df["training_memory_bytes"] = training_memory(df)
    keys = ["run", "model", "profile", "device"]
    cols = ["step_time_s", "samples_per_s", "global_batch", "peak_memory_bytes",
            "training_memory_bytes"]
    base = df[df["is_baseline"] == True][keys + cols]  # noqa: E712
    base = base.drop_duplicates(keys).rename(columns={c: f"base_{c}" for c in cols})
    df = df.merge(base, on=keys, how="left")
    df["speedup"] = df["samples_per_s"] / df["base_samples_per_s"]
    df["memory_ratio"] = df["training_memory_bytes"] / df["base_training_memory_bytes"]
    return with_scaling(df)


def with_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``scaling_efficiency`` to parallel cases: samples/s / (devices x samples/s of the
    single-device case with the same per-device settings, ``single_case_id``). 1.0 is perfect
    scaling; single-device cases get 1.0 by definition."""
    if "single_case_id" not in df:
        df["scaling_efficiency"] = float("nan")
        return df
    single = df[["run", "case_id", "samples_per_s"]].rename(
        columns={"case_id": "single_case_id", "samples_per_s": "single_samples_per_s"}
    )
    df = df.merge(single.drop_duplicates(["run", "single_case_id"]),
                  on=["run", "single_case_id"], how="left")
    devices = df["world_size"].where(df["parallel"] != "single", 1).astype(float)
    df["scaling_efficiency"] = (df["samples_per_s"] / (devices * df["single_samples_per_s"]))
    df.loc[df["parallel"] == "single", "scaling_efficiency"] = 1.0
    return df
