"""The recommendation: the fastest measured configuration that measurably beats FP32 and trains
correctly (within a memory budget), and ``confirm``, which times it against the baseline in
alternating rounds."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from gpubench.analysis.results import (
    PARTNER_TOLERANCE,
    compile_cost_words,
    disturbed_words,
    numbers,
    partner_drift,
    with_baseline_ratios,
)
from gpubench.analysis.speed import (
    SpeedComparison,
    _speed_vs_baseline,
    compare_paired_rounds,
)
from gpubench.train.config import RunConfig, config_from_record, inert_techniques
from gpubench.train.techniques import TECHNIQUES
from gpubench.util.verdicts import ALPHA, MIN_EFFECT, Kind


@dataclass(frozen=True)
class Recommendation:
    model: str
    case_id: str
    speedup: float
    low: float
    high: float
    peak_memory_bytes: float
    budget_bytes: float | None
    confirmed: bool = False
    """Re-measured against the baseline in alternating rounds (``confirm``)."""
    note: str = ""
    is_baseline: bool = False
    reason: str = ""
    """Why this configuration: what it beat, or why none beat the baseline."""
    passed_over: tuple[PassedOver, ...] = ()
    """Measured configurations with a higher speedup than this one's, each with why it was
    not chosen (fastest first)."""


@dataclass(frozen=True)
class PassedOver:
    case_id: str
    speedup: float
    low: float
    high: float
    batch_factor: float
    """Its effective (global) batch over the baseline's (1: the same)."""
    why: str


def budget_measure(df: pd.DataFrame) -> pd.Series:
    """The memory a budget is held to: the peak, on the CPU the training peak above the
    resident base (``peak_above_base_bytes``) where the record has it."""
    peak = numbers(df["peak_memory_bytes"])
    if "peak_above_base_bytes" in df:
        peak = numbers(df["peak_above_base_bytes"]).fillna(peak)
    return peak


PASSED_OVER_SHOWN = 8
"""At most this many passed-over candidates per model (the fastest)."""


def _passed_over(measured: pd.DataFrame, baseline: pd.Series, chosen: pd.Series, eligible: set,
                 excluded: dict, budget_bytes: float | None, alpha: float, n: int
                 ) -> tuple[PassedOver, ...]:
    """Every measured case of the model faster than the ``chosen`` one (by the speedup
    column), with the first rule of ``recommend`` it fails."""
    out = []
    faster = measured[(measured["speedup"] > float(chosen["speedup"]))
                      & ~measured["case_id"].isin([baseline["case_id"], chosen["case_id"]])]
    for _, row in faster.sort_values("speedup", ascending=False).iterrows():
        if len(out) == PASSED_OVER_SHOWN:
            break
        speed = _speed_vs_baseline(baseline, row)
        gb, base_gb = row.get("global_batch"), baseline.get("global_batch")
        factor = (float(gb) / float(base_gb) if pd.notna(gb) and pd.notna(base_gb)
                  else float("nan"))
        peak = budget_measure(row.to_frame().T).iloc[0]
        if row["case_id"] in excluded:
            why = excluded[row["case_id"]]
        elif row["case_id"] not in eligible:
            parallel, ranks = row.get("parallel"), row.get("world_size")
            if isinstance(parallel, str) and parallel != "single":
                why = (f"runs {parallel} on "
                       f"{int(ranks) if pd.notna(ranks) else 'several'} processes: the "
                       "recommendation compares single-device configurations")
            else:
                why = (f"loads its batches from {row.get('dataset')}: the recommendation "
                       f"compares configurations on the baseline's ({baseline.get('dataset')})")
        elif budget_bytes is not None and not pd.notna(peak):
            why = "its peak memory was not measured, so it cannot be held to the budget"
        elif budget_bytes is not None and peak > budget_bytes:
            why = (f"peak memory {peak / 2**20:,.0f} MiB is over the budget of "
                   f"{budget_bytes / 2**20:,.0f} MiB")
        elif factor != 1:
            why = ("changes the training recipe: effective batch "
                   + (f"{int(gb)} vs {int(base_gb)}" if factor == factor else "unknown"))
        elif row.get("optimizer") != baseline.get("optimizer"):
            why = f"changes the training recipe: optimizer {row.get('optimizer')} vs " \
                  f"{baseline.get('optimizer')}"
        elif not speed.p_value < alpha:
            why = (f"not significant: p={speed.p_value:.2g}, where {n} candidates need "
                   f"p < {alpha:.2g} (Bonferroni)")
        elif speed.ratio < 1 + MIN_EFFECT:
            why = f"under the smallest counted effect ({MIN_EFFECT:.0%} faster)"
        else:
            why = "not a candidate of the recommendation (see its rules)"
        out.append(PassedOver(row["case_id"], speed.ratio, speed.low, speed.high, factor, why))
    return tuple(out)


