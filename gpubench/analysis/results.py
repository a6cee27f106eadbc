"""Load pytest-benchmark JSON files into one tidy DataFrame: one row per case and run.

``read_benchmark_json`` is the one reader of result files: it checks the parts gpubench uses
against a schema (pytest-benchmark's layout: ``benchmarks``, each with ``name``, ``stats`` and
``extra_info``; ``machine_info``) and turns every malformed file into a one-line
``ResultsError`` that names the file and the first bad field.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gpubench.analysis.schema import field_types
from gpubench.measure.version import SCHEMA_VERSION
from gpubench.train.techniques import TECHNIQUES, column_type
from gpubench.util.verdicts import Kind

REQUIRED_FIELDS = (
    "model", "profile", "device", "precision", "accum_steps", "micro_batch", "global_batch",
    "optimizer", "parallel", "world_size", "input_shape", "case_id", "is_baseline",
    "step_time_s", "samples_per_s", "peak_memory_bytes", "flops_per_step", "tflops", "mfu",
)
"""Fields every gpubench record carries in ``extra_info``; older or foreign files may lack some."""

NULLABLE_REQUIRED = ("tflops", "mfu")
"""Required fields that are null where the FLOP count left out heavy work (``uncounted_ops``):
no FLOP rate is better than a silently low one."""

STAT_FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "rounds")

INT64_MAX = 2**63 - 1

# -- schema of the parts gpubench uses --------------------------------------------------------
STORAGE_COLUMNS = ("storage_read_mb_s", "storage_cached_mb_s", "storage_random_iops",
                   "storage_resident_after_evict", "storage_fs", "storage_note")
"""The storage probe of the data folder (``machine_info.gpubench.storage``), a column each."""
EXTRA_SCHEMA: dict[str, tuple[str, str]] = {
    **{t.field: column_type(t) for t in TECHNIQUES},
    **field_types(),
}
"""Known ``extra_info`` fields: (type, constraint), from the techniques' declarations and the
documented record schema (``gpubench.analysis.schema.METRICS``). Any may be null except the
REQUIRED_FIELDS (but ``NULLABLE_REQUIRED``) and ``kind``; unknown fields pass through (integers
must fit in 64 bits)."""

STATS_SCHEMA: dict[str, tuple[str, str]] = {
    **{f: ("float", ">0") for f in ("min", "max", "mean", "median", "q1", "q3")},
    **{f: ("float", ">=0") for f in ("stddev", "iqr")},
    "rounds": ("int", ">=1"),
    "data": ("floats", ">0"),
}
"""pytest-benchmark's ``stats`` as gpubench reads them (times in seconds); ``median`` is
required, the others are checked where present."""

KINDS = ("step", "claim", "overhead", "transfer")


class ResultsError(ValueError):
    """A result file that gpubench cannot use; the message (one line) names the file and the
    first bad field."""


def load_report_files(paths: Iterable, name: str, problem) -> list[dict]:
    """The reports in JSON side files (``memory.json``, ``parity.json``): one report per file,
    or a list of them (one per model, as ``gpubench run`` writes them). ``problem(report)``
    says what a report lacks (None: nothing); a bad file is a one-line ``ResultsError``."""
    reports = []
    for path in map(Path, paths):
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ResultsError(f"{path}: no such file") from None
        except (OSError, ValueError) as err:
            raise ResultsError(f"{path}: not a gpubench {name} ({err})") from None
        for report in data if isinstance(data, list) else [data]:
            why = "not a mapping" if not isinstance(report, dict) else problem(report)
            if why:
                raise ResultsError(f"{path}: not a gpubench {name} ({why})")
            reports.append(report)
    return reports


def files_beside(files: Iterable, name: str) -> list[Path]:
    """The file ``name`` in each result file's folder, where there is one (each folder once)."""
    folders = dict.fromkeys(Path(f).resolve().parent for f in files)
    return [p for p in (d / name for d in folders) if p.is_file()]


def _describe(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        text = f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def _number_ok(value, constraint: str) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int) and abs(value) > INT64_MAX:
        return False
    if constraint == "loss":
        return True
    try:
        number = float(value)
    except OverflowError:
        return False
    if not math.isfinite(number):
        return False
    return {">0": number > 0, ">=0": number >= 0, ">=1": number >= 1}.get(constraint, True)


_BOUND = {">0": "positive ", ">=0": "non-negative ", ">=1": "positive ", "any": "finite ",
          "loss": ""}


def _expectation(kind: str, constraint: str) -> str:
    if kind == "str":
        return "a string"
    if kind == "bool":
        return "true or false"
    bound = _BOUND[constraint]
    if kind == "int":
        return f"a {bound}integer" if bound not in ("", "finite ") else "an integer"
    if kind == "float":
        return f"a {bound}number"
    if kind == "map":
        return f"a mapping of names to {bound}numbers"
    return f"a list of {bound}{'integers' if kind == 'ints' else 'numbers'}"


