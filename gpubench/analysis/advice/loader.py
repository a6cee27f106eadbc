"""The advice's judges of data loading: workers, caching, pinned memory, prefetch, storage."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpubench.analysis.advice.cases import (
    _MISSING,
    Verdict,
    _Cases,
    _missing,
    _not_applicable,
    _own_datasets,
)
from gpubench.analysis.speed import (
    compare_rounds,
    compare_speed,
)
from gpubench.suite.claims import CLAIMS
from gpubench.train.config import inert_techniques
from gpubench.util.verdicts import Kind, combine_parts


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
    # Both sides are the baseline's step (not a recipe stack's) but for the loader: the base
    # reads on-disk data with 0 workers, the tuned cases the same data with workers and their
    # knobs (pinning, prefetch, persistence).
    plain = c.find()
    base = None if plain is None else c.first(
        c.like(plain, vary=("dataset", "dataset_size"))
        & ~c.missing("dataset") & ~c.is_("dataset", "synthetic")
        & ~c.is_("dataset", "device-resident"))
    tuned = [] if base is None else c.where(
        c.like(base, vary=("num_workers", *WORKER_KNOBS))
        & np.array([v is not _MISSING and v > 0 for v in c.values("num_workers")], dtype=bool))
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


WORKER_KNOBS = ("pin_memory", "non_blocking", "prefetch_factor", "persistent_workers")
"""The loader's knobs that need workers (or a device) to act: the tuned side of the workers
claim may set them."""


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
    pair = c.pair("cache", base, cached)
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
    # Each cold case the baseline's step on on-disk data, beside its warm twin (the same
    # configuration in every field but ``cold``).
    colds = [] if base is None else sorted(c.where(
        c.like(base, vary=("dataset", "dataset_size", "num_workers", "cold"))
        & c.flag("cold")), key=lambda r: int(r["num_workers"]))
    pairs = [(cold, c.twin(cold, vary=("cold",))) for cold in colds]
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