def recommend(df: pd.DataFrame, budget_bytes: float | None = None) -> list[Recommendation]:
    """Per model: the fastest single-device configuration (device-resident batches, so that
    techniques compare, not loaders; techniques that do nothing on this device left out), or
    stack of techniques (the recipe group's cases, with their loader and DDP), that
    keeps the baseline's training recipe (the same effective batch and optimizer), whose peak
    memory fits the budget and that beats the FP32 baseline significantly (Bonferroni-corrected
    over the candidates, and by at least ``MIN_EFFECT``); the baseline itself when none does. A
    faster configuration that changes the recipe is named in the note, not recommended; FP8
    emulated without FP8 units is no candidate; a compiled winner's note says when its
    compilation pays off."""
    df = with_baseline_ratios(df)
    out = []
    for model in dict.fromkeys(df["model"].dropna()):
        measured = df[(df["model"] == model) & df["step_time_s"].notna()]
        base_rows = measured[measured["is_baseline"] == True]  # noqa: E712
        dataset = base_rows["dataset"].iloc[0] if len(base_rows) else "device-resident"
        # Single-device techniques on the baseline's batches, and the recipe group's stacks
        # (whatever their data path and parallelism: what a reader of S1 would run).
        stack = (measured["group"] == "recipe").fillna(False).astype(bool) if (
            "group" in measured) else False
        sub = measured[((measured["parallel"] == "single") & (measured["dataset"] == dataset))
                       | stack]
        if sub.empty:
            continue
        # A technique that does nothing on this device can only "win" by measurement noise.
        # So can an emulated one: FP8 without FP8 units runs its casts in higher precision. And
        # a case whose baseline rounds beside it ran slower than that baseline at rest just
        # before them (``partner_drift``).
        excluded = {}  # case id: why it is no candidate
        for _, r in sub.iterrows():
            does_nothing = inert_techniques(r.to_dict())
            if does_nothing:
                excluded[r["case_id"]] = (f"{', '.join(does_nothing)} does nothing on this "
                                       "device: its gain is noise")
            elif r.get("fp8_emulated") is True:
                excluded[r["case_id"]] = "FP8 emulated without FP8 units (casts in bf16)"
            elif (drift := partner_drift(r)) is not None and drift > PARTNER_TOLERANCE:
                # Its speedup is read against a baseline its presence slowed, which flatters it.
                excluded[r["case_id"]] = (f"{Kind.DISTURBED}: {disturbed_words(r)}, so its "
                                       "speedup is not what switching gives")
        eligible = set(sub["case_id"])
        sub = sub[~sub["case_id"].isin(excluded)]
        if budget_bytes is not None:
            sub = sub[budget_measure(sub) <= budget_bytes]
        base = sub[sub["is_baseline"] == True]  # noqa: E712
        if sub.empty or base.empty:
            continue
        baseline = base.iloc[0]
        same_recipe = ((sub["global_batch"] == baseline["global_batch"])
                       & (sub["optimizer"] == baseline["optimizer"]))
        alpha = ALPHA / max(1, len(sub) - 1)

        def best_of(rows: pd.DataFrame, baseline=baseline, alpha=alpha):
            for _, row in rows.sort_values("speedup", ascending=False).iterrows():
                if row["case_id"] == baseline["case_id"]:
                    continue
                speed = _speed_vs_baseline(baseline, row)
                if speed.p_value < alpha and speed.ratio >= 1 + MIN_EFFECT:
                    return row, speed
            return None, None

        best, best_speed = best_of(sub[same_recipe])
        other, other_speed = best_of(sub[~same_recipe])
        note = ""
        if other is not None and (best_speed is None or other_speed.ratio > best_speed.ratio):
            note = (f"faster but changes the training recipe: `{other['case_id']}` "
                    f"{other_speed.ratio:.2f}x (effective batch {int(other['global_batch'])} vs "
                    f"{int(baseline['global_batch'])}, optimizer {other['optimizer']} vs "
                    f"{baseline['optimizer']})")
        if best is None:
            best, best_speed = baseline, SpeedComparison(1.0, 1.0, 1.0, 1.0, "none")
            reason = ("no configuration with the baseline's recipe beat FP32 significantly "
                      + (f"(p < {alpha:.2g}, Bonferroni over {len(sub) - 1}) "
                         if len(sub) > 1 else "")
                      + f"by {MIN_EFFECT:.0%} or more"
                      + ("" if len(sub) > 1 else " (none was measured)"))
        else:
            reason = (f"the fastest of {int(same_recipe.sum()) - 1} configurations with the "
                      f"baseline's recipe to beat FP32 significantly (p < {alpha:.2g}, "
                      f"Bonferroni over {len(sub) - 1}) by {MIN_EFFECT:.0%} or more")
        if best is not baseline and pd.notna(best.get("compile_time_s")):
            note = "; ".join(filter(None, [compile_cost_words(best), note]))
        passed = _passed_over(measured, baseline, best, eligible, excluded,
                              budget_bytes, alpha, len(sub) - 1)
        out.append(Recommendation(model, best["case_id"], best_speed.ratio, best_speed.low,
                                  best_speed.high, float(best["training_memory_bytes"]),
                                  budget_bytes, note=note, is_baseline=best is baseline,
                                  reason=reason, passed_over=passed))
    return out


