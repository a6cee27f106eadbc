"""Parallel strategies: equivalence with single-process training, and the worker machinery's
behaviour under faults. DDP and pipeline ranks really run, as gloo processes on this CPU."""

from __future__ import annotations

import os
import time

import pytest
import torch
from processes import FORKED  # the tests folder is on sys.path

from gpubench.launchers.workers import WorkerError, WorkerGroup, WorkerTimeout
from gpubench.measure.protocol import combine
from gpubench.train.build import build, check_world_size
from gpubench.train.config import RunConfig
from gpubench.train.data import seed_worker

PARAM_ATOL = 1e-6
"""Parameters after one SGD step: the same sums in another order (float32)."""


def _global_batch(cfg: RunConfig, n: int):
    torch.manual_seed(123)
    case = build(cfg.with_(parallel="single", world_size=1, ddp_no_sync=False, micro_batch=n,
                           chunks=1, schedule="gpipe"))
    return next(case.batches)


class DDPOneStep:
    """A rank that trains one step on its half of a fixed global batch."""

    def __init__(self, rank, world_size, cfg):
        self.rank, self.world_size, self.cfg = rank, world_size, cfg

    def run(self):
        case = build(self.cfg, self.rank)
        inputs, targets = _global_batch(self.cfg, 8)
        shard = slice(self.rank * 4, (self.rank + 1) * 4)
        k = self.cfg.accum_steps
        micro = zip(inputs[shard].chunk(k), targets[shard].chunk(k), strict=True)
        case.step(iter(micro))
        return {n: p.detach().clone() for n, p in case.model.module.named_parameters()}


@pytest.mark.parametrize("no_sync", [False, True])
@pytest.mark.slow
def test_ddp_step_equals_single_process_on_global_batch(no_sync):
    cfg = RunConfig(model="bert", profile="smoke", parallel="ddp", world_size=2, micro_batch=4,
                    accum_steps=2 if no_sync else 1, ddp_no_sync=no_sync)
    with WorkerGroup(2, DDPOneStep, (cfg,), start_method=FORKED) as group:
        rank_params = group.call("run")
    single = build(RunConfig(model="bert", profile="smoke", micro_batch=8))
    single.step(iter([_global_batch(cfg, 8)]))
    for name, p in single.model.named_parameters():
        for params in rank_params:
            torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=PARAM_ATOL)


def test_model_parallel_matches_unsplit_model():
    base = RunConfig(model="resnet18", profile="smoke")
    single, split = build(base), build(base.with_(parallel="model", world_size=2))
    inputs, targets = next(single.batches)
    for case in (single, split):
        case.model(inputs, targets).backward()
    assert split.model(inputs, targets).item() == pytest.approx(
        single.model(inputs, targets).item(), rel=1e-6)
    grads = [p.grad for p in single.model.parameters()]
    split_grads = [p.grad for p in split.model.parameters()]
    assert len(grads) == len(split_grads)
    for a, b in zip(grads, split_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


class PipelineOneStep:
    """One pipeline step of any configuration ``run`` is given, in ranks started once."""

    def __init__(self, rank, world_size):
        self.rank = rank

    def run(self, cfg):
        case = build(cfg, self.rank)
        k = cfg.accum_steps
        inputs, targets = _global_batch(cfg, cfg.micro_batch * k)
        loss = case.step(iter(zip(inputs.chunk(k), targets.chunk(k), strict=True)))
        params = {n: p.detach().clone() for n, p in case.model.stage.named_parameters()}
        return params, None if loss is None else loss.item(), torch.get_num_threads()


@pytest.fixture(scope="module")
def pipeline_ranks():
    """Two ranks for every pipeline configuration of this module: each configuration is built
    afresh in them, as a run's consecutive cases are (the ranks' start-up paid once)."""
    with WorkerGroup(2, PipelineOneStep, (), start_method=FORKED) as group:
        yield group


@pytest.mark.parametrize("model, schedule, accum", [
    ("resnet18", "gpipe", 1), ("resnet18", "1f1b", 1), ("bert", "gpipe", 1),
    # Accumulation over schedule steps: torch's default scale_grads would divide the gradients
    # accumulated from the first micro-batch by the chunk count a second time.
    ("bert", "1f1b", 2)])
@pytest.mark.slow
def test_pipeline_step_equals_unsplit_model_accumulating_over_chunks(model, schedule, accum,
                                                                    pipeline_ranks):
    cfg = RunConfig(model=model, profile="smoke", parallel="pipeline", world_size=2,
                    micro_batch=8, chunks=4, schedule=schedule, accum_steps=accum)
    results = pipeline_ranks.call("run", cfg)
    # The unsplit model trained on the same samples as 4 * accum accumulated chunks of 2, at the
    # ranks' thread count (batch norm's reductions are ordered by it).
    torch.set_num_threads(results[0][2])
    n = 4 * accum
    single = build(RunConfig(model=model, profile="smoke", micro_batch=2, accum_steps=n))
    inputs, targets = _global_batch(cfg, 8 * accum)
    loss = single.step(iter(zip(inputs.chunk(n), targets.chunk(n), strict=True)))
    assert results[1][1] == pytest.approx(loss.item(), rel=1e-5)
    stages = single.workload.stages(single.model.net, 2)
    for rank, (params, _, _) in enumerate(results):
        for name, p in stages[rank].named_parameters():
            torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=PARAM_ATOL)


