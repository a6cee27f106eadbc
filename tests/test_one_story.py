"""One story on the page, on a real run's results (``tests/data/cpu-run.json``, a frozen CPU
run): one speedup whose samples/s agree with it, the baseline at 1.00x wherever it is shown,
and every lookup of a case's partner (baseline, cold case's warm twin, loader grid, the
accumulation chart's points, a parallel case's single-device case, a claim's two sides and its
interleaved pair, the advice's accumulation, DDP, loader and storage cases) matching it on
every configuration field but those it varies, with decoys beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from records import results_file, step_record  # tests/ on sys.path

from gpubench.analysis.advice import _Cases, advice_markdown
from gpubench.analysis.advice.loader import check_loader_workers, check_storage
from gpubench.analysis.advice.parallel import check_ddp
from gpubench.analysis.advice.speed import check_accumulation
from gpubench.analysis.answer import answer_markdown
from gpubench.analysis.results import load_results, twin, with_baseline_ratios
from gpubench.report.charts import accumulation_points, loader_grid, scaling_points
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


def _grouped(group: str, record: dict) -> dict:
    """``record`` as a case of the technique group ``group`` (its ``group`` field)."""
    record["extra_info"]["group"] = group
    return record


def test_the_accumulation_chart_draws_the_baselines_configuration_only(tmp_path):
    """Every point is the baseline but for k and the micro-batch: accumulation cases of
    another precision, optimizer, layout, loader, compile or world size stay off its lines."""
    accum = {"accum_steps": 4, "is_baseline": False}
    quarter = {**accum, "micro_batch": 2}
    df = _file(
        tmp_path,
        _grouped("precision", step_record("bert-fp32", (0.1,) * 3)),
        # decoys first, each another configuration in one field
        _grouped("accumulation", step_record("bert-bf16-accum4-mb2", (0.3,) * 3,
                                             precision="bf16", **quarter)),
        _grouped("accumulation", step_record("bert-fp32-adam-accum4-mb2", (0.3,) * 3,
                                             optimizer="adam", **quarter)),
        _grouped("accumulation", step_record("bert-fp32-cl-accum4", (0.3,) * 3,
                                             channels_last=True, global_batch=32, **accum)),
        _grouped("accumulation", step_record("bert-fp32-accum4-tokens-mmap", (0.3,) * 3,
                                             global_batch=32, **accum, **LOADER)),
        _grouped("accumulation", step_record("bert-fp32-compile-accum4-mb2", (0.3,) * 3,
                                             compile=True, **quarter)),
        _grouped("accumulation", step_record("bert-fp32-accum4-mb2-ddp2", (0.3,) * 3,
                                             parallel="ddp", world_size=2, global_batch=16,
                                             **quarter)),
        _grouped("accumulation", step_record("bert-fp32-accum4-mb2", (0.2,) * 3, **quarter)),
        _grouped("accumulation", step_record("bert-fp32-accum4", (0.4,) * 3, global_batch=32,
                                             **accum)))
    points = accumulation_points(df)
    lines = {mode: sorted(g["case_id"]) for mode, g in points.groupby("mode")}
    assert lines == {
        "constant effective batch (smaller micro-batches)": ["bert-fp32", "bert-fp32-accum4-mb2"],
        "constant micro-batch (larger effective batch)": ["bert-fp32", "bert-fp32-accum4"]}


def test_a_parallel_case_scales_against_its_own_single_device_case(tmp_path):
    """The scaling table's efficiency and the chart's world-size-1 point read the same
    configuration on one device: not a record of another kind under its case id, nor a
    single-device case of another precision, optimizer or micro-batch listed first."""
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.5,) * 3, kind="transfer", workload="bert",
                    samples_per_s=10.0),
        step_record("bert-bf16", (0.05,) * 3, is_baseline=False, precision="bf16",
                    samples_per_s=160.0),
        step_record("bert-fp32-adam", (0.05,) * 3, is_baseline=False, optimizer="adam",
                    samples_per_s=160.0),
        step_record("bert-fp32-mb16", (0.05,) * 3, is_baseline=False, micro_batch=16,
                    global_batch=16, samples_per_s=160.0),
        step_record("bert-fp32", (0.1,) * 3, samples_per_s=80.0),
        step_record("bert-fp32-ddp2", (0.1,) * 3, is_baseline=False, parallel="ddp",
                    world_size=2, global_batch=16, samples_per_s=120.0,
                    single_case_id="bert-fp32"))
    row = with_baseline_ratios(df).set_index("case_id").loc["bert-fp32-ddp2"]
    assert row["single_samples_per_s"] == pytest.approx(80.0)
    assert row["scaling_efficiency"] == pytest.approx(120.0 / (2 * 80.0))
    points = scaling_points(df[df["kind"] == "step"])
    line = points[points["line"] == "fp32-ddp"].set_index("world_size")["samples_per_s"]
    assert line.to_dict() == pytest.approx({1: 80.0, 2: 120.0})


def _claim(name: str, base: str, new: str, base_s: float, new_s: float) -> dict:
    """An interleaved claim pair's record (``gpubench.suite.claims.measure_pair``)."""
    record = step_record(f"claim-{name}-bert", (base_s,) * 3, kind="claim", claim=name,
                         case_id_base=base, case_id_new=new, rounds_base_s=[base_s] * 6,
                         rounds_new_s=[new_s] * 6, global_batch_base=8, global_batch_new=8)
    for key in ("step_time_s", "samples_per_s"):  # a pair's figures are its sides' rounds
        del record["extra_info"][key]
    return record


