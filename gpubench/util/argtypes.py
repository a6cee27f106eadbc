"""argparse types for bounded numbers and byte sizes: a bad value is argparse's one-line error
(exit 2) naming the value and what was expected."""

from __future__ import annotations

import argparse
import math
import re
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


def name_list(valid, what: str = "techniques", *, joined: bool = False) -> Callable:
    """argparse type of a comma-separated list of names from ``valid``: the names in order (a
    list, or one comma-joined string with ``joined``); an empty or unknown one is argparse's
    one-line error naming the valid ones, exit 2, nothing run."""
    valid = tuple(valid)

    def parse(text: str):
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names or any(t not in valid for t in names):
            raise argparse.ArgumentTypeError(
                f"{what} must be from {', '.join(valid)}; got {text!r}")
        return ",".join(names) if joined else names

    parse.__name__ = f"{what} list"
    return parse


positive_int = bounded(int, low=1)
non_negative_int = bounded(int, low=0)
non_negative = bounded(float, low=0)
positive = bounded(float, low=0, open_low=True)


BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
    "t": 2**40, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
"""Byte-size suffixes (any case): K, M, G, T and KiB ... TiB are powers of 2 (``8G`` = ``8GiB``
= 8 x 2**30 bytes); KB ... TB are powers of 10 (``8GB`` = 8 x 10**9 bytes)."""

BYTE_SIZE_HELP = ("a byte size: a number with an optional unit, K/M/G/T or KiB/MiB/GiB/TiB "
                  "(powers of 2: 8G = 8GiB = 8 x 2**30 bytes) or KB/MB/GB/TB (powers of 10: "
                  "8GB = 8 x 10**9 bytes)")

_BYTE_SIZE = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(?P<unit>[a-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``8G``, ``8GiB`` (8 x 2**30), ``8GB`` (8 x 10**9), ``1.5 MiB``, ``1000000`` -> bytes;
    ``ValueError`` (one line) for anything else or a size that is not positive."""
    match = _BYTE_SIZE.match(str(text).lower())
    if not match or match["unit"] not in BYTE_UNITS:
        raise ValueError(f"memory size must be {BYTE_SIZE_HELP}; got {text!r}")
    value = float(match["number"]) * BYTE_UNITS[match["unit"]]
    if not math.isfinite(value) or int(value) <= 0:
        raise ValueError(f"memory size must be positive; got {text!r}")
    return int(value)


def byte_size(text: str) -> int:
    """argparse type of a byte size (``parse_bytes``)."""
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


byte_size.__name__ = "byte size"


_DASHED_VALUE = re.compile(r"^-[0-9.]")


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr, exit 2 (no usage block):
    ``gpubench run: error: argument --rounds: expected an integer >= 0; got '-1' (see
    'gpubench run --help')``. Its subcommand parsers are of the same class.

    An option's value that starts with ``-`` and a digit (``--budget -1GiB``, ``--max-time
    -1e3``) is taken as the value, so that the type names it, instead of argparse's "expected
    one argument"."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} "
                     f"(see '{self.prog} --help')\n")

    def parse_known_args(self, args=None, namespace=None):
        import sys

        args = list(sys.argv[1:] if args is None else args)
        takes_value = {opt for action in self._actions if action.nargs is None
                       for opt in action.option_strings}
        joined, i = [], 0
        while i < len(args):
            token = args[i]
            if token == "--":
                joined += args[i:]
                break
            if (token in takes_value and i + 1 < len(args)
                    and _DASHED_VALUE.match(str(args[i + 1]))):
                joined.append(f"{token}={args[i + 1]}")
                i += 2
                continue
            joined.append(token)
            i += 1
        return super().parse_known_args(joined, namespace)
