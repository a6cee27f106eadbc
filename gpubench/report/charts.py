"""Comparative charts. Each ``plot_*`` takes the tidy results and returns a figure, or raises
``CannotPlot`` saying why the data does not allow it (the report then notes it).

Conventions every chart follows, so that a chart never contradicts the tables beside it:

- memory is the *training memory* of ``results.training_memory`` (CUDA: the allocator's peak;
  CPU: the exact parameters + gradients + optimizer state + saved activations, per device or
  rank), never the CPU process high-water mark, which is mostly the Python/PyTorch runtime;
- throughput and memory axes start at 0, so that a 7% difference looks like 7%;
- legends sit outside the data, and a run label appears only when several runs are drawn;
- technique groups keep one colour everywhere (``GROUP_COLORS``).
"""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from gpubench.analysis.results import (  # noqa: E402
    BATCH_MARK_NOTE,
    batch_mark,
    same_configuration,
    training_memory,
    with_baseline_ratios,
)
from gpubench.suite.cases import GROUPS  # noqa: E402
from gpubench.util.stats import bootstrap_ratio_ci  # noqa: E402

MIB = 2**20

OTHER_COLOR = "#7f7f7f"
_PALETTE = [c for c in sns.color_palette("tab10").as_hex() if c != OTHER_COLOR] + [
    c for c in sns.color_palette("tab20").as_hex()[1::2] if c != "#c7c7c7"]
GROUP_COLORS = dict(zip(GROUPS, _PALETTE[:len(GROUPS)], strict=True))
"""One colour per technique group (``cases.GROUPS``, the legend order; the record field
``group``): tab10 without its grey, which marks everything else, then tab20's light shades."""
PRECISION_MARKERS = {"fp32": "o", "tf32": "s", "fp16": "^", "bf16": "D"}
BASELINE_COLOR = "black"


class CannotPlot(Exception):
    """The results lack what a chart needs; the message says what."""


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    if "kind" in df:
        df = df[df["kind"].isna() | (df["kind"] == "step")]
    df = df[df["step_time_s"].notna()]
    if df.empty:
        raise CannotPlot("no measured cases")
    return df


def _runs(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["run"]))


def _short(case_id: str, model: str) -> str:
    """The case id without the model prefix its panel already names."""
    return case_id.removeprefix(f"{model}-") if case_id != model else case_id


def group_color(group: object) -> str:
    return GROUP_COLORS.get(group, OTHER_COLOR) if isinstance(group, str) else OTHER_COLOR


def memory_measure(df: pd.DataFrame) -> tuple[pd.Series, str]:
    """(bytes, label): the training memory of each record and what it is for these devices."""
    devices = set(df["device"].dropna())
    if devices == {"cuda"}:
        label = "peak memory, CUDA allocator, per device"
    elif "cuda" not in devices:
        label = "training memory (params + grads + optimizer state + saved activations), per rank"
    else:
        label = "training memory (CUDA: allocator peak; CPU: exact params + grads + state + " \
                "activations), per device"
    return training_memory(df), label


def _process_peak_note(df: pd.DataFrame) -> str:
    """Where the CPU process high-water mark was left out, say so with its range."""
    cpu = df[df["device"] != "cuda"]["peak_memory_bytes"].astype(float).dropna()
    if cpu.empty:
        return ""
    return (f"CPU process high-water mark (not shown: mostly the Python/PyTorch runtime): "
            f"{cpu.min() / MIB:,.0f}-{cpu.max() / MIB:,.0f} MiB")


def _legend_above(fig: plt.Figure, handles: list, ncol: int | None = None,
                  title: str | None = None) -> None:
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=ncol or min(len(handles), 5), frameon=False, fontsize="small",
               title=title, title_fontsize="small")


def speedup_interval(
    rounds: list[float], base_rounds: list[float], *, samples_ratio: float = 1.0,
    n_boot: int = 1000, seed: int = 0,
) -> tuple[float, float]:
    """95% bootstrap interval of the speedup from raw rounds (``stats.bootstrap_ratio_ci``, each
    sample resampled on its own): (median baseline time / median case time) x (case global
    batch / baseline global batch)."""
    if not len(rounds) or not len(base_rounds):
        return (np.nan, np.nan)
    low, high = bootstrap_ratio_ci(base_rounds, rounds, n_resamples=n_boot, seed=seed)
    return samples_ratio * low, samples_ratio * high


