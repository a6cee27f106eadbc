"""The verdict vocabulary and the thresholds that decide it, in one place (no heavy imports: the
command line's --help reads the defaults from here).

A claim's part (its time, its memory) is judged *holds*, *smaller than claimed*, *does not hold*
or *inconclusive* (``gpubench.analysis.advice``); a claim combines its parts
(``combine_parts``). A claim is *not applicable* when the workload lacks what it is about and
*not testable here* when the machine cannot show it; *case failed* when its case did not run.
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """The words every verdict is given in: a claim's (the advice, convergence parity), a
    regression check's (``gpubench compare``), a leak check's (``gpubench memory``), and the
    words that mark a figure not to trust (the summary's flags, telemetry's contention). Equal
    to their strings, so records and tables keep plain text."""

    HOLDS = "holds"
    SMALLER = "smaller than claimed"
    DOES_NOT_HOLD = "does not hold"
    INCONCLUSIVE = "inconclusive"
    NOT_APPLICABLE = "not applicable"
    NOT_TESTABLE = "not testable here"
    FAILED = "case failed"
    # gpubench compare: a case measured in both runs
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"
    TOO_FEW = "too few rounds to decide"
    # gpubench memory's leak check of a training loop
    LEAKS = "LEAKS"
    NO_LEAK = "ok"
    DOES_NOT_FIT = "does not fit"
    # a figure not to trust (the summary's flags, the advice's why, telemetry)
    IMPLAUSIBLE = "implausible"
    MACHINE_NOISE = "machine noise"
    NOISY_BASELINE = "noisy baseline"
    CONTENDED = "measured under contention"
    DISTURBED = "disturbed pairing"

    @property
    def tone(self) -> str:
        """How the report colours it: good, bad, unsure, na or neutral."""
        return _TONES[self]


_TONES = {
    Kind.HOLDS: "good", Kind.IMPROVEMENT: "good",
    Kind.DOES_NOT_HOLD: "bad", Kind.FAILED: "bad", Kind.REGRESSION: "bad",
    Kind.INCONCLUSIVE: "unsure", Kind.SMALLER: "unsure", Kind.TOO_FEW: "unsure",
    Kind.NOT_TESTABLE: "na", Kind.NOT_APPLICABLE: "na",
    Kind.UNCHANGED: "neutral", Kind.NO_LEAK: "good", Kind.LEAKS: "bad", Kind.DOES_NOT_FIT: "na",
    Kind.IMPLAUSIBLE: "bad", Kind.MACHINE_NOISE: "unsure", Kind.NOISY_BASELINE: "unsure",
    Kind.CONTENDED: "unsure", Kind.DISTURBED: "unsure",
}


FAILED = Kind.FAILED.value
"""The verdict of a claim whose case failed to run (instead of *inconclusive*)."""

ALPHA = 0.05
"""Significance level of every test behind a verdict (advice, parity, regression compare)."""

MIN_EFFECT = 0.05
"""Smallest relative change in speed that counts as an effect."""

TIME_THRESHOLD = 0.07
"""``gpubench compare``: smallest relative change of median time that counts as a regression."""

MEMORY_THRESHOLD = 0.02
"""``gpubench compare``: smallest relative change of training memory that counts."""

NOISE_SIGMAS = 3.0
"""``gpubench compare``: a time change must also exceed this many between-run spreads of its
basis (``--noise-sigmas``; 0: the time threshold alone)."""

SCREEN_SIGMAS = 2.5
"""``gpubench compare --confirm``, first stage: a time change beyond this many between-run
spreads (and beyond ``SCREEN_THRESHOLD_SHARE`` of the time threshold; never beyond the plain
limit) flags a case for re-measurement (``--screen-sigmas``). About 1 case in 160 of one
commit is flagged, and re-measured, for nothing."""

SCREEN_THRESHOLD_SHARE = 0.5
"""``gpubench compare --confirm``: the share of the time threshold a flagged change must reach
at least, so a quiet machine does not re-measure changes too small to ever count."""

CONFIRM_SIGMAS = 4.2
"""``gpubench compare --confirm``, second stage: a flagged case is a regression only when its
re-measurement alone passes the first stage again and the new and re-measured rounds pooled
differ from the base by more than the time threshold and this many standard deviations of that
pooled change (``--confirm-sigmas``; the between-run spread scaled by
``analysis.compare.pooled_spread_factor``). Chosen so that two runs of one commit with 140
cases fail in under 1 comparison in 100 under Gaussian between-run noise: 0.63% (0.49-0.81%)
with two re-measurements, while a 10% slowdown at a 2.4% between-run spread is caught in 77% of
comparisons with one base run and 93% with two (``scripts/gate_false_alarms.py``;
docs/history.md has its table). Against the base code re-measured (``confirm_alternated``) the
same number of standard deviations of the change between the two sides' runs: no same-commit
failure in 2,000 simulated pairs, a 10% slowdown caught 73% of the time (one base run, two
re-measurements a side)."""

CONFIRM_RUNS = 2
"""``gpubench compare --confirm-runs``: how many times the flagged cases are re-measured."""

CONFIRM_EXTRA_PAIRS = 2
"""``gpubench compare --confirm`` against the base code: a case confirmed after the
re-measurement runs gets up to this many more pairs of runs (base, new), one at a time, and
stays confirmed only if each pair keeps it so. A case whose level jumps between two values
from one process to the next is confirmed by chance when every base run lands low and every new
run high: 1 in 16 with two runs a side, 1 in 64 with three, 1 in 256 with four; a real
slowdown stays confirmed (about a minute a pair)."""

COMPARE_BASES = ("auto", "raw", "normalized")
"""``gpubench compare --basis``: what a case's round times are compared as
(``analysis.compare.BASES`` says how)."""

MIN_NOISE_CASES = 8
"""``gpubench compare``: fewest compared cases from which a between-run spread is estimated."""

PRIOR_RUNS = 1
"""``gpubench compare``: a case's own spread between runs (where two runs of one side give one)
is shrunk towards the spread across cases as if that were this many degrees of freedom
(``stats.moderated_spread``): two base runs alone cannot tell a noisy case from a chance
difference, ten times the typical spread can."""

OWN_SPREAD_ALPHA = 0.01
"""``gpubench compare``: a case is judged by its own spread only where that spread is
significantly larger than the typical case's (``stats.spread_excess_p`` below this): a case like
the others keeps the spread estimated from all of them, and the gate its power."""


def combine_parts(parts: dict[str, str]) -> str:
    """One verdict from the verdicts of a claim's parts (e.g. {"time": ..., "memory": ...}):
    holds if all hold; partly holds (naming them) if some do; does not hold if any part is
    contradicted; smaller than claimed if the rest go the claimed way but not far enough;
    inconclusive when a part is and no part holds or is contradicted: a claim of less time
    *and* less memory is not "smaller than claimed" on the memory part alone while the time
    part could not be decided (the row's why says what each part found)."""
    kinds = set(parts.values())
    if kinds == {Kind.HOLDS}:
        return Kind.HOLDS.value
    if Kind.HOLDS in kinds:
        return "partly holds (" + ", ".join(k for k, v in parts.items() if v == Kind.HOLDS) + ")"
    for kind in (Kind.DOES_NOT_HOLD, Kind.INCONCLUSIVE, Kind.SMALLER):
        if kind in kinds:
            return kind.value
    return Kind.INCONCLUSIVE.value
