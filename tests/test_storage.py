"""Cold storage: files dropped from the page cache before each epoch are read
from the disk again, measurably slower; the cold cases, the storage probe and the storage
verdict."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_advice import _row  # the tests folder is on sys.path (pytest's rootdir-less import)
from torch.utils.data import DataLoader, Dataset

from gpubench.analysis.advice import advise
from gpubench.suite.claims import CLAIMS
from gpubench.train.config import LoaderConfig, RunConfig
from gpubench.train.data import endless, measure_loader
from gpubench.workloads import storage

FILES, FILE_BYTES = 8, 8 << 20
"""64 MB over 8 files: one batch of 8 reads them all."""


def _write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(FILES):
        path = folder / f"{i:02d}.bin"
        with open(path, "wb") as f:
            f.write(os.urandom(FILE_BYTES))
            f.flush()
            os.fsync(f.fileno())
        paths.append(path)
    return paths


def _evictable(paths: list[Path]) -> None:
    """Skip, saying why, where this platform or filesystem cannot drop files from the cache."""
    reason = storage.eviction_unsupported_reason()
    if reason:
        pytest.skip(reason)
    storage.evict(paths)
    left = storage.resident_fraction(paths)
    if left is None:
        pytest.skip("mincore is not available: cannot tell whether the eviction happened")
    if left > 0.5:
        fs, _ = storage._mount_of(paths[0].parent)
        pytest.skip(f"{left:.0%} of the files stayed in the page cache after "
                    f"POSIX_FADV_DONTNEED: this filesystem ({fs or 'unknown'}, e.g. tmpfs or "
                    "overlay) keeps them, so it cannot show a cold read")


class Files(Dataset):
    """Each sample is one whole file's bytes (a real read per sample)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def files(self) -> list[Path]:
        return self.paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        # Read in 1 MiB blocks into one buffer: a warm read is then a copy from the cache,
        # not page faults of a fresh 8 MB object, so the disk's share stands out.
        block, total = bytearray(1 << 20), 0
        with open(self.paths[i], "rb", buffering=0) as f:
            while n := f.readinto(block):
                total += n
        assert total == FILE_BYTES
        return torch.frombuffer(block[:8], dtype=torch.uint8)


def test_eviction_empties_the_cache_and_a_read_fills_it(tmp_path):
    paths = _write(tmp_path / "data")
    _evictable(paths)
    assert storage.resident_fraction(paths) < 0.05
    for p in paths:
        p.read_bytes()
    assert storage.resident_fraction(paths) > 0.95


def test_each_epoch_of_a_cold_loader_starts_from_the_disk(tmp_path):
    """An epoch that starts with an eviction reads its first batch from the disk: the files'
    pages are out of the page cache when the epoch's iterator starts and back in it after the
    first batch, each of three epochs. (Whether the disk is slower than the cache is the
    machine's: a fast NVMe drive, or a VM disk the host caches, reads near memory speed; the
    storage probe measures it: ``test_storage_probe_measures_and_cleans_up``.)"""
    paths = _write(tmp_path / "data")
    _evictable(paths)
    dataset = Files(paths)
    assert storage.dataset_files(dataset, tmp_path) == paths
    evictor = storage.Evictor(storage.dataset_files(dataset, tmp_path))
    resident_at_start = []

    def evict_and_look():
        evictor()
        resident_at_start.append(storage.resident_fraction(paths))

    loader = DataLoader(dataset, batch_size=FILES)
    after = []
    for _ in range(3):
        next(endless(loader))  # the files are in the cache now
        assert storage.resident_fraction(paths) > 0.95
        next(endless(loader, evict_and_look))
        after.append(storage.resident_fraction(paths))
    assert evictor.evictions == 3 and len(evictor.evict_s) == 3
    assert max(resident_at_start) < 0.05, resident_at_start
    assert min(after) > 0.95, after


