"""Every command's failure path: a failed case, an interrupted command, an out-of-memory and an
unexpected error end in one line naming what failed and why (the log with the traceback where
there is one) and a documented exit status; a workload that exits the process is a failure;
``--timeout`` bounds the workload's validation; JSON files stay strict."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from gpubench.cli import failure
from gpubench.cli import main as cli

FAULTS = str(Path(__file__).parent / "data" / "fault_workloads.py")
LSTM = str(Path(__file__).parent / "data" / "lstm_workload.py") + ":workload"
SMOKE = ["--profile", "smoke", "--device", "cpu"]


def strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity, as strict parsers do."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(autouse=True)
def _logs(tmp_path, monkeypatch):
    monkeypatch.setenv(failure.LOG_DIR_ENV, str(tmp_path / "logs"))
    monkeypatch.chdir(tmp_path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _argv(command: str, tmp_path: Path) -> list[str]:
    """A valid command line of each command (parsed, not run: its function is replaced)."""
    result = tmp_path / "r.json"
    return {
        "case": ["case", "--model", "bert", *SMOKE, "-o", str(tmp_path / "c.json")],
        "tune": ["tune", "--model", "bert", *SMOKE, "--out", str(tmp_path / "t")],
        "parity": ["parity", "--model", "bert", *SMOKE, "--out", str(tmp_path / "p")],
        "memory": ["memory", "--model", "bert", *SMOKE, "--out", str(tmp_path / "m")],
        "compare": ["compare", str(result), str(result)],
        "report": ["report", str(result), "-o", str(tmp_path / "rep")],
        "dist": ["dist", "--model", "bert", *SMOKE, "--out", str(tmp_path / "d.json")],
        "run": ["run", *SMOKE, "--out", str(tmp_path / "out")],
    }[command]


COMMANDS = ("case", "tune", "parity", "memory", "compare", "report", "dist", "run")


def _replace_command(monkeypatch, command: str, fn) -> None:
    if command == "dist":
        import gpubench.cli.torchrun

        monkeypatch.setattr(gpubench.cli.torchrun, "dist_main", fn)
    else:
        monkeypatch.setattr(cli, f"cmd_{command}", fn)


# -- one failure path for every command ---------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("raised", "code", "words"), [
    (RuntimeError("boom\nsecond line"), 1, "failed: RuntimeError: second line; traceback in"),
    (MemoryError(), 1, "ran out of memory: MemoryError; traceback in"),
    (KeyboardInterrupt(), 130, "interrupted (SIGINT)"),
    (SystemExit(0), 1, "called sys.exit(0)"),
    (SystemExit(7), 7, "called sys.exit(7)"),
], ids=["error", "oom", "ctrl-c", "exit0", "exit7"])
def test_every_command_fails_in_one_line_with_its_exit_status(command, raised, code, words,
                                                              tmp_path, monkeypatch, capsys):
    def fails(args):
        raise raised

    _replace_command(monkeypatch, command, fails)
    assert cli.main(_argv(command, tmp_path)) == code
    line = _one_line(capsys)
    assert line.startswith(f"gpubench {command}: ") and words in line, line
    if "traceback in" in line:
        log = Path(line.rsplit("traceback in ", 1)[1])
        assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text()
    assert code in failure.EXIT_CODES or code == 7


def test_exit_codes_are_documented():
    text = (Path(__file__).parents[1] / "docs" / "getting-started.md").read_text()
    for code in failure.EXIT_CODES:
        assert f"| {code} |" in text, code


# -- workloads that break the contract ----------------------------------------------------------

@pytest.mark.parametrize("command", ["case", "run", "tune", "parity", "memory"])
def test_a_factory_calling_sys_exit_0_fails_every_command(command, tmp_path, capsys):
    spec = f"{FAULTS}:exits"
    argv = [spec if a == "bert" else a for a in _argv(command, tmp_path)]
    if command == "run":
        argv += ["--model", spec]
    assert cli.main(argv) != 0
    line = _one_line(capsys)
    assert "called sys.exit(0)" in line, line


@pytest.mark.parametrize("command", ["case", "tune", "parity", "memory"])
def test_make_batch_ignoring_n_is_caught_at_the_largest_batch(command, tmp_path, capsys):
    argv = [f"{FAULTS}:ignores_n" if a == "bert" else a for a in _argv(command, tmp_path)]
    assert cli.main(argv) == 2
    line = _one_line(capsys)
    assert "make_batch(4, generator) must return 4 samples" in line and "ignore n" in line
    assert [p.name for p in tmp_path.iterdir() if p.name != "logs"] == []  # nothing written


def test_a_single_tensor_from_make_batch_names_the_pair_contract(tmp_path, capsys):
    assert cli.main(["case", "--model", f"{FAULTS}:one_tensor", *SMOKE, "-o",
                     str(tmp_path / "c.json")]) == 2
    line = _one_line(capsys)
    assert "must return a pair (inputs, targets); got a tensor of shape [2, 4]" in line, line


@pytest.mark.parametrize("command", ["case", "run"])
def test_timeout_bounds_a_blocking_make_batch_in_validation(command, tmp_path, capsys):
    from gpubench.util.watchdog import GRACE_S

    argv = (["case", "--model", f"{FAULTS}:blocking", *SMOKE, "-o", str(tmp_path / "c.json")]
            if command == "case" else
            ["run", *SMOKE, "--model", f"{FAULTS}:blocking", "--out", str(tmp_path / "out")])
    start = time.monotonic()
    assert cli.main([*argv, "--timeout", "2"]) == 2
    took = time.monotonic() - start
    line = _one_line(capsys)
    assert "did not finish within 2 s (hung?)" in line, line
    assert took < 2 + GRACE_S, took
    assert not (tmp_path / "out").exists() and not (tmp_path / "c.json").exists()


def test_a_case_out_of_memory_is_one_line_and_a_log(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert cli.main(["case", "--model", f"{FAULTS}:out_of_memory", *SMOKE, "--rounds", "2",
                     "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "gpubench case: hungry-fp32: ran out of memory: OutOfMemoryError" in err
    assert not out.exists()


def test_ctrl_c_mid_case_is_one_line_and_130(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert cli.main(["case", "--model", f"{FAULTS}:interrupted", *SMOKE, "--rounds", "2",
                     "-o", str(out)]) == 130
    line = _one_line(capsys)
    assert line.startswith("gpubench case: stops-fp32: interrupted (SIGINT)"), line
    assert not out.exists()


@pytest.mark.slow
def test_a_technique_the_cpu_lacks_is_one_line_naming_the_case(tmp_path, capsys):
    out = tmp_path / "c.json"
    code = cli.main(["case", "--model", LSTM, "--precision", "fp16", *SMOKE, "--rounds", "2",
                     "-o", str(out)])
    err = capsys.readouterr().err
    if code == 0:
        pytest.skip("this CPU runs an fp16 LSTM")
    assert code in (1, 3) and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "gpubench case: lstm-fp16" in err


# -- Ctrl-C keeps what finished ----------------------------------------------------------------

def test_parity_interrupted_after_fp32_keeps_it(tmp_path, capsys):
    out = tmp_path / "p"
    assert cli.main(["parity", "--model", f"{FAULTS}:stops_in_autocast", *SMOKE, "--techniques",
                     "fp32,bf16", "--steps", "4", "--no-chart", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted (SIGINT)" in lines[0], captured.err
    assert f"what finished is in {out / 'parity.json'}" in captured.out
    report = strict_json((out / "parity.json").read_text())
    assert [r["technique"] for r in report["techniques"]] == ["fp32"]
    assert report["interrupted"] == "SIGINT"
    assert report["left_out"]["bf16"] == "interrupted (SIGINT) before it finished"
    assert "not trained: bf16: interrupted" in (out / "parity.md").read_text()


def test_parity_interrupted_in_its_reference_writes_nothing(tmp_path, capsys):
    out = tmp_path / "p"
    assert cli.main(["parity", "--model", f"{FAULTS}:interrupted", *SMOKE, "--techniques",
                     "fp32", "--steps", "2", "--no-chart", "--out", str(out)]) == 130
    assert "interrupted (SIGINT)" in _one_line(capsys)
    assert not out.exists()


def test_memory_interrupted_after_a_frontier_keeps_it(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["memory", "--model", f"{FAULTS}:stops_in_autocast", *SMOKE,
                     "--techniques", "fp32,bf16", "--budget", "8G", "--max-batch", "8",
                     "--no-leaks", "--no-hygiene", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted (SIGINT)" in lines[0], captured.err
    assert f"what finished is in {out / 'memory.md'}, {out / 'memory.json'}" in captured.out
    report = strict_json((out / "memory.json").read_text())
    assert [f["technique"] for f in report["frontier"]] == ["fp32"]
    assert report["frontier"][0]["max_batch"] == 8 and report["interrupted"] == "SIGINT"
    text = (out / "memory.md").read_text()
    assert "stopsamp-fp32" in text and "Interrupted (SIGINT) after the frontier of fp32" in text

# -- files ------------------------------------------------------------------------------------


def test_json_is_written_strict(tmp_path):
    from gpubench.util import atomic

    path = tmp_path / "x.json"
    atomic.write_json(path, {"a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf}})
    assert strict_json(path.read_text()) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_tune_resume_of_a_truncated_file_names_it(tmp_path, capsys):
    out = tmp_path / "t"
    out.mkdir()
    (out / "tune.json").write_text('{"identity": {"version"')
    assert cli.main(["tune", "--model", "bert", *SMOKE, "--out", str(out), "--resume"]) == 2
    line = _one_line(capsys)
    assert f"{out / 'tune.json'}" in line and "not valid JSON" in line, line


def test_tune_interrupted_before_its_first_measurement_says_no_file(tmp_path, monkeypatch,
                                                                      capsys):
    import gpubench.diagnostics.tune as tune

    def stop(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune.Tuner, "run", stop)
    assert cli.main(["tune", "--model", "bert", *SMOKE, "--out", str(tmp_path / "t")]) == 130
    line = _one_line(capsys)
    assert "no tune.json was written" in line and "without --resume" in line, line


def test_a_lock_path_that_is_a_folder_is_one_line(tmp_path):
    from gpubench.measure.journal import JournalError, RunLock, lock_path

    json_path = tmp_path / "benchmark.json"
    lock_path(json_path).mkdir()
    with pytest.raises(JournalError, match="is a folder"):
        RunLock(json_path).acquire()


def test_compare_of_one_file_with_itself_says_so(tmp_path, monkeypatch, capsys):
    import gpubench.analysis.compare

    monkeypatch.setattr(gpubench.analysis.compare, "compare_main", lambda args, remeasure=None: 0)
    (tmp_path / "r.json").write_text("{}")
    assert cli.main(["compare", str(tmp_path / "r.json"), str(tmp_path / "r.json")]) == 0
    assert "BASE and NEW are the same file" in capsys.readouterr().err


def test_compare_refuses_a_bad_output_path_in_one_line_before_any_warning(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "afile").write_text("")
    assert cli.main(["compare", str(tmp_path / "r.json"), str(tmp_path / "r.json"),
                     "--markdown", str(tmp_path / "afile" / "c.md")]) == 2
    line = _one_line(capsys)
    assert "--markdown" in line and "same file" not in line, line


def test_a_resumed_run_prints_no_share_over_100_percent():
    import pandas as pd

    frame = pd.DataFrame({"rounds_s": [[5.0, 2.0]], "paired_baseline_rounds_s": [[1.0]]})
    line = cli._run_cost_line(frame, 6.0)
    assert "%" not in line and "before --resume" in line, line


# -- a real Ctrl-C: the terminal's SIGINT to the command's whole process group -------------------

@pytest.mark.slow
@pytest.mark.parametrize("command", ["case", "parity"])
def test_a_terminal_ctrl_c_mid_command_is_one_line_and_130(command, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    spec = f"{FAULTS}:slow_step"
    argv = {"case": ["case", "--model", spec, *SMOKE, "--rounds", "1000", "-o",
                     str(tmp_path / "c.json")],
            "parity": ["parity", "--model", spec, *SMOKE, "--techniques", "fp32",
                       "--steps", "1000", "--no-chart", "--out", str(tmp_path / "p")]}[command]
    proc = subprocess.Popen([sys.executable, "-m", "gpubench", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, failure.LOG_DIR_ENV: str(tmp_path / "logs")})
    try:
        first = proc.stdout.readline()  # "gpubench <command>: ... " once it runs
        assert first.startswith(f"gpubench {command}:"), first
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted (SIGINT)" in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "c.json").exists()
