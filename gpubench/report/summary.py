"""The readable summary table of a run: one line per case, the baseline's figures as reference."""

from __future__ import annotations

import math
import re

import pandas as pd

from gpubench.analysis.results import numbers, twin, with_baseline_ratios
from gpubench.util import tables
from gpubench.util.tables import figures_table

COLUMNS = {
    "case_id": "case",
    "step_time_ms": "median step (ms)",
    "iqr_ms": "IQR (ms)",
    "samples_per_s": "samples/s",
    "baseline_samples_per_s": "fp32 samples/s alongside",
    "global_batch": "global batch",
    "peak_memory_mib": "peak mem (MiB)",
    "step_memory_mib": "step mem (MiB)",
    "speedup": "speedup vs fp32",  # samples/s over the fp32 samples/s alongside
    "speedup_ci": "95% interval",
    "memory_ratio": "train mem vs fp32",
    "mfu": "MFU",
    "scaling_efficiency": "scaling eff.",
    "flags": "flags",
}


def summary_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The summary columns, sorted by run, model and speedup (fastest first)."""
    df = with_baseline_ratios(df[df["step_time_s"].notna()])
    own_base = (df["is_baseline"] == True).fillna(False).astype(bool).tolist()  # noqa: E712
    out = pd.DataFrame(
        {
            "run": df["run"],
            "model": df["model"],
            "case_id": df["case_id"],
            "step_time_ms": df["step_time_s"] * 1e3,
            "iqr_ms": df.get("step_time_iqr_s", pd.Series(math.nan, index=df.index)) * 1e3,
            "samples_per_s": df["samples_per_s"],
            "global_batch": df["global_batch"],
            "batch_factor": df["batch_factor"],
            # CPU: the training peak above the resident base before the model was built (the
            # figure a user's loop measures the same way), where the record has it.
            "peak_memory_mib": numbers(
                df.get("peak_above_base_bytes", pd.Series(math.nan, index=df.index)))
            .fillna(numbers(df["peak_memory_bytes"])) / 2**20,
            "step_memory_mib": df.get("step_memory_bytes", pd.Series(math.nan, index=df.index))
            .astype(float)
            / 2**20,
            "baseline_samples_per_s": df["baseline_samples_per_s"],
            # The baseline reads 1.00x, as everywhere; its interval column gives the range of
            # its paired ratio against its own copy: the run's noise floor.
            "speedup": df["speedup"],
            "speedup_ci": [
                (f"baseline (noise {lo:.2f}-{hi:.2f})" if is_base else f"{lo:.2f}-{hi:.2f}")
                if method == "paired" and lo == lo else "baseline" if is_base else
                (("separate runs" if run == base_run else f"separate runs (baseline: {base_run})")
                 if sp == sp else "-")
                for lo, hi, method, sp, run, base_run, is_base in zip(
                    df["speedup_low"], df["speedup_high"], df["speedup_method"], df["speedup"],
                    df["run"], df["baseline_run"], own_base, strict=True)],
            "memory_ratio": df["memory_ratio"],
            "mfu": [_mfu_shown(m, ops, h, f8) for m, ops, h, f8 in zip(
                df["mfu"], df["uncounted_ops"] if "uncounted_ops" in df else [None] * len(df),
                df["hfu"] if "hfu" in df else [None] * len(df),
                df["mfu_fp8"] if "mfu_fp8" in df else [None] * len(df), strict=True)],
            # Single-device cases scale perfectly by definition: show the figure only where
            # it says something.
            "scaling_efficiency": df["scaling_efficiency"].where(df["parallel"] != "single"),
            "flags": df["flags"],
        }
    )
    return out.sort_values(["run", "model", "speedup"], ascending=[True, True, False])


def _mfu_shown(mfu, uncounted, hfu=None, mfu_fp8=None) -> object:
    """The MFU figure (model FLOPs), with the HFU (hardware FLOPs) beside it where the two
    differ by more than 1% (recomputation: checkpointing, fused attention); or "n/a" naming
    the heavy ops the FLOP count missed (an LSTM's ``aten.mkldnn_rnn_layer``): a count that
    leaves out the work makes any MFU wrong. An FP8 case measured on FP8 units also shows its
    MFU against the float8 matmul's peak (``mfu`` is against bf16's)."""
    if isinstance(uncounted, list | tuple) and uncounted:
        return f"n/a ({', '.join(uncounted)} not counted)"
    if isinstance(mfu_fp8, float) and mfu_fp8 == mfu_fp8 and isinstance(mfu, float):
        return f"{100 * mfu:.1f}% of bf16 peak, {100 * mfu_fp8:.1f}% of FP8's"
    if (isinstance(mfu, float) and isinstance(hfu, float) and mfu == mfu and hfu == hfu
            and mfu > 0 and abs(hfu / mfu - 1) > 0.01):
        return f"{100 * mfu:.1f}% (HFU {100 * hfu:.1f}%)"
    return mfu


def _set(frame: pd.DataFrame, column: str) -> pd.Series:
    """A boolean column as plain bools (missing or <NA>: False)."""
    if column not in frame:
        return pd.Series(False, index=frame.index)
    return frame[column].astype(object).eq(True)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def _overhead_intervals(frame: pd.DataFrame, figure: str) -> list[str]:
    """Each row's 95% interval of an overhead figure (``harness_overhead``,
    ``telemetry_overhead``), as the overhead column writes the figure ("-" for a record written
    before it was recorded)."""

    def shown(row: pd.Series) -> str:
        low, high = _number(row.get(f"{figure}_low")), _number(row.get(f"{figure}_high"))
        if low is None or high is None:
            return "-"
        return (f"{tables.format_figure(low, 'harness_overhead')} to "
                f"{tables.format_figure(high, 'harness_overhead')}")

    return [shown(row) for _, row in frame.iterrows()]


def storage_markdown(df: pd.DataFrame) -> str:
    """Per run: the storage probe of the data folder (``machine_info.gpubench.storage``) and
    each cold loader case (``LoaderConfig.cold``) beside its warm twin (the same configuration
    in every field but ``cold``: ``results.twin``): step time, stall, and the share of the
    files' pages the eviction left cached. Empty when a run has neither."""
    parts = []
    for run, g in df.groupby("run", sort=False):
        lines = []
        probe = g[g["storage_read_mb_s"].notna()] if "storage_read_mb_s" in g else g.iloc[:0]
        if not probe.empty:
            r = probe.iloc[0]
            text = f"Data folder's disk ({run}): {r['storage_read_mb_s']:,.0f} MB/s sequential"
            for column, what in (("storage_cached_mb_s", "MB/s from the page cache"),
                                 ("storage_random_iops", "random 4 KiB reads/s (cold)")):
                if _number(r.get(column)) is not None:
                    text += f", {r[column]:,.0f} {what}"
            if isinstance(r.get("storage_fs"), str):
                text += f"; {r['storage_fs']}"
            if isinstance(r.get("storage_note"), str):
                text += f"; {r['storage_note']}"
            lines.append(text + ".\n")
        cold = g[_set(g, "cold") & g["step_time_s"].notna()]
        rows = []
        for _, c in cold.iterrows():
            w = twin(g, c, vary=("cold",))  # the same configuration read warm
            rows.append({
                "case_id": c["case_id"],
                "cold_ms": c["step_time_s"] * 1e3,
                "warm_ms": w["step_time_s"] * 1e3 if w is not None else math.nan,
                "cold_stall": c.get("loader_stall_fraction"),
                "warm_stall": w.get("loader_stall_fraction") if w is not None else math.nan,
                "resident": c.get("cold_resident_fraction"),
            })
        if rows:
            frame = pd.DataFrame(rows).astype({k: float for k in ("cold_stall", "warm_stall",
                                                                    "resident")})
            for k in ("cold_stall", "warm_stall", "resident"):
                frame[k] = [f"{v:.0%}" if v == v else "-" for v in frame[k]]
            lines.append(figures_table(frame, {
                "case_id": "cold case", "cold_ms": "median step (ms)",
                "warm_ms": "warm twin (ms)", "cold_stall": "stall", "warm_stall": "warm stall",
                "resident": "cached after eviction"}) + "\n")
        if lines:
            parts.append("\n".join(lines))
    if not parts:
        return ""
    return ("### Storage: the data folder's disk, and the loader read cold\n\n"
            + "\n".join(parts))


