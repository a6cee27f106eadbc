"""``gpubench tune``: the search space, memory pruning, bad input, the outputs (the winner, the
ablation, the diagnosis, the snippet), a stopped tune resumed, and the search against an
exhaustive sweep of the same space measured the same way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gpubench.diagnostics import tune
from gpubench.diagnostics.tune import MemoryModel, TuneError, Tuner, search_space, snippet
from gpubench.suite.cases import baseline

QUIET = lambda line: None  # noqa: E731


def test_the_space_keeps_the_global_batch_and_starts_at_the_baseline():
    base = baseline("bert", "smoke", "cpu")
    space = search_space(base, 4, ("precision", "micro_batch", "optimizer_impl",
                                   "checkpointing"))
    assert space[0] == base and len(space) == len(set(space))
    assert all(c.global_batch == 4 for c in space)
    assert {c.resolved_micro_batch for c in space} == {4, 2, 1}
    # bf16 where this CPU computes it (AVX512-BF16/AMX), fp16 only on CUDA or AMX-FP16.
    assert {c.precision for c in space} >= {"fp32"}
    assert len(space) == 3 * 3 * 2 * len({c.precision for c in space})
    assert "bert-fp32-accum4-mb1-sgd_fused-ckpt" in {c.id for c in space}


def test_the_space_has_attention_where_the_model_has_it_and_says_what_it_leaves_out():
    bert, resnet = baseline("bert", "smoke", "cpu"), baseline("resnet18", "smoke", "cpu")
    dims = ("attn_implementation", "attention", "offload", "precision", "channels_last")
    ids = {c.id for c in search_space(bert, 4, dims)}
    # transformers' eager attention, and a pinned SDPA kernel, each on its own: the two
    # exclude each other (eager calls no SDPA), so no such pair is in the space.
    assert {"bert-fp32-attn_eager", "bert-fp32-sdpa_flash"} <= ids
    assert not any("attn_eager" in i and "sdpa_" in i for i in ids)
    assert not any("offload" in i for i in ids)  # inert on the CPU
    said = tune.left_out(bert, 4, dims, False)
    assert any(line.startswith("offload: activations already live in host memory")
               for line in said)
    assert any(line.startswith("channels_last: ") for line in said)
    assert any(line.startswith("precision fp8: ") for line in said)  # emulated on a CPU
    said = tune.left_out(resnet, 4, dims, False)
    assert any(line.startswith("attn_implementation: not a Hugging Face") for line in said)
    assert not any(line.startswith("channels_last") for line in said)
    assert tune.left_out(resnet, 4, ("optimizer_impl",), False) == []  # only what was asked


@pytest.mark.parametrize("kwargs, says", [
    ({"spec": "resnet18", "global_batch": 1}, "--global-batch 1: no micro-batch of resnet18 "
     "divides it (its smallest micro-batch is 2: BatchNorm needs two samples)"),
    ({"spec": "bert", "dims": ("precision", "lr")}, "techniques must be from precision, "
     "micro_batch, checkpointing, optimizer_impl, channels_last, attn_implementation, offload, "
     "attention, compile; got 'precision,lr'"),
])
def test_bad_input_is_one_line_naming_it(tmp_path, kwargs, says):
    spec = kwargs.pop("spec")
    with pytest.raises(TuneError) as err:
        Tuner(spec, "smoke", "cpu", tmp_path, progress=QUIET, **kwargs)
    assert str(err.value) == says


def test_an_impossible_budget_is_one_line(tmp_path):
    with pytest.raises(TuneError, match=r"^--budget 1.0 KiB: not even the baseline fits "
                       r"\(predicted [0-9,.]+ [KMG]?i?B\)$"):
        Tuner("bert", "smoke", "cpu", tmp_path, budget_bytes=1024, dims=("micro_batch",),
              progress=QUIET).run()


def test_the_memory_model_predicts_the_measured_training_memory():
    base = baseline("bert", "smoke", "cpu")
    model = MemoryModel()
    for cfg in (base.with_(micro_batch=2, accum_steps=2),
                base.with_(checkpointing=True), base):
        with tune.build(base) as base_case:
            _, _, _, facts = tune.paired_ratios(base_case, cfg, 1, check=True)
        assert model.predict(cfg) / tune.WORKSPACE_MARGIN == pytest.approx(
            facts["training_memory_bytes"], rel=0.1)
    assert model.counted == 2  # one count per (precision, checkpointing, layout)
    # Offloading: the saved activations are host memory; the device keeps one block's.
    offload = base.with_(offload=True)
    saved = model.predict(base) / tune.WORKSPACE_MARGIN - model._state
    assert model.predict_host(offload) == pytest.approx(saved) and model.predict_host(base) == 0
    blocks = max(1, base.workload.facts.blocks)
    assert model.predict(offload) / tune.WORKSPACE_MARGIN == pytest.approx(
        model._state + saved / blocks)
    assert model.counted == 2  # offloading saves the same tensors: no new count


def test_a_confirmed_winner_over_the_budget_by_its_measured_peak_is_not_the_winner():
    assert tune.over_budget({"peak_memory_bytes": 2 * 2**30}, 2**30) == (
        "over budget: measured peak 2.0 GiB > 1.0 GiB")
    assert tune.over_budget({"peak_memory_bytes": 2**29}, 2**30) is None
    assert tune.over_budget({}, 2**30) is None and tune.over_budget(
        {"peak_memory_bytes": 5}, None) is None


@pytest.mark.slow
def test_a_tune_writes_the_winner_its_ablation_the_diagnosis_and_the_snippet(tmp_path):
    out = tmp_path / "tune"
    proc = subprocess.run(
        [sys.executable, "-m", "gpubench", "tune", "--model", "bert", "--profile", "smoke",
         "--techniques", "optimizer_impl,micro_batch", "--out", str(out), "--parity",
         "--parity-steps", "8", "--price-per-hour", "3.6"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpubench tune: rung 0 [1/" in proc.stdout  # progress while it searches
    assert "gpubench tune: wrote" in proc.stdout and "re-measure it with: gpubench case" in (
        proc.stdout)
    md = (out / "tune.md").read_text()
    for heading in ("Winner: ", "## Use it", "## Diagnosis of the baseline step",
                    "## Confirmed finalists", "## Ablation of the winner",
                    "## Every configuration"):
        assert heading in md, heading
    state = json.loads((out / "tune.json").read_text())
    result = state["result"]
    assert len(result["candidates"]) == 9 and result["baseline"] == "bert-fp32"
    assert all(c["check"] == "passed" or c["check"].startswith("failed")
               for c in result["confirmed"])
    assert result["diagnosis"]["predictions"]["optimizer_impl"].split(":")[0] in (
        "helps", "neutral", "hurts")
    winner = result["winner"]
    # Where, with what and when: the answer of a run beside it uses it only on this machine.
    from gpubench.measure.provenance import FINGERPRINT_MACHINE

    fp = result["fingerprint"]
    assert set(FINGERPRINT_MACHINE) <= set(fp) and fp["device"] == "cpu"
    assert fp["libraries"]["torch"] == torch.__version__ and fp["date"].startswith("20")
    assert f"Measured on {fp['device_name']}" in md
    assert "## Left out of the space" not in md  # both searched techniques apply here
    # The price: each confirmed configuration's throughput (global batch over its median step
    # in the confirmation rounds) and its cost, bert's per token too, the unit in the header.
    cost = result["cost"]
    assert "| cost per 1M samples (at 3.6/machine-hour) | cost per 1M tokens (at " in md
    assert "the winner costs" in proc.stdout and "per million samples at 3.6" in proc.stdout
    passed = [c for c in result["confirmed"] if c["check"] == "passed"]
    assert set(cost["cases"]) == {result["baseline"]} | {c["case_id"] for c in passed}
    for c in [*passed, {"case_id": result["baseline"],
                        "step_time_s": result["baseline_step_time_s"]}]:
        rate = result["global_batch"] / c["step_time_s"]
        figures = cost["cases"][c["case_id"]]
        assert figures["samples_per_s"] == pytest.approx(rate)
        assert figures["cost_per_m_samples"] == pytest.approx(3.6 / 3600 / rate * 1e6)
        assert figures["cost_per_m_tokens"] == pytest.approx(
            figures["cost_per_m_samples"] / result["input_shape"][1])
    assert set(result["diagnosis"]["predictions"]) == {"optimizer_impl", "micro_batch"}
    parity = md.split("## Convergence parity of the winner")[1]
    if winner["case_id"] == "bert-fp32":
        assert result["ablation"] == [] and "nothing to take away" in md
        assert "nothing to compare" in parity and not (out / "parity.json").exists()
    else:  # each of its techniques set back in turn, and its loss curve beside FP32's
        assert result["ablation"] and all(a["removed"] in tune.DIMENSIONS
                                          for a in result["ablation"])
        report = json.loads((out / "parity.json").read_text())
        assert [r["technique"] for r in report["techniques"]] == ["fp32", "tuned"]
        assert report["techniques"][1]["case_id"] == winner["case_id"]
        assert (out / "parity.png").exists() and "| tuned " in parity


@pytest.mark.parametrize("precision, micro, ckpt, cl", [
    ("bf16", 2, True, False), ("fp16", 1, False, True), ("fp32", 4, False, False)])
def test_the_snippet_is_python_with_the_winners_settings(precision, micro, ckpt, cl):
    config = {"precision": precision, "micro_batch": micro, "accum_steps": 4 // micro,
              "checkpointing": ckpt, "optimizer_impl": "fused", "channels_last": cl,
              "compile": True, "optimizer": "sgd", "compile_mode": "default"}
    result = tune.TuneResult("bert", "cuda", "gpu-small", 4, None, "bert-fp32", {}, [], [],
                             {"case_id": "x", "config": config}, [], 0.0, True)
    code = snippet(result)
    compile(code, "snippet", "exec")
    assert "fused=True" in code and "torch.compile(model)" in code
    assert ("GradScaler" in code) == (precision == "fp16")
    assert (f"accum_steps, micro_batch = {4 // micro}, {micro}") in code
    assert ("channels_last" in code) == cl


def _config(**changes):
    return {"precision": "fp32", "micro_batch": 2, "accum_steps": 2, "checkpointing": False,
            "optimizer_impl": "default", "channels_last": False, "compile": False,
            "optimizer": "sgd", "compile_mode": "default", **changes}


def test_the_snippet_sets_attention_offload_and_fp8():
    config = _config(precision="fp8", attn_implementation="eager", attention="flash",
                     offload=True)
    code = snippet(tune.TuneResult("bert", "cuda", "gpu-small", 4, None, "bert-fp32", {}, [],
                                   [], {"case_id": "x", "config": config}, [], 0.0, True))
    compile(code, "snippet", "exec")
    assert 'model.set_attn_implementation("eager")' in code
    assert ('convert_to_float8_training(model, module_filter_fn=_auto_filter_for_recipe('
            '"tensorwise", filter_fqns=[]))') in code and "torch.bfloat16" in code
    assert "sdpa_kernel(SDPBackend.FLASH_ATTENTION)" in code
    # The offload the case measured: gpubench's side-stream hooks, not save_on_cpu (whose
    # device-to-host copy blocks on some torch versions).
    assert "save_on_cpu" not in code
    assert "from gpubench.train.implementations import ActivationOffload" in code
    assert 'offload = ActivationOffload("cuda")' in code
    # The forward runs under the contexts; backward after them (outside autocast).
    after = code.split("offload.saved_tensors():")[1].splitlines()
    assert after[1].strip().startswith("loss =")
    assert after[2] == "        loss.backward()"
    # The name the snippet imports is the technique's own hooks.
    from gpubench.train import implementations
    from gpubench.train.config import RunConfig

    measured = implementations.Offload(True, RunConfig(model="bert", device="cuda",
                                                       offload=True))
    assert isinstance(measured._offload, implementations.ActivationOffload)


def test_the_snippet_trains_a_model_as_written():
    """The snippet, run as pasted (with a model, loss and loader of the user's), takes
    optimizer steps: its loop is code, not a sketch."""
    config = _config(precision="bf16", optimizer_impl="foreach", offload=True)
    code = snippet(tune.TuneResult("m", "cpu", "cpu", 4, None, "m-fp32", {}, [], [],
                                   {"case_id": "x", "config": config}, [], 0.0, True))
    def build_model():
        torch.manual_seed(0)
        return torch.nn.Linear(8, 2)

    def loader_of(micro):  # three optimizer steps of accum_steps micro-batches
        return [[(torch.randn(micro, 8), torch.randn(micro, 2)) for _ in range(2)]] * 3

    scope = {"build_model": build_model, "loader_of": loader_of,
             "loss_fn": torch.nn.functional.mse_loss}
    assert "torch.autograd.graph.save_on_cpu(pin_memory=False)" in code  # what the CPU ran
    exec(compile(code, "snippet", "exec"), scope)
    assert not torch.equal(build_model().weight, scope["model"].weight)


def test_a_stopped_tune_resumes_from_what_it_measured(tmp_path):
    out = tmp_path / "tune"
    lines = []

    def stop_after_three(line):
        lines.append(line)
        if sum("rung 0 [" in x for x in lines) == 3:
            raise KeyboardInterrupt

    dims = ("optimizer_impl", "micro_batch")
    with pytest.raises(KeyboardInterrupt):
        Tuner("bert", "smoke", "cpu", out, dims=dims, progress=stop_after_three).run()
    kept = json.loads((out / "tune.json").read_text())["rungs"]
    assert len(kept) == 3  # every measured candidate, written as it was measured
    resumed = Tuner("bert", "smoke", "cpu", out, dims=dims, resume=True, progress=QUIET)
    result = resumed.run()
    state = json.loads((out / "tune.json").read_text())
    assert all(state["rungs"][k] == v for k, v in kept.items())  # reused, not re-measured
    assert result.complete and len(result.candidates) == 9
    with pytest.raises(TuneError, match="is a tune of another search"):
        Tuner("bert", "smoke", "cpu", out, dims=("micro_batch",), resume=True, progress=QUIET)
    with pytest.raises(TuneError, match="no tune to continue"):
        Tuner("bert", "smoke", "cpu", tmp_path / "none", resume=True, progress=QUIET)


SYNTHETIC_FACTORS = {"precision": {"bf16": 0.82, "fp16": 1.12},
                     "optimizer_impl": {"foreach": 0.97, "fused": 0.88},
                     "checkpointing": {True: 1.30}}
"""A machine whose step times are known: each changed setting multiplies the baseline's step
time by its factor, and each extra accumulation step adds 6%."""


def _synthetic_step_s(cfg) -> float:
    s = 0.010 * (1 + 0.06 * (cfg.accum_steps - 1))
    for dim, factors in SYNTHETIC_FACTORS.items():
        s *= factors.get(getattr(cfg, dim), 1.0)
    return s


def test_the_search_finds_the_exhaustive_winner_at_a_fraction_of_its_cost(tmp_path,
                                                                           monkeypatch):
    """The tuner's search and the exhaustive sweep, on the configurations of four dimensions,
    measured by the run's own paired rounds (``run_rounds``: ABBA blocks, the stopping rule)
    on a synthetic machine whose step times are known and carry 3% noise, seeded: both find
    the truly fastest configuration, and the search pays at most 45% of the sweep's paired
    rounds (103 of 255: rungs of 2 and 4 rounds, then three finalists confirmed at the
    sweep's 15). The same comparison measured on this machine's steps is
    ``scripts/tune_vs_exhaustive.py`` (a benchmark, not a test: real step times make the
    outcome depend on the machine's load)."""
    import random

    from gpubench.measure.protocol import StoppingRule, run_rounds

    noise = random.Random(0)
    rounds = []
    dims = ("precision", "micro_batch", "optimizer_impl", "checkpointing")
    tuner = Tuner("bert", "smoke", "cpu", tmp_path, dims=dims, ablate=False, progress=QUIET)

    def step(cfg):
        return lambda: _synthetic_step_s(cfg) * noise.lognormvariate(0, 0.03)

    def synthetic(base_case, cfg, n, *, check=False, rule=None):
        measured = run_rounds(step(cfg), rule or StoppingRule(0.0, n, n),
                              base_step=step(tuner.base))
        rounds.append(len(measured.case_s))
        facts = {"training_memory_bytes": 1.0} if check else {}
        return ([b / c for b, c in zip(measured.base_s, measured.case_s, strict=True)],
                measured.base_s, measured.case_s, facts)

    monkeypatch.setattr(tune, "paired_ratios", synthetic)
    space = [c for c in search_space(tuner.base, tuner.global_batch, dims)
             if not tune.unsupported_reason(c)]
    fastest = min(space, key=_synthetic_step_s).id
    result = tuner.run()
    tuned_rounds, rounds[:] = sum(rounds), []
    sweep = tune.exhaustive("bert", "smoke", "cpu", dims=dims, progress=QUIET)
    sweep_rounds = sum(rounds)
    assert sweep["winner"]["case_id"] == fastest
    assert result.winner["case_id"] == fastest, (result.winner, sweep["winner"])
    assert 0 < tuned_rounds <= 0.45 * sweep_rounds, (tuned_rounds, sweep_rounds)


@pytest.mark.parametrize("precision, matmul, cudnn", [
    ("fp32", "highest", "False"), ("tf32", "high", "True"), ("bf16", "highest", "False")])
def test_the_snippets_math_settings_are_the_measured_cases(precision, matmul, cudnn):
    """An fp32 winner ran IEEE float32 convolutions (cuDNN TF32 off, PyTorch's default on):
    the snippet says so, as ``Precision.math_mode`` set them."""
    from gpubench.train.precision import Precision

    code = snippet(tune.TuneResult("bert", "cuda", "gpu-small", 4, None, "bert-fp32", {}, [],
                                   [], {"case_id": "x", "config": _config(precision=precision)},
                                   [], 0.0, True))
    assert f'torch.set_float32_matmul_precision("{matmul}")' in code
    assert f"torch.backends.cudnn.allow_tf32 = {cudnn}" in code
    assert "torch.backends.cudnn.benchmark = True" in code
    assert Precision(precision, "cuda").math_settings() == {
        "float32_matmul_precision": matmul, "cudnn_allow_tf32": cudnn == "True",
        "cudnn_benchmark": True}


def test_the_tuner_pairs_rounds_as_a_run_does(monkeypatch):
    """A candidate's rounds alternate with the baseline's in ABBA blocks, the first step after
    each switch of side untimed (``run_rounds``, the run's own pairing), not one step each: a
    rung of 4 rounds is blocks of 3 timed steps, then of 1, each side."""
    from itertools import groupby

    from gpubench.measure.protocol import StoppingRule
    from gpubench.train.config import RunConfig

    base_case = object()
    calls = []
    monkeypatch.setattr(tune, "_timed",
                        lambda case: calls.append("base" if case is base_case else "case") or 0.01)
    _, base_s, new_s, _ = tune.paired_ratios(base_case, RunConfig(model="bert", profile="smoke"),
                                             4)
    assert len(base_s) == len(new_s) == 4
    blocks = [(side, len(list(run))) for side, run in groupby(calls)]
    # B A | A B: 1+3, 1+3 then 1 (no switch), 1+1
    assert blocks == [("base", 4), ("case", 5), ("base", 2)], blocks
    assert tune.confirm_rule(RunConfig(model="bert", profile="smoke")) == StoppingRule(
        0.0, tune.CONFIRM_ROUNDS, tune.CONFIRM_ROUNDS)  # smoke sets no target: a fixed count
    rule = tune.confirm_rule(RunConfig(model="bert", profile="cpu"))
    assert rule.target_width == 0.02 and rule.min_rounds < tune.CONFIRM_ROUNDS < rule.max_rounds
