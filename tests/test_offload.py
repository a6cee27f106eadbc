"""Activation offloading (``offload``: ``ActivationOffload``, on the CPU ``save_on_cpu``): its
hooks surround the step, a broken offload fails the training check, its count is the plain
step's, and its claim is judged from the OOM frontier and the case's speed."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from test_advice import _row  # the tests folder is on sys.path (pytest's rootdir-less import)

from gpubench.analysis.advice import advise
from gpubench.measure import protocol
from gpubench.measure.protocol import CaseProgram
from gpubench.suite.cases import profile_cases
from gpubench.suite.claims import CLAIMS
from gpubench.train import implementations
from gpubench.train.build import build
from gpubench.train.checks import TrainingCheckError, check_case
from gpubench.train.config import RunConfig

CFG = RunConfig(model="resnet18", profile="smoke", offload=True)
OFFLOAD = CLAIMS["offload"].text


def test_offload_cases_and_record_form():
    ids = {c.id for c in profile_cases("cpu", "cpu", ("resnet18",), ("memory",))}
    assert {"resnet18-fp32-offload", "resnet18-fp32-ckpt-offload"} <= ids
    assert CFG.id == "resnet18-fp32-offload"
    assert CFG.inert_techniques == ["offload (activations already live in host memory: only "
                                    "the copies remain)"]


def test_the_offload_hooks_surround_every_micro_batch(monkeypatch):
    packed = []
    real = torch.autograd.graph.save_on_cpu

    class Spy(real):
        def __init__(self, pin_memory=False, device_type="cuda"):
            super().__init__(pin_memory=pin_memory, device_type=device_type)
            inner = self.pack_hook

            def pack(tensor):
                packed.append(tensor.shape)
                return inner(tensor)

            self.pack_hook = pack

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Spy)
    with build(CFG.with_(accum_steps=2)) as case:
        check_case(case)  # passes: offloading changes where tensors wait, not what they are
        before = len(packed)
        case.step()
    assert before > 0 and len(packed) - before >= 2 * 10  # both micro-batches' saved tensors


def test_a_broken_offload_fails_the_training_check(monkeypatch):
    """An offload whose unpack hands back zeros in place of the saved tensor (a lost copy)."""
    def broken(self):
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t,
                                                        lambda t: torch.zeros_like(t))

    monkeypatch.setattr(implementations.Offload, "forward", broken)
    with build(CFG) as case, pytest.raises(TrainingCheckError, match="differs from plain FP32"):
        check_case(case)


def test_the_count_of_an_offload_case_is_the_plain_steps():
    counts = {}
    for cfg in (CFG.baseline, CFG):
        protocol._LAST_COUNT.clear()  # counted afresh, not reused
        program = CaseProgram(0, 1, cfg)
        try:
            program.check()
            counts[cfg.id] = program.count()
        finally:
            program.close()
    base, off = counts["resnet18-fp32"], counts["resnet18-fp32-offload"]
    assert off["activation_bytes"] == base["activation_bytes"] > 0
    assert off["flops"] == base["flops"]


def _report(plain, offloaded):
    def entry(technique, batch):
        return {"technique": technique, "cfg_id": technique, "max_batch": batch, "tries": [],
                "capped": False}
    return {"model": "bert", "device": "cuda", "hygiene": None,
            "frontier": [entry("fp32", plain), entry("offload", offloaded)]}


@pytest.mark.parametrize(("median", "offloaded", "expected"), [
    (1.1, 1024, "holds"),  # 0.91x speed, twice the batch
    (2.0, 1024, "partly holds (max_batch)"),  # it fits, at half the speed: no modest cost
    (1.1, 512, "partly holds (time)"),  # modest cost, but no larger batch fits
])
def test_the_offload_claim_is_judged_from_the_frontier_and_the_speed(median, offloaded,
                                                                     expected):
    rows = [_row("bert-fp32", 1.0, device="cuda", offload=False, noise=0.002),
            _row("bert-fp32-offload", median, device="cuda", offload=True, noise=0.002,
                 group="memory")]
    (v,) = [v for v in advise(pd.DataFrame(rows), [_report(512, offloaded)])
            if v.claim == OFFLOAD]
    assert v.verdict == expected, v
    assert "512 -> " in v.measured


def test_the_offload_claim_is_not_testable_on_the_cpu():
    rows = [_row("bert-fp32", 1.0, offload=False), _row("bert-fp32-offload", 1.1, offload=True)]
    (v,) = [v for v in advise(pd.DataFrame(rows)) if v.claim == OFFLOAD]
    assert v.verdict == "not testable here" and "host memory" in v.why


