"""A /dev/shm too small for the loader cases' workers (Docker's 64 MiB) is known before they run:
they skip with the reason, which ``gpubench list`` shows, instead of dying in a DataLoader
shared-memory traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gpubench import Workload
from gpubench.cli import main as cli
from gpubench.train import data as loader_data
from gpubench.train.build import unsupported_reason
from gpubench.train.config import LoaderConfig, RunConfig
from gpubench.train.data import shared_memory_need, shared_memory_reason

SPEC = f"{Path(__file__).resolve()}:"


def images(profile: str = "smoke") -> Workload:
    """3 x 224 x 224 float32 images (602,112 bytes) and int64 labels, 256 a batch."""
    return Workload(name="shmimages", build_model=lambda: nn.Sequential(nn.Flatten(1),
                                                                      nn.Linear(3 * 224 * 224, 2)),
                    make_batch=lambda n, g: (torch.randn(n, 3, 224, 224, generator=g),
                                             torch.randint(0, 2, (n,), generator=g)),
                    micro_batch=256, loss_fn=nn.functional.cross_entropy)


def _cfg(**loader) -> RunConfig:
    return RunConfig(model=SPEC + "images", profile="smoke",
                     loader=LoaderConfig(dataset="synthetic", **loader))


def test_the_need_is_workers_times_prefetch_plus_one_batches():
    batch = 256 * (3 * 224 * 224 * 4 + 8)
    assert shared_memory_need(_cfg()) == 0  # no workers: the batches stay in this process
    assert shared_memory_need(_cfg(num_workers=2)) == (2 * 2 + 1) * batch
    assert shared_memory_need(_cfg(num_workers=2, prefetch_factor=4)) == (2 * 4 + 1) * batch
    ddp = _cfg(num_workers=2).with_(parallel="ddp", world_size=2)
    assert shared_memory_need(ddp) == 2 * (2 * 2 + 1) * batch  # each rank's loader
    # 32 workers of 224 px batches need about 10 GB, not the 2 GB of 32 x 2 x 32 MB guesses
    assert 9.5e9 < shared_memory_need(_cfg(num_workers=32)) < 10.5e9


def test_the_reason_names_the_need_what_is_free_and_the_fix():
    cfg = _cfg(num_workers=4)
    assert shared_memory_reason(cfg, free_bytes=2**40) is None
    assert shared_memory_reason(_cfg(), free_bytes=0) is None
    reason = shared_memory_reason(cfg, free_bytes=64 * 2**20)
    assert reason == ("its loader needs about 1.29 GiB of shared memory ((4 workers x 2 "
                      "prefetched batches + 1) x 147 MiB a batch) and /dev/shm has 64 MiB free "
                      "(Docker's default is 64 MiB: run the container with --shm-size=3g or "
                      "--ipc=host)")


def test_a_small_dev_shm_skips_the_loader_cases_in_list(monkeypatch, capsys):
    monkeypatch.setattr(loader_data, "shared_memory_free_bytes", lambda path="": 64 * 2**20)
    assert "shared memory" in unsupported_reason(_cfg(num_workers=1))
    assert cli.main(["list", "--profile", "smoke", "--model", SPEC + "images",
                     "--groups", "loader"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "skips" not in rows["shmimages-fp32-synthetic"]  # no workers: no shared memory
    assert "skips here: its loader needs about" in rows["shmimages-fp32-synthetic-w2"]
    assert "/dev/shm has 64 MiB free" in rows["shmimages-fp32-synthetic-w2"]


@pytest.mark.parametrize("free", [None, 2**40])
def test_enough_or_no_dev_shm_skips_nothing(monkeypatch, free):
    monkeypatch.setattr(loader_data, "shared_memory_free_bytes", lambda path="": free)
    assert unsupported_reason(_cfg(num_workers=2)) is None


def test_this_machine_reports_its_dev_shm():
    free = loader_data.shared_memory_free_bytes()
    assert free is None or free >= 0


def test_a_case_run_with_too_little_dev_shm_skips_before_anything_is_built(monkeypatch):
    """At run time the free space is read again, case by case (the run before it may have
    filled /dev/shm): the case is unsupported, which the benchmark turns into a skip with
    the reason, before its model, loader or workers exist."""
    from gpubench.measure.runner import run_case
    from gpubench.train.build import Unsupported

    monkeypatch.setattr(loader_data, "shared_memory_free_bytes", lambda path="": 64 * 2**20)
    with pytest.raises(Unsupported, match=r"needs about 735 MiB of shared memory .* and "
                                          r"/dev/shm has 64 MiB free"):
        run_case(None, _cfg(num_workers=2), rounds=3, warmup_rounds=1)
