"""torch.compile cases: the compile modes, what compiling costs (``compile_time_s``,
``break_even_steps``), a compiled case that trains and is counted on its eager model, and the
claims about compiling and CUDA graphs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_advice import _row  # the tests folder is on sys.path (pytest's rootdir-less import)

from gpubench.analysis.advice import advise
from gpubench.measure import protocol
from gpubench.measure.protocol import CaseProgram
from gpubench.measure.runner import compile_cost, compile_seconds
from gpubench.suite.cases import profile_cases
from gpubench.suite.claims import CLAIMS
from gpubench.train.build import unsupported_reason
from gpubench.train.config import RunConfig

TINY = f"{Path(__file__).resolve().parent / 'data' / 'tiny_workload.py'}:workload"
"""A two-layer MLP: the smallest model Inductor compiles forward and backward for."""


def test_compile_modes_are_cases_with_their_requirements():
    ids = {c.id: c for c in profile_cases("cpu", "cpu", ("resnet18",), ("compile",))}
    assert {"resnet18-fp32-compile", "resnet18-fp32-compile-reduce-overhead",
            "resnet18-fp32-compile-max-autotune-no-cudagraphs"} <= set(ids)
    assert all(c.slow for c in ids.values())
    graphs = ids["resnet18-fp32-compile-reduce-overhead"].cfg
    assert unsupported_reason(graphs) == ("compile_mode reduce-overhead records CUDA graphs: "
                                          "it needs a CUDA device")
    with pytest.raises(ValueError, match="compile_mode 'reduce-overhead' needs compile"):
        RunConfig(model="resnet18", compile_mode="reduce-overhead")
    with pytest.raises(ValueError, match="compile_mode must be one of default, reduce-overhead"):
        RunConfig(model="resnet18", compile=True, compile_mode="fast")


def test_compile_cost_and_break_even_against_the_same_configuration_uncompiled():
    # A 10 s first step, 1 s steady steps, 1.25x the baseline's speed: 0.25 s saved a step.
    info = {"first_step_s": 11.0, "step_time_s": 1.0, "baseline_step_time_s": 1.25,
            "speedup_paired": 1.25}
    fp32 = RunConfig(model="resnet18", compile=True)
    assert compile_cost(info, fp32) == {"compile_time_s": 10.0, "compile_steps": 1,
                                        "break_even_steps": 40.0,
                                        "break_even_against": "resnet18-fp32"}
    slower = {**info, "speedup_paired": 0.9}
    assert compile_cost(slower, fp32)["break_even_steps"] is None
    assert compile_cost({"step_time_s": 1.0}, fp32) == {}
    # bf16 compiled against the fp32 eager baseline: the saving is mostly bf16's, not
    # compiling's; no break-even without bf16 eager's step time, then against it.
    bf16 = RunConfig(model="resnet18", compile=True, precision="bf16")
    assert compile_cost(info, bf16)["break_even_steps"] is None
    out = compile_cost(info, bf16, uncompiled_step_s=1.1)
    assert out["break_even_steps"] == pytest.approx(100.0)
    assert out["break_even_against"] == "resnet18-bf16"


def test_a_compiled_record_says_its_kernels_are_the_eager_models():
    """A compiled case's FLOPs and attention kernels come from its eager model (the count
    traces ``_orig_mod``, not the code Inductor generated): its record says so."""
    from types import SimpleNamespace

    from gpubench.measure.runner import record

    def fake_benchmark():
        stats = SimpleNamespace(data=[0.1, 0.1, 0.1], median=0.1, iqr=0.0)
        return SimpleNamespace(stats=SimpleNamespace(stats=stats), extra_info={})

    measured = {"last_loss": 1.0, "flops_per_step": 1e9, "peak_flops_per_device": 1e12,
                "attention_kernels": ["flash (cpu)"], "fp8_gemm_flops_fraction": 0.0}
    sources = {}
    for compiled in (False, True):
        cfg = RunConfig(model="resnet18", profile="smoke", compile=compiled)
        info = record(fake_benchmark(), cfg, dict(measured))
        sources[compiled] = info["attention_kernels_from"]
    assert sources == {False: "step", True: "eager model"}


def test_compile_time_counts_the_steps_until_the_step_is_steady():
    """reduce-overhead: the first step compiles and warms the CUDA graphs up, the second
    records them (slower than a steady step), the third replays: both count, less a steady
    step each; the first step always counts, a step within 10% of steady ends the count."""
    assert compile_seconds([30.0, 5.0, 1.05, 3.0], 1.0) == (pytest.approx(33.0), 2)
    assert compile_seconds([30.0, 1.02, 1.0], 1.0) == (pytest.approx(29.0), 1)
    assert compile_seconds([1.05, 1.0], 1.0) == (pytest.approx(0.05), 1)
    assert compile_seconds([0.9, 1.0], 1.0) == (0.0, 1)  # never negative
    graphs = RunConfig(model="bert", device="cuda", compile=True,
                       compile_mode="reduce-overhead")
    out = compile_cost({"first_step_s": 30.0, "check_step_times_s": [30.0, 5.0, 1.0],
                        "step_time_s": 1.0}, graphs, uncompiled_step_s=1.5)
    assert out["compile_time_s"] == pytest.approx(33.0) and out["compile_steps"] == 2
    assert out["break_even_steps"] == pytest.approx(66.0)


def tinyconv(profile: str = "smoke"):
    """A convolution, batch norm in training mode and a linear head: what a CNN's compiled step
    holds (the norm's running statistics updated in the graph) in a few kernels."""
    import torch
    from torch import nn

    from gpubench import Workload

    return Workload(name="tinyconv", build_model=lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)),
        make_batch=lambda n, g: (torch.randn(n, 3, 16, 16, generator=g),
                                 torch.randint(0, 4, (n,), generator=g)),
        micro_batch=4, loss_fn=nn.functional.cross_entropy)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on the CPU needs a C++ compiler")
