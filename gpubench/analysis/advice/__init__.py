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

The judges live by area: ``advice.speed`` (precision, accumulation, optimizers, compilation,
attention, the recipe, parity), ``advice.memory``, ``advice.loader``, ``advice.parallel``, each
reading one model's measured cases found by configuration (``advice.cases``). The recommended
configuration the advice ends with is the decision of ``gpubench.analysis.decision``, the same
the answer prints.
"""

from __future__ import annotations

import re

import pandas as pd

from gpubench.analysis.advice.cases import BASELINE_FIELDS, Verdict, _Cases
from gpubench.analysis.advice.loader import (
    check_cache,
    check_loader_workers,
    check_pinning,
    check_prefetch,
    check_storage,
)
from gpubench.analysis.advice.memory import (
    MEMORY_CHECKS,
    check_del,
    check_empty_cache,
    check_empty_cache_oom,
    check_no_grad,
    check_offload,
    memory_verdicts,
)
from gpubench.analysis.advice.parallel import (
    check_ddp,
    check_dp_vs_ddp,
    check_no_sync,
    check_sharding,
)
from gpubench.analysis.advice.speed import (
    check_accumulation,
    check_adamw,
    check_amp,
    check_compile,
    check_cuda_graphs,
    check_flash_attention,
    check_fp8,
    check_parity,
    check_recipe,
)
from gpubench.analysis.decision import Decision, decide
from gpubench.analysis.recommend import Recommendation
from gpubench.analysis.results import with_baseline_ratios
from gpubench.util.verdicts import FAILED

__all__ = ["BASELINE_FIELDS", "CHECKS", "JUDGES", "MEMORY_CHECKS", "Verdict", "_Cases",
           "advice_markdown", "advise", "memory_verdicts"]

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
