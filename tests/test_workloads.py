"""Bring your own model: workloads named by spec, through every group of the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpubench.analysis.advice import advise
from gpubench.analysis.results import load_results
from gpubench.diagnostics.frontier import find_frontier
from gpubench.measure.runner import run_case
from gpubench.measure.standalone import StandaloneBenchmark, write_benchmark_json
from gpubench.report.summary import summary_markdown
from gpubench.suite.cases import profile_cases
from gpubench.train.build import Unsupported, build
from gpubench.train.config import RunConfig
from gpubench.workloads.api import WorkloadError, validate
from gpubench.workloads.registry import resolve

HERE = Path(__file__).parent
KWS = f"{HERE / 'kws_workload.py'}:workload"
ROOT = HERE.parent


def run(cfg: RunConfig, rounds: int = 2) -> dict:
    bench = StandaloneBenchmark(cfg.id)
    return run_case(bench, cfg, rounds=rounds, warmup_rounds=0, timeout_s=120)


def test_custom_workload_resolves_with_its_name_and_data():
    workload = resolve(KWS, "smoke")
    assert workload.name == "kws" and workload.spec == KWS
    assert workload.dataset_names == ("waves",)
    assert not workload.uses_channels_last and workload.min_batch == 2  # 3-D input, BatchNorm
    cfg = RunConfig(model=KWS, profile="smoke")
    assert cfg.id == "kws-fp32" and cfg.name == "kws"


def test_custom_workload_cases_cover_every_group_that_applies():
    cases = profile_cases("smoke", "cpu", (KWS,))
    groups = {c.group for c in cases}
    assert groups == {"precision", "accumulation", "optimizer", "memory", "parallel", "loader"}
    ids = {c.id for c in cases}
    assert {"kws-fp32-model2", "kws-fp32-ddp2", "kws-fp32-waves-w2",
            "kws-fp32-waves-cached"} <= ids
    assert not any(c.cfg.channels_last for c in cases)  # layout does not apply to 3-D input


@pytest.mark.slow
def test_custom_workload_runs_every_case_with_builtin_fields(tmp_path, monkeypatch):
    """Every smoke case of a workload defined only in a test file runs, passes its training
    check, and records the same fields as the built-in model's case of the same kind."""
    monkeypatch.setenv("GPUBENCH_DATA_DIR", str(tmp_path))
    builtin = run(RunConfig(model="bert", profile="smoke"))
    ran, benches = 0, []
    for case in profile_cases("smoke", "cpu", (KWS,)):
        bench = StandaloneBenchmark(case.id, "kws-smoke-cpu")
        try:
            info = run_case(bench, case.cfg, rounds=2, warmup_rounds=0, timeout_s=120)
        except Unsupported as why:
            assert case.cfg.parallel == "dp", why  # DataParallel needs CUDA
            continue
        bench.extra_info["group"] = case.group
        benches.append(bench)
        ran += 1
        assert info["model"] == "kws" and info["workload"] == KWS
        assert info["loss_first"] == pytest.approx(info["loss_reference"],
                                                   rel=info["loss_rtol"], abs=info["loss_rtol"])
        assert set(builtin) - set(info) == set(), case.id
        assert info["flops_per_step"] > 0 and info["activation_bytes"] > 0
    assert ran >= 12
    # The results load, summarize and advise like a built-in model's.
    write_benchmark_json(tmp_path / "kws.json", benches, {"device": "cpu"})
    df = load_results([tmp_path / "kws.json"])
    amp = {v.claim: v for v in advise(df)}["AMP cuts training time ~30% and memory ~50% (bf16)"]
    # Measured from the workload's own records (which way it goes is the CPU's noise to decide).
    assert amp.measured != "-" and not amp.why.startswith("not measured"), amp
    assert "kws-fp32" in summary_markdown(df)
    # The OOM frontier on the CPU: a budget stands in for the device.
    frontier = find_frontier(RunConfig(model=KWS, profile="smoke"), budget_bytes=8 * 2**30,
                             limit=16)
    assert frontier.max_batch == 16 and frontier.capped


