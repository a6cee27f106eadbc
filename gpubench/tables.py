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
