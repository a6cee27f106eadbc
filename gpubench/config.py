"""What to run: one frozen, validated configuration per benchmark case.

Strings become objects only in ``gpubench.build``; here they are checked against the valid
choices so that a typo fails at once with a message naming the bad value and the valid ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

MODELS = ("resnet18", "resnet50", "bert", "gpt2")
IMAGE_MODELS = ("resnet18", "resnet50")
PROFILES = ("smoke", "cpu", "gpu-small", "gpu-full")
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
OPTIMIZERS = ("sgd", "adam", "adamw")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
PARALLELS = ("single", "dp", "ddp", "model", "pipeline")
MULTIPROCESS_PARALLELS = ("ddp", "pipeline")
"""Strategies that run one process per rank (DDP replicas, pipeline stages)."""
SPLIT_PARALLELS = ("model", "pipeline")
"""Strategies that split the model's layers into stages (image models only)."""
MAX_STAGES = 4
"""A ResNet splits into at most four stages, one per residual layer group."""
DATASETS = ("synthetic", "device-resident", "images-jpeg", "images-png", "tokens-mmap")
IMAGE_DATASETS = ("images-jpeg", "images-png")
ON_DISK_DATASETS = (*IMAGE_DATASETS, "tokens-mmap")
SCHEDULES = ("gpipe", "1f1b")


