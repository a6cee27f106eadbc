"""FP8 training (the ``fp8`` and ``fp8-rowwise`` precisions: torchao's float8 linears under bf16
autocast, emulated on the CPU): which linears convert, that the recipe trains and the check
catches a broken one, what the record says, and the FP8 claim's verdicts."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
import torch
from test_advice import _row  # the tests folder is on sys.path (pytest's rootdir-less import)

from gpubench.analysis.advice import advise
from gpubench.suite.cases import profile_cases
from gpubench.suite.claims import CLAIMS
from gpubench.train.build import build, unsupported_reason
from gpubench.train.checks import TrainingCheckError, check_case
from gpubench.train.config import RunConfig
from gpubench.train.precision import import_float8

pytest.importorskip("torchao.float8", reason="FP8 training needs torchao (the test extra)")

FP8 = CLAIMS["fp8"].text


def _bert(precision="fp8", layers="all"):
    return RunConfig(model="bert", profile="cpu", precision=precision, fp8_layers=layers)


def test_the_precision_group_has_both_recipes_with_every_eligible_linear_on_the_cpu():
    ids = {c.id for c in profile_cases("cpu", "cpu", ("bert",), ("precision",))}
    assert {"bert-fp8-f8all", "bert-fp8-rowwise-f8all"} <= ids


@pytest.mark.parametrize("precision", ["fp8", "fp8-rowwise"])
def test_an_emulated_recipe_trains_and_says_what_it_converted(precision):
    cfg = _bert(precision)
    assert unsupported_reason(cfg) is None
    with build(cfg) as case:
        result = check_case(case)
        float8 = import_float8().float8_linear.Float8Linear
        converted = [m for m in case.model.modules() if isinstance(m, float8)]
        # The check's FP32 reference is the unconverted model, sharing the trained parameters.
        assert not any(isinstance(m, float8) for m in case.reference_model.modules())
        assert {id(p) for p in case.reference_model.parameters()} == {
            id(p) for p in case.model.parameters()}
        facts = case.facts
    # BERT's 2 layers x 6 linears and the pooler; not the classifier (2 outputs).
    assert len(converted) == len(facts["fp8_converted"]) == 13
    assert facts["fp8_emulated"] is True  # no FP8 units on a CPU
    assert result.grad_cosine > 0.99 and result.losses[-1] < result.losses[0]


def test_a_gradient_left_scaled_fails_the_check(monkeypatch):
    """A broken cast: the output gradient is scaled into float8's range and the scale is then
    forgotten, so every weight gradient comes out multiplied by it."""
    scaling = import_float8().float8_scaling_utils
    role = import_float8().float8_training_tensor.GemmInputRole
    real = scaling.hp_tensor_and_scale_to_float8

    def forgetful(hp, scale, dtype, mm_config=None, gemm_role=role.INPUT, *args, **kwargs):
        out = real(hp, scale, dtype, mm_config, gemm_role, *args, **kwargs)
        if gemm_role == role.GRAD_OUTPUT:
            out._scale = torch.ones_like(out._scale)
        return out

    monkeypatch.setattr(scaling, "hp_tensor_and_scale_to_float8", forgetful)
    with build(_bert()) as case, pytest.raises(TrainingCheckError,
                                               match="gradient differs from plain FP32"):
        check_case(case)


def test_cases_without_a_convertible_linear_skip_with_the_reason():
    # ResNet-18's one linear has 1000 outputs (not a multiple of 16); torchao's own filter
    # keeps no linear of a 128-wide BERT (its thresholds start at thousands of features).
    resnet = unsupported_reason(RunConfig(model="resnet18", profile="cpu", precision="fp8",
                                          fp8_layers="all"))
    assert resnet == ("fp8: none of resnet18's 1 nn.Linear layers passes the fp8_layers 'all' "
                      "filter (dimensions multiples of 16)")
    auto = unsupported_reason(_bert("fp8-rowwise", "auto"))
    assert "torchao's thresholds" in auto and "try fp8_layers 'all'" in auto


def test_fp8_runs_on_one_device_and_needs_torchao(monkeypatch):
    ddp = RunConfig(model="bert", profile="cpu", precision="fp8", fp8_layers="all",
                    parallel="ddp", world_size=2)
    assert "run on one device" in unsupported_reason(ddp)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails as if absent
    assert "pip install 'gpubench[fp8]'" in unsupported_reason(_bert())


@pytest.mark.parametrize("emulated, fp8_median, expected", [
    (True, 0.5, "not testable here"), (False, 0.7, "holds"), (False, 1.1, "does not hold")])
def test_the_fp8_claim_against_bf16(emulated, fp8_median, expected):
    # On CUDA both sides compiled (as torchao measures it); the eager pair is not the claim's.
    fp8 = {"fp8_layers": "auto", "fp8_emulated": emulated, "fp8_converted": ["a", "b"],
           "device": "cuda", "group": "compile", "compile": True}
    rows = [_row("bert-fp32", 1.0, device="cuda", fp8_layers="auto"),
            _row("bert-bf16", 0.5, precision="bf16", device="cuda", fp8_layers="auto"),
            _row("bert-fp8", 1.5, precision="fp8", **{**fp8, "compile": False}),
            _row("bert-bf16-compile", 1.0, precision="bf16", device="cuda", fp8_layers="auto",
                 compile=True),
            _row("bert-fp8-compile", fp8_median, precision="fp8", **fp8),
            _row("bert-fp8-rowwise-compile", fp8_median, precision="fp8-rowwise", **fp8)]
    verdicts = {v.claim: v for v in advise(pd.DataFrame(rows)) if v.claim.startswith(FP8)}
    assert set(verdicts) == {f"{FP8} (fp8)", f"{FP8} (fp8-rowwise)"}
    for v in verdicts.values():
        assert v.verdict == expected, v
        assert "2 linears converted (auto filter)" in v.why


def test_on_cuda_fp8_is_compiled_beside_compiled_bf16():
    from gpubench.suite.cases import profile_cases

    ids = {c.id for c in profile_cases("gpu-small", "cuda", ("bert",), ("compile",))}
    assert {"bert-bf16-compile", "bert-fp8-compile", "bert-fp8-rowwise-compile"} <= ids, ids
    claim = CLAIMS["fp8"]
    cuda = RunConfig(model="bert", profile="gpu-small", device="cuda")
    assert claim.config("new", cuda).compile and claim.config("base", cuda).compile


def test_the_summary_states_an_fp8_mfu_against_both_peaks():
    from gpubench.report.summary import _mfu_shown

    assert _mfu_shown(0.40, [], 0.40, 0.21) == "40.0% of bf16 peak, 21.0% of FP8's"
    assert _mfu_shown(0.40, [], 0.40, None) == 0.40  # emulated: no FP8 peak to state
