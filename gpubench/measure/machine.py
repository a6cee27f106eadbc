"""What the results were measured on: library versions, device, CPU, threads, measured peaks."""

from __future__ import annotations

import functools
import os
import platform

import torch

from gpubench.measure.flops import fp8_peak_flops, matmul_peak_flops
from gpubench.measure.memory import malloc_settings
from gpubench.measure.provenance import source_commit
from gpubench.train.config import FP8_PRECISIONS, PRECISIONS
from gpubench.train.precision import fp8_units, unsupported_reason


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name from py-cpuinfo (``brand_raw``, the name pytest-benchmark
    records in ``machine_info.cpu``), else what platform knows."""
    try:
        import cpuinfo  # py-cpuinfo, installed with pytest-benchmark

        name = cpuinfo.get_cpu_info().get("brand_raw")
    except Exception:  # a probe of the machine: fall back, never fail a run
        name = None
    return name or platform.processor() or platform.machine()


def _driver_version() -> str | None:
    """The NVIDIA driver's version (NVML), or None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # a probe of the machine: no NVML, no driver, never fail a run
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def library_versions() -> dict[str, str | None]:
    """The versions of the libraries a measurement depends on (None: not installed)."""
    from importlib import metadata

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda,
           "cudnn": (str(torch.backends.cudnn.version())
                     if torch.backends.cudnn.is_available() else None)}
    for name in ("gpubench", "torchvision", "transformers", "timm", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def fingerprint(device: str) -> dict:
    """Where, with what and when a measurement was taken, cheaply (no measurement): the
    machine (CPU model and count; the device, its model and count, the NVIDIA driver), the
    library versions, the gpubench commit and the date (UTC, ISO 8601). The one description
    of a machine that results, ``tune.json`` and the report carry."""
    import datetime

    dev = torch.device(device)
    cuda = dev.type == "cuda" and torch.cuda.is_available()
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if cuda else cpu_model(),
        "device_count": torch.cuda.device_count() if cuda else 1,
        "driver": _driver_version() if cuda else None,
        "node": platform.node(),
        "libraries": library_versions(),
        "commit": source_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def measured_peaks_tflops(device: str) -> dict[str, float | None]:
    """Measured matmul peak per precision, TFLOP/s (None where the precision cannot run; for
    the fp8 precisions, the float8 matmul's, None without FP8 units)."""
    peaks = {}
    for p in PRECISIONS:
        if p in FP8_PRECISIONS and not fp8_units(torch.device(device).type):
            peaks[p] = None  # emulated: no peak of its own (and no torchao import to say so)
        elif unsupported_reason(p, device):
            peaks[p] = None
        elif p in FP8_PRECISIONS:
            fp8 = fp8_peak_flops(device)
            peaks[p] = None if fp8 is None else fp8 / 1e12
        else:
            peaks[p] = matmul_peak_flops(device, p) / 1e12
    return peaks


def machine_info(device: str, storage_dir: str | os.PathLike | None = None) -> dict:
    """Versions, device, CPU, threads and measured matmul peaks; with ``storage_dir``, also
    the storage probe of that folder's disk (``storage``:
    ``gpubench.workloads.storage.probe_storage``)."""
    dev = torch.device(device)
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": device,
        "device_name": device_name(dev),
        "device_count": torch.cuda.device_count() if dev.type == "cuda" else 1,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "matmul_peak_tflops": measured_peaks_tflops(device),
        **malloc_settings(),
        "fingerprint": fingerprint(device),
    }
    if storage_dir is not None:
        from gpubench.workloads.storage import probe_storage

        info["storage"] = probe_storage(storage_dir)
    versions = library_versions()  # read from the installed metadata: no import (seconds)
    info["torchvision"] = versions["torchvision"]
    info["transformers"] = versions["transformers"]
    return info