PHASES = {
    "build": "building cases (rank processes started where not reused)",
    "prepare": "data path to steady state, loader probe",
    "check": "training check (FP32 reference, 3 steps; the first counts FLOPs)",
    "count": "FLOP and saved-activation count (where the check did not)",
    "warmup": "warm-up rounds (the in-process case's memory window)",
    "partner": "building the paired baseline beside the case",
    "untimed_rounds": ("in the timed window, untimed (the first step after each switch of "
                       "side, the stopping rule's intervals, a multi-process case's window "
                       "warm-up step; with --partner worker, the worker's start and offset)"),
    "finish": "all-reduce probe, records",
    "close": "closing cases",
    "trace": "profiling (--trace)",
}
"""The parts of each case's measurement (``harness_s`` in its record, ``measure.Phases``)."""


def timed_seconds(frame: pd.DataFrame) -> tuple[float, float]:
    """(seconds of the records' own timed rounds, seconds of their paired baseline rounds)."""
    own = sum(sum(r) for r in frame["rounds_s"].dropna())
    paired = (sum(sum(r) for r in frame["paired_baseline_rounds_s"].dropna())
              if "paired_baseline_rounds_s" in frame else 0.0)
    return own, paired


RUN_COST_COLUMNS = ["run", "part", "seconds", "share"]