def _with_intervals(df: pd.DataFrame) -> pd.DataFrame:
    df = with_baseline_ratios(df)
    keys = ["run", "model", "profile", "device"]
    base = df[df["is_baseline"] == True].drop_duplicates(keys)  # noqa: E712
    base_rounds = {tuple(r[k] for k in keys): r["rounds_s"] for _, r in base.iterrows()}
    lo, hi = [], []
    for _, r in df.iterrows():
        if r.get("speedup_method") == "paired":  # the paired rounds' own interval
            lo.append(r["speedup_low"])
            hi.append(r["speedup_high"])
            continue
        rounds = r["rounds_s"] if isinstance(r["rounds_s"], list) else []
        br = base_rounds.get(tuple(r[k] for k in keys))
        interval = speedup_interval(rounds, br if isinstance(br, list) else [],
                                    samples_ratio=r["global_batch"] / r["base_global_batch"])
        lo.append(interval[0])
        hi.append(interval[1])
    return df.assign(speedup_lo=lo, speedup_hi=hi)


def plot_speedup(df: pd.DataFrame) -> plt.Figure:
    """Speedup (throughput ratio) of every case over its FP32 baseline, with 95% bootstrap
    intervals; bars coloured by technique group (one run) or by run (several runs, the case
    labels then take the group colour)."""
    df = _with_intervals(_measured(df)).dropna(subset=["speedup"])
    if df.empty:
        raise CannotPlot("no case has a measured FP32 baseline to compare with")
    runs = _runs(df)
    run_colors = dict(zip(runs, sns.color_palette("colorblind", len(runs)).as_hex(), strict=True))
    models = list(dict.fromkeys(df["model"]))
    n_cases = [df[df["model"] == m]["case_id"].nunique() for m in models]
    bar_h = 0.8 / len(runs)
    heights = [max(1.6, (0.2 + 0.08 * (len(runs) - 1)) * n + 0.9) for n in n_cases]
    fig, axes = plt.subplots(len(models), 1, figsize=(9, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    # The axis follows the bars, not the widest whisker: one case with a wild interval (a
    # two-rank case on a busy machine) would otherwise squeeze every bar into a corner. A
    # whisker past the axis is cut there and its bar's label gives the interval's end.
    xmax = max(1.2, 1.4 * float(np.nanmax(df["speedup"].to_numpy(float))))
    xmax = min(xmax, float(np.nanmax(df[["speedup", "speedup_hi"]].to_numpy(float))))
    xmax = max(xmax, 1.2)
    limit = xmax * 1.12
    for ax, model in zip(axes[:, 0], models, strict=True):
        sub = df[df["model"] == model]
        order = sub.groupby("case_id")["speedup"].mean().sort_values(ascending=False).index
        pos = {c: i for i, c in enumerate(order)}
        groups = sub.drop_duplicates("case_id").set_index("case_id")["group"] \
            if "group" in sub else pd.Series(dtype=object)
        for j, run in enumerate(runs):
            r = sub[sub["run"] == run]
            if r.empty:
                continue
            y = r["case_id"].map(pos).to_numpy(float) + (j - (len(runs) - 1) / 2) * bar_h
            colors = ([group_color(g) for g in r.get("group", [None] * len(r))]
                      if len(runs) == 1 else run_colors[run])
            ax.barh(y, r["speedup"], height=bar_h * 0.9, color=colors)
            err = np.vstack([r["speedup"] - r["speedup_lo"], r["speedup_hi"] - r["speedup"]])
            ax.errorbar(r["speedup"], y, xerr=np.nan_to_num(err.clip(min=0)), fmt="none",
                        ecolor="black", capsize=2, lw=0.7)
            if len(runs) == 1:
                for yy, s, hi in zip(y, r["speedup"], r["speedup_hi"], strict=True):
                    end = hi if np.isfinite(hi) else s
                    cut = end > limit * 0.9
                    label = f"{s:.2f}x (interval to {hi:.2f}x)" if cut else f"{s:.2f}x"
                    ax.text(s + 0.01 * xmax if cut else end + 0.01 * xmax, yy, label,
                            va="center", fontsize=6.5,
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3,
                                  "alpha": 0.8})
        factor = sub.groupby("case_id")["batch_factor"].first()
        ax.set_yticks(range(len(order)), [_short(c, model) + batch_mark(factor.get(c))
                                          for c in order], fontsize=7.5)
        if len(runs) > 1:
            for label, case in zip(ax.get_yticklabels(), order, strict=True):
                label.set_color(group_color(groups.get(case)))
        ax.set_ylim(len(order) - 0.5, -0.5)
        ax.set_xlim(0, limit)
        ax.axvline(1.0, color=BASELINE_COLOR, ls="--", lw=1)
        ax.set_title(f"{model}: speedup over the FP32 baseline (higher is faster)", loc="left",
                     fontsize="medium")
        marked = (factor.fillna(1) != 1).any()
        ax.set_xlabel("speedup = case samples/s ÷ FP32 samples/s alongside it  "
                      "(whiskers: 95% bootstrap interval)"
                      + (f"\n{BATCH_MARK_NOTE}" if marked else ""), fontsize="small")
        ax.grid(axis="x", alpha=0.3)
    present = [g for g in GROUPS if "group" in df and (df["group"] == g).any()]
    handles = ([Patch(color=run_colors[r], label=f"run {r}") for r in runs] if len(runs) > 1
               else [Patch(color=GROUP_COLORS[g], label=g) for g in present])
    handles.append(Line2D([], [], color=BASELINE_COLOR, ls="--", label="FP32 baseline (1.0)"))
    fig.tight_layout()
    _legend_above(fig, handles, title="technique group" if len(runs) == 1 else
                  "run (case labels coloured by technique group)")
    return fig


def plot_memory(df: pd.DataFrame) -> plt.Figure:
    """Training memory per case, split into parameters, gradients, optimizer state, saved
    activations and (CUDA) the allocator's other peak use; first run only."""
    df = _measured(df)
    df = df[df["run"] == df["run"].iloc[0]]
    mem, label = memory_measure(df)
    df = df.assign(_mem=mem).dropna(subset=["_mem", "model"])  # a record without its model:
    if df.empty:  # skipped, as the reader's warning says (it crashed the chart)
        raise CannotPlot("no case recorded its training memory (CUDA peak, or on the CPU "
                         "parameters, gradients, optimizer state and activations)")
    parts = {"param_bytes": "parameters", "grad_bytes": "gradients",
             "optimizer_state_bytes": "optimizer state",
             "activation_bytes": "saved activations (one micro-batch)"}
    colors = dict(zip(parts, ["#4c72b0", "#dd8452", "#55a868", "#c44e52"], strict=True))
    models = list(dict.fromkeys(df["model"]))
    sizes = [int((df["model"] == m).sum()) for m in models]
    heights = [0.19 * n + 0.9 for n in sizes]
    fig, axes = plt.subplots(len(models), 1, figsize=(9, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    has_other = False
    for ax, model in zip(axes[:, 0], models, strict=True):
        sub = df[df["model"] == model].sort_values("_mem")
        y = np.arange(len(sub))
        left = np.zeros(len(sub))
        for col, name in parts.items():
            vals = (sub[col].astype(float).fillna(0).to_numpy() if col in sub
                    else np.zeros(len(sub))) / MIB
            ax.barh(y, vals, left=left, color=colors[col], height=0.8, label=name)
            left += vals
        total = sub["_mem"].to_numpy(float) / MIB
        other = np.clip(total - left, 0, None)
        if other.any():
            has_other = True
            ax.barh(y, other, left=left, color="0.8", height=0.8)
        for yy, t in zip(y, total, strict=True):
            ax.text(t, yy, f" {t:,.1f}", va="center", fontsize=6.5)
        ax.set_yticks(y, [_short(c, model) for c in sub["case_id"]], fontsize=7.5)
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.set_xlim(0, total.max() * 1.12)
        ax.set_title(f"{model}: training memory per case (smallest first)", loc="left",
                     fontsize="medium")
        ax.set_xlabel(f"MiB: {label}", fontsize="small")
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=colors[c], label=n) for c, n in parts.items()]
    if has_other:
        handles.append(Patch(color="0.8", label="rest of the allocator peak (temporaries)"))
    note = _process_peak_note(df)
    if note:
        fig.text(0.01, 0.0, note, fontsize="small", color="0.35", va="top")
    fig.tight_layout()
    _legend_above(fig, handles, ncol=3)
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


def spread_labels(wanted: list[float], gap: float, lo: float = 0.0,
                  hi: float = 1.0) -> list[float]:
    """Positions as close as possible to ``wanted`` (ascending), at least ``gap`` apart, within
    [lo, hi]: where a label column goes, so that labels never overlap."""
    if not wanted:
        return []
    gap = min(gap, (hi - lo) / max(len(wanted) - 1, 1))
    pos = list(wanted)
    for i in range(len(pos)):
        pos[i] = max(pos[i], lo + i * gap, pos[i - 1] + gap if i else lo)
    for i in range(len(pos) - 1, -1, -1):
        pos[i] = min(pos[i], hi - (len(pos) - 1 - i) * gap,
                     pos[i + 1] - gap if i < len(pos) - 1 else hi)
    return [min(max(p, lo), hi) for p in pos]


def plot_pareto(df: pd.DataFrame) -> plt.Figure:
    """Throughput against training memory; the line joins the configurations nothing beats on
    both, named in a column beside each panel."""
    df = _measured(df).dropna(subset=["samples_per_s"])
    mem, label = memory_measure(df)
    df = df.assign(mem_mib=mem.astype(float) / MIB).dropna(subset=["mem_mib"])
    if df.empty:
        raise CannotPlot("no case has both throughput and training memory")
    models, runs = list(dict.fromkeys(df["model"])), _runs(df)
    fig, axes = plt.subplots(len(models), len(runs), squeeze=False,
                             figsize=(9.5 * len(runs), 3.6 * len(models)))
    for (i, model), (j, run) in ((m, r) for m in enumerate(models) for r in enumerate(runs)):
        ax = axes[i, j]
        sub = df[(df["model"] == model) & (df["run"] == run)]
        if sub.empty:
            ax.set_visible(False)
            continue
        for _, r in sub.iterrows():
            ax.scatter(r["mem_mib"], r["samples_per_s"], s=28, color=group_color(r.get("group")),
                       marker=PRECISION_MARKERS.get(r["precision"], "X"), alpha=0.85,
                       edgecolor="white", linewidth=0.4, zorder=3)
        front = pareto_front(sub, "mem_mib", "samples_per_s")
        ax.plot(front["mem_mib"], front["samples_per_s"], color="black", lw=1, zorder=2)
        ax.set_xlim(0, sub["mem_mib"].max() * 1.08)
        ax.set_ylim(0, sub["samples_per_s"].max() * 1.1)
        ax.grid(alpha=0.3)
        ax.set_xlabel(f"MiB: {label}", fontsize="small")
        ax.set_ylabel("samples/s")
        title = f"{model}" + (f" ({run})" if len(runs) > 1 else "")
        ax.set_title(f"{title}: throughput vs memory (up and left is better)", loc="left",
                     fontsize="medium")
        # The front's names in a column to the right of the axes, joined by thin lines.
        ymax = ax.get_ylim()[1]
        order = front.sort_values("samples_per_s")
        wanted = (order["samples_per_s"] / ymax).tolist()
        for (_, r), yl in zip(order.iterrows(), spread_labels(wanted, 0.085), strict=True):
            ax.annotate(_short(r["case_id"], model), xy=(r["mem_mib"], r["samples_per_s"]),
                        xycoords="data", xytext=(1.03, yl), textcoords="axes fraction",
                        va="center", fontsize=7,
                        arrowprops={"arrowstyle": "-", "color": "0.7", "lw": 0.5, "ls": ":"})
    present = [g for g in GROUPS if "group" in df and (df["group"] == g).any()]
    handles = [Patch(color=GROUP_COLORS[g], label=g) for g in present]
    handles += [Line2D([], [], ls="", marker=m, color="0.3", label=p)
                for p, m in PRECISION_MARKERS.items() if (df["precision"] == p).any()]
    handles.append(Line2D([], [], color="black", lw=1, label="Pareto front (named at right)"))
    fig.tight_layout(w_pad=12)
    _legend_above(fig, handles, ncol=7, title="colour: technique group; marker: precision")
    note = _process_peak_note(df)
    if note:
        fig.text(0.01, 0.0, note, fontsize="small", color="0.35", va="top")
    return fig


def _like_baselines(df: pd.DataFrame, vary: tuple[str, ...]) -> pd.Series:
    """Mask of the rows of ``df`` that are their run's baseline of their model in every
    configuration field but those in ``vary`` (``results.same_configuration``)."""
    baselines = df[df["is_baseline"] == True].drop_duplicates(["run", "model"])  # noqa: E712
    like = pd.Series(False, index=df.index)
    for _, b in baselines.iterrows():
        like |= (df["run"] == b["run"]) & same_configuration(df, b, vary=vary)
    return like


ACCUMULATION_MODES = ("constant effective batch (smaller micro-batches)",
                      "constant micro-batch (larger effective batch)")


def accumulation_points(df: pd.DataFrame) -> pd.DataFrame:
    """The accumulation chart's points: each run's baseline of each model and the
    accumulation group's cases that are that baseline in every other configuration field but
    ``accum_steps`` and ``micro_batch`` (``results.same_configuration``), each on the line
    (``mode``) of the baseline's global batch or of its micro-batch; the k=1 baseline on
    both."""
    picked = (df["group"] == "accumulation") | (df["is_baseline"] == True)  # noqa: E712
    df = df[picked.fillna(False).astype(bool)
            & _like_baselines(df, vary=("accum_steps", "micro_batch"))]
    if df.empty:
        return df.assign(mode=pd.Series(dtype=object))
    base = df[df["is_baseline"] == True].groupby(["run", "model"])  # noqa: E712
    key = pd.MultiIndex.from_frame(df[["run", "model"]])
    same_global = df["global_batch"].to_numpy() == base["global_batch"].first().reindex(key)
    same_micro = df["micro_batch"].to_numpy() == base["micro_batch"].first().reindex(key)
    return pd.concat([df[same_global.to_numpy()].assign(mode=ACCUMULATION_MODES[0]),
                      df[same_micro.to_numpy()].assign(mode=ACCUMULATION_MODES[1])])


def plot_accumulation(df: pd.DataFrame) -> plt.Figure:
    """Training memory and throughput against accumulation steps k, at fixed effective batch
    and at fixed micro-batch (``accumulation_points``)."""
    df = _measured(df)
    if "group" not in df:
        raise CannotPlot("results carry no case groups")
    picked = (df["group"] == "accumulation") | (df["is_baseline"] == True)  # noqa: E712
    if df[picked & (df["precision"] == "fp32") & (df["parallel"] == "single")][
            "accum_steps"].nunique() < 2:
        raise CannotPlot("no gradient-accumulation cases (need at least two values of k)")
    # k is read against each model's baseline: a run without it has no k = 1 point.
    data = accumulation_points(df)
    if data["accum_steps"].nunique() < 2:
        raise CannotPlot("no FP32 baseline record beside the gradient-accumulation cases")
    mem, label = memory_measure(data)
    data = data.assign(mem_mib=mem.astype(float) / MIB)
    runs, models = _runs(data), list(dict.fromkeys(data["model"]))
    modes = list(dict.fromkeys(data["mode"]))
    colors = dict(zip(modes, ["#4c72b0", "#dd8452"], strict=False))
    styles = dict(zip(runs, ["-", "--", ":", "-."] * 4, strict=False))
    metrics = [("mem_mib", f"MiB: {label}"), ("samples_per_s", "samples/s (global batch)")]
    fig, axes = plt.subplots(2, len(models), squeeze=False, sharex=True,
                             figsize=(3.6 * len(models) + 0.5, 6))
    for col, model in enumerate(models):
        for row, (metric, ylabel) in enumerate(metrics):
            ax = axes[row, col]
            for (mode, run), sub in data[data["model"] == model].groupby(["mode", "run"],
                                                                          sort=False):
                sub = sub.sort_values("accum_steps")
                ax.plot(sub["accum_steps"], sub[metric], marker="o", color=colors[mode],
                        ls=styles[run])
            ax.set_ylim(0, max(data.loc[data["model"] == model, metric].max() * 1.15, 1e-9))
            ax.grid(alpha=0.3)
            ax.set_title(f"{model}: " + ("training memory" if row == 0 else "throughput"),
                         loc="left", fontsize="medium")
            if col == 0:
                ax.set_ylabel(ylabel if row else "MiB", fontsize="small")
            if row == 1:
                ax.set_xlabel("accumulation steps k")
            ax.xaxis.get_major_locator().set_params(integer=True)
    handles = [Line2D([], [], color=colors[m], marker="o", label=m) for m in modes]
    if len(runs) > 1:
        handles += [Line2D([], [], color="0.3", ls=styles[r], label=f"run {r}") for r in runs]
    fig.tight_layout()
    _legend_above(fig, handles, ncol=2)
    fig.text(0.01, 0.0, f"memory: {label}", fontsize="small", color="0.35", va="top")
    return fig


def scaling_points(df: pd.DataFrame) -> pd.DataFrame:
    """The scaling chart's points: each parallel case with its scaling efficiency, on the line
    of its configuration across world sizes (``line``: "fp32-ddp" joins ddp2, ddp4, ddp8), which
    starts at world size 1 from its single-device case, the one its efficiency is against
    (``results.single_device_case``: its samples/s, efficiency 1.0)."""
    df = with_baseline_ratios(df)
    par = df[df["parallel"] != "single"].dropna(subset=["scaling_efficiency"])
    par = par.assign(line=[
        re.sub(rf"-{p}\d+", f"-{p}", c.removeprefix(f"{m}-"))
        for c, p, m in zip(par["case_id"], par["parallel"], par["model"], strict=True)
    ])
    ones = par.drop_duplicates(["run", "model", "line"]).assign(
        world_size=1, samples_per_s=lambda f: f["single_samples_per_s"], scaling_efficiency=1.0)
    return pd.concat([par, ones], ignore_index=True)


def plot_scaling(df: pd.DataFrame) -> plt.Figure:
    """Throughput and scaling efficiency against world size (``scaling_points``)."""
    data = scaling_points(_measured(df))
    if data.empty:
        raise CannotPlot("no parallel cases with a measured single-device counterpart")
    models, runs = list(dict.fromkeys(data["model"])), _runs(data)
    lines = list(dict.fromkeys(data["line"]))
    colors = dict(zip(lines, sns.color_palette("tab10", max(len(lines), 1)).as_hex() * 3,
                      strict=False))
    styles = dict(zip(runs, ["-", "--", ":", "-."] * 4, strict=False))
    fig, axes = plt.subplots(2, len(models), squeeze=False, figsize=(4.6 * len(models) + 0.5, 7))
    for col, model in enumerate(models):
        sub = data[data["model"] == model]
        for row, (metric, label) in enumerate([("samples_per_s", "samples/s (global batch)"),
                                               ("scaling_efficiency", "scaling efficiency")]):
            ax = axes[row, col]
            for (line, run), s in sub.groupby(["line", "run"], sort=False):
                s = s.sort_values("world_size")
                ax.plot(s["world_size"], s[metric], marker="o", color=colors[line],
                        ls=styles[run])
            ax.set_title(f"{model}: {label}", loc="left", fontsize="medium")
            ax.set_xlabel("world size (devices or processes)")
            ax.set_ylabel(label, fontsize="small")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
            if metric == "scaling_efficiency":
                ax.axhline(1.0, color=BASELINE_COLOR, ls="--", lw=1)
                ax.set_ylim(0, max(1.1, sub[metric].max() * 1.1))
                ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
            else:
                ax.set_ylim(0, sub[metric].max() * 1.1)
    handles = [Line2D([], [], color=colors[n], marker="o", label=n) for n in lines]
    handles.append(Line2D([], [], color=BASELINE_COLOR, ls="--", label="perfect scaling"))
    if len(runs) > 1:
        handles += [Line2D([], [], color="0.3", ls=styles[r], label=f"run {r}") for r in runs]
    fig.suptitle("Parallel scaling vs the single-device case with the same per-device batch",
                 x=0.02, ha="left", fontsize="medium")
    if (data["device"] == "cpu").all():
        fig.text(0.02, 0.0, "CPU: the ranks share the same cores, so no speedup is possible; "
                 "these lines show the cost of communication and coordination only.",
                 fontsize="small", color="0.35", va="top")
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.79, 0.5), frameon=False,
               fontsize="small", title="configuration", title_fontsize="small")
    return fig


