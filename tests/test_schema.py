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
    """Each field of the committed records as they are read (brought to this version by
    ``upgrade``, the one place an older record's fields are renamed)."""
    from gpubench.analysis.results import upgrade

    files = sorted((ROOT / "results").glob("*/*.json"))
    seen = set()
    for path in files:
        data = json.loads(path.read_text())
        for bench in data.get("benchmarks", []) if isinstance(data, dict) else []:
            seen |= set(upgrade(bench.get("extra_info") or {}))
    assert len(seen) > 50, files
    assert seen <= DOCUMENTED, sorted(seen - DOCUMENTED)


def test_records_say_their_version_and_older_ones_are_upgraded_in_one_place(tmp_path):
    from gpubench.analysis.results import load_results, upgrade
    from gpubench.measure.version import SCHEMA_VERSION

    old = {"model": "resnet18", "case_id": "resnet18-fp32-ckpt", "checkpointing": True}
    new = upgrade(old)
    assert new["schema"] == SCHEMA_VERSION and new["kind"] == "step"
    assert new["workload"] == "resnet18" and new["checkpointing"] is True
    assert new["cold"] is False and new["precision"] == "fp32"  # declared since: the default
    assert old == {"model": "resnet18", "case_id": "resnet18-fp32-ckpt", "checkpointing": True}
    current = {"schema": SCHEMA_VERSION, "kind": "claim", "claim": "adamw"}
    assert upgrade(current) is current
    # Version 1's FP8 share was of all counted FLOPs, version 2's of the GEMM FLOPs: zero in
    # both where no float8 matmul ran, another share not convertible without the GEMM FLOPs.
    for share, read in ((0.0, 0.0), (0.3, None)):
        v1 = upgrade({"schema": 1, "kind": "step", "model": "bert", "fp8_flops_fraction": share})
        assert "fp8_flops_fraction" not in v1 and v1["fp8_gemm_flops_fraction"] == read
        assert v1["schema"] == SCHEMA_VERSION
    foreign = upgrade({"anything": 1})  # not a gpubench record: nothing invented for it
    assert "precision" not in foreign and foreign["kind"] == "step"
    # The committed runs (version 0) load as the current version.
    df = load_results(sorted((ROOT / "results" / "cpu").glob("benchmark.json")))
    steps = df[df["kind"] == "step"]
    assert (df["schema"] == SCHEMA_VERSION).all() and steps["workload"].notna().all()


def test_every_writer_stamps_the_version():
    from gpubench.measure.standalone import StandaloneBenchmark
    from gpubench.measure.version import SCHEMA_VERSION

    assert StandaloneBenchmark("x").extra_info == {"schema": SCHEMA_VERSION}
    # The pytest plugin's records: tests/test_cli.py (every record of a real run).
