"""Write files so that an interrupted run never leaves a half-written or lost result.

Everything is written to a temporary file in the destination's folder, flushed, then renamed over
the destination (``os.replace`` is atomic on POSIX within one filesystem).

Temporary names are hidden and carry their owner, ``.<dest>.<pid>-<host>.<random>.tmp<suffix>``,
so that what a killed process left behind is recognised and removed on the next start
(``remove_stale_temporaries``) while a concurrent process's files in progress are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HOST_ID = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
"""This machine in temporary names (a process id means something only on its own host)."""

STALE_AFTER_S = 15 * 60
"""Seconds without a change after which a temporary whose owner cannot be checked (another
host, or a name without owner from an older gpubench) counts as abandoned."""

REUSED_PID_AFTER_S = 24 * 3600
"""Seconds after which a temporary counts as abandoned even if its owner's pid is alive (the
pid may have been reused)."""

_OWNER = re.compile(r"\.(?P<pid>\d+)-(?P<host>[0-9a-f]{8})\.[a-z0-9_]{8}(?:\.tmp|$)")
_TEMP_FILE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp(?:\.[^.]*)?$")
"""``atomic_path``'s temporaries, with or without owner (older gpubench)."""


def is_temp_file_name(name: str) -> bool:
    return bool(_TEMP_FILE.match(name))


def temp_prefix(name: str) -> str:
    """Prefix of a hidden temporary for ``name``, owned by this process on this host."""
    return f".{name}.{os.getpid()}-{HOST_ID}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def is_stale(path: Path, *, now: float | None = None, max_age_s: float = STALE_AFTER_S) -> bool:
    """Whether the temporary ``path`` was abandoned: its owner (from its name) is a dead process
    of this host, or it has not changed for ``max_age_s`` and its owner cannot be checked."""
    try:
        age = (now or time.time()) - path.lstat().st_mtime
    except OSError:
        return False
    owner = _OWNER.search(path.name)
    if owner and owner["host"] == HOST_ID:
        return not _pid_alive(int(owner["pid"])) or age > REUSED_PID_AFTER_S
    return age > max_age_s


def remove_stale_temporaries(folder: str | os.PathLike,
                             match: Callable[[str], bool] | None = None, *,
                             max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the abandoned hidden temporaries (files or folders) in ``folder``: names that
    ``match`` accepts (default: ``atomic_path``'s temporary files), see
    ``is_stale``. Returns what was removed; a missing folder or a failed removal is no error."""
    match = match or is_temp_file_name
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        path = Path(entry.path)
        if not match(entry.name) or not is_stale(path, now=now, max_age_s=max_age_s):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``dest``, on error it is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=temp_prefix(dest.name), suffix=".tmp" + dest.suffix, dir=dest.parent
    )
    os.close(fd)
    tmp = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o666 & ~umask)  # mkstemp makes it owner-only; results are ordinary files
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except OSError as err:  # a full disk names the result, not its hidden temporary
        if not err.filename or str(err.filename) == str(tmp):
            err.filename = str(dest)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_text(dest: str | os.PathLike, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text)


def strict_json(value):
    """``value`` with every float that is not finite (NaN, Infinity) replaced by None, so that
    it serializes as JSON every strict parser reads (Python's ``json`` writes bare ``NaN``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def json_text(value, **kwargs) -> str:
    """``json.dumps`` of ``strict_json(value)``, refusing non-finite floats (``allow_nan`` off;
    ``default=str`` unless given)."""
    kwargs.setdefault("default", str)
    return json.dumps(strict_json(value), allow_nan=False, **kwargs)


def write_json(dest: str | os.PathLike, value, **kwargs) -> None:
    """``write_text(dest, json_text(value, ...))``: strict JSON, written atomically."""
    write_text(dest, json_text(value, **kwargs))


def move_into_place(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Atomically install the finished file ``src`` as ``dest`` (copying across filesystems)."""
    with atomic_path(dest) as tmp:
        Path(tmp).write_bytes(Path(src).read_bytes())
    Path(src).unlink(missing_ok=True)
