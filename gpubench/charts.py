"""Comparative seaborn charts. Each ``plot_*`` takes the tidy results and returns a figure, or
raises ``CannotPlot`` saying why the data does not allow it (the report then notes it)."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from gpubench.results import with_baseline_ratios  # noqa: E402

MIB = 2**20


class CannotPlot(Exception):
    """The results lack what a chart needs; the message says what."""


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    df = df[df["step_time_s"].notna()]
    if df.empty:
        raise CannotPlot("no measured cases")
    return df


def speedup_interval(
    rounds: list[float], base_rounds: list[float], *, samples_ratio: float = 1.0,
    n_boot: int = 1000, seed: int = 0,
) -> tuple[float, float]:
    """95% bootstrap interval of the speedup from raw rounds: (median baseline time / median case
    time) x (case global batch / baseline global batch)."""
    if not rounds or not base_rounds:
        return (np.nan, np.nan)
    rng = np.random.default_rng(seed)
    a, b = np.asarray(rounds), np.asarray(base_rounds)
    ratios = np.median(rng.choice(b, (n_boot, b.size)), axis=1) / np.median(
        rng.choice(a, (n_boot, a.size)), axis=1
    )
    return tuple(samples_ratio * np.percentile(ratios, [2.5, 97.5]))


def _with_intervals(df: pd.DataFrame) -> pd.DataFrame:
    df = with_baseline_ratios(df)
    keys = ["run", "model", "profile", "device"]
    base = df[df["is_baseline"] == True].drop_duplicates(keys)  # noqa: E712
    base_rounds = {tuple(r[k] for k in keys): r["rounds_s"] for _, r in base.iterrows()}
    lo, hi = [], []
    for _, r in df.iterrows():
        rounds = r["rounds_s"] if isinstance(r["rounds_s"], list) else []
        br = base_rounds.get(tuple(r[k] for k in keys))
        interval = speedup_interval(rounds, br if isinstance(br, list) else [],
                                    samples_ratio=r["global_batch"] / r["base_global_batch"])
        lo.append(interval[0])
        hi.append(interval[1])
    return df.assign(speedup_lo=lo, speedup_hi=hi)


def plot_speedup(df: pd.DataFrame) -> plt.Figure:
    """Speedup of every case over its FP32 baseline, with 95% bootstrap intervals."""
    df = _with_intervals(_measured(df)).dropna(subset=["speedup"])
    if df.empty:
        raise CannotPlot("no case has a measured FP32 baseline to compare with")
    models = list(dict.fromkeys(df["model"]))
    heights = [max(2.0, 0.28 * df[df["model"] == m]["case_id"].nunique() + 1) for m in models]
    fig, axes = plt.subplots(
        len(models), 1, figsize=(9, sum(heights)), squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, model in zip(axes[:, 0], models, strict=True):
        sub = df[df["model"] == model].sort_values("speedup", ascending=False)
        order = list(dict.fromkeys(sub["case_id"]))
        sns.barplot(data=sub, y="case_id", x="speedup", hue="run", order=order, ax=ax,
                    errorbar=None, orient="h")
        if sub["run"].nunique() == 1:
            pos = {c: i for i, c in enumerate(order)}
            y = sub["case_id"].map(pos)
            err = np.vstack(
                [sub["speedup"] - sub["speedup_lo"], sub["speedup_hi"] - sub["speedup"]]
            )
            ax.errorbar(sub["speedup"], y, xerr=np.nan_to_num(err.clip(min=0)), fmt="none",
                        ecolor="black", capsize=2, lw=0.8)
            if ax.get_legend():
                ax.get_legend().remove()
        ax.axvline(1.0, color="crimson", ls="--", lw=1, label="fp32 baseline")
        ax.set_title(f"{model}: speedup over the FP32 baseline (higher is faster; 95% CI)")
        ax.set_xlabel("speedup (case samples/s / baseline samples/s, from median step times)")
        ax.set_ylabel("")
    fig.tight_layout()
    return fig


def plot_memory(df: pd.DataFrame) -> plt.Figure:
    """Peak memory per case, split into parameters, gradients, optimizer state and the rest."""
    df = _measured(df).dropna(subset=["peak_memory_bytes"])
    if df.empty:
        raise CannotPlot("no case recorded peak memory")
    df = df[df["run"] == df["run"].iloc[0]]
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(len(models), 1, figsize=(9, 0.3 * len(df) + 1.5 * len(models)),
                             squeeze=False)
    parts = {"param_bytes": "parameters", "grad_bytes": "gradients",
             "optimizer_state_bytes": "optimizer state"}
    for ax, model in zip(axes[:, 0], models, strict=True):
        sub = df[df["model"] == model].sort_values("peak_memory_bytes")
        left = np.zeros(len(sub))
        for col, label in parts.items():
            vals = sub.get(col, pd.Series(0, index=sub.index)).fillna(0).to_numpy() / MIB
            ax.barh(sub["case_id"], vals, left=left, label=label)
            left += vals
        peak = sub["peak_memory_bytes"].to_numpy(float) / MIB
        step = sub.get("step_memory_bytes", pd.Series(0, index=sub.index)).fillna(0)
        step = np.minimum(step.to_numpy(float) / MIB, peak)
        held = np.clip(peak - step - left, 0, None)
        ax.barh(sub["case_id"], held, left=left, color="0.85",
                label="other memory held before the step (process, buffers)")
        ax.barh(sub["case_id"], step, left=left + held, color="tab:red", alpha=0.7,
                label="added by the step (activations, temporaries)")
        method = sub["peak_memory_method"].iloc[0] if "peak_memory_method" in sub else ""
        ax.set_title(f"{model}: peak memory per case ({method})")
        ax.set_xlabel("MiB")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    return fig


def pareto_front(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Rows not dominated by another with lower-or-equal ``x`` and higher-or-equal ``y``."""
    pts = points.sort_values([x, y], ascending=[True, False])
    best, keep = -np.inf, []
    for idx, row in pts.iterrows():
        if row[y] > best:
            keep.append(idx)
            best = row[y]
    return pts.loc[keep]


