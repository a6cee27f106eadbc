"""Traces and top operators: what a case's step spends its time on (``gpubench run --trace``).

After a case's timed rounds (outside them, so the figures are untouched), ``trace_case`` has
every process of the case profile ``TRACE_WARMUP`` + ``TRACE_STEPS`` more steps with
``torch.profiler`` (the warm-up step is not recorded) and write a Chrome/Perfetto trace,
``<folder>/<case_id>.json`` (``<case_id>-rank<r>.json`` per rank of DDP and pipeline cases; open
it at https://ui.perfetto.dev or chrome://tracing). From the same steps it keeps the case's
``TOP_K`` operators in the record as ``top_ops``: name, self time per step (device time on
CUDA, CPU time otherwise), share of the step, calls per step and FLOPs per step where the
profiler counts them. Without a trace folder none of this runs: the profiler is never entered.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

TRACE_WARMUP = 1
"""Profiled steps that warm the profiler up and are not recorded."""

TRACE_STEPS = 3
"""Recorded steps per case (and rank)."""

TOP_K = 10
"""Operators per case kept in the record's ``top_ops``."""

TRACES_DIR_NAME = "traces"
"""The traces' folder inside ``gpubench run``'s results folder."""


def trace_path(path_prefix: str | Path, rank: int, multiprocess: bool) -> Path:
    """``<prefix>.json``, or ``<prefix>-rank<r>.json`` for a rank of a multi-process case."""
    prefix = str(path_prefix)
    return Path(f"{prefix}-rank{rank}.json" if multiprocess else f"{prefix}.json")


def _is_operator(evt) -> bool:
    """A CPU-side operator (``aten::mm``, ``c10d::allreduce_`` ...): not a kernel, memcpy or
    runtime call recorded on the device's timeline, not the profiler's step marker and not a
    ``record_function`` annotation (whose self time is the Python around the operators)."""
    name = evt.key or ""
    if name.startswith("ProfilerStep#") or getattr(evt, "is_user_annotation", False):
        return False
    return str(getattr(evt, "device_type", "DeviceType.CPU")).endswith("CPU")


def operator_rows(events, on_device: bool, steps: int) -> list[dict]:
    """Every operator of a profiler's ``key_averages()`` with time, per step: ``name``,
    ``self_time_s`` (self device time when ``on_device``, else self CPU time), ``calls`` and
    ``flops`` (None where the profiler has no formula)."""
    rows = []
    for evt in events:
        if not _is_operator(evt):
            continue
        micros = evt.self_device_time_total if on_device else evt.self_cpu_time_total
        flops = getattr(evt, "flops", 0) or 0
        if micros <= 0 and not flops:
            continue
        rows.append({"name": evt.key, "self_time_s": micros / 1e6 / steps,
                     "calls": evt.count / steps, "flops": flops / steps if flops else None})
    return rows


def trace_steps(program, path_prefix: str | Path) -> dict:
    """Profile ``TRACE_WARMUP`` + ``TRACE_STEPS`` steps of ``program`` (a ``CaseProgram``),
    write its Chrome trace, and return its operators (``operator_rows``) with the recorded
    steps' wall time."""
    import torch
    from torch.profiler import ProfilerActivity, schedule

    case = program.case
    on_device = case.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    path = trace_path(path_prefix, program.rank, program.cfg.multiprocess)
    path.parent.mkdir(parents=True, exist_ok=True)
    wall = 0.0
    with case.precision.math_mode(), torch.profiler.profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=TRACE_WARMUP, active=TRACE_STEPS, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
            with_flops=True) as prof:
        for i in range(TRACE_WARMUP + TRACE_STEPS):
            start = time.perf_counter()
            case.synced_step()
            if i >= TRACE_WARMUP:
                wall += time.perf_counter() - start
            prof.step()
    return {"file": path.name, "ops": operator_rows(prof.key_averages(), on_device, TRACE_STEPS),
            "step_time_s": wall / TRACE_STEPS, "time": "device" if on_device else "cpu"}


