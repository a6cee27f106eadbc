"""Harness overhead: gpubench's step against a minimal hand-written loop, interleaved in one run.

Both sides train identical copies of the model (same seed) on the same data with the same
optimizer; rounds alternate between them (and which goes first), so machine noise hits both
alike. ``harness_overhead`` = the median over the pairs of gpubench step / hand-written step - 1.

Like with like: the baseline's batches are device-resident (made once, placed on the device
once, reused every step: no collation or host-to-device copy in a round), so the hand-written
loop also places its batches once and cycles them; otherwise on CUDA it would pay a copy of
each batch that gpubench's step does not, and the overhead would read negative.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time

import pytest
import torch

from gpubench.measure.memory import release_free_memory
from gpubench.suite.cases import baseline
from gpubench.train.build import build
from gpubench.train.data import Placement, resident_batches
from gpubench.util.stats import compare_paired
from gpubench.workloads.api import call_model

OVERHEAD_PAIRS_S = 4.0
"""Seconds of timed pairs a fast step's overhead figure is read from (at most 100 pairs)."""

OVERHEAD_BUILDS = 4
"""Builds of each side the pairs take turns on (pair i steps build i mod 4 of both; fewer where
the device runs out of memory, ``overhead_builds``). Two builds
of the same model in one process step about 1% apart on a 2-core CPU for their whole lives
(where their tensors landed: ``scripts/overhead_floor.py``), as far as gpubench reads from the
hand-written loop; the figure over one build of each side carries that luck, over four builds
of each about half of it."""


def handwritten_loop(cfg):
    """The loop a user would write by hand, sharing nothing with gpubench but the model and
    the data (identical weights and samples)."""
    case = build(cfg)
    net = case.reference_model.net
    workload = case.workload
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    dev = torch.device(cfg.device)
    # The baseline's data path (``LoaderConfig.dataset`` "device-resident"): one optimizer
    # step of batches placed on the device once and reused: the very samples the case steps
    # on (``resident_batches``, the same seeds), so the two sides differ in the step only.
    assert cfg.loader.dataset == "device-resident", cfg.loader
    it = itertools.cycle(resident_batches(
        workload, cfg.resolved_micro_batch, cfg.accum_steps, cfg.seed,
        Placement(dev, non_blocking=False, channels_last=False)))
    return plain_step(net, workload.loss_fn, opt, it, dev)


