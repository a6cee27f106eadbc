"""Rank processes kept between consecutive multi-process cases (``runner.RankPool``): the next
case rebuilds its program in the same processes, measures what a fresh group measures, and a
failure or a case of another shape starts afresh."""

from __future__ import annotations

import sys

import pytest
from processes import FORKED  # the tests folder is on sys.path

from gpubench.launchers.workers import WorkerError, WorkerGroup
from gpubench.measure.runner import RankPool, run_case
from gpubench.measure.standalone import StandaloneBenchmark
from gpubench.train.config import RunConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks ranks")


class Counter:
    def __init__(self, rank, world_size, start=0):
        self.rank, self.value = rank, start

    def bump(self):
        self.value += 1
        return self.value


def test_rebuild_replaces_each_ranks_program_in_the_same_processes():
    with WorkerGroup(2, Counter, (10,), start_method=FORKED) as group:
        pids = group.pids
        assert group.call("bump") == [11, 11]
        group.rebuild(Counter, (100,))
        assert group.call("bump") == [101, 101]
        assert group.pids == pids and group.alive


class LazyImports:
    """A rank that imports what a case's process imports up front, then says what it holds."""

    def __init__(self, rank, world_size):
        from gpubench.measure.protocol import import_lazy_modules

        import_lazy_modules()

    def modules(self):
        return sorted(name for name in ("scipy", "torch._dynamo") if name in sys.modules)


@pytest.mark.slow
def test_a_rank_process_does_not_import_what_only_the_rounds_process_needs():
    """scipy (the stopping rule's interval) is imported where the rounds run, up front; a
    WorkerGroup rank only steps when its host tells it, and pays for torch's own lazy import
    alone."""
    from gpubench.measure.protocol import import_lazy_modules

    import_lazy_modules()
    assert "scipy" in sys.modules and "torch._dynamo" in sys.modules
    with WorkerGroup(1, LazyImports) as group:
        assert group.call("modules") == [["torch._dynamo"]]


class Threads:
    def __init__(self, rank, world_size):
        pass

    def threads(self):
        import torch

        return torch.get_num_threads()


@pytest.mark.slow
def test_the_runs_threads_reach_the_worker_processes_it_starts(monkeypatch):
    """--threads 1 (``set_run_threads``): a multi-process case's paired baseline worker and a
    case in a process of its own step at one thread too, not at torch's default: the paired
    ratio of a DDP case would otherwise compare a 2-thread baseline with 1-thread ranks."""
    import torch

    from gpubench.launchers.workers import set_run_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # restored after
    before = torch.get_num_threads()
    try:
        set_run_threads(1)
        assert torch.get_num_threads() == 1
        with WorkerGroup(1, Threads) as group:
            assert group.call("threads") == [1]
    finally:
        torch.set_num_threads(before)


def _run(cfg, pool):
    return run_case(StandaloneBenchmark(cfg.id), cfg, rounds=2, warmup_rounds=0,
                    timeout_s=120, ranks=pool)


@pytest.mark.slow
def test_consecutive_ddp_cases_share_their_ranks_and_still_check_and_measure():
    pool = RankPool()
    try:
        first = RunConfig(model="bert", profile="smoke", parallel="ddp", world_size=2)
        second = first.with_(accum_steps=2)
        a = _run(first, pool)
        pids = pool.group.pids
        b = _run(second, pool)
        assert pool.started == 1 and pool.group.pids == pids  # no new processes
        for info in (a, b):
            assert info["check_grad_cosine"] > 0.9999 and info["flops_per_step"] > 0
        # accumulation over 2 micro-batches of the same size: twice the forward work
        assert b["flops_per_step"] == pytest.approx(2 * a["flops_per_step"], rel=0.01)
        other = first.with_(parallel="pipeline", chunks=2, world_size=2, accum_steps=1)
        _run(other, pool)  # same world size and backend: the same ranks again
        assert pool.started == 1
    finally:
        pool.close()
    assert pool.group is None


@pytest.mark.slow
def test_a_failing_case_stops_the_pooled_ranks(monkeypatch):
    pool = RankPool()
    try:
        cfg = RunConfig(model="bert", profile="smoke", parallel="ddp", world_size=2)
        with pool.lease(cfg, 120) as ranks:  # a case's program in running ranks
            ranks.call("noop")
        group = pool.group
        assert group.alive
        with pytest.raises(WorkerError):
            with pool.lease(cfg, 120) as ranks:
                assert ranks is group  # the same ranks, until the case fails
                ranks.call("no_such_command")
        assert pool.group is None and not group.alive
        with pool.lease(cfg, 120) as ranks:  # and the next case starts fresh ones
            assert ranks is not group and ranks.call("noop") == [None, None]
        assert pool.started == 2
    finally:
        pool.close()


def test_the_fork_server_imports_the_models_of_the_cases_that_fork_their_ranks():
    """A run's CPU DDP, FSDP and pipeline cases fork their ranks from one server, which imports
    their models' libraries once (``forked_imports``); in-process cases and cases spawned for
    an environment of their own add nothing to it."""
    from gpubench.measure.runner import forked_imports
    from gpubench.suite.cases import profile_cases

    configs = [c.cfg for c in profile_cases("smoke", "cpu", ("resnet18", "bert"))]
    assert forked_imports(configs) == {"torchvision.models",
                                       "transformers.models.bert.modeling_bert"}
    assert forked_imports(c for c in configs if not c.multiprocess) == set()
    assert forked_imports(c for c in configs if c.model == "bert" and c.multiprocess) == {
        "transformers.models.bert.modeling_bert"}
