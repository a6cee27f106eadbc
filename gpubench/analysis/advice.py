"""The advice check: each common speed-up claim, tested on this machine's measured cases.

Each claim is split into its parts (AMP: time and memory), and each part is judged against the
size the articles claim (``gpubench.suite.claims.CLAIMS``, the data the paired benchmarks read
too), on
its statistical basis (``gpubench.util.stats``), per sample so that cases with different batches
compare fairly. Speed comes, in order of preference, from
the claim's own pair measured in alternating rounds, from the case's rounds each paired with a
baseline round (``speedup_paired``), or from two separately measured cases (Mann-Whitney and a
bootstrap interval of the ratio of medians). A part:

- *holds*: a significant change in the claimed direction whose 95% interval reaches the claimed
  range (a "~30% less time" claim needs an interval reaching 1.25x, not a 10% gain);
- *smaller than claimed*: significant and in the claimed direction, but the whole interval falls
  short of the claimed range;
- *does not hold*: significant the other way, or no effect (the interval within
  +-``MIN_EFFECT``);
- *inconclusive*: none of these (too noisy, or not measured).

A claim holds when every part holds, *partly holds* (naming the part) when some do; it is *not
applicable* when the workload lacks what it is about (no dataset to cache), and *not testable
here* when the machine cannot show it (CUDA-only effects on a CPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd

from gpubench.analysis.decision import Decision, decide
from gpubench.analysis.recommend import Recommendation
from gpubench.analysis.results import with_baseline_ratios
from gpubench.analysis.speed import (
    SpeedComparison,
    _speed_vs_baseline,
    compare_paired_rounds,
    compare_rounds,
    compare_speed,
    judge_memory,
)
from gpubench.suite.claims import CLAIMS
from gpubench.train.config import FP8_PRECISIONS, baseline_fields, inert_techniques
from gpubench.util.verdicts import FAILED, MIN_EFFECT, Kind, combine_parts


@dataclass(frozen=True)
class Verdict:
    model: str
    claim: str
    measured: str
    verdict: str
    why: str
    chart: str
















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
        self.pairs = {r["claim"]: r for _, r in claims[claims["model"] == model].iterrows()}
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
        row = self.first(self.flag("pin_memory") | self.flag("persistent_workers")
                         | ~self.missing("prefetch_factor"))
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

    def speed(self, claim: str, base: pd.Series, new: pd.Series) -> tuple[SpeedComparison, str]:
        """From the claim's interleaved pair when measured; else, against the baseline, from
        the case's rounds each paired with a baseline round; else from the two cases."""
        pair = self.pairs.get(claim)
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


def check_amp(c: _Cases) -> list[Verdict]:
    """S0: each AMP precision (fp16 with GradScaler, bf16) against the FP32 baseline: its
    paired speedup and its training memory, each part judged against its claimed range."""
    base = c.find()
    out = []
    for precision in ("fp16", "bf16"):
        claim = CLAIMS[f"amp-{precision}"]
        amp = c.claim_case(claim.key)
        if base is None or amp is None:
            out.append(_missing(c.model, f"{claim.text} ({precision})", "speedup.png",
                                f"{c.model}-fp32 and {c.model}-{precision}"))
            continue
        speed, basis = c.speed(claim.key, base, amp)
        memory = _memory(amp) / _memory(base)
        parts = {"time": speed.judge(claim.parts["time"]),
                 "memory": judge_memory(memory, claim.parts["memory"])}
        why = (f"{basis}; time {parts['time']} (claimed {_range(claim.parts['time'])}), "
               f"memory {parts['memory']} (claimed {_range(claim.parts['memory'], True)})")
        if c.peaks and c.peaks.get(precision) and c.peaks.get("fp32"):
            fast, slow = c.peaks[precision], c.peaks["fp32"]
            why += (f"; measured matmul peak {precision} {fast:.3g} vs fp32 {slow:.3g} TFLOP/s")
            if fast < slow:
                why += f": this device has no fast {precision} matrix units"
        out.append(Verdict(c.model, f"{claim.text} ({precision})",
                           f"{speed.describe()}, memory x{memory:.2f}", combine_parts(parts),
                           why, "speedup.png"))
    return out


def check_accumulation(c: _Cases) -> list[Verdict]:
    """S0, S1, S4: k = 4 micro-batches at the baseline's effective batch against the baseline:
    training memory judged against the claimed range, with the speed it costs."""
    claim = CLAIMS["accumulation"]
    base = c.find()
    k = claim.new["accum_steps"]
    # The claim's case: k micro-batches at the baseline's effective batch (its micro-batch is
    # the baseline's / k, found by the global batch so that a workload's minimum batch holds).
    row = None if base is None else c.first(
        c.is_("accum_steps", k) & c.is_("global_batch", base["global_batch"])
        & c.is_("precision", "fp32") & c.is_("parallel", "single")
        & c.is_("dataset", base.get("dataset")))
    if row is None:
        return [_missing(c.model, claim.text, "accumulation.png",
                         f"accumulation k={k} at constant batch")]
    memory = _memory(row) / _memory(base)
    speed, basis = c.speed(claim.key, base, row)
    return [_accumulation_verdict(c, claim.text, k, memory, speed, basis)]


def _accumulation_verdict(c: _Cases, claim: str, k: int, memory: float,
                          speed: SpeedComparison, basis: str) -> Verdict:
    verdict = judge_memory(memory, CLAIMS["accumulation"].parts["memory"])
    return Verdict(c.model, claim, f"k={k}: memory x{memory:.2f}, {speed.describe()}", verdict,
                   f"{basis}; smaller micro-batches keep fewer activations (gradients and "
                   f"optimizer state stay); the price is {k} sequential micro-steps",
                   "accumulation.png")


def _own_datasets(c: _Cases) -> list[str] | None:
    """The workload's own dataset names from its records (None: the records do not say)."""
    return next((names for names in c.col("workload_datasets") if isinstance(names, list)),
                None)


def _not_applicable(c: _Cases, claim: str, why: str, chart: str) -> Verdict:
    return Verdict(c.model, claim, "-", Kind.NOT_APPLICABLE, why, chart)


