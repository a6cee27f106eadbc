"""A history of runs and the changes in it: one small file per run, series per case and machine,
change points with the commit that made them.

**The store** (``save_run``) follows pytest-benchmark's ``--benchmark-storage`` layout: a folder
per machine, one file per run named ``NNNN_<commit>_<datetime>[_uncommitted-changes].json``.
A run's file is an index: the commit (id, time, branch, dirty), the machine
(``gpubench.measure.provenance.recorded_machine``: its fingerprint), the profile, and per case
a handful of figures in columns (median step time, the median per-round ratio over the paired
baseline rounds, throughput, training memory). The result file itself, raw rounds and all,
is kept gzipped beside it in ``raw/``, apart from the index: reading a history reads only the
indexes. ``read_history`` also reads folders pytest-benchmark wrote itself
(``--benchmark-autosave``), whole result files.

**Series** (``history_series``): one per (model, profile, device, case id, metric, machine
fingerprint), ordered by commit time, then run time. Machines are never mixed: a run on another
machine starts (or continues) that machine's own series. Time is taken on ``basis`` as in
``gpubench compare``: by default (auto) each run's median per-round ratio over the paired
baseline rounds taken right before them, which cancels the machine's state between runs, where
every run of the series has them; the FP32 baseline case and series without paired rounds
as their median step time.

**Change points** (``change_points``): binary segmentation of a series' log values. At each
split the statistic is the largest standardized rank-sum (Mann-Whitney) difference between the
runs before and after any split point; its p-value comes from a permutation test (the runs'
ranks shuffled ``PERMUTATIONS`` times), which makes no assumption on the noise's shape and is
robust to a single outlying run. A split counts when p < ``CHANGE_ALPHA``, the medians on its two
sides differ by at least the minimum magnitude (compare's thresholds: 7% time, 2% memory),
and the new level held for at least ``PERSISTENCE`` runs (one slow run is not a change).
Segments are then split again the same way. The latest runs, fewer than ``PERSISTENCE``, are
reported as a *pending* change when they all lie beyond every earlier run of their level and
their median beyond the minimum magnitude, with p (the chance of that for exchangeable runs)
below ``PENDING_ALPHA``:
``gpubench compare --confirm`` decides those. Each change point has its last good and first
bad commit, the ratio of the medians after/before with a bootstrap interval
(``stats.bootstrap_ratio_ci``), and p.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from gpubench.analysis.cost import tokens_per_sample
from gpubench.analysis.results import ResultsError, load_results, training_memory
from gpubench.measure.provenance import library_changes, recorded_machine
from gpubench.util import atomic
from gpubench.util.stats import bootstrap_ratio_ci
from gpubench.util.verdicts import COMPARE_BASES, MEMORY_THRESHOLD, TIME_THRESHOLD

HISTORY_FORMAT = 1
"""The version of a run's index file (``"gpubench_history"`` in it)."""

RAW_DIR = "raw"
"""Where beside a machine's index files the gzipped result files are kept."""

CHANGE_ALPHA = 0.01
"""Significance level of a change point's permutation test."""

PERSISTENCE = 2
"""Runs the new level must hold for a change point to count (a later change may follow)."""

PENDING_ALPHA = 0.1
"""The chance below which the latest runs lying beyond all earlier ones is flagged as pending
(with one latest run: a level of 20 runs or more)."""

PERMUTATIONS = 999
"""Shuffles of a series' ranks per permutation test (p resolves to 0.001)."""

PERMUTATION_BATCH = 111

METRICS = ("time", "memory")
"""What a series follows: step time (on the chosen basis) and training memory."""

CASE_COLUMNS = ("model", "profile", "device", "case_id", "workload", "is_baseline",
                "step_time_s", "samples_per_s", "global_batch", "seq_len", "time_rounds",
                "paired", "memory", "memory_kind")
"""The figures a run's index keeps per case (``paired``: median per-round ratio over the
paired baseline rounds; ``memory``: training memory, else the peak; ``seq_len``: tokens per
sample of a language model's input)."""

TREND_RUNS = 5
"""Runs at each end of a series whose medians make its trend."""

SERIES_KEY = ("model", "profile", "device", "case_id", "metric", "machine_id")


# -- one run's index ---------------------------------------------------------------------------

