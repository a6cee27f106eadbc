"""gpubench: which PyTorch training acceleration techniques pay off for your model here.

``from gpubench import Workload`` is the public API for bringing your own model (see
``gpubench.workloads.api``); it is imported on first use, so the command line starts fast.
"""

__version__ = "0.2.0"
__all__ = ["DataRequest", "Workload", "WorkloadError", "checkpoint_blocks", "load_results"]


def __getattr__(name: str):
    if name in ("DataRequest", "Workload", "WorkloadError", "checkpoint_blocks"):
        from gpubench.workloads import api as workload

        return getattr(workload, name)
    if name == "load_results":
        from gpubench.analysis.results import load_results

        return load_results
    raise AttributeError(f"module 'gpubench' has no attribute {name!r}")