def check_loader_workers(c: _Cases) -> list[Verdict]:
    """S0, S1: the workload's own data read warm with 0 loader workers against its fastest
    worker count at the same micro-batch."""
    spec = CLAIMS["loader-workers"]
    claim = spec.text
    own = _own_datasets(c)
    if own == []:
        return [_not_applicable(c, claim, "the workload has no dataset of its own: its batches "
                                "are made in memory, there is no loading to speed up",
                                "loader.png")]
    # Warm data only: the cold cases (files read from the disk) answer the storage claim.
    plain = c.find()
    warm = ~c.flag("cached") & ~c.flag("cold")
    base = None if plain is None else c.first(
        ~c.missing("dataset") & ~c.is_("dataset", "synthetic")
        & ~c.is_("dataset", "device-resident")
        & c.is_("num_workers", 0) & warm & c.is_("micro_batch", plain["micro_batch"]))
    tuned = [] if base is None else c.where(
        c.is_("dataset", base["dataset"])
        & np.array([v is not _MISSING and v > 0 for v in c.values("num_workers")], dtype=bool)
        & c.is_("micro_batch", base["micro_batch"]) & warm
        # the loader group's cases: the baseline's step (not a recipe stack's)
        & c.is_("precision", "fp32") & c.is_("accum_steps", 1) & c.is_("parallel", "single"))
    if not tuned:
        return [_missing(c.model, claim, "loader.png", "on-disk data with 0 and more workers")]
    best = max(tuned, key=lambda r: r["samples_per_s"])
    speed = compare_speed(base, best)
    verdict = speed.judge(spec.parts["time"])
    why = (f"separate cases; best: {best['case_id']}; stall {base['loader_stall_fraction']:.0%} -> "
           f"{best['loader_stall_fraction']:.0%}")
    if c.device == "cpu":
        why += ("; on a CPU-only machine the workers compete with the training step for the same "
                "cores, and pinning has no accelerator to serve")
    return [Verdict(c.model, claim, speed.describe(), verdict, why, "loader.png")]


def check_cache(c: _Cases) -> list[Verdict]:
    """S0: cached against uncached decoded samples (their own interleaved pair where measured),
    and how close the cached case comes to the device-resident bound."""
    spec = CLAIMS["cache"]
    claim = spec.text
    own = _own_datasets(c)
    if own == []:
        return [_not_applicable(c, claim, "the workload has no dataset of its own: nothing is "
                                "decoded", "loader.png")]
    base, cached = c.claim_case(spec.key, "base"), c.claim_case(spec.key)
    pair = c.pairs.get("cache")
    if (base is None or cached is None) and pair is None:
        return [_missing(c.model, claim, "loader.png", "cached and uncached on-disk data")]
    speed, basis = c.speed("cache", base, cached)
    resident = c.find()  # the baseline: its batches are already on the device
    why = f"{basis}; the cache keeps the decode, augmentation still runs"
    if base is not None and cached is not None:
        why += (f"; stall {base['loader_stall_fraction']:.0%} -> "
                f"{cached['loader_stall_fraction']:.0%}")
    verdict = speed.decide()
    if resident is not None and cached is not None:
        # "Removes the loading cost": the cached case reaches the no-loading bound.
        bound = cached["samples_per_s"] / resident["samples_per_s"]
        why += f"; {bound:.0%} of the device-resident bound (claimed: all of it)"
        if verdict == Kind.HOLDS and bound < spec.parts["time"][0]:
            verdict = Kind.SMALLER
    return [Verdict(c.model, claim, speed.describe(), verdict, why, "loader.png")]


def check_ddp(c: _Cases) -> list[Verdict]:
    """S4: the scaling efficiency of the largest fp32 DDP case (samples/s over devices x the
    single-device case's); testable only with one GPU per rank."""
    spec = CLAIMS["ddp"]
    claim = spec.text
    rows = c.where(c.is_("parallel", "ddp") & c.is_("accum_steps", 1)
                   & c.is_("precision", "fp32"))
    if not rows:
        return [_missing(c.model, claim, "scaling.png", "DDP cases")]
    row = max(rows, key=lambda r: r["world_size"])
    eff = row.get("scaling_efficiency")
    measured = f"{row['case_id']}: scaling efficiency {eff:.0%}" if pd.notna(eff) else "-"
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, measured, Kind.NOT_TESTABLE,
                        f"needs {int(row['world_size'])} GPUs: on the CPU the ranks share the same "
                        "cores, so no speedup is possible; the figure shows the cost of gloo "
                        "communication only", "scaling.png")]
    least = spec.parts["efficiency"][0]
    verdict = Kind.HOLDS if eff >= least else Kind.DOES_NOT_HOLD
    return [Verdict(c.model, claim, measured, verdict,
                    f"efficiency >= {least:.0%} counts as time cut to ~1/N", "scaling.png")]


def check_empty_cache(c: _Cases) -> list[Verdict]:
    """S0, S4: ``empty_cache()`` after every step against the baseline on CUDA: it helps if it
    is faster, or lowers the peak reserve without costing speed."""
    spec = CLAIMS["empty-cache"]
    claim = spec.text
    base, row = c.find(), c.claim_case(spec.key)
    if base is None or row is None:
        return [_missing(c.model, claim, "speedup.png", "the emptycache case")]
    speed, basis = c.speed(spec.key, base, row)
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, speed.describe(), Kind.NOT_TESTABLE,
                        "needs CUDA: the CPU allocator has no cache to empty", "speedup.png")]
    reserved = row["peak_reserved_bytes"] / base["peak_reserved_bytes"]
    # It helps if it is faster, or if it lowers the peak reserve without costing speed.
    speed_verdict = speed.decide()
    lowers_reserve = reserved <= spec.parts["reserved"][1] and speed.ratio >= 1 - MIN_EFFECT
    verdict = Kind.HOLDS if speed_verdict == Kind.HOLDS or lowers_reserve else (
        Kind.INCONCLUSIVE if speed_verdict == Kind.INCONCLUSIVE else Kind.DOES_NOT_HOLD)
    return [Verdict(c.model, claim, f"{speed.describe()}, peak reserved x{reserved:.2f}",
                    verdict, "it releases cached blocks the next step must allocate again; "
                    "it lowers the reserve only between steps", "memory.png")]


def check_adamw(c: _Cases) -> list[Verdict]:
    """S1: AdamW against Adam in each optimizer implementation (default: their interleaved
    pair), same update but for the weight decay."""
    spec = CLAIMS["adamw"]
    claim = spec.text
    out = []
    for impl in ("default", "foreach", "fused"):
        adam = c.find(**spec.base, optimizer_impl=impl)
        adamw = c.find(**spec.new, optimizer_impl=impl)
        if adam is None or adamw is None:
            continue
        speed, basis = c.speed(spec.key, adam, adamw) if impl == "default" else (
            compare_speed(adam, adamw), "separate cases")
        out.append(Verdict(c.model, f"{claim} ({impl})",
                           speed.describe(), speed.decide(),
                           f"{basis}; both run the same update; AdamW only applies weight "
                           "decay to the weights directly instead of through the gradient",
                           "speedup.png"))
    return out or [_missing(c.model, claim, "speedup.png", "adam and adamw cases")]


def check_no_sync(c: _Cases) -> list[Verdict]:
    """S4: DDP accumulation with ``no_sync`` on the non-final micro-batches against without,
    with the estimated all-reduce time per step."""
    spec = CLAIMS["no-sync"]
    claim = spec.text
    rows = {False: c.claim_case(spec.key, "base"), True: c.claim_case(spec.key)}
    if rows[False] is None or rows[True] is None:
        return [_missing(c.model, claim, "scaling.png", "DDP accumulation with and without "
                         "no_sync")]
    speed = compare_speed(rows[False], rows[True])
    why = "separate cases"
    if pd.notna(rows[True].get("comm_time_s")):
        why += (f"; estimated all-reduce time per step {rows[False]['comm_time_s'] * 1e3:.1f} ms "
               f"-> {rows[True]['comm_time_s'] * 1e3:.1f} ms")
    return [Verdict(c.model, claim, speed.describe(), speed.decide(), why, "scaling.png")]


