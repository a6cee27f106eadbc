"""The ``memory.json`` reports of ``gpubench memory`` (and of ``gpubench run``'s loop-hygiene
measurements), read for the advice and the report."""

from __future__ import annotations


def load_memory_reports(paths) -> list[dict]:
    """``memory.json`` files: one report of ``gpubench memory``, or a list of them (one per
    model, as ``gpubench run`` writes its loop-hygiene measurements). A bad one: a one-line
    ``ResultsError``."""
    from gpubench.analysis.results import load_report_files

    def problem(report: dict) -> str | None:
        if not isinstance(report.get("model"), str) \
                or not isinstance(report.get("frontier", []), list):
            return "no model or frontier"
        return None
    return load_report_files(paths, "memory.json", problem)


def memory_reports_beside(files) -> list[dict]:
    """The reports of the ``memory.json`` beside each result file, where there is one."""
    from gpubench.analysis.results import files_beside

    return load_memory_reports(files_beside(files, "memory.json"))
