"""FSDP2 (``parallel="fsdp"``): a step equals single-process training on the global batch, each
rank holds half of the model state at 2 ranks, a case's record passes its training check and a
broken gradient reduction fails it. Ranks really run, as gloo processes on this CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from processes import FORKED  # the tests folder is on sys.path

from gpubench.launchers.workers import WorkerGroup
from gpubench.measure.memory import SavedActivations, state_breakdown
from gpubench.measure.protocol import CaseProgram
from gpubench.measure.runner import run_case
from gpubench.measure.standalone import StandaloneBenchmark
from gpubench.train.build import build
from gpubench.train.checks import GRAD_TOL, TrainingCheckError, check_case
from gpubench.train.config import RunConfig
from gpubench.train.parallel import shard_units
from gpubench.workloads.api import build_train_module

PARAM_ATOL = 1e-6
"""Parameters after one SGD step: the same sums in another order (float32)."""

BASE = RunConfig(model="bert", profile="smoke", parallel="fsdp", world_size=2, micro_batch=4)


def _global_batch(n: int):
    torch.manual_seed(123)
    return next(build(RunConfig(model="bert", profile="smoke", micro_batch=n)).batches)


class FSDPRank:
    """One rank: the tests' commands on FSDP cases built on it."""

    def __init__(self, rank, world_size):
        torch.set_num_threads(1)  # two ranks on two cores
        self.rank = rank
        self.program: CaseProgram | None = None

    def load(self, cfg: RunConfig) -> None:
        """Build ``cfg``'s rank program: the measurement commands then reach it (``run_case``
        drives these ranks like a torchrun job's)."""
        self.program = CaseProgram(self.rank, 2, cfg)

    def __getattr__(self, name):
        program = self.__dict__.get("program")
        if program is None:
            raise AttributeError(name)
        return getattr(program, name)

    def one_step(self, cfg: RunConfig):
        """One step on this rank's half of a fixed global batch of 8: the whole parameters
        after it, this rank's state bytes and the activations its micro-batch saved."""
        from torch.distributed.tensor import DTensor

        case = build(cfg, self.rank)
        inputs, targets = _global_batch(8)
        shard = slice(self.rank * 4, (self.rank + 1) * 4)
        k = cfg.accum_steps
        micro = zip(inputs[shard].chunk(k), targets[shard].chunk(k), strict=True)
        with SavedActivations(case.model) as saved:
            case.step(iter(micro))
        params = {n: p.detach().full_tensor() for n, p in case.strategy.module.named_parameters()}
        assert all(isinstance(p, DTensor) for p in case.model.parameters())
        return params, state_breakdown(case.model, case.optimizer), saved.per_micro_batch_bytes

    def training_check(self, cfg: RunConfig, broken: bool):
        """The training check; ``broken``: gradients summed over the ranks, not averaged."""
        from torch.distributed.fsdp import FSDPModule

        case = build(cfg, self.rank)
        if broken:
            for module in case.strategy.module.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
                    module.set_gradient_divide_factor(1.0)
        try:
            return dataclasses.asdict(check_case(case))
        except TrainingCheckError as err:
            return str(err)


@pytest.fixture(scope="module")
def ranks():
    group = WorkerGroup(2, FSDPRank, timeout_s=120, start_method=FORKED)
    yield group
    group.close(graceful=False)  # nothing to wait for: the ranks' work is done


def _single(n: int, inputs, targets):
    """Single-process SGD step on ``n`` samples: the model and optimizer after it, and the
    activations it saved."""
    single = build(RunConfig(model="bert", profile="smoke", micro_batch=n))
    with SavedActivations(single.model) as saved:
        single.step(iter([(inputs[:n], targets[:n])]))
    return single, saved.per_micro_batch_bytes


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.slow
def test_fsdp_step_equals_single_process_on_global_batch_with_half_the_state(ranks, accum):
    results = ranks.call("one_step", BASE.with_(accum_steps=accum, micro_batch=4 // accum))
    inputs, targets = _global_batch(8)
    single, _ = _single(8, inputs, targets)
    for name, p in single.model.named_parameters():
        for params, _, _ in results:
            torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=PARAM_ATOL)
    whole = state_breakdown(single.model, single.optimizer)
    for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
        per_rank = [state[key] for _, state, _ in results]
        assert sum(per_rank) == whole[key] > 0  # shards: nothing replicated, nothing lost
        assert all(0.45 < b / whole[key] < 0.55 for b in per_rank), (key, per_rank, whole)
    if accum == 1:
        # FSDP's gathered parameters are parameters, not saved activations: each rank saves
        # what one process saves for the same 4 samples.
        _, single_saved = _single(4, inputs, targets)
        assert [saved for _, _, saved in results] == [single_saved, single_saved]


def test_fsdp_check_passes_and_a_summed_gradient_fails_it(ranks):
    good = ranks.call("training_check", BASE, False)
    for result in good:
        assert isinstance(result, dict), result
        assert result["grad_cosine"] > 1 - 1e-6 and result["grad_norm_ratio"] == pytest.approx(1)
    bad = ranks.call("training_check", BASE, True)
    assert all(isinstance(r, str) and "gradient differs" in r and "norm ratio 2.0" in r
               for r in bad), bad


def test_fsdp_mixed_precision_case_record_passes_its_check(ranks):
    cfg = RunConfig(model="bert", profile="smoke", parallel="fsdp", world_size=2,
                    fsdp_mixed_precision=True)
    assert cfg.id == "bert-fp32-fsdp2-mp" and cfg.global_batch == 2 * cfg.resolved_micro_batch
    ranks.call("load", cfg)
    info = run_case(StandaloneBenchmark(cfg.id), cfg, rounds=2, warmup_rounds=0, group=ranks)
    cos_tol, norm_tol = GRAD_TOL["bf16"]  # FSDP's mixed precision computes in bf16
    assert info["check_grad_cosine"] >= 1 - cos_tol
    assert abs(info["check_grad_norm_ratio"] - 1) <= norm_tol
    assert info["check_grad_cosine"] < 1 - 1e-7  # bf16 compute: not bit-identical to fp32
    assert info["fsdp_mixed_precision"] is True and info["parallel"] == "fsdp"
    whole = sum(p.numel() * 4 for p in build_train_module(cfg.workload).parameters())
    # fp32 shards for the optimizer: half the fp32 model per rank.
    assert 0.45 < info["param_bytes"] / whole < 0.55
    assert 0.45 < info["optimizer_state_bytes"] / whole < 0.55


def test_fsdp_config_validation_and_units():
    with pytest.raises(ValueError, match="fsdp_mixed_precision needs parallel 'fsdp'"):
        RunConfig(model="bert", profile="smoke", fsdp_mixed_precision=True)
    with pytest.raises(ValueError, match="precision 'fp32'"):
        RunConfig(model="bert", profile="smoke", parallel="fsdp", world_size=2,
                  precision="bf16", fsdp_mixed_precision=True)
    cfg = RunConfig(model="resnet18", profile="smoke", parallel="fsdp", world_size=2)
    assert cfg.multiprocess and cfg.parallelism.replicas == 2
    net = build_train_module(cfg.workload).net
    units = shard_units(net)
    assert [type(u).__name__ for u in units] == ["BasicBlock"] * 8  # downsample stays inside
