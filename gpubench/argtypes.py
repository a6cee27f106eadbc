"""argparse types for bounded numbers: a bad value is argparse's one-line error (exit 2) naming
the value and what was expected."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def bounded(cast: Callable[[str], float], *, low: float | None = None,
            high: float | None = None, open_low: bool = False,
            open_high: bool = False) -> Callable[[str], float]:
    """A parser of ``cast(text)`` that must be finite and within [low, high] (``open_low`` /
    ``open_high``: the bound itself excluded)."""
    kind = "an integer" if cast is int else "a number"
    parts = []
    if low is not None:
        parts.append(f"{'>' if open_low else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if open_high else '<='} {high:g}")
    expected = f"{kind} {' and '.join(parts)}".strip()

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        too_low = low is not None and (value <= low if open_low else value < low)
        too_high = high is not None and (value >= high if open_high else value > high)
        if not math.isfinite(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    parse.__name__ = expected  # argparse names the type in some messages
    return parse


positive_int = bounded(int, low=1)
non_negative_int = bounded(int, low=0)
non_negative = bounded(float, low=0)
positive = bounded(float, low=0, open_low=True)
