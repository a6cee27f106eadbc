"""The command line's polish: a live progress line on terminals only, byte sizes with units,
one-line warnings, tox passing the project's variables, ordinary file permissions."""

from __future__ import annotations

import configparser
import io
import json
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from gpubench.cli import main as cli
from gpubench.measure.standalone import StandaloneBenchmark, write_benchmark_json
from gpubench.util.argtypes import parse_bytes
from gpubench.util.progress import with_progress

ROOT = Path(__file__).resolve().parents[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal_shows_case_and_round():
    screen, setups = Terminal(), []
    bench = with_progress(StandaloneBenchmark("x"), "bert-bf16", stream=screen)
    result = bench.pedantic(lambda: 7, setup=lambda: setups.append(1), rounds=3,
                            warmup_rounds=1)
    text = screen.getvalue()
    assert result == 7 and len(setups) == 4  # the case's own setup still runs every round
    assert "bert-bf16: warm-up 1/1" in text
    for i in (1, 2, 3):
        assert f"bert-bf16: round {i}/3" in text
    assert len(bench.stats.stats.data) == 3  # the wrapped benchmark's rounds and fields
    bench.extra_info["x"] = 1
    assert bench._benchmark.extra_info["x"] == 1


def test_no_progress_line_off_a_terminal():
    calls = {}

    class Fixture:
        extra_info: dict = {}

        def pedantic(self, target, **kwargs):
            calls.update(kwargs)
            return target()

    log = io.StringIO()
    assert with_progress(Fixture(), "bert", stream=log).pedantic(
        lambda: 1, args=(), rounds=2, warmup_rounds=0, iterations=1) == 1
    assert log.getvalue() == ""
    assert calls["setup"] is None and calls["iterations"] == 1  # timed exactly as without it


def test_gpubench_case_shows_progress_on_a_terminal_stderr(monkeypatch, tmp_path, capsys):
    import gpubench.measure.machine
    import gpubench.measure.runner

    def fake_run_case(benchmark, cfg, *, rounds, warmup_rounds, **kwargs):
        benchmark.pedantic(lambda: None, rounds=rounds, warmup_rounds=warmup_rounds)
        benchmark.extra_info.update(step_time_s=0.01, samples_per_s=100.0,
                                    peak_memory_bytes=2**20)
        return benchmark.extra_info

    monkeypatch.setattr(gpubench.measure.runner, "run_case", fake_run_case)
    monkeypatch.setattr(gpubench.measure.machine, "machine_info",
                        lambda device, storage_dir=None: {"device": device})
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    out = tmp_path / "one.json"
    assert cli.main(["case", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                     "--precision", "bf16", "--rounds", "2", "--warmup", "0",
                     "-o", str(out)]) == 0
    assert "bert-bf16: round 2/2" in screen.getvalue()
    assert "round" not in capsys.readouterr().out
    assert json.loads(out.read_text())["benchmarks"][0]["extra_info"]["group"] == "case"


@pytest.mark.parametrize(("text", "expected"), [
    ("8G", 8 * 2**30), ("8GiB", 8 * 2**30), ("8gib", 8 * 2**30), ("8GB", 8 * 10**9),
    ("512M", 512 * 2**20), ("512MB", 512 * 10**6), ("1.5 KiB", 1536), ("2T", 2 * 2**40),
    ("1000", 1000), ("64B", 64),
])
def test_byte_sizes_binary_and_decimal(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "0", "-1G", "8Gx", "G", "inf", "nan", ""])
def test_bad_byte_sizes_are_one_line_errors(text):
    with pytest.raises(ValueError, match="memory size must be") as err:
        parse_bytes(text)
    assert "\n" not in str(err.value)


def test_budget_options_take_byte_sizes():
    parser = cli.build_parser()
    assert parser.parse_args(["advise", "--results", "r.json", "--budget", "8G"]).budget \
        == 8 * 2**30
    assert parser.parse_args(["advise", "--results", "r.json", "--budget", "8GB"]).budget \
        == 8 * 10**9
    assert parser.parse_args(["memory", "--model", "bert", "--budget", "2GiB"]).budget \
        == 2 * 2**30


