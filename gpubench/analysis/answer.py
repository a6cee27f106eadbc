"""The answer a reader came for, first: per model, the configuration to train with.

A model tuned by ``gpubench tune`` (a ``tune.json`` beside the results, or in a ``tune-*``
folder beside them) is answered by the tuner's winner; any other by the recommendation
(``gpubench.analysis.recommend``), with its reason and every faster measured configuration with
why it was not chosen. A case whose effective (global) batch differs from the baseline's is
marked wherever it is ranked (``batch_mark``): it does different work per step, and a user who
trains with it changes their training recipe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

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


def _tune_for(model: str, rows: pd.DataFrame, tunes: list[dict]) -> dict | None:
    """The newest tune of ``model`` in the same profile and device type, at the global batch
    of the run's baseline (a tune at another batch answers another question)."""
    def first(column):
        values = rows[column].dropna() if column in rows else pd.Series(dtype=object)
        return values.iloc[0] if len(values) else None

    base = rows[rows["is_baseline"] == True] if "is_baseline" in rows else rows.iloc[:0]  # noqa: E712
    batch = base["global_batch"].dropna().iloc[0] if len(base) and "global_batch" in base \
        and base["global_batch"].notna().any() else None
    profile, device = first("profile"), first("device")
    found = [t for t in tunes if t.get("name", t.get("model")) == model
             and (profile is None or t.get("profile") == profile)
             and (device is None or t.get("device") == device)
             and (batch is None or t.get("global_batch") == int(batch))]
    return found[-1] if found else None


def _tuned(model: str, t: dict, base: Path | None) -> list[str]:
    w = t["winner"]
    where = t["path"] if base is None else _relative(t["path"], base)
    md = Path(where).with_name("tune.md")
    if w["case_id"] == t["baseline"]:
        head = (f"**{model}**: train with **`{t['baseline']}`**, the FP32 baseline: "
                f"{w.get('why', 'no configuration beat it')}.")
    else:
        head = (f"**{model}**: train with **`{w['case_id']}`**: {w['speedup']:.2f}x the FP32 "
                f"baseline's speed (95% CI {w['low']:.2f}-{w['high']:.2f}) at the same global "
                f"batch {t['global_batch']}, found by `gpubench tune` and confirmed with the "
                "training check and fresh paired rounds.")
    parity = t.get("parity")
    if isinstance(parity, dict):
        head += (f" Convergence parity against FP32 over {parity.get('steps')} steps: "
                 f"**{parity.get('verdict')}** ({parity.get('reason')}).")
    searched = sum(1 for c in t.get("candidates", []) if c.get("rounds"))
    return [head, "", f"The search measured {searched} of {len(t.get('candidates', []))} "
            f"configurations; the snippet to paste, the ablation and the diagnosis are in "
            f"[{md}]({md}).", ""]


def _relative(path: str, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return path


def _recommended(r: Recommendation) -> list[str]:
    chosen = (f"**`{r.case_id}`**, the FP32 baseline" if r.is_baseline else
              f"**`{r.case_id}`**, {r.speedup:.2f}x the FP32 baseline (95% CI {r.low:.2f}-"
              f"{r.high:.2f})")
    lines = [f"**{r.model}**: train with {chosen}: {r.reason}."]
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
    by_model = {r.model: r for r in recs}
    lines = []
    for model in dict.fromkeys(df["model"].dropna()):
        rows = df[df["model"] == model]
        t = _tune_for(model, rows, tunes)
        if t is not None:
            lines += _tuned(model, t, base)
        elif model in by_model:
            lines += _recommended(by_model[model])
    if not lines:
        return ""
    if any(p.batch_factor != 1 for r in recs for p in r.passed_over):
        lines += [f"*{BATCH_MARK_NOTE}.*", ""]
    if not tunes:
        lines += ["Search combinations of techniques for one model with "
                  "`gpubench tune --model NAME`: its winner then answers here.", ""]
    return "\n".join(lines)
