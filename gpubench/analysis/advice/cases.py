"""The advice's building blocks: a verdict, and the measured cases of one model found by
configuration (``_Cases``), which every judge reads."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd

from gpubench.analysis.results import same_configuration, twin
from gpubench.analysis.speed import (
    SpeedComparison,
    _speed_vs_baseline,
    compare_paired_rounds,
    compare_speed,
)
from gpubench.suite.claims import CLAIMS
from gpubench.train.config import baseline_fields
from gpubench.train.techniques import TECHNIQUES
from gpubench.util.verdicts import Kind


@dataclass(frozen=True)
class Verdict:
    model: str
    claim: str
    measured: str
    verdict: str
    why: str
    chart: str


LOADER_FIELDS = tuple(t.field for t in TECHNIQUES if t.loader)
"""The data loader's fields (dataset, workers, pinning, caching, ...)."""

BASELINE_FIELDS = baseline_fields()
"""The baseline's configuration: ``_Cases.find`` matches every field not named otherwise."""


_ANY = object()


_MISSING = object()
"""Stands for a missing value (None, NaN, <NA>) in a column's values (``_Cases.values``)."""


def _flag(value) -> bool:
    """A boolean field that is set (not False, missing or <NA>)."""
    return isinstance(value, bool | np.bool_) and bool(value)


def _memory(row: pd.Series) -> float:
    """The memory a technique changes (``results.training_memory``)."""
    return float(row["training_memory_bytes"])


