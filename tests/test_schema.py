"""Every record field is documented once (``gpubench.analysis.schema.METRICS``, or a technique's
declaration), and the documented types are the ones a file is checked against."""

from __future__ import annotations

import json
from pathlib import Path

from gpubench.analysis.results import EXTRA_SCHEMA, REQUIRED_FIELDS
from gpubench.analysis.schema import METRICS, TYPES
from gpubench.train.techniques import TECHNIQUES

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = {f for m in METRICS for f in m.fields} | {t.field for t in TECHNIQUES}


def test_each_field_is_documented_once_with_a_known_type():
    names = [f for m in METRICS for f in m.fields]
    assert len(names) == len(set(names)), "a field documented twice"
    assert not set(names) & {t.field for t in TECHNIQUES}
    for m in METRICS:
        assert m.meaning and m.kind in ("step", "claim", "overhead", "transfer", "derived")
        assert all(t is None or t in TYPES.values() for t in m.types().values())
    assert set(REQUIRED_FIELDS) <= DOCUMENTED
    assert set(EXTRA_SCHEMA) <= DOCUMENTED
    assert EXTRA_SCHEMA["step_time_s"] == ("float", ">0")
    assert EXTRA_SCHEMA["check_losses"] == ("floats", "loss")


def test_every_field_of_the_committed_runs_is_documented():
    files = sorted((ROOT / "results").glob("*/*.json"))
    seen = set()
    for path in files:
        data = json.loads(path.read_text())
        for bench in data.get("benchmarks", []) if isinstance(data, dict) else []:
            seen |= set(bench.get("extra_info", {}))
    assert len(seen) > 50, files
    assert seen <= DOCUMENTED, sorted(seen - DOCUMENTED)
