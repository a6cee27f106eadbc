"""The expandable-segments technique on the CPU, as far as it can be tested without a GPU: the
config field, its skip reason here, the launcher's choice of a process of its own, and the
environment that process starts with (in place before it imports torch)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from gpubench.launchers.workers import WorkerGroup
from gpubench.measure import runner
from gpubench.suite.cases import profile_cases
from gpubench.train.build import unsupported_reason
from gpubench.train.config import RunConfig
from gpubench.util.signals import guarded_call

VAR = "PYTORCH_CUDA_ALLOC_CONF"


def test_field_validated_and_named_in_the_id():
    cfg = RunConfig(model="resnet18", expandable_segments=True)
    assert cfg.id == "resnet18-fp32-expseg"
    assert not cfg.is_baseline and cfg.baseline == RunConfig(model="resnet18")
    assert cfg.flatten()["expandable_segments"] is True
    with pytest.raises(ValueError, match=r"expandable_segments must be True or False; got 'yes'"):
        RunConfig(model="resnet18", expandable_segments="yes")


def test_skipped_on_the_cpu_with_a_one_line_reason():
    reason = unsupported_reason(RunConfig(model="resnet18", expandable_segments=True))
    assert reason and "CUDA" in reason and "\n" not in reason
    (case,) = [c for c in profile_cases("cpu", "cpu", ("resnet18",)) if c.cfg.expandable_segments]
    assert case.group == "memory" and case.id == "resnet18-fp32-expseg"
    assert case.skip_reason() == reason
    gpu = [c.id for c in profile_cases("gpu-small", "cuda", ("resnet50",))]
    assert "resnet50-fp32-expseg" in gpu


def test_worker_env_adds_the_option_to_what_is_set():
    assert RunConfig(model="resnet18").worker_env({}) == {}
    cfg = RunConfig(model="resnet18", device="cuda", expandable_segments=True)
    assert cfg.worker_env({}) == {VAR: "expandable_segments:True"}
    set_before = {VAR: "max_split_size_mb:128,expandable_segments:False",
                  "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    assert cfg.worker_env(set_before) == {
        VAR: "max_split_size_mb:128,expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6,expandable_segments:True",
    }


def _recorder(log: list) -> type:
    """A stand-in for a launcher class: records how it was made, starts nothing."""

    class Recorder:
        def __init__(self, *args, **kwargs):
            log.append((args, kwargs))

    return Recorder


def test_launcher_gives_the_case_a_process_of_its_own(monkeypatch):
    made = []
    Group, Here = _recorder(made), _recorder([])
    monkeypatch.setattr(runner, "WorkerGroup", Group)
    monkeypatch.setattr(runner, "InProcess", Here)
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    cfg = RunConfig(model="resnet18", device="cuda", expandable_segments=True)
    assert cfg.in_workers and not cfg.multiprocess
    assert isinstance(runner.launcher(cfg, timeout_s=12), Group)
    (args, kwargs), = made
    assert args[0] == 1 and args[2] == (cfg,)  # one rank running this case's program
    assert kwargs["env"] == {VAR: "expandable_segments:True"}
    assert kwargs["backend"] == "gloo" and kwargs["timeout_s"] == 12
    # The plain single-device case stays in this process; DDP ranks get no allocator setting.
    assert isinstance(runner.launcher(RunConfig(model="resnet18")), Here)
    ddp = RunConfig(model="resnet18", parallel="ddp", world_size=2)
    runner.launcher(ddp)
    assert made[-1][0][0] == 2 and made[-1][1]["env"] == {}


def test_spawned_entry_point_sees_the_variable_before_torch_is_imported(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=guarded_call,
                       args=(os.getpid(), True, "alloc_env_probe:report", child),
                       kwargs={"env": {VAR: "expandable_segments:True"}})
    proc.start()
    child.close()
    try:
        assert parent.poll(60), "the probe did not answer"
        seen = parent.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert seen == {"alloc_conf": "expandable_segments:True", "torch_imported": False}
    assert VAR not in os.environ  # set in the child only


class EnvProgram:
    """A rank that reports its allocator setting."""

    def __init__(self, rank, world_size):
        pass

    def alloc_conf(self):
        return os.environ.get(VAR)


@pytest.mark.slow
def test_worker_started_for_the_case_has_the_setting(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    cfg = RunConfig(model="resnet18", device="cuda", expandable_segments=True)
    with WorkerGroup(1, EnvProgram, env=cfg.worker_env(), timeout_s=60) as group:
        assert group.call("alloc_conf") == ["expandable_segments:True"]
    with WorkerGroup(1, EnvProgram, timeout_s=60) as group:  # without: the default allocator
        assert group.call("alloc_conf") == [None]
    assert VAR not in os.environ


def test_empty_cache_on_cuda_gets_an_allocator_of_its_own(monkeypatch):
    """torch.cuda.empty_cache() frees every cached block of the process: beside its paired
    baseline it would free the baseline's too. On CUDA the case runs in a process of its own
    (and pairs with the baseline's worker); on the CPU, which has no cache, it stays here."""
    made = []
    Group, Here = _recorder(made), _recorder([])
    monkeypatch.setattr(runner, "WorkerGroup", Group)
    monkeypatch.setattr(runner, "InProcess", Here)
    cfg = RunConfig(model="resnet18", device="cuda", empty_cache=True)
    assert cfg.in_workers and not cfg.multiprocess
    assert isinstance(runner.launcher(cfg, timeout_s=12), Group)
    (args, kwargs), = made
    assert args[0] == 1 and args[2] == (cfg,) and kwargs["env"] == {}
    assert isinstance(runner.launcher(RunConfig(model="resnet18", empty_cache=True)), Here)
