"""The answer a reader came for, first: per model, the configuration to train with.

The decision is ``gpubench.analysis.decision.decide``'s: a model tuned by ``gpubench tune`` on
this machine (a ``tune.json`` beside the results, or in a ``tune-*`` folder beside them) is
answered by the tuner's winner; any other by the recommendation
(``gpubench.analysis.recommend``), with its reason and every faster measured configuration with
why it was not chosen, and a tune from elsewhere named as such. Each answer says where and when
its figures were measured. A case whose effective (global) batch differs from the baseline's is
marked wherever it is ranked (``batch_mark``): it does different work per step, and a user who
trains with it changes their training recipe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gpubench.analysis.decision import Decision, decide, relative
from gpubench.analysis.recommend import Recommendation, recommend
from gpubench.analysis.results import BATCH_MARK_NOTE, batch_mark
from gpubench.util.tables import markdown_table


def tune_reports_beside(files: Iterable) -> list[dict]:
    """The finished tunes (``tune.json`` with a result) beside each result file: in its folder
    or in a ``tune-*`` folder within it; each with ``path``, the file it came from."""
    folders = dict.fromkeys(Path(f).resolve().parent for f in files)
    out = []
    for folder in folders:
        found = sorted(folder.glob("tune-*/tune.json"), key=lambda p: p.stat().st_mtime)
        for path in [folder / "tune.json", *found]:  # the newest last
            if not path.is_file():
                continue
            try:
                result = json.loads(path.read_text()).get("result")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(result, dict) and isinstance(result.get("winner"), dict):
                out.append({**result, "path": str(path)})
    return out


def _tuned(d: Decision, base: Path | None) -> list[str]:
    t, model = d.tune, d.model
    w = t["winner"]
    md = Path(relative(t["path"], base)).with_name("tune.md")
    if d.is_baseline:
        head = (f"**{model}**: train with **`{t['baseline']}`**, the FP32 baseline: "
                f"{w.get('why', 'no configuration beat it')}.")
    else:
        head = (f"**{model}**: train with **`{w['case_id']}`**: {w['speedup']:.2f}x the FP32 "
                f"baseline's speed (95% CI {w['low']:.2f}-{w['high']:.2f}) at the same global "
                f"batch {t['global_batch']}, found by `gpubench tune` on this machine and "
                "confirmed with the training check and fresh paired rounds.")
    head += f" Measured by the tune on {d.where}."
    parity = t.get("parity")
    if isinstance(parity, dict):
        head += (f" Convergence parity against FP32 over {parity.get('steps')} steps: "
                 f"**{parity.get('verdict')}** ({parity.get('reason')}).")
    searched = sum(1 for c in t.get("candidates", []) if c.get("rounds"))
    lines = [head, "", f"The search measured {searched} of {len(t.get('candidates', []))} "
             f"configurations; the snippet to paste, the ablation and the diagnosis are in "
             f"[{md}]({md}).", ""]
    if d.differs:
        lines += [d.differs, ""]
    return lines


def _elsewhere(d: Decision, base: Path | None) -> list[str]:
    """A line per tune of the model that is not this run's answer: which, where, why."""
    lines = []
    for t in d.elsewhere:
        w = t.get("winner") or {}
        figure = (f" ({w['speedup']:.2f}x there)" if isinstance(w.get("speedup"), float)
                  and w.get("case_id") != t.get("baseline") else "")
        lines += [f"A tune of {d.model} from elsewhere is beside these results "
                  f"(`{relative(t['path'], base)}`, measured on {t['where']}): its winner "
                  f"`{w.get('case_id', '?')}`{figure} is not this run's answer "
                  f"({t['not_used']}).", ""]
    return lines


def _recommended(r: Recommendation, where: str = "") -> list[str]:
    chosen = (f"**`{r.case_id}`**, the FP32 baseline" if r.is_baseline else
              f"**`{r.case_id}`**, {r.speedup:.2f}x the FP32 baseline (95% CI {r.low:.2f}-"
              f"{r.high:.2f})")
    lines = [f"**{r.model}**: train with {chosen}: {r.reason}."
             + (f" Measured in this run on {where}." if where else "")]
    # The note's recipe-changing candidate is in the table below, with its reason.
    note = "; ".join(part for part in r.note.split("; ") if part and not (
        r.passed_over and part.startswith("faster but changes the training recipe")))
    if note:
        lines[0] += f" Note: {note}."
    lines.append("")
    if r.passed_over:
        rows = [{"faster configuration": f"`{p.case_id}`{batch_mark(p.batch_factor)}",
                 "speedup": f"{p.speedup:.2f}x",
                 "95% CI": f"{p.low:.2f}-{p.high:.2f}" if p.low == p.low else "-",
                 "why it was not chosen": p.why} for p in r.passed_over]
        lines += [markdown_table(rows, ["left", "right", "right", "left"]), ""]
    return lines


def answer_markdown(df: pd.DataFrame, tunes: list[dict] | None = None,
                    budget_bytes: float | None = None,
                    recommendations: list[Recommendation] | None = None,
                    base: Path | None = None) -> str:
    """Per model: the tuner's winner where a tune of it is given, else the recommendation with
    its reason and the faster configurations it passed over. ``base``: the folder links are
    written relative to."""
    tunes = tunes or []
    recs = recommend(df, budget_bytes) if recommendations is None else recommendations
    decisions = decide(df, tunes, budget_bytes, recs)
    lines = []
    for d in decisions:
        if d.source == "tune":
            lines += _tuned(d, base)
        else:
            lines += _recommended(d.recommendation, d.where)
        lines += _elsewhere(d, base)
    if not lines:
        return ""
    if any(p.batch_factor != 1 for r in recs for p in r.passed_over):
        lines += [f"*{BATCH_MARK_NOTE}.*", ""]
    if not any(d.source == "tune" for d in decisions):
        lines += ["Search combinations of techniques for one model with "
                  "`gpubench tune --model NAME`: its winner then answers here.", ""]
    return "\n".join(lines)