def loader_grid(df: pd.DataFrame) -> pd.DataFrame:
    """The loader chart's points: on-disk data read warm, without caching, feeding the
    baseline's step (the num_workers x pin_memory grid), each point its run's baseline in every
    other configuration field (``results.same_configuration``). The cold cases, read from the
    disk, are the storage verdict's; the recipe group's stacks, with their precision and
    optimizer, the recipe verdict's."""
    on_grid = _like_baselines(df, vary=("dataset", "dataset_size", "num_workers", "pin_memory"))
    return df[on_grid & df["dataset"].isin(["images-jpeg", "tokens-mmap"])]


def plot_loader(df: pd.DataFrame) -> plt.Figure:
    """Loader stall fraction and throughput across num_workers x pin_memory."""
    df = _measured(df)
    if "loader_stall_fraction" not in df:
        raise CannotPlot("results carry no loader stall measurements")
    grid = loader_grid(df)
    if grid["num_workers"].nunique() < 2:
        raise CannotPlot("no data-loader cases varying num_workers on on-disk data")
    resident = df[df["is_baseline"] == True]  # noqa: E712  (its batches are on the device)
    models, runs = list(dict.fromkeys(grid["model"])), _runs(grid)
    colors = {False: "#4c72b0", True: "#dd8452"}
    styles = dict(zip(runs, ["-", "--", ":", "-."] * 4, strict=False))
    metrics = {"samples_per_s": "training samples/s",
               "loader_samples_per_s": "loader alone, samples/s",
               "loader_stall_fraction": "share of step time waiting for data"}
    fig, axes = plt.subplots(len(metrics), len(models), squeeze=False, sharex="col",
                             figsize=(4.2 * len(models) + 0.5, 2.6 * len(metrics)))
    for col, model in enumerate(models):
        sub = grid[grid["model"] == model]
        for row, (metric, label) in enumerate(metrics.items()):
            ax = axes[row, col]
            for (pin, run), s in sub.groupby(["pin_memory", "run"], sort=False):
                s = s.sort_values("num_workers")
                ax.plot(s["num_workers"], s[metric], marker="o", color=colors[bool(pin)],
                        ls=styles[run])
            top = sub[metric].max()
            if metric == "samples_per_s":
                res = resident[resident["model"] == model]["samples_per_s"]
                for value in res:
                    ax.axhline(value, color=BASELINE_COLOR, ls="--", lw=1)
                top = max(top, res.max() if not res.empty else 0)
            if metric == "loader_stall_fraction":
                ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
            ax.set_ylim(0, top * 1.15 if top > 0 else 1)
            ax.grid(alpha=0.3)
            ax.set_title(f"{model}: {label}", loc="left", fontsize="medium")
            if row == len(metrics) - 1:
                ax.set_xlabel("DataLoader num_workers")
            ax.xaxis.get_major_locator().set_params(integer=True)
    pins = sorted({bool(p) for p in grid["pin_memory"].dropna()})
    handles = [Line2D([], [], color=colors[p], marker="o",
                      label="pinned memory" if p else "not pinned") for p in pins]
    handles.append(Line2D([], [], color=BASELINE_COLOR, ls="--",
                          label="data already on the device (no loading)"))
    if len(runs) > 1:
        handles += [Line2D([], [], color="0.3", ls=styles[r], label=f"run {r}") for r in runs]
    fig.tight_layout()
    _legend_above(fig, handles, ncol=3, title="Data loader on on-disk data")
    return fig