def check_sharding(c: _Cases) -> list[Verdict]:
    """S4: per-rank model state of DDP and FSDP at 2 ranks against one device's (exact bytes:
    testable on any device). DDP keeps a full replica of the parameters, gradients and
    optimizer state on every rank; FSDP shards all three."""
    spec = CLAIMS["sharding"]
    claim = spec.text
    base, ddp = c.find(), c.find(parallel="ddp", world_size=2)
    fsdp = c.find(parallel="fsdp", world_size=2)
    if base is None or ddp is None or not base["optimizer_state_bytes"]:
        return [_missing(c.model, claim, "memory.png", "the fp32 baseline and ddp2 cases")]

    def ratios(row: pd.Series) -> tuple[float, float]:
        model = row["param_bytes"] + row["grad_bytes"]
        return (row["optimizer_state_bytes"] / base["optimizer_state_bytes"],
                model / (base["param_bytes"] + base["grad_bytes"]))

    ddp_opt, ddp_model = ratios(ddp)
    verdict = judge_memory(ddp_opt, spec.parts["memory"])
    measured = (f"optimizer state per rank: DDP x{ddp_opt:.2f} of one device's "
                f"({ddp['optimizer_state_bytes'] / 2**20:,.2f} MiB)")
    why = (f"DDP replicates the optimizer state on every rank, like the parameters and "
           f"gradients (x{ddp_model:.2f}: gradients are all-reduced, not split)")
    if fsdp is not None:
        fsdp_opt, fsdp_model = ratios(fsdp)
        measured += (f", FSDP x{fsdp_opt:.2f} "
                     f"({fsdp['optimizer_state_bytes'] / 2**20:,.2f} MiB)")
        why += (f"; FSDP shards it: x{fsdp_opt:.2f} per rank at 2 ranks (parameters + "
                f"gradients x{fsdp_model:.2f})")
    else:
        why += "; FSDP, which shards it, not measured (fsdp2 case)"
    return [Verdict(c.model, claim, measured, verdict, why, "memory.png")]


def _bytes(n: float) -> str:
    if n >= 2**20:
        return f"{n / 2**20:,.2f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:,.1f} KiB"
    return f"{int(n)} B"


def _device_imbalance(row: pd.Series) -> float:
    """Max over min of a case's per-device peaks (``device_peak_memory_bytes``), NaN without
    two of them."""
    peaks = row.get("device_peak_memory_bytes")
    if not isinstance(peaks, list | tuple | np.ndarray):
        return float("nan")
    peaks = [float(p) for p in peaks if p is not None and p == p]
    if len(peaks) < 2 or min(peaks) <= 0:
        return float("nan")
    return max(peaks) / min(peaks)


def check_dp_vs_ddp(c: _Cases) -> list[Verdict]:
    """S4, S0: DDP against DataParallel over 2 GPUs, per sample, and the memory of their GPUs."""
    spec = CLAIMS["dp-vs-ddp"]
    claim = spec.text
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, "-", Kind.NOT_TESTABLE,
                        "needs 2 GPUs: DataParallel runs on CUDA only (its cases skip on the "
                        "CPU), and DDP ranks on a CPU share its cores", "scaling.png")]
    base = c.find()
    ddp, dp = c.claim_case(spec.key), c.claim_case(spec.key, "base")
    same_batch = dp is not None
    if dp is None and base is not None:  # DataParallel at the baseline's micro-batch
        dp = c.find(parallel="dp", world_size=2, micro_batch=int(base["micro_batch"]))
    if dp is None or ddp is None:
        return [_missing(c.model, claim, "scaling.png", "the fp32 dp2 and ddp2 cases")]
    speed = compare_speed(dp, ddp)  # per sample: the global batches may differ
    dp_imb, ddp_imb = _device_imbalance(dp), _device_imbalance(ddp)
    peak = float(ddp["peak_memory_bytes"]) / float(dp["peak_memory_bytes"])
    parts = {"time": speed.judge(spec.parts["time"]),
             "imbalance": judge_memory(ddp_imb / dp_imb, spec.parts["imbalance"])}
    why = ("separate cases, per sample; DataParallel is one process that every step copies the "
           "module to each GPU, scatters the batch from GPU 0, gathers the outputs and reduces "
           "the gradients on GPU 0, its threads sharing one GIL; DDP runs a process per GPU, "
           "each with its own micro-batch, and all-reduces gradients during backward")
    if same_batch:
        parts["peak"] = judge_memory(peak, spec.parts["peak"])
        why += (f"; both at global batch {int(ddp['global_batch'])}, "
                f"{int(ddp['micro_batch'])} samples per GPU")
    else:
        why += (f"; busiest-GPU memory not judged: {dp['case_id']} puts "
                f"{int(dp['micro_batch']) // 2} samples on each GPU, DDP "
                f"{int(ddp['micro_batch'])} (DataParallel at twice the micro-batch not measured)")
    measured = (f"DDP vs DataParallel {speed.describe()}; busiest GPU "
                f"{_bytes(float(dp['peak_memory_bytes']))} (DP), "
                f"{_bytes(float(ddp['peak_memory_bytes']))} (DDP), x{peak:.2f}; GPUs' peaks "
                f"apart x{dp_imb:.2f} (DP), x{ddp_imb:.2f} (DDP)")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "scaling.png")]


def _stall(rows: list[pd.Series]) -> str:
    fractions = [r.get("loader_stall_fraction") for r in rows]
    if any(f is None or f is pd.NA or f != f for f in fractions):
        return ""
    return "; stall " + " -> ".join(f"{f:.0%}" for f in fractions)


def _knob_sides(c: _Cases, key: str) -> tuple[pd.Series | None, pd.Series | None]:
    """The base and new cases of a loader-knob claim at the baseline's micro-batch."""
    base = c.find()
    if base is None:
        return None, None
    micro = int(base["micro_batch"])
    return (c.claim_case(key, "base", micro_batch=micro), c.claim_case(key, micro_batch=micro))


PIN_PARTS = {"pin_memory": "pin_memory", "non_blocking": "pin_memory + non_blocking"}