def _commit(data: dict, commit: dict | None) -> dict:
    """The run's commit: ``commit`` where given, else the file's ``commit_info``
    (pytest-benchmark's: id, time, author_time, dirty, branch), else none known."""
    info = commit if commit is not None else data.get("commit_info")
    info = info if isinstance(info, dict) else {}
    return {"id": info.get("id"), "time": info.get("time") or info.get("author_time"),
            "branch": info.get("branch"), "dirty": bool(info.get("dirty"))}


def case_figures(df: pd.DataFrame) -> pd.DataFrame:
    """``CASE_COLUMNS`` per measured step case of a results frame (``load_results``)."""
    steps = df[(df["kind"] == "step") & df["case_id"].notna() & df["step_time_s"].notna()]
    steps = steps.copy()
    paired = []
    for rounds, base in zip(steps["rounds_s"], steps.get("paired_baseline_rounds_s",
                                                         pd.Series([None] * len(steps))),
                            strict=True):
        ok = (isinstance(rounds, list | tuple | np.ndarray) and isinstance(base, list | tuple
              | np.ndarray) and len(rounds) == len(base) and len(rounds) > 0)
        if ok:
            r, b = np.asarray(rounds, dtype=float), np.asarray(base, dtype=float)
            ok = bool(np.all(np.isfinite(b) & (b > 0)))
        paired.append(float(np.median(r / b)) if ok else math.nan)
    train = training_memory(steps)
    out = pd.DataFrame({
        "model": steps["model"].astype(object), "profile": steps["profile"].astype(object),
        "device": steps["device"].astype(object), "case_id": steps["case_id"].astype(object),
        "workload": steps["workload"].astype(object),
        "is_baseline": steps["is_baseline"].fillna(False).astype(bool),
        "step_time_s": steps["step_time_s"].astype(float),
        "samples_per_s": pd.to_numeric(steps["samples_per_s"], errors="coerce"),
        "global_batch": pd.to_numeric(steps["global_batch"], errors="coerce"),
        "seq_len": [tokens_per_sample(m, s) for s, m in zip(steps["input_shape"],
                                                            steps["model"], strict=True)],
        "time_rounds": pd.to_numeric(steps["time_rounds"], errors="coerce"),
        "paired": paired,
        "memory": train.fillna(pd.to_numeric(steps["peak_memory_bytes"], errors="coerce")),
        "memory_kind": np.where(train.notna(), "training", "peak"),
    })
    return out.reset_index(drop=True)


def run_index(result_file: str | Path, *, commit: dict | None = None) -> dict:
    """The index of one result file: commit, machine fingerprint, profiles, run time and the
    case figures (``case_figures``) in columns."""
    df = load_results([result_file], labels=["run"])  # checks the file
    data = json.loads(Path(result_file).read_bytes())
    cases = case_figures(df)
    if cases.empty:
        raise ResultsError(f"{result_file}: no measured gpubench case to keep in a history")
    return {
        "gpubench_history": HISTORY_FORMAT,
        "commit": _commit(data, commit),
        "datetime": data.get("datetime"),
        "machine": recorded_machine(data.get("machine_info")),
        "profiles": sorted(set(cases["profile"].dropna())),
        "source": Path(result_file).name,
        "cases": {c: [None if isinstance(v, float) and not math.isfinite(v) else v
                      for v in cases[c].tolist()] for c in CASE_COLUMNS},
    }


def _stamp(when: str | None) -> str:
    try:
        moment = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    except ValueError:
        moment = datetime.now(UTC)
    return moment.strftime("%Y%m%d_%H%M%S")


def save_run(result_file: str | Path, history: str | Path, *,
             commit: dict | None = None) -> Path:
    """Append ``result_file`` to the history folder ``history``: its index as
    ``<machine id>/NNNN_<commit>_<datetime>[_uncommitted-changes].json`` (pytest-benchmark's
    naming, numbered on from the machine's last run) and the result file gzipped in
    ``<machine id>/raw/`` under the same name. ``commit`` overrides the file's
    ``commit_info`` (``{"id", "time", "branch", "dirty"}``). Both written atomically, raw
    first: an interrupted save leaves the history as it was. Returns the index's path."""
    index = run_index(result_file, commit=commit)
    folder = Path(history) / index["machine"]["id"]
    numbers = [int(m.group(1)) for p in (folder.glob("*.json") if folder.is_dir() else ())
               if (m := re.match(r"(\d{4,})_", p.name))]
    commit_id = (index["commit"]["id"] or "unversioned")[:12]
    name = (f"{max(numbers, default=0) + 1:04d}_{commit_id}_{_stamp(index['datetime'])}"
            + ("_uncommitted-changes" if index["commit"]["dirty"] else "") + ".json")
    raw = folder / RAW_DIR / f"{name}.gz"
    raw.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(raw) as tmp:
        tmp.write_bytes(gzip.compress(Path(result_file).read_bytes(), mtime=0))
    index["raw"] = f"{RAW_DIR}/{raw.name}"
    atomic.write_text(folder / name, json.dumps(index, separators=(",", ":")))
    return folder / name


