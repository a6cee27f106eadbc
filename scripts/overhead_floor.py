"""The floor of the harness-overhead reading: gpubench's step, a second gpubench build of the same
model, the hand-written loop of ``benchmarks/test_overhead.py`` and the same loop written over
gpubench's own model, optimizer and batch tensors ("same objects": no build apart, only the step
code differs), stepped in alternation in one process (order reversed every other round). Where
two builds of one model read as far apart as gpubench reads from the hand-written loop, the
overhead figure is at the machine's resolution; gpubench over the same-objects loop is the step
code's own cost, with the 95% interval of its median (a bootstrap over the rounds).

    python scripts/overhead_floor.py [MODEL] [ROUNDS]      (default bert 60)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from test_overhead import handwritten_loop, plain_step  # noqa: E402

from gpubench.measure.memory import steady_malloc  # noqa: E402
from gpubench.suite.cases import baseline  # noqa: E402
from gpubench.train.build import build  # noqa: E402


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "bert"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    steady_malloc()  # as in a benchmark process
    torch.set_num_threads(2)
    cfg = baseline(model, "cpu", "cpu")
    case = build(cfg)
    sides = {"gpubench": case.synced_step, "hand": handwritten_loop(cfg),
             "gpubench2": build(cfg).synced_step, "same": same_objects_loop(case)}
    for _ in range(5):
        for step in sides.values():
            step()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(rounds):
        order = list(sides.items())
        for name, step in (order[::-1] if i % 2 else order):
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)

    def apart(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True)) - 1

    from gpubench.util.stats import paired_ratio_ci

    low, high = paired_ratio_ci(times["gpubench"], times["same"])
    print(f"{model}: gpubench over hand-written {apart('gpubench', 'hand'):+.2%}; a second "
          f"build over hand-written {apart('gpubench2', 'hand'):+.2%}; the two builds "
          f"{apart('gpubench', 'gpubench2'):+.2%} apart; gpubench over the same objects' loop "
          f"{apart('gpubench', 'same'):+.2%} (95% {low - 1:+.2%}..{high - 1:+.2%}); "
          f"hand-written step {statistics.median(times['hand']) * 1e3:.2f} ms")


def same_objects_loop(case):
    """The hand-written step over ``case``'s own model, optimizer and batch tensors (a single
    device case): it trains the case's model on, one plain step at a time."""
    import itertools

    return plain_step(case.model.net, case.workload.loss_fn, case.optimizer,
                      itertools.cycle(case.fixed_batches()), case.device)


if __name__ == "__main__":
    main()