def test_bad_budget_is_argparse_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["memory", "--model", "bert", "--budget", "lots"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--budget" in err and "lots" in err
    assert "8G = 8GiB" in err and "8GB = 8 x 10**9" in err


def test_warnings_are_one_line(monkeypatch):
    text = cli.one_line_warning("a.json: records lack\n  step_time_s", UserWarning, "x.py", 3)
    assert text == "gpubench: warning: a.json: records lack step_time_s\n"
    other = cli.one_line_warning("old\napi", FutureWarning, "/lib/transformers/m.py", 9)
    assert other == "gpubench: FutureWarning: old api (m.py:9)\n"
    seen, before = [], warnings.formatwarning
    monkeypatch.setattr(cli, "cmd_summary", lambda args: seen.append(warnings.formatwarning))
    cli.main(["summary", "r.json"])
    assert seen == [cli.one_line_warning]  # while a command runs
    assert warnings.formatwarning is before  # and restored after it


def test_cli_warning_reaches_stderr_as_one_line(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"machine_info": {}, "version": "5", "benchmarks": [
        {"name": "test_x", "stats": {"median": 0.1}, "extra_info": {"model": "bert"}}]}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "gpubench", "summary", str(old)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: warning: ")
    assert "old.json: records lack" in lines[0]


def test_tox_passes_the_project_variables():
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    passed = tox["testenv"]["passenv"].split()
    assert "GPUBENCH_*" in passed and "OMP_NUM_THREADS" in passed


def test_progress_and_tables_libraries_are_declared():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    assert {"tqdm", "tabulate"} <= names


def test_result_files_have_normal_permissions(tmp_path):
    bench = StandaloneBenchmark("x")
    bench.pedantic(lambda: None, rounds=1)
    umask = os.umask(0o022)
    try:
        write_benchmark_json(tmp_path / "r.json", [bench], {})
    finally:
        os.umask(umask)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


# -- argument errors: one line (no usage block), exit 2, the bad value named (fault campaign) --

@pytest.mark.parametrize("argv", [
    ["run", "--rounds", "-1"], ["run", "--threads", "-1"], ["run", "--max-time", "-1e3"],
    ["case", "--model", "bert", "-o", "x.json", "--seed", "-1"],
    ["compare", "a.json", "b.json", "--alpha", "nan"],
    ["advise", "--results", "r.json", "--budget", "-1GiB"],
    ["memory", "--model", "bert", "--budget", "nan"],
    ["memory", "--model", "bert", "--max-batch", "0"],
    ["memory", "--model", "bert", "--techniques", "bogus"],
    ["list", "--profile", "bogus"],
])
def test_argument_errors_are_one_line_naming_the_value(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert len(err.strip().splitlines()) == 1, err  # argparse's usage block is not printed
    assert argv[-1] in err and f"gpubench {argv[0]}: error:" in err and "--help" in err


def test_negative_looking_option_values_reach_the_option():
    parser = cli.build_parser()
    assert parser.parse_args(["run", "-k", "-1x", "--out", "-2"]).k == "-1x"
    assert parser.parse_args(["run", "--out", "-2"]).out == "-2"
    args = parser.parse_args(["compare", "--time-threshold", "0.1", "--", "-1.json", "b.json"])
    assert args.files == ["-1.json", "b.json"]  # after "--": positionals, as argparse has it


@pytest.mark.parametrize(("env", "named"), [
    ({"RANK": "5"}, "RANK"), ({"RANK": "-1"}, "RANK"), ({"RANK": "foo"}, "RANK"),
    ({"LOCAL_RANK": "-3"}, "LOCAL_RANK"), ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
    ({"LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE"),
])
def test_dist_with_a_bad_torchrun_variable_is_one_line_before_the_process_group(
        env, named, monkeypatch, capsys):
    """A RANK out of range made the rank wait at the rendezvous forever."""
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **env}.items():
        monkeypatch.setenv(var, value)
    if "LOCAL_WORLD_SIZE" not in env:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert cli.main(["dist", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                     "--out", "x.json"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and named in err and repr(env[named]) in err


# -- output paths of every command checked before any work (fault campaign) -------------------

def _result_file(tmp_path) -> Path:
    info = {"kind": "step", "case_id": "bert-fp32", "model": "bert", "profile": "smoke",
            "device": "cpu", "precision": "fp32", "accum_steps": 1, "micro_batch": 8,
            "global_batch": 8, "optimizer": "sgd", "parallel": "single", "world_size": 1,
            "input_shape": [8, 16], "is_baseline": True, "step_time_s": 0.01,
            "samples_per_s": 800.0, "peak_memory_bytes": 1000, "flops_per_step": 10**9,
            "tflops": 0.1, "mfu": 0.01}
    bench = {"name": "test_step[bert-fp32]", "group": "bert", "extra_info": info,
             "stats": {"median": 0.01, "min": 0.009, "max": 0.012, "mean": 0.01,
                       "rounds": 3, "data": [0.009, 0.01, 0.012]}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"machine_info": {}, "benchmarks": [bench]}))
    return path


@pytest.mark.parametrize("command", ["report", "export", "advise", "compare-md",
                                     "compare-gh", "case", "memory"])
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_unusable_output_path_is_one_line_before_any_work(command, where, tmp_path, capsys,
                                                          monkeypatch):
    """A file or a path under a file as the output folder (or, for file options, a path under
    a file) was a FileExistsError / NotADirectoryError traceback after the work was done."""
    import gpubench.cli.memory
    import gpubench.measure.runner

    def no_work(*args, **kwargs):
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(gpubench.measure.runner, "run_case", no_work)
    monkeypatch.setattr(gpubench.cli.memory, "memory_main", no_work)
    results = _result_file(tmp_path)
    other = tmp_path / "r2.json"  # compare's NEW: another file (the same one is warned about)
    other.write_text(results.read_text())
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    folder = a_file if where == "a file" else a_file / "sub"
    file_path = a_file / "sub" / "out.md"
    if where == "a file" and command in ("compare-md", "case"):
        folder = file_path = tmp_path  # a file option given a folder
    argv = {
        "report": ["report", str(results), "-o", str(folder)],
        "export": ["export", str(results), "--github-json", str(folder)],
        "advise": ["advise", "--results", str(results), "--out", str(folder)],
        "compare-md": ["compare", str(results), str(other), "--markdown", str(file_path)],
        "compare-gh": ["compare", str(results), str(other), "--github-json", str(folder)],
        "case": ["case", "--model", "bert", "--profile", "smoke", "-o", str(file_path)],
        "memory": ["memory", "--model", "bert", "--profile", "smoke", "--out", str(folder)],
    }[command]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    named = file_path if command in ("compare-md", "case") else folder
    assert len(lines) == 1 and str(named) in lines[0], captured.err
    assert "nothing was done" in lines[0] or "is a folder" in lines[0]
    assert a_file.read_text() == "keep me"
    assert "compared" not in captured.out  # compare did not run either


def test_case_whose_rank_fails_is_one_line_naming_rank_and_cause(monkeypatch, tmp_path,
                                                                  capsys):
    """A rank killed or failing in `gpubench case` was a WorkerError traceback."""
    import gpubench.measure.runner
    from gpubench.launchers.workers import WorkerError

    def rank_fails(*args, **kwargs):
        raise WorkerError("rank 1 failed during 'step':\nTraceback (most recent call last):\n"
                          "  File \"x.py\", line 1\nRuntimeError: boom")

    monkeypatch.setattr(gpubench.measure.runner, "run_case", rank_fails)
    assert cli.main(["case", "--model", "bert", "--profile", "smoke", "--parallel", "ddp",
                     "--world-size", "2", "-o", str(tmp_path / "c.json")]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "rank 1 failed during 'step'" in lines[0], err
    assert "RuntimeError: boom" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize(("wall_s", "shown"), [(779.6, "13:00"), (59.4, "0:59"), (61, "1:01")])
def test_the_run_cost_line_rounds_to_whole_minutes_and_seconds(wall_s, shown):
    import pandas as pd

    from gpubench.cli.main import _run_cost_line

    frame = pd.DataFrame({"rounds_s": [[1.0, 2.0]], "paired_baseline_rounds_s": [[1.0]]})
    assert _run_cost_line(frame, wall_s).startswith(f"the run took {shown}, of which timed "
                                                    "rounds 4 s")
