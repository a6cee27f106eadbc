"""Markdown tables, written by pandas (``DataFrame.to_markdown``, through ``tabulate``).

Every table gpubench writes (summary, advice, compare, memory, report, traces) goes through
``markdown_table``: GitHub-flavoured pipe tables with padded columns and alignment markers,
cells given as text by the caller (numbers formatted there), ``|`` escaped and line breaks
turned into spaces so that no cell breaks its row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd


def _cell(value: object) -> str:
    missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
    text = "-" if missing else str(value)
    return text.replace("\r\n", " ").replace("\n", " ").replace("|", "\\|")


def markdown_table(rows: pd.DataFrame | Iterable[Mapping[str, object]],
                   align: Sequence[str] | str = "left",
                   columns: Sequence[str] | None = None) -> str:
    """A Markdown pipe table of ``rows`` (a frame, or mappings of header -> cell), one column
    per header in order (``columns``: these headers, also for no rows); ``align``: "left" or
    "right" per column, or one for all."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=columns)
    frame = frame.astype(object).map(_cell)
    frame.columns = [_cell(c) for c in frame.columns]
    colalign = [align] * len(frame.columns) if isinstance(align, str) else list(align)
    if len(colalign) != len(frame.columns):
        raise ValueError(f"{len(colalign)} alignments for {len(frame.columns)} columns")
    return frame.to_markdown(index=False, tablefmt="pipe", colalign=colalign,
                             disable_numparse=True)


def format_figure(value: object, column: str) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column == "scaling_efficiency":
        return f"{100 * value:.0f}%"
    if column in ("speedup", "memory_ratio"):
        return f"{value:.2f}x"
    if column == "harness_overhead":
        return f"{100 * value:+.2f}%"
    if column == "mfu":
        return value if isinstance(value, str) else f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


TEXT_COLUMNS = ("case_id", "flags", "status")
"""Left-aligned columns; the others hold figures, right-aligned."""


def figures_table(frame: pd.DataFrame, columns: dict[str, str]) -> str:
    """A GitHub-flavoured Markdown table of ``columns`` (source name -> header), written by
    pandas (``markdown_table``): text left-aligned, figures right-aligned."""
    cells = pd.DataFrame({header: [format_figure(v, c) for v in frame[c]]
                          for c, header in columns.items()})
    return markdown_table(cells, ["left" if c in TEXT_COLUMNS else "right"
                                         for c in columns])
