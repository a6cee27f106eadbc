"""The measurement protocol's pairing: an in-process case is paired with a baseline partner in
its own process, built after the case's memory window, so the case's peaks stay its own."""

from __future__ import annotations

import pytest
import torch

from gpubench.measure.protocol import InProcess, PairedBaseline, measure
from gpubench.measure.standalone import StandaloneBenchmark
from gpubench.train.config import RunConfig


def _measure(cfg: RunConfig, baseline=None) -> dict:
    with InProcess(cfg) as group:
        return measure(StandaloneBenchmark(cfg.id), cfg, group, rounds=6, warmup_rounds=1,
                       baseline=baseline)


@pytest.mark.slow
def test_an_in_process_case_pairs_in_its_own_process_and_keeps_its_own_peak():
    cfg = RunConfig(model="resnet18", profile="smoke", precision="tf32")
    alone = _measure(cfg)
    baseline = PairedBaseline(cfg, timeout_s=60)
    try:
        paired = _measure(cfg, baseline)
        assert baseline.group is None  # no worker process was needed
    finally:
        baseline.close()
    assert paired["paired_partner"] == "this process"
    assert len(paired["paired_baseline_rounds_s"]) == 6
    assert paired["paired_baseline_case_id"] == "resnet18-fp32"
    # Its steps at rest before the rounds, what a disturbed pairing is read against.
    assert isinstance(paired["paired_baseline_steady_s"], float)
    assert paired["paired_baseline_steady_s"] > 0
    assert paired["paired_worker_offset"] is None  # no worker, no offset
    # The partner (ResNet-18: 45 MB of weights, as much of gradients and of momentum) is built
    # after the memory window: the case's figures do not include it.
    for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
        assert paired[key] == alone[key]
    assert paired["peak_memory_bytes"] < alone["peak_memory_bytes"] + 100 * 2**20


@pytest.mark.slow
def test_partner_worker_pairs_an_in_process_case_with_a_baseline_process_of_its_own():
    cfg = RunConfig(model="bert", profile="smoke", precision="tf32")
    baseline = PairedBaseline(cfg, timeout_s=60, in_process=False)
    try:
        paired = _measure(cfg, baseline)
        assert baseline.group is not None and baseline.group.alive  # the worker ran it
        assert len(baseline.times) == len(paired["paired_baseline_rounds_s"])
    finally:
        baseline.close()
    assert paired["paired_partner"] == "worker process"
    assert paired["paired_baseline_case_id"] == "bert-fp32"
    assert paired["paired_baseline_steady_s"] is None
    # The worker's own speed against this process's, measured paired when it started: what
    # its rounds said (its size is the machine's: BERT's smoke step in this process read 2.4
    # times the worker's once, under a loaded CI machine).
    offset = baseline.offset
    assert offset is not None and len(offset.case_s) == len(offset.base_s) >= 6
    assert paired["paired_worker_offset"] == offset.ratio > 0
    assert paired["paired_worker_offset_width"] == offset.width >= 0
    assert len(paired["paired_baseline_rounds_s"]) >= 6


class _Worker:
    """A baseline worker's group that answers each step with a fixed time."""

    def call(self, command):
        assert command == "step"
        return [0.01]


def test_a_worker_offset_that_does_not_fit_falls_back_to_none(monkeypatch):
    """The worker's offset needs the baseline built in this process too: where a step of it
    runs out of device memory, there is no offset (the baseline case is the reference then)
    and the baseline built for it is freed, not a failed case."""
    from gpubench.measure import protocol

    baseline = PairedBaseline(RunConfig(model="bert", profile="smoke"), timeout_s=60)
    baseline.group = _Worker()
    closed = []
    real_close = protocol.LocalBaseline.close

    def out_of_memory(self):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(protocol.LocalBaseline, "step", out_of_memory)
    monkeypatch.setattr(protocol.LocalBaseline, "close",
                        lambda self: closed.append(self) or real_close(self))
    assert baseline.measure_offset() is None
    assert len(closed) == 1 and closed[0].partner is None


def test_gpubench_run_rejects_an_unknown_partner(capsys):
    from gpubench.cli import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--partner", "elsewhere"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "elsewhere" in err and "process" in err and "worker" in err


@pytest.mark.slow
def test_the_next_models_baseline_is_built_in_the_previous_baseline_worker():
    first = PairedBaseline(RunConfig(model="resnet18", profile="smoke"), timeout_s=60)
    second = None
    try:
        first.step()
        pids = first.group.pids
        second = PairedBaseline(RunConfig(model="bert", profile="smoke"), timeout_s=60,
                                spare=first.handoff())
        assert first.group is None
        second.step()
        assert second.group.pids == pids  # no new process
        with InProcess(RunConfig(model="bert", profile="smoke")) as bert:
            bert.call("reset_peak")
            want = bert.call("read_peak")[0]["param_bytes"]
        second.group.call("reset_peak")
        assert second.group.call("read_peak")[0]["param_bytes"] == want  # bert's program
    finally:
        first.close()
        if second is not None:
            second.close()