# -- reading a history ---------------------------------------------------------------------------

RUN_COLUMNS = ("run", "commit_id", "commit_time", "branch", "dirty", "run_time", "machine_id",
               "machine_name", "software", "libraries")
"""Per run (``libraries``: the machine's library versions as a mapping, ``software`` in words)."""


def _index_of(path: Path) -> dict | None:
    """The index in ``path``: a gpubench history file as it is, a pytest-benchmark result file
    summarized on reading; None for a file that is neither (said by the caller)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data.get("gpubench_history"):
        return data
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        try:
            return run_index(path)
        except (ResultsError, KeyError, ValueError):
            return None
    return None


@dataclass
class History:
    """The runs of a history folder: ``cases`` (one row per case and run, ``CASE_COLUMNS`` and
    ``RUN_COLUMNS``), ``runs`` (one row per run, in order), ``skipped`` (files not read, with
    why)."""

    cases: pd.DataFrame
    runs: pd.DataFrame
    skipped: list[str] = field(default_factory=list)


def read_history(folder: str | Path, *, since: str | None = None, until: str | None = None,
                 cases: str | None = None) -> History:
    """Every run under ``folder`` (a gpubench history or a pytest-benchmark storage folder; the
    gzipped raw files are not read), ordered by commit time, then run time. ``since`` /
    ``until``: a date or time (ISO), or a commit id prefix, bounding the window (inclusive);
    ``cases``: a regular expression the case id (or ``model case``) must match."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such history folder")
    runs, skipped = [], []
    columns: dict[str, list] = {c: [] for c in (*CASE_COLUMNS, "run")}
    for path in sorted(folder.rglob("*.json")):
        if RAW_DIR in path.relative_to(folder).parts[:-1] or atomic.is_temp_file_name(path.name):
            continue
        index = _index_of(path)
        if index is None:
            skipped.append(f"{path}: not a gpubench history file or pytest-benchmark result file")
            continue
        commit, machine = index.get("commit") or {}, index.get("machine") or {}
        run = str(path.relative_to(folder))
        runs.append({"run": run, "commit_id": commit.get("id"),
                     "commit_time": commit.get("time"), "branch": commit.get("branch"),
                     "dirty": bool(commit.get("dirty")), "run_time": index.get("datetime"),
                     "machine_id": machine.get("id"), "machine_name": machine.get("name"),
                     "software": ", ".join(f"{k} {v}" for k, v in (machine.get("software")
                                                                   or {}).items()
                                           if v is not None),
                     "libraries": machine.get("software") or {}})
        figures = index["cases"]
        n = len(figures["case_id"])
        for c in CASE_COLUMNS:
            columns[c].extend(figures.get(c) or [None] * n)
        columns["run"].extend([run] * n)
    if not runs:
        raise ResultsError(f"{folder}: holds no run (gpubench run --history {folder} or "
                           "gpubench history --add FILE adds one)")
    run_frame = pd.DataFrame(runs)
    for col in ("commit_time", "run_time"):
        run_frame[col] = pd.to_datetime(run_frame[col], utc=True, errors="coerce",
                                        format="ISO8601")
    run_frame["commit_time"] = run_frame["commit_time"].fillna(run_frame["run_time"])
    run_frame = run_frame.sort_values(["commit_time", "run_time", "run"], kind="stable")
    run_frame = _window(run_frame, since, until).reset_index(drop=True)
    run_frame["order"] = range(len(run_frame))
    table = pd.DataFrame(columns)
    for c in ("step_time_s", "samples_per_s", "global_batch", "seq_len", "time_rounds",
              "paired", "memory"):
        table[c] = pd.to_numeric(table[c], errors="coerce").astype(float)
    table["is_baseline"] = table["is_baseline"].fillna(False).astype(bool)
    table = table.merge(run_frame.drop(columns=["run_time"]), on="run", how="inner")
    if cases:
        try:
            pattern = re.compile(cases)
        except re.error as err:
            raise ValueError(f"--case {cases!r} is not a regular expression ({err})") from None
        keep = [bool(pattern.search(str(c)) or pattern.search(f"{m} {c}"))
                for c, m in zip(table["case_id"], table["model"], strict=True)]
        table = table[keep]
        if table.empty:
            raise ValueError(f"--case {cases!r} matches no case of the history's runs")
    return History(table.sort_values(["order"], kind="stable").reset_index(drop=True),
                   run_frame, skipped)


