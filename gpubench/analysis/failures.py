"""The failed cases of a run, as the summary, the advice and the report show them."""

from __future__ import annotations


def failures_markdown(failures: list[dict]) -> str:
    """The failed cases of a run (``gpubench.measure.journal.failures_beside``): one line each, with
    where its traceback is; empty when none failed."""
    if not failures:
        return ""
    lines = [f"| {f.get('case_id') or f.get('nodeid')} | {f.get('model') or ''} | "
             f"{(f.get('reason') or 'failed').replace('|', '/')} | {f.get('log') or ''} |"
             for f in failures]
    return ("\n### Failed cases\n\n| case | model | reason | traceback |\n| --- | --- | --- | "
            "--- |\n" + "\n".join(lines) + "\n")