def check_pinning(c: _Cases) -> list[Verdict]:
    """S0: pinned against pageable host memory at the same worker count, alone and with
    ``non_blocking`` copies."""
    spec = CLAIMS["pin-memory"]
    claim = spec.text
    if _own_datasets(c) == []:
        return [_not_applicable(c, claim, "the workload has no dataset of its own: no loader "
                                "batches to pin", "loader.png")]
    pageable, both = _knob_sides(c, spec.key)
    pinned = None if pageable is None else c.find(
        **{**{k: pageable[k] for k in ("dataset", "num_workers", "micro_batch")},
           "pin_memory": True})
    if pageable is None or (pinned is None and both is None):
        if c.device not in spec.devices:
            return [Verdict(c.model, claim, "-", Kind.NOT_TESTABLE, "needs CUDA: "
                            + inert_techniques({"pin_memory": True})[0], "loader.png")]
        return [_missing(c.model, claim, "loader.png",
                         "pageable and pinned on-disk data at the same worker count")]
    parts, figures = {}, []
    for part, row in (("pin_memory", pinned), ("non_blocking", both)):
        if row is None:
            parts[part] = Kind.INCONCLUSIVE
            continue
        speed = compare_speed(pageable, row)
        parts[part] = speed.judge(spec.parts[part])
        figures.append(f"{PIN_PARTS[part]}: {speed.describe()}")
    measured = "; ".join(figures)
    workers = int(pageable["num_workers"])
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, measured, Kind.NOT_TESTABLE,
                        "needs CUDA: " + inert_techniques({"pin_memory": True})[0]
                        + f"; separate cases at {workers} workers", "loader.png")]
    why = (f"separate cases at {workers} workers against pageable memory"
           f"{_stall([r for r in (pageable, pinned, both) if r is not None])}; page-locked "
           "memory lets the GPU's copy engine read the batch directly, without a staging copy; "
           "the copy is asynchronous only with .to(device, non_blocking=True), which lets it "
           "overlap the step: pin_memory alone makes it faster, not asynchronous")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "loader.png")]


def check_prefetch(c: _Cases) -> list[Verdict]:
    """S1, S0: ``prefetch_factor=4`` against the default (2) at the same worker count."""
    spec = CLAIMS["prefetch"]
    claim = spec.text
    if _own_datasets(c) == []:
        return [_not_applicable(c, claim, "the workload has no dataset of its own: no loader "
                                "workers to prefetch", "loader.png")]
    plain, deep = _knob_sides(c, spec.key)
    if plain is None or deep is None:
        return [_missing(c.model, claim, "loader.png",
                         "prefetch_factor=4 and the default at the same worker count")]
    speed = compare_speed(plain, deep)
    why = (f"separate cases at {int(plain['num_workers'])} workers, prefetch_factor 4 against "
           f"the default 2{_stall([plain, deep])}; with workers the DataLoader already loads 2 "
           "batches per worker ahead while the step computes (S1's example sets that default); "
           "a deeper queue helps only when loading keeps up on average but varies from batch "
           "to batch, never when the workers are too slow on average")
    if c.device == "cpu":
        why += "; on a CPU-only machine the workers take the cores the step computes on"
    return [Verdict(c.model, claim, speed.describe(), speed.judge(spec.parts["time"]), why,
                    "loader.png")]


MAX_RESIDENT_COLD = 0.1
"""A cold case whose files stayed in the page cache above this share after eviction was not
cold (the filesystem ignored the drop): its verdict is inconclusive."""


def _storage_figures(rows: list[pd.Series]) -> str:
    """The storage probe of the data folder (``gpubench.workloads.storage.probe_storage``),
    as text."""
    for row in rows:
        mb_s = row.get("storage_read_mb_s")
        if isinstance(mb_s, float | int) and mb_s == mb_s:
            iops = row.get("storage_random_iops")
            text = f"data folder's disk: {mb_s:,.0f} MB/s sequential"
            if isinstance(iops, float | int) and iops == iops:
                text += f", {iops:,.0f} random 4 KiB reads/s"
            fs = row.get("storage_fs")
            return text + (f" ({fs}, cold page cache)" if isinstance(fs, str) else "")
    return "storage probe not run"


def _against_paired_baseline(row: pd.Series) -> np.ndarray | None:
    """A case's round times each over its paired baseline round (machine drift cancels), or
    None when the case was not paired."""
    rounds, base = row.get("rounds_s"), row.get("paired_baseline_rounds_s")
    if not (isinstance(rounds, list) and isinstance(base, list) and rounds
            and len(rounds) == len(base)):
        return None
    return np.asarray(rounds, dtype=float) / np.asarray(base, dtype=float)


def check_storage(c: _Cases) -> list[Verdict]:
    """S0: "use an SSD instead of an HDD". The workload's own data read warm (from the page
    cache: the fastest storage there is) against cold (dropped from the cache before each
    epoch: read from the disk the data folder is on), at 0 and at the knob workers: storage
    limits loading on this disk where warm is faster."""
    spec = CLAIMS["storage"]
    claim = spec.text
    if _own_datasets(c) == []:
        return [_not_applicable(c, claim, "the workload has no dataset of its own: its batches "
                                "are made in memory, nothing is read from a disk", "loader.png")]
    base = c.find()
    colds = [] if base is None else sorted(c.where(
        c.flag("cold") & ~c.flag("cached") & c.is_("micro_batch", base["micro_batch"])
        & ~c.flag("pin_memory") & c.missing("prefetch_factor")
        & ~c.flag("persistent_workers")), key=lambda r: int(r["num_workers"]))
    pairs = [(cold, c.find(dataset=cold["dataset"], num_workers=int(cold["num_workers"]),
                           micro_batch=int(cold["micro_batch"]))) for cold in colds]
    pairs = [(cold, warm) for cold, warm in pairs if warm is not None]
    if not pairs:
        return [_missing(c.model, claim, "loader.png",
                         "cold and warm on-disk data at the same worker count")]
    parts, figures, stalls, bases = {}, [], [], set()
    for cold, warm in pairs:
        part = f"{int(cold['num_workers'])} workers"
        # Same batch on both sides: each round over its paired baseline round where both
        # cases were paired (the two were measured a minute apart), else the raw rounds.
        ratios = [_against_paired_baseline(r) for r in (cold, warm)]
        if all(r is not None for r in ratios):
            speed = compare_rounds(*ratios)
            bases.add("rounds over their paired baseline rounds")
        else:
            speed = compare_speed(cold, warm)
            bases.add("separate cases")
        parts[part] = speed.judge(spec.parts["time"])
        figures.append(f"{part}: warm vs cold {speed.describe()}")
        alone = [r.get("loader_samples_per_s") for r in (warm, cold)]
        if all(isinstance(a, float | int) and a == a and a > 0 for a in alone):
            figures[-1] += f", loader alone {alone[0] / alone[1]:.2f}x"
        stall = _stall([cold, warm]).removeprefix("; stall ")
        stalls.append(f"{part} {stall}" if stall else f"{part} not measured")
    resident = [r.get("cold_resident_fraction") for r, _ in pairs]
    kept = max((float(f) for f in resident if isinstance(f, float | int) and f == f),
               default=None)
    measured = "; ".join(figures) + "; " + _storage_figures([p[0] for p in pairs])
    why = (" and ".join(sorted(bases)) + "; cold: the dataset's files dropped from the page "
           "cache before each epoch (posix_fadvise DONTNEED), so each is read from the disk "
           "once per epoch, as with a dataset larger than RAM; warm: read from the cache, the "
           "fastest storage there is; stall cold -> warm: " + ", ".join(stalls)
           + "; the verdict is about this disk: where cold is as fast, storage does not limit "
           "this model's loading here, and a faster disk would not help")
    if kept is not None and kept > MAX_RESIDENT_COLD:
        return [Verdict(c.model, claim, measured, Kind.INCONCLUSIVE,
                        f"{kept:.0%} of the dataset's pages stayed in the page cache after "
                        "eviction (this filesystem ignores the drop, or a process maps the "
                        "files): the cold cases were not cold; " + why, "loader.png")]
    if c.device == "cpu":
        why += "; on a CPU-only machine the decode and the step share the cores"
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "loader.png")]


