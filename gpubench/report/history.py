"""The history page: ``history.md`` (change points, machine changes, every case's latest value
and trend) and a self-contained ``history.html`` with one chart per case that changed (the
series, each level's median, the step marked, the commits labelled)."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import markdown as md_lib  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from gpubench.analysis.history import (  # noqa: E402
    CHANGE_ALPHA,
    PERSISTENCE,
    SERIES_KEY,
    History,
)
from gpubench.util import atomic  # noqa: E402
from gpubench.util.tables import markdown_table  # noqa: E402

ON_WORDS = {"paired": "time over paired baseline rounds", "raw": "median step time",
            "vs median": "time over the FP32 baseline's median", "memory": "training memory"}


def _short(commit) -> str:
    return str(commit)[:10] if isinstance(commit, str) and commit else "?"


def _value(v: float, on: str) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    if on == "raw":
        return f"{v * 1e3:.2f} ms"
    if on == "memory":
        return f"{v / 2**20:.1f} MiB"
    return f"{v:.3f}x"


def _case(row) -> str:
    case = str(row["case_id"])
    return case if case.startswith(str(row["model"])) else f"{row['model']} {case}"


def changes_markdown(changes: pd.DataFrame) -> str:
    rows = [{"case": _case(r), "metric": ON_WORDS.get(r["on"], r["on"]),
             "machine": r["machine_name"],
             "last good": _short(r["last_good"]), "first bad": _short(r["first_bad"]),
             "change": f"{r['ratio'] - 1:+.1%}",
             "95% interval": f"{r['low'] - 1:+.1%} to {r['high'] - 1:+.1%}",
             "p": f"{r['p']:.3f}",
             "note": "; ".join(x for x in (
                 "" if r["persistent"] else "latest run only: pending",
                 f"libraries changed: {r['software_change']}" if r["software_change"] else "")
                 if x)}
            for _, r in changes.iterrows()]
    return markdown_table(rows, columns=["case", "metric", "machine", "last good", "first bad",
                                         "change", "95% interval", "p", "note"])


def latest_markdown(latest: pd.DataFrame, cost: pd.DataFrame | None = None) -> str:
    time = latest[latest["metric"] == "time"]
    rows = []
    for _, r in time.iterrows():
        row = {"case": _case(r), "machine": r["machine_name"], "runs": r["runs"],
               "latest commit": _short(r["latest_commit"]),
               "step time (ms)": f"{r['latest_step_time_s'] * 1e3:.2f}",
               "samples/s": f"{r['latest_samples_per_s']:.1f}",
               "followed as": ON_WORDS.get(r["on"], r["on"]),
               "latest": _value(r["latest"], r["on"]),
               "trend (last 5 runs vs first 5)": f"{r['trend']:+.1%}",
               "change points": r["changes"]}
        rows.append(row)
    return markdown_table(rows, columns=None if rows else [
        "case", "machine", "runs", "latest commit", "step time (ms)", "samples/s",
        "followed as", "latest", "trend (last 5 runs vs first 5)", "change points"])


def history_markdown(history: History, changes: pd.DataFrame, latest: pd.DataFrame,
                     machine_lines: list[str], basis: str) -> str:
    runs = history.runs
    first, last = runs.iloc[0], runs.iloc[-1]
    parts = [
        f"{len(runs)} runs from commit {_short(first['commit_id'])} "
        f"({first['commit_time']:%Y-%m-%d %H:%M}) to {_short(last['commit_id'])} "
        f"({last['commit_time']:%Y-%m-%d %H:%M}), {runs['machine_id'].nunique()} machine(s), "
        f"{history.cases[['model', 'profile', 'device', 'case_id']].drop_duplicates().shape[0]}"
        f" cases; time followed on the {basis} basis.",
        "",
        f"A change point is a split of a series whose permutation test gives p < {CHANGE_ALPHA},"
        f" whose medians differ by at least the minimum magnitude, and whose new level held "
        f"{PERSISTENCE} runs or more.",
    ]
    if machine_lines:
        parts += ["", *[f"- {line}" for line in machine_lines]]
    held = changes[changes["persistent"]] if len(changes) else changes
    pending = changes[~changes["persistent"]] if len(changes) else changes
    parts += ["", "## Change points", ""]
    parts.append(changes_markdown(held) if len(held) else "None.")
    if len(pending):
        parts += ["", "## Pending: only the latest run moved", "",
                  "Confirm with `gpubench compare --confirm` before acting.", "",
                  changes_markdown(pending)]
    parts += ["", "## Latest value and trend of every case", "", latest_markdown(latest)]
    if history.skipped:
        parts += ["", "Not read:", "", *[f"- {s}" for s in history.skipped]]
    return "# gpubench history\n\n" + "\n".join(parts) + "\n"


def plot_series(s: pd.DataFrame, cps: pd.DataFrame, title: str) -> plt.Figure:
    """One series: each run a point in run order, each level's median a line, each change
    point a vertical line between its last good and first bad run, the commits on the x axis."""
    sns.set_theme(style="whitegrid", context="paper")
    on = s["on"].iloc[0]
    scale = {"raw": 1e3, "memory": 1 / 2**20}.get(on, 1.0)
    unit = {"raw": "median step time (ms)", "memory": "training memory (MiB)"}.get(
        on, ON_WORDS.get(on, on) + " (x)")
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(s) + 2), 3.4))
    x = range(len(s))
    y = s["value"].to_numpy() * scale
    ax.plot(x, y, "o-", color="#4c72b0", markersize=4, linewidth=0.8)
    bounds = [0, *sorted(int(a) for a in cps["at"]), len(s)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        level = float(pd.Series(y[lo:hi]).median())
        ax.hlines(level, lo - 0.4, hi - 0.6, colors="#dd8452", linewidth=2)
    for _, cp in cps.iterrows():
        at = int(cp["at"])
        ax.axvline(at - 0.5, color="#c44e52", linestyle="--", linewidth=1.2)
        ax.annotate(f"{cp['ratio'] - 1:+.1%} at {_short(cp['first_bad'])[:8]}",
                    (at - 0.5, ax.get_ylim()[1]), xytext=(4, -12), textcoords="offset points",
                    color="#c44e52", fontsize=8)
    labels = [_short(c)[:7] + ("*" if d else "") for c, d in zip(s["commit_id"], s["dirty"],
                                                                 strict=True)]
    step = max(1, len(labels) // 40)
    ax.set_xticks(list(x)[::step])
    ax.set_xticklabels(labels[::step], rotation=70, fontsize=7, family="monospace")
    ax.set_ylabel(unit)
    ax.set_xlabel("commit (in commit-time order; * uncommitted changes)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _png(fig: plt.Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_history_page(out: str | Path, history: History, series: pd.DataFrame,
                       changes: pd.DataFrame, latest: pd.DataFrame, machine_lines: list[str],
                       basis: str) -> list[Path]:
    """``history.md`` and ``history.html`` (charts embedded) in ``out``; their paths."""
    out = Path(out)
    text = history_markdown(history, changes, latest, machine_lines, basis)
    atomic.write_text(out / "history.md", text)
    charts = []
    if len(changes):
        for key, cps in changes.groupby(list(SERIES_KEY), sort=False):
            s = series[(series[list(SERIES_KEY)] == pd.Series(key, index=list(SERIES_KEY)))
                       .all(axis=1)]
            r = dict(zip(SERIES_KEY, key, strict=True))
            title = (f"{_case(r)} [{r['profile']}, {r['device']}]: "
                     f"{ON_WORDS.get(s['on'].iloc[0])} on {cps['machine_name'].iloc[0]}")
            charts.append((title, _png(plot_series(s, cps, title))))
    body = md_lib.markdown(text, extensions=["tables"])
    figures = "".join(f"<figure><img alt=\"{html.escape(t)}\" src=\"data:image/png;base64,{p}\">"
                      f"<figcaption>{html.escape(t)}</figcaption></figure>" for t, p in charts)
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>gpubench history</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
            "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;"
            "padding:2px 6px}img{max-width:100%}figure{margin:1em 0}</style></head><body>"
            + body + ("<h2>Charts of the cases that changed</h2>" + figures if charts else "")
            + "</body></html>")
    atomic.write_text(out / "history.html", page)
    return [out / "history.md", out / "history.html"]
