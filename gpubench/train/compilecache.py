"""A fresh ``torch.compile`` cache per compiled case, so that its compile time is its own.

Inductor keeps compiled graphs on disk (the FX graph cache and AOTAutograd's cache under
``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``) and Triton its kernels
(``TRITON_CACHE_DIR``): a case compiled after another of the same model (or in a later run)
would load what the earlier one compiled, and its ``compile_time_s`` would depend on the order of
the cases and on what ran before. Each compiled case therefore compiles into an empty folder of
its own (``torch._inductor.utils.fresh_cache``: Inductor's in-memory caches cleared, both
variables pointed at a new temporary folder; Inductor hands them to its compile worker processes
with every job), removed when the case closes; the FX graph and AOTAutograd cache hits and misses
its compilation saw are counted (``counts``): a hit there means a compiled graph came from
elsewhere.
"""

from __future__ import annotations

import contextlib

COUNTERS = {
    "hits": (("inductor", "fxgraph_cache_hit"), ("aot_autograd", "autograd_cache_hit")),
    "misses": (("inductor", "fxgraph_cache_miss"), ("aot_autograd", "autograd_cache_miss")),
}
"""torch's compile counters (``torch._dynamo.utils.counters``) behind ``counts``."""


def _counter_totals() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {name: sum(counters[group][key] for group, key in keys)
            for name, keys in COUNTERS.items()}


class CompileCache:
    """The fresh Inductor and Triton cache folder of one compiled case (``open``), in use from
    before ``torch.compile`` until ``close``."""

    _current: CompileCache | None = None
    """The one open in this process (a case that failed before closing leaves it open: the
    next ``open`` closes it)."""

    def __init__(self):
        from torch._inductor import utils

        fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(fresh())
        self._start = _counter_totals()

    @classmethod
    def open(cls) -> CompileCache:
        """A new empty cache for the next compilation, closing the previous one."""
        if cls._current is not None:
            cls._current.close()
        cls._current = cls()
        return cls._current

    def counts(self) -> dict[str, int]:
        """FX graph and AOTAutograd cache hits and misses since ``open``: with this fresh
        cache every graph is a miss, compiled here."""
        now = _counter_totals()
        return {f"compile_cache_{name}": now[name] - self._start[name] for name in now}

    def close(self) -> None:
        """Remove the folder and restore the variables (idempotent)."""
        self._stack.close()
        if CompileCache._current is self:
            CompileCache._current = None