def energy_per_sample(df: pd.DataFrame) -> pd.Series:
    """Joules per training sample of each record: the GPUs' energy per step over the global
    batch (``energy_j_per_step`` / ``global_batch``), else from ``samples_per_kj``; NaN where
    a record has neither (no NVML, or not CUDA)."""
    nan = pd.Series(np.nan, index=df.index)
    per_step = df["energy_j_per_step"].astype(float) if "energy_j_per_step" in df else nan
    batch = df["global_batch"].astype(float).where(lambda b: b > 0)
    per_kj = df["samples_per_kj"].astype(float) if "samples_per_kj" in df else nan
    return (per_step / batch).fillna(1000 / per_kj.where(per_kj > 0))


def plot_energy(df: pd.DataFrame) -> plt.Figure:
    """CUDA: energy per sample against throughput for the precision cases (the FP32 baseline,
    TF32, fp16, bf16), one panel per model; down and right is better. Energy comes from the
    GPUs' NVML counters over the timed rounds (``gpubench.measure.telemetry``), so the CPU never has
    it."""
    df = _measured(df)
    cuda = df[df["device"] == "cuda"]
    if cuda.empty:
        raise CannotPlot("no CUDA cases: energy is read from the GPUs' NVML counters")
    if "group" not in cuda:
        raise CannotPlot("results carry no case groups")
    picked = ((cuda["group"] == "precision").fillna(False).astype(bool)
              | (cuda["is_baseline"] == True).fillna(False).astype(bool))  # noqa: E712
    cases = cuda[picked & (cuda["parallel"] == "single")]
    cases = cases.assign(j_per_sample=energy_per_sample(cases)).dropna(
        subset=["j_per_sample", "samples_per_s"])
    if cases.empty:
        raise CannotPlot("no CUDA precision case recorded its GPU energy (NVML: install "
                         "gpubench[gpu], the nvidia-ml-py bindings)")
    models, runs = list(dict.fromkeys(cases["model"])), _runs(cases)
    run_colors = dict(zip(runs, sns.color_palette("colorblind", len(runs)).as_hex(),
                          strict=True))
    fig, axes = plt.subplots(1, len(models), squeeze=False,
                             figsize=(4.6 * len(models) + 0.5, 4))
    for ax, model in zip(axes[0], models, strict=True):
        sub = cases[cases["model"] == model]
        for _, r in sub.iterrows():
            color = (group_color("precision") if len(runs) == 1 else run_colors[r["run"]])
            ax.scatter(r["samples_per_s"], r["j_per_sample"], s=36, color=color,
                       marker=PRECISION_MARKERS.get(r["precision"], "X"), edgecolor="white",
                       linewidth=0.4, zorder=3)
            ax.annotate(_short(r["case_id"], model), (r["samples_per_s"], r["j_per_sample"]),
                        xytext=(4, 4), textcoords="offset points", fontsize=7)
        ax.set_xlim(0, sub["samples_per_s"].max() * 1.2)
        ax.set_ylim(0, sub["j_per_sample"].max() * 1.2)
        ax.grid(alpha=0.3)
        ax.set_xlabel("samples/s (global batch)")
        ax.set_ylabel("J per sample (GPU energy)", fontsize="small")
        ax.set_title(f"{model}: energy vs throughput (down and right is better)", loc="left",
                     fontsize="medium")
    handles = [Line2D([], [], ls="", marker=m, color="0.3", label=p)
               for p, m in PRECISION_MARKERS.items() if (cases["precision"] == p).any()]
    if len(runs) > 1:
        handles += [Patch(color=run_colors[r], label=f"run {r}") for r in runs]
    fig.tight_layout()
    _legend_above(fig, handles, title="marker: precision")
    fig.text(0.01, 0.0, "energy: the GPUs' NVML energy counters over a block of the case's "
             "own rounds back to back (energy_source in the record), divided by the samples "
             "trained", fontsize="small", color="0.35", va="top")
    return fig


CHARTS = {
    "speedup": plot_speedup,
    "memory": plot_memory,
    "pareto": plot_pareto,
    "accumulation": plot_accumulation,
    "scaling": plot_scaling,
    "loader": plot_loader,
    "energy": plot_energy,
}
"""Chart name -> function; the report draws each into ``<name>.png`` and ``<name>.svg``."""
