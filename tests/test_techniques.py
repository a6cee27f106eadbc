"""Every technique declared once (gpubench.train.techniques): each config field is declared, and
validation, case ids, the count key, the baseline lookup and record types follow from it."""

from __future__ import annotations

from dataclasses import fields

import pytest

from gpubench.analysis.advice import BASELINE_FIELDS
from gpubench.analysis.results import EXTRA_SCHEMA
from gpubench.measure.protocol import count_key
from gpubench.train.config import LoaderConfig, RunConfig, inert_techniques
from gpubench.train.techniques import BY_FIELD, TECHNIQUES, column_type

NOT_TECHNIQUES = {"model", "profile", "device", "seed", "loader"}


def test_every_config_field_is_declared_once():
    names = [t.field for t in TECHNIQUES]
    assert len(names) == len(set(names))
    run = {f.name for f in fields(RunConfig)} - NOT_TECHNIQUES
    loader = {f.name for f in fields(LoaderConfig)}
    assert {t.field for t in TECHNIQUES if not t.loader} == run
    assert {t.field for t in TECHNIQUES if t.loader} == loader


def test_the_record_types_and_the_baseline_come_from_the_declarations():
    for t in TECHNIQUES:
        assert EXTRA_SCHEMA[t.field] == column_type(t), t.field
    defaults = {**{f.name: f.default for f in fields(RunConfig)},
                **{f.name: f.default for f in fields(LoaderConfig)}}
    assert BASELINE_FIELDS == {t.field: defaults[t.field] for t in TECHNIQUES if t.matched}
    assert "micro_batch" not in BASELINE_FIELDS and BASELINE_FIELDS["precision"] == "fp32"


@pytest.mark.parametrize("changes, part", [
    ({"checkpointing": True}, "ckpt"), ({"zero_grad_set_to_none": False}, "zerofill"),
    ({"accum_steps": 4}, "accum4"), ({"optimizer_impl": "fused"}, "sgd_fused"),
    ({"optimizer": "adamw", "optimizer_impl": "foreach"}, "adamw_foreach"),
    ({"parallel": "ddp", "world_size": 2}, "ddp2"),
    ({"loader": LoaderConfig(dataset="synthetic", num_workers=2, pin_memory=True)},
     "synthetic-w2-pin"),
])
def test_case_ids_are_the_tags_of_what_differs_from_the_baseline(changes, part):
    cfg = RunConfig(model="bert", profile="smoke", **changes)
    assert cfg.id == f"bert-fp32-{part}"
    assert RunConfig(model="bert", profile="smoke").id == "bert-fp32"


@pytest.mark.parametrize("field, bad, says", [
    ("checkpointing", "yes", "checkpointing must be True or False; got 'yes'"),
    ("precision", "fp4", "precision must be one of fp32, tf32, fp16, bf16, fp8, fp8-rowwise; "
                     "got 'fp4'"),
    ("accum_steps", 0, "accum_steps must be a positive integer; got 0"),
    ("schedule", "zb", "schedule must be one of gpipe, 1f1b; got 'zb'"),
])
def test_a_bad_value_is_one_line_naming_the_valid_ones(field, bad, says):
    with pytest.raises(ValueError, match="^" + says.replace("(", r"\(") + "$"):
        RunConfig(model="bert", profile="smoke", **{field: bad})
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0; got -1"):
        LoaderConfig(dataset="synthetic", num_workers=-1)


def test_only_counted_techniques_change_the_count_key():
    base = RunConfig(model="bert", profile="smoke")
    for changes in ({"optimizer": "adamw"}, {"zero_grad_set_to_none": False},
                    {"empty_cache": True}, {"precision": "tf32"},
                    {"loader": LoaderConfig(dataset="synthetic", num_workers=2)}):
        same = base.with_(**changes)
        expected = base.with_(loader=LoaderConfig(dataset="synthetic")) \
            if "loader" in changes else base
        assert count_key(same, 0) == count_key(expected, 0), changes
    for changes in ({"checkpointing": True}, {"precision": "bf16"}, {"accum_steps": 2}):
        assert count_key(base.with_(**changes), 0) != count_key(base, 0), changes
    assert not BY_FIELD["optimizer"].counted and BY_FIELD["checkpointing"].counted


def test_inert_techniques_read_records_with_missing_values():
    assert inert_techniques({"device": "cpu", "precision": "tf32", "pin_memory": True}) == [
        "tf32 (TF32 exists only on CUDA: identical to fp32)",
        "pin_memory (no accelerator to copy to)"]
    assert inert_techniques({"device": "cpu", "precision": None, "empty_cache": None}) == []
    assert inert_techniques({"device": "cuda", "precision": "tf32"}) == []
