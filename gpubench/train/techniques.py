"""Every technique a case can turn on, declared once.

A technique is a field of ``RunConfig`` (or of its ``LoaderConfig``: how batches are loaded) whose
default is "off". Its declaration here is all the suite knows of it, and what the rest derives
from:

- the config field itself, its default and its help text (``RunConfig`` / ``LoaderConfig`` gain
  one field per declaration; ``gpubench case`` one flag, with the help text);
- how a value is checked (``kind``, ``choices``), with the one-line error naming the valid ones;
- its part of the case id (``tag``: shown where the value differs from the default);
- whether it changes the ops a step runs or the tensors autograd saves (``counted``: where it does
  not, a case reuses the FLOP and activation count of a case that differs only in it);
- why it does nothing on the CPU (``inert_on_cpu``), flagged in records and the advice;
- whether finding a case by configuration matches it against the baseline's value (``matched``);
- the type of its record column (from ``kind``);
- the cases it adds to a case group (``group``, ``cases``, ``profiles``: ``gpubench list``);
- the named variants the memory frontier and convergence parity can train (``variants``);
- its implementation object (``implementation``: a ``gpubench.train.implementations``
  ``Implementation``, whose hooks wrap the model, enter a context around each micro-batch's
  forward and backward, act after each step, or say why a machine cannot run it).

Techniques older than the implementation objects are built by ``gpubench.train.build`` itself
(precision, strategies, optimizer, layout, checkpointing, compile, the loader); the claim a
technique answers, if any, is in ``gpubench.suite.claims``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

KINDS = ("bool", "choice", "count", "count0", "name")
"""``bool``: True or False; ``choice``: one of ``choices``; ``count``: a positive integer (or
None where the default is None); ``count0``: an integer >= 0; ``name``: a non-empty string."""

DIAGNOSTICS = ("frontier", "parity")


@dataclass(frozen=True)
class Variant:
    """A named configuration a diagnostic can train: the memory frontier (``gpubench memory
    --techniques``) and convergence parity (``gpubench parity --techniques``)."""

    name: str
    changes: Mapping[str, Any]
    """The fields it sets on the baseline."""
    description: str
    diagnostics: tuple[str, ...] = DIAGNOSTICS


@dataclass(frozen=True)
class Technique:
    field: str
    """The ``RunConfig`` field (``loader``: a ``LoaderConfig`` field)."""
    kind: str
    choices: tuple = ()
    _: KW_ONLY
    default: Any
    """The field's default: the technique's "off" form."""
    help: str
    """What the field means (its documentation and ``gpubench case`` help)."""
    tag: str | Callable[[Any, Any], str | None] | None = None
    """Its part of the case id: a format string (``"accum{}"``) shown where the value differs
    from the default, a function ``(value, config) -> part or None``, or None (shown by
    another technique's tag)."""
    tag_doc: str = ""
    """How a tag function writes its part, for the documentation (``"{parallel}{world_size}"``)."""
    counted: bool = True
    """False: changes neither the ops a step runs nor the tensors autograd saves."""
    count_as: Callable[[Any], Any] | None = None
    """For a counted technique: the value whose count this one's equals (tf32 counts as fp32)."""
    inert_on_cpu: Callable[[Any], str | None] | None = None
    """Why the value does nothing on the CPU (None: it does something); also given a record's
    value, which may be missing (None, ``pd.NA``) or of the wrong type."""
    matched: bool = True
    """Finding a case by configuration matches this field against the baseline's value (False:
    a size that follows from other fields, such as the micro-batch of an accumulation case)."""
    loader: bool = False
    implementation: str | None = None
    """``"module:Class"`` of its ``Implementation`` (imported when a case is built: this module
    stays free of torch), made for every case whose value differs from the default."""
    group: str | None = None
    """The case group (``gpubench.suite.cases.GROUPS``) its ``cases`` join."""
    cases: Callable[[Any], list] | None = None
    """``base -> [RunConfig, ...]``: the cases it adds to ``group``, made from a model's FP32
    baseline (an empty list where the model cannot use it)."""
    profiles: tuple[str, ...] = ("smoke", "cpu", "gpu-small", "gpu-full")
    """The profiles whose runs include its ``cases`` (smoke keeps only those whose variant
    ``gpubench.suite.cases.SMOKE_VARIANTS`` lists)."""
    variants: tuple[Variant, ...] = field(default=())

    def check(self, value: Any, default: Any) -> None:
        """A one-line ``ValueError`` naming the field, the bad value and the valid ones."""
        name = self.field
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False; got {value!r}")
        elif self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"{name} must be one of {', '.join(map(str, self.choices))}; "
                                 f"got {value!r}")
        elif self.kind == "count":
            if value is None and default is None:
                return
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        elif self.kind == "count0":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0; got {value!r}")
        elif self.kind == "name":
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a {name} name; got {value!r}")

    def id_part(self, value: Any, default: Any, config: Any) -> str | None:
        if self.tag is None:
            return None
        if callable(self.tag):
            return self.tag(value, config)
        if value == default:
            return None
        return self.tag.format(value)


