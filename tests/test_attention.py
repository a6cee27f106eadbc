"""Attention backends (``attention``: ``scaled_dot_product_attention``'s kernel pinned with
``sdpa_kernel``): which workloads have the cases, which kernels run here, that a pinned kernel
really runs and trains, and the flash-attention claim."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from test_advice import _row  # the tests folder is on sys.path (pytest's rootdir-less import)

from gpubench.analysis.advice import advise
from gpubench.suite.cases import profile_cases
from gpubench.suite.claims import CLAIMS
from gpubench.train import implementations
from gpubench.train.build import build, unsupported_reason
from gpubench.train.checks import TrainingCheckError, check_case
from gpubench.train.config import RunConfig
from gpubench.workloads.registry import resolve

FLASH = CLAIMS["flash-attention"].text


def test_the_sdpa_probe_stops_at_the_first_attention_and_no_fallback_hides_it():
    """The probe's forward ends at the first ``scaled_dot_product_attention`` call (what runs
    after it never runs), even inside a forward that falls back on ``except Exception``; a
    forward without one, or one that fails before it, reads False."""
    from torch import nn
    from torch.nn import functional as F

    from gpubench.workloads.api import _calls_sdpa

    ran = []

    class Attends(nn.Module):
        def forward(self, x):
            try:
                y = F.scaled_dot_product_attention(x, x, x)
            except Exception:  # noqa: BLE001 - a model's own fallback
                y = x
            ran.append("after")
            return y

    class Plain(nn.Module):
        def forward(self, x):
            return x * 2

    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("needs its targets")

    x = torch.ones(1, 2, 4, 8)
    assert _calls_sdpa(Attends(), x) and ran == []
    assert not _calls_sdpa(Plain(), x) and not _calls_sdpa(Fails(), x)


def test_attention_cases_only_for_models_that_call_sdpa():
    assert resolve("bert", "smoke").facts.uses_sdpa and resolve("gpt2", "smoke").facts.uses_sdpa
    assert not resolve("resnet18", "smoke").facts.uses_sdpa
    ids = {c.id for c in profile_cases("cpu", "cpu", ("resnet18", "bert"), ("attention",))}
    assert ids == {"bert-fp32-sdpa_math", "bert-fp32-sdpa_flash", "bert-fp32-sdpa_efficient",
                   "bert-fp32-sdpa_cudnn", "bert-bf16-sdpa_flash", "bert-fp32-attn_eager"}
    reason = unsupported_reason(RunConfig(model="resnet18", attention="flash"))
    assert reason == "attention flash: resnet18's forward calls no scaled_dot_product_attention"


def test_on_cuda_the_four_kernels_and_their_claim_are_at_bf16():
    """Flash and cuDNN attention have no fp32 kernel on CUDA: the kernels are compared at bf16
    (the precision group's bf16 case is their default), and the claim's two sides with them."""
    ids = {c.id for c in profile_cases("gpu-small", "cuda", ("bert",), ("attention",))}
    assert {"bert-bf16-sdpa_math", "bert-bf16-sdpa_flash", "bert-bf16-sdpa_efficient",
            "bert-bf16-sdpa_cudnn"} <= ids
    assert not any(i.startswith("bert-fp32-sdpa_") for i in ids)
    claim = CLAIMS["flash-attention"]
    cuda = RunConfig(model="bert", profile="gpu-small", device="cuda")
    assert claim.config("new", cuda).id == "bert-bf16-sdpa_flash"
    assert claim.config("base", cuda).id == "bert-bf16-sdpa_math"
    cpu = RunConfig(model="bert", profile="cpu")
    assert claim.config("new", cpu).id == "bert-fp32-sdpa_flash"


def test_the_cpu_runs_the_flash_and_math_kernels_only():
    base = RunConfig(model="bert", profile="smoke")
    for backend in ("flash", "math"):
        assert unsupported_reason(base.with_(attention=backend)) is None
    for backend in ("efficient", "cudnn"):
        reason = unsupported_reason(base.with_(attention=backend))
        assert reason.startswith(f"attention {backend} has no kernel for fp32 on cpu: ")


@pytest.mark.parametrize("backend, op", [("flash", "_scaled_dot_product_flash_attention"),
                                         ("math", "_softmax")])
def test_a_pinned_kernel_runs_and_trains(backend, op):
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.__name__)
            return func(*args, **(kwargs or {}))

    with build(RunConfig(model="bert", profile="smoke", attention=backend)) as case:
        check_case(case)
        with Ops():
            case.step()
    assert any(op in name for name in seen), sorted(seen)
    if backend == "math":
        assert not any("flash" in name for name in seen)


def test_a_kernel_that_computes_wrong_attention_fails_the_check(monkeypatch):
    """A broken backend: each position attends to itself only (its value, unmixed)."""
    real = torch.nn.functional.scaled_dot_product_attention

    def wrong(q, k, v, *args, **kwargs):
        return v * (1 + 0 * q.sum())  # the values, still a function of q for autograd

    class _Patched:
        def __init__(self, fn):
            self.fn = fn

        def __enter__(self):
            torch.nn.functional.scaled_dot_product_attention = self.fn

        def __exit__(self, *exc):
            torch.nn.functional.scaled_dot_product_attention = real

    monkeypatch.setattr(implementations.AttentionBackend, "forward",
                        lambda self: _Patched(wrong))
    # At the cpu profile's shape: smoke's 1 layer of 32 features barely feels its attention.
    with build(RunConfig(model="bert", profile="cpu", attention="flash")) as case, \
            pytest.raises(TrainingCheckError, match="gradient differs from plain FP32"):
        check_case(case)


@pytest.mark.parametrize("flash_median, flash_act, expected", [
    (0.8, 200, "holds"), (1.0, 200, "partly holds (memory)"), (0.8, 500, "partly holds (time)")])
def test_the_flash_attention_claim(flash_median, flash_act, expected):
    rows = [_row("bert-fp32", 1.0, attention="default", noise=0.002),
            _row("bert-fp32-sdpa_math", 1.0, attention="math", noise=0.002, group="attention"),
            _row("bert-fp32-sdpa_flash", flash_median, attention="flash", noise=0.002,
                 group="attention", activation_bytes=flash_act)]
    (v,) = [v for v in advise(pd.DataFrame(rows)) if v.claim == FLASH]
    assert v.verdict == expected, v


def test_the_flash_attention_claim_does_not_apply_without_attention():
    rows = [_row("bert-fp32", 1.0, uses_sdpa=False)]
    (v,) = [v for v in advise(pd.DataFrame(rows)) if v.claim == FLASH]
    assert v.verdict == "not applicable"


def test_transformers_models_get_an_eager_attention_case_others_none():
    ids = {c.id for c in profile_cases("cpu", "cpu", ("bert", "resnet18"), ("attention",))}
    assert "bert-fp32-attn_eager" in ids  # bert's default is sdpa: no attn_sdpa case
    assert not any("attn_" in i for i in ids if i.startswith("resnet18"))
    reason = unsupported_reason(RunConfig(model="resnet18", profile="cpu",
                                          attn_implementation="eager"))
    assert reason == "attn_implementation eager: resnet18 is not a Hugging Face transformers model"
    with pytest.raises(ValueError, match="attention 'flash' pins a scaled_dot_product_attention"):
        RunConfig(model="bert", attention="flash", attn_implementation="eager")


def test_eager_attention_trains_without_calling_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    with build(RunConfig(model="bert", profile="cpu", attn_implementation="eager")) as case:
        result = check_case(case)
        from gpubench.workloads.api import hf_model

        assert hf_model(case.model).config._attn_implementation == "eager"
        # The FP32 reference keeps the default, on the same parameters.
        assert hf_model(case.reference_model).config._attn_implementation == "sdpa"
        calls.clear()
        case.step()
    assert result.grad_cosine > 0.9999  # the same function, computed in other ops
    assert calls == []  # the case's own steps do not call it


def test_a_broken_eager_attention_fails_the_check(monkeypatch):
    """Eager attention that forgets its softmax: the scores weigh the values unnormalised."""
    from transformers.models.bert import modeling_bert

    def no_softmax(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                   **kwargs):
        weights = torch.matmul(query, key.transpose(2, 3)) * query.size(-1) ** -0.5
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    monkeypatch.setattr(modeling_bert, "eager_attention_forward", no_softmax)
    with build(RunConfig(model="bert", profile="cpu", attn_implementation="eager")) as case, \
            pytest.raises(TrainingCheckError):
        check_case(case)


@pytest.mark.parametrize("sdpa_median, sdpa_act, expected", [
    (0.8, 200, "holds"), (1.0, 200, "partly holds (memory)")])
def test_the_flash_attention_claim_compares_sdpa_with_eager(sdpa_median, sdpa_act, expected):
    rows = [_row("bert-fp32", sdpa_median, hf_attention="sdpa", activation_bytes=sdpa_act,
                 noise=0.002),
            _row("bert-fp32-attn_eager", 1.0, attn_implementation="eager", group="attention",
                 hf_attention="sdpa", noise=0.002)]
    (v,) = [v for v in advise(pd.DataFrame(rows))
            if v.claim == f"{FLASH} (transformers: sdpa vs eager)"]
    assert v.verdict == expected, v


def test_the_kernel_that_ran_is_named_by_the_flop_counter():
    """The record's ``attention_kernels``: what the FLOP counter saw run; the math path runs
    as plain matmuls and names none. ``fp8_flops``: the float8 matmuls' share."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpubench.measure.flops import FlopCount, count_flops_detailed

    q = torch.randn(2, 4, 16, 8, requires_grad=True)

    def step():
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()

    ran = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(backend):
            ran[backend] = count_flops_detailed(step).attention_kernels
    assert ran == {SDPBackend.FLASH_ATTENTION: ["flash (cpu)"], SDPBackend.MATH: []}
    cuda = FlopCount(100, {"aten._scaled_dot_product_efficient_attention": 10,
                           "aten._scaled_dot_product_efficient_attention_backward": 20,
                           "aten._scaled_mm": 40, "aten.mm": 30})
    assert cuda.attention_kernels == ["efficient"] and cuda.fp8_flops == 40


def test_the_fp8_share_is_of_the_gemm_flops():
    """``fp8_gemm_flops_fraction``: the float8 matmuls' FLOPs over the step's GEMM FLOPs (the
    matrix multiplications), not over every counted FLOP (convolutions and fused attention
    are not GEMMs an FP8 recipe converts)."""
    from gpubench.measure.flops import FlopCount, count_flops_detailed, fp8_gemm_fraction

    step = FlopCount(200, {"aten.convolution": 60,
                           "aten._scaled_dot_product_efficient_attention": 20,
                           "aten._scaled_mm": 90, "aten.mm": 20, "aten.addmm": 6,
                           "aten.bmm": 4})
    assert step.gemm_flops == 120 and step.fp8_flops == 90
    counts = [{"flops": 200, "fp8_flops": 90, "gemm_flops": 120},
              {"flops": 200, "fp8_flops": 90, "gemm_flops": 120}]  # two ranks
    assert fp8_gemm_fraction(counts) == pytest.approx(0.75)  # not 90 / 200
    assert fp8_gemm_fraction([{"flops": 60, "fp8_flops": 0, "gemm_flops": 0}]) is None
    # A real count: a linear layer's matmuls are GEMMs, a convolution's FLOPs are not.
    conv, linear = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(16, 8)
    x = torch.randn(2, 3, 6, 6)

    def run():
        linear(conv(x).flatten(2)).sum().backward()

    counted = count_flops_detailed(run)
    assert 0 < counted.gemm_flops < counted.total
    assert counted.gemm_flops == sum(n for op, n in counted.by_op.items() if "mm" in op)
    assert fp8_gemm_fraction([{"fp8_flops": counted.fp8_flops,
                               "gemm_flops": counted.gemm_flops}]) == 0.0
