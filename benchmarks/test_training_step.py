"""Every case of the profile: each technique of the step against the model's FP32 baseline."""

from __future__ import annotations

import pytest

from gpubench.measure.runner import run_case
from gpubench.suite.cases import case_timeout
from gpubench.train.build import Unsupported


def test_step(benchmark, bench_case, options):
    if bench_case.slow and not options.slow:
        pytest.skip("slow case (torch.compile): pass --gpubench-slow to run it")
    cfg = bench_case.cfg
    benchmark.group = f"{cfg.name}-{cfg.profile}-{cfg.device}"
    benchmark.extra_info["group"] = bench_case.group
    reason = bench_case.skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        run_case(benchmark, cfg, rounds=options.rounds, warmup_rounds=options.warmup,
                 timeout_s=case_timeout(cfg, options.timeout_s), max_time_s=options.max_time_s,
                 baseline=options.paired_baseline(cfg), trace_dir=options.trace_dir,
                 ranks=options.ranks, min_time_s=options.min_time_s,
                 energy_block_s=options.energy_block_s, target_width=options.target_width)
    except Unsupported as why:
        pytest.skip(str(why))
