"""The advice check: each common speed-up claim, tested on this machine's measured cases.

A verdict is "holds", "does not hold", "inconclusive" or "not testable here", with its
statistical basis (``gpubench.stats``), on the raw per-round times per sample (so cases with
different batches compare fairly): for two separately measured cases, a two-sided Mann-Whitney U
test and a bootstrap 95% interval of the ratio of medians; for a claim's pair measured in
alternating rounds, the median per-round ratio, its bootstrap 95% interval over the rounds and a
Wilcoxon signed-rank test (drift between rounds cancels in each round's ratio).
A claim holds when the difference is significant, in the claimed direction and at least
``MIN_EFFECT``; it does not hold when it is significant the other way, or when the whole
interval lies within +-``MIN_EFFECT`` (no effect of the claimed size); otherwise inconclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpubench.config import config_from_record, inert_techniques
from gpubench.results import with_baseline_ratios
from gpubench.stats import compare_independent, compare_paired

ALPHA = 0.05
MIN_EFFECT = 0.05
"""Smallest relative change in speed that counts as an effect."""
MIN_MEMORY_EFFECT = 0.05


@dataclass(frozen=True)
class Verdict:
    model: str
    claim: str
    measured: str
    verdict: str
    why: str
    chart: str


@dataclass(frozen=True)
class SpeedComparison:
    """``new`` against ``base``: speed ratio (>1: new is faster per sample), p-value of
    ``test``, 95% CI."""

    ratio: float
    p_value: float
    low: float
    high: float
    test: str = "Mann-Whitney"

    def decide(self, min_effect: float = MIN_EFFECT) -> str:
        if self.p_value < ALPHA and self.ratio >= 1 + min_effect:
            return "holds"
        if self.p_value < ALPHA and self.ratio < 1:
            return "does not hold"
        if 1 - min_effect <= self.low and self.high <= 1 + min_effect:
            return "does not hold"
        return "inconclusive"

    def describe(self) -> str:
        return (f"{self.ratio:.2f}x speed (95% CI {self.low:.2f}-{self.high:.2f}, "
                f"{self.test} p={self.p_value:.3g})")


def _per_sample_rounds(row: pd.Series) -> np.ndarray:
    rounds = row["rounds_s"] if isinstance(row.get("rounds_s"), list) else [row["step_time_s"]]
    return np.asarray(rounds, dtype=float) / row["global_batch"]


def compare_speed(base: pd.Series, new: pd.Series) -> SpeedComparison:
    """Two separately measured cases, per sample."""
    return compare_rounds(_per_sample_rounds(base), _per_sample_rounds(new))


def compare_rounds(a: np.ndarray, b: np.ndarray, n_boot: int = 2000,
                   seed: int = 0) -> SpeedComparison:
    """Per-sample round times of a baseline ``a`` and a technique ``b``, measured separately:
    ratio of medians, Mann-Whitney, bootstrap interval (``stats.compare_independent``)."""
    est = compare_independent(a, b, n_resamples=n_boot, seed=seed)
    return SpeedComparison(est.ratio, est.p_value, est.low, est.high, est.test)


def compare_paired_rounds(a: np.ndarray, b: np.ndarray, n_boot: int = 2000,
                          seed: int = 0) -> SpeedComparison:
    """Per-sample round times of a baseline ``a`` and a technique ``b`` measured in
    alternation (round ``i`` of each side next to the other's): median per-round ratio,
    Wilcoxon signed-rank, bootstrap interval over the rounds (``stats.compare_paired``)."""
    est = compare_paired(a, b, n_resamples=n_boot, seed=seed)
    return SpeedComparison(est.ratio, est.p_value, est.low, est.high, est.test)


def _memory(row: pd.Series) -> float:
    """The memory a technique changes (``results.training_memory``)."""
    return float(row["training_memory_bytes"])


class _Cases:
    """The measured step cases of one model in one run, by id, and its paired claims."""

    def __init__(self, df: pd.DataFrame, model: str):
        sub = df[(df["model"] == model) & df["step_time_s"].notna()]
        self.rows = {r["case_id"]: r for _, r in sub.iterrows()}
        claims = df[df["kind"] == "claim"] if "kind" in df else df.iloc[0:0]
        self.pairs = {r["claim"]: r for _, r in claims[claims["model"] == model].iterrows()}
        self.model = model
        self.device = sub["device"].iloc[0] if len(sub) else "cpu"
        self.peaks = sub["matmul_peak_tflops"].iloc[0] if "matmul_peak_tflops" in sub and len(
            sub) else None

    def get(self, suffix: str) -> pd.Series | None:
        return self.rows.get(f"{self.model}-{suffix}")

    def speed(self, claim: str, base: pd.Series, new: pd.Series) -> tuple[SpeedComparison, str]:
        """From the claim's interleaved pair when measured, else from the two cases."""
        pair = self.pairs.get(claim)
        if pair is not None:
            a = np.asarray(pair["rounds_base_s"]) / pair["global_batch_base"]
            b = np.asarray(pair["rounds_new_s"]) / pair["global_batch_new"]
            return compare_paired_rounds(a, b), "interleaved rounds"
        return compare_speed(base, new), "separate cases"


def _missing(model: str, claim: str, chart: str, what: str) -> Verdict:
    return Verdict(model, claim, "-", "inconclusive", f"not measured in these results ({what})",
                   chart)


def check_amp(c: _Cases) -> list[Verdict]:
    claim = "AMP cuts training time ~30% and memory ~50%"
    base = c.get("fp32")
    out = []
    for precision in ("fp16", "bf16"):
        amp = c.get(precision)
        if base is None or amp is None:
            out.append(_missing(c.model, f"{claim} ({precision})", "speedup.png",
                                f"{c.model}-fp32 and {c.model}-{precision}"))
            continue
        speed, basis = c.speed(f"amp-{precision}", base, amp)
        memory = _memory(amp) / _memory(base)
        verdict = speed.decide(0.10)
        why = f"{basis}; memory x{memory:.2f}"
        if c.peaks and c.peaks.get(precision) and c.peaks.get("fp32"):
            fast, slow = c.peaks[precision], c.peaks["fp32"]
            why += (f"; measured matmul peak {precision} {fast:.3g} vs fp32 {slow:.3g} TFLOP/s")
            if fast < slow:
                why += f": this device has no fast {precision} matrix units"
        out.append(Verdict(c.model, f"{claim} ({precision})",
                           f"{speed.describe()}, memory x{memory:.2f}", verdict, why,
                           "speedup.png"))
    return out


def check_accumulation(c: _Cases) -> list[Verdict]:
    claim = "gradient accumulation keeps the effective batch at lower memory"
    base = c.get("fp32")
    pair = c.pairs.get("accumulation")
    if pair is not None and base is not None and pd.notna(pair.get("accum_steps_new")):
        # The interleaved pair: its own k, and memory from its exact activation counts.
        k = int(pair["accum_steps_new"])
        fixed = base["param_bytes"] + base["grad_bytes"] + base["optimizer_state_bytes"]
        memory = (pair["activation_bytes_new"] + fixed) / (pair["activation_bytes_base"] + fixed)
        if base["device"] == "cuda":
            row = c.get(f"fp32-accum{k}-mb{pair['global_batch_new'] // k}")
            memory = _memory(row) / _memory(base) if row is not None else memory
        speed, basis = c.speed("accumulation", base, base)
        return [_accumulation_verdict(c, claim, k, memory, speed, basis)]
    pairs = [(k, r) for k in (2, 4) for r in c.rows.values()
             if r["accum_steps"] == k and r["group"] == "accumulation" and base is not None
             and r["global_batch"] == base["global_batch"] and r["precision"] == "fp32"]
    if not pairs:
        return [_missing(c.model, claim, "accumulation.png", "accumulation at constant batch")]
    k, row = max(pairs, key=lambda p: p[0])
    memory = _memory(row) / _memory(base)
    return [_accumulation_verdict(c, claim, k, memory, compare_speed(base, row),
                                  "separate cases")]


def _accumulation_verdict(c: _Cases, claim: str, k: int, memory: float,
                          speed: SpeedComparison, basis: str) -> Verdict:
    verdict = "holds" if memory <= 1 - MIN_MEMORY_EFFECT else "does not hold"
    return Verdict(c.model, claim, f"k={k}: memory x{memory:.2f}, {speed.describe()}", verdict,
                   f"{basis}; smaller micro-batches keep fewer activations (gradients and "
                   f"optimizer state stay); the price is {k} sequential micro-steps",
                   "accumulation.png")


def check_loader_workers(c: _Cases) -> list[Verdict]:
    claim = "more DataLoader workers and pinned, asynchronous copies speed training ~30%"
    base = c.get("fp32-images-jpeg")
    if base is None:
        base = c.get("fp32-tokens-mmap")
    tuned = [] if base is None else [
        r for r in c.rows.values()
        if r.get("dataset") == base["dataset"] and r["num_workers"] > 0
        and r["micro_batch"] == base["micro_batch"] and not r.get("cached")
    ]
    if not tuned:
        return [_missing(c.model, claim, "loader.png", "on-disk data with 0 and more workers")]
    best = max(tuned, key=lambda r: r["samples_per_s"])
    speed = compare_speed(base, best)
    verdict = speed.decide(0.10)
    why = (f"separate cases; best: {best['case_id']}; stall {base['loader_stall_fraction']:.0%} -> "
           f"{best['loader_stall_fraction']:.0%}")
    if c.device == "cpu":
        why += ("; on a CPU-only machine the workers compete with the training step for the same "
                "cores, and pinning has no accelerator to serve")
    return [Verdict(c.model, claim, speed.describe(), verdict, why, "loader.png")]


def check_cache(c: _Cases) -> list[Verdict]:
    claim = "caching decoded samples removes the loading cost"
    base, cached = c.get("fp32-images-jpeg"), c.get("fp32-images-jpeg-cached")
    if base is None or cached is None:
        return [_missing(c.model, claim, "loader.png", "cached and uncached on-disk data")]
    speed, basis = c.speed("cache", base, cached)
    resident = c.get("fp32-device-resident")
    why = (f"{basis}; stall {base['loader_stall_fraction']:.0%} -> "
           f"{cached['loader_stall_fraction']:.0%}; the cache keeps the decode, augmentation "
           "still runs")
    if resident is not None:
        why += f"; device-resident bound {resident['samples_per_s']:.0f} samples/s"
    return [Verdict(c.model, claim, speed.describe(), speed.decide(0.10), why, "loader.png")]


def check_ddp(c: _Cases) -> list[Verdict]:
    claim = "DDP cuts training time to ~1/N"
    rows = [r for r in c.rows.values() if r["parallel"] == "ddp" and r["accum_steps"] == 1
            and r["precision"] == "fp32"]
    if not rows:
        return [_missing(c.model, claim, "scaling.png", "DDP cases")]
    row = max(rows, key=lambda r: r["world_size"])
    eff = row.get("scaling_efficiency")
    measured = f"{row['case_id']}: scaling efficiency {eff:.0%}" if pd.notna(eff) else "-"
    if c.device == "cpu":
        return [Verdict(c.model, claim, measured, "not testable here",
                        f"needs {int(row['world_size'])} GPUs: on the CPU the ranks share the same "
                        "cores, so no speedup is possible; the figure shows the cost of gloo "
                        "communication only", "scaling.png")]
    verdict = "holds" if eff >= 0.8 else "does not hold"
    return [Verdict(c.model, claim, measured, verdict,
                    "efficiency >= 80% counts as time cut to ~1/N", "scaling.png")]


def check_empty_cache(c: _Cases) -> list[Verdict]:
    claim = "torch.cuda.empty_cache() after every step helps"
    base, row = c.get("fp32"), c.get("fp32-emptycache")
    if base is None or row is None:
        return [_missing(c.model, claim, "speedup.png", "the emptycache case")]
    speed, basis = c.speed("empty-cache", base, row)
    if c.device != "cuda":
        return [Verdict(c.model, claim, speed.describe(), "not testable here",
                        "needs CUDA: the CPU allocator has no cache to empty", "speedup.png")]
    reserved = row["peak_reserved_bytes"] / base["peak_reserved_bytes"]
    # It helps if it is faster, or if it lowers the peak reserve without costing speed.
    speed_verdict = speed.decide()
    lowers_reserve = reserved <= 1 - MIN_MEMORY_EFFECT and speed.ratio >= 1 - MIN_EFFECT
    verdict = "holds" if speed_verdict == "holds" or lowers_reserve else (
        "inconclusive" if speed_verdict == "inconclusive" else "does not hold")
    return [Verdict(c.model, claim, f"{speed.describe()}, peak reserved x{reserved:.2f}",
                    verdict, "it releases cached blocks the next step must allocate again; "
                    "it lowers the reserve only between steps", "memory.png")]


def check_adamw(c: _Cases) -> list[Verdict]:
    claim = "AdamW is faster than Adam"
    out = []
    for impl in ("", "_foreach", "_fused"):
        adam, adamw = c.get(f"fp32-adam{impl}"), c.get(f"fp32-adamw{impl}")
        if adam is None or adamw is None:
            continue
        speed, basis = c.speed("adamw", adam, adamw) if not impl else (
            compare_speed(adam, adamw), "separate cases")
        out.append(Verdict(c.model, f"{claim} ({impl.strip('_') or 'default'})",
                           speed.describe(), speed.decide(),
                           f"{basis}; both run the same update; AdamW only applies weight "
                           "decay to the weights directly instead of through the gradient",
                           "speedup.png"))
    return out or [_missing(c.model, claim, "speedup.png", "adam and adamw cases")]


def check_no_sync(c: _Cases) -> list[Verdict]:
    claim = "no_sync during accumulation saves communication"
    rows = {r["ddp_no_sync"]: r for r in c.rows.values()
            if r["parallel"] == "ddp" and r["accum_steps"] > 1}
    if set(rows) != {False, True}:
        return [_missing(c.model, claim, "scaling.png", "DDP accumulation with and without "
                         "no_sync")]
    speed = compare_speed(rows[False], rows[True])
    why = "separate cases"
    if pd.notna(rows[True].get("comm_time_s")):
        why += (f"; estimated all-reduce time per step {rows[False]['comm_time_s'] * 1e3:.1f} ms "
               f"-> {rows[True]['comm_time_s'] * 1e3:.1f} ms")
    return [Verdict(c.model, claim, speed.describe(), speed.decide(), why, "scaling.png")]


CHECKS = (check_amp, check_accumulation, check_loader_workers, check_cache, check_ddp,
          check_empty_cache, check_adamw, check_no_sync)


def advise(df: pd.DataFrame) -> list[Verdict]:
    """Every claim, for every model in the results (one run)."""
    df = with_baseline_ratios(df)
    verdicts = []
    for model in dict.fromkeys(df["model"].dropna()):
        cases = _Cases(df, model)
        for check in CHECKS:
            verdicts.extend(check(cases))
    return verdicts


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


def recommend(df: pd.DataFrame, budget_bytes: float | None = None) -> list[Recommendation]:
    """Per model: the fastest single-device configuration (synthetic data, so that techniques
    compare, not loaders; techniques that do nothing on this device left out) whose
    peak memory fits the budget and that beats the FP32 baseline
    significantly (Mann-Whitney, Bonferroni-corrected over the candidates, and by at least
    ``MIN_EFFECT``); the baseline itself when none does."""
    df = with_baseline_ratios(df)
    out = []
    for model in dict.fromkeys(df["model"].dropna()):
        sub = df[(df["model"] == model) & df["step_time_s"].notna()
                 & (df["parallel"] == "single") & (df["dataset"] == "synthetic")]
        # A technique that does nothing on this device can only "win" by measurement noise.
        inert = sub.apply(lambda r: bool(inert_techniques(r.to_dict())),
                          axis=1)
        sub = sub[~inert]
        if budget_bytes is not None:
            sub = sub[sub["peak_memory_bytes"] <= budget_bytes]
        base = sub[sub["is_baseline"] == True]  # noqa: E712
        if sub.empty or base.empty:
            continue
        baseline = base.iloc[0]
        alpha = ALPHA / max(1, len(sub) - 1)
        best, best_speed = baseline, compare_speed(baseline, baseline)
        for _, row in sub.sort_values("samples_per_s", ascending=False).iterrows():
            speed = compare_speed(baseline, row)
            if speed.p_value < alpha and speed.ratio >= 1 + MIN_EFFECT:
                best, best_speed = row, speed
                break
        out.append(Recommendation(model, best["case_id"], best_speed.ratio, best_speed.low,
                                  best_speed.high, float(best["peak_memory_bytes"]),
                                  budget_bytes))
    return out


def confirm(rec: Recommendation, df: pd.DataFrame, rounds: int = 20) -> Recommendation:
    """Re-measure a recommended configuration against the FP32 baseline in alternating rounds:
    separately measured cases can differ by machine drift alone. Keeps the recommendation
    only if the interleaved comparison also shows a significant win."""
    from gpubench.claims import ClaimPair, measure_pair
    from gpubench.standalone import StandaloneBenchmark

    rows = df.set_index("case_id")
    new = config_from_record(rows.loc[rec.case_id].to_dict())
    base = new.with_(precision="fp32", accum_steps=1, micro_batch=None, optimizer="sgd",
                     optimizer_impl="default", zero_grad_set_to_none=True, empty_cache=False,
                     checkpointing=False, channels_last=False, compile=False)
    if base == new:
        return rec
    bench = StandaloneBenchmark(f"confirm-{rec.case_id}")
    info = measure_pair(bench, ClaimPair("recommendation", base, new), rounds, 1)
    speed = compare_paired_rounds(np.asarray(info["rounds_base_s"]) / info["global_batch_base"],
                                  np.asarray(info["rounds_new_s"]) / info["global_batch_new"])
    if speed.p_value < ALPHA and speed.ratio >= 1 + MIN_EFFECT:
        return Recommendation(rec.model, rec.case_id, speed.ratio, speed.low, speed.high,
                              rec.peak_memory_bytes, rec.budget_bytes, confirmed=True)
    base_row = rows.loc[base.id] if base.id in rows.index else None
    peak = float(base_row["peak_memory_bytes"]) if base_row is not None else float("nan")
    return Recommendation(rec.model, base.id, 1.0, speed.low, speed.high, peak,
                          rec.budget_bytes, confirmed=True,
                          note=f"{rec.case_id} did not beat FP32 in alternating rounds "
                          f"({speed.describe()})")


def advice_markdown(df: pd.DataFrame, budget_bytes: float | None = None,
                    recommendations: list[Recommendation] | None = None) -> str:
    lines = ["| model | claim | measured | verdict | why | chart |", "|---|---|---|---|---|---|"]
    for v in advise(df):
        lines.append(f"| {v.model} | {v.claim} | {v.measured} | **{v.verdict}** | {v.why} | "
                     f"[{v.chart}]({v.chart}) |")
    recs = recommend(df, budget_bytes) if recommendations is None else recommendations
    if recs:
        budget = "" if budget_bytes is None else f" within {budget_bytes / 2**20:,.0f} MiB"
        lines += ["", f"Recommended configuration{budget}: the fastest that measurably beats "
                  "FP32 and trains correctly (the baseline when none does):", ""]
        for r in recs:
            basis = ("confirmed in alternating rounds" if r.confirmed
                     else "from separately measured cases")
            note = f"; {r.note}" if r.note else ""
            lines.append(f"- {r.model}: `{r.case_id}`, {r.speedup:.2f}x the FP32 baseline "
                         f"(95% CI {r.low:.2f}-{r.high:.2f}, {basis}), peak memory "
                         f"{r.peak_memory_bytes / 2**20:,.0f} MiB{note}")
    return "\n".join(lines) + "\n"