def test_measure_loader_evicts_before_each_iterator(tmp_path):
    paths = _write(tmp_path / "data")
    _evictable(paths)
    loader = DataLoader(Files(paths), batch_size=2)
    calls = []

    def evict():
        calls.append(storage.resident_fraction(paths))
        storage.evict(paths)

    measure_loader(loader, 2, evict)
    # Before the first iterator and before the restart; the first read left 6 of 8 files cached.
    assert len(calls) == 2 and calls[1] > 0.5


def test_dataset_files_finds_folder_path_cache_and_data_root(tmp_path):
    from gpubench.workloads.datasets import CachedDataset

    paths = _write(tmp_path / "d")

    class Folder(Dataset):
        folder = tmp_path / "d"

        def __len__(self):
            return 1

        def __getitem__(self, i):
            return i

    class OneFile(Folder):
        path = paths[0]
        folder = None

    assert storage.dataset_files(Folder(), tmp_path) == paths
    assert storage.dataset_files(OneFile(), tmp_path) == [paths[0]]
    assert storage.dataset_files(CachedDataset(Folder(), 1), tmp_path) == paths
    assert storage.dataset_files(torch.utils.data.TensorDataset(torch.zeros(1)),
                                 tmp_path / "d") == paths
    with pytest.raises(ValueError, match="found none"):
        storage.Evictor([])


def test_storage_probe_measures_and_cleans_up(tmp_path):
    from gpubench.util import atomic

    # What a probe killed mid-way left: its process (pid 2^22 + 1, above any pid_max) is gone.
    (tmp_path / f".storage-probe.{2**22 + 1}-{atomic.HOST_ID}.abcdefgh").write_bytes(b"x")
    out = storage.probe_storage(tmp_path, size_bytes=8 << 20)
    if storage.eviction_unsupported_reason():
        assert out["storage_note"] and out["storage_read_mb_s"] is None
        return
    assert out["storage_read_mb_s"] > 0 and out["storage_cached_mb_s"] > 0
    assert out["storage_random_iops"] > 0
    assert out["storage_probe_bytes"] == 8 << 20
    assert list(tmp_path.iterdir()) == []  # the probe file is gone, and the stale one
    resident = out["storage_resident_after_evict"]
    if resident is not None and resident > 0.5:
        assert "stayed in the page cache" in out["storage_note"]


def test_storage_probe_of_an_unwritable_folder_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = storage.probe_storage(blocker / "data")
    if not storage.eviction_unsupported_reason():
        assert "cannot write a probe file" in out["storage_note"]
    assert out["storage_read_mb_s"] is None


# -- configuration and cases ------------------------------------------------------------------


def test_cold_is_a_validated_loader_field():
    cfg = RunConfig(model="resnet18", profile="smoke",
                    loader=LoaderConfig(dataset="images-jpeg", num_workers=2, cold=True))
    assert cfg.id == "resnet18-fp32-images-jpeg-w2-cold"
    assert cfg.flatten()["cold"] is True
    with pytest.raises(ValueError, match="cold must be True or False; got 'yes'"):
        LoaderConfig(dataset="images-jpeg", cold="yes")
    with pytest.raises(ValueError, match="cold applies to a workload's own"):
        LoaderConfig(dataset="synthetic", cold=True)
    with pytest.raises(ValueError, match="cold applies to a workload's own"):
        LoaderConfig(cold=True)


def test_cold_cases_sit_beside_the_warm_ones():
    from gpubench.suite.cases import knob_workers, profile_cases

    cpu = profile_cases("cpu", "cpu")
    cold = [c for c in cpu if c.cfg.loader.cold]
    assert [c.id for c in cold] == ["resnet18-fp32-images-jpeg-cold",
                                    f"resnet18-fp32-images-jpeg-w{knob_workers('cpu')}-cold"]
    ids = {c.id for c in cpu}
    for c in cold:  # each has its warm twin
        assert c.id.removesuffix("-cold") in ids
    small = profile_cases("gpu-small", "cuda")
    assert {c.cfg.name for c in small if c.cfg.loader.cold} == {"resnet50", "bert", "gpt2"}
    assert not any(c.cfg.loader.cold for c in profile_cases("smoke", "cpu"))
    base = RunConfig(model="resnet18", profile="cpu")
    assert CLAIMS["storage"].config("base", base).id in ids
    assert CLAIMS["storage"].config("new", base).id in ids