STRATEGY_FIELDS = ("parallel", "world_size", "ddp_no_sync", "fsdp_mixed_precision", "chunks",
                   "schedule")
"""The techniques that make the parallel layout, which ``confirm`` keeps."""


def confirm_baseline(cfg: RunConfig) -> RunConfig:
    """What ``confirm`` measures a configuration against: every technique of the step off
    (from the declarations), its data path and parallel layout kept (a recipe stack is
    confirmed against FP32 on the same loader and ranks)."""
    return cfg.with_(**{t.field: t.default for t in TECHNIQUES
                        if not t.loader and t.field not in STRATEGY_FIELDS})


def confirm(rec: Recommendation, df: pd.DataFrame, rounds: int = 20) -> Recommendation:
    """Re-measure a recommended configuration against the FP32 baseline in alternating rounds:
    separately measured cases can differ by machine drift alone. Keeps the recommendation
    only if the interleaved comparison also shows a significant win."""
    from gpubench.measure.standalone import StandaloneBenchmark
    from gpubench.suite.claims import ClaimPair, measure_pair

    rows = df.set_index("case_id")
    new = config_from_record(rows.loc[rec.case_id].to_dict())
    base = confirm_baseline(new)
    if base == new:
        return rec
    bench = StandaloneBenchmark(f"confirm-{rec.case_id}")
    info = measure_pair(bench, ClaimPair("recommendation", base, new), rounds, 1)
    speed = compare_paired_rounds(np.asarray(info["rounds_base_s"]) / info["global_batch_base"],
                                  np.asarray(info["rounds_new_s"]) / info["global_batch_new"])
    if speed.p_value < ALPHA and speed.ratio >= 1 + MIN_EFFECT:
        return replace(rec, speedup=speed.ratio, low=speed.low, high=speed.high,
                       confirmed=True)
    base_row = rows.loc[base.id] if base.id in rows.index else None
    peak = float(base_row["peak_memory_bytes"]) if base_row is not None else float("nan")
    return replace(rec, case_id=base.id, speedup=1.0, low=speed.low, high=speed.high,
                   peak_memory_bytes=peak, confirmed=True, is_baseline=True,
                   reason=(why := f"{rec.case_id} did not beat FP32 in alternating rounds "
                           f"({speed.describe()})"), note=why)
