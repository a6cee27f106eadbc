"""On-disk datasets, the decoded-sample cache, loader reproducibility and the stall metric."""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import threading
import time

import pytest
import torch

from gpubench.train.build import build
from gpubench.train.config import LoaderConfig, RunConfig
from gpubench.train.data import WaitTimer, build_loader, endless, measure_loader
from gpubench.workloads.datasets import (
    MANIFEST,
    CachedDataset,
    DataError,
    ImageFolderDataset,
    ensure_image_folder,
    ensure_token_file,
)


def _folder(tmp_path, count=12, fmt="images-jpeg"):
    return ensure_image_folder(tmp_path, fmt, count=count, size=48, num_classes=10)


@pytest.mark.parametrize("fmt", ["images-jpeg", "images-png"])
def test_image_dataset_is_generated_once_and_decodes(tmp_path, fmt):
    folder = _folder(tmp_path, fmt=fmt)
    mtime = (folder / MANIFEST).stat().st_mtime_ns
    assert _folder(tmp_path, fmt=fmt) == folder  # reused, not regenerated
    assert (folder / MANIFEST).stat().st_mtime_ns == mtime
    ds = ImageFolderDataset(folder, image_size=16)
    image, label = ds[3]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert 0 <= int(label) < 10


def test_incomplete_dataset_is_regenerated(tmp_path):
    folder = _folder(tmp_path)
    (folder / "000004.jpg").unlink()  # an interrupted or damaged generation
    again = _folder(tmp_path)
    assert (again / "000004.jpg").exists()
    assert len(ImageFolderDataset(again, 16)) == 12


def test_corrupt_file_error_names_it(tmp_path):
    folder = _folder(tmp_path)
    bad = folder / "000002.jpg"
    size = bad.stat().st_size
    bad.write_bytes(b"\0" * size)  # same size, so the manifest still accepts the folder
    ds = ImageFolderDataset(folder, 16)
    with pytest.raises(DataError, match="000002.jpg"):
        ds[2]


def test_unwritable_cache_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DataError, match="cannot create the data cache folder"):
        ensure_image_folder(blocker / "data", "images-jpeg", 4, 32, 10)
    if os.geteuid() != 0:  # root can write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(DataError, match="not writable"):
            ensure_image_folder(locked, "images-jpeg", 4, 32, 10)


def test_concurrent_generation_does_not_corrupt(tmp_path):
    results, errors = [], []

    def generate():
        try:
            results.append(_folder(tmp_path, count=30))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=generate) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    manifest = json.loads((results[0] / MANIFEST).read_text())
    assert len(manifest["files"]) == 30
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_token_file_windows(tmp_path):
    folder = ensure_token_file(tmp_path, count=20, seq_len=8, vocab_size=100)
    raw = torch.from_file(str(folder / "tokens.bin"), size=20 * 8 + 1, dtype=torch.int16)
    assert int(raw.max()) < 100
    cfg = RunConfig(model="gpt2", profile="smoke",
                    loader=LoaderConfig(dataset="tokens-mmap", dataset_size=20))
    case = build(cfg, data_dir=tmp_path)
    inputs, targets = next(case.batches)
    assert inputs.dtype == torch.int64 and torch.equal(inputs, targets)
    assert inputs.shape == (4, 16) and int(inputs.max()) < 256  # the smoke vocabulary
    case.close()


def test_cache_returns_the_same_samples_and_is_bounded(tmp_path):
    ds = ImageFolderDataset(_folder(tmp_path), 16)
    cached = CachedDataset(ds, max_items=4)
    for i in range(len(ds)):
        torch.testing.assert_close(cached.dataset.load(i)[0], ds.load(i)[0])
        assert cached[i][1] == ds[i][1]
    assert len(cached._cache) == 4
    for _ in range(2):
        cached[0]
    assert cached.hits >= 1
    # Augmentation still runs on every access: same decoded image, same seed -> same sample.
    torch.manual_seed(0)
    a = cached[1][0]
    torch.manual_seed(0)
    b = ds[1][0]
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_with_seed_is_reproducible_across_worker_counts(tmp_path, workers):
    ds = ImageFolderDataset(_folder(tmp_path), 16)
    order = [build_loader(ds, LoaderConfig(dataset="synthetic", num_workers=w), 4, seed=7)
             for w in (0, workers)]
    labels = [[tuple(b[1].tolist()) for b in loader] for loader in order]
    assert labels[0] == labels[1]