def _check(value, kind: str, constraint: str) -> str | None:
    """Why ``value`` is not of ``kind`` under ``constraint``, or None."""
    expect = _expectation(kind, constraint)
    bad = f"expected {expect}, got {_describe(value)}"
    if kind == "str":
        return None if isinstance(value, str) else bad
    if kind == "bool":
        return None if isinstance(value, bool) else bad
    if kind == "int":
        return None if isinstance(value, int) and _number_ok(value, constraint) else bad
    if kind == "float":
        return None if _number_ok(value, constraint) else bad
    if kind == "map":
        if not isinstance(value, dict):
            return bad
        for key, item in value.items():
            if _check(item, "float", constraint) is not None:
                return (f"{key}: expected {_expectation('float', constraint)}, "
                        f"got {_describe(item)}")
        return None
    if not isinstance(value, list):
        return bad
    item_kind = "int" if kind == "ints" else "float"
    for i, item in enumerate(value):
        if _check(item, item_kind, constraint) is not None:
            return (f"item {i}: expected {_expectation(item_kind, constraint)}, "
                    f"got {_describe(item)}")
    return None


def _huge_int(value) -> bool:
    """Whether ``value`` holds, at any depth, an integer beyond 64 bits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) > INT64_MAX
    if isinstance(value, dict):
        return any(_huge_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_huge_int(v) for v in value)
    return False


def _validate_mapping(mapping: dict, schema: dict, where: str, non_null: Iterable[str]) -> None:
    non_null = set(non_null)
    for key, value in mapping.items():
        spec = schema.get(key)
        if spec is None:
            if _huge_int(value):
                raise _Bad(f"{where}.{key}", "holds an integer beyond 64 bits")
            continue
        if value is None:
            if key in non_null:
                raise _Bad(f"{where}.{key}", "is null")
            continue
        problem = _check(value, *spec)
        if problem:
            raise _Bad(f"{where}.{key}", problem)


class _Bad(Exception):
    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")


def _validate_bench(bench, where: str) -> None:
    if not isinstance(bench, dict):
        raise _Bad(where, f"expected an object, got {_describe(bench)}")
    name = bench.get("name")
    if not isinstance(name, str) or not name:
        raise _Bad(f"{where}.name", f"expected a non-empty string, got {_describe(name)}")
    if bench.get("group") is not None and not isinstance(bench["group"], str):
        raise _Bad(f"{where}.group", f"expected a string or null, got {_describe(bench['group'])}")
    stats = bench.get("stats")
    if not isinstance(stats, dict):
        raise _Bad(f"{where}.stats", f"expected an object, got {_describe(stats)}")
    if "median" not in stats:
        raise _Bad(f"{where}.stats.median", "missing")
    _validate_mapping(stats, STATS_SCHEMA, f"{where}.stats", STATS_SCHEMA)
    if "extra_info" in bench:
        extra = bench["extra_info"]
        if not isinstance(extra, dict):
            raise _Bad(f"{where}.extra_info", f"expected an object, got {_describe(extra)}")
        _validate_mapping(extra, EXTRA_SCHEMA, f"{where}.extra_info",
                          (*(f for f in REQUIRED_FIELDS if f not in NULLABLE_REQUIRED), "kind"))
        if "kind" in extra and extra["kind"] not in KINDS:
            raise _Bad(f"{where}.extra_info.kind",
                       f"expected one of {', '.join(KINDS)}, got {_describe(extra['kind'])}")
        for key in ("model", "case_id"):
            if extra.get(key) == "":
                raise _Bad(f"{where}.extra_info.{key}", "is empty")


def _validate(data) -> None:
    if not isinstance(data, dict):
        raise _Bad("top level", f"expected an object, got {_describe(data)}")
    benches = data.get("benchmarks")
    if not isinstance(benches, list):
        raise _Bad("benchmarks", f"expected a list, got {_describe(benches)}")
    if not benches:
        raise _Bad("benchmarks", "empty (the file holds no cases)")
    for key in ("datetime", "version"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise _Bad(key, f"expected a string, got {_describe(data[key])}")
    machine = data.get("machine_info", {})
    if not isinstance(machine, dict):
        raise _Bad("machine_info", f"expected an object, got {_describe(machine)}")
    for key, expect in (("node", str), ("cpu", dict), ("gpubench", dict)):
        if machine.get(key) is not None and not isinstance(machine[key], expect):
            raise _Bad(f"machine_info.{key}",
                       f"expected {'a string' if expect is str else 'an object'}, "
                       f"got {_describe(machine[key])}")
    if (machine.get("cpu") or {}).get("brand_raw") is not None and \
            not isinstance(machine["cpu"]["brand_raw"], str):
        raise _Bad("machine_info.cpu.brand_raw", "expected a string")
    storage = (machine.get("gpubench") or {}).get("storage")
    if storage is not None and not isinstance(storage, dict):
        raise _Bad("machine_info.gpubench.storage", f"expected an object, got {_describe(storage)}")
    for key in STORAGE_COLUMNS:
        value = (storage or {}).get(key)
        kind = "str" if key in ("storage_fs", "storage_note") else "float"
        if value is not None and not (isinstance(value, str) if kind == "str" else (
                isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and value >= 0)):
            raise _Bad(f"machine_info.gpubench.storage.{key}",
                       f"expected {'a string' if kind == 'str' else 'a number >= 0'}, "
                       f"got {_describe(value)}")
    for key in ("cpu", "torch"):
        value = (machine.get("gpubench") or {}).get(key)
        if value is not None and not isinstance(value, str):
            raise _Bad(f"machine_info.gpubench.{key}",
                       f"expected a string, got {_describe(value)}")
    for i, bench in enumerate(benches):
        _validate_bench(bench, f"benchmarks[{i}]")


def read_benchmark_json(path: str | Path) -> dict:
    """The parsed result file ``path``, checked against the schema (see the module docstring);
    ``ResultsError`` (one line: file, first bad field, what is wrong) otherwise."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultsError(f"{path}: is a directory, not a result file") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: not JSON (not UTF-8 text)") from None
    except OSError as err:
        raise ResultsError(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ResultsError(f"{path}: not JSON ({err})") from None
    except (ValueError, RecursionError) as err:  # 4300+ digit integers, absurd nesting
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise ResultsError(f"{path}: not usable JSON ({reason.splitlines()[0]})") from None
    try:
        _validate(data)
    except _Bad as bad:
        raise ResultsError(f"{path}: not a gpubench/pytest-benchmark result file: {bad}") \
            from None
    except RecursionError:
        raise ResultsError(f"{path}: not usable JSON (nested too deeply)") from None
    return data


def upgrade(extra: dict) -> dict:
    """A record's ``extra_info`` brought to this gpubench's version of the record
    (``gpubench.measure.version``), the one place older records are read differently: a
    record without ``schema`` (version 0) is a benchmark case where it has no ``kind``, was
    built from its ``model`` where it has no ``workload`` spec, and ran every technique
    declared since at its default. A record of a newer version than this gpubench knows is
    read as it is (its unknown fields pass through). Before version 2, a record's
    ``fp8_flops_fraction`` was a share of all its counted FLOPs; it is read as
    ``fp8_gemm_flops_fraction`` (a share of the GEMM FLOPs) where it was 0, the same in both,
    else as unknown (the record lacks the GEMM FLOPs to convert it)."""
    version = extra.get("schema")
    if not isinstance(version, int) or isinstance(version, bool):
        version = 0
    if version >= SCHEMA_VERSION:
        return extra
    out = dict(extra)
    if version < 1:
        out.setdefault("kind", "step")
        if out["kind"] == "step" and "model" in out:  # a gpubench record (not a foreign one)
            if not out.get("workload") and isinstance(out.get("model"), str):
                out["workload"] = out["model"]
            for t in TECHNIQUES:
                out.setdefault(t.field, t.default)
    if version < 2 and "fp8_flops_fraction" in out:
        share = out.pop("fp8_flops_fraction")
        out["fp8_gemm_flops_fraction"] = share if share == 0 else None
    out["schema"] = SCHEMA_VERSION
    return out


def _row(bench: dict, run: str, path: Path, data: dict) -> dict:
    stats = bench.get("stats") or {}
    extra = upgrade(bench.get("extra_info") or {})
    machine = data.get("machine_info") or {}
    gpubench_machine = machine.get("gpubench") or {}
    base = {
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
        "fingerprint": gpubench_machine.get("fingerprint"),
        "pytest_benchmark_version": data.get("version"),
        **{k: (gpubench_machine.get("storage") or {}).get(k) for k in STORAGE_COLUMNS},
    }
    row = {**extra, **base}  # the reader's columns win over same-named extra_info fields
    row.setdefault("case_id", bench.get("name"))
    row["kind"] = extra.get("kind") or "step"
    return row


def _dtype(column: str) -> str | None:
    """The frame dtype of a column: nullable ``Int64``/``boolean`` for integer and boolean
    fields (a record kind lacking one gets <NA>), ``float64`` for numbers."""
    if column == "time_rounds":
        return "Int64"
    if column in {f"time_{k}" for k in STAT_FIELDS}:
        return "float64"
    kind, _ = EXTRA_SCHEMA.get(column, (None, None))
    return {"int": "Int64", "bool": "boolean", "float": "float64"}.get(kind)


def load_results(paths: str | Path | Iterable[str | Path],
                 labels: Iterable[str] | None = None) -> pd.DataFrame:
    """Read result files (``read_benchmark_json``: a malformed file is a ``ResultsError``)
    into one frame, one row per benchmark record and file.

    Columns, besides every ``extra_info`` field of the records:

    - ``run`` (the label: ``labels``, default the file's stem, made unique), ``file``,
      ``datetime`` (of the run), ``name`` (pytest-benchmark's test name), ``bench_group``;
    - ``kind``: ``step`` (one training-step case: the timing rows), ``claim`` (a paired A/B
      check of a speed-up claim: ``claim``, ``case_id_base``/``case_id_new``, per-round
      ``rounds_base_s``/``rounds_new_s``), ``overhead`` (gpubench's own cost, e.g.
      ``process_overhead_s``) or ``transfer`` (CUDA host-to-device copies: ``bytes``,
      ``bandwidth_gb_s``); records without a kind (older files) are ``step``;
    - pytest-benchmark's statistics in **seconds**: ``time_min``, ``time_max``, ``time_mean``,
      ``time_stddev``, ``time_median``, ``time_iqr``, ``time_q1``, ``time_q3``,
      ``time_rounds`` (a count) and ``rounds_s`` (the list of round times);
    - the machine: ``machine_node``, ``machine_cpu``, ``torch_version``, ``fingerprint`` (the
      machine, library versions, commit and date: ``gpubench.measure.machine.fingerprint``),
      ``matmul_peak_tflops`` (per precision), ``pytest_benchmark_version``, the storage probe
      of the data folder (``STORAGE_COLUMNS``: ``storage_read_mb_s`` ...);
    - every field gpubench knows (``EXTRA_SCHEMA``; a column even when no record has it),
      among them ``REQUIRED_FIELDS``, units in the name: ``step_time_s`` (median seconds per
      optimizer step), ``samples_per_s`` (global batch / step time), ``peak_memory_bytes``,
      ``flops_per_step`` (FLOPs), ``tflops`` (achieved 10^12 FLOP/s), ``mfu`` (fraction of
      the measured matmul peak), ``accum_steps``, ``micro_batch``, ``global_batch``,
      ``world_size`` (counts), ``is_baseline``; other fields follow the same convention
      (``_s`` seconds, ``_bytes`` bytes, ``_fraction`` a ratio; README, "Python API").

    Integer and boolean fields have pandas' nullable dtypes (``Int64``, ``boolean``): a field
    that a record kind lacks is ``<NA>``, not a float NaN or ``None``. Step records lacking
    gpubench fields load with a warning naming the file and the fields."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one file
    paths = [Path(p) for p in paths]
    if not paths:
        raise ResultsError("no result files given")
    labels = list(labels) if labels is not None else _unique_stems(paths)
    if len(labels) != len(paths):
        raise ResultsError(f"{len(labels)} labels for {len(paths)} result files")
    rows = []
    for path, run in zip(paths, labels, strict=True):
        data = read_benchmark_json(path)
        missing = set()
        for bench in data["benchmarks"]:
            row = _row(bench, run, path, data)
            if row["kind"] == "step":
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
    # A stable set of columns, whatever the file (added at once: one by one fragments the frame).
    absent = [c for c in dict.fromkeys((*REQUIRED_FIELDS, *EXTRA_SCHEMA)) if c not in df]
    df = pd.concat([df, pd.DataFrame({c: pd.Series([None] * len(df), index=df.index,
                                                    dtype=object) for c in absent})], axis=1)
    for col in df.columns:
        dtype = _dtype(col)
        if dtype is not None:
            df[col] = df[col].astype(object).where(df[col].notna(), None).astype(dtype)
    return df.copy()  # one block per dtype: the casts above leave the frame fragmented


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


MACHINE_IDENTITY = ("machine_cpu", "device_name")
"""What makes two runs' records comparable when one borrows the other's baseline: the same CPU
and device names (with the same model, profile and device)."""


def baseline_runs(df: pd.DataFrame) -> pd.Series:
    """The run whose FP32 baseline (and single-device cases) each row is compared with: its
    own where it has one for the row's model, profile and device; otherwise another run of the
    same model, profile, device and machine (``MACHINE_IDENTITY``) that has one, one on the
    same node first. A case run on its own, such as ``gpubench dist`` under torchrun or
    ``gpubench case``, so gets its speedup and scaling efficiency from a baseline in another
    file (``gpubench summary base.json ddp.json``). Rows without any stay on their own run."""
    def col(frame: pd.DataFrame, name: str) -> list:
        values = frame[name] if name in frame else pd.Series(None, index=frame.index)
        return [None if pd.isna(v) else v for v in values.astype(object)]

    keys = ("run", "model", "profile", "device")
    rows = list(zip(*(col(df, k) for k in (*keys, *MACHINE_IDENTITY, "machine_node")),
                    strict=True))
    is_base = (df["is_baseline"] == True).fillna(False).tolist()  # noqa: E712
    own, by_machine = set(), {}
    for row, base in zip(rows, is_base, strict=True):
        if base:
            own.add(row[:4])
            by_machine.setdefault((*row[1:4], *row[4:6]), {}).setdefault(row[0], row[6])
    runs = []
    for row in rows:
        if row[:4] in own:
            runs.append(row[0])
            continue
        candidates = by_machine.get((*row[1:4], *row[4:6]), {})
        same_node = [r for r, node in candidates.items() if node == row[6]]
        runs.append((same_node or list(candidates) or [row[0]])[0])
    return pd.Series(runs, index=df.index, dtype=object)


def with_baseline_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``speedup`` and ``memory_ratio`` against the FP32 single-device baseline of the same
    run, model, profile and device; for a run without one (a torchrun record of
    ``gpubench dist``, a ``gpubench case`` file), the baseline of another run of the same
    model, profile, device and machine, named in ``baseline_run`` (see ``baseline_runs``).

    ``speedup`` is the ratio of throughputs (samples/s of the global batch): for cases with the
    baseline's global batch it equals baseline step time / step time, and it stays fair for
    cases that process more samples per step (accumulation at constant micro-batch, DDP).
    Where the case was timed with a paired baseline round before each of its rounds
    (``speedup_paired``), that drift-robust figure is the speedup, with its bootstrap interval
    in ``speedup_low`` / ``speedup_high`` and ``speedup_method`` "paired"; otherwise it is the
    ratio of separately measured medians ("separate", no interval). A case paired with the
    baseline's worker process has that figure against the baseline as it runs in the
    benchmark process: ``speedup_offset``, the benchmark process's baseline step over the
    worker's, is measured paired when the worker started and applied to its rounds as they are
    recorded (``paired_speedup``); in older records it is the baseline case's step over the
    worker's and is applied here (see the code).
    ``memory_ratio`` compares ``training_memory_bytes`` (see ``training_memory``). Compiled
    cases get their break-even against the same configuration uncompiled
    (``with_compile_break_even``)."""
    df = df.copy()
    df["training_memory_bytes"] = training_memory(df)
    df["baseline_run"] = baseline_runs(df)
    keys = ["run", "model", "profile", "device"]
    cols = ["step_time_s", "samples_per_s", "global_batch", "peak_memory_bytes",
            "training_memory_bytes"]
    # The baseline: a measured step record flagged as one (not a claim pair's side, not a
    # case that failed before its rounds), the first of a run where it was measured twice.
    steps = (df["kind"].isna() | (df["kind"] == "step")) if "kind" in df else True
    base = df[(df["is_baseline"] == True) & steps & df["step_time_s"].notna()]  # noqa: E712
    base = base[keys + cols].drop_duplicates(keys).rename(columns={c: f"base_{c}" for c in cols})
    base = base.rename(columns={"run": "baseline_run"})
    df = df.merge(base, on=["baseline_run", *keys[1:]], how="left")
    separate = (df["samples_per_s"] / df["base_samples_per_s"]).astype(float)
    paired = (df["speedup_paired"].astype(float) if "speedup_paired" in df
              else pd.Series(float("nan"), index=df.index))
    # A case paired with the baseline's worker process (``--partner worker``; in older records,
    # multi-process cases and those with an allocator of their own too) gets that process's
    # baseline steps, which run at their own speed: a fresh process differs from the in-process
    # baseline case it stands for by several percent for its whole life. The pairing cancels the
    # drift between the rounds; the offset between the two processes turns the ratio into the one
    # against the baseline in this process, interval and all: measured paired when the worker
    # started (``paired_worker_offset``, this process's step over the worker's), so the machine's
    # speed cancels in it too; in older records, the baseline case's median step over the worker's
    # median step during the case's rounds, which carries whatever the machine's speed did between
    # the two.
    worker = (df["paired_partner"].eq("worker process").fillna(False).astype(bool)
              if "paired_partner" in df else pd.Series(False, index=df.index))
    own_base = (df["baseline_step_time_s"].astype(float) if "baseline_step_time_s" in df
                else pd.Series(float("nan"), index=df.index))
    measured = (numbers(df["paired_worker_offset"]) if "paired_worker_offset" in df
                else pd.Series(float("nan"), index=df.index))
    legacy = (df["base_step_time_s"].astype(float) / own_base).where(measured.isna())
    df["speedup_offset"] = measured.where(measured.notna(), legacy).where(worker)
    # the measured offset is in ``speedup_paired`` already (``paired_speedup``), with its
    # interval and test; an older record's is applied here
    offset = legacy.where(worker)
    paired = paired * offset.fillna(1.0)
    df["speedup"] = paired.where(paired.notna(), separate)
    # The baseline is 1.0x by definition; its paired interval (against its own copy in the
    # baseline worker) stays, as the noise floor of the run.
    df.loc[df["is_baseline"] == True, "speedup"] = 1.0  # noqa: E712
    df["speedup_method"] = pd.Series("paired", index=df.index).where(paired.notna(), "separate")
    for side in ("low", "high"):
        col = f"speedup_paired_{side}"
        df[f"speedup_{side}"] = (df[col].astype(float) if col in df
                                 else pd.Series(float("nan"), index=df.index)
                                 ) * offset.fillna(1.0)
    # The baseline's throughput beside each case: the samples/s its speedup divides by. For a
    # paired case, the baseline's during the case's own rounds (the case's samples/s over
    # the paired speedup); else the baseline case's. So samples/s over this is the speedup.
    df["baseline_samples_per_s"] = (df["samples_per_s"].astype(float)
                                    / df["speedup"].astype(float)).where(
        df["speedup_method"] == "paired", df["base_samples_per_s"].astype(float))
    df["memory_ratio"] = df["training_memory_bytes"] / df["base_training_memory_bytes"]
    df["batch_factor"] = numbers(df["global_batch"]) / numbers(df["base_global_batch"])
    return with_compile_break_even(with_plausibility(with_scaling(df)))


def numbers(values: pd.Series) -> pd.Series:
    """``values`` as floats, NaN where missing (``None``, ``pd.NA``) or not a number."""
    return pd.to_numeric(values, errors="coerce").astype(float)


def batch_mark(factor: float) -> str:
    """The mark of a case whose effective (global) batch is ``factor`` times its baseline's
    (``batch_factor`` of ``with_baseline_ratios``), wherever cases are ranked: such a case does
    other work per step, and a user who trains with it changes their training recipe. "" for
    the same batch or an unknown one."""
    if factor is None or pd.isna(factor) or factor == 1:
        return ""
    return f" [batch x{float(factor):g}]"


BATCH_MARK_NOTE = ("[batch xN]: the case's effective (global) batch is N times the baseline's, "
                   "another training recipe")


NOOP_TOLERANCE = 0.03
"""How far from 1.0 a technique that does nothing on the device may read before it is flagged."""

SPREAD_LIMIT = 0.10
"""Baseline IQR / median above which a run's timings are flagged as noisy."""

PARTNER_TOLERANCE = 0.10
"""A case paired in its own process whose baseline rounds there ran more than this fraction
slower than the same baseline at rest just before them (``partner_drift``) is flagged as a
disturbed pairing: the case (its loader workers refilling while the baseline steps, its memory)
slowed the baseline it is read against, which flatters its speedup, and the recommendation
passes it over. Baseline rounds that ran faster are not flagged: no presence of the case speeds
its baseline up, and such a speedup could only be understated."""


def _positive(value) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value and value > 0 \
        else None


def partner_reference(row) -> tuple[str, float] | None:
    """What a case's in-process baseline rounds are read against (``partner_drift``), as (name,
    seconds): ("steady", ...), the same baseline's steps at rest just before the rounds
    (``paired_baseline_steady_s``); ("baseline case", ...), for records without that figure,
    the baseline case's step, measured minutes earlier, so a machine whose speed moved meanwhile
    reads as a disturbance too; None where the case was not paired in its own process (a worker
    process's rounds are read through its measured offset instead, ``speedup_offset``)."""
    if row.get("paired_partner") != "this process" or row.get("is_baseline") is True:
        return None
    for name, field in (("steady", "paired_baseline_steady_s"),
                        ("baseline case", "base_step_time_s")):
        seconds = _positive(row.get(field))
        if seconds is not None:
            return name, seconds
    return None


def partner_drift(row) -> float | None:
    """How far the baseline's rounds beside a case in its own process ran from their reference
    (``partner_reference``): their median step over it, less 1 (0.5: 50% slower), from a row
    of ``with_baseline_ratios``; None where there is none. Read against the steady figure, a
    machine that ran at another speed than when the baseline case was measured (the project's
    2-core VM alternates between two speeds some 30% apart for minutes at a time) is no
    disturbance: it moved both sides of the pairing, whose ratio cancels it."""
    own, reference = _positive(row.get("baseline_step_time_s")), partner_reference(row)
    if own is None or reference is None:
        return None
    return own / reference[1] - 1


def disturbed_words(row) -> str:
    """A disturbed pairing in words (the summary's flag, the recommendation's why), from a row
    of ``with_baseline_ratios`` (``partner_drift``)."""
    drift = partner_drift(row) or 0.0
    reference = partner_reference(row)
    than = ("in the paired rounds than at rest just before them"
            if reference and reference[0] == "steady" else "than the baseline case")
    return f"the FP32 baseline beside it ran {abs(drift):.0%} " \
           f"{'slower' if drift > 0 else 'faster'} {than}"


def _only_inert(flat: dict) -> bool:
    """Whether a record differs from its baseline only by techniques that do nothing on its
    device (so it must read 1.0x); a loader case with pinning differs by its loader too."""
    from dataclasses import replace

    from gpubench.train.config import config_from_record

    try:
        cfg = config_from_record(flat)
    except (ValueError, TypeError, KeyError):
        return False
    stripped = cfg.with_(precision="fp32" if cfg.precision == "tf32" else cfg.precision,
                         empty_cache=False)
    if stripped.loader.pin_memory or stripped.loader.non_blocking:
        loader = replace(stripped.loader, pin_memory=False, non_blocking=False)
        try:
            stripped = stripped.with_(loader=loader)
        except ValueError:
            return False
    return stripped.is_baseline


def with_plausibility(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``flags``: figures outside what the technique can physically give, so a reader knows
    which numbers to distrust: a no-op technique off 1.0 by more than ``NOOP_TOLERANCE`` with an
    interval that excludes 1.0; a speedup above the device count for a parallel case (or above
    what the baseline's spread allows); scaling efficiency above 100%; and a noisy baseline
    (IQR / median above ``SPREAD_LIMIT``); a case timed while the machine was contended
    (``contended``, see ``gpubench.measure.telemetry``); and a case whose baseline rounds in its
    own process ran more than ``PARTNER_TOLERANCE`` slower than their reference, the same
    baseline at rest just before them (``partner_drift``)."""
    from gpubench.train.config import inert_techniques

    flags = []
    for _, row in df.iterrows():
        out = []
        speedup = row.get("speedup")
        if isinstance(speedup, float) and speedup == speedup:
            flat = {k: (None if (isinstance(v, float) and v != v) else v)
                    for k, v in row.items()}
            low, high = row.get("speedup_low"), row.get("speedup_high")
            excludes_one = (isinstance(low, float) and low == low and (low > 1 or high < 1))
            if (inert_techniques(flat) and _only_inert(flat)
                    and abs(speedup - 1) > NOOP_TOLERANCE
                    and (excludes_one or row.get("speedup_method") != "paired")):
                out.append(f"no-op technique off 1.0x: {Kind.MACHINE_NOISE}")
            devices = row.get("world_size")
            devices = int(devices) if isinstance(devices, int | float) and devices == devices \
                else 1
            if row.get("parallel") in ("ddp", "fsdp") and speedup > devices * 1.05:
                out.append(f"speedup above {devices} devices: {Kind.IMPLAUSIBLE}")
        mfu = row.get("mfu")
        if isinstance(mfu, float) and mfu > 1.0:
            out.append("MFU above 100%: the measured matmul peak was too low (taken under load?)")
        eff = row.get("scaling_efficiency")
        if row.get("parallel") not in (None, "single") and isinstance(eff, float) and eff > 1.05:
            out.append(f"scaling efficiency above 100%: {Kind.IMPLAUSIBLE}")
        iqr, median = row.get("step_time_iqr_s"), row.get("step_time_s")
        if (row.get("is_baseline") is True and isinstance(iqr, float) and median
                and iqr / median > SPREAD_LIMIT):
            out.append(f"{Kind.NOISY_BASELINE} (IQR {100 * iqr / median:.0f}% of the median)")
        if row.get("contended") is True:  # gpubench.measure.telemetry
            out.append(f"{Kind.CONTENDED}: {row.get('contention_reason')}")
        drift = partner_drift(row)
        if drift is not None and drift > PARTNER_TOLERANCE:
            out.append(f"{Kind.DISTURBED}: {disturbed_words(row)}")
        flags.append("; ".join(out))
    df["flags"] = flags
    return df


SINGLE_DEVICE = ("parallel", "world_size", "ddp_no_sync", "fsdp_mixed_precision", "chunks",
                 "schedule")
"""The fields a parallel case differs in from its single-device case (each at its default
there: ``gpubench.measure.runner`` names that case in ``single_case_id``)."""


def single_device_case(frame: pd.DataFrame, row) -> pd.Series | None:
    """The measured step case of ``frame`` that is ``row``'s configuration on one device: every
    ``CONFIG_FIELDS`` field the same but ``SINGLE_DEVICE``, each of those at its default
    (``twin``), or None."""
    return twin(_single_device_pool(frame), _on_one_device(row), vary=())


def _single_device_pool(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` a single-device case is looked up among: measured step records on
    one device."""
    keep = (frame["parallel"] == "single").fillna(False).astype(bool) if "parallel" in frame \
        else pd.Series(True, index=frame.index)
    if "kind" in frame:
        keep &= (frame["kind"].isna() | (frame["kind"] == "step")).fillna(False).astype(bool)
    return frame[keep]


def _on_one_device(row) -> dict:
    return {**dict(row), **{f: _FIELD_DEFAULTS[f] for f in SINGLE_DEVICE}}


def with_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``scaling_efficiency`` to parallel cases: samples/s / (devices x samples/s of its
    single-device case, the same configuration on one device (``single_device_case``), of the
    same run, else of ``baseline_run``); its figures as ``single_samples_per_s``,
    ``single_speedup``, ``single_speedup_method``. 1.0 is perfect scaling; single-device cases
    get 1.0 by definition. Where both cases have paired speedups against the same baseline,
    their ratio is used (drift-robust)."""
    single_cols = {"samples_per_s": "single_samples_per_s", "speedup": "single_speedup",
                   "speedup_method": "single_speedup_method"}
    found: dict[str, list] = {c: [None] * len(df) for c in single_cols.values()}
    runs = df["run"] if "run" in df else pd.Series("", index=df.index, dtype=object)
    other_runs = df["baseline_run"] if "baseline_run" in df else runs
    parallel = ~df["parallel"].isin(["single"]) & df["parallel"].notna()
    if parallel.any():
        columns = [c for c in (*CONFIG_FIELDS, "case_id", "step_time_s", *single_cols)
                   if c in df]
        pool = _single_device_pool(df)
        pools = {run: g[columns] for run, g in pool.groupby(runs[pool.index], sort=False)}
        for n, (i, row) in enumerate(df.iterrows()):
            if not parallel.loc[i]:
                continue
            ref = _on_one_device(row)
            for run in dict.fromkeys((runs.loc[i], other_runs.loc[i])):
                single = twin(pools[run], ref, vary=()) if run in pools else None
                if single is not None:
                    for c, name in single_cols.items():
                        found[name][n] = single[c]
                    break
    for name, values in found.items():
        df[name] = pd.Series(values, index=df.index, dtype=object)
    df["single_samples_per_s"] = numbers(df["single_samples_per_s"])
    df["single_speedup"] = numbers(df["single_speedup"])
    devices = df["world_size"].where(df["parallel"] != "single", 1).astype(float)
    separate = df["samples_per_s"] / (devices * df["single_samples_per_s"])
    both_paired = (df["speedup_method"] == "paired") & (df["single_speedup_method"] == "paired")
    paired = df["speedup"] / (devices * df["single_speedup"])
    df["scaling_efficiency"] = paired.where(both_paired, separate).astype(float)
    df.loc[df["parallel"] == "single", "scaling_efficiency"] = 1.0
    return df


CONFIG_FIELDS = ("model", "workload", "profile", "device", *(t.field for t in TECHNIQUES))
"""What makes a case the case it is: the model (and the workload spec it was built from), the
profile and device, and every technique's field. Two records that agree on all of them measured
the same configuration; a lookup of a case's partner (its baseline, a cold case's warm twin,
a loader grid's points) matches on all of them but the fields it varies."""


def _missing_value(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _comparable(field: str, value):
    """``value`` of ``field`` as compared by ``same_configuration``: a missing value stands
    for the technique's default (an older record, or ``prefetch_factor`` of no loader)."""
    if _missing_value(value):
        return _FIELD_DEFAULTS.get(field)
    if isinstance(value, bool) or hasattr(value, "dtype") and value.dtype == bool:
        return bool(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return tuple(value)
    return value


_FIELD_DEFAULTS = {t.field: t.default for t in TECHNIQUES}


def same_configuration(frame: pd.DataFrame, ref, vary: Iterable[str] = ()) -> pd.Series:
    """Mask of the rows of ``frame`` whose configuration (``CONFIG_FIELDS``) equals ``ref``'s
    (a row or a mapping) in every field but those in ``vary``; a field neither side has
    matches."""
    vary = set(vary)
    keep = [True] * len(frame)
    for field in CONFIG_FIELDS:
        if field in vary or field not in frame:
            continue
        want = _comparable(field, ref.get(field) if hasattr(ref, "get") else None)
        keep = [k and bool(_comparable(field, v) == want)
                for k, v in zip(keep, frame[field].tolist(), strict=True)]
    return pd.Series(keep, index=frame.index, dtype=bool)


def twin(frame: pd.DataFrame, row, vary: Iterable[str]) -> pd.Series | None:
    """The measured case of ``frame`` (not ``row`` itself) that is ``row``'s configuration
    with only the fields in ``vary`` different, or None."""
    mask = same_configuration(frame, row, vary)
    if "case_id" in frame:
        mask &= frame["case_id"] != row.get("case_id")
    if "step_time_s" in frame:
        mask &= frame["step_time_s"].notna()
    hits = mask.to_numpy(dtype=bool).nonzero()[0]
    return frame.iloc[hits[0]] if len(hits) else None


UNCOMPILED = ("compile", "compile_mode")
"""The fields a compiled case differs in from its uncompiled twin."""


def with_compile_break_even(df: pd.DataFrame) -> pd.DataFrame:
    """Each compiled case's ``break_even_steps`` (its ``compile_time_s`` over the seconds each
    step saves) against the same configuration uncompiled, its *uncompiled twin* (every
    ``CONFIG_FIELDS`` field equal but ``compile`` and ``compile_mode``), named in
    ``break_even_against``, whose step time (in the case's batch) is added as
    ``uncompiled_step_time_s``:

    - a record that already names ``break_even_against`` was paired in its run with that twin
      (an fp32 compiled case with the fp32 baseline; ``gpubench.measure.runner.compile_cost``):
      its drift-robust figure is kept, the twin's step time being the case's times
      ``speedup_paired``;
    - otherwise the twin measured in the same run (``twin``), from its median step time;
    - otherwise none was measured: ``break_even_steps``, ``break_even_against`` and
      ``uncompiled_step_time_s`` are null. Never a figure against another configuration: a bf16
      compiled case against the fp32 baseline would credit bf16's saving to compiling.

    ``break_even_steps`` is null also where the compiled step saves nothing against its twin
    (``break_even_against`` set)."""
    df = df.copy()
    if "compile_time_s" not in df or "step_time_s" not in df:
        return df
    compiled = numbers(df["compile_time_s"]).notna()
    steps = ((df["kind"].isna() | (df["kind"] == "step")).fillna(False).astype(bool)
             if "kind" in df else pd.Series(True, index=df.index))
    flag = ((df["compile"] == True).fillna(False).astype(bool)  # noqa: E712
            if "compile" in df else compiled)
    eager = steps & ~flag & numbers(df["step_time_s"]).notna()
    even = numbers(df.get("break_even_steps", pd.Series(float("nan"), index=df.index)))
    against = df.get("break_even_against", pd.Series(None, index=df.index, dtype=object))
    out_even, out_against, out_uncompiled = [], [], []
    for i, row in df.iterrows():
        kept = against.loc[i] if isinstance(against.loc[i], str) else None
        if not compiled.loc[i]:
            out_even.append(even.loc[i])
            out_against.append(kept)
            out_uncompiled.append(float("nan"))
            continue
        step = float(row["step_time_s"])
        if kept is not None:  # paired in its run with its uncompiled twin
            paired = row.get("speedup_paired")
            paired = float("nan") if _missing_value(paired) else float(paired)
            out_even.append(even.loc[i])
            out_against.append(kept)
            out_uncompiled.append(step * paired)
            continue
        pool = df[eager & (df["run"] == row["run"])] if "run" in df else df[eager]
        other = twin(pool, row, vary=UNCOMPILED)
        if other is None:
            out_even.append(float("nan"))
            out_against.append(None)
            out_uncompiled.append(float("nan"))
            continue
        uncompiled = float(other["step_time_s"])
        saved = uncompiled - step
        out_even.append(float(row["compile_time_s"]) / saved if saved > 0 else float("nan"))
        out_against.append(other["case_id"])
        out_uncompiled.append(uncompiled)
    df["break_even_steps"] = pd.Series(out_even, index=df.index, dtype="float64")
    df["break_even_against"] = pd.Series(out_against, index=df.index, dtype=object)
    df["uncompiled_step_time_s"] = pd.Series(out_uncompiled, index=df.index, dtype="float64")
    return df


def compile_cost_words(row) -> str:
    """What compiling cost a case and the steps after which it is won back, in words (the
    advice's and the recommendations'): from ``with_compile_break_even``'s columns."""
    text = f"compiling took {row['compile_time_s']:.1f} s, "
    even = row.get("break_even_steps")
    if not _missing_value(even):
        return text + f"won back after {even:,.0f} steps"
    if isinstance(row.get("break_even_against"), str):
        return text + f"which no step wins back (no faster than {row['break_even_against']})"
    return (text + "won back after steps not known: the same configuration uncompiled was not "
            "measured")