def test_custom_workload_pipeline_and_model_parallel_match_unsplit(tmp_path):
    """The workload's stages compute exactly the unsplit model (loss and gradients)."""
    single = build(RunConfig(model=KWS, profile="smoke"))
    split = build(RunConfig(model=KWS, profile="smoke", parallel="model", world_size=2))
    inputs, targets = single.fixed_batches()[0]
    a, b = single.model(inputs, targets), split.model(inputs, targets)
    assert b.item() == pytest.approx(a.item(), rel=1e-6)
    a.backward()
    b.backward()
    grads = [p.grad for p in single.model.parameters()]
    split_grads = [p.grad for p in split.model.parameters()]
    for g, h in zip(grads, split_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-6)
    single.close()
    split.close()


@pytest.mark.parametrize("spec", ["bert", "gpt2"])
def test_transformer_stages_match_unsplit_model(spec):
    """The built-in transformers split by blocks compute the unsplit loss and gradients (GPT-2's
    split copy of the tied LM head aside, which has no counterpart)."""
    case = build(RunConfig(model=spec, profile="smoke", micro_batch=4))
    inputs, targets = case.fixed_batches()[0]
    net, workload = case.model.net, case.workload
    params = [p for p in case.model.parameters()]
    full = case.model(inputs, targets)
    full_grads = torch.autograd.grad(full, params, allow_unused=True)
    stages = workload.stages(net, 2)
    x = inputs
    for stage in stages:
        x = stage(x)
    split = workload.loss_fn(x, targets)
    assert split.item() == pytest.approx(full.item(), rel=1e-6)
    shared = [p for p in params if any(p is q for s in stages for q in s.parameters())]
    split_grads = torch.autograd.grad(split, shared, allow_unused=True)
    by_id = {id(p): g for p, g in zip(params, full_grads, strict=True)}
    tied = {id(net.net.lm_head.weight)} if spec == "gpt2" else set()
    checked = 0
    for p, g in zip(shared, split_grads, strict=True):
        if id(p) in tied or g is None:
            continue
        torch.testing.assert_close(g, by_id[id(p)], rtol=1e-4, atol=1e-6)
        checked += 1
    assert checked > 10
    case.close()


def test_dict_inputs_and_loss_in_model_run_a_case():
    spec = f"{HERE / 'kws_workload.py'}:dict_workload"
    info = run(RunConfig(model=spec, profile="smoke", accum_steps=2))
    assert info["model"] == "dictnet" and info["input_shape"] == [4, 12]
    assert info["check_losses"][-1] < info["check_losses"][0]


@pytest.mark.parametrize("spec", ["torchvision:mobilenet_v3_small",
                                  "transformers:llama?hidden_size=32&num_hidden_layers=1"])