def _window(runs: pd.DataFrame, since: str | None, until: str | None) -> pd.DataFrame:
    def position(bound: str, first: bool) -> int:
        ids = runs["commit_id"].fillna("").astype(str)
        hits = [i for i, c in enumerate(ids) if bound and c.startswith(bound)]
        if hits and re.fullmatch(r"[0-9a-fA-F]{4,40}", bound):
            return hits[0] if first else hits[-1]
        moment = pd.to_datetime(bound, utc=True, errors="coerce")
        if pd.isna(moment):
            raise ValueError(f"{'--since' if first else '--until'} {bound!r} is neither a date "
                             "(ISO, e.g. 2026-12-01) nor a commit id of the history's runs")
        times = runs["commit_time"].tolist()
        if first:
            return next((i for i, t in enumerate(times) if t >= moment), len(times))
        return max((i for i, t in enumerate(times) if t <= moment), default=-1)

    runs = runs.reset_index(drop=True)
    lo = position(since, True) if since else 0
    hi = position(until, False) if until else len(runs) - 1
    return runs.iloc[lo:hi + 1]


# -- series ----------------------------------------------------------------------------------

def history_series(history: History, basis: str = "auto") -> pd.DataFrame:
    """One row per case, metric and run: ``SERIES_KEY`` columns, ``order``, ``value`` (the
    figure followed: time on ``basis``, memory in bytes), ``on`` (what the value is: paired,
    raw, vs median, memory), ``step_time_s``, and the run's columns."""
    if basis not in COMPARE_BASES:
        raise ValueError(f"basis must be one of {', '.join(COMPARE_BASES)}, got {basis!r}")
    t = history.cases.copy()
    if t.empty:
        return t.assign(metric=[], value=[], on=[])
    base = t[t["is_baseline"] == True]  # noqa: E712
    run_key = ["run", "model", "profile", "device"]
    ref = base.groupby(run_key)["step_time_s"].median().rename("_ref").reset_index()
    t = t.merge(ref, on=run_key, how="left")
    t["vs_median"] = t["step_time_s"] / t["_ref"]
    case_key = ["model", "profile", "device", "case_id", "machine_id"]
    all_paired = t["paired"].isna().groupby([t[k] for k in case_key]).transform("sum") == 0
    all_median = t["vs_median"].isna().groupby([t[k] for k in case_key]).transform("sum") == 0
    baseline = t.groupby(case_key)["is_baseline"].transform("max").astype(bool)
    if basis == "raw":
        on = pd.Series("raw", index=t.index)
    elif basis == "auto":
        on = pd.Series(np.where(all_paired & ~baseline, "paired", "raw"), index=t.index)
    else:
        on = pd.Series(np.where(all_paired & ~baseline, "paired",
                                np.where(all_median & ~baseline, "vs median", "raw")),
                       index=t.index)
    value = np.where(on == "paired", t["paired"],
                     np.where(on == "vs median", t["vs_median"], t["step_time_s"]))
    time = t.assign(metric="time", value=value.astype(float), on=on)
    memory = t.assign(metric="memory", value=t["memory"].astype(float), on="memory")
    out = pd.concat([time, memory], ignore_index=True)
    out = out[np.isfinite(out["value"]) & (out["value"] > 0)]
    return out.sort_values([*SERIES_KEY, "order"], kind="stable").reset_index(drop=True)


# -- change points -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ChangePoint:
    """A step in a series: ``at`` the first run of the new level (its position in the series),
    ``ratio`` median after / median before with its bootstrap interval ``low``-``high``, ``p``
    of the permutation test, ``persistent``: whether the new level held ``PERSISTENCE`` runs."""

    at: int
    ratio: float
    low: float
    high: float
    p: float
    persistent: bool = True