def test_a_cold_case_records_that_its_files_left_the_cache(tmp_path):
    """The smoke ResNet's JPEGs, read cold: the record says how much stayed cached."""
    from gpubench.measure.protocol import CaseProgram

    cfg = RunConfig(model="resnet18", profile="smoke",
                    loader=LoaderConfig(dataset="images-jpeg", cold=True))
    program = CaseProgram(0, 1, cfg, data_dir=tmp_path)
    try:
        info = program.prepare()
        program.step()
    finally:
        program.close()
    assert info["cold_files"] == 64 + 1  # the images and the manifest
    assert info["cold_evict_s"] >= 0
    if storage.eviction_unsupported_reason() is None and info["cold_resident_fraction"] > 0.5:
        pytest.skip(f"{tmp_path}'s filesystem keeps evicted files cached")
    assert info["cold_resident_fraction"] < 0.05
    # measure_loader's two iterators, the residency check, then the steps' first epoch.
    assert program.case.evictor.evictions == 4


# -- the verdict ------------------------------------------------------------------------------


def _storage_rows(cold0, cold2, *, resident=0.0, own=True):
    data = dict(dataset="images-jpeg", group="loader")
    mine = dict(workload_datasets=["images-jpeg"] if own else [], model="resnet18",
                storage_read_mb_s=123.0, storage_random_iops=4567.0, storage_fs="ext4")
    return [
        _row("resnet18-fp32", 0.5, is_baseline=True, **mine),
        _row("resnet18-fp32-images-jpeg", 1.0, loader_stall_fraction=0.2,
             loader_samples_per_s=200.0, **data, **mine),
        _row("resnet18-fp32-images-jpeg-w2", 0.8, num_workers=2, loader_stall_fraction=0.1,
             **data, **mine),
        _row("resnet18-fp32-images-jpeg-cold", cold0, cold=True, loader_stall_fraction=0.4,
             loader_samples_per_s=100.0,
             cold_resident_fraction=resident, **data, **mine),
        _row("resnet18-fp32-images-jpeg-w2-cold", cold2, num_workers=2, cold=True,
             loader_stall_fraction=0.1, cold_resident_fraction=resident, **data, **mine),
    ]


def _storage_verdict(rows):
    return next(v for v in advise(pd.DataFrame(rows)) if v.claim == CLAIMS["storage"].text)


def test_storage_verdict_compares_cold_and_warm_at_the_same_workers():
    v = _storage_verdict(_storage_rows(1.5, 0.8))
    # Without workers, cold reads cost 1.5x; two workers hide them.
    assert v.verdict == "partly holds (0 workers)", v
    assert "123 MB/s sequential" in v.measured and "4,567 random 4 KiB" in v.measured
    assert re.search(r"0 workers: warm vs cold 1\.(4[5-9]|5[0-5])x speed", v.measured), v
    assert "loader alone 2.00x" in v.measured  # the 2-worker pair has no loader figures
    assert "stall cold -> warm: 0 workers 40% -> 20%" in v.why
    assert _storage_verdict(_storage_rows(1.0, 0.8)).verdict == "does not hold"
    assert _storage_verdict(_storage_rows(1.5, 1.2)).verdict == "holds"


def test_storage_verdict_inconclusive_when_the_files_stayed_cached():
    v = _storage_verdict(_storage_rows(1.5, 1.2, resident=0.9))
    assert v.verdict == "inconclusive" and "90% of the dataset's pages stayed" in v.why


def test_storage_verdict_not_applicable_without_a_dataset_and_missing_without_cold_cases():
    v = _storage_verdict(_storage_rows(1.5, 1.2, own=False))
    assert v.verdict == "not applicable"
    rows = [r for r in _storage_rows(1.5, 1.2) if not r.get("cold")]
    v = _storage_verdict(rows)
    assert v.verdict == "inconclusive" and "not measured" in v.why


