"""Convergence parity: the same weights and data for every technique, FP32 against itself within
its tolerance (bit-identical on the CPU), a deliberately broken technique outside it, the
verdict row in the advice, and one-line errors for bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from gpubench.analysis.parity import CLAIM, TOLERANCE, judge, load_parity_reports
from gpubench.cli.main import main
from gpubench.diagnostics.parity import (
    DataPlan,
    OverBudget,
    ParityProgram,
    run_parity,
    technique_config,
    train_technique,
)
from gpubench.train import parallel
from gpubench.train.config import RunConfig
from gpubench.util.verdicts import Kind

STEPS = 80  # bert smoke: FP32 falls from 2.30 to about 0.45 (the task is learned)


@pytest.fixture(autouse=True, scope="module")
def _one_thread_for_the_module():
    # These tests train for tens of steps: on a shared 2-core machine two threads per step
    # contend with everything else (10x slower under load); the losses do not need them.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _one_thread():  # after conftest's per-test setting
    torch.set_num_threads(1)


def _run(techniques, steps=STEPS):
    return judge(run_parity("bert", "smoke", "cpu", techniques, steps))


def _by_name(report):
    return {r["technique"]: r for r in report["techniques"]}


@pytest.fixture(scope="module")
def raw_report():
    """FP32, a second FP32 run and correct k = 4 accumulation, unjudged."""
    return run_parity("bert", "smoke", "cpu", ["fp32-repeat", "accum4"], STEPS)


def test_techniques_split_the_same_global_batch():
    base = RunConfig(model="bert", profile="smoke")
    assert technique_config(base, "fp32") == base
    accum = technique_config(base, "accum4")
    ddp = technique_config(base, "ddp2")
    assert (accum.accum_steps, accum.micro_batch, accum.global_batch) == (4, 1, 4)
    assert (ddp.world_size, ddp.micro_batch, ddp.global_batch) == (2, 2, 4)
    with pytest.raises(ValueError, match="technique must be one of fp32, fp32-repeat.*'fp8'"):
        technique_config(base, "fp8")
    # resnet18 (BatchNorm: micro-batches of at least 2) at a global batch of 4 cannot split in 4
    small = RunConfig(model="resnet18", profile="smoke", micro_batch=4)
    with pytest.raises(ValueError, match="does not split into 4 micro-batches of at least 2"):
        technique_config(small, "accum4")


def test_every_rank_and_micro_batch_sees_its_share_of_the_same_samples():
    base = RunConfig(model="bert", profile="smoke")
    plan = DataPlan(base.resolved_micro_batch)
    whole = ParityProgram(0, 1, base, plan)
    split = ParityProgram(0, 1, technique_config(base, "accum4"), plan)
    assert whole.digest() == split.digest()  # the same initial weights
    for b in range(plan.batches):
        (inputs, targets), = whole.steps[b]
        assert len(split.steps[b]) == 4
        assert torch.equal(inputs, torch.cat([i for i, _ in split.steps[b]]))
        assert torch.equal(targets, torch.cat([t for _, t in split.steps[b]]))
    assert not torch.equal(whole.steps[0][0][1], whole.steps[1][0][1])  # 4 different batches


def test_fp32_matches_itself_and_correct_accumulation_holds(raw_report):
    report = judge(json.loads(json.dumps(raw_report)))
    runs = _by_name(report)
    assert report["reference_learned"]
    assert report["reference_final_loss"] < 0.5 * report["initial_loss"]
    repeat = runs["fp32-repeat"]
    assert repeat["bit_identical"] and repeat["gap"] == 0 and repeat["verdict"] == "holds"
    accum = runs["accum4"]
    assert accum["case_id"] == "bert-fp32-accum4-mb1"
    assert abs(accum["gap"]) <= TOLERANCE and accum["verdict"] == "holds"
    assert len({r["initial_weights"] for r in report["techniques"]}) == 1


def test_accumulation_without_dividing_the_loss_by_k_fails_parity(raw_report, monkeypatch):
    def undivided(self, model, inputs, targets, precision, accum_steps):
        with precision.autocast():
            loss = model(inputs, targets)  # the bug: not divided by accum_steps
        precision.backward(loss)
        return (loss / accum_steps).detach()

    monkeypatch.setattr(parallel.Single, "forward_backward", undivided)
    base = RunConfig(model="bert", profile="smoke")
    broken = train_technique(technique_config(base, "accum4"), DataPlan(4), STEPS)
    fp32 = _by_name(raw_report)["fp32"]
    report = judge({**raw_report, "techniques": [
        fp32, {**broken, "technique": "accum4", "description": "broken"}]})
    broken = _by_name(report)["accum4"]
    assert broken["initial_weights"] == fp32["initial_weights"]
    assert abs(broken["gap"]) > TOLERANCE and broken["verdict"] == "does not hold"


def test_too_few_steps_to_learn_is_inconclusive():
    runs = _by_name(_run(["fp32-repeat"], steps=8))
    assert runs["fp32-repeat"]["verdict"] == "inconclusive"
    assert "raise --steps" in runs["fp32-repeat"]["reason"]


def test_a_run_projected_over_its_budget_stops_after_its_probe_steps():
    base = RunConfig(model="bert", profile="smoke")
    with pytest.raises(OverBudget, match="s per step here, about .* for 1000 steps"):
        train_technique(base, DataPlan(base.resolved_micro_batch), 1000, budget_s=1e-6)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity")
    code = main(["parity", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                 "--techniques", "bf16", "--steps", str(STEPS), "--out", str(out)])
    assert code == 0
    return out


def test_cli_writes_json_markdown_and_chart(cli_run):
    report = json.loads((cli_run / "parity.json").read_text())
    assert [r["technique"] for r in report["techniques"]] == ["fp32", "bf16"]
    assert len(report["techniques"][1]["losses"]) == STEPS
    assert report["tolerance"] == TOLERANCE
    text = (cli_run / "parity.md").read_text()
    assert "| bf16" in text and CLAIM in text
    assert (cli_run / "parity.png").stat().st_size > 5000
    assert (cli_run / "parity.svg").exists()


def _results(tmp_path):
    row = {"run": "r", "model": "bert", "profile": "smoke", "device": "cpu",
           "case_id": "bert-fp32", "workload": "bert", "is_baseline": True,
           "step_time_s": 0.01, "rounds_s": [0.01] * 6, "global_batch": 4, "micro_batch": 4,
           "samples_per_s": 400.0, "parallel": "single", "world_size": 1, "precision": "fp32",
           "accum_steps": 1, "dataset": "device-resident", "group": "precision",
           "peak_memory_bytes": 1000.0, "activation_bytes": 500, "param_bytes": 0,
           "grad_bytes": 100, "optimizer_state_bytes": 100, "num_workers": 0,
           "cached": False, "optimizer": "sgd", "optimizer_impl": "default",
           "zero_grad_set_to_none": True, "empty_cache": False, "checkpointing": False,
           "channels_last": False, "compile": False, "pin_memory": False,
           "non_blocking": False, "ddp_no_sync": False}
    return pd.DataFrame([row])


def test_advice_row_from_parity_json_and_without_it(cli_run, tmp_path):
    from gpubench.analysis.advice import advise

    df = _results(tmp_path)
    missing = next(v for v in advise(df) if v.claim == CLAIM)
    assert missing.verdict == "inconclusive"
    assert "gpubench parity --model bert" in missing.why
    reports = load_parity_reports([cli_run / "parity.json"])
    row = next(v for v in advise(df, parity_reports=reports) if v.claim == CLAIM)
    bf16 = _by_name(reports[0])["bf16"]
    assert row.verdict == ("holds" if abs(bf16["gap"]) <= TOLERANCE else "does not hold")
    assert "bf16" in row.measured and "fp32" in row.measured
    # a broken part turns the claim's verdict
    broken = json.loads(json.dumps(reports[0]))
    _by_name(broken)["bf16"]["verdict"] = "does not hold"
    row = next(v for v in advise(df, parity_reports=[broken]) if v.claim == CLAIM)
    assert row.verdict == "does not hold"


def test_advise_picks_up_parity_json_beside_the_results(cli_run, tmp_path):
    import gpubench.cli.main as cli

    results = tmp_path / "benchmark.json"
    results.write_text("{}")
    (tmp_path / "parity.json").write_text((cli_run / "parity.json").read_text())
    args = cli.build_parser().parse_args(["advise", "--results", str(results)])
    assert args.parity is None
    found = cli.parity_reports(args, [results])
    assert [r["model"] for r in found] == ["bert"]


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["parity", "--model", "bert", "--techniques", "fp32,fp8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "fp8" in err and "fp32, fp32-repeat, bf16, fp16, accum4, ddp2" in err
    with pytest.raises(SystemExit) as exit_:
        main(["parity", "--model", "bert", "--steps", "0"])
    assert exit_.value.code == 2
    assert "expected an integer >= 1; got '0'" in capsys.readouterr().err
    bad = tmp_path / "parity.json"
    bad.write_text('{"kind": "memory"}')
    from gpubench.analysis.results import ResultsError

    with pytest.raises(ResultsError, match="parity.json: not a gpubench parity.json"):
        load_parity_reports([bad])


@pytest.mark.slow
def test_ddp_over_two_ranks_trains_the_same_curve():
    """DDP ranks (gloo, worker processes) start from the same weights and, each on its half of
    the global batch, average to FP32's gradient: the curves agree within the tolerance."""
    runs = _by_name(_run(["ddp2"]))
    ddp = runs["ddp2"]
    assert ddp["case_id"] == "bert-fp32-mb2-ddp2"
    assert set(ddp["rank_initial_weights"]) == {runs["fp32"]["initial_weights"]}
    assert ddp["verdict"] == "holds" and abs(ddp["gap"]) < 1e-3


