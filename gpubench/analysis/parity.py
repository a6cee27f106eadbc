"""``gpubench parity``: the verdicts on convergence parity (``gpubench.diagnostics.parity``), its
tables, its chart of the loss curves, and ``parity.json``, which ``gpubench advise --parity`` judges
beside a run's results.

The tolerance: a technique keeps FP32's accuracy when its *final loss* (the mean training loss
of the last ``final_window`` steps, a whole number of passes over the fixed set) differs from
FP32's by at most ``TOLERANCE`` of FP32's *initial loss* (the mean of its first pass), and its
loss curve (smoothed over one pass) stays within ``CURVE_TOLERANCE`` of FP32's on average. The
difference is measured against the initial loss, not the final one, because a memorised set's
final loss can approach 0, where relative differences explode (ResNet-18: 0.002 against
0.0004 after 120 steps, both fully trained). The verdict is inconclusive unless FP32 itself
learned: its final loss at most ``LEARNED`` of its initial loss.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from gpubench.diagnostics.parity import TECHNIQUES
from gpubench.suite.claims import CLAIMS
from gpubench.util import atomic
from gpubench.util.verdicts import Kind

TOLERANCE = CLAIMS["parity"].parts["bf16"][1]
"""Largest |final loss - FP32's final loss| / FP32's initial loss that counts as parity (the
claim's range, ``gpubench.suite.claims``: 0.02)."""

CURVE_TOLERANCE = 0.10
"""Largest mean |smoothed loss - FP32's| over the run, as a share of FP32's initial loss: a
technique must also *train* like FP32, not only end near it (ResNet-18's BatchNorm over
micro-batches of 2 under k = 4 accumulation learns the set much more slowly, a mean gap of
26%, and still ends within 2%)."""

LEARNED = 0.5
"""FP32's final loss must be at most this share of its initial loss (the task was learned)."""

FINAL_SHARE = 0.2
"""The final loss averages the last fifth of the steps (whole passes over the fixed set)."""

CLAIM = CLAIMS["parity"].text
COMPARED = tuple(CLAIMS["parity"].parts)
"""The techniques the claim is about (the parts of its verdict)."""


def final_window(steps: int, batches: int) -> int:
    """Steps the final loss averages: about ``FINAL_SHARE`` of ``steps``, whole passes."""
    passes = max(1, round(steps * FINAL_SHARE / batches))
    return min(steps, passes * batches)


def smoothed(losses: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` steps (one pass over the fixed set): the loss over the
    whole set at that point of training; the first ``window - 1`` steps have none."""
    return [statistics.fmean(losses[i + 1 - window:i + 1]) for i in range(window - 1,
                                                                          len(losses))]


def judge(report: dict) -> dict:
    """``report`` (``run_parity``'s) with each technique's final loss, gap to FP32 and
    verdict, and the reference's initial and final loss."""
    runs = {r["technique"]: r for r in report["techniques"]}
    ref = runs[report["reference"]]
    batches = report["batches"]
    window = final_window(report["steps"], batches)
    initial = statistics.fmean(ref["losses"][:batches])
    ref_final = statistics.fmean(ref["losses"][-window:])
    learned = ref_final <= LEARNED * initial
    ref_curve = smoothed(ref["losses"], batches)
    for run in report["techniques"]:
        final = statistics.fmean(run["losses"][-window:])
        curve = smoothed(run["losses"], batches)
        run["final_loss"] = final
        run["gap"] = (final - ref_final) / initial
        gaps = [abs(a - b) / initial for a, b in zip(curve, ref_curve, strict=True)]
        run["curve_gap"] = statistics.fmean(gaps)
        run["curve_gap_max"] = max(gaps)
        run["bit_identical"] = run["losses"] == ref["losses"]
        finite = all(math.isfinite(x) for x in run["losses"])
        if run["initial_weights"] != ref["initial_weights"]:
            run["verdict"], run["reason"] = Kind.INCONCLUSIVE, "different initial weights"
        elif not finite:
            run["verdict"], run["reason"] = Kind.DOES_NOT_HOLD, "non-finite loss"
        elif not learned:
            run["verdict"], run["reason"] = Kind.INCONCLUSIVE, (
                f"FP32 did not learn the task in {report['steps']} steps (final loss "
                f"{ref_final:.3g} above {LEARNED:.0%} of its initial {initial:.3g}): raise --steps")
        elif abs(run["gap"]) > TOLERANCE:
            run["verdict"], run["reason"] = Kind.DOES_NOT_HOLD, "final loss outside tolerance"
        elif run["curve_gap"] > CURVE_TOLERANCE:
            run["verdict"], run["reason"] = Kind.DOES_NOT_HOLD, "loss curve outside tolerance"
        else:
            run["verdict"], run["reason"] = Kind.HOLDS, "within tolerance"
    return {**report, "tolerance": TOLERANCE, "curve_tolerance": CURVE_TOLERANCE,
            "learned": LEARNED, "final_window": window,
            "initial_loss": initial, "reference_final_loss": ref_final, "reference_learned":
            learned}


def parity_rows(report: dict) -> list[dict]:
    return [{"technique": r["technique"], "configuration": r["case_id"],
             "final loss": f"{r['final_loss']:.4g}",
             "gap (share of initial loss)": f"{r['gap']:+.2%}",
             "curve gap (mean / largest)": f"{r['curve_gap']:.2%} / {r['curve_gap_max']:.1%}",
             "fp16 skipped steps": r["skipped_steps"] if r["precision"] == "fp16" else "-",
             "seconds": f"{r['seconds']:.1f}", "verdict": f"**{r['verdict']}**"
             + ("" if r["reason"] == "within tolerance" else f" ({r['reason']})")}
            for r in report["techniques"]]


def verdict_parts(report: dict) -> dict[str, str]:
    """The claim's parts: each of ``COMPARED`` that was trained, with its verdict."""
    runs = {r["technique"]: r for r in report["techniques"]}
    return {name: runs[name]["verdict"] for name in COMPARED if name in runs}


def describe(report: dict) -> tuple[str, str]:
    """(measured, why) of the claim's verdict row."""
    runs = {r["technique"]: r for r in report["techniques"]}
    ref = runs[report["reference"]]
    measured = (f"final loss after {report['steps']} steps: fp32 {ref['final_loss']:.3g}; "
                + ", ".join(f"{n} {runs[n]['final_loss']:.3g} (final {runs[n]['gap']:+.1%}, "
                            f"curve {runs[n]['curve_gap']:.1%})" for n in COMPARED if n in runs))
    repeat = runs.get("fp32-repeat")
    why = (f"{report['model']} trained from the same initial weights on a fixed, memorisable "
           f"set of {report['batches']} batches of {report['global_batch']} samples in the same "
           f"order; parity: the final loss (mean of the last {report['final_window']} steps) "
           f"no further from FP32's than {report['tolerance']:.0%} of FP32's initial loss, and "
           f"the smoothed loss curve no further than {report['curve_tolerance']:.0%} of it on "
           "average")
    if report.get("batch_norm"):
        why += ("; the model has BatchNorm, which normalises each micro-batch (accumulation) "
                "and each rank's shard (DDP without SyncBatchNorm) by its own statistics: "
                "splitting the batch changes the computation, not only its rounding")
    if repeat is not None:
        why += ("; a second FP32 run is bit-identical" if repeat["bit_identical"] else
                f"; a second FP32 run differs by {repeat['gap']:+.2%}")
    if report.get("left_out"):
        why += "; not trained: " + "; ".join(f"{k} ({v})" for k, v in report["left_out"].items())
    return measured, why


def parity_markdown(report: dict) -> str:
    from gpubench.util.tables import markdown_table

    lines = [f"# gpubench parity: {report['model']} ({report['profile']}, {report['device']})",
             "", f"{report['steps']} optimizer steps per technique, {report['optimizer']}, from "
             "the same initial weights on the same data in the same order: a fixed set of "
             f"{report['batches']} global batches of {report['global_batch']} samples "
             "(`make_batch`, random targets) cycled, which the model memorises. Final loss: "
             f"the mean of the last {report['final_window']} steps. Tolerance: |final loss - "
             f"FP32's| <= {report['tolerance']:.0%} of FP32's initial loss "
             f"({report['initial_loss']:.4g}), and the mean |gap| between the loss curves "
             f"(each the mean over one pass of {report['batches']} steps) <= "
             f"{report['curve_tolerance']:.0%} of it; FP32 must reach {report['learned']:.0%} "
             "of its initial loss.",
             "", markdown_table(parity_rows(report))]
    if report.get("left_out"):
        lines.append("")
    for name, reason in report.get("left_out", {}).items():
        lines.append(f"- not trained: {name}: {reason}")
    parts = verdict_parts(report)
    if parts:
        from gpubench.util.verdicts import combine_parts

        measured, why = describe(report)
        lines += ["", f"**{CLAIM}**: {combine_parts(parts)}. {measured}."]
    lines.append(f"\nTotal {report['seconds']:.0f} s. Chart: {report.get('chart', 'parity.png')}")
    return "\n".join(lines) + "\n"


def plot_parity(report: dict):
    """The smoothed loss curves (one pass over the set) per technique, FP32 in black; and each
    technique's final-loss gap with the tolerance band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    batches = report["batches"]
    fig, (ax, bar) = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=(2.2, 1))
    named = list(dict.fromkeys([*TECHNIQUES, *(r["technique"] for r in report["techniques"])]))
    colors = dict(zip(named, sns.color_palette("tab10", len(named)), strict=True))
    lows = []
    for run in report["techniques"]:
        curve = smoothed(run["losses"], batches)
        lows.append(min(curve))
        ref = run["technique"] == report["reference"]
        ax.plot(range(batches, len(run["losses"]) + 1), curve, label=run["technique"],
                color="black" if ref else colors[run["technique"]],
                lw=2.2 if ref else 1.3, ls="-" if ref else "--", zorder=3 if ref else 2)
    if min(lows) > 0 and report["initial_loss"] / min(lows) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"training loss (mean over {batches} steps)")
    ax.set_title(f"{report['model']} ({report['profile']}, {report['device']}): loss curves")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    names = [r["technique"] for r in report["techniques"]]
    gaps = [100 * r["gap"] for r in report["techniques"]]
    tol = 100 * report["tolerance"]
    bar.axvspan(-tol, tol, color="#d9f0d3", zorder=0, label=f"tolerance \u00b1{tol:g}%")
    reach = max([tol * 1.6, *(abs(g) * 1.35 for g in gaps)])
    bar.set_xlim(-reach, reach)
    bar.barh(names, gaps, color=["black" if n == report["reference"] else colors[n]
                                 for n in names])
    for i, gap in enumerate(gaps):
        bar.annotate(f"{gap:+.2f}%", (gap, i), xytext=(4 if gap >= 0 else -4, 0),
                     textcoords="offset points", va="center", fontsize=8,
                     ha="left" if gap >= 0 else "right")
    bar.axvline(0, color="black", lw=0.8)
    bar.invert_yaxis()
    bar.set_xlabel("final loss - FP32's, % of FP32's initial loss")
    bar.set_title("final-loss gap")
    bar.legend(loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def write_parity(reports: dict | list[dict], out: Path, chart: bool = True) -> list[Path]:
    """``parity.json``, ``parity.md`` and (``chart``) the chart into ``out``, each written
    atomically: for one report ``parity.png``/``.svg``; for several (``gpubench run
    --parity``: one per model) a list in ``parity.json`` and ``parity-<model>.png``/``.svg``."""
    import matplotlib.pyplot as plt

    many = isinstance(reports, list)
    reports = reports if many else [reports]
    for r in reports:
        r["chart"] = f"parity-{r['model']}.png" if many else "parity.png"
    written = [out / "parity.json", out / "parity.md"]
    atomic.write_json(written[0], reports if many else reports[0], indent=1)
    atomic.write_text(written[1], "\n".join(parity_markdown(r) for r in reports))
    for r in reports if chart else ():
        fig = plot_parity(r)
        try:
            for suffix in ("png", "svg"):
                dest = out / Path(r["chart"]).with_suffix(f".{suffix}")
                with atomic.atomic_path(dest) as tmp:
                    fig.savefig(tmp, format=suffix, dpi=110, bbox_inches="tight")
                written.append(dest)
        finally:
            plt.close(fig)
    return written


def load_parity_reports(paths) -> list[dict]:
    """The reports in ``parity.json`` files of ``gpubench parity`` (one report) or ``gpubench
    run --parity`` (a list, one per model); a bad file: a one-line ``ResultsError``."""
    from gpubench.analysis.results import load_report_files

    def problem(report: dict) -> str | None:
        if report.get("kind") != "parity" or not isinstance(report.get("techniques"), list):
            return "no kind 'parity' or techniques"
        return None
    # The verdicts by this version's tolerances.
    return [judge(r) for r in load_report_files(paths, "parity.json", problem)]


def parity_reports_beside(files) -> list[dict]:
    """The reports of the ``parity.json`` beside each result file, where there is one."""
    from gpubench.analysis.results import files_beside

    return load_parity_reports(files_beside(files, "parity.json"))