def run_cost(df: pd.DataFrame) -> pd.DataFrame:
    """Per run, seconds of the cases' timed rounds, of their paired baseline rounds and of each
    untimed part (``PHASES``), summed over the step records, with each one's share."""
    steps = df[(df["kind"] == "step") & df["step_time_s"].notna()] if "kind" in df else df.iloc[:0]
    if steps.empty or "harness_s" not in steps:
        return pd.DataFrame(columns=RUN_COST_COLUMNS)
    rows = []
    for run, group in steps.groupby("run", sort=False):
        phases: dict[str, float] = {}
        for h in group["harness_s"].dropna():
            for k, v in h.items():
                phases[k] = phases.get(k, 0.0) + float(v)
        if not phases:
            continue
        timed, paired = timed_seconds(group)
        parts = {"timed rounds of the cases": timed, "paired baseline rounds": paired}
        phases["untimed_rounds"] = max(0.0, phases.pop("rounds", 0.0) - timed - paired)
        parts.update({PHASES.get(k, k): v for k, v in phases.items() if v > 0})
        total = sum(parts.values())
        rows += [{"run": run, "part": k, "seconds": v, "share": v / total}
                 for k, v in parts.items()]
    return pd.DataFrame(rows, columns=RUN_COST_COLUMNS)


def run_cost_markdown(df: pd.DataFrame) -> str:
    """Where the cases' time went (``run_cost``), one table per run; empty without records of
    their phases (results written before they were recorded)."""
    cost = run_cost(df)
    parts = []
    for run, group in cost.groupby("run", sort=False):
        total = group["seconds"].sum()
        timed = group["seconds"].iloc[:2].sum()
        cells = group.assign(seconds=group["seconds"].map(lambda v: f"{v:.1f}"),
                             share=group["share"].map(lambda v: f"{v:.0%}"))
        parts.append(
            f"### Where the cases' time went ({run})\n\n"
            f"{total:.0f} s in the step cases, {timed / total:.0%} of it timed rounds (the "
            "cases' and their paired baseline's); pytest's start, the claims pairs and the "
            "harness checks come on top.\n\n"
            + tables.markdown_table(cells[["part", "seconds", "share"]],
                                    ["left", "right", "right"]) + "\n")
    return "\n".join(parts)


def compile_markdown(df: pd.DataFrame) -> str:
    """What torch.compile cost each compiled case: its compile time, the seconds each step
    saves against the same configuration uncompiled (``with_compile_break_even``: its twin,
    named), the steps after which it pays off, the recompiles. Where that twin was not
    measured, the table says so rather than compare with another configuration."""
    if "compile_time_s" not in df:
        return ""
    if df["compile_time_s"].dropna().empty:
        return ""
    rows = with_baseline_ratios(df[df["step_time_s"].notna()]).dropna(subset=["compile_time_s"])
    if rows.empty:
        return ""

    def pays_off(row) -> str:
        if pd.notna(row["break_even_steps"]):
            return f"{row['break_even_steps']:,.0f}"
        if isinstance(row["break_even_against"], str):
            return "never (no saving)"
        return "not known (uncompiled twin not measured)"

    saved = (rows["uncompiled_step_time_s"] - rows["step_time_s"]) * 1e3
    rows = rows.assign(compile_s=rows["compile_time_s"], step_ms=rows["step_time_s"] * 1e3,
                       saved_ms=saved,
                       against=rows["break_even_against"].map(
                           lambda v: v if isinstance(v, str) else "-"),
                       break_even=[pays_off(r) for _, r in rows.iterrows()])
    cols = {"case_id": "case", "compile_s": "compile time (s)", "step_ms": "step (ms)",
            "against": "uncompiled twin", "saved_ms": "saved per step (ms)",
            "break_even": "pays off after (steps)", "dynamo_recompiles": "recompiles"}
    return ("### torch.compile: what compiling costs and when it pays off\n\n"
            "Against the same configuration uncompiled (its twin), never the fp32 baseline "
            "of another precision.\n\n"
            + figures_table(rows, cols) + "\n")


