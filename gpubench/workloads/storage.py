"""Cold storage: dropping a dataset's files from the page cache before each epoch, checking that
they left it, and a read-throughput probe of the data folder's disk.

After its first epoch an on-disk dataset is read from the page cache (RAM), so the loader cases
measure decoding, not the disk. A ``cold`` loader case calls ``os.posix_fadvise(fd, 0, 0,
POSIX_FADV_DONTNEED)`` on every file of its dataset before each epoch, in the training process
(no root needed): each file is then read from the disk once per epoch, as in training on a
dataset larger than RAM. Dirty pages are not dropped, so the first eviction ``fdatasync``s each
file first (generation does not sync its files). Only file data leaves the cache: directory
entries and inodes stay (one ``open`` per file costs no disk seek). A file that a process has
mapped (``np.memmap`` of the token datasets) keeps its mapped pages: mapped pages are in use.

Whether the pages really left is measured, not assumed: ``resident_fraction`` maps each file
and asks the kernel which of its pages are in memory (``mincore``). Filesystems without a page
cache of their own to drop (tmpfs, some FUSE and network mounts) keep the pages: the fraction
then stays near 1 and the verdicts say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from gpubench.util import atomic

BLOCK_BYTES = 1 << 20
"""Sequential reads of the probe: 1 MiB blocks."""
PAGE_BYTES = 4096
"""Random reads of the probe: 4 KiB, a page."""
PROBE_BYTES = 64 << 20
"""Size of the probe's file: large enough to read past the disk's own cache of a few MiB."""
PROBE_RANDOM_READS = 256
PROBE_RANDOM_BUDGET_S = 1.0
"""The random reads stop after this long (an HDD seeks ~100 times a second)."""


def eviction_unsupported_reason() -> str | None:
    """Why this platform cannot drop files from the page cache (no ``os.posix_fadvise``:
    macOS, Windows), or None."""
    if not hasattr(os, "posix_fadvise") or not hasattr(os, "POSIX_FADV_DONTNEED"):
        return (f"cold-cache cases need os.posix_fadvise(POSIX_FADV_DONTNEED) to drop files "
                f"from the page cache; this platform ({sys.platform}) has none")
    return None


def evict(paths: Iterable[str | os.PathLike], *, sync: bool = False) -> int:
    """Drop ``paths`` from the page cache (``fdatasync`` each first when ``sync``: dirty pages
    stay cached otherwise); the number of files evicted."""
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            if sync:
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        count += 1
    return count


@functools.cache
def _libc():
    """The C library's mmap, munmap and mincore (loaded once: ``find_library`` runs a
    subprocess)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_ubyte))
    return libc