def test_family_specs_build_and_train(spec):
    info = run(RunConfig(model=spec, profile="smoke"))
    assert info["samples_per_s"] > 0 and info["workload"] == spec
    imports = resolve(spec, "smoke").imports  # what the fork server imports for its ranks
    assert imports and all(m in sys.modules for m in imports), imports


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown workload 'nope'"),
    ("missing_file.py:workload", "does not exist"),
    (f"{HERE / 'kws_workload.py'}:absent", "has no attribute 'absent'"),
    (f"{HERE / 'kws_workload.py'}:not_a_workload", "must return a gpubench.Workload"),
    (f"{HERE / 'kws_workload.py'}:scalar_free", "scalar tensor"),
    ("torchvision:not_a_model", "torchvision has no classification model"),
    ("transformers:not_a_type", "transformers has no model type"),
    ("no_such_module_xyz:factory", "cannot import module"),
    ("transformers:llama?hidden_sise=64",  # a misspelt override ran the default size
     r"llama has no config field 'hidden_sise' \(did you mean hidden_size\?\); valid keys: "
     r".*\bhidden_size\b.*\bseq_len\b"),
])
def test_bad_specs_fail_on_one_line(spec, message):
    with pytest.raises(WorkloadError, match=message) as err:
        validate(resolve(spec, "smoke"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("command", [["list"], ["run", "--no-charts"]])
def test_bad_spec_on_the_command_line_exits_2_and_writes_nothing(tmp_path, command):
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command[0] == "run" else []
    proc = subprocess.run(
        [sys.executable, "-m", "gpubench", *command, "--profile", "smoke",
         "--model", "missing_file.py:workload", *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing_file.py" in lines[0], proc.stderr
    assert not out.exists()


def test_builtin_case_ids_of_the_committed_results_are_kept(monkeypatch):
    """On any CPU: the profile's cases follow the precisions the CPU computes natively (the
    recipe's precision, the reduced-precision combinations kept), so the ids of a CPU with
    bf16 units and of one without both count."""
    from gpubench.suite import cases

    data = json.loads((ROOT / "results" / "cpu" / "benchmark.json").read_text())
    committed = {b["extra_info"]["case_id"] for b in data["benchmarks"]
                 if b["extra_info"].get("kind") == "step"}
    now = set()
    for native in (set(), {"bf16"}, {"bf16", "fp16"}):
        monkeypatch.setattr(cases, "native_cpu_precisions", lambda native=native: native)
        now |= {c.id for c in profile_cases("cpu", "cpu", None)}
    assert committed - now == set()


@pytest.mark.slow
def test_case_command_runs_one_configuration(tmp_path):
    out = tmp_path / "one.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gpubench", "case", "--profile", "smoke", "--model", KWS,
         "--precision", "bf16", "--accum-steps", "2", "--micro-batch", "4", "--rounds", "3",
         "-o", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    assert record["case_id"] == "kws-bf16-accum2-mb4" and record["global_batch"] == 8


def test_initial_weights_are_built_once_and_copied_with_the_rng_where_a_build_leaves_it():
    from gpubench.workloads import api as wl
    from gpubench.workloads.registry import resolve

    w = resolve("bert", "smoke")
    torch.manual_seed(0)
    fresh = wl.build_train_module(w)
    after_fresh = torch.rand(3)
    wl._INITIAL.clear()
    first = wl.initial_train_module(w, 0)
    after_first = torch.rand(3)
    second = wl.initial_train_module(w, 0, checkpointing=True)
    after_second = torch.rand(3)
    assert torch.equal(after_fresh, after_first) and torch.equal(after_fresh, after_second)
    for a, b, c in zip(fresh.parameters(), first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert second is not first and next(second.parameters()) is not next(first.parameters())


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "bert", "gpt2", "llama"])
def test_every_builtin_workload_passes_validation(name):
    """The commands skip validating built-in names (a model build each, before any case):
    this is where they are validated; the modules each declares for the fork server to import
    are modules its build has imported."""
    workload = resolve(name, "smoke")
    validate(workload)
    assert workload.imports and all(m in sys.modules for m in workload.imports), workload.imports


def test_the_builtin_llama_is_fp8s_workload_every_linear_a_multiple_of_16():
    """Every profile's sizes give linears torchao's filter converts (hidden, 4 x hidden, heads
    x head size, vocabulary all multiples of 16); at smoke, the probe's linears say so, and on
    CUDA its compile group holds the FP8 compiled cases beside compiled bf16."""
    from gpubench.suite.cases import profile_cases
    from gpubench.workloads.builtin import LLAMA_SIZES

    for size in LLAMA_SIZES.values():
        assert all(d % 16 == 0 for d in (size.hidden, 4 * size.hidden, size.vocab_size))
        assert size.hidden % size.heads == 0
    workload = resolve("llama", "smoke")
    assert workload.name == "llama" and workload.micro_batch == LLAMA_SIZES["smoke"].micro_batch
    linears = workload.facts.linears
    assert len(linears) == 7 * LLAMA_SIZES["smoke"].layers + 1  # q k v o, gate up down; head
    assert all(o % 16 == 0 and i % 16 == 0 for _, o, i in linears), linears
    ids = {c.id for c in profile_cases("cpu", "cuda", ("llama",), ("compile",))}
    assert {"llama-bf16-compile", "llama-fp8-compile", "llama-fp8-rowwise-compile"} <= ids, ids


@pytest.mark.parametrize("imports", ["transformers.models.bert.modeling_bert", (1,)])
def test_imports_that_are_not_module_names_are_one_line(imports):
    """A bare string (iterated, it would name one-letter modules) or a non-string is refused
    where the workload is made, naming the value."""
    from gpubench.workloads.api import Workload

    with pytest.raises(WorkloadError, match=r"imports must be a tuple of module names .*got "):
        Workload(name="mlp", build_model=lambda: torch.nn.Linear(2, 2),
                 make_batch=lambda n, g: (torch.zeros(n, 2), torch.zeros(n, 2)), micro_batch=2,
                 imports=imports)