class _Cases:
    """The measured step cases of one model in one run (``frame``, one row per case id), and its
    paired claims. Cases are found by queries on the frame: ``find`` by configuration,
    ``where`` and ``first`` by a mask of its columns (``col``, ``flag``, ``is_``)."""

    def __init__(self, df: pd.DataFrame, model: str, memory: dict | None = None):
        self.memory = memory
        """This model's ``gpubench memory`` report (``memory.json``: frontier, hygiene), or
        None when the results come without one."""
        self.parity: dict | None = None
        """This model's ``gpubench parity`` report (``parity.json``), or None."""
        sub = df[(df["model"] == model) & df["step_time_s"].notna()]
        if "case_id" in sub:
            sub = sub[~sub["case_id"].duplicated(keep="last")]
        self.frame = sub.reset_index(drop=True)
        self._values: dict[str, np.ndarray] = {}
        self._rows = [row for _, row in self.frame.iterrows()]  # what a query hands back
        claims = df[df["kind"] == "claim"] if "kind" in df else df.iloc[0:0]
        self.pairs = [r for _, r in claims[claims["model"] == model].iterrows()]
        """This model's interleaved claim pairs (``gpubench.suite.claims``): ``pair`` finds
        one by its claim and sides."""
        self.model = model
        self.device = sub["device"].iloc[0] if len(sub) else "cpu"
        self.peaks = sub["matmul_peak_tflops"].iloc[0] if "matmul_peak_tflops" in sub and len(
            sub) else None
        self.defaults = dict(BASELINE_FIELDS)
        base = self.first(self.flag("is_baseline"))
        if base is not None and pd.notna(base.get("micro_batch")):
            # The baseline's micro-batch, too: a case at another batch is another
            # configuration (found only when asked for by its micro_batch).
            self.defaults["micro_batch"] = int(base["micro_batch"])
        if base is not None and isinstance(base["dataset"], str):
            # Results measured before batches were device-resident by default: their baseline
            # (and every technique case) read "synthetic" samples through the loader.
            self.defaults["dataset"] = base["dataset"]

    def col(self, name: str) -> pd.Series:
        """Column ``name`` of the frame (all missing where the records lack it)."""
        if name in self.frame:
            return self.frame[name]
        return pd.Series([None] * len(self.frame), index=self.frame.index, dtype=object)

    def values(self, name: str) -> np.ndarray:
        """Column ``name`` as objects, ``_MISSING`` where a value is missing (cached)."""
        if name not in self._values:
            column = self.col(name)
            out = column.to_numpy(dtype=object).copy()
            out[column.isna().to_numpy()] = _MISSING
            self._values[name] = out
        return self._values[name]

    def flag(self, name: str) -> np.ndarray:
        """Mask: a boolean column that is set (not False, missing or <NA>)."""
        return np.fromiter((_flag(v) for v in self.values(name)), bool, len(self.frame))

    def is_(self, name: str, value) -> np.ndarray:
        """Mask: column ``name`` equals ``value`` (False where missing)."""
        return np.fromiter((v is not _MISSING and bool(v == value) for v in self.values(name)),
                           bool, len(self.frame))

    def missing(self, name: str) -> np.ndarray:
        """Mask: column ``name`` is missing (or the records lack it)."""
        return np.fromiter((v is _MISSING for v in self.values(name)), bool, len(self.frame))

    def where(self, mask) -> list[pd.Series]:
        """The cases where ``mask`` holds, in the run's order."""
        return [self._rows[i] for i in np.flatnonzero(np.asarray(mask, dtype=bool))]

    def first(self, mask) -> pd.Series | None:
        """The first case where ``mask`` holds, or None."""
        hits = np.flatnonzero(np.asarray(mask, dtype=bool))
        return self._rows[hits[0]] if len(hits) else None

    def like(self, ref: pd.Series, vary=()) -> np.ndarray:
        """Mask: the cases that are ``ref``'s configuration in every field but those in
        ``vary`` (``results.same_configuration``)."""
        return same_configuration(self.frame, ref, vary).to_numpy(dtype=bool)

    def twin(self, row: pd.Series, vary) -> pd.Series | None:
        """The case that is ``row``'s configuration with only the fields in ``vary``
        different (``results.twin``), or None."""
        return twin(self.frame, row, vary)

    def find(self, **fields) -> pd.Series | None:
        """The measured case whose configuration has ``fields`` and otherwise the baseline's
        (single device, device-resident batches, SGD, fp32, ...): cases are found by
        configuration. A field a record lacks (an older file) or leaves empty
        (``prefetch_factor`` of a loader without one) is taken at the baseline's value, and
        matches anything where that is not known."""
        mask = np.ones(len(self.frame), dtype=bool)
        for key, value in {**self.defaults, **fields}.items():
            default = self.defaults.get(key, _ANY)
            match = self.is_(key, value)
            if default is _ANY or bool(default == value):
                match |= self.missing(key)  # a missing field is taken at the baseline's value
            mask &= match
        return self.first(mask)

    def knob_workers(self) -> int | None:
        """The worker count this model's loader knobs (pinning, prefetch, persistence) were
        measured at (``cases.knob_workers`` on the measuring machine), or None."""
        base = self.find()
        if base is None:
            return None
        row = self.first(self.like(base, vary=LOADER_FIELDS) & (
            self.flag("pin_memory") | self.flag("persistent_workers")
            | ~self.missing("prefetch_factor")))
        return None if row is None else int(row["num_workers"])

    def claim_case(self, claim: str, side: str = "new", **extra) -> pd.Series | None:
        """The measured case of one side of ``CLAIMS[claim]``, found by its configuration
        (the claim's fields evaluated for this model's records, then ``extra`` fields), or None
        (not measured, or the claim does not apply to this workload)."""
        base = self.find()
        if base is None:
            return None
        described = SimpleNamespace(  # what the claims' field functions read of a baseline
            workload=SimpleNamespace(dataset_names=_own_datasets(self) or [], min_batch=1),
            resolved_micro_batch=int(base["micro_batch"]), device=self.device,
            knob_workers=self.knob_workers())
        fields = CLAIMS[claim].fields(side, described)
        if fields is None:
            return None
        return self.find(**{**fields.pop("loader", {}), **fields, **extra})

    def pair(self, claim: str, base: pd.Series | None = None,
             new: pd.Series | None = None) -> pd.Series | None:
        """The interleaved pair of ``claim`` whose sides are the cases ``base`` and ``new``
        (its ``case_id_base`` and ``case_id_new``; a side not given, or that the record does
        not name, matches any), or None."""
        for pair in self.pairs:
            if pair["claim"] != claim:
                continue
            named = {side: pair.get(f"case_id_{side}") for side in ("base", "new")}
            if all(row is None or not isinstance(named[side], str)
                   or named[side] == row.get("case_id")
                   for side, row in (("base", base), ("new", new))):
                return pair
        return None

    def speed(self, claim: str, base: pd.Series | None,
              new: pd.Series | None) -> tuple[SpeedComparison, str]:
        """From the claim's interleaved pair of these two cases when measured (``pair``);
        else, against the baseline, from the case's rounds each paired with a baseline round;
        else from the two cases."""
        pair = self.pair(claim, base, new)
        if pair is not None:
            a = np.asarray(pair["rounds_base_s"]) / pair["global_batch_base"]
            b = np.asarray(pair["rounds_new_s"]) / pair["global_batch_new"]
            return compare_paired_rounds(a, b), "interleaved rounds"
        # gpubench.measure.telemetry: a case timed while the machine was contended says so in the
        # why
        busy = (f" ({Kind.CONTENDED})"
                if any(r.get("contended") is True for r in (base, new)) else "")
        if (base.get("is_baseline") is True and new.get("speedup_method") == "paired"
                and pd.notna(new.get("speedup_low"))):
            return _speed_vs_baseline(base, new), "rounds paired with baseline rounds" + busy
        return compare_speed(base, new), "separate cases" + busy


def _missing(model: str, claim: str, chart: str, what: str) -> Verdict:
    return Verdict(model, claim, "-", Kind.INCONCLUSIVE, f"not measured in these results ({what})",
                   chart)


def _range(claimed: tuple[float, float], memory: bool = False) -> str:
    low, high = claimed
    if memory:
        return f"x{high:.2g} or less" if low == 0 else f"x{low:.2g}-{high:.2g}"
    return f"{low:.3g}x or more" if high == float("inf") else f"{low:.3g}-{high:.3g}x"


def _own_datasets(c: _Cases) -> list[str] | None:
    """The workload's own dataset names from its records (None: the records do not say)."""
    return next((names for names in c.col("workload_datasets") if isinstance(names, list)),
                None)


def _not_applicable(c: _Cases, claim: str, why: str, chart: str) -> Verdict:
    return Verdict(c.model, claim, "-", Kind.NOT_APPLICABLE, why, chart)