def plain_step(net, loss_fn, opt, batches, dev):
    """The hand-written step: the next batch, forward, loss, backward, optimizer step; the
    loss returned detached."""

    def step():
        x, y = next(batches)
        if loss_fn is None:
            loss = call_model(net, x, y)
        else:
            loss = loss_fn(call_model(net, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        # Detached, as gpubench's step returns its loss: the graph is freed here, inside this
        # step's time. Returned with its graph, it was freed when the next result replaced it:
        # in the pairs where this step went first, inside gpubench's timed step (bert: about
        # 0.06 ms of 20).
        return loss.detach()

    return step


def overhead_builds(cfg) -> tuple[list, list]:
    """Up to ``OVERHEAD_BUILDS`` builds of each side (gpubench's case, the hand-written loop),
    each stepped once; as many as fit where the device runs out of memory (a large model on
    one GPU: one build of each side at least, or the error)."""
    cases, hands = [], []
    for _ in range(OVERHEAD_BUILDS):
        case = hand = None
        try:
            # Which side is built (and allocates its gradients and optimizer state) first
            # alternates over the builds: the first takes the heap's holes, the second fresh
            # pages, and neither side should always get the same.
            if len(cases) % 2:
                hand = handwritten_loop(cfg)
                case = build(cfg)
                hand()
                case.synced_step()
            else:
                case = build(cfg)
                hand = handwritten_loop(cfg)
                case.synced_step()  # its first step allocates gradients and optimizer state
                hand()
        except torch.OutOfMemoryError:
            if not cases:
                raise
            if case is not None:
                case.close()
            del case, hand
            release_free_memory()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # what the failed build cached, back to the driver
            break
        cases.append(case)
        hands.append(hand)
    return cases, hands


def pytest_generate_tests(metafunc):
    if "overhead_model" in metafunc.fixturenames:
        opts = metafunc.config.gpubench  # honours --gpubench-models
        metafunc.parametrize("overhead_model", opts.models[:2], ids=opts.model_names[:2])


def test_harness_overhead(benchmark, overhead_model, options):
    profile = options.profile
    if options.device == "cpu" and profile.startswith("gpu"):
        pytest.skip("GPU profile on the CPU")
    benchmark.group = "harness-overhead"
    cfg = baseline(overhead_model, profile, options.device)
    cases, hands = overhead_builds(cfg)
    builds = len(cases)
    times = {"gpubench": [], "handwritten": []}
    turn = [0]

    def pair():
        i = turn[0]
        turn[0] += 1
        order = [("gpubench", cases[i % builds].synced_step), ("handwritten", hands[i % builds])]
        # which side goes first alternates over each build's pairs too
        for name, fn in order if (i // builds) % 2 else order[::-1]:
            start = time.perf_counter()
            loss = fn()
            times[name].append(time.perf_counter() - start)
        return loss

    # Each build warmed up (untimed by pytest-benchmark, and left out of the figures).
    warm = max(options.warmup, 2) * builds
    for _ in range(warm):
        pair()
    # At least 20 pairs; where the run asks for an interval's width (not a fixed count of
    # rounds: --rounds, the smoke profile), more for a fast step until the pairs take about
    # OVERHEAD_PAIRS_S (at most 100): the figure is a ratio of steps a few per cent noisy,
    # read to 1%.
    pair_s = sum(v[-1] for v in times.values())
    seconds = OVERHEAD_PAIRS_S if options.target_width else 0.0
    rounds = max(options.rounds, 20, min(100, math.ceil(seconds / max(pair_s, 1e-9))))
    rounds = math.ceil(rounds / builds) * builds  # as many pairs per build
    last = benchmark.pedantic(pair, rounds=rounds)
    for case in cases:
        case.close()
    assert torch.isfinite(last).item()
    med = {k: statistics.median(v[warm:]) for k, v in times.items()}
    # Paired, as the speedups are: the median of each pair's ratio, which machine drift slower
    # than a pair leaves alone, with its interval over this run's pairs (one pair's ratio
    # spreads several per cent on a shared CPU; builds and processes add about 1% more).
    overhead = compare_paired(times["gpubench"][warm:], times["handwritten"][warm:])
    benchmark.extra_info.update(
        kind="overhead",
        case_id=f"overhead-{cfg.name}",
        model=cfg.name,
        workload=cfg.model,
        profile=profile,
        device=options.device,
        gpubench_step_time_s=med["gpubench"],
        handwritten_step_time_s=med["handwritten"],
        harness_overhead=overhead.ratio - 1,
        harness_overhead_low=overhead.low - 1,
        harness_overhead_high=overhead.high - 1,
        overhead_pairs=len(times["gpubench"]) - warm,
        overhead_builds=builds,
        note="benchmark time is one gpubench step plus one hand-written step; "
        "harness_overhead = median over the pairs of gpubench step / hand-written step - 1",
    )


def test_telemetry_overhead(benchmark, overhead_model, options):
    """What the telemetry sampler (``gpubench.measure.telemetry``) costs a step: the same case's
    steps with the sampling thread sampling and paused, in alternating rounds of one run."""
    from gpubench.measure.telemetry import PERIOD_S, sampling_cost

    profile = options.profile
    if options.device == "cpu" and profile.startswith("gpu"):
        pytest.skip("GPU profile on the CPU")
    benchmark.group = "harness-overhead"
    cfg = baseline(overhead_model, profile, options.device)
    case = build(cfg)
    for _ in range(max(options.warmup, 2)):
        case.synced_step()
    rounds = max(options.rounds, 20)
    cost = benchmark.pedantic(sampling_cost, args=(case.synced_step, rounds, options.device),
                              rounds=1, iterations=1)
    case.close()
    benchmark.extra_info.update(
        kind="overhead",
        case_id=f"telemetry-{cfg.name}",
        model=cfg.name,
        workload=cfg.model,
        profile=profile,
        device=options.device,
        telemetry_period_s=PERIOD_S,
        **{k: v for k, v in cost.items() if k.startswith("telemetry_")},
        note="benchmark time is the whole alternating run; telemetry_overhead = total step "
        "time sampling / total step time not sampling - 1",
    )