def nodes_markdown(df: pd.DataFrame) -> str:
    """Scaling across nodes: ``gpubench dist`` records (those naming their ``nodes``) of one
    model and case kind (the case id without its world size), from every run given (a job
    each), by node count where a kind ran at several or on more than one node; "vs fewest
    nodes" is samples/s per node against the kind's smallest node count (1.0: the extra nodes
    add their full share; below: the network between them costs)."""
    if "nodes" not in df:
        return ""
    rows = df[df["nodes"].notna() & df["step_time_s"].notna()].copy()
    if rows.empty:
        return ""
    rows["nodes"] = rows["nodes"].astype(int)
    rows["kind"] = [re.sub(rf"-({p})\d+", r"-\1", c) for c, p in
                    zip(rows["case_id"], rows["parallel"], strict=True)]
    per_node = rows["samples_per_s"] / rows["nodes"]
    key = ["model", "device", "kind"]
    fewest = rows.groupby(key)["nodes"].transform("min")
    base = per_node.where(rows["nodes"] == fewest).groupby(
        [rows[k] for k in key]).transform("max")
    rows = rows.assign(per_node=per_node, vs_fewest=per_node / base)
    spread = rows.groupby(key)["nodes"].transform("nunique")
    rows = rows[(spread > 1) | (rows["nodes"] > 1)]
    if rows.empty:
        return ""
    cols = {"kind": "case", "nodes": "nodes", "world_size": "ranks",
            "tasks_per_node": "ranks/node", "samples_per_s": "samples/s",
            "per_node": "samples/s per node", "vs_fewest": "vs fewest nodes",
            "job_id": "job", "run": "run"}
    parts = [f"### {model} on {device}: scaling across nodes\n\n"
             + figures_table(g.sort_values(["kind", "nodes"]), cols) + "\n"
             for (model, device), g in rows.groupby(["model", "device"], sort=False)]
    return "\n".join(parts)


def summary_markdown(df: pd.DataFrame) -> str:
    """One Markdown section per run and model, then the storage section (``storage_markdown``)
    where a run has one."""
    frame = summary_frame(df)
    parts = []
    # The mark of a case that changes the effective batch, wherever it is ranked.
    frame = frame.assign(global_batch=[
        "-" if gb != gb else f"{gb:.0f}" + (f" (x{f:g})" if f == f and f != 1 else "")
        for gb, f in zip(numbers(frame["global_batch"]), numbers(frame["batch_factor"]),
                         strict=True)])
    for (run, model), group in frame.groupby(["run", "model"], sort=False):
        parts.append(f"### {model} ({run})\n\n{figures_table(group, COLUMNS)}\n")
    compiled = compile_markdown(df)
    if compiled:
        parts.append(compiled)
    across = nodes_markdown(df)
    if across:
        parts.append(across)
    storage = storage_markdown(df)
    if storage:
        parts.append(storage)
    over = df.dropna(subset=["harness_overhead"]) if "harness_overhead" in df else df.iloc[:0]
    if not over.empty:
        cols = {"case_id": "case", "gpubench_ms": "gpubench step (ms)",
                "handwritten_ms": "hand-written step (ms)", "harness_overhead": "overhead",
                "interval": "95% interval"}
        over = over.assign(gpubench_ms=over["gpubench_step_time_s"] * 1e3,
                           handwritten_ms=over["handwritten_step_time_s"] * 1e3,
                           interval=_overhead_intervals(over, "harness_overhead"))
        parts.append("### Harness overhead (interleaved rounds)\n\n"
                     + figures_table(over, cols) + "\n")
    if "telemetry_overhead" in df:
        tele = df.dropna(subset=["telemetry_overhead"])
        if not tele.empty:
            tele = tele.assign(on_ms=tele["telemetry_on_step_time_s"] * 1e3,
                               off_ms=tele["telemetry_off_step_time_s"] * 1e3,
                               sample_us=tele["telemetry_sample_cpu_s"] * 1e6,
                               harness_overhead=tele["telemetry_overhead"],
                               interval=_overhead_intervals(tele, "telemetry_overhead"))
            cols = {"case_id": "case", "on_ms": "step, sampling (ms)",
                    "off_ms": "step, not sampling (ms)", "harness_overhead": "overhead",
                    "interval": "95% interval", "sample_us": "CPU per sample (us)"}
            parts.append("### Telemetry sampling cost (alternating rounds)\n\n"
                         + figures_table(tele, cols) + "\n")
    procs = (df.dropna(subset=["process_overhead_s"]) if "process_overhead_s" in df
             else df.iloc[:0])
    if not procs.empty:
        procs = procs.assign(overhead_us=procs["process_overhead_s"] * 1e6)
        cols = {"case_id": "case", "world_size": "processes",
                "overhead_us": "per-step command round trip (us)"}
        parts.append("### Multi-process machinery (no-op step)\n\n"
                     + figures_table(procs, cols) + "\n")
    cost = run_cost_markdown(df)
    if cost:
        parts.append(cost)
    if not parts:
        return "No measured cases.\n"
    return "\n".join(parts)


