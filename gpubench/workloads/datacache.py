"""Where generated datasets are kept, and the cleaning of what killed generations left there:
the parts of ``gpubench.workloads.datasets`` that the command line needs before any case runs,
without importing torch (3 s on a small machine)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpubench.util import atomic


def default_data_dir() -> Path:
    """``$GPUBENCH_DATA_DIR``, else ``~/.cache/gpubench/data``."""
    env = os.environ.get("GPUBENCH_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "gpubench" / "data"


_PARTIAL = re.compile(r"^\.(?:images-|tokens-).+\.[a-z0-9_]{8}$")
"""Hidden temporary dataset folders: ``.<final name>.[<pid>-<host>.]<random>``."""


def remove_stale_partials(root: str | os.PathLike) -> list[Path]:
    """Remove the partial dataset folders that killed generations left in ``root``: those
    whose owner process is gone (same host) or, when that cannot be checked, unchanged for
    ``atomic.STALE_AFTER_S``. A concurrent generation's folder is kept."""
    return atomic.remove_stale_temporaries(root, lambda name: bool(_PARTIAL.match(name)))