def test_a_claims_sides_and_its_interleaved_pair_are_its_own(tmp_path):
    """AdamW against Adam: each side the baseline but for the optimizer (not Adam at another
    precision, implementation or micro-batch), timed by the pair of those two cases, not by a
    pair of the same claim at another micro-batch."""
    off = {"is_baseline": False}
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1,) * 3),
        step_record("bert-bf16-adam", (0.1,) * 3, precision="bf16", optimizer="adam", **off),
        step_record("bert-fp32-adam_foreach", (0.1,) * 3, optimizer="adam",
                    optimizer_impl="foreach", **off),
        step_record("bert-fp32-mb16-adam", (0.1,) * 3, optimizer="adam", micro_batch=16,
                    global_batch=16, **off),
        step_record("bert-fp32-mb16-adamw", (0.1,) * 3, optimizer="adamw", micro_batch=16,
                    global_batch=16, **off),
        step_record("bert-fp32-adam", (0.1,) * 3, optimizer="adam", **off),
        step_record("bert-fp32-adamw", (0.1,) * 3, optimizer="adamw", **off),
        _claim("adamw", "bert-fp32-mb16-adam", "bert-fp32-mb16-adamw", 0.1, 0.2),
        _claim("adamw", "bert-fp32-adam", "bert-fp32-adamw", 0.1, 0.1))
    cases = _Cases(with_baseline_ratios(df), "bert")
    adam, adamw = cases.claim_case("adamw", "base"), cases.claim_case("adamw")
    assert (adam["case_id"], adamw["case_id"]) == ("bert-fp32-adam", "bert-fp32-adamw")
    assert cases.pair("adamw", adam, adamw)["case_id_base"] == "bert-fp32-adam"
    speed, basis = cases.speed("adamw", adam, adamw)
    assert basis == "interleaved rounds" and speed.ratio == pytest.approx(1.0)


def test_the_loader_knobs_worker_count_is_the_baselines_loader_cases(tmp_path):
    """The worker count the pin and prefetch claims' sides are found at: a knob case of the
    baseline's step, not a pinned stack of another precision listed first."""
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1,) * 3),
        step_record("bert-bf16-tokens-mmap-w4-pin", (0.1,) * 3, is_baseline=False,
                    precision="bf16", num_workers=4, pin_memory=True, **LOADER),
        step_record("bert-fp32-tokens-mmap-w2-pin", (0.1,) * 3, is_baseline=False,
                    num_workers=2, pin_memory=True, **LOADER))
    assert _Cases(with_baseline_ratios(df), "bert").knob_workers() == 2


