"""What to run: one frozen, validated configuration per benchmark case.

Strings become objects only in ``gpubench.train.build``; here they are checked against the valid
choices so that a typo fails at once with a message naming the bad value and the valid ones.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING

from gpubench.train.techniques import (  # noqa: F401 - the choices, for every caller
    BY_FIELD,
    FP8_PRECISIONS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PARALLELS,
    PRECISIONS,
    SCHEDULES,
    TECHNIQUES,
    declare_fields,
)
from gpubench.util.docstrings import attribute_docs
from gpubench.workloads.profiles import PROFILES  # noqa: F401 - the names, for every caller

if TYPE_CHECKING:  # imported when used: this module stays light (no torch) for the CLI
    from gpubench.workloads.api import Workload

DEVICES = ("cpu", "cuda")
MULTIPROCESS_PARALLELS = ("ddp", "fsdp", "pipeline")
"""Strategies that run one process per rank (DDP and FSDP replicas, pipeline stages)."""
SPLIT_PARALLELS = ("model", "pipeline")
"""Strategies that split the model into stages (workloads with ``stages``)."""
GENERATED_DATASETS = ("device-resident", "synthetic")
"""Datasets every workload has: batches made by its ``make_batch`` and placed on the device once
(the default: the technique groups measure the step, not the host), or samples held in host
memory, collated by the loader and copied each step. Other names are the workload's own."""
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""The CUDA caching allocator's settings (``PYTORCH_ALLOC_CONF`` is the newer, device-neutral
name), read once, when CUDA starts."""


def _check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


@dataclass(frozen=True, kw_only=True)
@declare_fields(loader=True)
class LoaderConfig:
    """How batches reach the training step (a ``torch.utils.data.DataLoader``): one field per
    loader technique of ``gpubench.train.techniques``."""

    def __post_init__(self) -> None:
        _check_techniques(self, loader=True)
        if self.cold and self.dataset in GENERATED_DATASETS:
            raise ValueError(
                f"cold applies to a workload's own (on-disk) datasets; got dataset {self.dataset!r}"
            )
        if self.cached and self.dataset in GENERATED_DATASETS:
            raise ValueError(
                f"cached applies to a workload's own datasets; got dataset {self.dataset!r}"
            )
        resident = self.dataset == "device-resident"
        if resident and replace(self, dataset="synthetic") != LoaderConfig(dataset="synthetic"):
            raise ValueError(
                "dataset 'device-resident' (the default) bypasses the loader: loader settings "
                "need dataset 'synthetic' or one of the workload's own datasets; got "
                + ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                            if f.name != "dataset"
                            and getattr(self, f.name) != getattr(LoaderConfig(), f.name)))
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ValueError(
                "prefetch_factor and persistent_workers need num_workers > 0; "
                f"got num_workers=0, prefetch_factor={self.prefetch_factor!r}, "
                f"persistent_workers={self.persistent_workers!r}"
            )


@dataclass(frozen=True, kw_only=True)
@declare_fields(loader=False, after="device")
class RunConfig:
    """One benchmark case: a model through one training step under a set of techniques.

    After ``device``, one field per technique of ``gpubench.train.techniques`` (its declaration
    gives the default and the help text). Every technique's default is its "off" form, so
    ``RunConfig(model=...)`` is the FP32 single-device baseline the other cases are compared
    with.
    """

    model: str
    """The workload: a built-in name (resnet18, resnet50, bert, gpt2), FILE.py:FACTORY,
    MODULE:FACTORY, torchvision:NAME, timm:NAME or transformers:TYPE (see
    ``gpubench.workloads.api``)."""
    profile: str = "cpu"
    """Problem size: smoke (tests), cpu (2-core laptop scale), gpu-small, gpu-full."""
    device: str = "cpu"
    """Where the step runs: cpu or cuda."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """DataLoader settings."""
    seed: int = 0
    """Seeds model weights and data, so that cases of one model start from identical state."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:  # a list: TypeError in resolve
            raise ValueError(f"model must be a workload spec (a non-empty string); "
                             f"got {self.model!r}")
        _check_choice("profile", self.profile, PROFILES)
        _check_choice("device", self.device, DEVICES)
        _check_techniques(self, loader=False)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0; got {self.seed!r}")
        workload = self.workload  # resolves the spec: a bad one fails here, on one line
        if self.parallel == "single" and self.world_size != 1:
            raise ValueError(f"parallel 'single' needs world_size 1; got {self.world_size!r}")
        if self.parallel in SPLIT_PARALLELS:
            if workload.stages is None or workload.loss_fn is None:
                raise ValueError(
                    f"parallel {self.parallel!r} splits the model into stages; workload "
                    f"{workload.name} defines no stages() (and loss_fn for the last stage)"
                )
            if self.world_size < 2:
                raise ValueError(f"parallel {self.parallel!r} needs world_size >= 2 (stages); "
                                 f"got {self.world_size!r}")
        if self.ddp_no_sync and self.parallel != "ddp":
            raise ValueError(f"ddp_no_sync needs parallel 'ddp'; got {self.parallel!r}")
        if self.fsdp_mixed_precision and (self.parallel != "fsdp" or self.precision != "fp32"):
            raise ValueError("fsdp_mixed_precision needs parallel 'fsdp' and precision 'fp32'; "
                             f"got parallel {self.parallel!r}, precision {self.precision!r}")
        if self.parallel != "pipeline" and (self.chunks != 1 or self.schedule != "gpipe"):
            raise ValueError(
                f"chunks and schedule apply to parallel 'pipeline'; got {self.parallel!r}"
            )
        if self.attention != "default" and self.attn_implementation == "eager":
            raise ValueError(f"attention {self.attention!r} pins a scaled_dot_product_attention "
                             "kernel, which attn_implementation 'eager' does not call; use "
                             "attn_implementation 'default' or 'sdpa'")
        if self.fp8_layers != "auto" and self.precision not in FP8_PRECISIONS:
            raise ValueError(f"fp8_layers {self.fp8_layers!r} needs an fp8 precision "
                             f"({', '.join(FP8_PRECISIONS)}); got {self.precision!r}")
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f"compile_mode {self.compile_mode!r} needs compile; got "
                             "compile=False")
        if self.channels_last and not workload.uses_channels_last:
            raise ValueError(
                f"channels_last applies to workloads whose input is one 4-D tensor; "
                f"got model {workload.name!r}"
            )
        if not isinstance(self.loader, LoaderConfig):
            raise ValueError(f"loader must be a LoaderConfig; got {self.loader!r}")
        valid = (*GENERATED_DATASETS, *workload.dataset_names)
        if self.loader.dataset not in valid:
            raise ValueError(f"dataset must be one of {', '.join(valid)} for model "
                             f"{workload.name!r}; got {self.loader.dataset!r}")

    @property
    def workload(self) -> Workload:
        """The workload ``model`` names, sized for ``profile``."""
        from gpubench.workloads.registry import resolve

        return resolve(self.model, self.profile)

    @property
    def name(self) -> str:
        """The workload's short name (case ids, charts, the ``model`` column of results)."""
        return self.workload.name

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(self.parallel, self.world_size)

    @property
    def resolved_micro_batch(self) -> int:
        """Samples per micro-batch: ``micro_batch``, or the workload's default."""
        return self.micro_batch or self.workload.micro_batch

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over every replica."""
        return self.resolved_micro_batch * self.accum_steps * self.parallelism.replicas

    @property
    def is_baseline(self) -> bool:
        """True for the FP32 single-device case every other case of the model is compared to."""
        return self == self.baseline

    @property
    def baseline(self) -> RunConfig:
        """The FP32 single-device case of the same workload, profile, device and seed."""
        return RunConfig(model=self.model, profile=self.profile, device=self.device,
                         seed=self.seed)

    @property
    def inert_techniques(self) -> list[str]:
        """Techniques of this config that do nothing on its device (each with the reason)."""
        return inert_techniques(self.flatten())

    @property
    def multiprocess(self) -> bool:
        """True when the case runs one worker process per rank."""
        return self.parallelism.multiprocess

    @property
    def in_workers(self) -> bool:
        """True when the case runs in worker processes of its own: one per rank
        (``multiprocess``), or one for a case whose CUDA caching allocator must be its own:
        configured before CUDA starts (``expandable_segments``, see ``worker_env``), or emptied
        every step (``empty_cache`` on CUDA: in the process of its paired baseline it would
        free the baseline's cached blocks too, and the baseline, re-allocating its step,
        would hide the case's own cost)."""
        return (self.multiprocess or self.expandable_segments
                or (self.empty_cache and self.device == "cuda"))

    def worker_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment variables the case's worker processes must have before they import
        torch: ``PYTORCH_CUDA_ALLOC_CONF`` with ``expandable_segments:True`` for
        ``expandable_segments`` (added to the allocator options already set in ``environ``,
        default ``os.environ``, and to ``PYTORCH_ALLOC_CONF``, its newer name, where that is
        set); empty otherwise."""
        if not self.expandable_segments:
            return {}
        environ = os.environ if environ is None else environ
        env = {}
        for var in ALLOC_CONF_VARS:
            if var != ALLOC_CONF_VARS[0] and var not in environ:
                continue
            options = [o for o in environ.get(var, "").split(",")
                       if o.strip() and o.split(":")[0].strip() != "expandable_segments"]
            env[var] = ",".join([*options, "expandable_segments:True"])
        return env

    @property
    def id(self) -> str:
        """A readable name listing only what differs from the baseline: ``resnet18-bf16-accum4``."""
        parts = [self.name, *_id_parts(self, loader=False)]
        if self.loader != LoaderConfig():
            parts.append(loader_id(self.loader))
        return "-".join(parts)

    def with_(self, **changes) -> RunConfig:
        """A copy with ``changes`` applied (and validated)."""
        return replace(self, **changes)

    def flatten(self) -> dict:
        """The config as one flat dict of plain values, the loader's fields inlined (``model``
        is the spec; records replace it with the short name and keep the spec as
        ``workload``)."""
        flat = {k: v for k, v in asdict(self).items() if k != "loader"}
        flat.update(asdict(self.loader))
        return flat


def field_docs(cls: type) -> dict[str, str]:
    """What each field of ``RunConfig`` or ``LoaderConfig`` means: the declared techniques'
    help texts and the docstrings under the class's own fields, whitespace folded."""
    docs = attribute_docs(cls)
    loader = cls is LoaderConfig
    docs.update({t.field: " ".join(t.help.split()) for t in TECHNIQUES if t.loader == loader})
    return {f.name: docs.get(f.name, "") for f in fields(cls)}


