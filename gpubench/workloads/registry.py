"""How a workload is named: built-in names, ``FILE.py:FACTORY`` / ``MODULE:FACTORY`` specs,
``torchvision:`` and ``transformers:`` families, and the entry-point group ``gpubench.workloads``
(``resolve``). The API a workload is written against is ``gpubench.workloads.api``."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubench.workloads.api import Workload, WorkloadError

ENTRY_POINT_GROUP = "gpubench.workloads"


def _call_factory(factory: Callable[..., Any], spec: str, profile: str) -> Workload:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    try:
        workload = factory(profile=profile) if "profile" in params else factory()
    except WorkloadError:
        raise
    except SystemExit as err:  # a silent exit 0 would pass for success
        raise WorkloadError(f"workload {spec!r}: the factory called sys.exit({err.code!r}); "
                            "it must return a gpubench.Workload, not exit") from None
    except Exception as err:  # noqa: BLE001 - the user's factory: report it on one line
        raise WorkloadError(f"workload {spec!r}: the factory raised "
                            f"{type(err).__name__}: {err}") from None
    if not isinstance(workload, Workload):
        raise WorkloadError(f"workload {spec!r}: the factory must return a gpubench.Workload; "
                            f"got {type(workload).__name__}")
    return workload


def _load_attr(spec: str) -> Callable[..., Any]:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise WorkloadError(f"workload {spec!r}: expected FILE.py:FACTORY or MODULE:FACTORY")
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise WorkloadError(f"workload {spec!r}: file {target} does not exist")
        name = f"gpubench_user_{abs(hash(str(path)))}"
        module = sys.modules.get(name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except SystemExit as err:
                del sys.modules[name]
                raise WorkloadError(f"workload {spec!r}: importing {target} called "
                                    f"sys.exit({err.code!r})") from None
            except Exception as err:  # noqa: BLE001
                del sys.modules[name]
                raise WorkloadError(f"workload {spec!r}: importing {target} raised "
                                    f"{type(err).__name__}: {err}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise WorkloadError(f"workload {spec!r}: cannot import module {target}: "
                                f"{err}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise WorkloadError(f"workload {spec!r}: {target} has no attribute {attr!r}")
    if not callable(factory):
        raise WorkloadError(f"workload {spec!r}: {target}:{attr} is not callable")
    return factory


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def builtin_names() -> tuple[str, ...]:
    from gpubench.workloads.builtin import BUILTIN

    return tuple(BUILTIN)


def known_names() -> tuple[str, ...]:
    """Built-in names and those registered through entry points."""
    return (*builtin_names(), *sorted(_entry_points()))


@functools.cache
def resolve(spec: str, profile: str) -> Workload:
    """The workload a spec names, sized for ``profile``; ``WorkloadError`` with one line if the
    spec cannot be resolved or the workload breaks the contract."""
    from gpubench.workloads import builtin

    if not isinstance(spec, str) or not spec.strip():
        raise WorkloadError(f"model must be a workload spec (a name, FILE.py:FACTORY, "
                            f"torchvision:NAME, timm:NAME or transformers:TYPE); got {spec!r}")
    if spec in builtin.BUILTIN:
        workload = builtin.BUILTIN[spec](profile)
    elif spec.startswith("torchvision:"):
        workload = builtin.torchvision_workload(spec, profile)
    elif spec.startswith("transformers:"):
        workload = builtin.transformers_workload(spec, profile)
    elif spec.startswith("timm:"):
        workload = builtin.timm_workload(spec, profile)
    elif ":" in spec:
        workload = _call_factory(_load_attr(spec), spec, profile)
    elif spec in _entry_points():
        try:
            factory = _entry_points()[spec].load()
        except Exception as err:  # noqa: BLE001
            raise WorkloadError(f"workload {spec!r}: loading its entry point raised "
                                f"{type(err).__name__}: {err}") from None
        workload = _call_factory(factory, spec, profile)
    else:
        raise WorkloadError(
            f"unknown workload {spec!r}: expected one of {', '.join(known_names())}, "
            "FILE.py:FACTORY, MODULE:FACTORY, torchvision:NAME, timm:NAME or transformers:TYPE"
        )
    if workload.spec != spec:
        object.__setattr__(workload, "spec", spec)
    if workload.profile != profile:
        object.__setattr__(workload, "profile", profile)
    return workload


def checked(spec: str, profile: str) -> Workload:
    """``resolve(spec, profile)``, validated (``gpubench.workloads.api.validate``: one forward
    and backward on the CPU) unless it is a built-in name, which the project's tests validate:
    a bad spec is a one-line ``WorkloadError`` before anything runs, and a built-in one costs
    no model build."""
    from gpubench.workloads.api import validate

    workload = resolve(spec, profile)
    if spec not in builtin_names():
        validate(workload)
    return workload
