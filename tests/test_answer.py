"""The answer first: per model, the configuration to train with (the tuner's winner, or the
recommendation with its reason), each faster configuration with why it was not chosen, and
the mark of a case that changes the effective batch wherever cases are ranked."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from gpubench.analysis.answer import answer_markdown, tune_reports_beside
from gpubench.analysis.recommend import recommend
from gpubench.analysis.results import batch_mark, with_baseline_ratios

RNG = np.random.default_rng(1)


def _row(case_id, median, *, noise=0.01, rounds=20, global_batch=8, **extra):
    data = list(median * np.exp(RNG.normal(0, noise, rounds)))
    return {
        "run": "r", "model": "bert", "profile": "cpu", "device": "cpu", "case_id": case_id,
        "is_baseline": case_id == "bert-fp32", "step_time_s": float(np.median(data)),
        "rounds_s": data, "global_batch": global_batch, "micro_batch": 8,
        "samples_per_s": global_batch / float(np.median(data)), "parallel": "single",
        "world_size": 1, "precision": "fp32", "accum_steps": global_batch // 8,
        "dataset": "device-resident", "group": "precision", "peak_memory_bytes": 1000.0,
        "activation_bytes": 500, "param_bytes": 0, "grad_bytes": 100,
        "optimizer_state_bytes": 100, "optimizer": "sgd", "optimizer_impl": "default",
        "checkpointing": False, "channels_last": False, "compile": False, "mfu": 0.1, **extra}


@pytest.fixture
def frame():
    return pd.DataFrame([
        _row("bert-fp32", 1.0),
        _row("bert-fp32-sgd_fused", 0.9, optimizer_impl="fused", group="optimizer"),
        # Faster still, but its rounds are too spread to tell from the baseline's.
        {**_row("bert-bf16", 0.8, precision="bf16"), "rounds_s": [0.3, 1.5, 0.8, 0.6, 1.3]},
        # Faster per sample, at 4x the effective batch: another recipe.
        _row("bert-fp32-accum4", 3.0, global_batch=32, group="accumulation"),
        # TF32 on a CPU is FP32: a "gain" is noise.
        _row("bert-tf32", 0.85, precision="tf32"),
        # Over the budget given below.
        _row("bert-fp32-sgd_foreach", 0.7, optimizer_impl="foreach",
             peak_memory_bytes=5000.0),
    ])


def test_the_recommendation_says_why_and_why_not_each_faster_one(frame):
    (rec,) = recommend(frame, budget_bytes=2000)
    assert rec.case_id == "bert-fp32-sgd_fused" and not rec.is_baseline
    assert "fastest of" in rec.reason
    why = {p.case_id: p.why for p in rec.passed_over}
    assert set(why) == {"bert-bf16", "bert-fp32-accum4", "bert-tf32", "bert-fp32-sgd_foreach"}
    assert why["bert-bf16"].startswith("not significant")
    assert "effective batch 32 vs 8" in why["bert-fp32-accum4"]
    assert "does nothing on this device" in why["bert-tf32"]
    assert "over the budget" in why["bert-fp32-sgd_foreach"]
    factors = {p.case_id: p.batch_factor for p in rec.passed_over}
    assert factors["bert-fp32-accum4"] == 4 and factors["bert-bf16"] == 1
    speeds = [p.speedup for p in rec.passed_over]
    assert speeds == sorted(speeds, reverse=True) and min(speeds) > rec.speedup


def test_the_answer_names_the_choice_and_marks_a_changed_batch(frame):
    text = answer_markdown(frame, budget_bytes=2000)
    first = text.splitlines()[0]
    assert first.startswith("**bert**: train with **`bert-fp32-sgd_fused`**")
    assert "`bert-fp32-accum4` [batch x4]" in text and "[batch xN]" in text
    assert "`bert-bf16`" in text and "`bert-bf16` [batch" not in text  # same batch: no mark
    assert "gpubench tune --model" in text  # no tune yet: how to get one


def test_with_only_the_baseline_the_answer_says_nothing_beat_it():
    df = pd.DataFrame([_row("bert-fp32", 1.0), _row("bert-fp32-x", 1.2, group="optimizer",
                                                     optimizer_impl="fused")])
    (rec,) = recommend(df)
    assert rec.is_baseline and rec.passed_over == ()
    assert "the FP32 baseline: no configuration" in answer_markdown(df)


FINGERPRINT = {"cpu": "AMD EPYC", "cpu_count": 2, "device": "cpu", "device_name": "AMD EPYC",
               "device_count": 1, "driver": None, "node": "vm",
               "libraries": {"torch": "2.14.1", "transformers": "5.24.0"},
               "commit": "c0b9e2eefb95", "date": "2026-12-03T10:01:23+00:00"}


def test_a_tune_beside_the_results_answers_for_its_model(frame, tmp_path):
    frame = frame.assign(fingerprint=[FINGERPRINT] * len(frame))
    results = tmp_path / "benchmark.json"
    results.write_text("{}")
    folder = tmp_path / "tune-bert"
    folder.mkdir()
    winner = {"case_id": "bert-bf16-sgd_fused", "speedup": 1.31, "low": 1.2, "high": 1.4}
    (folder / "tune.json").write_text(json.dumps({"result": {
        "name": "bert", "model": "bert", "profile": "cpu", "device": "cpu", "global_batch": 8,
        "baseline": "bert-fp32", "winner": winner, "candidates": [{"rounds": 2}] * 5,
        "fingerprint": {**FINGERPRINT, "date": "2026-12-01T08:00:00+00:00"}}}))
    (tmp_path / "tune-other").mkdir()
    (tmp_path / "tune-other" / "tune.json").write_text("{not json")  # passed over
    tunes = tune_reports_beside([results])
    assert [t["winner"]["case_id"] for t in tunes] == ["bert-bf16-sgd_fused"]
    text = answer_markdown(frame, tunes, budget_bytes=2000, base=tmp_path)
    assert "train with **`bert-bf16-sgd_fused`**: 1.31x" in text
    assert "Measured by the tune on AMD EPYC (2 CPUs), torch 2.14.1" in text
    assert "2026-12-01" in text  # when
    assert "[tune-bert/tune.md](tune-bert/tune.md)" in text
    # The run's own recommendation differs: the page says so, and why, in one line.
    assert "This run's own cases alone point to `bert-fp32-sgd_fused`" in text
    # The advice's recommended configuration is the same decision.
    from gpubench.analysis.advice import advice_markdown

    advice = advice_markdown(frame, 2000, tunes=tunes)
    assert "- bert: `bert-bf16-sgd_fused`, 1.31x" in advice
    # A tune from another machine, or with other library versions, or one that records no
    # machine at all, is named as such and does not answer.
    for other in ({**FINGERPRINT, "cpu": "Intel Xeon", "device_name": "Intel Xeon"},
                  {**FINGERPRINT, "libraries": {"torch": "2.9.0", "transformers": "5.24.0"}},
                  None):
        elsewhere = [{**tunes[0], "fingerprint": other}]
        text = answer_markdown(frame, elsewhere, budget_bytes=2000, base=tmp_path)
        assert text.startswith("**bert**: train with **`bert-fp32-sgd_fused`**")
        assert "Measured in this run on AMD EPYC" in text.splitlines()[0]
        assert ("A tune of bert from elsewhere is beside these results "
                "(`tune-bert/tune.json`") in text
        assert "`bert-bf16-sgd_fused` (1.31x there) is not this run's answer (" in text
        advice = advice_markdown(frame, 2000, tunes=elsewhere)
        assert "- bert: `bert-fp32-sgd_fused`, " in advice and "bf16" not in advice.split(
            "Recommended configuration")[1]
    assert "Intel Xeon" in answer_markdown(frame, [{**tunes[0], "fingerprint": {
        **FINGERPRINT, "cpu": "Intel Xeon", "device_name": "Intel Xeon"}}])
    assert "records no machine" in answer_markdown(frame, [{**tunes[0], "fingerprint": None}])
    # Another profile's tune, or one at another global batch, does not answer for this one.
    text = answer_markdown(frame, [{**tunes[0], "global_batch": 64}])
    assert "train with **`bert-bf16" not in text
    assert "not this run's answer (tuned at global batch 64, this run's is 8)" in text
    tunes[0]["profile"] = "gpu-small"
    text = answer_markdown(frame, tunes)
    assert "train with **`bert-bf16" not in text and "tuned in profile gpu-small" in text


def test_the_batch_mark_and_the_summary_column():
    assert batch_mark(4.0) == " [batch x4]" and batch_mark(0.5) == " [batch x0.5]"
    assert batch_mark(1.0) == batch_mark(float("nan")) == batch_mark(None) == ""
    from gpubench.report.summary import summary_frame, summary_markdown

    df = pd.DataFrame([_row("bert-fp32", 1.0), _row("bert-fp32-accum4", 3.0, global_batch=32)])
    assert list(with_baseline_ratios(df)["batch_factor"]) == [1.0, 4.0]
    frame = summary_frame(df).set_index("case_id")  # numbers (gpubench summary --csv)
    assert frame.loc["bert-fp32-accum4", ["global_batch", "batch_factor"]].tolist() == [32, 4]
    rows = {line.split("|")[1].strip(): line for line in summary_markdown(df).splitlines()
            if line.startswith("| bert-")}
    assert re.search(r"\|\s*32 \(x4\)\s*\|", rows["bert-fp32-accum4"])


def test_the_speedup_chart_marks_a_changed_batch():
    import matplotlib.pyplot as plt

    from gpubench.report.charts import plot_speedup

    df = pd.DataFrame([_row("bert-fp32", 1.0), _row("bert-fp32-accum4", 3.0, global_batch=32,
                                                    group="accumulation")])
    fig = plot_speedup(df)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["fp32-accum4 [batch x4]", "fp32"]
    assert "[batch xN]" in ax.get_xlabel()
    plt.close(fig)


def test_the_page_opens_with_the_answer_above_its_contents():
    from gpubench.report.page import Section, render_html

    html = render_html("t", [Section("answer", "The answer: what to train with", "**x**\n"),
                             Section("runs", "Runs", "table\n")], {})
    assert html.index('id="answer"') < html.index("Contents") < html.index('id="runs"')
