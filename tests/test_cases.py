import pytest

from gpubench.suite.cases import PROFILE_MODELS, profile_cases
from gpubench.train.config import PROFILES


@pytest.mark.slow
def test_case_ids_unique_and_baseline_first_per_model():
    for profile in PROFILES:
        cases = profile_cases(profile, "cpu")
        ids = [c.id for c in cases]
        assert len(ids) == len(set(ids)), profile
        for model in PROFILE_MODELS[profile]:
            first = next(c for c in cases if c.cfg.model == model)
            assert first.cfg.is_baseline


def test_accumulation_covers_both_uses():
    cases = [c.cfg for c in profile_cases("cpu", "cpu", ("resnet18",)) if c.group == "accumulation"]
    base_batch = 8
    same_global = [
        c for c in cases if c.accum_steps > 1 and c.micro_batch == base_batch // c.accum_steps
    ]
    same_micro = [c for c in cases if c.accum_steps > 1 and c.micro_batch is None]
    assert same_global and same_micro


def test_compile_cases_are_slow():
    cases = profile_cases("cpu", "cpu")
    assert all(c.slow == c.cfg.compile for c in cases)
    assert any(c.cfg.compile for c in cases)


def test_budget_rounds_shrinks_slow_cases_but_keeps_a_sample():
    from gpubench.measure.runner import MIN_ROUNDS, budget_rounds

    assert budget_rounds(10, 0.01, 4.0) == 10
    assert budget_rounds(10, 0.5, 4.0) == 8
    assert budget_rounds(10, 10.0, 4.0) == MIN_ROUNDS
    assert budget_rounds(3, 10.0, 4.0) == 3  # never more than asked
    assert budget_rounds(10, 10.0, 0) == 10


def test_budget_rounds_extends_fast_cases_to_the_minimum_time_within_a_cap():
    from gpubench.measure.protocol import EXTEND_FACTOR
    from gpubench.measure.runner import budget_rounds

    assert budget_rounds(12, 0.015, 3.0, 0.6) == 40  # 40 x 15 ms = 0.6 s
    assert budget_rounds(12, 0.045, 3.0, 0.6) == 14
    assert budget_rounds(12, 0.001, 3.0, 0.6) == EXTEND_FACTOR * 12  # capped
    assert budget_rounds(12, 0.1, 3.0, 0.6) == 12  # already long enough
    assert budget_rounds(12, 0.9, 3.0, 0.6) == 6  # slow: max-time still shrinks
    assert budget_rounds(12, 0.015, 3.0, 0) == 12


def test_only_the_loader_group_reads_through_a_loader():
    """Technique cases time the step on device-resident batches; the loader group alone
    measures loading (collation, copies, workers), and the recipe group stacks it with the
    rest (S1's case study reads its own data)."""
    for c in profile_cases("cpu", "cpu"):
        resident = c.cfg.loader.dataset == "device-resident"
        assert resident == (c.group not in ("loader", "recipe")) or c.cfg.is_baseline, c.id
        if c.group == "loader":
            assert not resident, c.id


def test_gpu_small_has_the_promised_shapes_and_is_a_subset_of_gpu_full():
    from gpubench.workloads.registry import resolve

    small = {c.id: c for c in profile_cases("gpu-small", "cuda")}
    full = {c.id: c for c in profile_cases("gpu-full", "cuda")}
    assert set(small) < set(full)
    assert resolve("resnet50", "gpu-small").input_shape(1) == [1, 3, 224, 224]
    assert resolve("gpt2", "gpu-small").input_shape(1) == [1, 1024]
    assert resolve("bert", "gpu-small").input_shape(1) == [1, 128]
    left_out = set(full) - set(small)
    assert "gpt2-fp32-adamw_fused" in small and "gpt2-fp32-adam_fused" in left_out
    assert "resnet50-fp32-accum4" in small and "resnet50-fp32-accum2" in left_out


def test_worker_sweep_goes_above_the_core_count(monkeypatch):
    import gpubench.suite.cases as cases

    monkeypatch.setattr(cases.os, "cpu_count", lambda: 2)
    assert cases.worker_counts() == [0, 1, 2, 4]
    monkeypatch.setattr(cases.os, "cpu_count", lambda: 16)
    assert cases.worker_counts()[-1] == 32
    assert cases.knob_workers("cpu") == 2


def test_emulated_precision_combinations_leave_the_cpu_profile():
    from gpubench.suite.cases import budget_reason, native_cpu_precisions
    from gpubench.train.config import RunConfig

    base = RunConfig(model="resnet18", profile="cpu")
    assert budget_reason(base.with_(precision="bf16")) is None  # the precision group's case
    stacked = budget_reason(base.with_(precision="bf16", checkpointing=True))
    if "bf16" in native_cpu_precisions():
        assert stacked is None
    else:
        assert "emulated" in stacked and "gpubench case" in stacked
    assert budget_reason(base.with_(device="cuda", precision="bf16", checkpointing=True)) is None


@pytest.mark.parametrize("native", [set(), {"bf16"}, {"bf16", "fp16"}])
def test_the_smoke_profile_runs_an_emulated_precision_on_its_last_workload_only(
        monkeypatch, native):
    from gpubench.suite import cases as module

    monkeypatch.setattr(module, "native_cpu_precisions", lambda: set(native))
    assert PROFILE_MODELS["smoke"] == ("resnet18", "bert")
    ids = {c.id for c in profile_cases("smoke", "cpu")}
    for precision in ("fp16", "bf16"):
        # a precision the CPU has units for runs on every workload, an emulated one on bert
        assert ("resnet18-" + precision in ids) == (precision in native)
        assert "bert-" + precision in ids
    assert {"resnet18-fp32", "resnet18-fp32-ckpt", "bert-fp32"} <= ids
    alone = {c.id for c in profile_cases("smoke", "cpu", ("resnet18",))}
    assert {"resnet18-fp16", "resnet18-bf16"} <= alone  # the run's last workload
    gpu = {c.id for c in profile_cases("smoke", "cuda")}
    assert {"resnet18-fp16", "bert-fp16"} <= gpu


@pytest.mark.parametrize("option", ["--gpubench-min-time", "--gpubench-max-time",
                                    "--gpubench-rounds", "--gpubench-warmup"])
def test_a_negative_round_budget_is_a_one_line_usage_error(option):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", str(root / "benchmarks"),
                           "--collect-only", "-q", "-p", "no:cacheprovider", f"{option}=-1"],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 4  # pytest's usage error
    assert f"argument {option}: expected " in done.stderr and ">= 0; got '-1'" in done.stderr


def test_gpubench_run_rejects_a_negative_min_time(capsys):
    from gpubench.cli import main as cli

    with pytest.raises(SystemExit) as err:
        cli.main(["run", "--min-time", "-1"])
    assert err.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--min-time" in line and "-1" in line