def inert_techniques(flat: dict) -> list[str]:
    """Techniques of a flattened config (or a result record) that do nothing on its device."""
    if flat.get("device") == "cuda":
        return []
    reasons = (t.inert_on_cpu(flat.get(t.field)) for t in TECHNIQUES if t.inert_on_cpu)
    return [r for r in reasons if r]


@functools.cache
def _defaults(loader: bool) -> dict:
    """The default of every field of ``LoaderConfig`` (``loader``) or ``RunConfig``."""
    return {f.name: f.default for f in fields(LoaderConfig if loader else RunConfig)}


def _check_techniques(config, loader: bool) -> None:
    defaults = _defaults(loader)
    for t in TECHNIQUES:
        if t.loader == loader:
            t.check(getattr(config, t.field), defaults[t.field])


def _id_parts(config, loader: bool) -> list[str]:
    defaults = _defaults(loader)
    parts = (t.id_part(getattr(config, t.field), defaults[t.field], config)
             for t in TECHNIQUES if t.loader == loader)
    return [p for p in parts if p]


def count_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every technique that changes neither the ops a step runs nor the tensors
    autograd saves set to its default, and the counted ones to the value they count as: two
    cases with equal ``count_config`` have equal FLOP and saved-activation counts."""
    changes = {"run": {}, "loader": {}}
    for t in TECHNIQUES:
        side = "loader" if t.loader else "run"
        value = getattr(cfg.loader if t.loader else cfg, t.field)
        if not t.counted:
            changes[side][t.field] = _defaults(t.loader)[t.field]
        elif t.count_as is not None:
            changes[side][t.field] = t.count_as(value)
    loader = replace(cfg.loader, **changes["loader"])
    return replace(cfg, loader=loader, **changes["run"])


def baseline_fields() -> dict:
    """The baseline's value of every technique that finding a case by configuration matches
    (flattened: the loader's fields inlined)."""
    return {t.field: _defaults(t.loader)[t.field] for t in TECHNIQUES if t.matched}


@dataclass(frozen=True)
class Parallelism:
    """The one answer to the parallel questions of a case: processes, replicas, devices."""

    kind: str
    world_size: int

    @property
    def multiprocess(self) -> bool:
        """One worker process per rank (DDP and FSDP replicas, pipeline stages)."""
        return self.kind in MULTIPROCESS_PARALLELS

    @property
    def processes(self) -> int:
        return self.world_size if self.multiprocess else 1

    @property
    def replicas(self) -> int:
        """Model replicas that each consume their own micro-batches (DDP, FSDP: each rank a
        data-parallel replica, FSDP's holding a shard of the state); DataParallel splits one
        micro-batch over its devices, model and pipeline stages share one."""
        return self.world_size if self.kind in ("ddp", "fsdp") else 1

    @property
    def splits_model(self) -> bool:
        return self.kind in SPLIT_PARALLELS

    @property
    def devices(self) -> int:
        """Devices the case occupies (MFU is against all of their peaks)."""
        return self.world_size if self.kind != "single" else 1

    def devices_needed(self, device: str) -> int:
        """CUDA devices the case needs on one machine."""
        return 0 if device != "cuda" else self.devices

    def process_devices(self, device: str, local_rank: int) -> list[str]:
        """The devices one process's step runs on (several for dp and model parallelism)."""
        if device != "cuda":
            return ["cpu"]
        if self.multiprocess:
            return [f"cuda:{local_rank}"]
        if self.kind in ("dp", "model"):
            return [f"cuda:{i}" for i in range(self.world_size)]
        return ["cuda:0"]


def config_from_record(record: dict) -> RunConfig:
    """The ``RunConfig`` a result record was measured with (the inverse of ``flatten``): a
    record as ``gpubench.analysis.results`` reads it (``upgrade``d: every technique field
    present), whose ``workload`` (the spec) names the model."""

    def plain(value):
        if hasattr(value, "item"):  # numpy scalars from pandas
            value = value.item()
        if isinstance(value, float) and value != value:  # NaN: the field's None
            return None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    loader = {f.name: plain(record[f.name]) for f in fields(LoaderConfig)}
    run = {f.name: plain(record[f.name]) for f in fields(RunConfig)
           if f.name not in ("loader", "model")}
    run["model"] = record.get("workload") or record["model"]  # a flattened config: its model
    cfg = RunConfig(**run, loader=LoaderConfig(**loader))
    # Records hold the resolved micro-batch; the config said None when it was the default.
    default = cfg.with_(micro_batch=None)
    return default if default.id == record.get("case_id") else cfg


def loader_id(loader: LoaderConfig) -> str:
    parts = _id_parts(loader, loader=True)
    return "-".join(parts)