def _memory(activation_bytes: int) -> dict:
    """A CPU record's exact training memory: 300 bytes of state and its activations."""
    return {"param_bytes": 100, "grad_bytes": 100, "optimizer_state_bytes": 100,
            "activation_bytes": activation_bytes}


def test_the_advice_reads_accumulation_at_the_baselines_configuration(tmp_path):
    quarter = {"accum_steps": 4, "micro_batch": 2, "is_baseline": False, **_memory(100)}
    decoy = {**quarter, **_memory(700)}
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1,) * 3, **_memory(700)),
        step_record("bert-bf16-accum4-mb2", (0.1,) * 3, precision="bf16", **decoy),
        step_record("bert-fp32-adam-accum4-mb2", (0.1,) * 3, optimizer="adam", **decoy),
        step_record("bert-fp32-ckpt-accum4-mb2", (0.1,) * 3, checkpointing=True, **decoy),
        step_record("bert-fp32-accum4-mb2-tokens-mmap", (0.1,) * 3, **decoy, **LOADER),
        step_record("bert-fp32-accum4-mb2", (0.1,) * 3, **quarter))
    (verdict,) = check_accumulation(_Cases(with_baseline_ratios(df), "bert"))
    assert verdict.measured.startswith("k=4: memory x0.40")


def test_the_advice_reads_ddp_scaling_of_the_baselines_configuration(tmp_path):
    ddp = {"parallel": "ddp", "is_baseline": False}
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1,) * 3),
        # at more ranks, each another configuration in one field
        step_record("bert-bf16-ddp4", (0.1,) * 3, precision="bf16", world_size=4, **ddp),
        step_record("bert-fp32-adam-ddp4", (0.1,) * 3, optimizer="adam", world_size=4, **ddp),
        step_record("bert-fp32-ckpt-ddp4", (0.1,) * 3, checkpointing=True, world_size=4, **ddp),
        step_record("bert-fp32-mb4-ddp4", (0.1,) * 3, micro_batch=4, world_size=4, **ddp),
        step_record("bert-fp32-ddp2", (0.1,) * 3, world_size=2, **ddp))
    (verdict,) = check_ddp(_Cases(with_baseline_ratios(df), "bert"))
    assert verdict.measured.startswith("bert-fp32-ddp2: ")


def test_the_advice_reads_loader_workers_at_the_baselines_step(tmp_path):
    """0 workers against the fastest worker count, both the baseline's step but for the
    loader: not a faster case with another optimizer or layout, nor a base of another
    optimizer listed first."""
    off = {"is_baseline": False, **LOADER}
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1,) * 3),
        step_record("bert-fp32-adam-tokens-mmap", (0.1,) * 3, optimizer="adam",
                    loader_stall_fraction=0.9, **off),
        step_record("bert-fp32-adam-tokens-mmap-w4", (0.01,) * 3, optimizer="adam",
                    num_workers=4, loader_stall_fraction=0.0, **off),
        step_record("bert-fp32-ckpt-tokens-mmap-w4", (0.01,) * 3, checkpointing=True,
                    num_workers=4, loader_stall_fraction=0.0, **off),
        step_record("bert-fp32-tokens-mmap", (0.2,) * 3, loader_stall_fraction=0.5, **off),
        step_record("bert-fp32-tokens-mmap-w2", (0.1,) * 3, num_workers=2,
                    loader_stall_fraction=0.2, **off))
    (verdict,) = check_loader_workers(_Cases(with_baseline_ratios(df), "bert"))
    assert "best: bert-fp32-tokens-mmap-w2; stall 50% -> 20%" in verdict.why


