"""A workload's facts (``Workload.facts``: one probe build of its model) kept on disk, so that
the processes of a run (every ``gpubench`` command, each case's worker and rank processes) build
the model for them once, not each anew: GPT-2 at 1,024 tokens takes seconds to initialise.

An entry is a JSON file in ``$GPUBENCH_CACHE_DIR/facts`` (default ``~/.cache/gpubench/facts``)
named by a hash of its key, which holds everything the facts depend on (``facts_key``): the
workload's spec and profile (its shapes), the code that defines it (the sources of gpubench's
version, of the built-in workloads and of the probe; a ``FILE.py`` workload's or a
``transformers:`` config file's content), the versions of Python, torch, torchvision,
transformers and timm, and the facts' own fields. A change in any of them is a new key: the
old entry is never read again. A workload whose code no key can follow (``MODULE:FACTORY`` and
entry-point specs, a ``Workload`` made without ``resolve``) is probed in every process, as
before. An entry that cannot be read or does not match its key counts as absent; one that
cannot be written (a read-only home) is skipped. Processes that miss the same entry at once
probe it once (``probing``: a lock file per entry beside it).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path

from gpubench.util import atomic

LIBRARIES = ("torch", "torchvision", "transformers", "timm")
"""The libraries whose version is part of the key: they build the models and decide what a
probe sees (attention implementation, module types)."""

BUILTIN_MODULE = "gpubench.workloads.builtin"
"""Where the built-in workloads' ``build_model`` functions live."""

SOURCES = ("__init__.py", "workloads/api.py", "workloads/builtin.py", "workloads/profiles.py")
"""gpubench's files whose content is part of the key: its version, the probe, the built-in
workloads and their per-profile shapes."""


def facts_dir() -> Path:
    """``$GPUBENCH_CACHE_DIR/facts``, else ``~/.cache/gpubench/facts``."""
    env = os.environ.get("GPUBENCH_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "gpubench") / "facts"


def _file_digest(path: str | os.PathLike) -> str | None:
    try:
        return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
    except OSError:
        return None


@functools.cache
def _environment() -> dict:
    """The part of every key this process shares: gpubench and library versions."""
    from importlib import metadata

    package = Path(__file__).resolve().parent.parent
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import torch  # its own version string carries the build (+cu130, +cpu)

    versions["torch"] = torch.__version__
    return {"gpubench": {name: _file_digest(package / name) for name in SOURCES},
            "python": platform.python_version(), "libraries": versions}


def _code_digest(workload) -> str | None:
    """The digest of the code ``workload``'s spec names beyond gpubench and the libraries: ""
    for the built-in names (their ``build_model`` is gpubench's) and the ``torchvision:``,
    ``timm:`` and ``transformers:`` model types, the file's content for ``FILE.py:FACTORY``
    and ``transformers:`` config files; None where no file says what the code is
    (``MODULE:FACTORY``, an entry point's package)."""
    spec = workload.spec
    for prefix in ("torchvision:", "timm:", "transformers:"):
        if spec.startswith(prefix):
            source = spec.removeprefix(prefix).partition("?")[0]
            if prefix == "transformers:" and (source.endswith(".json") or "/" in source):
                return _file_digest(source)
            return ""
    target, _, attr = spec.rpartition(":")
    if target and attr and (target.endswith(".py") or "/" in target):
        return _file_digest(target)
    if ":" not in spec and getattr(workload.build_model, "__module__", None) == BUILTIN_MODULE:
        return ""
    return None


def facts_key(workload, fields: tuple[str, ...]) -> dict | None:
    """Everything ``workload``'s facts (a ``WorkloadFacts`` of ``fields``) depend on, or None
    where they cannot be cached (see the module's text)."""
    if not workload.spec or not workload.profile:
        return None
    code = _code_digest(workload)
    if code is None:
        return None
    return {"spec": workload.spec, "profile": workload.profile, "name": workload.name,
            "micro_batch": workload.micro_batch, "code": code, "fields": list(fields),
            **_environment()}


def _path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return facts_dir() / f"{digest}.json"


def read_facts(key: dict) -> dict | None:
    """The facts stored under ``key`` (their fields as JSON gives them back), or None."""
    try:
        entry = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != json.loads(json.dumps(key)):
        return None
    facts = entry.get("facts")
    return facts if isinstance(facts, dict) else None


@contextlib.contextmanager
def probing(key: dict | None, wait_s: float) -> Iterator[None]:
    """Held while this process, having missed ``key``'s entry, reads it once more and, if still
    absent, probes and stores it: the processes that start together (a job's ranks under
    torchrun or srun, the workers of a test suite) and miss the same entry wait for the one
    that probes it, then read it, instead of each building the model at once. An exclusive
    ``flock`` on ``<entry>.lock`` beside the entry (the lock files stay in the folder), let go
    when the holder ends however it ends. After ``wait_s`` (a holder stopped, a probe slower
    than its limit), where the folder cannot be written or the filesystem has no locks, this
    process probes without it, as without the cache."""
    handle = _lock_file(key)
    try:
        if handle is not None and not _lock(handle, wait_s):
            handle.close()
            handle = None
        yield
    finally:
        if handle is not None:
            handle.close()  # lets the lock go


NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
"""``flock``'s errors on a filesystem that has no locks: probe without one."""

LOCK_POLL_S = 0.05


def _lock_file(key: dict | None):
    """An open handle on ``key``'s lock file, or None (no key, no ``fcntl``, a folder that
    cannot be written)."""
    if key is None:
        return None
    try:
        import fcntl  # noqa: F401 - POSIX only
    except ImportError:
        return None
    path = _path(key).with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a")  # noqa: SIM115 - ``probing`` closes it
    except OSError:
        return None


def _lock(handle, wait_s: float) -> bool:
    """Take the exclusive lock on ``handle`` within ``wait_s`` seconds (polled, so that a time
    limit's stop is not held up); False when it cannot be had."""
    import fcntl
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:  # another process holds it
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_S)
        except OSError as err:
            if err.errno in NO_LOCKS:
                return False
            raise


def write_facts(key: dict, facts: dict) -> None:
    """Store ``facts`` under ``key`` (atomically: a reader never sees half a file); a folder
    that cannot be written leaves the cache as it was."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path, {"key": key, "facts": facts})
    except OSError:
        pass