def _frontier_entry(report: dict, technique: str) -> dict | None:
    """One technique's frontier in a ``gpubench memory`` report (by name; older reports, which
    lack the names, by the configuration's id)."""
    ids = {"fp32": f"{report.get('model')}-fp32",
           "emptycache": f"{report.get('model')}-fp32-emptycache"}
    for entry in report.get("frontier") or []:
        if entry.get("technique") == technique or (
                entry.get("technique") is None and entry.get("cfg_id") == ids.get(technique)):
            return entry
    return None


def check_empty_cache_oom(c: _Cases) -> list[Verdict]:
    """S0, S4: the largest micro-batch that fits with and without ``empty_cache()`` after every
    step (the OOM frontier of ``gpubench memory``)."""
    spec = CLAIMS["empty-cache-oom"]
    claim = spec.text
    report = c.memory or {}
    device = report.get("device", c.device)
    plain, emptied = _frontier_entry(report, "fp32"), _frontier_entry(report, "emptycache")
    measured = "-" if plain is None or emptied is None else (
        f"largest micro-batch that fits: {plain['max_batch']} without, {emptied['max_batch']} "
        "with empty_cache() after every step")
    if device not in spec.devices:
        return [Verdict(c.model, claim, measured, Kind.NOT_TESTABLE,
                        "needs CUDA: the CPU allocator keeps no cache to empty (on the CPU the "
                        "frontier runs against a --budget)", "memory.json")]
    if plain is None or emptied is None:
        return [_missing(c.model, claim, "memory.json", "the fp32 and emptycache OOM frontiers: "
                         "gpubench memory --techniques fp32,emptycache, and its memory.json")]
    why = ("when an allocation fails, PyTorch's caching allocator itself frees its unused "
           "cached blocks and retries (allocation retries) before raising out of memory, so "
           "emptying the cache by hand cannot make a larger batch fit in the same process; it "
           "returns memory to other processes on the GPU, at the cost of new cudaMalloc calls")
    if plain.get("capped") or emptied.get("capped"):
        return [Verdict(c.model, claim, measured, Kind.INCONCLUSIVE,
                        "the search reached its limit (--max-batch) without running out of "
                        "memory; " + why, "memory.json")]
    low = spec.parts["max_batch"][0]
    ratio = (emptied["max_batch"] / plain["max_batch"] if plain["max_batch"]
             else float("inf") if emptied["max_batch"] else 1.0)
    verdict = (Kind.HOLDS if ratio >= low else Kind.SMALLER if ratio > 1
               else Kind.DOES_NOT_HOLD)
    return [Verdict(c.model, claim, measured + f" (x{ratio:.2f})", verdict, why, "memory.json")]


def check_compile(c: _Cases) -> list[Verdict]:
    """The compiled fp32 case against the baseline (``--slow`` runs it), with what compiling
    cost and the steps after which it pays off (``compile_time_s``, ``break_even_steps``)."""
    spec = CLAIMS["compile"]
    base, row = c.find(), c.claim_case(spec.key)
    if base is None or row is None:
        return [_missing(c.model, spec.text, "speedup.png",
                         "the compile case (gpubench run --slow, or gpubench case --compile)")]
    speed, basis = c.speed(spec.key, base, row)
    why = basis
    if pd.notna(row.get("compile_time_s")):
        even = row.get("break_even_steps")
        why += (f"; compiling took {row['compile_time_s']:.1f} s, "
                + ("which no step wins back" if pd.isna(even)
                   else f"won back after {even:,.0f} steps"))
    return [Verdict(c.model, spec.text, speed.describe(), speed.judge(spec.parts["time"]), why,
                    "speedup.png")]


def check_cuda_graphs(c: _Cases) -> list[Verdict]:
    """torch.compile's reduce-overhead mode (CUDA graphs) against its default mode at the
    baseline's batch (separate cases): the launch overhead the graphs remove shows on steps
    whose kernels are short."""
    spec = CLAIMS["cuda-graphs"]
    base, row = c.claim_case(spec.key, "base"), c.claim_case(spec.key)
    if c.device not in spec.devices:
        return [Verdict(c.model, spec.text, "-", Kind.NOT_TESTABLE,
                        "needs CUDA: CUDA graphs record and replay a GPU's kernel launches",
                        "speedup.png")]
    if base is None or row is None:
        return [_missing(c.model, spec.text, "speedup.png",
                         "the compile and compile-reduce-overhead cases (gpubench run --slow)")]
    speed = compare_speed(base, row)
    why = (f"separate cases; default-mode compiled step {base['step_time_s'] * 1e3:.2f} ms: the "
           "shorter the step's kernels, the larger the launch overhead the graph removes")
    return [Verdict(c.model, spec.text, speed.describe(), speed.judge(spec.parts["time"]), why,
                    "speedup.png")]


def check_flash_attention(c: _Cases) -> list[Verdict]:
    """The FlashAttention kernel against the math kernel (the unfused attention eager code
    computes) at fp32, separate cases: speed per sample, and training memory (the score
    matrices the math kernel saves for backward, which flash recomputes)."""
    spec = CLAIMS["flash-attention"]
    math_row, flash = c.claim_case(spec.key, "base"), c.claim_case(spec.key)
    if math_row is None or flash is None:
        known = [bool(v) for v in c.col("uses_sdpa").dropna()]
        if known and not any(known):
            return [_not_applicable(c, spec.text, "the model calls no "
                                    "scaled_dot_product_attention", "speedup.png")]
        return [_missing(c.model, spec.text, "speedup.png",
                         "the sdpa_math and sdpa_flash cases (the attention group)"),
                *_eager_attention(c)]
    speed = compare_speed(math_row, flash)
    memory = _memory(flash) / _memory(math_row)
    parts = {"time": speed.judge(spec.parts["time"]),
             "memory": judge_memory(memory, spec.parts["memory"])}
    saved = (f"; saved activations {math_row['activation_bytes'] / 2**20:,.1f} -> "
             f"{flash['activation_bytes'] / 2**20:,.1f} MiB per micro-batch"
             if pd.notna(math_row.get("activation_bytes"))
             and pd.notna(flash.get("activation_bytes")) else "")
    why = (f"separate cases; time {parts['time']}, memory {parts['memory']} (claimed "
           f"{_range(spec.parts['memory'], True)}){saved}; the gap grows with the sequence "
           "length (the math kernel's scores are seq x seq per head)")
    return [Verdict(c.model, spec.text, f"{speed.describe()}, memory x{memory:.2f}",
                    combine_parts(parts), why, "speedup.png"), *_eager_attention(c)]