def test_each_compiled_case_compiles_into_a_fresh_cache_of_its_own():
    """The same compiled case twice in one process: the second finds nothing the first
    compiled (no FX graph or AOTAutograd cache hit; Inductor's default cache would serve it
    every graph), each compiles in a folder of its own, removed when the case closes, and the
    environment is as it was after."""
    import os

    from gpubench.train.checks import CHECK_STEPS

    cfg = RunConfig(model=TINY, profile="smoke", compile=True)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")
    seen = []
    for _ in range(2):
        program = CaseProgram(0, 1, cfg)
        try:
            folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
            check = program.check()
            assert any(folder.iterdir())  # the compilation wrote here
        finally:
            program.close()
        assert not folder.exists()
        seen.append((folder, check))
    assert (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")) \
        == before
    assert seen[0][0] != seen[1][0]
    for _, check in seen:
        assert check["compile_cache_hits"] == 0, check
        assert check["compile_cache_misses"] > 0, check
        assert len(check["step_times_s"]) == CHECK_STEPS
        assert check["step_times_s"][0] == check["first_step_s"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on the CPU needs a C++ compiler")
def test_a_compiled_case_trains_compiles_in_its_first_step_and_counts_as_eager():
    counts, firsts = {}, {}
    model = f"{Path(__file__).resolve()}:tinyconv"
    for cfg in (RunConfig(model=model, profile="smoke"),
                RunConfig(model=model, profile="smoke", compile=True)):
        protocol._LAST_COUNT.clear()
        program = CaseProgram(0, 1, cfg)
        try:
            check = program.check()  # raises where the compiled step trains differently
            counts[cfg.compile] = program.count()
            firsts[cfg.compile] = check["first_step_s"]
            steady = min(program.step() for _ in range(3))
        finally:
            program.close()
    assert counts[True]["flops"] == counts[False]["flops"] > 0
    assert counts[True]["activation_bytes"] == counts[False]["activation_bytes"]
    assert firsts[True] > 5 * steady  # the first compiled step is the compilation


def test_the_compile_claims():
    compile_claim, graphs = CLAIMS["compile"].text, CLAIMS["cuda-graphs"].text
    rows = [_row("bert-fp32", 1.0, noise=0.002, compile=False),
            _row("bert-fp32-compile", 0.8, noise=0.002, compile=True, group="compile",
                 compile_time_s=12.0, break_even_steps=60.0, break_even_against="bert-fp32")]
    verdicts = {v.claim: v for v in advise(pd.DataFrame(rows))}
    assert verdicts[compile_claim].verdict == "holds"
    assert "compiling took 12.0 s, won back after 60 steps" in verdicts[compile_claim].why
    assert verdicts[graphs].verdict == "not testable here"
    # CUDA graphs against compile's default mode, both at bf16 on a launch-bound micro-batch
    # (a sixteenth of the baseline's 8: 1); the compute-bound fp32 pair is not the claim's.
    small = {"precision": "bf16", "micro_batch": 1, "global_batch": 1, "device": "cuda",
             "noise": 0.002, "compile": True}
    cuda = [_row("bert-fp32", 1.0, device="cuda", noise=0.002),
            _row("bert-fp32-compile", 0.8, device="cuda", noise=0.002, compile=True),
            _row("bert-fp32-compile-reduce-overhead", 0.8, device="cuda", noise=0.002,
                 compile=True, compile_mode="reduce-overhead"),
            _row("bert-bf16-mb1-compile", 0.2, **small),
            _row("bert-bf16-mb1-compile-reduce-overhead", 0.1, compile_mode="reduce-overhead",
                 **small)]
    verdicts = {v.claim: v for v in advise(pd.DataFrame(cuda))}
    assert verdicts[graphs].verdict == "holds", verdicts[graphs]
    ids = {c.id for c in profile_cases("gpu-small", "cuda", ("bert",), ("compile",))}
    assert {"bert-bf16-mb8-compile", "bert-bf16-mb8-compile-reduce-overhead"} <= ids, ids


def test_break_even_is_against_the_same_configuration_uncompiled():
    """A compiled case's break-even is read against its uncompiled twin (every field the same
    but compile and its mode) measured in the run; a record paired with that twin keeps its
    figure; without the twin there is no figure, never one against the fp32 baseline."""
    from gpubench.analysis.results import compile_cost_words, with_compile_break_even

    rows = pd.DataFrame([
        _row("bert-fp32", 1.0),
        # paired in its run with fp32 eager (the runner's figure, kept)
        _row("bert-fp32-compile", 0.8, compile=True, compile_time_s=12.0, speedup_paired=1.25,
             break_even_steps=60.0, break_even_against="bert-fp32"),
        _row("bert-bf16", 0.5, precision="bf16"),
        _row("bert-bf16-compile", 0.4, precision="bf16", compile=True, compile_time_s=10.0),
        # its twin (bf16 micro-batch 1, eager) was not measured; fp32 eager and bf16 eager at
        # the baseline's micro-batch were, and are not its configuration
        _row("bert-bf16-mb1-compile", 0.1, precision="bf16", micro_batch=1, global_batch=1,
             compile=True, compile_time_s=8.0),
        # slower than its twin: no step wins compiling back
        _row("bert-bf16-compile-max-autotune-no-cudagraphs", 0.6, precision="bf16",
             compile=True, compile_mode="max-autotune-no-cudagraphs", compile_time_s=30.0),
        # the same configuration in another run is not this run's twin
        {**_row("bert-bf16", 0.45, precision="bf16"), "run": "other"},
    ])
    out = with_compile_break_even(rows).set_index(["run", "case_id"]).loc["r"]
    kept = out.loc["bert-fp32-compile"]
    assert kept["break_even_steps"] == 60.0 and kept["break_even_against"] == "bert-fp32"
    assert kept["uncompiled_step_time_s"] == pytest.approx(kept["step_time_s"] * 1.25)
    bf16 = out.loc["bert-bf16-compile"]
    assert bf16["break_even_against"] == "bert-bf16"
    saved = out.loc["bert-bf16", "step_time_s"] - bf16["step_time_s"]
    assert bf16["break_even_steps"] == pytest.approx(10.0 / saved)
    assert bf16["uncompiled_step_time_s"] == out.loc["bert-bf16", "step_time_s"]
    lone = out.loc["bert-bf16-mb1-compile"]
    assert pd.isna(lone["break_even_steps"]) and lone["break_even_against"] is None
    assert pd.isna(lone["uncompiled_step_time_s"])
    assert "the same configuration uncompiled was not measured" in compile_cost_words(lone)
    slow = out.loc["bert-bf16-compile-max-autotune-no-cudagraphs"]
    assert pd.isna(slow["break_even_steps"]) and slow["break_even_against"] == "bert-bf16"
    assert "which no step wins back" in compile_cost_words(slow)
    assert pd.isna(out.loc["bert-bf16", "break_even_steps"])  # not compiled: untouched


def test_the_summary_says_what_compiling_cost():
    from gpubench.report.summary import compile_markdown

    rows = pd.DataFrame([_row("bert-fp32", 1.0),
                         _row("bert-fp32-compile", 0.8, compile=True, compile_time_s=12.0,
                              break_even_steps=60.0, break_even_against="bert-fp32",
                              speedup_paired=1.25, dynamo_recompiles=0),
                         _row("bert-fp32-compile-x", 1.2, compile=True, compile_time_s=3.0,
                              compile_mode="max-autotune-no-cudagraphs", speedup_paired=0.8,
                              dynamo_recompiles=1),
                         _row("bert-bf16-compile", 0.4, precision="bf16", compile=True,
                              compile_time_s=10.0, dynamo_recompiles=0)])
    text = compile_markdown(rows)
    assert "pays off after (steps)" in text

    def cells(case):
        row = next(line for line in text.splitlines() if line.startswith(f"| {case} "))
        return [c.strip() for c in row.strip("|").split("|")]

    assert cells("bert-fp32-compile")[-2:] == ["60", "0"]
    assert cells("bert-fp32-compile")[3] == "bert-fp32"
    assert cells("bert-fp32-compile-x")[-2] == "never (no saving)"
    # fp32 eager is there, bf16 eager is not: no figure against the wrong configuration
    assert cells("bert-bf16-compile")[3:] == ["-", "-", "not known (uncompiled twin not "
                                                       "measured)", "0"]
    assert compile_markdown(pd.DataFrame([_row("bert-fp32", 1.0)])) == ""


def test_a_miscompiled_model_fails_the_check(monkeypatch):
    """A compiler that gets the model wrong (its outputs halved) is caught by the check."""
    import torch

    from gpubench.train import build as build_module
    from gpubench.train.checks import TrainingCheckError, check_case

    class Halved(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs) * 0.5

    monkeypatch.setattr(build_module.torch, "compile", lambda model, **kw: Halved(model))
    with build_module.build(RunConfig(model="bert", profile="smoke", compile=True)) as case, \
            pytest.raises(TrainingCheckError):
        check_case(case)


def test_a_compiled_case_has_a_time_limit_sized_for_compiling():
    from gpubench.suite.cases import case_timeout

    eager = RunConfig(model="resnet18")
    assert case_timeout(eager, 90.0) == 90.0 and case_timeout(eager, None) is None
    assert case_timeout(eager.with_(compile=True), 90.0) == 600.0
    autotune = eager.with_(compile=True, compile_mode="max-autotune-no-cudagraphs")
    assert case_timeout(autotune, 300.0) == 1800.0
    assert case_timeout(autotune, 3600.0) == 3600.0  # a longer --timeout stands
