"""Real data on disk: encoded image files and a memory-mapped token file, generated once into a
cache folder, plus a bounded cache of decoded samples.

Generation writes into a private temporary folder and renames it into place, and a manifest
written last marks a folder complete, so two runs generating at once cannot corrupt it and an
interrupted generation is detected and redone; the hidden partial folder a killed generation leaves
is removed by the next generation in the same folder (or ``gpubench run``'s start). Loading costs
what it costs in training: each image is a file read, a JPEG/PNG decode (PIL) and torchvision
augmentations.

Images are generated in parallel over the machine's cores (one process per core, each writing
its share of the files into the private temporary folder), each image from its own random
stream (seeded by the dataset's seed and the image's index), so the files and labels are the
same whatever the number of processes. The PNG set is small (``SMALL_SETS``): a larger request
is served by cycling over its files.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from gpubench.util import atomic
from gpubench.workloads.datacache import (  # noqa: F401 - part of this module's interface
    default_data_dir,
    remove_stale_partials,
)

MANIFEST = "manifest.json"
IMAGE_FORMATS = {"images-jpeg": ("JPEG", ".jpg"), "images-png": ("PNG", ".png")}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

SMALL_SETS = {"images-png": 512}
"""Formats generated as a small set of files: the PNG set is an extra dataset, which one loader
case reads for a few batches, and a PNG costs twice a JPEG to generate (its encoding) and six
times its disk space. A request for more samples gets ``image_file_count`` files, which the
dataset cycles over (each a real file read and decode)."""

MAX_READS_PER_FILE = 16
"""In a small set, a file is read at most this many times per epoch (more files beyond that)."""

MIN_FILES_PER_PROCESS = 32
"""Generation uses no more processes than this many files each keep busy (smaller sets are
written in this process: starting workers would cost more than it saves)."""


class DataError(ValueError):
    """A dataset folder or file that cannot be used; the message names it."""


def ensure_writable_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create the data cache folder {path}: {err.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise DataError(f"the data cache folder {path} is not writable")
    return path


def _read_manifest(folder: Path) -> dict | None:
    """The manifest of a complete dataset folder, or None if missing, unreadable or if any file
    it lists is missing or has the wrong size (an interrupted or damaged generation)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        for name, size in manifest["files"].items():
            if (folder / name).stat().st_size != size:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished folder into place; if another process got there first, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if _read_manifest(final) is None:  # a damaged folder: replace it
            shutil.rmtree(final, ignore_errors=True)
            try:
                os.rename(tmp, final)
                return
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def _synthetic_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """A photo-like image: smooth colour gradients, a few shapes, mild noise. Pure noise would
    make encoded files unrealistically large and slow to decode."""
    y, x = np.mgrid[0:size, 0:size] / size
    channels = [
        np.sin(2 * np.pi * (rng.uniform(0.5, 3) * x + rng.uniform(0.5, 3) * y + rng.uniform()))
        for _ in range(3)
    ]
    img = (np.stack(channels, -1) + 1) * 110
    for _ in range(4):
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        mask = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[mask] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def image_file_count(fmt: str, count: int) -> int:
    """Files generated for a request of ``count`` samples: all of them, except for a small-set
    format (``SMALL_SETS``), which gets its set size, or more where a file would otherwise be
    read more than ``MAX_READS_PER_FILE`` times an epoch."""
    small = SMALL_SETS.get(fmt)
    if small is None:
        return count
    return min(count, max(small, -(-count // MAX_READS_PER_FILE)))


def default_processes() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _write_images(folder: str, fmt: str, start: int, stop: int, size: int, num_classes: int,
                  seed: int) -> list[tuple[str, int, int]]:
    """Write images ``start``..``stop - 1`` into ``folder``; (name, bytes, label) of each. Image
    ``i`` and its label come from a random stream of its own (seed, i): the same bytes
    whichever process writes it."""
    pil_format, ext = IMAGE_FORMATS[fmt]
    written = []
    for i in range(start, stop):
        rng = np.random.default_rng((seed, i))
        name = f"{i:06d}{ext}"
        path = Path(folder) / name
        Image.fromarray(_synthetic_image(rng, size)).save(path, pil_format, quality=90)
        written.append((name, path.stat().st_size, int(rng.integers(num_classes))))
    return written


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: end this worker when the generating process dies (Linux), so that a
    killed generation leaves no writer behind in its partial folder for the next generation
    to race with while removing it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: workers end when their task queue closes
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


def _generate_images(folder: Path, fmt: str, count: int, size: int, num_classes: int,
                     seed: int, processes: int) -> list[tuple[str, int, int]]:
    """(name, bytes, label) of ``count`` images written into ``folder`` by up to
    ``processes`` processes, in index order."""
    processes = max(1, min(processes, count // MIN_FILES_PER_PROCESS))
    if processes == 1:
        return _write_images(str(folder), fmt, 0, count, size, num_classes, seed)
    chunk = -(-count // (4 * processes))  # several chunks per process: even finishing times
    starts = range(0, count, chunk)
    # fork: workers start at once, without re-importing torch (as DataLoader workers do).
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = [pool.submit(_write_images, str(folder), fmt, start,
                               min(start + chunk, count), size, num_classes, seed)
                   for start in starts]
        try:
            return [row for future in futures for row in future.result()]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # the running chunks, then out
            raise


def ensure_image_folder(root: Path, fmt: str, count: int, size: int, num_classes: int,
                        seed: int = 0, processes: int | None = None) -> Path:
    """The folder of ``count`` encoded ``size``-pixel images (of ``image_file_count`` files,
    which a small-set format cycles over), generated if missing or damaged, by ``processes``
    processes (default: one per core; the files do not depend on it)."""
    final = ensure_writable_dir(root) / f"{fmt}-{size}px-{count}-c{num_classes}-s{seed}"
    if _read_manifest(final) is not None:
        return final
    remove_stale_partials(root)
    tmp = Path(tempfile.mkdtemp(prefix=atomic.temp_prefix(final.name), dir=root))
    try:
        written = _generate_images(tmp, fmt, image_file_count(fmt, count), size, num_classes,
                                   seed, processes or default_processes())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed generation leaves nothing behind
        raise
    manifest = {"format": fmt, "size": size, "samples": count,
                "files": {name: nbytes for name, nbytes, _ in written},
                "labels": {name: label for name, _, label in written}}
    (tmp / MANIFEST).write_text(json.dumps(manifest))  # written last: marks the folder complete
    _publish(tmp, final)
    return final


class ImageFolderDataset(Dataset):
    """Encoded images decoded with PIL and augmented like ImageNet training
    (RandomResizedCrop, horizontal flip, normalize). ``load`` is the expensive, deterministic
    part (read + decode); ``finish`` the random part, so a cache can sit between them."""

    def __init__(self, folder: Path, image_size: int):
        manifest = _read_manifest(folder)
        if manifest is None:
            raise DataError(f"{folder} is not a complete image dataset (no valid {MANIFEST})")
        self.folder = folder
        self.names = sorted(manifest["files"])
        self.labels = [manifest["labels"][n] for n in self.names]
        # A small set (SMALL_SETS) holds fewer files than samples: sample i is file i mod n.
        self.samples = manifest.get("samples", len(self.names))
        from torchvision.transforms import v2  # imported when used: torchvision starts slowly

        self.to_image = v2.functional.to_image
        self.transform = v2.Compose([
            v2.RandomResizedCrop(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ])

    def __len__(self) -> int:
        return self.samples

    def load(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.samples:
            raise IndexError(f"sample {index} of a dataset of {self.samples}")
        file = index % len(self.names)
        path = self.folder / self.names[file]
        try:
            with Image.open(path) as img:
                pixels = np.array(img.convert("RGB"))
        except (OSError, ValueError) as err:
            raise DataError(f"cannot decode image {path}: {err}") from None
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), self.labels[file]

    def finish(self, sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = sample
        return self.transform(self.to_image(image)), torch.tensor(label)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.finish(self.load(index))


def ensure_token_file(root: Path, count: int, seq_len: int, vocab_size: int,
                      seed: int = 0) -> Path:
    """A flat file of ``count * seq_len + 1`` uint16/uint32 token ids, generated if missing."""
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    final_dir = ensure_writable_dir(root) / f"tokens-{count}x{seq_len}-v{vocab_size}-s{seed}"
    if _read_manifest(final_dir) is not None:
        return final_dir
    remove_stale_partials(root)
    tmp = Path(tempfile.mkdtemp(prefix=atomic.temp_prefix(final_dir.name), dir=root))
    rng = np.random.default_rng(seed)
    # Zipf-like ids, as in text: a few tokens are frequent.
    ids = np.minimum(rng.zipf(1.2, count * seq_len + 1) - 1, vocab_size - 1).astype(dtype)
    ids.tofile(tmp / "tokens.bin")
    manifest = {"files": {"tokens.bin": (tmp / "tokens.bin").stat().st_size},
                "dtype": np.dtype(dtype).name, "seq_len": seq_len, "count": count,
                "labels": rng.integers(0, 2, count).tolist()}
    (tmp / MANIFEST).write_text(json.dumps(manifest))
    _publish(tmp, final_dir)
    return final_dir


class TokenFileDataset(Dataset):
    """Fixed-length windows of a memory-mapped token file (opened lazily in each worker).
    Targets are class labels (encoder) or the window itself (decoder language modelling)."""

    def __init__(self, folder: Path, causal_lm: bool):
        manifest = _read_manifest(folder)
        if manifest is None:
            raise DataError(f"{folder} is not a complete token dataset (no valid {MANIFEST})")
        self.path = folder / "tokens.bin"
        self.dtype, self.seq_len = np.dtype(manifest["dtype"]), manifest["seq_len"]
        self.count, self.labels = manifest["count"], manifest["labels"]
        self.causal_lm = causal_lm
        self._tokens = None

    def __len__(self) -> int:
        return self.count

    def load(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tokens is None:  # per process: a memmap must not cross a fork/spawn
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = index * self.seq_len
        window = torch.from_numpy(self._tokens[start:start + self.seq_len].astype(np.int64))
        target = window if self.causal_lm else torch.tensor(self.labels[index])
        return window, target

    def finish(self, sample):
        return sample

    def __getitem__(self, index: int):
        return self.load(index)

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None}


class CachedDataset(Dataset):
    """Keeps up to ``max_items`` decoded samples (``dataset.load``) in memory, least recently used
    out first; ``finish`` (augmentation) still runs on every access, so samples stay random. A
    dataset without ``load``/``finish`` is cached whole (``__getitem__``'s samples, so any
    random augmentation in it is frozen by the cache).

    Each DataLoader worker process holds its own cache (nothing is shared between processes), so
    a cache survives from one epoch to the next only with ``num_workers=0`` or with
    ``persistent_workers=True``; with ordinary workers it is rebuilt every epoch."""

    def __init__(self, dataset: Dataset, max_items: int):
        if max_items < 1:
            raise ValueError(f"max_items must be a positive integer; got {max_items!r}")
        self.dataset, self.max_items = dataset, max_items
        split = hasattr(dataset, "load") and hasattr(dataset, "finish")
        self._load = dataset.load if split else dataset.__getitem__
        self._finish = dataset.finish if split else (lambda sample: sample)
        self._cache: OrderedDict[int, object] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        sample = self._cache.get(index)
        if sample is None:
            self.misses += 1
            sample = self._load(index)
            self._cache[index] = sample
            if len(self._cache) > self.max_items:
                self._cache.popitem(last=False)
        else:
            self.hits += 1
            self._cache.move_to_end(index)
        return self._finish(sample)
