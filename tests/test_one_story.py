"""One story on the page, on a real run's results (``tests/data/cpu-run.json``, a frozen CPU
run): one speedup whose samples/s agree with it, the baseline at 1.00x wherever it is shown,
and every lookup of a case's partner (baseline, cold case's warm twin, loader grid) matching it
on every configuration field but those it varies, with decoys beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from records import results_file, step_record  # tests/ on sys.path

from gpubench.analysis.advice import _Cases, advice_markdown
from gpubench.analysis.answer import answer_markdown
from gpubench.analysis.results import load_results, twin, with_baseline_ratios
from gpubench.report.charts import loader_grid
from gpubench.report.summary import storage_markdown, summary_frame, summary_markdown

RUN = Path(__file__).resolve().parent / "data" / "cpu-run.json"


@pytest.fixture(scope="module")
def run() -> pd.DataFrame:
    return load_results([RUN])


def test_every_cases_samples_per_s_over_the_baselines_alongside_is_its_speedup(run):
    frame = summary_frame(run)
    shown = frame.dropna(subset=["speedup"])
    assert len(shown) > 50
    ratio = shown["samples_per_s"] / shown["baseline_samples_per_s"]
    assert (ratio - shown["speedup"]).abs().max() < 1e-9
    # The figure beside each paired case is the baseline's during its own rounds: close to the
    # baseline case's, not equal (the drift between cases measured minutes apart is out).
    ratios = with_baseline_ratios(run[run["step_time_s"].notna()])
    paired = ratios[ratios["speedup_method"] == "paired"]
    drift = paired["baseline_samples_per_s"] / paired["base_samples_per_s"]
    assert drift.between(0.6, 1.6).all() and (drift - 1).abs().max() > 0.01


def test_the_baseline_reads_one_everywhere(run):
    base = summary_frame(run)
    base = base[base["case_id"].isin(["resnet18-fp32", "bert-fp32", "gpt2-fp32"])]
    assert (base["speedup"] == 1.0).all()
    assert all(ci.startswith("baseline") for ci in base["speedup_ci"])
    summary = summary_markdown(run)
    for case in ("resnet18-fp32", "bert-fp32"):
        row = next(line for line in summary.splitlines() if line.startswith(f"| {case} "))
        assert "1.00x" in row and "0.98x" not in row
    answer = answer_markdown(run)
    advice = advice_markdown(run)
    for text in (answer, advice):
        assert "1.00x the FP32 baseline" not in text and "CI 1.00-1.00" not in text
    # The answer and the advice name the same configuration per model.
    chosen = dict(re.findall(r"\*\*(\w+)\*\*: train with \*\*`([^`]+)`", answer))
    recommended = dict(re.findall(r"^- (\w+): `([^`]+)`", advice.split(
        "Recommended configuration")[1], flags=re.M))
    assert chosen and chosen == recommended


def test_the_cold_case_is_read_against_its_warm_twin_not_a_decoy(run):
    """The run holds ``resnet18-bf16-accum4-ddp2-nosync-images-jpeg-w2`` (429 ms a step)
    first: the storage table set the cold w2 case against it, as if cold read 7x faster than
    warm. The twin matches on every field but ``cold``."""
    steps = {r["case_id"]: r["step_time_s"] for _, r in run.iterrows()}
    table = storage_markdown(run)
    row = next(line for line in table.splitlines()
               if line.startswith("| resnet18-fp32-images-jpeg-w2-cold "))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert float(cells[2].replace(",", "")) == pytest.approx(
        steps["resnet18-fp32-images-jpeg-w2"] * 1e3, abs=0.06)
    cold = run[run["case_id"] == "resnet18-fp32-images-jpeg-w2-cold"].iloc[0]
    assert twin(run, cold, vary=("cold",))["case_id"] == "resnet18-fp32-images-jpeg-w2"
    assert twin(run, cold, vary=()) is None  # nothing else is the same configuration


def _file(tmp_path: Path, *records) -> pd.DataFrame:
    return load_results([results_file(tmp_path / "run.json", *records)])


LOADER = {"dataset": "tokens-mmap", "dataset_size": 64}


def test_a_twin_differs_only_in_the_fields_it_varies(tmp_path):
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1, 0.1, 0.1)),
        # decoys first: another precision, optimizer, batch or worker count, read warm
        step_record("bert-bf16-tokens-mmap-w2", (0.5,) * 3, is_baseline=False, precision="bf16",
                    num_workers=2, **LOADER),
        step_record("bert-fp32-adam-tokens-mmap-w2", (0.6,) * 3, is_baseline=False,
                    optimizer="adam", num_workers=2, **LOADER),
        step_record("bert-fp32-mb16-tokens-mmap-w2", (0.7,) * 3, is_baseline=False,
                    micro_batch=16, global_batch=16, num_workers=2, **LOADER),
        step_record("bert-fp32-tokens-mmap", (0.8,) * 3, is_baseline=False, **LOADER),
        step_record("bert-fp32-tokens-mmap-w2", (0.2,) * 3, is_baseline=False, num_workers=2,
                    **LOADER),
        step_record("bert-fp32-tokens-mmap-w2-cold", (0.3,) * 3, is_baseline=False,
                    num_workers=2, cold=True, **LOADER))
    cold = df[df["case_id"] == "bert-fp32-tokens-mmap-w2-cold"].iloc[0]
    assert twin(df, cold, vary=("cold",))["case_id"] == "bert-fp32-tokens-mmap-w2"
    row = next(line for line in storage_markdown(df).splitlines() if "-cold " in line)
    assert "200" in row.split("|")[3]  # the warm twin's 0.2 s
    # The loader chart's points: the baseline's configuration but for the loader's fields.
    assert sorted(loader_grid(df)["case_id"]) == ["bert-fp32-tokens-mmap",
                                                  "bert-fp32-tokens-mmap-w2"]
    # The advice finds cases by configuration the same way.
    cases = _Cases(with_baseline_ratios(df), "bert")
    assert cases.find(num_workers=2, **LOADER)["case_id"] == "bert-fp32-tokens-mmap-w2"


def test_the_baseline_is_a_measured_step_record(tmp_path):
    """Records of other kinds flagged as a baseline (a claim pair's, a transfer's) before the
    real one: every ratio is against the measured baseline step."""
    claim = step_record("bert-fp32", (0.5,) * 3, kind="claim", claim="amp-bf16")
    transfer = step_record("bert-fp32", (0.4,) * 3, kind="transfer")
    df = _file(tmp_path, claim, transfer, step_record("bert-fp32", (0.1,) * 3),
               step_record("bert-bf16", (0.05,) * 3, is_baseline=False, precision="bf16"))
    ratios = with_baseline_ratios(df)
    row = ratios[ratios["case_id"] == "bert-bf16"].iloc[0]
    assert row["base_step_time_s"] == pytest.approx(0.1) and row["speedup"] == pytest.approx(2)


def test_a_new_run_sets_an_earlier_tune_aside(tmp_path):
    from gpubench.cli import main as cli

    out = tmp_path / "out"
    (out / "tune-bert").mkdir(parents=True)
    (out / "tune-bert" / "tune.json").write_text(json.dumps({"result": {}}))
    (out / "benchmark.json").write_text("old")
    (out / "tuned-notes").mkdir()  # not a tune's folder: stays
    assert cli._set_aside_previous(out) == 2
    assert sorted(p.name for p in out.iterdir()) == ["previous", "tuned-notes"]
    assert (out / "previous" / "tune-bert" / "tune.json").exists()


# -- what was not measured is visible ---------------------------------------------------------

def test_a_skipped_case_is_journaled_with_its_reason(tmp_path):
    from types import SimpleNamespace

    from gpubench.measure.journal import Journal, skipped_beside

    json_path = tmp_path / "benchmark.json"
    journal = Journal(None, json_path, {"profile": "smoke"},
                      case_info=lambda item: {"case_id": item.name.split("[")[1][:-1],
                                              "model": "bert"})
    journal.start()
    try:
        item = SimpleNamespace(nodeid="b.py::test_step[bert-fp8]", name="test_step[bert-fp8]")
        report = SimpleNamespace(when="setup", passed=False, failed=False, skipped=True,
                                 longrepr=("b.py", 3, "Skipped: fp8 needs CUDA"))
        journal.record_report(item, report)
    finally:
        journal.close()
    (entry,) = skipped_beside([json_path])
    assert entry["case_id"] == "bert-fp8" and entry["reason"] == "fp8 needs CUDA"
    assert entry["model"] == "bert"


@pytest.mark.slow
def test_the_report_lists_skipped_and_failed_cases_and_links_only_what_it_holds(tmp_path):
    from gpubench.report.page import write_report

    out = tmp_path / "out"
    out.mkdir()
    results = out / "benchmark.json"
    results.write_text(RUN.read_text())
    lines = [{"type": "run", "key": {}}]
    for case, reason in (("bert-fp8", "fp8 needs CUDA"), ("gpt2-fp8", "fp8 needs CUDA"),
                         ("bert-fp32-ddp8", "needs 8 devices, this machine has 1")):
        lines.append({"type": "case", "outcome": "skipped", "nodeid": f"t::{case}",
                      "case_id": case, "reason": reason})
    lines.append({"type": "case", "outcome": "failed", "nodeid": "t::bert-fp16",
                  "case_id": "bert-fp16", "model": "bert", "reason": "RuntimeError: boom",
                  "log": "logs/bert-fp16.log"})
    (out / "cases.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    write_report([results], out)
    md = (out / "report.md").read_text()
    skipped = md.split("## Skipped cases")[1].split("\n## ")[0]
    assert "| fp8 needs CUDA | 2 | `bert-fp8`, `gpt2-fp8` |" in skipped
    assert "| needs 8 devices, this machine has 1 | 1 | `bert-fp32-ddp8` |" in skipped
    assert "| bert-fp16 | bert | RuntimeError: boom | logs/bert-fp16.log |" in md
    # The run holds no parity.md: the advice names it without a link to nowhere.
    assert "(parity.md)" not in md and "`parity.md`" in md
    for link in re.findall(r"\]\(([\w.-]+)\)", md):
        assert (out / link).exists(), link