def _optimizer_tag(value: str, cfg: Any) -> str | None:
    if value == "sgd" and cfg.optimizer_impl == "default":
        return None
    return value + ("" if cfg.optimizer_impl == "default" else f"_{cfg.optimizer_impl}")


def _cached_tag(value: bool, loader: Any) -> str | None:
    if not value:
        return None
    return "cached" if loader.cache_items is None else f"cached{loader.cache_items}"


_NO_ACCELERATOR = "no accelerator to copy to"

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp8-rowwise")
FP8_PRECISIONS = {"fp8": "tensorwise", "fp8-rowwise": "rowwise"}
"""The FP8 precisions and torchao's float8 recipe of each (scales per tensor, or per row)."""
FP8_LAYERS = ("auto", "all")
OPTIMIZERS = ("sgd", "adam", "adamw")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
PARALLELS = ("single", "dp", "ddp", "fsdp", "model", "pipeline")
SCHEDULES = ("gpipe", "1f1b")
ATTN_IMPLEMENTATIONS = ("default", "eager", "sdpa")
ATTENTION_BACKENDS = ("default", "flash", "efficient", "cudnn", "math")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def launch_bound_batch(base) -> int:
    """A micro-batch at which the step is launch-bound on a GPU: a sixteenth of the
    baseline's (ResNet-50 16 images, BERT 8 sequences, GPT-2 1), at least the workload's
    smallest: thousands of small kernels a step, each launch a few microseconds, what CUDA
    graphs replay as one."""
    return max(base.workload.min_batch, base.resolved_micro_batch // 16)


TECHNIQUES: tuple[Technique, ...] = (
    # In case-id order.
    Technique(
        "precision", "choice", PRECISIONS, default="fp32",
        help="fp32; tf32 (TF32 matmul/conv on CUDA, same as fp32 elsewhere); fp16 (autocast + "
             "GradScaler); bf16 (autocast); fp8 and fp8-rowwise (bf16 autocast, and the "
             "linears ``fp8_layers`` picks trained in float8 by torchao's "
             "``convert_to_float8_training``, scaled per tensor or per row; emulated where the "
             "device has no FP8 matmul units: a CPU, a GPU below compute capability 8.9).",
        tag=lambda v, c: v, tag_doc="the value, always",
        implementation="gpubench.train.implementations:Float8",
        count_as=lambda v: "fp32" if v == "tf32" else v,
        inert_on_cpu=lambda v: "tf32 (TF32 exists only on CUDA: identical to fp32)"
        if isinstance(v, str) and v == "tf32" else None,
        variants=(Variant("bf16", {"precision": "bf16"}, "AMP bf16 (autocast)"),
                  Variant("fp16", {"precision": "fp16"}, "AMP fp16 (autocast + GradScaler)"))),
    Technique(
        "fp8_layers", "choice", FP8_LAYERS, default="auto",
        tag=lambda v, c: "f8all" if v == "all" and c.precision in FP8_PRECISIONS else None,
        tag_doc="f8all, with an fp8 precision",
        help="Which linears an fp8 precision converts: auto (torchao's own filter, "
             "``_auto_filter_for_recipe``: dimensions multiples of 16 and large enough to gain "
             "by its H100 measurements) or all (every linear whose dimensions are multiples "
             "of 16, FP8 matmul's requirement). The record lists the converted layers "
             "(``fp8_converted``).",
        group="precision", cases=lambda base: [
            base.with_(precision=p, fp8_layers="auto" if base.device == "cuda" else "all")
            for p in FP8_PRECISIONS]),
    Technique(
        "accum_steps", "count", default=1, tag="accum{}",
        help="Micro-batches whose gradients are accumulated before one optimizer step.",
        variants=(Variant("accum4", {"accum_steps": 4},
                          "gradient accumulation k=4, same effective batch", ("parity",)),)),
    Technique(
        "micro_batch", "count", default=None, tag="mb{}", matched=False,
        help="Samples per forward/backward; None takes the profile's default batch size."),
    Technique(
        "optimizer", "choice", OPTIMIZERS, default="sgd", tag=_optimizer_tag, counted=False,
        tag_doc="{optimizer}_{optimizer_impl}, the impl left out when default",
        help="sgd (momentum 0.9), adam or adamw.",
        variants=(Variant("adamw", {"optimizer": "adamw"}, "AdamW (two state tensors per "
                          "parameter)", ("frontier",)),)),
    Technique(
        "optimizer_impl", "choice", OPTIMIZER_IMPLS, default="default", counted=False,
        help="default (torch picks), foreach (multi-tensor) or fused (single kernel)."),
    Technique(
        "zero_grad_set_to_none", "bool", default=True, tag="zerofill", counted=False,
        help="``optimizer.zero_grad(set_to_none=...)``: None frees gradient memory, False "
             "zero-fills.",
        group="memory", cases=lambda base: [base.with_(zero_grad_set_to_none=False)],
        variants=(Variant("sgd-zerofill", {"zero_grad_set_to_none": False},
                          "gradients zero-filled, not freed", ("frontier",)),)),
    Technique(
        "empty_cache", "bool", default=False, tag="emptycache", counted=False,
        help="Call ``torch.cuda.empty_cache()`` after every step (a no-op on the CPU).",
        implementation="gpubench.train.implementations:EmptyCache",
        inert_on_cpu=lambda v: "empty_cache (the CPU allocator keeps no cache)"
        if v is True else None,
        group="memory", cases=lambda base: [base.with_(empty_cache=True)],
        variants=(Variant("emptycache", {"empty_cache": True},
                          "``torch.cuda.empty_cache()`` after every step", ("frontier",)),)),
    Technique(
        "expandable_segments", "bool", default=False, tag="expseg", counted=False,
        help="The CUDA caching allocator with "
             "``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: segments that grow in place "
             "instead of new fixed-size ones, against fragmentation (CUDA only). The allocator "
             "reads the setting when CUDA starts, so such a case runs in a worker process of "
             "its own started with it (``worker_env``).",
        implementation="gpubench.train.implementations:ExpandableSegments",
        group="memory", cases=lambda base: [base.with_(expandable_segments=True)]),
    Technique(
        "checkpointing", "bool", default=False, tag="ckpt",
        help="Activation checkpointing of the model's blocks (``torch.utils.checkpoint``).",
        group="memory", cases=lambda base: [base.with_(checkpointing=True),
                                            base.with_(precision="bf16", checkpointing=True)],
        variants=(Variant("ckpt", {"checkpointing": True}, "activation checkpointing",
                          ("frontier",)),
                  Variant("bf16+ckpt", {"precision": "bf16", "checkpointing": True},
                          "AMP bf16 with activation checkpointing", ("frontier",)))),
    Technique(
        "offload", "bool", default=False, tag="offload", counted=False,
        help="Activation offloading: the tensors autograd saves for backward are copied to "
             "host memory in forward and back to the device in backward "
             "(on CUDA pinned copies on a side stream, ``non_blocking``: "
             "``gpubench.train.implementations.ActivationOffload``; on the CPU "
             "``torch.autograd.graph.save_on_cpu``): device memory for the price of the copies; "
             "an alternative to checkpointing, or beside it.",
        implementation="gpubench.train.implementations:Offload",
        inert_on_cpu=lambda v: "offload (activations already live in host memory: only the "
        "copies remain)" if v is True else None,
        group="memory", cases=lambda base: [base.with_(offload=True),
                                            base.with_(offload=True, checkpointing=True)],
        variants=(Variant("offload", {"offload": True}, "activations offloaded to host memory",
                          ("frontier",)),
                  Variant("offload+ckpt", {"offload": True, "checkpointing": True},
                          "offloading beside activation checkpointing", ("frontier",)))),
    Technique(
        "attention", "choice", ATTENTION_BACKENDS, default="default",
        tag=lambda v, c: None if v == "default" else f"sdpa_{v}",
        tag_doc="sdpa_{attention}",
        help="The kernel ``scaled_dot_product_attention`` runs "
             "(``torch.nn.attention.sdpa_kernel``): default (torch picks); flash "
             "(FlashAttention, also on the CPU); efficient (memory-efficient attention, CUDA); "
             "cudnn (cuDNN attention, CUDA); math (the unfused reference: the scores "
             "materialised, as eager attention does). For workloads whose forward calls it.",
        implementation="gpubench.train.implementations:AttentionBackend",
        # On CUDA the four kernels at bf16, the one dtype all of them have kernels for
        # (flash and cuDNN attention have none for fp32); the precision group's bf16 case is
        # their default. Elsewhere at the baseline's precision, and flash also at bf16.
        group="attention", cases=lambda base: (
            [base.with_(attention=b, precision="bf16" if base.device == "cuda"
                        else base.precision) for b in ("math", "flash", "efficient", "cudnn")]
            + ([] if base.device == "cuda" else [base.with_(precision="bf16", attention="flash")])
            if base.workload.facts.uses_sdpa else [])),
    Technique(
        "attn_implementation", "choice", ATTN_IMPLEMENTATIONS, default="default",
        tag=lambda v, c: None if v == "default" else f"attn_{v}", tag_doc="attn_{value}",
        help="The attention code of a Hugging Face transformers model "
             "(``PreTrainedModel.set_attn_implementation``): default (the model's own, "
             "``sdpa`` for most); eager (transformers' Python attention: the score matrix "
             "materialised, softmax and dropout as separate ops); sdpa "
             "(``scaled_dot_product_attention``, whose kernel ``attention`` can pin).",
        implementation="gpubench.train.implementations:AttnImplementation",
        group="attention", cases=lambda base: [
            base.with_(attn_implementation=v) for v in ("eager", "sdpa")
            if v != base.workload.facts.hf_attention]
        if base.workload.facts.hf_attention else []),
    Technique(
        "channels_last", "bool", default=False, tag="cl",
        help="NHWC memory format (workloads whose input is one 4-D tensor).",
        group="layout",
        cases=lambda base: [base.with_(channels_last=True),
                            base.with_(precision="bf16", channels_last=True)]
        if base.workload.uses_channels_last else []),
    Technique(
        "compile", "bool", default=False, tag="compile",
        help="Wrap the model in ``torch.compile`` (needs a C++ compiler on the CPU). The record "
             "says what compiling cost: ``compile_time_s`` (the first step's time less a "
             "steady step's) and ``break_even_steps`` (that time over the seconds each step "
             "saves against the baseline).",
        # On CUDA also FP8 compiled, beside compiled bf16: torchao's float8 gains are with
        # torch.compile (its scaling and casts fused), the fp8 claim's two sides.
        group="compile", cases=lambda base: [base.with_(compile=True),
                                             base.with_(precision="bf16", compile=True)]
        + ([base.with_(precision=p, compile=True) for p in FP8_PRECISIONS]
           if base.device == "cuda" else [])),
    Technique(
        "compile_mode", "choice", COMPILE_MODES, default="default", tag="{}",
        help="``torch.compile``'s ``mode`` with ``compile``: default; reduce-overhead (CUDA "
             "graphs: the step's kernels replayed as one graph, against launch overhead; CUDA "
             "only); max-autotune-no-cudagraphs (Triton / C++ kernels autotuned per shape, "
             "minutes of compilation).",
        group="compile", cases=lambda base: [
            base.with_(compile=True, compile_mode="reduce-overhead"),
            base.with_(compile=True, compile_mode="max-autotune-no-cudagraphs")]
        # On CUDA, CUDA graphs where they can help: a launch-bound step (bf16 at a sixteenth
        # of the micro-batch), against compile's default mode at the same configuration.
        + ([base.with_(compile=True, precision="bf16", micro_batch=launch_bound_batch(base)),
            base.with_(compile=True, compile_mode="reduce-overhead", precision="bf16",
                       micro_batch=launch_bound_batch(base))] if base.device == "cuda" else [])),
    Technique(
        "parallel", "choice", PARALLELS, default="single",
        tag=lambda v, c: None if v == "single" else f"{v}{c.world_size}",
        tag_doc="{parallel}{world_size}",
        help="How the step is spread over devices: single; dp (``nn.DataParallel``, one "
             "process, CUDA only); ddp (``DistributedDataParallel``, one process per rank); "
             "fsdp (FSDP2's ``fully_shard``, one process per rank: parameters, gradients and "
             "optimizer state sharded over the ranks, each block gathered for its forward and "
             "backward; with accumulation, gradients are reduced on the last micro-batch "
             "only); model (the workload's stages over devices in one process); pipeline "
             "(stages in one process each, fed micro-batches by a "
             "``torch.distributed.pipelining`` schedule).",
        variants=(Variant("ddp2", {"parallel": "ddp", "world_size": 2},
                          "DDP over 2 ranks, same global batch", ("parity",)),)),
    Technique(
        "world_size", "count", default=1, matched=False,
        help="Devices (dp, model) or processes (ddp, fsdp, pipeline) taking part in the step."),
    Technique(
        "ddp_no_sync", "bool", default=False, tag="nosync",
        help="DDP with accumulation: skip the gradient all-reduce on all but the last "
             "micro-batch."),
    Technique(
        "fsdp_mixed_precision", "bool", default=False, tag="mp",
        help="FSDP's own mixed precision (``MixedPrecisionPolicy``: bf16 parameters for forward "
             "and backward, gradients reduced in fp32, fp32 sharded parameters for the "
             "optimizer) instead of autocast; needs parallel fsdp and precision fp32."),
    Technique(
        "chunks", "count", default=1, tag="chunks{}", matched=False,
        help="Pipeline micro-batches per micro-batch (the schedule splits each batch into this "
             "many)."),
    Technique(
        "schedule", "choice", SCHEDULES, default="gpipe", tag="{}", matched=False,
        help="Pipeline schedule: gpipe or 1f1b."),
    # How batches reach the step (LoaderConfig).
    Technique(
        "dataset", "name", default="device-resident", tag="{}", loader=True,
        help="Where samples come from: ``device-resident`` (the default: one optimizer step of "
             "batches made by the workload's ``make_batch``, placed on the device once and "
             "reused, so that a timed step measures the technique, not collation and "
             "host-to-device copies; the no-loading upper bound of the loader cases); "
             "``synthetic`` (the same samples held in host memory, collated by the loader and "
             "copied every step); or one of the workload's own datasets by name (the built-in "
             "image models: ``images-jpeg`` / ``images-png``, encoded files decoded with PIL "
             "and augmented with torchvision; the built-in token models: ``tokens-mmap``, "
             "windows of a memory-mapped token file)."),
    Technique(
        "dataset_size", "count", default=None, tag="n{}", matched=False, loader=True,
        help="Samples on disk for the on-disk datasets (None: the profile's default)."),
    Technique(
        "cached", "bool", default=False, tag=_cached_tag, counted=False, loader=True,
        tag_doc="cached, or cached{cache_items} with a bound",
        help="Keep decoded samples in a bounded in-memory cache (the workload's own datasets)."),
    Technique(
        "cache_items", "count", default=None, counted=False, matched=False, loader=True,
        help="Bound of the decoded-sample cache, per loading process (None: the whole "
             "dataset)."),
    Technique(
        "num_workers", "count0", default=0, tag="w{}", counted=False, loader=True,
        help="DataLoader worker processes; 0 loads in the training process."),
    Technique(
        "pin_memory", "bool", default=False, tag="pin", counted=False, loader=True,
        help="Collate batches into page-locked host memory (faster, asynchronous host-to-device "
             "copies).",
        inert_on_cpu=lambda v: f"pin_memory ({_NO_ACCELERATOR})" if v is True else None),
    Technique(
        "prefetch_factor", "count", default=None, tag="pf{}", counted=False, loader=True,
        help="Batches each worker loads ahead; only valid with ``num_workers > 0`` (torch "
             "default 2)."),
    Technique(
        "persistent_workers", "bool", default=False, tag="persist", counted=False, loader=True,
        help="Keep workers alive between epochs; only valid with ``num_workers > 0``."),
    Technique(
        "non_blocking", "bool", default=False, tag="nb", counted=False, loader=True,
        help="Copy batches to the device with ``non_blocking=True`` (overlaps with compute if "
             "pinned).",
        inert_on_cpu=lambda v: f"non_blocking ({_NO_ACCELERATOR})" if v is True else None),
    Technique(
        "cold", "bool", default=False, tag="cold", counted=False, loader=True,
        help="Drop the dataset's files from the page cache before each epoch "
             "(``posix_fadvise(POSIX_FADV_DONTNEED)``, ``gpubench.workloads.storage``), so that "
             "every file is read from the disk, as with a dataset larger than RAM; the "
             "workload's own datasets only."),
)
"""Every technique, run-level first, in the order their parts appear in case ids."""

BY_FIELD = {t.field: t for t in TECHNIQUES}

SEARCH_DIMENSIONS = ("precision", "micro_batch", "checkpointing", "optimizer_impl",
                     "channels_last", "attn_implementation", "offload", "attention", "compile")
"""The techniques ``gpubench tune`` can combine (``micro_batch`` with the accumulation that keeps
the global batch); each where the device and the workload can use it."""
DEFAULT_SEARCH = SEARCH_DIMENSIONS[:-2]
"""Those it combines by default: all but the pinned SDPA kernel (torch's default already picks
the fastest supported one) and compile (minutes of compilation per try)."""


def column_type(technique: Technique) -> tuple[str, str]:
    """The record column type of a technique's field, as ``gpubench.analysis.results`` checks
    it: (type, range)."""
    return {"bool": ("bool", "any"), "choice": ("str", "any"), "name": ("str", "any"),
            "count": ("int", ">=1"), "count0": ("int", ">=0")}[technique.kind]


def variants(diagnostic: str) -> dict[str, Variant]:
    """The named variants ``diagnostic`` (one of ``DIAGNOSTICS``) can train, by name, in
    declaration order."""
    return {v.name: v for t in TECHNIQUES for v in t.variants if diagnostic in v.diagnostics}


def annotation(technique: Technique) -> str:
    """The type of a technique's config field."""
    return {"bool": "bool", "choice": "str", "name": "str", "count0": "int",
            "count": "int | None" if technique.default is None else "int"}[technique.kind]


def declare_fields(loader: bool, after: str | None = None) -> Callable[[type], type]:
    """A class decorator (applied before ``@dataclass``) that adds one field per declared
    technique of ``RunConfig`` (``loader``: ``LoaderConfig``), with its default, in declaration
    order, after the class's own field ``after`` (None: before its own fields)."""

    def add(cls: type) -> type:
        own = list(cls.__dict__.get("__annotations__", {}).items())
        cut = 0 if after is None else [name for name, _ in own].index(after) + 1
        declared = [(t.field, annotation(t)) for t in TECHNIQUES if t.loader == loader]
        for t in TECHNIQUES:
            if t.loader == loader:
                setattr(cls, t.field, t.default)
        cls.__annotations__ = dict(own[:cut] + declared + own[cut:])
        return cls

    return add
