"""A workload whose own code fails or blocks is the documented one-line error and exit 2, before
any case runs: ``build_model`` or ``make_batch`` raising, or blocking past the limit."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from gpubench import Workload, WorkloadError
from gpubench.cli import main as cli
from gpubench.workloads.api import validate
from gpubench.workloads.registry import resolve

SPEC = f"{Path(__file__).resolve()}:"


def _batch(n, g):
    return torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)


def raising_build():
    def build():
        raise RuntimeError("cannot allocate\nthe embedding table")

    return Workload(name="badbuild", build_model=build, make_batch=_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


def raising_batch():
    def make_batch(n, g):
        raise KeyError("images")

    return Workload(name="badbatch", build_model=lambda: nn.Linear(4, 2),
                    make_batch=make_batch, micro_batch=4, loss_fn=nn.functional.cross_entropy)


def blocking_build():
    def build():
        threading.Event().wait()

    return Workload(name="stuckbuild", build_model=build, make_batch=_batch, micro_batch=4,
                    loss_fn=nn.functional.cross_entropy)


@pytest.mark.parametrize("factory, message", [
    ("raising_build", "build_model() raised RuntimeError: cannot allocate the embedding table"),
    ("raising_batch", "make_batch(2, generator) raised KeyError: 'images'"),
])
def test_a_workload_that_raises_is_one_line(factory, message):
    with pytest.raises(WorkloadError) as err:
        validate(resolve(SPEC + factory, "smoke"))
    assert str(err.value) == f"workload {SPEC + factory}: {message}"


def test_a_workload_that_blocks_fails_its_check_in_time():
    done = threading.Event()  # a broken limit would hang here: end the test process instead

    def guard():
        if not done.wait(60):
            os.write(2, b"\ntest_a_workload_that_blocks_fails_its_check_in_time hung\n")
            os._exit(1)

    threading.Thread(target=guard, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(WorkloadError, match=r"blocking_build: checking it \(build_model, "
                       r"make_batch, one forward\) did not finish within 1 s \(hung\?\)$"):
        validate(resolve(SPEC + "blocking_build", "smoke"), timeout_s=1)
    done.set()
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("command", [
    ["list"], ["run", "--no-charts"], ["case", "-o", "{out}/one.json"], ["advise"]])
def test_a_build_model_that_raises_exits_2_on_one_line(command, tmp_path, capsys):
    args = [a.replace("{out}", str(tmp_path)) for a in command]
    extra = ["--out", str(tmp_path / "out")] if command[0] in ("run", "advise") else []
    code = cli.main([*args, "--profile", "smoke", "--model", SPEC + "raising_build", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"gpubench: workload {SPEC}raising_build: build_model() raised "
                   "RuntimeError: cannot allocate the embedding table"]
    assert list(tmp_path.iterdir()) == []


LSTM = str(Path(__file__).resolve().parent / "data" / "lstm_workload.py") + ":workload"


def test_list_says_beforehand_that_checkpointing_finds_no_blocks(capsys):
    assert cli.main(["list", "--profile", "smoke", "--model", LSTM, "--groups", "memory"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["lstm-fp32-ckpt"].endswith(
        "skips here: activation checkpointing of lstm: no nn.ModuleList/nn.Sequential of "
        "blocks to checkpoint; give the Workload a checkpointing function")
    assert "skips" not in rows["lstm-fp32-zerofill"]


def test_checkpointing_runs_where_blocks_or_a_function_exist():
    from gpubench.suite.cases import profile_cases

    kws = str(Path(__file__).resolve().parent / "kws_workload.py") + ":workload"
    own = SPEC + "own_checkpointing"
    for spec in (kws, own):
        ckpt = [c for c in profile_cases("smoke", "cpu", (spec,), ("memory",))
                if c.cfg.checkpointing]
        assert ckpt and all(c.skip_reason() is None for c in ckpt), spec


def own_checkpointing():
    return Workload(name="ownckpt", build_model=lambda: nn.Linear(4, 2), make_batch=_batch,
                    micro_batch=4, loss_fn=nn.functional.cross_entropy,
                    checkpointing=lambda model: None)