def test_run_parity_for_writes_a_list_and_a_chart_per_model(tmp_path):
    """What ``gpubench run --parity`` writes beside the results: parity.json as a list (one
    report per model), parity-<model>.png, and the advice's chart column naming it."""
    from gpubench.analysis.advice import advise
    from gpubench.cli.parity import run_parity_for

    run_parity_for(["bert"], "smoke", "cpu", tmp_path, steps=STEPS, techniques=["accum4"])
    data = json.loads((tmp_path / "parity.json").read_text())
    assert isinstance(data, list) and [r["model"] for r in data] == ["bert"]
    assert (tmp_path / "parity-bert.png").stat().st_size > 5000
    reports = load_parity_reports([tmp_path / "parity.json"])
    row = next(v for v in advise(_results(tmp_path), parity_reports=reports) if v.claim == CLAIM)
    assert row.verdict == "holds" and row.chart == "parity.md"


@pytest.mark.slow
def test_report_shows_the_parity_beside_the_results(cli_run, tmp_path):
    """A report of results with a parity.json beside them: the accuracy verdict from it, a
    convergence section with the table, and the chart embedded in the HTML page."""
    import shutil
    from pathlib import Path

    from gpubench.report.page import write_report

    committed = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run
    data = json.loads(committed.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"]
                          if (b.get("extra_info") or {}).get("model") == "bert"]
    src = tmp_path / "benchmark.json"
    src.write_text(json.dumps(data))
    for name in ("parity.json", "parity.png"):
        shutil.copy(cli_run / name, tmp_path / name)
    write_report([src], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Convergence parity: loss curves against FP32" in text
    rows = [line for line in text.splitlines() if CLAIM in line and line.startswith("|")]
    assert rows and all("not measured" not in row for row in rows)
    html = (tmp_path / "report" / "report.html").read_text()
    assert 'src="parity.png"' not in html and html.count("data:image/png;base64") >= 2


def test_run_parity_for_passes_over_records_without_a_model_and_warns_on_failure(tmp_path):
    """``gpubench run --parity`` gets the models of its records: a missing one (NaN) is passed
    over, a failing one is a warning, and parity.json is still a (here empty) list."""
    from gpubench.cli.parity import run_parity_for

    with pytest.warns(UserWarning, match="convergence parity of bert failed: ValueError: steps"):
        run_parity_for([float("nan"), "bert"], "smoke", "cpu", tmp_path, steps=0)
    assert json.loads((tmp_path / "parity.json").read_text()) == []
    assert load_parity_reports([tmp_path / "parity.json"]) == []


def test_a_tuned_configuration_trains_beside_fp32_at_the_tunes_global_batch():
    """``gpubench tune --parity``: the winner (any configuration, here micro-batch 2 x 2
    accumulation steps with the fused optimizer) trains from FP32's weights on FP32's data, at the
    global batch the tune kept, and is judged like a named technique; a configuration of
    another global batch is refused in one line."""
    base = RunConfig(model="bert", profile="smoke", device="cpu")
    tuned = base.with_(micro_batch=2, accum_steps=2, optimizer_impl="fused")
    report = judge(run_parity("bert", "smoke", "cpu", ["fp32"], STEPS, extra={"tuned": tuned},
                              micro_batch=4))
    runs = {r["technique"]: r for r in report["techniques"]}
    assert set(runs) == {"fp32", "tuned"} and report["global_batch"] == 4
    assert runs["tuned"]["case_id"] == tuned.id
    assert runs["tuned"]["initial_weights"] == runs["fp32"]["initial_weights"]
    assert runs["tuned"]["verdict"] == Kind.HOLDS, runs["tuned"]
    with pytest.raises(ValueError, match="global batch of 4, the reference 8"):
        run_parity("bert", "smoke", "cpu", ["fp32"], STEPS, extra={"tuned": tuned},
                   micro_batch=8)
