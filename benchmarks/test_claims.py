"""The claims group: each advice claim's baseline and technique, timed in alternating rounds."""

from __future__ import annotations

import pytest

from gpubench.suite.claims import claim_pairs, measure_pair
from gpubench.train.build import Unsupported

CLAIM_MODELS = 2
"""The first two chosen workloads get claim pairs (by default an image and a token model);
a time budget."""


def _pairs(config):
    opts = config.gpubench
    return [p for m in opts.models[:CLAIM_MODELS]
            for p in claim_pairs(m, opts.profile, opts.device)]


def pytest_generate_tests(metafunc):
    if "pair_id" in metafunc.fixturenames:
        pairs = {p.id: p for p in _pairs(metafunc.config)}
        metafunc.config.gpubench.pairs = pairs
        metafunc.parametrize("pair_id", list(pairs))  # readable string params in the JSON


def test_claim(benchmark, pair_id, options):
    pair = options.pairs[pair_id]
    benchmark.group = "claims"
    try:
        measure_pair(benchmark, pair, rounds=max(options.rounds, 10),
                     warmup_rounds=max(options.warmup, 1), timeout_s=options.timeout_s)
    except Unsupported as why:
        pytest.skip(str(why))
