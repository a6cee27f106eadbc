"""The cost of gpubench's process management: a no-op command round trip to every rank."""

from __future__ import annotations

import statistics

from gpubench.launchers.distributed import NoopProgram
from gpubench.launchers.workers import WorkerGroup


def test_worker_round_trip(benchmark, options):
    benchmark.group = "harness-overhead"
    with WorkerGroup(2, NoopProgram, timeout_s=options.timeout_s) as group:
        benchmark.pedantic(group.call, args=("noop",), rounds=200, warmup_rounds=10)
    rounds = benchmark.stats.stats.data
    benchmark.extra_info.update(
        kind="overhead",
        case_id="overhead-workers2",
        world_size=2,
        process_overhead_s=statistics.median(rounds),
        note="median time to send a no-op command to 2 worker processes and collect both "
        "replies: the per-step cost multi-process cases pay on top of the step itself",
    )
