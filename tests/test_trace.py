"""Traces and top operators (``gpubench.measure.trace``, ``gpubench run --trace``) and memory
snapshots (``gpubench memory --snapshot``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from gpubench.cli import main as cli
from gpubench.measure.runner import run_case
from gpubench.measure.standalone import StandaloneBenchmark
from gpubench.measure.trace import TOP_K, op_changes, op_changes_markdown, shares_ok
from gpubench.train.config import RunConfig


def run(cfg: RunConfig, trace_dir=None) -> dict:
    return run_case(StandaloneBenchmark(cfg.id), cfg, rounds=2, warmup_rounds=0,
                    timeout_s=120, trace_dir=trace_dir)


def check_top_ops(rows: list[dict]) -> None:
    assert 0 < len(rows) <= TOP_K
    assert set(rows[0]) == {"name", "self_time_s", "share", "calls", "flops"}
    times = [r["self_time_s"] for r in rows]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert shares_ok(rows), [r["share"] for r in rows]
    assert any(r["flops"] for r in rows)  # matmuls: the profiler knows their FLOPs


def test_without_trace_the_profiler_is_never_entered(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.profiler.profile entered without --trace")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    info = run(RunConfig(model="bert", profile="smoke"))
    assert "top_ops" not in info and "trace_files" not in info


def test_a_traced_case_writes_its_trace_and_top_operators(tmp_path):
    cfg = RunConfig(model="bert", profile="smoke")
    info = run(cfg, tmp_path / "traces")
    assert info["trace_files"] == [f"{cfg.id}.json"]
    trace = json.loads((tmp_path / "traces" / f"{cfg.id}.json").read_text())
    assert trace["traceEvents"]  # Chrome/Perfetto format
    assert info["top_ops_time"] == "cpu"
    check_top_ops(info["top_ops"])


@pytest.mark.slow
def test_a_traced_ddp_case_writes_one_trace_per_rank(tmp_path):
    cfg = RunConfig(model="bert", profile="smoke", parallel="ddp", world_size=2)
    info = run(cfg, tmp_path)
    assert info["trace_files"] == [f"{cfg.id}-rank0.json", f"{cfg.id}-rank1.json"]
    for name in info["trace_files"]:
        assert json.loads((tmp_path / name).read_text())["traceEvents"]
    check_top_ops(info["top_ops"])
    names = {r["name"] for r in info["top_ops"]}
    assert any("allreduce" in n or "broadcast" in n for n in names) or len(names) == TOP_K


def test_run_passes_the_trace_folder_to_pytest_beside_the_results():
    json_path = Path("/tmp/staging/benchmark.json")
    args = cli.build_parser().parse_args(["run", "--device", "cpu", "--profile", "smoke",
                                          "--trace"])
    assert "--gpubench-trace=/tmp/staging/traces" in cli.pytest_command(args, json_path)
    args = cli.build_parser().parse_args(["run", "--device", "cpu", "--profile", "smoke"])
    assert not any(a.startswith("--gpubench-trace") for a in cli.pytest_command(args, json_path))


def test_an_earlier_runs_traces_are_set_aside_with_its_results(tmp_path):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "benchmark.json").write_text("old")
    (out / "traces" / "old.json").write_text("{}")
    (out / "notes.txt").write_text("mine")  # not a run's: stays where it is
    assert cli._set_aside_previous(out) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "previous"]
    assert (out / "previous" / "benchmark.json").read_text() == "old"
    assert [p.name for p in (out / "previous" / "traces").iterdir()] == ["old.json"]
    (out / "benchmark.json").write_text("newer")  # the next run: replaces that previous/
    assert cli._set_aside_previous(out) == 1
    assert sorted(p.name for p in (out / "previous").iterdir()) == ["benchmark.json"]
    assert (out / "previous" / "benchmark.json").read_text() == "newer"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    # A run killed before its first case left only a journal: the earlier results stay.
    (out / "cases.jsonl").write_text('{"type": "run"}\n')
    (out / "logs").mkdir()
    assert cli._set_aside_previous(out) == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "previous"]
    assert sorted(p.name for p in (out / "previous").iterdir()) == ["benchmark.json"]
    assert (out / "previous" / "benchmark.json").read_text() == "newer"


def _ops(**times_ms):
    return [{"name": k.replace("_", "::", 1), "self_time_s": v / 1e3, "share": 0.1,
             "calls": 1, "flops": None} for k, v in times_ms.items()]


def test_the_report_lists_the_operators_whose_time_changed_most():
    base = _ops(aten_mm=10.0, aten_add=1.0, aten_relu=0.5)
    bf16 = _ops(aten_mm=4.0, aten_add=1.1, aten_to=2.0)
    assert [c["name"] for c in op_changes(base, bf16)][:2] == ["aten::mm", "aten::to"]
    df = pd.DataFrame([
        {"run": "r", "model": "m", "case_id": "m-fp32", "is_baseline": True,
         "group": "precision", "top_ops": base, "top_ops_time": "cpu"},
        {"run": "r", "model": "m", "case_id": "m-bf16", "is_baseline": False,
         "group": "precision", "top_ops": bf16, "top_ops_time": "cpu"},
        {"run": "r", "model": "m", "case_id": "m-fp32-accum4", "is_baseline": False,
         "group": "accumulation", "top_ops": base, "top_ops_time": "cpu"},
    ])
    text = op_changes_markdown(df)
    assert "#### m-bf16 vs m-fp32" in text and "m-fp32-accum4" not in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| `")]  # cells without the table's padding
    assert ["`aten::mm`", "10.00", "4.00", "0.40x"] in rows
    assert ["`aten::to`", "0.00", "2.00", "new in top ops"] in rows
    assert ["`aten::relu`", "0.50", "0.00", "left top ops"] in rows
    assert op_changes_markdown(df.assign(top_ops=None)) == ""


def test_memory_snapshot_on_the_cpu_is_one_line_and_exit_2(capsys):
    code = cli.main(["memory", "--model", "resnet18", "--profile", "smoke", "--device", "cpu",
                     "--budget", "1GiB", "--snapshot", "/tmp/never.pickle"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == ("gpubench: memory snapshots need CUDA: the CPU allocator keeps no "
                   "allocation history")
    assert not Path("/tmp/never.pickle").exists()


def test_memory_snapshot_records_the_first_failing_try_and_one_step(monkeypatch, tmp_path):
    """The CUDA path's order, with the allocator's recorder stood in: a fresh history, the
    search's first out-of-memory try run again, one step at the largest batch that fits, the
    dump, recording off."""
    from gpubench.diagnostics import snapshot
    from gpubench.diagnostics.frontier import Frontier, Try

    calls = []
    frontier = Frontier("resnet18-fp32", 48, [Try(8, True, 1), Try(16, True, 2),
                                              Try(64, False, None, "OOM"), Try(32, True, 3),
                                              Try(48, True, 4), Try(56, False, None, "OOM")])
    monkeypatch.setattr(snapshot, "find_frontier", lambda cfg, budget, limit: frontier)
    monkeypatch.setattr(snapshot, "try_batch",
                        lambda cfg, batch, budget: calls.append(("try", batch)))
    monkeypatch.setattr(snapshot, "one_step", lambda cfg, batch: calls.append(("step", batch)))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kw: calls.append(("record", enabled, kw)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: calls.append(("dump", path)))
    cfg = RunConfig(model="resnet18", profile="smoke", device="cuda")
    got, line = snapshot.frontier_with_snapshot(cfg, None, 4096, tmp_path / "s.pickle")
    assert got is frontier
    assert calls == [
        ("record", "all", {"max_entries": 100_000, "clear_history": True}),
        ("try", 64), ("step", 48), ("dump", str(tmp_path / "s.pickle")),
        ("record", None, {}),
    ]
    assert "micro-batch 64" in line and "micro-batch 48" in line and "memory_viz" in line


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_memory_snapshot_on_cuda_writes_a_pickle(tmp_path):
    import pickle

    path = tmp_path / "snap.pickle"
    assert cli.main(["memory", "--model", "resnet18", "--profile", "smoke", "--device", "cuda",
                     "--techniques", "fp32", "--max-batch", "64", "--no-leaks",
                     "--snapshot", str(path)]) == 0
    snap = pickle.loads(path.read_bytes())
    assert "segments" in snap and "device_traces" in snap
