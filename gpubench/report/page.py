"""The report: every chart the results allow (PNG and SVG), plus a Markdown page and a
self-contained HTML page (rendered with Python-Markdown: real tables, coloured verdicts, a table
of contents, the charts embedded). Charts the results cannot support are listed with the reason,
never a crash."""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import markdown as md_lib
import matplotlib.pyplot as plt
import pandas as pd

from gpubench.analysis.advice import advice_markdown
from gpubench.analysis.results import load_results
from gpubench.report.charts import CHARTS, CannotPlot, energy_per_sample
from gpubench.report.summary import summary_markdown
from gpubench.util import atomic
from gpubench.util.tables import markdown_table
from gpubench.util.verdicts import Kind

READING_GUIDE = """\
- **Speedup** (one definition, used by every table, chart and sentence of this report: the
  answer, the advice, the summary, the charts): the case's samples/s divided by the samples/s
  of the FP32 baseline of the same model, profile and device *measured alongside it*, shown in
  the summary as *fp32 samples/s alongside* (above 1 is faster). Each round of a case is paired
  with a baseline round taken beside it; the speedup is the median of the per-round ratios and
  its 95% interval a bootstrap over the rounds, so the baseline's samples/s alongside is the
  case's samples/s over that speedup (cases without paired rounds: the baseline case's
  samples/s, marked *separate runs*). Throughput counts the effective (global) batch, so cases
  that process more samples per step (accumulation, DDP) compare fairly; they are marked
  [batch xN]. The baseline reads 1.00x; its interval column gives its paired ratio against its
  own copy, the run's noise floor.
- **Training memory** is what the techniques change: on CUDA the allocator's peak; on the CPU
  the exact sum of parameters, gradients, optimizer state and the activations autograd saves
  for one micro-batch, per device or rank. The summary's *peak mem* column is, on CUDA, the
  allocator's peak and, on the CPU, the process's resident high-water mark above its resident
  size before the case built its model (the suite's imports and state below that base): what
  a hand-written loop of the same model holds, measured the same way.
- **MFU** is model FLOPs per second over the measured matmul peak of the case's precision.
  Model FLOPs follow the convention of published MFU figures (PaLM, appendix B; torchtitan;
  nanoGPT): what the model needs, no recomputation, attention in full, so a checkpointed case
  has its plain case's. Where the kernels did more (checkpointing's re-run forward, the fused
  attention backward's recompute), the summary adds the **HFU** (hardware FLOPs) beside it.
- The **Pareto** chart joins the configurations that no other beats on both throughput and
  training memory.
- Throughput and memory axes start at 0; bar colours are technique groups."""

CHART_TITLES = {
    "speedup": "speedup: throughput over the FP32 baseline",
    "memory": "memory: training memory per case",
    "pareto": "pareto: throughput vs training memory",
    "accumulation": "accumulation: memory and throughput vs accumulation steps",
    "scaling": "scaling: throughput and efficiency vs world size",
    "loader": "loader: data loading on on-disk data",
    "energy": "energy: joules per sample vs throughput (precision cases, CUDA)",
}

TELEMETRY_INTRO = """\
Sampled every 0.1 s during each case's timed rounds (the paired baseline's steps left out):
CPU utilisation of the case's own processes in % of the machine's cores, CPU clock; on CUDA
(NVML) GPU utilisation, SM and memory clocks, the power of the case's GPUs and their energy
per training sample, read around a block of the case's own rounds back to back (a paired
case's come after its paired rounds, then its baseline's: *J/sample vs fp32* compares the two
blocks). *Contended*: something else competed with the case (CPU steal, other
processes on busy cores or on its GPU, a run queue beyond the case's own threads, a GPU slowed
for heat or a power brake); the summary flags such cases.

"""

VERDICT_CLASSES = {kind.value: kind.tone for kind in Kind}
"""Bold verdict words of the advice (and compare) tables -> CSS class of their colour
(``gpubench.util.verdicts.Kind.tone``)."""

