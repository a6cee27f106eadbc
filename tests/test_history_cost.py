"""Cost per million samples (and tokens) on round numbers: in summary, compare (and compare across
two machines) and the tune's finalists."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from records import MACHINE, results_file, step_record  # tests/ on sys.path

from gpubench.analysis.compare import compare_main
from gpubench.analysis.cost import Price, cost_per_million, tune_cost, with_cost
from gpubench.analysis.results import load_results
from gpubench.cli.compare import add_compare_arguments
from gpubench.cli.main import main
from gpubench.diagnostics.tune import TuneResult, tune_markdown


def test_cost_arithmetic_on_round_numbers():
    # 3.60 per machine-hour is 0.001 per second; at 1000 samples/s a sample costs 1e-6, a
    # million samples 1.00; 16 tokens per sample: a million tokens 1/16.
    samples, tokens = cost_per_million(1000.0, Price.parse("3.6"), tokens=16)
    assert samples == pytest.approx(1.0) and tokens == pytest.approx(0.0625)
    # per GPU: 2 per GPU-hour on 4 GPUs is 8 per hour; 8 / 3600 / 1000 * 1e6 = 2.222...
    samples, tokens = cost_per_million(1000.0, Price.parse("2/gpu"), gpus=4)
    assert samples == pytest.approx(20 / 9) and math.isnan(tokens)
    assert Price.parse("2.5/machine") == Price(2.5, False)
    for bad in ("-1", "abc", "2/tpu", "0"):
        with pytest.raises(ValueError, match=f"expected a positive price per hour.*{bad!r}"):
            Price.parse(bad)


def test_with_cost_counts_gpus_and_tokens_from_the_records(tmp_path):
    df = load_results([results_file(
        tmp_path / "r.json",
        step_record("bert-fp32", rounds=(0.008,) * 3, is_baseline=True),  # 8 / 0.008 = 1000/s
        step_record("bert-fp32-ddp4", rounds=(0.008,) * 3, device="cuda", world_size=4,
                    global_batch=8))])
    df = with_cost(df, Price.parse("3.6/gpu"))
    single, ddp = df["cost_per_m_samples"]
    assert single == pytest.approx(1.0) and ddp == pytest.approx(4.0)
    assert df["cost_per_m_tokens"].iloc[0] == pytest.approx(1 / 16)  # bert: [8, 16] inputs


def test_summary_prints_cost_with_its_unit(tmp_path, capsys):
    path = results_file(tmp_path / "r.json",
                        step_record("bert-fp32", rounds=(0.008,) * 3, is_baseline=True))
    assert main(["summary", str(path), "--price-per-hour", "3.6"]) == 0
    out = capsys.readouterr().out
    assert "cost per 1M samples (at 3.6/machine-hour)" in out
    assert "cost per 1M tokens (at 3.6/machine-hour)" in out and " 0.0625 |" in out


def _args(*argv):
    p = argparse.ArgumentParser()
    add_compare_arguments(p)
    return p.parse_args(list(argv))


def test_two_machines_are_compared_per_case_without_a_regression_call(tmp_path, capsys):
    other = json.loads(json.dumps(MACHINE))
    other["gpubench"].update(device_name="Intel Xeon 8480", cpu="Intel Xeon 8480")
    other["cpu"]["brand_raw"] = "Intel Xeon 8480"
    base = results_file(tmp_path / "a.json",
                        step_record("bert-fp32", rounds=(0.008,) * 5, is_baseline=True),
                        step_record("bert-bf16", rounds=(0.004,) * 5, is_baseline=False,
                                    precision="bf16"))
    new = results_file(tmp_path / "b.json",
                       step_record("bert-fp32", rounds=(0.016,) * 5, is_baseline=True),
                       step_record("bert-bf16", rounds=(0.016,) * 5, is_baseline=False,
                                   precision="bf16"), machine=other)
    code = compare_main(_args(str(base), str(new), "--price-per-hour", "3.6",
                              "--price-per-hour", "1.8"))
    out = capsys.readouterr().out
    assert code == 0  # twice slower, but another machine: not a regression
    assert "A (base): AMD EPYC" in out and "B (new): Intel Xeon 8480" in out
    row = next(line for line in out.splitlines() if line.startswith("| bert-bf16"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # speedup vs own FP32: 2x on A, 1x on B; throughput B / A: 0.25x; cost per 1M samples
    # on A 3.6 / 3600 / 2000 * 1e6 = 0.5, on B 1.8 / 3600 / 500 * 1e6 = 1.0
    assert cells[1:4] == ["2.00x", "1.00x", "2000.0"] and cells[5] == "0.25x"
    assert "cost per 1M samples (at 3.6/machine-hour) on A" in out
    assert cells[6] == "0.5" and cells[8] == "1"
    with pytest.raises(ValueError, match="once per file"):
        compare_main(_args(str(base), str(new), "--price-per-hour", "1", "--price-per-hour",
                           "2", "--price-per-hour", "3"))

    with pytest.raises(SystemExit) as bad:  # the command line's type: argparse's one line
        _args(str(base), str(new), "--price-per-hour", "2/tpu")
    assert bad.value.code == 2


def _tune(name: str = "bert", shape=(36, 16)) -> TuneResult:
    """A tune of global batch 36: the winner's step 0.018 s (2000 samples/s), the baseline's
    0.036 s (1000 samples/s); one finalist failed its check."""
    config = {"precision": "bf16", "micro_batch": 36, "accum_steps": 1, "checkpointing": False,
              "optimizer_impl": "default", "channels_last": False, "compile": False,
              "optimizer": "adam", "compile_mode": "default"}
    winner = {"case_id": f"{name}-bf16", "check": "passed", "speedup": 2.0, "low": 1.9,
              "high": 2.1, "p_value": 0.001, "step_time_s": 0.018,
              "baseline_step_time_s": 0.036}
    failed = {"case_id": f"{name}-fp16", "check": "failed: loss did not decrease"}
    return TuneResult(name, "cpu", "cpu", 36, None, f"{name}-fp32",
                      {"bound": "compute", "optimizer_share": 0.1, "predictions": {}}, [],
                      [winner, failed], {**winner, "config": config}, [], 1.0, True,
                      name=name, input_shape=list(shape), baseline_step_time_s=0.036)


def test_tune_cost_on_round_numbers():
    cost = tune_cost(_tune(), Price.parse("3.6"))
    # 3.6 per hour is 0.001 per second: at 1000 samples/s a million samples cost 1.00, at
    # 2000 samples/s 0.50; 16 tokens per sample: a million tokens 1/16 and 1/32.
    base, win = cost["cases"]["bert-fp32"], cost["cases"]["bert-bf16"]
    assert base["samples_per_s"] == pytest.approx(1000) and win["samples_per_s"] == (
        pytest.approx(2000))
    assert base["cost_per_m_samples"] == pytest.approx(1.0)
    assert win["cost_per_m_samples"] == pytest.approx(0.5)
    assert base["cost_per_m_tokens"] == pytest.approx(0.0625)
    assert win["cost_per_m_tokens"] == pytest.approx(0.03125)
    assert "bert-fp16" not in cost["cases"]  # failed its check: no throughput to price
    json.dumps(cost, allow_nan=False)  # tune.json keeps it as it is
    # the tune runs on one device: a per-GPU price counts one GPU
    per_gpu = tune_cost(_tune(), Price.parse("3.6/gpu"))
    assert per_gpu["cases"]["bert-bf16"]["cost_per_m_samples"] == pytest.approx(0.5)
    # not a language model: per sample only
    image = tune_cost(_tune("resnet18", (36, 3, 32, 32)), Price.parse("7.2"))
    assert image["tokens_header"] is None
    assert image["cases"]["resnet18-bf16"]["cost_per_m_samples"] == pytest.approx(1.0)
    assert image["cases"]["resnet18-bf16"]["cost_per_m_tokens"] is None


def test_tune_md_ranks_the_finalists_with_their_cost_and_its_unit():
    result = _tune()
    md = tune_markdown(result, tune_cost(result, Price.parse("3.6")))
    assert ("At 3.6/machine-hour, the winner costs 0.5 per million samples (0.03125 per "
            "million tokens); the baseline 1 per million samples (0.0625 per million "
            "tokens).") in md
    table = md.split("## Confirmed finalists")[1].split("\n\n")[1].splitlines()
    assert table[0] == ("| case | check | speedup | 95% CI | training memory | predicted | "
                        "samples/s | cost per 1M samples (at 3.6/machine-hour) | cost per 1M "
                        "tokens (at 3.6/machine-hour) |")
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in table[2:]}
    assert rows["bert-fp32 (the baseline)"][6:] == ["1,000.0", "1", "0.0625"]
    assert rows["bert-bf16 (the winner)"][6:] == ["2,000.0", "0.5", "0.03125"]
    assert rows["bert-fp16"][6:] == ["-", "-", "-"]
    assert "cost per 1M" not in tune_markdown(result)  # no price: no cost


def test_tune_takes_the_price_as_summary_and_compare_do(capsys):
    with pytest.raises(SystemExit) as bad:
        main(["tune", "--model", "bert", "--price-per-hour", "abc"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert "argument --price-per-hour: expected a positive price per hour" in err
    assert err.count("\n") <= 3  # usage and one line
