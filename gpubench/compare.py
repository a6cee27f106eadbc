"""Regression tracking: compare two runs case by case with a statistical test on the raw rounds.

A case regresses when its time distribution differs significantly (two-sided Mann-Whitney U on
the per-round times, as asv does) *and* its median moved by more than a minimum effect (default 7%
for time, like TorchBench; 2% for peak memory, which is near-deterministic and has no test).
``--normalized`` compares each case's time divided by its own run's FP32 baseline median, which
survives moving to a faster or slower machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from gpubench import atomic
from gpubench.results import load_results, read_benchmark_json, training_memory
from gpubench.summary import markdown_table


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    time: float = 0.07
    """Minimum relative change of median step time that counts."""
    memory: float = 0.02
    """Minimum relative change of peak memory that counts."""
    alpha: float = 0.05
    """Significance level of the Mann-Whitney U test."""


def time_verdict(base: np.ndarray, new: np.ndarray, th: Thresholds) -> tuple[str, float, float]:
    """(verdict, relative change of the median, p-value) for two samples of round times."""
    change = float(np.median(new) / np.median(base) - 1)
    if len(base) < 2 or len(new) < 2:
        return "inconclusive", change, float("nan")
    p = float(mannwhitneyu(base, new, alternative="two-sided").pvalue)
    if p >= th.alpha or abs(change) < th.time:
        return "unchanged", change, p
    return ("regression" if change > 0 else "improvement"), change, p


def memory_verdict(base: float, new: float, th: Thresholds) -> tuple[str, float]:
    if not base or pd.isna(base) or pd.isna(new):
        return "unchanged", float("nan")
    change = new / base - 1
    if abs(change) < th.memory:
        return "unchanged", change
    return ("regression" if change > 0 else "improvement"), change


def _rounds(row: pd.Series, normalize_by: float | None) -> np.ndarray:
    rounds = row.get("rounds_s")
    arr = np.asarray(rounds if isinstance(rounds, list) else [row["step_time_s"]], dtype=float)
    return arr / normalize_by if normalize_by else arr


def _baseline_medians(df: pd.DataFrame) -> dict:
    base = df[df["is_baseline"] == True]  # noqa: E712
    return {(r["model"], r["profile"], r["device"]): r["step_time_s"] for _, r in base.iterrows()}


def compare_runs(
    base: pd.DataFrame, new: pd.DataFrame, th: Thresholds = Thresholds(), normalized: bool = False
) -> pd.DataFrame:
    """One row per case id present in either run, with status and changes. Memory is the
    training memory (``results.training_memory``: exact on the CPU, where the process peak
    wanders between runs), or the peak for records that lack its parts."""
    base, new = (
        df.assign(compared_memory_bytes=training_memory(df).fillna(
            df["peak_memory_bytes"].astype(float)))
        .drop_duplicates("case_id", keep="last").set_index("case_id")
        for df in (base, new)
    )
    base_ref, new_ref = _baseline_medians(base.reset_index()), _baseline_medians(new.reset_index())
    rows = []
    for case in list(dict.fromkeys([*base.index, *new.index])):
        if case not in new.index:
            rows.append({"case_id": case, "status": "removed"})
            continue
        if case not in base.index:
            rows.append({"case_id": case, "status": "added"})
            continue
        b, n = base.loc[case], new.loc[case]
        if pd.isna(b["step_time_s"]) or pd.isna(n["step_time_s"]):
            rows.append({"case_id": case, "status": "skipped"})
            continue
        key = (n["model"], n["profile"], n["device"])
        b_norm = base_ref.get(key) if normalized else None
        n_norm = new_ref.get(key) if normalized else None
        if normalized and (b_norm is None or n_norm is None):
            rows.append({"case_id": case, "status": "skipped", "note": "no baseline to normalize"})
            continue
        verdict, t_change, p = time_verdict(_rounds(b, b_norm), _rounds(n, n_norm), th)
        mem_verdict, m_change = memory_verdict(b["compared_memory_bytes"],
                                               n["compared_memory_bytes"], th)
        status = "regression" if "regression" in (verdict, mem_verdict) else (
            "improvement" if "improvement" in (verdict, mem_verdict) else verdict)
        rows.append({
            "case_id": case, "status": status, "time_change": t_change, "p_value": p,
            "throughput_change": 1 / (1 + t_change) - 1, "memory_change": m_change,
            "base_step_time_s": b["step_time_s"], "new_step_time_s": n["step_time_s"],
            "time_verdict": verdict, "memory_verdict": mem_verdict,
        })
    return pd.DataFrame(rows)


def environment_warnings(base_file: str, new_file: str) -> list[str]:
    """Differences between the two runs' machines and library versions."""
    b = read_benchmark_json(base_file).get("machine_info", {})
    n = read_benchmark_json(new_file).get("machine_info", {})
    out = []
    for key in ("node", "processor", "python_version"):
        if b.get(key) != n.get(key):
            out.append(f"{key} differs: {b.get(key)!r} vs {n.get(key)!r}")
    bg, ng = b.get("gpubench", {}), n.get("gpubench", {})
    for key in ("torch", "cuda", "cudnn", "device_name", "cpu", "torch_threads", "transformers"):
        if bg.get(key) != ng.get(key):
            out.append(f"{key} differs: {bg.get(key)!r} vs {ng.get(key)!r}")
    return out


