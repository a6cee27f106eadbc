"""Output paths checked before any work is done."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a folder gpubench writes into, or None: it is a writable folder,
    or it can be created (the nearest existing folder above it is writable). Creates nothing."""

    probe = path
    while not probe.is_dir():
        if probe.exists() or probe.is_symlink():
            if probe == path:
                return "is a file, not a folder" if probe.is_file() else "is not a folder"
            return f"lies under {probe}, which is not a folder"
        if probe.parent == probe:
            break
        probe = probe.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".gpubench-probe.", dir=probe))
    except OSError as err:
        where = "" if probe == path else f" (cannot create it in {probe})"
        return f"is not writable{where}: {err.strerror or err}"
    return None


def check_output(option: str, path, *, is_file: bool = False) -> Path:
    """``path`` of an output option (a folder, or with ``is_file`` a file), checked before any
    work: a one-line ``ValueError`` naming the option and the path when it cannot be written
    (a file where a folder goes, under a file, read-only). Creates nothing."""
    path = Path(path)
    if is_file and path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name")
    problem = folder_problem(path.parent if is_file else path)
    if problem:
        where = f" (its folder {path.parent})" if is_file else ""
        raise ValueError(f"{option} {path}{where} {problem}; nothing was done")
    return path


RUN_FILES = frozenset({
    "benchmark.json", "cases.jsonl",  # the results and their journal
    "summary.md", "advice.md", "memory.json", "memory.md",  # tables, verdicts, hygiene
    "report.md", "report.html", "parity.json", "parity.md",  # the report, --parity
})
"""The files a ``gpubench run`` writes into its results folder, charts aside (``CHART_NAMES``)."""

CHART_NAMES = ("speedup", "memory", "pareto", "accumulation", "scaling", "loader", "energy")
"""The report's charts (``gpubench.report.charts.CHARTS``), each drawn into ``<name>.png`` and
``<name>.svg``; ``--parity`` draws ``parity.png`` or one ``parity-<model>.png`` per model."""

RUN_DIRS = ("traces", "logs")
"""The folders a run writes into its results folder (a tune beside it: ``tune-<model>/``)."""


def is_run_output(name: str, is_dir: bool) -> bool:
    """Whether an entry ``name`` of a results folder is what a run (or a tune beside it) writes:
    what a new run sets aside. A file of the user's there (notes, a script's record, a chart
    of their own) is not, whatever its extension."""
    if is_dir:
        return name in RUN_DIRS or name.startswith("tune-")
    if name in RUN_FILES:
        return True
    stem, dot, ext = name.rpartition(".")
    return bool(dot) and ext in ("png", "svg") and (
        stem in CHART_NAMES or stem == "parity" or stem.startswith("parity-"))
