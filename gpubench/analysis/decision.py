"""The decision: per model, the one configuration the report tells a reader to train with, and
where and when its figures were measured. The answer at the top of the report, the advice's
"Recommended configuration" and the end of ``gpubench run`` all print this decision, so they
cannot disagree.

A model is answered by a ``gpubench tune`` winner only when that tune measured on this run's
machine with its library versions (``gpubench.measure.provenance``), in the same profile and
device, at the run's global batch; then the run's own recommendation, where it differs, is
named with why (the tune searched combinations the run did not measure). Otherwise the answer
is this run's recommendation (``gpubench.analysis.recommend``), and a tune of the model from
elsewhere is named as such (which, measured where and when, why it is not this run's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gpubench.analysis.recommend import Recommendation, recommend
from gpubench.measure.provenance import describe_fingerprint, fingerprint_difference


@dataclass(frozen=True)
class Decision:
    model: str
    case_id: str
    speedup: float
    low: float
    high: float
    is_baseline: bool
    source: str
    """``tune`` (a ``gpubench tune`` winner measured on this machine) or ``run`` (this run's
    recommendation)."""
    where: str
    """Where and when the figures were measured, in words."""
    recommendation: Recommendation | None = None
    """This run's own recommendation (``recommend``), whatever the source."""
    tune: dict | None = None
    """The tune answered with (``tune.json``'s result, with ``path``), or None."""
    elsewhere: tuple[dict, ...] = field(default_factory=tuple)
    """Tunes of this model not used, each with ``not_used`` (why) and ``where``."""

    @property
    def differs(self) -> str:
        """One line: why the tune's winner and the run's own recommendation differ, or ""."""
        rec = self.recommendation
        if self.source != "tune" or rec is None or rec.case_id == self.case_id:
            return ""
        searched = sum(1 for c in self.tune.get("candidates", []) if c.get("rounds"))
        return (f"This run's own cases alone point to `{rec.case_id}`"
                + ("" if rec.is_baseline else f" ({rec.speedup:.2f}x)")
                + f": the tune searched {searched} combinations of techniques, the run "
                "measures techniques one at a time and did not measure the winner.")


def run_fingerprint(rows: pd.DataFrame) -> dict | None:
    """The machine fingerprint of a run's records (the first recorded), or None."""
    if "fingerprint" not in rows:
        return None
    return next((f for f in rows["fingerprint"] if isinstance(f, dict)), None)


def run_where(rows: pd.DataFrame) -> str:
    """Where and when a run's records were measured, in words."""
    fp = run_fingerprint(rows)
    if fp is not None:
        return describe_fingerprint(fp)

    def first(column):
        values = rows[column].dropna() if column in rows else pd.Series(dtype=object)
        return str(values.iloc[0]) if len(values) else None

    cuda = "device" in rows and (rows["device"] == "cuda").any()
    hardware = first("device_name") if cuda else first("machine_cpu")
    parts = [hardware or "an unrecorded machine",
             f"torch {first('torch_version')}" if first("torch_version") else None,
             (first("datetime") or "")[:10] or None]
    return ", ".join(p for p in parts if p)


def _first(rows: pd.DataFrame, column: str):
    values = rows[column].dropna() if column in rows else pd.Series(dtype=object)
    return values.iloc[0] if len(values) else None


def _why_not(t: dict, rows: pd.DataFrame) -> str | None:
    """Why the tune ``t`` of a model does not answer for ``rows`` (the model's records of one
    run), or None when it does."""
    base = rows[rows["is_baseline"] == True] if "is_baseline" in rows else rows.iloc[:0]  # noqa: E712
    batch = _first(base, "global_batch")
    profile, device = _first(rows, "profile"), _first(rows, "device")
    if profile is not None and t.get("profile") != profile:
        return f"tuned in profile {t.get('profile')}, this run is {profile}"
    if device is not None and t.get("device") != device:
        return f"tuned on {t.get('device')}, this run is on {device}"
    if batch is not None and t.get("global_batch") != int(batch):
        return f"tuned at global batch {t.get('global_batch')}, this run's is {int(batch)}"
    differ = fingerprint_difference(t.get("fingerprint"), run_fingerprint(rows))
    if differ is not None:
        return ("measured on another machine or with other libraries (" + differ + ")"
                if isinstance(t.get("fingerprint"), dict) else
                "it records no machine, library versions or date: it cannot be shown to be "
                "from this machine")
    return None


def decide(df: pd.DataFrame, tunes: list[dict] | None = None,
           budget_bytes: float | None = None,
           recommendations: list[Recommendation] | None = None) -> list[Decision]:
    """Per model of ``df`` (one run): the tune's winner where a tune of it answers (see the
    module doc; the newest), else the recommendation."""
    tunes = tunes or []
    recs = recommend(df, budget_bytes) if recommendations is None else recommendations
    by_model = {r.model: r for r in recs}
    out = []
    for model in dict.fromkeys(df["model"].dropna()):
        rows = df[df["model"] == model]
        mine = [t for t in tunes if t.get("name", t.get("model")) == model]
        used, elsewhere = None, []
        for t in mine:
            why = _why_not(t, rows)
            if why is None:
                used = t  # the newest last
            else:
                elsewhere.append({**t, "not_used": why,
                                  "where": describe_fingerprint(t.get("fingerprint"))})
        rec = by_model.get(model)
        if used is not None:
            w = used["winner"]
            is_base = w["case_id"] == used["baseline"]
            out.append(Decision(model, w["case_id"], 1.0 if is_base else w["speedup"],
                                w.get("low", 1.0), w.get("high", 1.0), is_base, "tune",
                                describe_fingerprint(used.get("fingerprint")), rec, used,
                                tuple(elsewhere)))
        elif rec is not None:
            out.append(Decision(model, rec.case_id, 1.0 if rec.is_baseline else rec.speedup,
                                rec.low, rec.high, rec.is_baseline, "run", run_where(rows), rec,
                                None, tuple(elsewhere)))
    return out


def relative(path: str, base: Path | None) -> str:
    """``path`` relative to ``base`` where it lies within it."""
    if base is None:
        return path
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return path