def top_ops(traced: list[dict], k: int = TOP_K) -> list[dict]:
    """The ``k`` operators with the most self time per step over all processes of a case (a
    name's times added over ranks), each with its ``share`` of the step: its time over the
    processes' step times added up, or over the operators' total time where operators overlap
    (threads, CUDA streams), so that the shares never add up to more than 1."""
    merged: dict[str, dict] = {}
    for rank in traced:
        for row in rank["ops"]:
            m = merged.setdefault(row["name"], {"name": row["name"], "self_time_s": 0.0,
                                                "calls": 0.0, "flops": None})
            m["self_time_s"] += row["self_time_s"]
            m["calls"] += row["calls"]
            if row["flops"]:
                m["flops"] = (m["flops"] or 0) + row["flops"]
    step = sum(rank["step_time_s"] for rank in traced)
    total = max(step, sum(m["self_time_s"] for m in merged.values()))
    rows = sorted(merged.values(), key=lambda m: m["self_time_s"], reverse=True)[:k]
    return [{**m, "share": m["self_time_s"] / total if total > 0 else 0.0,
             "calls": round(m["calls"], 2),
             "flops": int(m["flops"]) if m["flops"] else None} for m in rows]


def trace_case(group, cfg, trace_dir: str | Path) -> dict:
    """Trace every process of the case through its launcher ``group`` (after its timed
    rounds); the record's ``top_ops``, ``top_ops_time`` ("device" or "cpu") and
    ``trace_files`` (names inside ``trace_dir``)."""
    traced = group.call("trace", str(Path(trace_dir) / cfg.id))
    return {"top_ops": top_ops(traced), "top_ops_time": traced[0]["time"],
            "trace_files": [t["file"] for t in traced]}


# -- the report: operators whose time changed most against the baseline ------------------------

CHANGED_OPS = 5
"""Operators listed per case in the report's comparison."""

OP_COLUMNS = ("operator", "baseline (ms)", "case (ms)", "change")


def _ops_by_name(value) -> dict[str, float] | None:
    if not isinstance(value, list) or not value:
        return None
    return {r["name"]: float(r.get("self_time_s") or 0.0) for r in value if isinstance(r, dict)
            and isinstance(r.get("name"), str)}


def op_changes(base_ops: list[dict], case_ops: list[dict], n: int = CHANGED_OPS) -> list[dict]:
    """The ``n`` operators whose self time per step moved most (in seconds) between the
    baseline's and a case's ``top_ops``; an operator missing from one top list counts as 0
    there (it was below that list's top k)."""
    base, case = _ops_by_name(base_ops) or {}, _ops_by_name(case_ops) or {}
    rows = [{"name": name, "base_s": base.get(name, 0.0), "case_s": case.get(name, 0.0),
             "in_base": name in base, "in_case": name in case}
            for name in dict.fromkeys([*base, *case])]
    rows.sort(key=lambda r: abs(r["case_s"] - r["base_s"]), reverse=True)
    return rows[:n]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def op_changes_markdown(df) -> str:
    """For each traced precision case (each other traced case when a run has none) against
    its run's traced FP32 baseline: the operators whose time per step changed most. Empty when
    no case was traced."""
    from gpubench.util.tables import markdown_table  # pandas: only where a report is written

    if "top_ops" not in df:
        return ""
    traced = df[df["top_ops"].map(lambda v: isinstance(v, list) and len(v) > 0)]
    if traced.empty:
        return ""
    parts = []
    for (run, _model), g in traced.groupby(["run", "model"], sort=False):
        base = g[g["is_baseline"] == True]  # noqa: E712
        if base.empty:
            continue
        base_row = base.iloc[0]
        others = g[g["is_baseline"] != True]  # noqa: E712
        if "group" in g and (others["group"] == "precision").any():
            others = others[others["group"] == "precision"]
        kind = base_row.get("top_ops_time") or "cpu"
        for _, row in others.iterrows():
            rows = []
            for c in op_changes(base_row["top_ops"], row["top_ops"]):
                ratio = ("new in top ops" if not c["in_base"] else
                         "left top ops" if not c["in_case"] else
                         f"{c['case_s'] / c['base_s']:.2f}x" if c["base_s"] > 0 else "-")
                rows.append({"operator": f"`{c['name']}`", "baseline (ms)": _ms(c["base_s"]),
                             "case (ms)": _ms(c["case_s"]), "change": ratio})
            table = markdown_table(rows, ["left", "right", "right", "right"], OP_COLUMNS)
            parts.append(f"#### {row['case_id']} vs {base_row['case_id']} ({run}, self {kind} "
                         f"time per step)\n\n{table}\n")
    return "\n".join(parts)


def shares_ok(rows: list[dict]) -> bool:
    """Whether ``top_ops`` shares are each in [0, 1] and add up to at most 1."""
    shares = [r["share"] for r in rows]
    return all(0 <= s <= 1 for s in shares) and math.fsum(shares) <= 1 + 1e-9
