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


SKIPPED_NAMED = 12
"""At most this many cases named per reason; the rest are counted."""


def skipped_markdown(skipped: list[dict]) -> str:
    """The cases a run skipped (``gpubench.measure.journal.skipped_beside``), grouped by their
    reason: what the run did not measure, and why; empty when none was skipped."""
    if not skipped:
        return ""
    groups: dict[str, list[str]] = {}
    for s in skipped:
        groups.setdefault(s.get("reason") or "skipped", []).append(
            str(s.get("case_id") or s.get("nodeid")))
    rows = []
    for reason, cases in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        named = ", ".join(f"`{c}`" for c in cases[:SKIPPED_NAMED])
        if len(cases) > SKIPPED_NAMED:
            named += f" and {len(cases) - SKIPPED_NAMED} more"
        rows.append(f"| {reason.replace('|', '/')} | {len(cases)} | {named} |")
    return (f"{len(skipped)} cases were not measured on this machine, by reason:\n\n"
            "| why | cases | which |\n| --- | ---: | --- |\n" + "\n".join(rows) + "\n")