def plot_pareto(df: pd.DataFrame) -> plt.Figure:
    """Throughput against peak memory; the line joins the configurations nothing beats on both."""
    df = _measured(df).dropna(subset=["peak_memory_bytes", "samples_per_s"])
    if df.empty:
        raise CannotPlot("no case has both throughput and peak memory")
    df = df.assign(peak_mib=df["peak_memory_bytes"].astype(float) / MIB)
    g = sns.relplot(data=df, x="peak_mib", y="samples_per_s", hue="precision", style="run",
                    col="model", col_wrap=min(3, df["model"].nunique()), kind="scatter",
                    facet_kws={"sharex": False, "sharey": False}, height=3.5)
    for model, ax in g.axes_dict.items():
        sub = df[df["model"] == model]
        front = pareto_front(sub, "peak_mib", "samples_per_s")
        ax.plot(front["peak_mib"], front["samples_per_s"], color="black", lw=1,
                label="Pareto front")
        for _, r in front.iterrows():
            ax.annotate(r["case_id"].removeprefix(f"{model}-"), (r["peak_mib"], r["samples_per_s"]),
                        fontsize=6)
        ax.set_xlabel("peak memory (MiB)")
        ax.set_ylabel("samples/s")
    g.figure.suptitle("Throughput vs peak memory (up and left is better)", y=1.02)
    return g.figure


def plot_accumulation(df: pd.DataFrame) -> plt.Figure:
    """Peak memory and throughput against accumulation steps k, at fixed effective batch and at
    fixed micro-batch."""
    df = _measured(df)
    if "group" not in df:
        raise CannotPlot("results carry no case groups")
    picked = (df["group"] == "accumulation") | (df["is_baseline"] == True)  # noqa: E712
    df = df[picked & (df["precision"] == "fp32")]
    if df["accum_steps"].nunique() < 2:
        raise CannotPlot("no gradient-accumulation cases (need at least two values of k)")
    base = df[df["is_baseline"] == True].groupby("model")  # noqa: E712
    same_global = df["global_batch"] == df["model"].map(base["global_batch"].first())
    same_micro = df["micro_batch"] == df["model"].map(base["micro_batch"].first())
    # The k=1 baseline belongs to both lines.
    data = pd.concat([
        df[same_global].assign(mode="constant effective batch"),
        df[same_micro].assign(mode="constant micro-batch"),
    ])
    # Older results lack the step's own memory; fall back to the peak.
    mem = "step_memory_bytes" if data.get("step_memory_bytes") is not None else "peak_memory_bytes"
    data["step_mib"] = data[mem].astype(float) / MIB
    long = data.melt(id_vars=["model", "accum_steps", "mode", "run"],
                     value_vars=["step_mib", "samples_per_s"], var_name="metric")
    g = sns.relplot(data=long, x="accum_steps", y="value", hue="mode", style="run", row="metric",
                    col="model", kind="line", marker="o",
                    facet_kws={"sharey": False, "sharex": True}, height=2.8)
    g.set_axis_labels("accumulation steps k", "")
    for (metric, model), ax in g.axes_dict.items():
        unit = "step memory (MiB)" if metric == "step_mib" else "samples/s (global batch)"
        ax.set_title(model, fontsize="medium")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel(unit)
    g.figure.suptitle(
        "Gradient accumulation vs k: memory the step adds above its resting state (top), "
        "throughput (bottom)", y=1.03)
    return g.figure