def test_the_advice_reads_each_cold_case_against_its_warm_twin(tmp_path):
    """Cold cases of the baseline's step only (not one at another precision), each against
    the same configuration read warm (not the same loader at another dataset size)."""
    off = {"is_baseline": False, **LOADER}
    df = _file(
        tmp_path,
        step_record("bert-fp32", (0.1,) * 3),
        step_record("bert-bf16-tokens-mmap-cold", (0.1,) * 3, precision="bf16", cold=True,
                    loader_stall_fraction=0.8, **off),
        step_record("bert-bf16-tokens-mmap", (0.1,) * 3, precision="bf16",
                    loader_stall_fraction=0.7, **off),
        step_record("bert-fp32-tokens-mmap-n32", (0.1,) * 3, loader_stall_fraction=0.9,
                    **{**off, "dataset_size": 32}),
        step_record("bert-fp32-tokens-mmap", (0.1,) * 3, loader_stall_fraction=0.2, **off),
        step_record("bert-fp32-tokens-mmap-cold", (0.1,) * 3, cold=True,
                    loader_stall_fraction=0.3, **off))
    (verdict,) = check_storage(_Cases(with_baseline_ratios(df), "bert"))
    assert verdict.measured.startswith("0 workers: warm vs cold")
    assert verdict.measured.count("workers: warm vs cold") == 1
    assert "stall cold -> warm: 0 workers 30% -> 20%;" in verdict.why


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


def test_the_users_own_files_in_the_results_folder_survive_new_runs(tmp_path):
    """A new run sets aside what a run wrote (by name) and leaves the rest where it is: set
    aside, a file would be deleted with the older generation by the run after next."""
    from gpubench.cli import main as cli

    out = tmp_path / "out"
    out.mkdir()
    mine = {"notes.md": "mine", "paired_vs_separate.md": "a script's record",
            "my-plot.png": "a chart of my own", "data.csv": "x,y", "cases.json": "{}"}
    for name, text in mine.items():
        (out / name).write_text(text)
    for generation in ("first", "second"):
        written = ["benchmark.json", "cases.jsonl", "summary.md", "advice.md", "report.md",
                   "report.html", "memory.json", "speedup.png", "speedup.svg",
                   "parity-bert.png", "parity.json"]
        for name in written:
            (out / name).write_text(generation)
        (out / "traces").mkdir()
        assert cli._set_aside_previous(out) == len(written) + 1
        assert sorted(p.name for p in (out / "previous").iterdir()) == sorted([*written,
                                                                              "traces"])
        assert (out / "previous" / "summary.md").read_text() == generation
    for name, text in mine.items():
        assert (out / name).read_text() == text, name


def test_the_run_outputs_name_every_chart_the_report_draws():
    from gpubench.report.charts import CHARTS
    from gpubench.util.paths import CHART_NAMES

    assert set(CHARTS) == set(CHART_NAMES)


def test_every_file_a_real_run_writes_is_named_a_run_output(smoke_run):
    """The names (``is_run_output``) cover what a real ``gpubench run`` wrote: an output a
    change adds without naming it would be left beside the next run's as if it were its own."""
    from gpubench.util.paths import is_run_output

    out, _ = smoke_run
    entries = [e for e in out.iterdir() if not e.name.startswith(".")]
    assert entries
    assert [e.name for e in entries if not is_run_output(e.name, e.is_dir())] == []


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


def _paired(case_id: str, step: float, beside: float, **fields) -> dict:
    """A case paired with the baseline in its own process: its rounds about ``step`` s, the
    baseline's rounds beside it about ``beside`` s."""
    rounds = [step * (1 + 0.01 * (i % 3)) for i in range(12)]
    base = [beside * (1 + 0.01 * (i % 3)) for i in range(12)]
    ratio = beside / step
    return step_record(case_id, rounds, is_baseline=False, paired_partner="this process",
                       paired_baseline_rounds_s=base, baseline_step_time_s=beside,
                       speedup_paired=ratio, speedup_paired_low=ratio * 0.98,
                       speedup_paired_high=ratio * 1.02, speedup_paired_p=1e-6, **fields)


