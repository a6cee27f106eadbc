"""The options of a benchmark session are declared once (``gpubench.cli.options.SESSION_OPTIONS``):
``gpubench run`` and the pytest plugin both declare them from it, and every value given to
``gpubench run`` reaches the pytest child unchanged."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gpubench.cli.main import build_parser, pytest_command
from gpubench.cli.options import SESSION_OPTIONS, add_session_arguments
from gpubench.launchers.workers import DEFAULT_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]

GIVEN = {"groups": "memory,layout", "rounds": "7", "warmup": "2", "max_time": "1.5",
         "min_time": "0.25", "target_width": "0.03", "energy_block": "1.5", "timeout": "90",
         "threads": "2", "data_dir": "/tmp/somewhere", "partner": "worker"}


def _plugin_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_session_arguments(parser.add_argument, pytest=True)
    return parser


def test_every_value_given_to_gpubench_run_reaches_the_pytest_child(tmp_path):
    argv = ["run", "--profile", "smoke", "--device", "cpu"]
    for option in SESSION_OPTIONS:
        if option.flag:
            argv.append(option.cli_flag())
        elif option.name in GIVEN:
            argv += [option.cli_flag(), GIVEN[option.name]]
    assert {o.name for o in SESSION_OPTIONS if not o.flag} == {*GIVEN, "profile", "device"}
    args = build_parser().parse_args(argv)
    command = pytest_command(args, tmp_path / "run.json")
    # the session's options; --gpubench-hygiene is the run's (its child's file)
    handed = [a for a in command if a.startswith("--gpubench-") and "models" not in a
              and not a.startswith("--gpubench-hygiene=")]
    child, rest = _plugin_parser().parse_known_args(handed)
    assert rest == []
    for option in SESSION_OPTIONS:
        assert getattr(child, "gpubench_" + option.name) == getattr(args, option.name), option.name
    # Left at their defaults, nothing is handed on beyond the resolved target.
    plain = pytest_command(build_parser().parse_args(["run", "--profile", "smoke", "--device",
                                                      "cpu"]), tmp_path / "run.json")
    assert [a for a in plain if a.startswith("--gpubench-")] == [
        "--gpubench-profile=smoke", "--gpubench-device=cpu",
        f"--gpubench-hygiene={tmp_path / '.hygiene.json'}"]


@pytest.mark.slow
def test_the_plugin_declares_the_same_options_as_gpubench_run():
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    done = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "benchmarks"), "--help",
                           "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for option in SESSION_OPTIONS:
        assert option.cli_flag() in run_help
        assert option.pytest_flag() in done.stdout
    assert f"(default {DEFAULT_TIMEOUT_S:g})" in run_help.replace("\n", " ").replace("  ", " ")


def test_the_runs_pytest_child_leaves_hypothesis_unloaded(tmp_path):
    """Hypothesis's pytest plugin (installed with the test extras) costs every ``gpubench run``
    about 0.9 s to load and serves no benchmark: the run's pytest child blocks it."""
    command = pytest_command(build_parser().parse_args(
        ["run", "--profile", "smoke", "--device", "cpu", "--no-hygiene"]), tmp_path / "run.json")
    assert command[:3] == [sys.executable, "-m", "pytest"]
    done = subprocess.run([sys.executable, "-X", "importtime", *command[1:], "--collect-only",
                           "-q", "-k", "resnet18-fp32 and not ddp"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_step[resnet18-fp32]" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert any(name.startswith("pytest_benchmark.") for name in imported)
    assert not [name for name in imported if name.split(".")[0] == "hypothesis"]