class _Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.zeros(4), torch.tensor(0)


def test_stall_is_near_zero_for_resident_data_and_large_for_a_slow_dataset():
    slow = WaitTimer(endless(build_loader(_Slow(), LoaderConfig(dataset="synthetic"), 4, 0)),
                     lambda b: b)
    for _ in range(5):
        next(slow)
        time.sleep(0.005)  # the "compute" of a step
    # Each batch's wait holds its four samples' 10 ms sleeps, however the machine schedules
    # the rest (a share of the elapsed time would depend on it).
    assert len(slow.waits) == 5 and min(slow.waits) >= 4 * 0.01, slow.waits

    # Resident data: the typical wait is a small part of the typical step (medians: one
    # preemption of this process during a wait, on a loaded machine, is not the loader's).
    case = build(RunConfig(model="bert", profile="smoke",
                           loader=LoaderConfig(dataset="device-resident")))
    steps = []
    for _ in range(9):
        start = time.perf_counter()
        case.step()
        steps.append(time.perf_counter() - start)
    assert statistics.median(list(case.batches.waits)[-9:]) < 0.05 * statistics.median(steps)


def test_loader_probe_and_workers_do_not_outlive_the_case(tmp_path):
    cfg = RunConfig(model="resnet18", profile="smoke",
                    loader=LoaderConfig(dataset="images-jpeg", num_workers=2,
                                        persistent_workers=True))
    case = build(cfg, data_dir=tmp_path)
    probe = measure_loader(case.loader, 3)
    assert probe["loader_samples_per_s"] > 0 and probe["time_to_first_batch_s"] > 0
    next(case.batches)
    assert multiprocessing.active_children()
    case.close()
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("fmt", ["images-jpeg", "images-png"])
def test_parallel_generation_writes_the_same_files_and_labels(tmp_path, fmt):
    from gpubench.workloads.datasets import MIN_FILES_PER_PROCESS

    count = 2 * MIN_FILES_PER_PROCESS + 5  # enough for two processes, chunks of unequal size
    folders = [ensure_image_folder(tmp_path / f"p{n}", fmt, count, 24, 10, seed=3, processes=n)
               for n in (1, 2)]
    manifests = [json.loads((f / MANIFEST).read_text()) for f in folders]
    assert manifests[0] == manifests[1] and len(manifests[0]["files"]) == count
    for name in manifests[0]["files"]:
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
    assert len(set(manifests[0]["labels"].values())) > 1  # labels vary, and agree above
    # A different seed gives different images.
    other = ensure_image_folder(tmp_path / "seed4", fmt, count, 24, 10, seed=4, processes=2)
    first = sorted(manifests[0]["files"])[0]
    assert (other / first).read_bytes() != (folders[0] / first).read_bytes()


def test_parallel_generation_leaves_no_workers_and_no_temporary_folder(tmp_path):
    ensure_image_folder(tmp_path, "images-jpeg", 80, 16, 10, processes=2)
    assert not multiprocessing.active_children()
    assert [p.name for p in tmp_path.iterdir()] == ["images-jpeg-16px-80-c10-s0"]


def test_png_set_is_small_and_cycled_over(tmp_path):
    from gpubench.workloads.datasets import SMALL_SETS, image_file_count

    small = SMALL_SETS["images-png"]
    assert image_file_count("images-png", 4096) == image_file_count("images-png", 8192) == small
    assert image_file_count("images-png", 40) == 40
    assert image_file_count("images-jpeg", 4096) == 4096  # JPEG sets: every sample a file
    count = small + 100
    folder = ensure_image_folder(tmp_path, "images-png", count, 16, 10)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert len(manifest["files"]) == small and manifest["samples"] == count
    ds = ImageFolderDataset(folder, image_size=8)
    assert len(ds) == count
    for i in (0, 7, small - 1):
        image, label = ds.load(small + i if small + i < count else i)
        torch.testing.assert_close(image, ds.load(i)[0])
        assert label == ds.load(i)[1]
    with pytest.raises(IndexError):
        ds.load(count)
    # The loader reads the whole request (DataLoader's sampler goes by len).
    loader = build_loader(ds, LoaderConfig(), 64, seed=0)
    assert len(loader) == count // 64
