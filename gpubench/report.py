"""The report: every chart the results allow (PNG and SVG), plus Markdown and HTML pages with the
summary tables. Charts the results cannot support are listed with the reason, never a crash."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt

from gpubench import atomic
from gpubench.advice import advice_markdown
from gpubench.charts import CHARTS, CannotPlot
from gpubench.results import load_results
from gpubench.summary import summary_markdown

READING_GUIDE = """\
How to read these charts: *speedup* is the FP32 baseline's median step time divided by the
case's (above 1 is faster; the whisker is a 95% bootstrap interval from the raw rounds).
*Peak memory* is the high-water mark during the timed steps (CUDA: allocated tensors; CPU: the
whole process's resident memory), split into parameters, gradients and optimizer state where those
are known exactly. The *Pareto* chart marks configurations no other beats on both throughput and
memory."""


def _save(fig: plt.Figure, dest: Path) -> None:
    with atomic.atomic_path(dest) as tmp:
        fig.savefig(tmp, format=dest.suffix.lstrip("."), dpi=110, bbox_inches="tight")


def write_report(
    files: Iterable[str | Path], out: str | Path, labels: Iterable[str] | None = None
) -> list[Path]:
    """Draw every chart into ``out`` and write ``report.md`` and ``report.html``; return paths."""
    out = Path(out)
    df = load_results(files, labels)
    written, sections, skipped, pngs = [], [], [], {}
    for name, plot in CHARTS.items():
        try:
            fig = plot(df)
        except CannotPlot as why:
            skipped.append(f"- {name}: not drawn: {why}")
            continue
        for ext in ("png", "svg"):
            _save(fig, out / f"{name}.{ext}")
            written.append(out / f"{name}.{ext}")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
        pngs[name] = base64.b64encode(buf.getvalue()).decode()
        plt.close(fig)
        sections.append(f"## {name}\n\n![{name}]({name}.png)\n")
    runs = ", ".join(dict.fromkeys(df["run"]))
    md = [f"# gpubench report: {runs}\n", READING_GUIDE + "\n", *sections]
    if skipped:
        md.append("## Charts not drawn\n\n" + "\n".join(skipped) + "\n")
    if df["run"].nunique() == 1:
        md.append("## Advice: the common speed-up claims, on these measurements\n\n"
                  + advice_markdown(df))
    md.append("## Summary\n\n" + summary_markdown(df))
    markdown = "\n".join(md)
    atomic.write_text(out / "report.md", markdown)
    written.append(out / "report.md")
    atomic.write_text(out / "report.html", _html(markdown, pngs))
    written.append(out / "report.html")
    return written


def _html(markdown: str, pngs: dict[str, str]) -> str:
    """A self-contained page: the Markdown as preformatted text with the charts embedded."""
    body = []
    for block in markdown.split("\n## "):
        title, _, rest = block.partition("\n")
        name = title.strip().lstrip("# ")
        body.append(f"<h2>{html.escape(name)}</h2>")
        if name in pngs:
            body.append(f'<img alt="{name}" src="data:image/png;base64,{pngs[name]}">')
        else:
            body.append(f"<pre>{html.escape(rest)}</pre>")
    return (
        "<!doctype html><meta charset='utf-8'><title>gpubench report</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "img{max-width:100%}pre{white-space:pre-wrap}</style>" + "\n".join(body)
    )
