"""End to end: ``gpubench run`` on the smoke profile, then summary, report and compare on it."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpubench.analysis.results import REQUIRED_FIELDS
from gpubench.cli.main import main

EXTRA_FIELDS = (
    "step_time_iqr_s", "peak_reserved_bytes", "step_memory_bytes", "peak_memory_method",
    "param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_tflops", "optimizer_impl",
    "loss_reference", "loss_first", "check_losses", "num_workers", "pin_memory",
    "prefetch_factor", "persistent_workers", "non_blocking", "dataset", "cached",
)
LOADER_FIELDS = ("loader_stall_fraction", "loader_wait_s", "loader_samples_per_s",
                 "time_to_first_batch_s", "epoch_restart_s")
RANK_FIELDS = ("rank_step_time_s", "rank_peak_memory_bytes", "single_case_id")
TINY = f"{Path(__file__).resolve().parent / 'data' / 'tiny_workload.py'}:workload"


def test_run_writes_json_with_every_field(smoke_run):
    out, _ = smoke_run
    data = json.loads((out / "benchmark.json").read_text())
    steps = [b for b in data["benchmarks"] if b["extra_info"].get("kind") == "step"]
    assert len(steps) >= 10
    for bench in steps:
        missing = [f for f in (*REQUIRED_FIELDS, *EXTRA_FIELDS) if f not in bench["extra_info"]]
        assert not missing, (bench["name"], missing)
        assert len(bench["stats"]["data"]) == 3  # raw rounds kept
        info = bench["extra_info"]
        expected = RANK_FIELDS if info["parallel"] in ("ddp", "pipeline") else LOADER_FIELDS
        assert all(f in info for f in expected), (bench["name"], expected)
    parallels = {b["extra_info"]["parallel"] for b in steps}
    assert {"single", "ddp", "model", "pipeline"} <= parallels
    datasets = {b["extra_info"]["dataset"] for b in steps}
    assert {"synthetic", "device-resident", "images-jpeg", "tokens-mmap"} <= datasets
    info = data["machine_info"]["gpubench"]
    for key in ("torch", "cuda", "cudnn", "device_name", "cpu", "torch_threads"):
        assert key in info
    assert info["matmul_peak_tflops"]["fp32"] > 0
    assert "storage_folder" in info["storage"]  # its cases read files: the disk was probed
    from gpubench.measure.version import SCHEMA_VERSION

    assert all(b["extra_info"]["schema"] == SCHEMA_VERSION for b in data["benchmarks"])
    overhead = [b for b in data["benchmarks"] if b["extra_info"].get("kind") == "overhead"]
    assert {b["extra_info"]["case_id"] for b in overhead} == {
        "overhead-resnet18", "overhead-bert", "overhead-workers2", "telemetry-resnet18",
        "telemetry-bert"}
    figures = [b["extra_info"] for b in overhead if "harness_overhead" in b["extra_info"]]
    assert {e["case_id"] for e in figures} == {"overhead-resnet18", "overhead-bert"}
    for e in figures:  # each harness-overhead figure with its interval around it
        assert e["harness_overhead_low"] <= e["harness_overhead"] <= e["harness_overhead_high"]
    for e in (b["extra_info"] for b in overhead if "telemetry_overhead" in b["extra_info"]):
        assert e["telemetry_overhead_low"] <= e["telemetry_overhead"] \
            <= e["telemetry_overhead_high"]


def test_every_case_of_a_run_pairs_with_a_baseline_in_the_benchmark_process(smoke_run):
    """Multi-process cases too (DDP, pipeline): their baseline is built and stepped in the
    benchmark process, where the baseline case ran, as an in-process case's is: no baseline
    worker, no worker offset; the ranks' memory stays their own (one replica's parameters)."""
    out, _ = smoke_run
    data = json.loads((out / "benchmark.json").read_text())
    steps = {b["extra_info"]["case_id"]: b["extra_info"] for b in data["benchmarks"]
             if b["extra_info"].get("kind") == "step"}
    paired = [i for i in steps.values() if not i["is_baseline"]]
    multi = [i for i in paired if i["parallel"] in ("ddp", "pipeline")]
    assert {i["case_id"] for i in multi} >= {"resnet18-fp32-ddp2", "bert-fp32-ddp2",
                                             "resnet18-fp32-pipeline2-chunks4"}
    for info in paired:
        assert info["paired_partner"] == "this process", info["case_id"]
        assert info["paired_worker_offset"] is None, info["case_id"]
        assert len(info["paired_baseline_rounds_s"]) == 3, info["case_id"]
        assert info["paired_baseline_steady_s"] > 0, info["case_id"]
    for model in ("resnet18", "bert"):
        ddp = steps[f"{model}-fp32-ddp2"]
        assert ddp["param_bytes"] == steps[f"{model}-fp32"]["param_bytes"]


def test_run_prints_and_writes_summary(smoke_run):
    out, stdout = smoke_run
    summary = (out / "summary.md").read_text()
    for header in ("median step (ms)", "samples/s", "peak mem (MiB)", "speedup vs fp32", "MFU"):
        assert header in summary and header in stdout
    assert "resnet18-fp32-accum2-mb4" in summary
    assert "Harness overhead" in summary
    # The cases' pytest child loads the plugins it needs, not every one installed here.
    assert "hypothesis profile" not in stdout
    # The run ends with the answer: each model's configuration to train with, and why.
    answer = stdout.split("## The answer: what to train with")[1]
    assert "**resnet18**: train with" in answer and "**bert**: train with" in answer


def test_run_judges_no_grad_and_del_from_its_own_measurements(smoke_run):
    out, _ = smoke_run
    reports = json.loads((out / "memory.json").read_text())
    assert {r["model"] for r in reports} == {"resnet18", "bert"}
    for r in reports:
        assert r["hygiene"]["evaluation"]["no_grad"]["saved_bytes"] == 0
        assert r["hygiene"]["evaluation"]["grad"]["saved_bytes"] > 0
    from gpubench.suite.claims import CLAIMS

    for text in (CLAIMS["no-grad"].text, CLAIMS["del"].text):
        for where in ("advice.md", "report.md"):
            rows = [line for line in (out / where).read_text().splitlines() if text in line]
            assert rows and all("not measured" not in row for row in rows), (where, text)


def test_run_writes_charts_and_report(smoke_run):
    out, _ = smoke_run
    for name in ("speedup", "memory", "pareto", "accumulation", "scaling", "loader"):
        assert (out / f"{name}.png").stat().st_size > 1000
        assert (out / f"{name}.svg").exists()
    report = (out / "report.md").read_text()
    assert "## scaling" in report and "## loader" in report
    assert report.split("\n## ")[1].startswith("The answer: what to train with")
    assert "data:image/png;base64" in (out / "report.html").read_text()


def test_compare_run_with_itself(smoke_run, tmp_path, capsys):
    out, _ = smoke_run
    code = main(["compare", str(out / "benchmark.json"), str(out / "benchmark.json"),
                 "--github-json", str(tmp_path)])
    assert code == 0
    assert "regression" not in capsys.readouterr().out.split("\n\n")[-1]
    series = json.loads((tmp_path / "smaller_is_better.json").read_text())
    assert {"name", "unit", "value"} <= set(series[0])


def test_not_benchmark_json_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    assert main(["summary", str(bad)]) == 2
    assert "notes.json" in capsys.readouterr().err


def test_bad_profile_is_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--profile", "huge"])
    assert "huge" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_ddp_writes_a_loadable_record(tmp_path):
    out = tmp_path / "ddp.json"
    # A rank that waits for the other past --timeout names it and ends the job, which then
    # fails here with its reason; past the outer limit the whole job (torchrun and its ranks,
    # a session of their own) is killed and the failure says what it wrote.
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "-m", "gpubench", "dist", "--model", TINY, "--profile", "smoke",
         "--rounds", "3", "--timeout", "60", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        _, stderr = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        _, stderr = job.communicate()
        pytest.fail(f"torchrun did not end within 300 s: {(stderr or '(no stderr)')[-3000:]}")
    assert job.returncode == 0, stderr[-3000:]
    data = json.loads(out.read_text())
    (bench,) = data["benchmarks"]
    info = bench["extra_info"]
    assert info["parallel"] == "ddp" and info["world_size"] == 2
    assert info["global_batch"] == 2 * info["micro_batch"]
    assert len(info["rank_step_time_s"]) == 2 and len(bench["stats"]["data"]) == 3
    assert info["check_losses"][-1] < info["check_losses"][0]


def test_dist_outside_torchrun_explains(capsys):
    assert main(["dist", "--model", "bert", "--out", "x.json"]) == 2
    assert "torchrun" in capsys.readouterr().err


@pytest.mark.slow
def test_report_across_two_runs(smoke_run, tmp_path):
    out, _ = smoke_run
    a, b = tmp_path / "machine-a.json", tmp_path / "machine-b.json"
    for f in (a, b):
        f.write_text((out / "benchmark.json").read_text())
    assert main(["report", str(a), str(b), "-o", str(tmp_path / "both")]) == 0
    report = (tmp_path / "both" / "report.md").read_text()
    assert "machine-a, machine-b" in report
    assert (tmp_path / "both" / "speedup.png").exists()
    assert "## Advice" not in report  # verdicts are per run


HEAVY = ("torch", "torchvision", "transformers", "scipy", "pandas", "matplotlib", "seaborn")


def test_the_command_line_starts_without_the_heavy_libraries():
    """Building the parser of every command and parsing a run's arguments imports none of them
    (``gpubench --help``, and the start of every gpubench process, would pay seconds)."""
    code = ("import sys\n"
            "from gpubench.cli.main import build_parser\n"
            "build_parser().parse_args(['run', '--profile', 'smoke', '--models', 'bert'])\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
