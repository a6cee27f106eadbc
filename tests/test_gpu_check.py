"""scripts/gpu_check.sh: the first GPU run's script, rehearsed on the CPU (its --rehearse mode
runs the same steps with the smoke profile), so that its plumbing is tested on every CI run:
every step writes its status and results when it ends, a step over its time box is stopped
and the next one runs, and the summary is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ["00-setup", "01-driver", "02-peaks", "03-core", "04-loader", "05-more",
         "06-parallel_claims", "07-transfer"]


def _rehearse(tmp_path: Path, timeout: float, **env) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    environ = {
        **os.environ,
        # python3 in the script is this interpreter (the one gpubench is installed in).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GPUBENCH_DATA_DIR": str(tmp_path / "data"),
        **env,
    }
    proc = subprocess.run(["bash", str(SCRIPT), "--rehearse", str(out)], env=environ,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    return proc, out


def _status(out: Path, step: str) -> dict:
    return json.loads((out / f"{step}.json").read_text())


def _cases(out: Path, folder: str) -> list[str]:
    data = json.loads((out / folder / "benchmark.json").read_text())
    return [b["extra_info"]["case_id"] for b in data["benchmarks"] if b.get("extra_info")]


@pytest.mark.slow
def test_rehearsal_runs_every_step_and_writes_its_results(tmp_path):
    proc, out = _rehearse(tmp_path, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    statuses = [_status(out, step) for step in STEPS]
    for step, status in zip(STEPS, statuses, strict=True):
        assert status["status"] == "ok", (step, status.get("log_tail"))
        assert (out / f"{step}.log").exists()
        assert status["seconds"] <= status["budget_s"]
    # Each step's status was written when that step ended, not all at the end.
    stamps = [s["written_at"] for s in statuses]
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]
    driver = json.loads((out / "driver" / "driver.json").read_text())
    assert driver["cuda_usable"] is False and driver["torch"] and "dev_shm_gib" in driver
    peaks = json.loads((out / "peaks" / "peaks.json").read_text())
    assert peaks["peak_tflops"]["fp32"] > 0 and peaks["peak_tflops"]["bf16"] > 0
    assert _cases(out, "core") == ["resnet18-fp32"]
    assert _cases(out, "loader") == ["resnet18-fp32-images-jpeg"]
    assert _cases(out, "more") == ["resnet18-fp32-zerofill"]
    assert _cases(out, "parallel_claims") == ["resnet18-fp32-model2", "claim-adamw-resnet18"]
    assert _status(out, "03-core")["outputs"]["core/benchmark.json"]["cases"] == 1
    assert "host-to-device copies need a CUDA device" in (out / "07-transfer.log").read_text()
    summary = json.loads((out / "gpu_check.json").read_text())
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert summary["headline"]["best loader case"]["case"] == "resnet18-fp32-images-jpeg"
    assert (out / "gpu_check.md").read_text().startswith("# gpubench gpu_check (rehearsal")
    assert all(f"| {step} | ok |" in (out / "progress.md").read_text() for step in STEPS)
    assert not (out / "data").exists() and (tmp_path / "data").is_dir()  # data kept out of OUT


def test_a_step_over_its_time_box_is_stopped_and_the_next_step_runs(tmp_path):
    proc, out = _rehearse(tmp_path, timeout=600, GPU_CHECK_STEPS="core,transfer",
                          GPU_CHECK_BUDGET_core="3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    core = _status(out, "03-core")
    assert core["status"] == "timed out" and core["timeout_s"] == 3 and core["seconds"] <= 5
    assert core["exit_code"] in (124, 137) and (out / "03-core.log").exists()
    assert _status(out, "07-transfer")["status"] == "ok"  # the next step ran
    assert not (out / "00-setup.json").exists() and not (out / "04-loader.json").exists()
    steps = json.loads((out / "gpu_check.json").read_text())["steps"]
    assert [s["step"] for s in steps] == ["03-core", "07-transfer"]


def test_usage_error():
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: scripts/gpu_check.sh [--rehearse] OUT" in proc.stderr