def plot_scaling(df: pd.DataFrame) -> plt.Figure:
    """Throughput and scaling efficiency against world size."""
    df = with_baseline_ratios(_measured(df))
    par = df[df["parallel"] != "single"].dropna(subset=["scaling_efficiency"])
    if par.empty:
        raise CannotPlot("no parallel cases with a measured single-device counterpart")
    # One line per configuration across world sizes ("fp32-ddp" joins ddp2, ddp4, ddp8),
    # starting from its single-device counterpart at world size 1.
    par = par.assign(line=[
        re.sub(rf"-{p}\d+", f"-{p}", c.removeprefix(f"{m}-"))
        for c, p, m in zip(par["case_id"], par["parallel"], par["model"], strict=True)
    ])
    singles = df.set_index(["run", "case_id"])
    rows = [par]
    for _, p in par.iterrows():
        key = (p["run"], p["single_case_id"])
        if key in singles.index:
            rows.append(singles.loc[[key]].reset_index().assign(line=p["line"], world_size=1))
    data = pd.concat(rows, ignore_index=True)
    fig, axes = plt.subplots(2, data["model"].nunique(), squeeze=False,
                             figsize=(5 * data["model"].nunique(), 7))
    for col, model in enumerate(dict.fromkeys(data["model"])):
        sub = data[data["model"] == model]
        for row, (metric, label) in enumerate([("samples_per_s", "samples/s (global batch)"),
                                               ("scaling_efficiency", "scaling efficiency")]):
            ax = axes[row, col]
            sns.lineplot(data=sub, x="world_size", y=metric, hue="line", style="run",
                         marker="o", ax=ax, errorbar=None)
            ax.set_title(f"{model}: {label}")
            ax.set_xlabel("world size (devices or processes)")
            ax.set_ylabel(label)
            ax.xaxis.get_major_locator().set_params(integer=True)
            if metric == "scaling_efficiency":
                ax.axhline(1.0, color="crimson", ls="--", lw=1)
    fig.suptitle("Parallel scaling vs the single-device case with the same per-device batch")
    fig.tight_layout()
    return fig


def plot_loader(df: pd.DataFrame) -> plt.Figure:
    """Loader stall fraction and throughput across num_workers x pin_memory."""
    df = _measured(df)
    if "loader_stall_fraction" not in df:
        raise CannotPlot("results carry no loader stall measurements")
    base = df[df["is_baseline"] == True].groupby("model")["micro_batch"].first()  # noqa: E712
    # On-disk data at the default batch, without caching: the num_workers x pin_memory grid.
    grid = df[(df.get("cached", False) != True)  # noqa: E712
              & df["dataset"].isin(["images-jpeg", "tokens-mmap"])
              & (df["micro_batch"] == df["model"].map(base))
              & df["prefetch_factor"].isna() & (df["persistent_workers"] != True)  # noqa: E712
              & (df["non_blocking"] != True)]  # noqa: E712
    if grid["num_workers"].nunique() < 2:
        raise CannotPlot("no data-loader cases varying num_workers on on-disk data")
    resident = df[df["dataset"] == "device-resident"].set_index(["run", "model"])["samples_per_s"]
    long = grid.melt(id_vars=["model", "num_workers", "pin_memory", "run", "dataset"],
                     value_vars=["samples_per_s", "loader_samples_per_s", "loader_stall_fraction"],
                     var_name="metric")
    g = sns.relplot(data=long, x="num_workers", y="value", hue="pin_memory", style="run",
                    row="metric", col="model", kind="line", marker="o",
                    facet_kws={"sharey": False}, height=2.8, aspect=1.3)
    labels = {"samples_per_s": "training samples/s",
              "loader_samples_per_s": "loader-only samples/s",
              "loader_stall_fraction": "share of step time waiting for data"}
    for (metric, model), ax in g.axes_dict.items():
        ax.set_title(f"{model}: {labels[metric]}", fontsize="medium")
        ax.set_ylabel(labels[metric])
        ax.xaxis.get_major_locator().set_params(integer=True)
        if metric == "samples_per_s":
            for (_run, m), value in resident.items():
                if m == model:
                    ax.axhline(value, color="crimson", ls="--", lw=1)
    g.set_xlabels("DataLoader num_workers")
    g.figure.suptitle("Data loader on on-disk data (dashed: data already on the device)", y=1.02)
    return g.figure


CHARTS = {
    "speedup": plot_speedup,
    "memory": plot_memory,
    "pareto": plot_pareto,
    "accumulation": plot_accumulation,
    "scaling": plot_scaling,
    "loader": plot_loader,
}
"""Chart name -> function; the report draws each into ``<name>.png`` and ``<name>.svg``."""