def test_cold_cases_do_not_answer_the_workers_claim():
    """The workers verdict compares warm cases: a cold 0-worker case is not its base."""
    rows = _storage_rows(3.0, 3.0)
    v = next(v for v in advise(pd.DataFrame(rows)) if v.claim == CLAIMS["loader-workers"].text)
    assert "best: resnet18-fp32-images-jpeg-w2;" in v.why and "stall 20% -> 10%" in v.why


# -- results and summary ----------------------------------------------------------------------


def test_results_carry_the_probe_and_the_summary_shows_cold_beside_warm(tmp_path):
    import json

    from test_results import _doc, _record

    from gpubench.analysis.results import ResultsError, load_results
    from gpubench.report.summary import summary_markdown

    def step(case_id, median, **extra):
        loader = dict(dataset="images-jpeg", num_workers=0, cached=False, pin_memory=False,
                      persistent_workers=False, non_blocking=False)
        return _record(case_id=case_id, is_baseline=False, step_time_s=median,
                       samples_per_s=8 / median, **{**loader, **extra})

    doc = _doc(_record(), step("bert-fp32-images-jpeg", 0.2, loader_stall_fraction=0.1),
               step("bert-fp32-images-jpeg-cold", 0.3, cold=True, loader_stall_fraction=0.4,
                    cold_resident_fraction=0.0, cold_files=65, cold_evict_s=0.002))
    probe = storage.probe_storage(tmp_path / "probe", size_bytes=1 << 20)
    doc["machine_info"]["gpubench"]["storage"] = {**probe, "storage_read_mb_s": 150.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    df = load_results([path])
    assert (df["storage_read_mb_s"] == 150.0).all()
    assert df["cold"].dtype == "boolean" and df["cold_files"].dtype == "Int64"
    text = summary_markdown(df)
    assert "Data folder's disk (r): 150 MB/s sequential" in text
    line = next(row for row in text.splitlines() if "bert-fp32-images-jpeg-cold" in row
                and "200.0" in row)
    assert "300.0" in line and "40%" in line and "10%" in line, line
    doc["machine_info"]["gpubench"]["storage"] = {"storage_read_mb_s": -1}
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match="machine_info.gpubench.storage.storage_read_mb_s"):
        load_results([path])


def test_the_probe_can_be_skipped_from_gpubench_run(tmp_path):
    from gpubench.cli.main import build_parser, pytest_command

    args = build_parser().parse_args(["run", "--profile", "smoke", "--device", "cpu",
                                      "--no-storage-probe"])
    assert "--gpubench-no-storage-probe" in pytest_command(args, tmp_path / "b.json")
    args = build_parser().parse_args(["run", "--profile", "smoke", "--device", "cpu"])
    assert "--gpubench-no-storage-probe" not in pytest_command(args, tmp_path / "b.json")


def test_storage_verdict_uses_the_paired_baseline_rounds_against_drift():
    """The warm case ran while the machine was slower (its baseline rounds too): the raw rounds
    look the same, the rounds over their paired baseline rounds show the cold reads' cost."""
    rows = _storage_rows(1.0, 0.8)
    for row in rows:
        if row["case_id"] == "resnet18-fp32-images-jpeg-cold":
            row["paired_baseline_rounds_s"] = [r / 2.0 for r in row["rounds_s"]]
        elif row["case_id"] == "resnet18-fp32-images-jpeg":  # baseline 0.71 s, not 0.5
            row["paired_baseline_rounds_s"] = [r / 1.4 for r in row["rounds_s"]]
    v = _storage_verdict(rows)
    assert v.verdict == "partly holds (0 workers)", v
    assert "rounds over their paired baseline rounds and separate cases" in v.why
    # cold 2.0 baseline rounds a round, warm 1.4: warm is 1.43x faster.
    assert re.search(r"0 workers: warm vs cold 1\.(3[8-9]|4[0-8])x speed", v.measured), v
    assert _storage_verdict(_storage_rows(1.0, 0.8)).verdict == "does not hold"