def github_benchmark_json(new: pd.DataFrame) -> dict[str, list[dict]]:
    """github-action-benchmark series: time and memory (smaller is better), MFU (bigger)."""
    new = new.dropna(subset=["step_time_s"])
    smaller = [
        {"name": f"{r.case_id} step time", "unit": "s", "value": float(r.step_time_s)}
        for r in new.itertuples()
    ] + [
        {"name": f"{r.case_id} peak memory", "unit": "bytes", "value": float(r.peak_memory_bytes)}
        for r in new.itertuples() if not pd.isna(r.peak_memory_bytes)
    ]
    bigger = [
        {"name": f"{r.case_id} MFU", "unit": "fraction", "value": float(r.mfu)}
        for r in new.itertuples() if not pd.isna(r.mfu)
    ]
    return {"customSmallerIsBetter": smaller, "customBiggerIsBetter": bigger}


def write_github_json(results: pd.DataFrame, folder: str | Path) -> list[Path]:
    """``smaller_is_better.json`` and ``bigger_is_better.json`` for github-action-benchmark."""
    payload = github_benchmark_json(results)
    written = []
    for tool, name in (("customSmallerIsBetter", "smaller_is_better.json"),
                       ("customBiggerIsBetter", "bigger_is_better.json")):
        atomic.write_text(Path(folder) / name, json.dumps(payload[tool], indent=1))
        written.append(Path(folder) / name)
    return written


COMPARE_COLUMNS = {
    "case_id": "case",
    "status": "status",
    "time_change": "time",
    "throughput_change": "throughput",
    "memory_change": "peak memory",
    "p_value": "p",
}


def compare_markdown(table: pd.DataFrame) -> str:
    shown = table.reindex(columns=list(COMPARE_COLUMNS)).copy()
    for col in ("time_change", "throughput_change", "memory_change"):
        shown[col] = shown[col].map(lambda v: "-" if pd.isna(v) else f"{100 * v:+.1f}%")
    shown["p_value"] = shown["p_value"].map(lambda v: "-" if pd.isna(v) else f"{v:.3f}")
    return markdown_table(shown.fillna("-"), COMPARE_COLUMNS)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", help="baseline pytest-benchmark JSON")
    p.add_argument("new", help="new pytest-benchmark JSON")
    p.add_argument("--time-threshold", type=float, default=Thresholds.time,
                   help="minimum relative change of median time that counts (default 0.07)")
    p.add_argument("--memory-threshold", type=float, default=Thresholds.memory,
                   help="minimum relative change of peak memory that counts (default 0.02)")
    p.add_argument("--alpha", type=float, default=Thresholds.alpha,
                   help="significance level of the Mann-Whitney U test (default 0.05)")
    p.add_argument("--normalized", action="store_true",
                   help="compare speed relative to each run's own FP32 baseline case")
    p.add_argument("--new-only", action="store_true",
                   help="only cases NEW ran (a partial run): do not list the others as removed")
    p.add_argument("--report-only", action="store_true",
                   help="always exit 0 (for noisy shared machines)")
    p.add_argument("--markdown", help="also write the table as Markdown to this file")
    p.add_argument("--github-json", metavar="DIR",
                   help="write NEW's figures for github-action-benchmark into DIR: "
                   "smaller_is_better.json (time, memory) and bigger_is_better.json (MFU)")


def compare_main(args: argparse.Namespace) -> int:
    th = Thresholds(time=args.time_threshold, memory=args.memory_threshold, alpha=args.alpha)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = load_results([args.base], labels=["base"])
        new = load_results([args.new], labels=["new"])
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for msg in environment_warnings(args.base, args.new):
        print(f"warning: the runs come from different environments: {msg}", file=sys.stderr)
    table = compare_runs(base, new, th, normalized=args.normalized)
    if args.new_only:
        table = table[table["status"] != "removed"]
    text = compare_markdown(table)
    print(text)
    counts = table["status"].value_counts().to_dict()
    print("\n" + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if args.markdown:
        atomic.write_text(args.markdown, text + "\n")
    if args.github_json:
        write_github_json(new, args.github_json)
    regressions = counts.get("regression", 0)
    if regressions and not args.report_only:
        print(f"gpubench compare: {regressions} significant regression(s)", file=sys.stderr)
        return 1
    return 0
