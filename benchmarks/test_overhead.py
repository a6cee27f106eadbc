"""Harness overhead: gpubench's step against a minimal hand-written loop, interleaved in one run.

Both sides train identical copies of the model (same seed) on the same data with the same
optimizer; rounds alternate between them (and which goes first), so machine noise hits both
alike. ``harness_overhead`` = median gpubench step / median hand-written step - 1.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
import torch.nn.functional as F

from gpubench.build import build
from gpubench.cases import baseline
from gpubench.data import SyntheticDataset, build_loader
from gpubench.models import model_size


def handwritten_loop(model: str, profile: str, device: str, seed: int):
    """The loop a user would write by hand, sharing nothing with gpubench but the data."""
    torch.manual_seed(seed)
    wrapped = build(baseline(model, profile, device))  # identical weights and data
    net = wrapped.reference_model.net
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    size = model_size(model, profile)
    dataset = SyntheticDataset(size, wrapped.reference_model.kind, size.micro_batch * 4, seed)
    loader = build_loader(dataset, wrapped.cfg.loader, size.micro_batch, seed)
    dev = torch.device(device)

    def batches():
        while True:
            for x, y in loader:
                yield x.to(dev), y.to(dev)

    it = batches()

    def step():
        x, y = next(it)
        if x.dim() == 4:
            loss = F.cross_entropy(net(x), y)
        else:
            loss = net(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return loss

    return step


@pytest.mark.parametrize("model", ["resnet18", "bert"])
def test_harness_overhead(benchmark, model, options):
    profile = options.profile
    if options.device == "cpu" and profile.startswith("gpu"):
        pytest.skip("GPU profile on the CPU")
    benchmark.group = "harness-overhead"
    case = build(baseline(model, profile, options.device))
    hand = handwritten_loop(model, profile, options.device, seed=0)
    times = {"gpubench": [], "handwritten": []}
    flip = [False]

    def pair():
        order = [("gpubench", case.synced_step), ("handwritten", hand)]
        flip[0] = not flip[0]
        for name, fn in order if flip[0] else order[::-1]:
            start = time.perf_counter()
            loss = fn()
            times[name].append(time.perf_counter() - start)
        return loss

    rounds = max(options.rounds, 20)
    last = benchmark.pedantic(pair, rounds=rounds, warmup_rounds=max(options.warmup, 2))
    assert torch.isfinite(last).item()
    warm = max(options.warmup, 2)
    med = {k: statistics.median(v[warm:]) for k, v in times.items()}
    benchmark.extra_info.update(
        kind="overhead",
        case_id=f"overhead-{model}",
        model=model,
        profile=profile,
        device=options.device,
        gpubench_step_time_s=med["gpubench"],
        handwritten_step_time_s=med["handwritten"],
        harness_overhead=med["gpubench"] / med["handwritten"] - 1,
        note="benchmark time is one gpubench step plus one hand-written step",
    )