def _eager_attention(c: _Cases) -> list[Verdict]:
    """A transformers model's ``sdpa`` attention against its ``eager`` one (separate cases;
    the sdpa side is the baseline where that is the model's default), where measured."""
    spec = CLAIMS["flash-attention"]
    eager = c.find(attn_implementation="eager")
    if eager is None:
        return []
    sdpa = c.find(attn_implementation="sdpa")
    base = c.find()
    if sdpa is None and base is not None and base.get("hf_attention") == "sdpa":
        sdpa = base
    if sdpa is None:
        return [_missing(c.model, f"{spec.text} (transformers: sdpa vs eager)", "speedup.png",
                         "the attn_sdpa case")]
    if sdpa is base:  # the eager case's rounds are paired with the baseline's
        speed, basis = c.speed(spec.key, base, eager)
        speed = speed.inverted()
    else:
        speed, basis = compare_speed(eager, sdpa), "separate cases"
    memory = _memory(sdpa) / _memory(eager)
    parts = {"time": speed.judge(spec.parts["time"]),
             "memory": judge_memory(memory, spec.parts["memory"])}
    why = (f"{basis}; time {parts['time']}, memory {parts['memory']}: transformers' "
           "sdpa attention calls scaled_dot_product_attention (a fused kernel where one "
           "runs), its eager attention materialises the scores and runs softmax and dropout "
           "as ops of their own")
    return [Verdict(c.model, f"{spec.text} (transformers: sdpa vs eager)",
                    f"{speed.describe()}, memory x{memory:.2f}", combine_parts(parts), why,
                    "speedup.png")]





def check_fp8(c: _Cases) -> list[Verdict]:
    """Each FP8 recipe (per-tensor and per-row scales) against bf16 autocast, separate cases of
    the precision group: speed per sample where the float8 matmuls ran on FP8 units; *not
    testable* where they were emulated (the training check still ran the recipe)."""
    spec = CLAIMS["fp8"]
    out = []
    for precision in FP8_PRECISIONS:
        text = f"{spec.text} ({precision})"
        bf16 = c.claim_case(spec.key, "base")
        row = c.claim_case(spec.key, precision=precision)
        if bf16 is None or row is None:
            out.append(_missing(c.model, text, "speedup.png",
                                f"the bf16 and {precision} cases of the precision group; an fp8 "
                                "case is skipped where none of the model's linears can convert"))
            continue
        converted = row.get("fp8_converted")
        layers = (f"{len(converted)} linears converted ({row.get('fp8_layers')} filter)"
                  if isinstance(converted, list) else "converted linears not recorded")
        speed = compare_speed(bf16, row)
        if _flag(row.get("fp8_emulated")) or c.device not in spec.devices:
            out.append(Verdict(c.model, text, speed.describe(), Kind.NOT_TESTABLE,
                               "needs FP8 matmul units (CUDA compute capability 8.9+: Ada, "
                               "Hopper, Blackwell); here the float8 casts and matmuls were "
                               f"emulated, so the speed is not FP8's; {layers}, training "
                               "check passed", "speedup.png"))
            continue
        why = (f"separate cases; {layers}: FP8 pays off on large matmuls only (torchao's "
               "filter keeps the linears its H100 measurements found faster), and each cast "
               "and scale costs memory traffic")
        out.append(Verdict(c.model, text, speed.describe(), speed.judge(spec.parts["time"]),
                           why, "speedup.png"))
    return out


def check_offload(c: _Cases) -> list[Verdict]:
    """The largest micro-batch that fits with activation offloading against without (the OOM
    frontier of ``gpubench memory --techniques fp32,offload``), and the step time it costs
    (the offload case against the baseline: at least 0.8 of its speed counts as modest)."""
    spec = CLAIMS["offload"]
    claim = spec.text
    base, row = c.find(), c.claim_case(spec.key)
    report = c.memory or {}
    plain, offloaded = _frontier_entry(report, "fp32"), _frontier_entry(report, "offload")
    measured = []
    speed = None
    if base is not None and row is not None:
        speed, basis = c.speed(spec.key, base, row)
        measured.append(speed.describe())
    if plain is not None and offloaded is not None:
        measured.append(f"largest micro-batch {plain['max_batch']} -> {offloaded['max_batch']}")
    text = ", ".join(measured) or "-"
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, text, Kind.NOT_TESTABLE,
                        "needs CUDA: on the CPU the activations already live in host memory, "
                        "so offloading only adds the copies", "memory.json")]
    if speed is None or plain is None or offloaded is None:
        return [_missing(c.model, claim, "memory.json", "the offload case and the fp32 and "
                         "offload OOM frontiers (gpubench memory --techniques fp32,offload)")]
    low = spec.parts["time"][0]
    parts = {"time": Kind.HOLDS if speed.low >= low else
             Kind.DOES_NOT_HOLD if speed.high < low else Kind.INCONCLUSIVE}
    if plain.get("capped") or offloaded.get("capped"):
        parts["max_batch"] = Kind.INCONCLUSIVE
    else:
        ratio = (offloaded["max_batch"] / plain["max_batch"] if plain["max_batch"]
                 else float("inf") if offloaded["max_batch"] else 1.0)
        fit = spec.parts["max_batch"][0]
        parts["max_batch"] = (Kind.HOLDS if ratio >= fit else Kind.SMALLER if ratio > 1
                              else Kind.DOES_NOT_HOLD)
    why = (f"{basis}; time {parts['time']} (claimed at least x{low:g} of the baseline's speed), "
           f"larger batch {parts['max_batch']}; the saved tensors cross PCIe twice per step, "
           "which the copies' overlap with compute decides")
    return [Verdict(c.model, claim, text, combine_parts(parts), why, "memory.json")]


def _hygiene_ratio(new: dict, base: dict) -> tuple[float, str]:
    """``new`` over ``base`` (``gpubench.diagnostics.hygiene`` figures): the CUDA allocator's peaks
    where measured, else the exact bytes held (saved activations at their peak + kept tensors)."""
    if new.get("peak_bytes") is not None and base.get("peak_bytes"):
        return new["peak_bytes"] / base["peak_bytes"], "CUDA allocator peak"
    held = base.get("held_bytes")
    return (new["held_bytes"] / held if held else float("nan"),
            "exact bytes held: saved activations + kept tensors")


def _hygiene(c: _Cases) -> dict | None:
    return (c.memory or {}).get("hygiene")


def check_no_grad(c: _Cases) -> list[Verdict]:
    """S4: an evaluation pass with autograd on, under ``no_grad`` and ``inference_mode``
    (``gpubench.diagnostics.hygiene.evaluation``, exact on any device)."""
    spec = CLAIMS["no-grad"]
    claim = spec.text
    h = _hygiene(c)
    if h is None:
        return [_missing(c.model, claim, "memory.json",
                         "the hygiene measurements of gpubench memory, in its memory.json")]
    ev = h["evaluation"]
    grad = ev["grad"]
    parts, ratios = {}, []
    for mode in ("no_grad", "inference_mode"):
        ratio, basis = _hygiene_ratio(ev[mode], grad)
        parts[mode] = judge_memory(ratio, spec.parts[mode])
        ratios.append(f"{mode} x{ratio:.2f}")
    measured = (f"evaluation of {h['micro_batch']} samples saves "
                f"{_bytes(grad['saved_bytes'])} for backward with autograd on, "
                f"{_bytes(ev['no_grad']['saved_bytes'])} under no_grad, "
                f"{_bytes(ev['inference_mode']['saved_bytes'])} under inference_mode; "
                f"{basis}: {', '.join(ratios)}")
    why = ("autograd saves what backward needs only while grad mode is on; under no_grad and "
           "inference_mode nothing is saved and each activation is freed once the next layer "
           "has used it; model.eval() alone switches dropout and BatchNorm, not autograd")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "memory.json")]