def test_a_pairing_disturbed_in_its_process_is_flagged_and_never_the_answer(tmp_path):
    """The baseline's rounds beside a case in its own process ran 50% slower than the baseline
    case: the case's 1.5x is read against a slowed baseline. It is flagged, and the answer takes
    the case whose baseline beside it ran as the baseline case did, saying why it passed over
    the other."""
    from gpubench.analysis.recommend import recommend
    from gpubench.analysis.results import load_results, with_baseline_ratios

    path = results_file(
        tmp_path / "run.json",
        step_record("bert-fp32", [0.1, 0.101, 0.102] * 4),
        _paired("bert-fp32-zerofill", 0.1, 0.15, zero_grad_set_to_none=False),
        _paired("bert-fp32-sgd_fused", 0.09, 0.101, optimizer_impl="fused"))
    df = with_baseline_ratios(load_results([path])).set_index("case_id")
    assert "disturbed pairing: the FP32 baseline beside it ran 49% slower than the baseline " \
           "case" in df.loc["bert-fp32-zerofill", "flags"]
    assert "disturbed" not in df.loc["bert-fp32-sgd_fused", "flags"]
    (rec,) = recommend(load_results([path]))
    assert rec.case_id == "bert-fp32-sgd_fused"
    (passed,) = rec.passed_over
    assert passed.case_id == "bert-fp32-zerofill" and passed.why.startswith("disturbed pairing")


def test_a_machine_that_slowed_since_the_baseline_case_is_no_disturbance(tmp_path):
    """The machine ran 30% slower while two cases were measured than when the baseline case
    was (a shared VM's speed moves for minutes at a time): both cases' FP32 rounds beside them
    read 30% slower than the baseline case. Read against the same baseline at rest just before
    its rounds, one pairing is sound (its baseline ran as fast in the rounds as at rest) and its
    case can be the answer; the other's baseline ran 25% slower in the rounds than at rest,
    which the case did, and it is flagged and passed over saying so. Records without the
    figure at rest keep the baseline case as the reference."""
    from gpubench.analysis.recommend import recommend
    from gpubench.analysis.results import load_results, partner_drift, with_baseline_ratios

    path = results_file(
        tmp_path / "run.json",
        step_record("bert-fp32", [0.1, 0.101, 0.102] * 4),
        _paired("bert-fp32-sgd_fused", 0.118, 0.13, optimizer_impl="fused",
                paired_baseline_steady_s=0.129),
        _paired("bert-fp32-zerofill", 0.1, 0.163, zero_grad_set_to_none=False,
                paired_baseline_steady_s=0.13))
    df = with_baseline_ratios(load_results([path])).set_index("case_id")
    assert partner_drift(df.loc["bert-fp32-sgd_fused"]) == pytest.approx(0.13 / 0.129 - 1)
    assert "disturbed" not in df.loc["bert-fp32-sgd_fused", "flags"]
    assert "disturbed pairing: the FP32 baseline beside it ran 25% slower in the paired rounds " \
           "than at rest just before them" in df.loc["bert-fp32-zerofill", "flags"]
    (rec,) = recommend(load_results([path]))
    assert rec.case_id == "bert-fp32-sgd_fused"
    (passed,) = rec.passed_over
    assert passed.case_id == "bert-fp32-zerofill" and passed.why.startswith("disturbed pairing")
    # The same rounds without the figure at rest: read against the baseline case, as before.
    old = df.loc["bert-fp32-sgd_fused"].drop("paired_baseline_steady_s")
    assert partner_drift(old) == pytest.approx(0.13 / df.loc["bert-fp32", "step_time_s"] - 1)


def test_baseline_rounds_that_ran_faster_beside_a_case_are_no_disturbance(tmp_path):
    """The baseline's rounds beside a case ran 20% faster than the baseline case (the machine
    was faster while both sides ran): nothing of the case can speed its baseline up, and the
    ratio of the two sides cancels the machine. Not flagged, and the case can be the answer."""
    from gpubench.analysis.recommend import recommend
    from gpubench.analysis.results import load_results, with_baseline_ratios

    path = results_file(
        tmp_path / "run.json",
        step_record("bert-fp32", [0.1, 0.101, 0.102] * 4),
        _paired("bert-fp32-sgd_fused", 0.0667, 0.08, optimizer_impl="fused"),  # 1.2x
        _paired("bert-fp32-adam_fused", 0.09, 0.1, optimizer="adam", optimizer_impl="fused"))
    df = with_baseline_ratios(load_results([path])).set_index("case_id")
    assert "disturbed" not in df.loc["bert-fp32-sgd_fused", "flags"]
    (rec,) = recommend(load_results([path]))
    assert rec.case_id == "bert-fp32-sgd_fused"
    assert not any(p.why.startswith("disturbed") for p in rec.passed_over)
