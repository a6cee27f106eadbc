"""A torchrun record (``gpubench dist``, one case per file) gets its speedup and scaling
efficiency from the baseline in another file of the same model, profile, device and machine;
``gpubench dist`` checks its arguments before the process group starts."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gpubench.analysis.results import load_results, with_baseline_ratios
from gpubench.cli import main as cli
from gpubench.measure.machine import cpu_model
from gpubench.measure.runner import paired_speedup, run_case
from gpubench.measure.standalone import StandaloneBenchmark
from gpubench.report.summary import summary_frame
from gpubench.train.config import RunConfig

SPEEDUP = 1.5  # the hand-made ddp record's throughput over the baseline's


def _machine(cpu: str) -> dict:
    return {"cpu": cpu, "torch": torch.__version__, "device": "cpu", "device_name": cpu}


@pytest.fixture(scope="module")
def baseline_record() -> dict:
    """A real record of the bert smoke baseline, measured here (3 rounds)."""
    cfg = RunConfig(model="bert", profile="smoke", device="cpu")
    bench = StandaloneBenchmark(f"case[{cfg.id}]", f"{cfg.name}-smoke-cpu")
    run_case(bench, cfg, rounds=3, warmup_rounds=0)
    assert bench.extra_info["is_baseline"] is True
    return bench.as_json()


def _ddp_copy(base: dict) -> dict:
    """The baseline record edited into what ``gpubench dist`` writes for 2 DDP ranks."""
    ddp = copy.deepcopy(base)
    info = ddp["extra_info"]
    for key in [k for k in info if k.startswith(("speedup_paired", "paired_baseline"))]:
        del info[key]
    info.update(parallel="ddp", world_size=2, global_batch=2 * info["micro_batch"],
                samples_per_s=SPEEDUP * info["samples_per_s"], is_baseline=False,
                case_id=f"{info['case_id']}-ddp2", single_case_id=info["case_id"],
                launcher="torchrun", group="parallel")
    ddp["name"] = f"torchrun[{info['case_id']}]"
    return ddp


def _write(path, bench: dict, cpu: str):
    data = {"machine_info": {"node": "n1", "gpubench": _machine(cpu)}, "benchmarks": [bench],
            "datetime": "2026-01-01T00:00:00", "version": "5"}
    path.write_text(json.dumps(data))
    return path


def test_torchrun_record_joins_the_baseline_of_another_file(baseline_record, tmp_path, capsys):
    base = _write(tmp_path / "base.json", baseline_record, cpu_model())
    ddp = _write(tmp_path / "ddp.json", _ddp_copy(baseline_record), cpu_model())
    df = with_baseline_ratios(load_results([base, ddp]))
    row = df[df["parallel"] == "ddp"].iloc[0]
    assert row["run"] == "ddp" and row["baseline_run"] == "base"
    assert row["speedup"] == pytest.approx(SPEEDUP)
    assert row["scaling_efficiency"] == pytest.approx(SPEEDUP / 2)
    assert row["speedup_method"] == "separate"

    assert cli.main(["summary", str(base), str(ddp)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "-ddp2" in line)
    assert "1.50x" in line and "75%" in line and "baseline: base" in line
    assert "Harness overhead" not in out and "Multi-process" not in out  # no empty sections


def test_no_join_across_machines_and_own_baselines_win(baseline_record, tmp_path):
    base = _write(tmp_path / "base.json", baseline_record, cpu_model())
    elsewhere = _write(tmp_path / "elsewhere.json", _ddp_copy(baseline_record), "Other CPU 9000")
    df = with_baseline_ratios(load_results([base, elsewhere]))
    row = df[df["parallel"] == "ddp"].iloc[0]
    assert row["baseline_run"] == "elsewhere" and row["speedup"] != row["speedup"]  # NaN
    summary = summary_frame(load_results([base, elsewhere]))
    assert summary.loc[summary["case_id"].str.endswith("-ddp2"), "speedup_ci"].item() == "-"

    # Two runs that each have their baseline keep their own, even on the same machine.
    faster = copy.deepcopy(baseline_record)
    faster["extra_info"]["samples_per_s"] *= 2
    other = _write(tmp_path / "other.json", faster, cpu_model())
    df = with_baseline_ratios(load_results([base, other]))
    assert list(df["baseline_run"]) == ["base", "other"]
    assert list(df["base_samples_per_s"]) == list(df["samples_per_s"])


@pytest.fixture
def torchrun_env(monkeypatch):
    """This process as rank 0 of 2 under torchrun; the process group must never start."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)

    def never(*args, **kwargs):
        raise AssertionError("init_process_group called before the arguments were checked")

    monkeypatch.setattr(torch.distributed, "init_process_group", never)


