"""The recipe group (S1's stacked case study): its cases, and the verdict that compares a stack
with its best ingredient and with the product of its ingredients' speedups."""

from __future__ import annotations

import pandas as pd
import pytest
from test_advice import _row as _noisy_row

from gpubench.analysis.advice import advise
from gpubench.analysis.recommend import recommend
from gpubench.suite.cases import (
    RECIPE_ACCUM_STEPS,
    baseline,
    knob_workers,
    profile_cases,
    recipe_cases,
    recipe_precision,
)
from gpubench.suite.claims import CLAIMS

CLAIM = CLAIMS["recipe"].text


def _row(case_id, median, **extra):
    """``test_advice``'s record with little round-to-round noise: the figures asserted here
    (interaction x1.0, x2.0) hold whatever rounds its shared generator draws."""
    return _noisy_row(case_id, median, noise=0.001, **extra)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_stack_is_what_a_reader_of_s1_builds(device):
    base = baseline("resnet18", "cpu", device)
    ddp, single = recipe_cases(base)  # DDP first: it runs in the parallel group's ranks
    assert single.precision == recipe_precision(device)
    assert single.accum_steps == RECIPE_ACCUM_STEPS
    assert single.resolved_micro_batch == base.resolved_micro_batch  # "a larger batch"
    assert single.loader.dataset == base.workload.dataset_names[0]
    assert single.loader.num_workers == knob_workers(device)
    assert single.loader.pin_memory == single.loader.non_blocking == (device == "cuda")
    assert ddp == single.with_(parallel="ddp", world_size=2, ddp_no_sync=True)
    if device == "cuda":
        assert single.precision == "bf16"


def test_every_ingredient_is_a_case_of_its_own_group():
    cases = {c.id: c for c in profile_cases("gpu-small", "cuda", ("resnet50",))}
    ddp, single = (c.cfg for c in cases.values() if c.group == "recipe")
    base = baseline("resnet50", "gpu-small", "cuda")
    for ingredient in (base.with_(precision=single.precision),
                       base.with_(accum_steps=RECIPE_ACCUM_STEPS),
                       base.with_(loader=single.loader),
                       base.with_(parallel="ddp", world_size=2)):
        assert ingredient.id in cases, ingredient.id
    # The cpu profile stacks on resnet18 only (its loader is swept there).
    groups = {(c.cfg.model, c.group) for c in profile_cases("cpu", "cpu")}
    assert ("resnet18", "recipe") in groups and ("bert", "recipe") not in groups


def _stack_rows(stack_time: float, *, ddp_time: float | None = None, device="cpu"):
    """bert at global batch 8: bf16 1.25x, accumulation k=4 at micro-batch 8 (32 samples per
    step) as fast per sample, the loader at 2 workers 0.8x, and the stack."""
    files = {"dataset": "tokens", "num_workers": 2, "group": "loader"}
    rows = [_row("bert-fp32", 1.0), _row("bert-bf16", 0.8, precision="bf16"),
            _row("bert-fp32-accum4", 4.0, accum_steps=4, global_batch=32, micro_batch=8,
                 group="accumulation"),
            _row("bert-fp32-tokens-w2", 1.25, **files),
            _row("bert-fp32-ddp2", 1.0, parallel="ddp", world_size=2, global_batch=16,
                 group="parallel"),
            _row("bert-bf16-accum4-tokens-w2", stack_time, precision="bf16", accum_steps=4,
                 global_batch=32, micro_batch=8, **{**files, "group": "recipe"})]
    if ddp_time is not None:
        rows.append(_row("bert-bf16-accum4-ddp2-nosync-tokens-w2", ddp_time, precision="bf16",
                         accum_steps=4, global_batch=64, micro_batch=8, parallel="ddp",
                         world_size=2, ddp_no_sync=True, **{**files, "group": "recipe"}))
    for r in rows:
        r["device"] = device
    return rows


def _recipe_verdict(rows):
    (v,) = [v for v in advise(pd.DataFrame(rows)) if v.claim == CLAIM]
    return v


def test_a_stack_that_multiplies_its_ingredients():
    # 1.25 x 1.0 x 0.8 = 1.0: a stack at 32 samples per 4 s is x1.00 per sample.
    v = _recipe_verdict(_stack_rows(4.0))
    assert "interaction x1.0" in v.measured
    assert "precision x1.25" in v.measured and "loader x0.80" in v.measured
    # Its best ingredient (bf16, x1.25) is faster than the stack: no gain from stacking.
    assert v.verdict == "does not hold"
    assert "changes the training recipe" in v.why


def test_a_stack_beyond_its_best_ingredient_holds_and_is_named_in_the_recommendation():
    v = _recipe_verdict(_stack_rows(2.0))  # x2.0 per sample: interaction x2.0
    assert v.verdict == "holds" and "interaction x2.0" in v.measured
    (rec,) = recommend(pd.DataFrame(_stack_rows(2.0)))
    # The stack trains 32 samples per step: a faster recipe change is named, not recommended.
    assert rec.case_id == "bert-bf16" and "bert-bf16-accum4-tokens-w2" in rec.note


def test_the_ddp_stack_is_judged_on_gpus_only():
    cpu = _recipe_verdict(_stack_rows(2.0, ddp_time=2.0))
    assert "not judged on the CPU" in cpu.why and cpu.verdict == "holds"
    cuda = _recipe_verdict(_stack_rows(2.0, ddp_time=4.0, device="cuda"))
    assert cuda.verdict == "partly holds (single)"  # DDP: x1.00 of the one-GPU stack
    assert "over DDP" in cuda.measured


def test_no_recipe_cases_not_measured():
    v = _recipe_verdict([_row("bert-fp32", 1.0)])
    assert v.verdict == "inconclusive" and "not measured" in v.why


def test_the_workers_verdict_compares_loader_cases_not_the_stack():
    rows = _stack_rows(0.5)  # the stack: by far the most samples/s
    rows.append(_row("bert-fp32-tokens", 1.5, dataset="tokens", num_workers=0, group="loader"))
    for r in rows:
        r["loader_stall_fraction"] = 0.1
    (v,) = [v for v in advise(pd.DataFrame(rows)) if v.claim == CLAIMS["loader-workers"].text]
    assert "best: bert-fp32-tokens-w2" in v.why


def test_a_recommendation_is_confirmed_against_fp32_with_every_step_technique_off():
    from gpubench.analysis.recommend import confirm_baseline
    from gpubench.train.config import LoaderConfig, RunConfig

    loader = LoaderConfig(dataset="images-jpeg", num_workers=2)
    stack = RunConfig(model="resnet18", precision="bf16", accum_steps=4, offload=True,
                      optimizer="adamw", channels_last=True, parallel="ddp", world_size=2,
                      ddp_no_sync=True, loader=loader)
    base = confirm_baseline(stack)
    assert base == RunConfig(model="resnet18", parallel="ddp", world_size=2, ddp_no_sync=True,
                             loader=loader)
    single = RunConfig(model="bert", attention="flash", compile=True,
                       compile_mode="max-autotune-no-cudagraphs")
    assert confirm_baseline(single) == single.baseline