def resident_pages(path: str | os.PathLike) -> tuple[int, int] | None:
    """(pages of ``path`` in the page cache, pages of the file), from ``mincore`` on a
    read-only mapping (which faults nothing in); None where ``mincore`` is missing."""
    size = os.stat(path).st_size
    page = mmap.PAGESIZE
    pages = -(-size // page)
    if pages == 0:
        return 0, 0
    try:
        libc = _libc()
    except (OSError, AttributeError):
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(v & 1 for v in vec), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(paths: Iterable[str | os.PathLike]) -> float | None:
    """The share of the files' pages in the page cache (0: all on disk only), or None where
    it cannot be asked."""
    resident = total = 0
    for path in paths:
        counted = resident_pages(path)
        if counted is None:
            return None
        resident, total = resident + counted[0], total + counted[1]
    return resident / total if total else None


def dataset_files(dataset, root: str | os.PathLike) -> list[Path]:
    """The files a dataset reads: its ``files()``, every file of its ``folder``, its ``path``;
    else every file under ``root`` (the data folder). A decoded-sample cache's files are its
    dataset's."""
    inner = getattr(dataset, "dataset", None)  # gpubench.workloads.datasets.CachedDataset
    if inner is not None and not hasattr(dataset, "files"):
        return dataset_files(inner, root)
    if callable(getattr(dataset, "files", None)):
        return [Path(p) for p in dataset.files()]
    for attr in ("folder", "path"):
        place = getattr(dataset, attr, None)
        if isinstance(place, str | os.PathLike) and Path(place).exists():
            place = Path(place)
            return sorted(p for p in place.rglob("*") if p.is_file()) if place.is_dir() \
                else [place]
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


class Evictor:
    """Called before each epoch of a cold case: drops the dataset's files from the page cache
    (syncing them the first time) and keeps what it took and what stayed."""

    def __init__(self, files: list[Path]):
        if not files:
            raise ValueError("a cold-cache case needs the dataset's files; found none")
        self.files = files
        self.evictions = 0
        self.evict_s: list[float] = []

    def __call__(self) -> None:
        start = time.perf_counter()
        evict(self.files, sync=self.evictions == 0)
        self.evict_s.append(time.perf_counter() - start)
        self.evictions += 1

    def resident_after_eviction(self) -> float | None:
        """Evict now and return the share of the files' pages still cached (ideally 0)."""
        self()
        return resident_fraction(self.files)


# -- the storage probe -------------------------------------------------------------------------

def _mount_of(path: Path) -> tuple[str, str]:
    """(filesystem type, source device) of the mount holding ``path``, from
    /proc/self/mountinfo; ('', '') where that is unknown."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return "", ""
    best, found = -1, ("", "")
    target = str(path.resolve())
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best:
            best, found = len(mount), (tail[0], tail[1])
    return found


def _rotational(path: Path) -> bool | None:
    """The kernel's ``rotational`` flag of the block device under ``path`` (True: a spinning
    disk; virtual disks often claim it), or None where there is no block device."""
    dev = os.stat(path).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (base / "queue" / "rotational", base / ".." / "queue" / "rotational"):
        try:
            return queue.read_text().strip() == "1"
        except OSError:
            continue
    return None


def _read_all(fd: int) -> int:
    os.lseek(fd, 0, os.SEEK_SET)
    total = 0
    while chunk := os.read(fd, BLOCK_BYTES):
        total += len(chunk)
    return total


def probe_storage(folder: str | os.PathLike, size_bytes: int = PROBE_BYTES) -> dict:
    """Read throughput of the disk under ``folder``, with a cold page cache: a file of
    ``size_bytes`` written there and synced, dropped from the cache, read back in 1 MiB blocks
    (``storage_read_mb_s``, 10^6 bytes/s), then again from the cache (``storage_cached_mb_s``),
    then dropped again and read at random 4 KiB offsets without readahead
    (``storage_random_iops``, for at most ``PROBE_RANDOM_BUDGET_S``); the file is deleted.
    ``storage_resident_after_evict`` is the share of the file still cached after the drop
    (near 1: this filesystem ignores it, and the cold figures are the cache's). Where the
    probe cannot run, ``storage_note`` says why and the figures are None."""
    folder = Path(folder)
    out = {"storage_folder": str(folder), "storage_fs": None,
           "storage_device": None, "storage_rotational": None,
           "storage_read_mb_s": None, "storage_cached_mb_s": None,
           "storage_random_iops": None, "storage_resident_after_evict": None,
           "storage_probe_bytes": size_bytes, "storage_note": None}
    reason = eviction_unsupported_reason()
    if reason:
        out["storage_note"] = reason
        return out
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fs, source = _mount_of(folder)
        out.update(storage_fs=fs or None, storage_device=source or None,
                   storage_rotational=_rotational(folder))
        # A probe file a killed run left behind (its process gone) goes first.
        atomic.remove_stale_temporaries(folder, lambda n: n.startswith(".storage-probe."))
        fd, name = tempfile.mkstemp(prefix=atomic.temp_prefix("storage-probe"), dir=folder)
    except OSError as err:
        out["storage_note"] = f"cannot write a probe file in {folder}: {err.strerror or err}"
        return out
    try:
        # Incompressible bytes: a compressing or deduplicating store would read zeros for free.
        block = os.urandom(BLOCK_BYTES)
        for _ in range(max(1, size_bytes // BLOCK_BYTES)):
            os.write(fd, block)
        os.fsync(fd)
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        out["storage_resident_after_evict"] = resident_fraction([name])
        start = time.perf_counter()
        _read_all(fd)
        out["storage_read_mb_s"] = size / (time.perf_counter() - start) / 1e6
        start = time.perf_counter()
        _read_all(fd)
        out["storage_cached_mb_s"] = size / (time.perf_counter() - start) / 1e6
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        rng = random.Random(0)
        pages = size // PAGE_BYTES
        done, start = 0, time.perf_counter()
        while done < PROBE_RANDOM_READS and time.perf_counter() - start < PROBE_RANDOM_BUDGET_S:
            os.pread(fd, PAGE_BYTES, rng.randrange(pages) * PAGE_BYTES)
            done += 1
        out["storage_random_iops"] = done / (time.perf_counter() - start)
        resident = out["storage_resident_after_evict"]
        if resident is not None and resident > 0.5:
            out["storage_note"] = (f"{resident:.0%} of the probe file stayed in the page cache "
                                   f"after eviction ({fs or 'this filesystem'} ignores it): "
                                   "the figures are the cache's, not the disk's")
    except OSError as err:
        out["storage_note"] = f"the storage probe failed in {folder}: {err.strerror or err}"
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass
    return out
