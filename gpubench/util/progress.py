"""A live progress line for long cases: the case and its round (``resnet50-bf16: round 3/30``),
drawn by ``tqdm`` on stderr, and only when stderr is a terminal (logs, pipes and tests get
nothing).

``with_progress(benchmark, label)`` wraps the benchmark fixture (pytest-benchmark's, or
``StandaloneBenchmark``) that ``measure`` times rounds with: the line moves in ``pedantic``'s
untimed ``setup`` before each round, so drawing it never lands inside a timed round.
"""

from __future__ import annotations

import sys
from typing import TextIO

BAR_FORMAT = "{desc} [{elapsed}<{remaining}]"


def is_terminal(stream: TextIO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class RoundProgress:
    """``benchmark`` with a progress line over the rounds of its ``pedantic`` calls; every
    other attribute (``extra_info``, ``stats``, ...) is the wrapped benchmark's."""

    def __init__(self, benchmark, label: str, stream: TextIO | None = None):
        self._benchmark = benchmark
        self._label = label
        self._stream = stream

    def __getattr__(self, name: str):
        return getattr(self._benchmark, name)

    def pedantic(self, target, args=(), kwargs=None, setup=None, rounds=1, warmup_rounds=0,
                 **rest):
        stream = self._stream if self._stream is not None else sys.stderr
        if not is_terminal(stream):
            return self._benchmark.pedantic(target, args=args, kwargs=kwargs, setup=setup,
                                            rounds=rounds, warmup_rounds=warmup_rounds, **rest)
        from tqdm import tqdm

        calls = 0
        label = self._label
        with tqdm(total=rounds, desc=f"{label}: starting", file=stream, leave=False, unit="round",
                  bar_format=BAR_FORMAT, dynamic_ncols=True, mininterval=0.0) as bar:

            def show_then_setup():  # untimed: before each (warm-up) round
                nonlocal calls
                calls += 1
                timed = calls - warmup_rounds
                if timed <= 0:
                    bar.set_description_str(f"{label}: warm-up {calls}/{warmup_rounds}")
                else:
                    bar.set_description_str(f"{label}: round {timed}/{rounds}", refresh=False)
                    bar.update(timed - 1 - bar.n)  # rounds finished so far
                return setup() if setup is not None else None

            result = self._benchmark.pedantic(target, args=args, kwargs=kwargs,
                                              setup=show_then_setup, rounds=rounds,
                                              warmup_rounds=warmup_rounds, **rest)
            bar.set_description_str(f"{label}: round {rounds}/{rounds}", refresh=False)
            bar.update(rounds - bar.n)
        return result


def with_progress(benchmark, label: str, stream: TextIO | None = None):
    """``benchmark`` with a live progress line on ``stream`` (default: stderr when used) when
    that is a terminal; off a terminal the rounds run exactly as without it."""
    return RoundProgress(benchmark, label, stream)