def _max_rank_statistic(ranks: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """max over split points k in [lo, hi] of the standardized rank sum of the first k values,
    for each row of ``ranks`` (shape: permutations x n)."""
    n = ranks.shape[-1]
    k = np.arange(1, n)
    sums = np.cumsum(ranks, axis=-1)[..., :-1]
    z = np.abs(sums - k * (n + 1) / 2) / np.sqrt(k * (n - k) * (n + 1) / 12)
    return z[..., lo - 1:hi].max(axis=-1)


def _best_split(x: np.ndarray, min_size: int, rng: np.random.Generator, permutations: int,
                ratio_floor: float = 0.0) -> tuple[int, float] | None:
    """(split point, permutation p) of the strongest split of the log values ``x`` with at
    least ``min_size`` values on each side, or None when ``x`` is too short; p is 1 without a
    test when the split's medians differ by less than ``ratio_floor``."""
    n = x.size
    if n < 2 * min_size or n < 3:
        return None
    from scipy.stats import rankdata

    ranks = rankdata(x)
    k = np.arange(1, n)
    sums = np.cumsum(ranks)[:-1]
    z = np.abs(sums - k * (n + 1) / 2) / np.sqrt(k * (n - k) * (n + 1) / 12)
    window = z[min_size - 1:n - min_size]
    if not window.size or not np.isfinite(window).any() or window.max() == 0:
        return None
    split = int(np.argmax(window)) + min_size
    if ratio_floor and abs(math.expm1(np.median(x[split:]) - np.median(x[:split]))) < ratio_floor:
        return split, 1.0  # the strongest split is too small to count: no test needed
    # Where: the split of least absolute deviation from the two sides' medians (the rank sum's
    # peak drifts by a run or two when a run next to the step is noisy).
    splits = range(min_size, n - min_size + 1)
    cost = [np.abs(x[:k] - np.median(x[:k])).sum() + np.abs(x[k:] - np.median(x[k:])).sum()
            for k in splits]
    split = splits[int(np.argmin(cost))]
    if ratio_floor and abs(math.expm1(np.median(x[split:]) - np.median(x[:split]))) < ratio_floor:
        return split, 1.0  # too small to count: no test needed
    # Permutations in batches: a split far from significant stops after the first batch.
    done = beyond = 0
    while done < permutations:
        batch = min(PERMUTATION_BATCH, permutations - done)
        shuffled = rng.permuted(np.broadcast_to(ranks, (batch, n)), axis=-1)
        null = _max_rank_statistic(shuffled, min_size, n - min_size)
        beyond += int(np.count_nonzero(null >= window.max() - 1e-12))
        done += batch
        if beyond >= 10:  # p above 10 / (done + 1): no need to resolve it further
            break
    return split, (1 + beyond) / (done + 1)


def change_points(values, *, min_magnitude: float = TIME_THRESHOLD,
                  alpha: float = CHANGE_ALPHA, persistence: int = PERSISTENCE,
                  permutations: int = PERMUTATIONS, seed: int = 0) -> list[ChangePoint]:
    """The change points of a series of positive ``values`` in run order (module docstring):
    binary segmentation on the largest standardized rank-sum split, each split kept when its
    permutation p < ``alpha`` and its medians differ by ``min_magnitude`` or more. A split
    whose new level has fewer than ``persistence`` runs (the latest runs only) is returned
    with ``persistent=False``. Sorted by position."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    found: list[ChangePoint] = []

    def segment(lo: int, hi: int) -> None:
        part = x[lo:hi]
        best = _best_split(np.log(part), persistence, rng, permutations, min_magnitude)
        if best is None:
            return
        split, p = best
        before, after = part[:split], part[split:]
        ratio = float(np.median(after) / np.median(before))
        if p >= alpha or abs(ratio - 1) < min_magnitude:
            return
        low, high = bootstrap_ratio_ci(after, before)
        found.append(ChangePoint(lo + split, ratio, low, high, p))
        segment(lo, lo + split)
        segment(lo + split, hi)

    segment(0, x.size)
    found.sort(key=lambda c: c.at)
    pending = _pending(x[found[-1].at if found else 0:], min_magnitude, persistence)
    if pending is not None:
        start = x.size - pending[0]
        before, after = x[found[-1].at if found else 0:start], x[start:]
        ratio = float(np.median(after) / np.median(before))
        low, high = bootstrap_ratio_ci(after, before)
        found.append(ChangePoint(start, ratio, low, high, pending[1], persistent=False))
    return found


def _pending(level: np.ndarray, min_magnitude: float, persistence: int
             ) -> tuple[int, float] | None:
    """(runs, p) when the last few runs of the latest level, fewer than ``persistence``, all
    lie beyond every earlier run of it on one side and their median beyond ``min_magnitude``:
    a step too recent to have persisted. ``p`` is the chance of the last ``t`` of ``n``
    exchangeable runs being the ``t`` most extreme on either side, 2 / C(n, t)."""
    for t in range(persistence - 1, 0, -1):
        before, after = level[:-t], level[-t:]
        if before.size < max(3, persistence):
            continue
        ratio = float(np.median(after) / np.median(before))
        beyond = after.min() > before.max() if ratio > 1 else after.max() < before.min()
        p = min(1.0, 2 / math.comb(level.size, t))
        if beyond and abs(ratio - 1) >= min_magnitude and p < PENDING_ALPHA:
            return t, p
    return None


def detect(series: pd.DataFrame, *, time_magnitude: float = TIME_THRESHOLD,
           memory_magnitude: float = MEMORY_THRESHOLD, alpha: float = CHANGE_ALPHA,
           persistence: int = PERSISTENCE, permutations: int = PERMUTATIONS) -> pd.DataFrame:
    """Every change point of every series (``history_series``): one row each with the series'
    key, what the values are (``on``), ``last_good``/``first_bad`` commit and run, ``ratio``
    with ``low``-``high`` and ``p``, ``persistent`` and ``software_change`` (the libraries
    both runs record at different versions: "torch 2.4.0 -> 2.5.0", "" when none)."""
    rows = []
    for key, s in series.groupby(list(SERIES_KEY), sort=False):
        magnitude = time_magnitude if key[4] == "time" else memory_magnitude
        for cp in change_points(s["value"].to_numpy(), min_magnitude=magnitude, alpha=alpha,
                                persistence=persistence, permutations=permutations):
            good, bad = s.iloc[cp.at - 1], s.iloc[cp.at]
            software = library_changes(good["libraries"], bad["libraries"])
            rows.append({**dict(zip(SERIES_KEY, key, strict=True)), "on": s["on"].iloc[0],
                         "machine_name": bad["machine_name"], "runs": len(s),
                         "last_good": good["commit_id"], "first_bad": bad["commit_id"],
                         "last_good_run": good["run"], "first_bad_run": bad["run"],
                         "at": cp.at, "ratio": cp.ratio, "low": cp.low, "high": cp.high,
                         "p": cp.p, "persistent": cp.persistent,
                         "software_change": software})
    return pd.DataFrame(rows, columns=[*SERIES_KEY, "on", "machine_name", "runs", "last_good",
                                       "first_bad", "last_good_run", "first_bad_run", "at",
                                       "ratio", "low", "high", "p", "persistent",
                                       "software_change"])


def machine_changes(history: History) -> list[str]:
    """One line per change of machine between consecutive runs (each machine keeps its own
    series)."""
    out = []
    runs = history.runs
    for prev, cur in zip(runs.iloc[:-1].itertuples(), runs.iloc[1:].itertuples(), strict=True):
        if prev.machine_id != cur.machine_id:
            out.append(f"machine changed at commit {str(cur.commit_id)[:10]} ({cur.run}): "
                       f"{prev.machine_name} -> {cur.machine_name}; its runs form their own "
                       "series")
    return out


def latest_table(series: pd.DataFrame, changes: pd.DataFrame) -> pd.DataFrame:
    """Per case, metric and machine: runs, the latest value, the trend (the median of the
    last ``TREND_RUNS`` runs over that of the first ones, fewer in a short series) and how
    many change points."""
    rows = []
    held = changes[changes["persistent"]] if len(changes) else changes
    counts = held.groupby(list(SERIES_KEY)).size().to_dict() if len(held) else {}
    for key, s in series.groupby(list(SERIES_KEY), sort=False):
        k = max(1, min(TREND_RUNS, len(s) // 3))
        first, last = s["value"].iloc[:k].median(), s["value"].iloc[-k:].median()
        rows.append({**dict(zip(SERIES_KEY, key, strict=True)), "on": s["on"].iloc[0],
                     "machine_name": s["machine_name"].iloc[-1], "runs": len(s),
                     "latest": float(s["value"].iloc[-1]),
                     "latest_step_time_s": float(s["step_time_s"].iloc[-1]),
                     "latest_samples_per_s": float(s["samples_per_s"].iloc[-1]),
                     "latest_commit": s["commit_id"].iloc[-1],
                     "trend": float(last / first - 1) if first else math.nan,
                     "changes": counts.get(key, 0)})
    return pd.DataFrame(rows)