class Faulty:
    def __init__(self, rank, world_size):
        self.rank = rank

    def boom(self):
        if self.rank == 1:
            raise RuntimeError("injected failure on rank 1")
        time.sleep(60)  # rank 0 would wait forever on its peer

    def hang(self):
        if self.rank == 0:
            time.sleep(60)

    def allreduce(self):
        t = torch.ones(3)
        torch.distributed.all_reduce(t)
        return t.tolist()


def _alive(pids):
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def test_failing_rank_fails_fast_with_its_traceback_and_no_orphans():
    group = WorkerGroup(2, Faulty, start_method=FORKED)
    pids = group.pids
    start = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 failed") as err:
        group.call("boom")
    assert "injected failure on rank 1" in str(err.value)
    assert "Traceback" in str(err.value)
    assert time.monotonic() - start < 15
    assert not _alive(pids)


@pytest.mark.slow
def test_hanging_rank_times_out_with_clear_message_and_no_orphans():
    group = WorkerGroup(2, Faulty, timeout_s=2, start_method=FORKED)
    pids = group.pids
    with pytest.raises(WorkerTimeout, match=r"rank\(s\) 0 did not finish 'hang' within 2 s"):
        group.call("hang")
    assert not _alive(pids)


@pytest.mark.slow
def test_two_groups_at_once_do_not_collide():
    with (WorkerGroup(2, Faulty, start_method=FORKED) as a,
          WorkerGroup(2, Faulty, start_method=FORKED) as b):
        assert a.call("allreduce") == b.call("allreduce") == [[2.0] * 3] * 2


def test_bad_world_size_is_an_error_before_any_process_starts():
    with pytest.raises(ValueError, match="world_size must be a positive integer; got 0"):
        RunConfig(model="bert", parallel="ddp", world_size=0)
    with pytest.raises(ValueError, match="world_size must be a positive integer; got 0"):
        WorkerGroup(0, Faulty)
    cfg = RunConfig(model="bert", device="cuda", parallel="ddp", world_size=64)
    with pytest.raises(ValueError, match="needs 64 CUDA devices; this machine has"):
        check_world_size(cfg)


def test_ranks_read_disjoint_shards_and_seed_workers_apart():
    cfg = RunConfig(model="bert", profile="smoke", parallel="ddp", world_size=2)
    seen = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(
            range(32), num_replicas=2, rank=rank, shuffle=True, seed=cfg.seed)
        seen.append(set(sampler))
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 32
    draws = []
    for rank in range(2):
        seed_worker(0, base_seed=0, rank=rank)
        draws.append(torch.rand(1).item())
    assert draws[0] != draws[1]


def _device(peak):
    return {"peak_memory_bytes": peak, "step_memory_bytes": 1, "peak_reserved_bytes": None,
            "peak_memory_method": "m"}


def test_combine_takes_max_memory_and_sums_flops():
    check = {"reference_loss": 1.0, "first_loss": 1.0, "rtol": 1e-4, "losses": [1.0, 0.5],
             "skipped_steps": 0}
    no_loss = {**check, "first_loss": None, "reference_loss": None, "losses": []}
    mem = {"devices": [_device(10)], "param_bytes": 4, "grad_bytes": 4,
           "optimizer_state_bytes": 4, "rank_step_time_s": 0.1, "last_loss": None,
           "loader_wait_s": 0.01, "loader_stall_fraction": 0.1}
    counts = [{"flops": 3, "activation_bytes": 7, "uncounted_ops": []},
              {"flops": 5, "activation_bytes": 9, "uncounted_ops": ["aten.x"]}]
    prepared = [{"time_to_first_batch_s": 0.5}, {"time_to_first_batch_s": 0.7}]
    out = combine(prepared, [no_loss, check], counts,
                  [mem, {**mem, "devices": [_device(20)], "last_loss": 0.4,
                         "loader_stall_fraction": 0.3}])
    assert out["peak_memory_bytes"] == 20 and out["rank_peak_memory_bytes"] == [10, 20]
    assert out["flops_per_step"] == 8 and out["loss_first"] == 1.0 and out["last_loss"] == 0.4
    assert out["activation_bytes"] == 9 and out["uncounted_ops"] == ["aten.x"]
    assert out["loader_stall_fraction"] == 0.3 and out["time_to_first_batch_s"] == 0.5


def test_combine_reports_every_device_of_one_process():
    check = {"reference_loss": 1.0, "first_loss": 1.0, "rtol": 1e-4, "losses": [1.0, 0.5],
             "skipped_steps": 0}
    mem = {"devices": [_device(10), _device(30)], "param_bytes": 4, "grad_bytes": 4,
           "optimizer_state_bytes": 4, "rank_step_time_s": 0.1, "last_loss": 0.5,
           "loader_wait_s": 0.0, "loader_stall_fraction": 0.0}
    out = combine([{}], [check], [{"flops": 1, "activation_bytes": 1, "uncounted_ops": []}],
                  [mem])
    assert out["peak_memory_bytes"] == 30 and out["device_peak_memory_bytes"] == [10, 30]
    assert "rank_peak_memory_bytes" not in out