def check_del(c: _Cases) -> list[Verdict]:
    """S0: ``del`` of what the training loop keeps: a loss kept with its graph, and the previous
    step's outputs after ``backward()`` (``gpubench.diagnostics.hygiene``)."""
    spec = CLAIMS["del"]
    claim = spec.text
    h = _hygiene(c)
    if h is None:
        return [_missing(c.model, claim, "memory.json",
                         "the hygiene measurements of gpubench memory, in its memory.json")]
    graph, outputs = h["kept_graph"], h["kept_outputs"]
    r_graph, basis = _hygiene_ratio(graph["deleted"], graph["kept"])
    r_outputs, _ = _hygiene_ratio(outputs["deleted"], outputs["kept"])
    parts = {"graph": judge_memory(r_graph, spec.parts["graph"]),
             "outputs": judge_memory(r_outputs, spec.parts["outputs"])}
    held = graph["kept"]["held_saved_bytes"] - graph["deleted"]["held_saved_bytes"]
    measured = (f"a loss kept with its graph ({_bytes(graph['kept']['kept_bytes'])}) holds "
                f"{_bytes(held)} of saved activations: x{r_graph:.2f} after del; the previous "
                f"step's outputs kept after backward ({_bytes(outputs['kept']['kept_bytes'])}): "
                f"x{r_outputs:.2f} after del ({basis})")
    why = ("del drops a name, and the memory goes when nothing else refers to the tensor: a "
           "tensor computed with autograd on and never backpropagated keeps its whole graph "
           "(del, .item() or .detach() frees it); after backward() the graph is already freed, "
           "so deleting the outputs frees only their own storage, until the next forward "
           "would have rebound the names")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "memory.json")]


def recipe_ingredients(c: _Cases, stack: pd.Series) -> dict[str, pd.Series | None]:
    """The single-technique cases a recipe stack is made of, each measured in its own group:
    its precision, its accumulation (k at the same micro-batch), its loader (the same dataset,
    workers and pinning), its DDP (2 ranks, no accumulation); None where not measured. An
    ingredient the stack does not use (fp32, device-resident batches) is left out."""
    micro = int(stack["micro_batch"])
    out: dict[str, pd.Series | None] = {}
    if stack["precision"] != "fp32":
        out["precision"] = c.find(precision=stack["precision"])
    if int(stack["accum_steps"]) > 1:
        out["accumulation"] = c.find(accum_steps=int(stack["accum_steps"]), micro_batch=micro)
    if stack.get("dataset") not in (None, "device-resident"):
        out["loader"] = c.find(**{k: stack[k] for k in ("dataset", "num_workers", "pin_memory",
                                                         "non_blocking")})
    if stack["parallel"] == "ddp":
        out["ddp"] = c.find(parallel="ddp", world_size=int(stack["world_size"]))
    return out


def interaction(c: _Cases, stack: pd.Series) -> tuple[float, dict[str, float]]:
    """The stack's speedup over the product of its ingredients' speedups (each against the FP32
    baseline, per sample): 1 when the techniques' gains multiply, below 1 when they overlap or
    get in each other's way, above 1 when they help each other; and each ingredient's speedup.
    NaN when an ingredient was not measured."""
    speeds = {name: (float(row["speedup"]) if row is not None else float("nan"))
              for name, row in recipe_ingredients(c, stack).items()}
    product = float(np.prod(list(speeds.values()))) if speeds else 1.0
    return float(stack["speedup"]) / product, speeds


def check_recipe(c: _Cases) -> list[Verdict]:
    """S1 section 6: the stacked recipe against its best single ingredient (part ``single``),
    and the stack over DDP against the stack on one device (part ``ddp``, GPUs only), with the
    interaction ratio (``interaction``) of each stack."""
    spec = CLAIMS["recipe"]
    claim = spec.text
    stacks = c.where(c.is_("group", "recipe"))
    single = next((r for r in stacks if r["parallel"] == "single"), None)
    ddp = next((r for r in stacks if r["parallel"] == "ddp"), None)
    if single is None:
        return [_missing(c.model, claim, "speedup.png", "the recipe group's cases")]
    ingredients = {k: v for k, v in recipe_ingredients(c, single).items() if v is not None}
    figures, parts = [], {}
    ratio, speeds = interaction(c, single)
    figures.append(f"{single['case_id']}: x{float(single['speedup']):.2f} vs the product of "
                   + " x ".join(f"{k} x{v:.2f}" for k, v in speeds.items())
                   + f", interaction x{ratio:.2f}")
    if ingredients:
        best_name, best = max(ingredients.items(), key=lambda kv: float(kv[1]["speedup"]))
        speed = compare_speed(best, single)
        parts["single"] = speed.judge(spec.parts["single"])
        figures.append(f"against its best ingredient ({best_name}): {speed.describe()}")
    else:
        parts["single"] = Kind.INCONCLUSIVE
    why = ("separate cases, per sample against the FP32 baseline; interaction = the stack's "
           "speedup over the product of its ingredients' (1: they multiply; below 1: they "
           "overlap, e.g. workers matter less once the step is slower per batch, or compete "
           "for the same cores)")
    if ddp is not None:
        ratio_ddp, _ = interaction(c, ddp)
        if c.device == "cuda":
            speed = compare_speed(single, ddp)
            parts["ddp"] = speed.judge(spec.parts["ddp"])
            figures.append(f"over DDP: {speed.describe()} against the stack on one GPU, "
                           f"interaction x{ratio_ddp:.2f}")
        else:
            figures.append(f"over DDP x{float(ddp['speedup']):.2f} (interaction "
                           f"x{ratio_ddp:.2f}: on the CPU the ranks share the cores)")
            why += "; the DDP stack is not judged on the CPU (its ranks share the same cores)"
    elif c.device == "cuda":
        parts["ddp"] = Kind.INCONCLUSIVE
    base = c.find()
    if base is not None and int(single["global_batch"]) != int(base["global_batch"]):
        why += (f"; the stack trains on {int(single['global_batch'])} samples per step, the "
                f"baseline on {int(base['global_batch'])}: accumulation at the same "
                "micro-batch changes the training recipe (S1: 'simulate a larger batch')")
    return [Verdict(c.model, claim, "; ".join(figures), combine_parts(parts), why,
                    "speedup.png")]


MEMORY_CHECKS = (check_empty_cache_oom, check_no_grad, check_del)
"""The verdicts read from a ``gpubench memory`` report (``memory.json``)."""


