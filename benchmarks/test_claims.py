"""The claims group: each advice claim's baseline and technique, timed in alternating rounds."""

from __future__ import annotations

import pytest

from gpubench.build import Unsupported
from gpubench.claims import claim_pairs, measure_pair
from gpubench.config import IMAGE_MODELS

CLAIM_MODELS = 2
"""The profile's first models get claim pairs (an image and a token model); time budget."""


def _pairs(config):
    opts = config.gpubench
    models = [m for m in opts.models][:CLAIM_MODELS]
    if not any(m in IMAGE_MODELS for m in models):
        models = models[:1]
    return [p for m in models for p in claim_pairs(m, opts.profile, opts.device)]


def pytest_generate_tests(metafunc):
    if "pair" in metafunc.fixturenames:
        pairs = _pairs(metafunc.config)
        metafunc.parametrize("pair", pairs, ids=[p.id for p in pairs])


def test_claim(benchmark, pair, options):
    benchmark.group = "claims"
    try:
        measure_pair(benchmark, pair, rounds=max(options.rounds, 10),
                     warmup_rounds=max(options.warmup, 1))
    except Unsupported as why:
        pytest.skip(str(why))
