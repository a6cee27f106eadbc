"""gpubench: which PyTorch training acceleration techniques pay off for your model here.

``from gpubench import Workload`` is the public API for bringing your own model (see
``gpubench.workloads.api``); it is imported on first use, so the command line starts fast.
"""

import logging

__version__ = "0.2.0"


def _not_enum_registration(record: logging.LogRecord) -> bool:
    """torchao, which transformers imports where it is installed, registers enums with torch's
    pytree, and recent torch logs a deprecation warning for each: lines about the libraries, not
    about the benchmark, kept out of its output."""
    return "Enum subclass" not in record.getMessage()


logging.getLogger("torch.utils._pytree").addFilter(_not_enum_registration)
__all__ = ["DataRequest", "Workload", "WorkloadError", "checkpoint_blocks", "load_results"]


def __getattr__(name: str):
    if name in ("DataRequest", "Workload", "WorkloadError", "checkpoint_blocks"):
        from gpubench.workloads import api as workload

        return getattr(workload, name)
    if name == "load_results":
        from gpubench.analysis.results import load_results

        return load_results
    raise AttributeError(f"module 'gpubench' has no attribute {name!r}")
