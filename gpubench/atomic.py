"""Write files so that an interrupted run never leaves a half-written or lost result.

Everything is written to a temporary file in the destination's folder, flushed, then renamed over
the destination (``os.replace`` is atomic on POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``dest``, on error it is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{dest.name}.", suffix=".tmp" + dest.suffix, dir=dest.parent
    )
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(dest: str | os.PathLike, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text)


def move_into_place(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Atomically install the finished file ``src`` as ``dest`` (copying across filesystems)."""
    with atomic_path(dest) as tmp:
        Path(tmp).write_bytes(Path(src).read_bytes())
    Path(src).unlink(missing_ok=True)