def memory_verdicts(report: dict) -> list[Verdict]:
    """The ``MEMORY_CHECKS`` verdicts of one ``gpubench memory`` report alone."""
    c = _Cases(pd.DataFrame({"model": [], "step_time_s": []}), report["model"], memory=report)
    c.device = report.get("device", c.device)
    return [v for check in MEMORY_CHECKS for v in check(c)]


def check_parity(c: _Cases) -> list[Verdict]:
    """Training accuracy under AMP, DDP and accumulation: the loss curves of ``gpubench parity``
    (``parity.json``), each technique's final loss against FP32's from the same initial
    weights and data (``gpubench.analysis.parity``)."""
    from gpubench.analysis.parity import CLAIM, describe, verdict_parts

    report = c.parity
    parts = verdict_parts(report) if report is not None else {}
    if not parts:
        spec = next((w for w in c.col("workload") if isinstance(w, str)), c.model)
        return [_missing(c.model, CLAIM, "parity.md",
                         f"the loss curves of gpubench parity --model {spec}, its parity.json")]
    measured, why = describe(report)
    # parity.md: the table, beside its chart(s) (parity.png, or parity-<model>.png)
    return [Verdict(c.model, CLAIM, measured, combine_parts(parts), why, "parity.md")]


JUDGES = {
    "amp-fp16": check_amp, "amp-bf16": check_amp, "accumulation": check_accumulation,
    "loader-workers": check_loader_workers, "pin-memory": check_pinning,
    "prefetch": check_prefetch, "storage": check_storage, "cache": check_cache, "ddp": check_ddp,
    "dp-vs-ddp": check_dp_vs_ddp, "empty-cache": check_empty_cache,
    "empty-cache-oom": check_empty_cache_oom, "offload": check_offload,
    "compile": check_compile, "cuda-graphs": check_cuda_graphs,
    "flash-attention": check_flash_attention, "fp8": check_fp8,
    "adamw": check_adamw, "no-sync": check_no_sync,
    "sharding": check_sharding, "no-grad": check_no_grad, "del": check_del,
    "recipe": check_recipe, "parity": check_parity,
}
"""The judge of each claim of ``CLAIMS``: the check that finds its measured cases and gives its
verdicts (one check may judge several claims: AMP's two precisions)."""

CHECKS = tuple(dict.fromkeys(JUDGES.values()))
"""Every judge once, in the order the advice lists their verdicts."""


def _memory_report(reports: list[dict] | None, model: str, device: str) -> dict | None:
    """The ``gpubench memory`` report of ``model`` among ``reports`` (the last one; one measured
    on ``device`` first)."""
    mine = [r for r in reports or () if r.get("model") == model]
    same = [r for r in mine if r.get("device") == device]
    return (same or mine or [None])[-1]


def advise(df: pd.DataFrame, memory_reports: list[dict] | None = None,
           parity_reports: list[dict] | None = None) -> list[Verdict]:
    """Every claim, for every model in the results (one run); the memory claims (the OOM
    frontier, no_grad, del) from the model's ``gpubench memory`` report among
    ``memory_reports`` (the ``memory.json`` files), when given; convergence parity from its
    ``gpubench parity`` report among ``parity_reports`` (``parity.json``)."""
    df = with_baseline_ratios(df)
    verdicts = []
    for model in dict.fromkeys(df["model"].dropna()):
        cases = _Cases(df, model)
        cases.memory = _memory_report(memory_reports, model, cases.device)
        cases.parity = _memory_report(parity_reports, model, cases.device)
        for check in CHECKS:
            verdicts.extend(check(cases))
    return verdicts










def advice_markdown(df: pd.DataFrame, budget_bytes: float | None = None,
                    recommendations: list[Recommendation] | None = None,
                    memory_reports: list[dict] | None = None,
                    parity_reports: list[dict] | None = None,
                    failures: list[dict] | None = None,
                    tunes: list[dict] | None = None) -> str:
    """The verdicts table and the recommended configuration (the decision of
    ``gpubench.analysis.decision``, with ``tunes``: what the answer says); ``failures``
    (``gpubench.measure.journal``): a claim whose case failed says *case failed* with the
    case's one-line reason, and the failed cases are listed below."""
    from gpubench.analysis.failures import failures_markdown
    from gpubench.util.tables import markdown_table

    verdicts = [_with_failures(v, failures or []) for v in
                advise(df, memory_reports, parity_reports)]
    rows = [{"model": v.model, "claim": v.claim, "measured": v.measured,
             "verdict": f"**{v.verdict}**", "why": v.why, "chart": f"[{v.chart}]({v.chart})"}
            for v in verdicts]
    lines = [markdown_table(rows, columns=("model", "claim", "measured", "verdict", "why",
                                           "chart"))]
    decisions = decide(df, tunes, budget_bytes, recommendations)
    if decisions:
        budget = "" if budget_bytes is None else f" within {budget_bytes / 2**20:,.0f} MiB"
        lines += ["", f"Recommended configuration{budget} (the answer's): the fastest that "
                  "measurably beats FP32 and trains correctly (the baseline when none does):",
                  ""]
        for d in decisions:
            lines.append(f"- {d.model}: " + _decision_line(d))
    return "\n".join(lines) + "\n" + failures_markdown(failures or [])




def _decision_line(d: Decision) -> str:
    """One model's recommended configuration, in a line (``decision.decide``)."""
    if d.source == "tune":
        w = d.tune["winner"]
        line = (f"`{d.case_id}`, the FP32 baseline (`gpubench tune` on this machine: "
                f"{w.get('why', 'nothing beat it')})" if d.is_baseline else
                f"`{d.case_id}`, {d.speedup:.2f}x the FP32 baseline (95% CI {d.low:.2f}-"
                f"{d.high:.2f}, found and confirmed by `gpubench tune` on this machine)")
        return line + (f". {d.differs}" if d.differs else "")
    r = d.recommendation
    if r.is_baseline:
        line = f"`{r.case_id}`, the FP32 baseline: {r.reason}"
    else:
        basis = ("confirmed in alternating rounds" if r.confirmed
                 else "from rounds paired with the baseline's")
        line = (f"`{r.case_id}`, {r.speedup:.2f}x the FP32 baseline (95% CI {r.low:.2f}-"
                f"{r.high:.2f}, {basis}), training memory "
                f"{r.peak_memory_bytes / 2**20:,.1f} MiB")
    return line + (f"; {r.note}" if r.note else "")


def _with_failures(v: Verdict, failures: list[dict]) -> Verdict:
    """``v``, or where it says its case was not measured and that case failed, the failure."""
    if not v.why.startswith("not measured"):
        return v
    hit = [f for f in failures if f.get("model") == v.model and f.get("case_id")
           and re.search(rf"(?<![\w-]){re.escape(f['case_id'])}(?![\w-])", v.why)]
    if not hit:
        return v
    why = "; ".join(f"{f['case_id']} failed: {f.get('reason') or 'failed'} ({f.get('log')})"
                    for f in hit)
    return Verdict(v.model, v.claim, "-", FAILED, why, v.chart)