STYLE = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --zebra: #f6f8fa; --accent: #0969da; }
* { box-sizing: border-box; }
body { font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--fg);
       max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 1.8em; border-bottom: 1px solid var(--line); padding-bottom: .3em; }
h2 { font-size: 1.4em; margin-top: 2em; border-bottom: 1px solid var(--line);
     padding-bottom: .2em; }
h3 { font-size: 1.1em; margin-top: 1.5em; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
code { font: 0.88em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
       background: var(--zebra); padding: .1em .3em; border-radius: 4px; }
.toc { background: var(--zebra); border: 1px solid var(--line); border-radius: 6px;
       padding: 8px 16px; display: inline-block; min-width: 50%; }
.toc ul { margin: 0; padding-left: 1.2em; }
.toc > ul { columns: 2; column-gap: 32px; }
.toc li { break-inside: avoid; }
.scroll { overflow-x: auto; margin: 12px 0; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 8px; vertical-align: top; }
th { background: var(--zebra); position: sticky; top: 0; }
tbody tr:nth-child(even) { background: #fbfcfd; }
tbody tr:hover { background: #eef4ff; }
img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px;
      padding: 8px; background: white; }
.verdict { display: inline-block; white-space: nowrap; padding: 0 .5em; border-radius: 1em;
           font-weight: 600; }
.verdict.good { background: #dafbe1; color: #116329; }
.verdict.bad { background: #ffebe9; color: #a40e26; }
.verdict.unsure { background: #fff8c5; color: #7d4e00; }
.verdict.na { background: #eaeef2; color: #424a53; }
.verdict.neutral { color: var(--muted); font-weight: 400; }
"""


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    body: str


def _save(fig: plt.Figure, dest: Path) -> None:
    with atomic.atomic_path(dest) as tmp:
        fig.savefig(tmp, format=dest.suffix.lstrip("."), dpi=110, bbox_inches="tight")


def _first(values: pd.Series) -> str:
    values = values.dropna()
    return str(values.iloc[0]) if not values.empty else "-"


def runs_markdown(df: pd.DataFrame) -> str:
    """One line per run: where and with what it was measured."""
    rows = []
    for run, g in df.groupby("run", sort=False):
        steps = g[g["kind"].isna() | (g["kind"] == "step")] if "kind" in g else g
        device_name = g.get("device_name", pd.Series(dtype=object))
        rows.append({
            "run": run,
            "profile": ", ".join(map(str, dict.fromkeys(steps["profile"].dropna()))) or "-",
            "device": ", ".join(map(str, dict.fromkeys(steps["device"].dropna()))) or "-",
            "hardware": _first(device_name) if (steps["device"] == "cuda").any()
            else _first(g["machine_cpu"]),
            "torch": _first(g["torch_version"]),
            "date": _first(g["datetime"])[:19].replace("T", " "),
            "commit": _commit(g),
            "cases": str(int(steps["step_time_s"].notna().sum())),
        })
        fp = next((f for f in g.get("fingerprint", pd.Series(dtype=object))
                   if isinstance(f, dict)), None)
        if fp is not None and fp.get("device") == "cuda":
            rows[-1]["hardware"] += (f" x{fp.get('device_count')}, driver "
                                     f"{fp.get('driver') or '?'}")
    return markdown_table(rows, [*["left"] * 7, "right"])


def _commit(g: pd.DataFrame) -> str:
    """The gpubench commit a run's records were measured with ("-": not recorded)."""
    fp = next((f for f in g.get("fingerprint", pd.Series(dtype=object)) if isinstance(f, dict)),
              None)
    commit = (fp or {}).get("commit")
    return "-" if not commit else str(commit)[:9] + ("+dirty" if "+dirty" in commit else "")


def baseline_notes(df: pd.DataFrame) -> str:
    """A line for each model whose FP32 baseline record is in none of the files (of its
    profile and device): what the report cannot then show. Empty when every model has one."""
    steps = df[df["kind"].isna() | (df["kind"] == "step")] if "kind" in df else df
    if "model" not in steps or steps.empty:
        return ""
    steps = steps[steps["model"].notna()]
    based = steps["is_baseline"].fillna(False).astype(bool) if "is_baseline" in steps \
        else pd.Series(False, index=steps.index)
    keys = [k for k in ("model", "profile", "device") if k in steps]
    lines = []
    for key, g in steps.groupby(keys, sort=False, dropna=False):
        if based[g.index].any():
            continue
        model = key[0] if isinstance(key, tuple) else key
        files = ", ".join(dict.fromkeys(Path(str(f)).name for f in g.get("file", g["run"])))
        lines.append(f"- no fp32 baseline record of model {model} in {files}: its cases are "
                     "shown with the speedups of their paired baseline rounds where they have "
                     "them; the charts and ratios that need the baseline's own figures leave "
                     "it out (load a file with its baseline too)")
    return "\n" + "\n".join(lines) + "\n" if lines else ""


TELEMETRY_COLUMNS = {
    "telemetry_cpu_util": "CPU util (%)",
    "telemetry_cpu_freq_mhz": "CPU clock (MHz)",
    "telemetry_gpu_util": "GPU util (%)",
    "telemetry_sm_clock_mhz": "SM clock (MHz)",
    "telemetry_mem_clock_mhz": "mem clock (MHz)",
    "telemetry_power_w": "power (W)",
    "j_per_sample": "energy (J/sample)",
    "energy_vs_baseline": "J/sample vs fp32",
}
"""The telemetry table's figures (``gpubench.measure.telemetry``): record field -> header. A column
that
no case of a table has (the GPU's on a CPU run) is left out."""


def _figure(value: object) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return "-"
    value = float(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def telemetry_markdown(df: pd.DataFrame) -> str:
    """Per run and model, one line per case with telemetry: the machine during its timed rounds
    (CPU and GPU utilisation, clocks, power, energy per sample) and whether something else
    competed with it (``contended``, with the reason). Empty when no case has telemetry (files
    written before it, or kinds other than training steps)."""
    if "telemetry_samples" not in df:
        return ""
    steps = df[(df["kind"].isna() | (df["kind"] == "step")) & df["step_time_s"].notna()]
    steps = steps[steps["telemetry_samples"].notna()]
    if steps.empty:
        return ""
    steps = steps.assign(j_per_sample=energy_per_sample(steps))
    if {"samples_per_kj", "baseline_samples_per_kj"} <= set(steps):
        # the case's block against its baseline's, right after it: no drift between the two
        steps = steps.assign(energy_vs_baseline=steps["baseline_samples_per_kj"].astype(float)
                             / steps["samples_per_kj"].astype(float))
    parts = []
    for (run, model), group in steps.groupby(["run", "model"], sort=False):
        shown = {c: h for c, h in TELEMETRY_COLUMNS.items()
                 if c in group and group[c].notna().any()}
        rows = []
        for _, r in group.iterrows():
            contended = r.get("contended")
            flag = ("-" if contended is None or contended is pd.NA
                    else f"yes: {r.get('contention_reason') or '?'}" if contended else "no")
            rows.append({"case": r["case_id"], **{h: _figure(r[c]) for c, h in shown.items()},
                         "contended": flag})
        table = markdown_table(rows, ["left", *["right"] * len(shown), "left"])
        parts.append(f"### {model} ({run})\n\n{table}\n")
    notes = sorted({str(n) for n in steps.get("telemetry_note", pd.Series(dtype=object))
                    if isinstance(n, str) and n})
    if notes:
        parts.append("Notes from the sampler:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    return "\n".join(parts)


def report_sections(df: pd.DataFrame, charts: Iterable[str], skipped: list[str],
                    memory_reports: list[dict] | None = None,
                    parity_reports: list[dict] | None = None,
                    failures: list[dict] | None = None,
                    tunes: list[dict] | None = None, base: Path | None = None,
                    not_run: list[dict] | None = None) -> list[Section]:
    """The report's sections, the answer first (one run: the tuner's winner or the
    recommendation, ``gpubench.analysis.answer``)."""
    sections = []
    if df["run"].nunique() == 1:
        from gpubench.analysis.answer import answer_markdown

        answer = answer_markdown(df, tunes, base=base)
        if answer:
            sections.append(Section("answer", "The answer: what to train with", answer))
    sections.append(Section("runs", "Runs", runs_markdown(df) + "\n" + baseline_notes(df)))
    if failures:  # gpubench.measure.journal: cases that failed are results too
        from gpubench.analysis.failures import failures_markdown

        sections.append(Section("failed", "Failed cases",
                                failures_markdown(failures).split("\n", 3)[-1]))
    if not_run:  # gpubench.measure.journal: what the run skipped is visible too
        from gpubench.analysis.failures import skipped_markdown

        sections.append(Section("skipped", "Skipped cases", skipped_markdown(not_run)))
    sections.append(Section("reading-guide", "How to read this report", READING_GUIDE + "\n"))
    for name in charts:
        sections.append(Section(name, CHART_TITLES.get(name, name), f"![{name}]({name}.png)\n"))
    if skipped:
        sections.append(Section("charts-not-drawn", "Charts not drawn", "\n".join(skipped) + "\n"))
    if df["run"].nunique() == 1:
        sections.append(Section("advice", "Advice: the common speed-up claims, on these "
                                "measurements",
                                advice_markdown(df, memory_reports=memory_reports,
                                                parity_reports=parity_reports,
                                                failures=failures, tunes=tunes)))
    if parity_reports:  # gpubench run --parity, or a gpubench parity folder's parity.json
        from gpubench.analysis.parity import parity_markdown

        body = "\n".join(f"### {r['model']}\n\n" + parity_markdown(r).split("\n", 2)[-1]
                         + f"\n![{r.get('chart', 'parity.png')}]({r.get('chart', 'parity.png')})\n"
                         for r in parity_reports)
        sections.append(Section("parity", "Convergence parity: loss curves against FP32", body))
    sections.append(Section("summary", "Summary", summary_markdown(df)))
    telemetry = telemetry_markdown(df)
    if telemetry:
        sections.append(Section("telemetry", "Telemetry: the machine during the timed rounds",
                                TELEMETRY_INTRO + telemetry))
    from gpubench.measure.trace import op_changes_markdown

    changed = op_changes_markdown(df)  # runs with --trace only
    if changed:
        sections.append(Section("top-operators", "Operators whose time changed most against "
                                "the FP32 baseline (traced steps)", changed))
    return sections


def write_report(
    files: Iterable[str | Path], out: str | Path, labels: Iterable[str] | None = None
) -> list[Path]:
    """Draw every chart into ``out`` and write ``report.md`` and ``report.html``; return paths."""
    out, files = Path(out), list(files)
    df = load_results(files, labels)
    out.mkdir(parents=True, exist_ok=True)
    # Drawn into a hidden folder inside ``out`` (same filesystem), then moved in by renames:
    # a full disk or an interrupt while drawing leaves ``out`` as it was.
    staging = Path(tempfile.mkdtemp(prefix=atomic.temp_prefix("report"), suffix=".tmp",
                                    dir=out))
    try:
        made = _write_report_into(staging, out, files, df)
        written = []
        for path in made:
            os.replace(path, out / path.name)
            written.append(out / path.name)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_report_into(out: Path, final: Path, files: list, df) -> list[Path]:
    """``write_report``'s files, written into ``out``; ``final`` is where they will live."""
    written, drawn, skipped, pngs = [], [], [], {}
    for name, plot in CHARTS.items():
        try:
            fig = plot(df)
        except CannotPlot as why:
            skipped.append(f"- {name}: not drawn: {why}")
            continue
        for ext in ("png", "svg"):
            _save(fig, out / f"{name}.{ext}")
            written.append(out / f"{name}.{ext}")
        # The page embeds the same PNG as the file beside it.
        pngs[name] = base64.b64encode((out / f"{name}.png").read_bytes()).decode()
        plt.close(fig)
        drawn.append(name)
    runs = ", ".join(dict.fromkeys(df["run"]))
    title = f"gpubench report: {runs}"
    from gpubench.analysis.parity import parity_reports_beside
    from gpubench.report.memory import memory_reports_beside

    parity = parity_reports_beside(files)
    for r in parity:  # the page embeds the parity charts (here, or beside the results)
        name = r.get("chart", "parity.png")
        found = [c for c in (out / name, final / name, *(Path(f).parent / name for f in files))
                 if c.is_file()]
        if found:
            pngs[found[0].stem] = base64.b64encode(found[0].read_bytes()).decode()
    from gpubench.analysis.answer import tune_reports_beside
    from gpubench.measure.journal import failures_beside, skipped_beside

    sections = report_sections(df, drawn, skipped, memory_reports_beside(files), parity,
                               failures_beside(files), tune_reports_beside(files), final,
                               skipped_beside(files))
    # No link to a file the report's folder does not hold (a parity.md of no parity run, a
    # chart that was not drawn): its name stays, as text.
    held = {p.name for p in written} | {p.name for p in final.iterdir() if p.is_file()}
    sections = [Section(s.anchor, s.title, _held_links(s.body, held)) for s in sections]
    markdown = f"# {title}\n\n" + "\n".join(f"## {s.title}\n\n{s.body}" for s in sections)
    atomic.write_text(out / "report.md", markdown)
    written.append(out / "report.md")
    atomic.write_text(out / "report.html", render_html(title, sections, pngs))
    written.append(out / "report.html")
    return written


_LOCAL_LINK = re.compile(r"\[([^\]]+)\]\(([\w.-]+\.(?:md|json|png|svg|html))\)")


def _held_links(body: str, held: set[str]) -> str:
    """``body`` with each Markdown link to a file in the report's folder that is not among
    ``held`` turned into its text."""
    return _LOCAL_LINK.sub(lambda m: m.group(0) if m.group(2) in held else f"`{m.group(1)}`",
                           body)


def render_html(title: str, sections: list[Section], pngs: dict[str, str]) -> str:
    """A self-contained page: the sections' Markdown rendered with Python-Markdown (tables,
    table of contents, anchors), verdicts coloured, charts embedded as base64 PNG."""
    # Result files are data: no raw HTML from them reaches the page.
    parts = [f"## {s.title} {{#{s.anchor}}}\n\n{s.body.replace('<', '&lt;')}" for s in sections]
    # The answer opens the page, above the table of contents.
    first = 1 if sections and sections[0].anchor == "answer" else 0
    body = md_lib.markdown(
        "\n".join([*parts[:first], "**Contents**\n\n[TOC]\n", *parts[first:]]),
        extensions=["tables", "toc", "attr_list", "sane_lists"],
        extension_configs={"toc": {"toc_depth": "2-3"}},
        output_format="html",
    )
    for name, data in pngs.items():
        body = body.replace(f'src="{name}.png"', f'src="data:image/png;base64,{data}"')
        # Links to a chart (the advice's "chart" column) jump to it within the page.
        body = body.replace(f'href="{name}.png"', f'href="#{name}"')
    body = re.sub(
        r"<strong>(" + "|".join(map(re.escape, VERDICT_CLASSES)) + r")</strong>",
        lambda m: f'<strong class="verdict {VERDICT_CLASSES[m.group(1)]}">{m.group(1)}</strong>',
        body,
    )
    body = body.replace("<table>", '<div class="scroll"><table>').replace(
        "</table>", "</table></div>")
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{title.replace('<', '&lt;')}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n<h1>{title.replace('<', '&lt;')}</h1>\n{body}\n</body>\n</html>\n"
    )