@pytest.mark.parametrize(("argv", "reason"), [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "resnet18", "--parallel", "pipeline", "--precision", "fp16"], "fp16"),
    (["--model", "resnet18", "--parallel", "fsdp", "--precision", "bf16",
      "--fsdp-mixed-precision"], "fsdp_mixed_precision"),
    (["--model", "resnet18", "--no-sync", "--parallel", "fsdp"], "ddp_no_sync"),
    (["--model", "resnet18", "--chunks", "2"], "chunks"),
])
def test_dist_checks_its_arguments_before_the_process_group(torchrun_env, capsys, tmp_path,
                                                            argv, reason):
    code = cli.main(["dist", "--profile", "smoke", "--device", "cpu", *argv,
                     "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and reason in err
    assert err.startswith("gpubench dist: ") and len(err.strip().splitlines()) == 1


def test_dist_pipeline_needs_two_ranks(torchrun_env, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    code = cli.main(["dist", "--model", "resnet18", "--profile", "smoke", "--device", "cpu",
                     "--parallel", "pipeline", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and "world_size >= 2" in err and len(err.strip().splitlines()) == 1


def test_dist_rejects_bad_counts_in_argparse(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["dist", "--model", "bert", "--rounds", "0", "--out", "x.json"])
    assert exit_.value.code == 2 and "--rounds" in capsys.readouterr().err


DDP2 = RunConfig(model="bert", profile="smoke", device="cpu", parallel="ddp", world_size=2)


def _worker_paired(baseline_record, tmp_path, seed: int, offset=None, width=None):
    """A run of the baseline case at 17.8 ms a step and a DDP case paired with the baseline's
    worker process, whose steps took 13.7 ms (the case's as long, at twice the batch), its
    record as ``paired_speedup`` writes it (``offset``: ``paired_worker_offset``): (its row of
    ``with_baseline_ratios``, its record's extra_info, the worker's rounds, the case's)."""
    import random
    import statistics

    base = copy.deepcopy(baseline_record)
    base["extra_info"].update(step_time_s=0.0178,
                              samples_per_s=base["extra_info"]["global_batch"] / 0.0178)
    ddp = _ddp_copy(baseline_record)
    info = ddp["extra_info"]
    rng = random.Random(seed)
    worker = [0.0137 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20)]
    case = [w * (1 + rng.uniform(-0.02, 0.02)) for w in worker]
    info.update(step_time_s=statistics.median(case), paired_partner="worker process",
                paired_baseline_rounds_s=worker, paired_worker_offset=offset,
                paired_worker_offset_width=width,
                **paired_speedup(DDP2, case, worker, offset, width))
    info["samples_per_s"] = info["global_batch"] / info["step_time_s"]
    path = _write(tmp_path / "r.json", base, cpu_model())
    data = json.loads(path.read_text())
    data["benchmarks"].append(ddp)
    path.write_text(json.dumps(data))
    df = with_baseline_ratios(load_results([path]))
    return df[df["parallel"] == "ddp"].iloc[0], info, worker, case, df


def test_a_case_paired_with_the_worker_baseline_agrees_with_its_samples_per_s(
        baseline_record, tmp_path):
    """A record from before the worker's measured offset: its DDP case's paired baseline ran
    in a worker process at 13.7 ms a step while the baseline case measured 17.8 ms, and the
    paired ratio alone (0.96x) contradicted the samples/s ratio (1.24x). The offset between
    the two baselines is applied: they agree."""
    row, info, _, _, df = _worker_paired(baseline_record, tmp_path, seed=0)
    by_samples = row["samples_per_s"] / row["base_samples_per_s"]
    assert info["speedup_paired"] == pytest.approx(2.0, rel=0.02)  # against the worker
    assert row["speedup_offset"] == pytest.approx(0.0178 / 0.0137, rel=0.02)
    assert row["speedup"] == pytest.approx(by_samples, rel=0.01)
    assert row["speedup_low"] <= by_samples <= row["speedup_high"]
    # A case paired in this process keeps its ratio as measured.
    assert pd_isna(df[df["is_baseline"] == True]["speedup_offset"].iloc[0])  # noqa: E712


def test_a_worker_offset_measured_paired_keeps_the_machines_speed_out(baseline_record, tmp_path):
    """The baseline case ran in a slow stretch of the machine (17.8 ms); minutes later the DDP
    case's rounds ran in a fast one, the worker's baseline at 13.7 ms. The worker's own speed
    against this process's, measured paired when it started (``paired_worker_offset``: this
    process's step 1.03 times the worker's), is the offset: the speedup is the paired ratio
    times 1.03, not the 1.30 that the baseline case's step over the worker's would make of
    the machine's swing; the samples/s alongside it say the same."""
    row, info, worker, case, _ = _worker_paired(baseline_record, tmp_path, seed=1,
                                                offset=1.03, width=0.006)
    raw = paired_speedup(DDP2, case, worker)
    assert row["speedup_offset"] == pytest.approx(1.03)
    assert row["speedup"] == pytest.approx(raw["speedup_paired"] * 1.03)
    assert row["speedup"] == pytest.approx(info["speedup_paired"])  # applied once
    # the interval carries the offset's too: wider than the rounds' own, scaled
    assert row["speedup_low"] < raw["speedup_paired_low"] * 1.03
    assert row["speedup_high"] > raw["speedup_paired_high"] * 1.03
    assert row["speedup"] == pytest.approx(row["samples_per_s"] / row["baseline_samples_per_s"])
    assert row["speedup"] < 0.9 * row["samples_per_s"] / row["base_samples_per_s"]


def pd_isna(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))