def _check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def _check_positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How batches reach the training step (a ``torch.utils.data.DataLoader``)."""

    dataset: str = "synthetic"
    """Where samples come from: ``synthetic`` (random tensors held in host memory, collated by
    the loader); ``device-resident`` (batches already on the device: the no-loading upper
    bound); ``images-jpeg`` / ``images-png`` (encoded files decoded with PIL and augmented with
    torchvision); ``tokens-mmap`` (windows of a memory-mapped token file)."""
    dataset_size: int | None = None
    """Samples on disk for the on-disk datasets (None: the profile's default)."""
    cached: bool = False
    """Keep decoded samples in a bounded in-memory cache (on-disk datasets)."""
    cache_items: int | None = None
    """Bound of the decoded-sample cache, per loading process (None: the whole dataset)."""
    num_workers: int = 0
    """DataLoader worker processes; 0 loads in the training process."""
    pin_memory: bool = False
    """Collate batches into page-locked host memory (faster, asynchronous host-to-device copies)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead; only valid with ``num_workers > 0`` (torch default 2)."""
    persistent_workers: bool = False
    """Keep workers alive between epochs; only valid with ``num_workers > 0``."""
    non_blocking: bool = False
    """Copy batches to the device with ``non_blocking=True`` (overlaps with compute if pinned)."""

    def __post_init__(self) -> None:
        _check_choice("dataset", self.dataset, DATASETS)
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0; got {self.num_workers!r}")
        _check_positive_int("prefetch_factor", self.prefetch_factor, allow_none=True)
        _check_positive_int("dataset_size", self.dataset_size, allow_none=True)
        _check_positive_int("cache_items", self.cache_items, allow_none=True)
        if self.cached and self.dataset not in ON_DISK_DATASETS:
            raise ValueError(
                f"cached applies to on-disk datasets ({', '.join(ON_DISK_DATASETS)}); "
                f"got dataset {self.dataset!r}"
            )
        resident = self.dataset == "device-resident"
        if resident and replace(self, dataset="synthetic") != LoaderConfig():
            raise ValueError("dataset 'device-resident' bypasses the loader: leave its other "
                             "settings at their defaults")
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ValueError(
                "prefetch_factor and persistent_workers need num_workers > 0; "
                f"got num_workers=0, prefetch_factor={self.prefetch_factor!r}, "
                f"persistent_workers={self.persistent_workers!r}"
            )


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One benchmark case: a model through one training step under a set of techniques.

    Every field's default is the technique's "off" form, so ``RunConfig(model=...)`` is the FP32
    single-device baseline the other cases are compared with.
    """

    model: str
    """Model family and size: resnet18, resnet50 (images), bert (encoder), gpt2 (decoder)."""
    profile: str = "cpu"
    """Problem size: smoke (tests), cpu (2-core laptop scale), gpu-small, gpu-full."""
    device: str = "cpu"
    """Where the step runs: cpu or cuda."""
    precision: str = "fp32"
    """fp32; tf32 (TF32 matmul/conv on CUDA, same as fp32 elsewhere); fp16 (autocast + GradScaler);
    bf16 (autocast)."""
    accum_steps: int = 1
    """Micro-batches whose gradients are accumulated before one optimizer step."""
    micro_batch: int | None = None
    """Samples per forward/backward; None takes the profile's default batch size."""
    optimizer: str = "sgd"
    """sgd (momentum 0.9), adam or adamw."""
    optimizer_impl: str = "default"
    """default (torch picks), foreach (multi-tensor) or fused (single kernel)."""
    zero_grad_set_to_none: bool = True
    """``optimizer.zero_grad(set_to_none=...)``: None frees gradient memory, False zero-fills."""
    empty_cache: bool = False
    """Call ``torch.cuda.empty_cache()`` after every step (a no-op on the CPU)."""
    checkpointing: bool = False
    """Activation checkpointing of the model's blocks (``torch.utils.checkpoint``)."""
    channels_last: bool = False
    """NHWC memory format for image models."""
    compile: bool = False
    """Wrap the model in ``torch.compile`` (needs a C++ compiler on the CPU)."""
    parallel: str = "single"
    """How the step is spread over devices: single; dp (``nn.DataParallel``, one process, CUDA
    only); ddp (``DistributedDataParallel``, one process per rank); model (layers split over
    devices in one process); pipeline (stages in one process each, fed micro-batches by a
    ``torch.distributed.pipelining`` schedule)."""
    world_size: int = 1
    """Devices (dp, model) or processes (ddp, pipeline) taking part in the step."""
    ddp_no_sync: bool = False
    """DDP with accumulation: skip the gradient all-reduce on all but the last micro-batch."""
    chunks: int = 1
    """Pipeline micro-batches per micro-batch (the schedule splits each batch into this many)."""
    schedule: str = "gpipe"
    """Pipeline schedule: gpipe or 1f1b."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """DataLoader settings."""
    seed: int = 0
    """Seeds model weights and data, so that cases of one model start from identical state."""

    def __post_init__(self) -> None:
        _check_choice("model", self.model, MODELS)
        _check_choice("profile", self.profile, PROFILES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _check_choice("parallel", self.parallel, PARALLELS)
        _check_positive_int("accum_steps", self.accum_steps)
        _check_positive_int("micro_batch", self.micro_batch, allow_none=True)
        _check_positive_int("world_size", self.world_size)
        _check_positive_int("chunks", self.chunks)
        _check_choice("schedule", self.schedule, SCHEDULES)
        if self.parallel == "single" and self.world_size != 1:
            raise ValueError(f"parallel 'single' needs world_size 1; got {self.world_size!r}")
        if self.parallel in SPLIT_PARALLELS:
            if self.model not in IMAGE_MODELS:
                raise ValueError(
                    f"parallel {self.parallel!r} splits image models into stages "
                    f"({', '.join(IMAGE_MODELS)}); got model {self.model!r}"
                )
            if not 2 <= self.world_size <= MAX_STAGES:
                raise ValueError(
                    f"parallel {self.parallel!r} needs world_size 2..{MAX_STAGES} (stages); "
                    f"got {self.world_size!r}"
                )
        if self.ddp_no_sync and self.parallel != "ddp":
            raise ValueError(f"ddp_no_sync needs parallel 'ddp'; got {self.parallel!r}")
        if self.parallel != "pipeline" and (self.chunks != 1 or self.schedule != "gpipe"):
            raise ValueError(
                f"chunks and schedule apply to parallel 'pipeline'; got {self.parallel!r}"
            )
        if self.channels_last and self.model not in IMAGE_MODELS:
            raise ValueError(
                f"channels_last applies to image models ({', '.join(IMAGE_MODELS)}); "
                f"got model {self.model!r}"
            )
        if not isinstance(self.loader, LoaderConfig):
            raise ValueError(f"loader must be a LoaderConfig; got {self.loader!r}")
        if self.loader.dataset in IMAGE_DATASETS and self.model not in IMAGE_MODELS:
            raise ValueError(f"dataset {self.loader.dataset!r} feeds image models "
                             f"({', '.join(IMAGE_MODELS)}); got model {self.model!r}")
        if self.loader.dataset == "tokens-mmap" and self.model in IMAGE_MODELS:
            raise ValueError(f"dataset 'tokens-mmap' feeds token models; got model {self.model!r}")

    @property
    def is_baseline(self) -> bool:
        """True for the FP32 single-device case every other case of the model is compared to."""
        return self == RunConfig(
            model=self.model, profile=self.profile, device=self.device, seed=self.seed
        )

    @property
    def inert_techniques(self) -> list[str]:
        """Techniques of this config that do nothing on its device (each with the reason)."""
        if self.device == "cuda":
            return []
        inert = []
        if self.precision == "tf32":
            inert.append("tf32 (TF32 exists only on CUDA: identical to fp32)")
        if self.empty_cache:
            inert.append("empty_cache (the CPU allocator keeps no cache)")
        if self.loader.pin_memory or self.loader.non_blocking:
            inert.append("pin_memory/non_blocking (no accelerator to copy to)")
        return inert

    @property
    def multiprocess(self) -> bool:
        """True when the case runs one worker process per rank."""
        return self.parallel in MULTIPROCESS_PARALLELS

    @property
    def id(self) -> str:
        """A readable name listing only what differs from the baseline: ``resnet18-bf16-accum4``."""
        parts = [self.model, self.precision]
        if self.accum_steps != 1:
            parts.append(f"accum{self.accum_steps}")
        if self.micro_batch is not None:
            parts.append(f"mb{self.micro_batch}")
        if self.optimizer != "sgd" or self.optimizer_impl != "default":
            impl = "" if self.optimizer_impl == "default" else f"_{self.optimizer_impl}"
            parts.append(f"{self.optimizer}{impl}")
        if not self.zero_grad_set_to_none:
            parts.append("zerofill")
        if self.empty_cache:
            parts.append("emptycache")
        if self.checkpointing:
            parts.append("ckpt")
        if self.channels_last:
            parts.append("cl")
        if self.compile:
            parts.append("compile")
        if self.parallel != "single":
            parts.append(f"{self.parallel}{self.world_size}")
        if self.ddp_no_sync:
            parts.append("nosync")
        if self.chunks != 1:
            parts.append(f"chunks{self.chunks}")
        if self.schedule != "gpipe":
            parts.append(self.schedule)
        if self.loader != LoaderConfig():
            parts.append(loader_id(self.loader))
        return "-".join(parts)

    def with_(self, **changes) -> RunConfig:
        """A copy with ``changes`` applied (and validated)."""
        return replace(self, **changes)

    def flatten(self) -> dict:
        """The config as one flat dict of plain values, the loader's fields inlined."""
        flat = {k: v for k, v in asdict(self).items() if k != "loader"}
        flat.update(asdict(self.loader))
        return flat


def config_from_record(record: dict) -> RunConfig:
    """The ``RunConfig`` a result record was measured with (the inverse of ``flatten``)."""

    def plain(value):
        if hasattr(value, "item"):  # numpy scalars from pandas
            value = value.item()
        if isinstance(value, float) and value != value:  # NaN: the field's None
            return None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    loader = {f.name: plain(record[f.name]) for f in fields(LoaderConfig) if f.name in record}
    run = {f.name: plain(record[f.name]) for f in fields(RunConfig)
           if f.name != "loader" and f.name in record}
    cfg = RunConfig(**run, loader=LoaderConfig(**loader))
    # Records hold the resolved micro-batch; the config said None when it was the default.
    default = cfg.with_(micro_batch=None)
    return default if default.id == record.get("case_id") else cfg


def loader_id(loader: LoaderConfig) -> str:
    parts = [loader.dataset] if loader.dataset != "synthetic" else []
    if loader.dataset_size is not None:
        parts.append(f"n{loader.dataset_size}")
    if loader.cached:
        parts.append("cached" if loader.cache_items is None else f"cached{loader.cache_items}")
    if loader.num_workers:
        parts.append(f"w{loader.num_workers}")
    if loader.pin_memory:
        parts.append("pin")
    if loader.prefetch_factor is not None:
        parts.append(f"pf{loader.prefetch_factor}")
    if loader.persistent_workers:
        parts.append("persist")
    if loader.non_blocking:
        parts.append("nb")
    return "-".join(parts)
