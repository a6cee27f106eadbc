"""What the suite needs to know about a model: the public ``Workload`` and how one is named.

A ``Workload`` is everything gpubench asks of a model: how to build it, a batch of inputs and
targets, the loss, and optionally the user's own dataset and a split into stages. No other module
asks which model family it is measuring. The built-in models are workloads defined in
``gpubench.workloads.builtin`` with this same public API.

A workload is named by a *spec* everywhere a model is accepted (``--model``, ``--models``,
``RunConfig.model``):

- a built-in name (``resnet18``, ``resnet50``, ``bert``, ``gpt2``);
- ``path/to/file.py:factory`` or ``package.module:factory``, ``factory()`` returning a
  ``Workload`` (called as ``factory(profile=...)`` if it takes a ``profile`` argument);
- ``torchvision:NAME`` (any torchvision classification model, random weights);
- ``transformers:MODEL_TYPE`` or ``transformers:path/to/config.json``, with size overrides after
  ``?`` (``transformers:llama?hidden_size=256&num_hidden_layers=2``);
- a name registered by an installed package in the entry-point group ``gpubench.workloads``.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset

VALIDATE_TIMEOUT_S = 300.0
"""Seconds the validation of a workload (and its probe build) may take before it fails as hung
(a ``make_batch`` or ``build_model`` that blocks), like ``--timeout``'s default."""


_probe_timeout_s = VALIDATE_TIMEOUT_S


def set_probe_timeout(seconds: float | None) -> None:
    """Bound this process's workload validation and probe builds by ``seconds`` (a command's
    ``--timeout``: everything a case does stays within it); None restores the default."""
    global _probe_timeout_s
    _probe_timeout_s = VALIDATE_TIMEOUT_S if not seconds else float(seconds)


def probe_timeout_s() -> float:
    """Seconds a workload's validation or probe build may take (``set_probe_timeout``)."""
    return _probe_timeout_s


PROBE_LOCK_GRACE_S = 10.0
"""How much longer than a probe's own limit a process waits for another's probe of the same
facts before probing itself (``factcache.probing``)."""


def _stored_facts(key: dict | None) -> WorkloadFacts | None:
    """The facts the cache holds under ``key``, or None (none, or an entry of another shape,
    which the next probe replaces)."""
    from gpubench.workloads import factcache

    stored = None if key is None else factcache.read_facts(key)
    if stored is None:
        return None
    try:
        return WorkloadFacts.from_json(stored)
    except (TypeError, ValueError):
        return None


class WorkloadError(ValueError):
    """A workload spec that cannot be resolved, or a workload that breaks the contract."""


def _user_call(workload: Workload, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a function the workload gave; whatever it raises becomes a one-line
    ``WorkloadError`` naming the workload and ``what`` (a time limit's stop passes through)."""
    from gpubench.util.watchdog import is_time_limit

    try:
        return fn(*args)
    except WorkloadError:
        raise
    except SystemExit as err:  # a silent exit 0 would pass for success
        raise WorkloadError(f"workload {workload.spec or workload.name}: {what} called "
                            f"sys.exit({err.code!r}); it must return, not exit") from None
    except Exception as err:  # noqa: BLE001 - the user's code: report it on one line
        if is_time_limit(err):
            raise
        text = " ".join(str(err).split())
        raise WorkloadError(f"workload {workload.spec or workload.name}: {what} raised "
                            f"{type(err).__name__}{': ' + text if text else ''}") from err


@dataclass(frozen=True)
class DataRequest:
    """What a workload's dataset factory is asked for."""

    root: Path
    """A folder the dataset may generate files into and reuse (``--data-dir``)."""
    size: int
    """Samples the loader cases will read at least (more is fine)."""
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A model and its data, as the benchmark suite sees it. Define one in a factory function and
    point ``gpubench run --model path/to/file.py:factory`` at it.

    The model's forward is called as ``model(inputs)`` (a tensor), ``model(*inputs)`` (a tuple)
    or ``model(**inputs)`` (a dict); with ``loss_fn`` the loss is ``loss_fn(outputs, targets)``,
    without it the model itself is called as ``model(inputs, targets)`` and returns the loss.
    """

    name: str
    """Short name used in case ids and charts (``unet``, ``vit-tiny``)."""
    build_model: Callable[[], nn.Module]
    """A fresh model with random weights, on the CPU (the suite seeds the RNG first and moves
    it to the device). Dropout layers are set to p=0 so techniques compare numerically."""
    make_batch: Callable[[int, torch.Generator], tuple[Any, Any]]
    """``make_batch(batch_size, generator) -> (inputs, targets)`` on the CPU: tensors, or a
    tuple/dict of tensors (e.g. ``{"input_ids": ..., "attention_mask": ...}``), batch first."""
    micro_batch: int
    """Default samples per micro-batch."""
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    """``loss_fn(outputs, targets) -> scalar``; None: ``model(inputs, targets)`` is the loss."""
    dataset: Callable[[DataRequest], Dataset] | None = None
    """Optional: the user's real data path, a Dataset of ``(input, target)`` samples (their own
    files, decoding and augmentation) for the loader cases. Without it the loader cases read
    samples made by ``make_batch``. A dataset with ``load(i)`` / ``finish(sample)`` methods is
    cached at the decode step (``load``); otherwise the cache keeps whole samples."""
    dataset_name: str = "files"
    """Name of ``dataset`` in case ids (``unet-fp32-files-w2``)."""
    extra_datasets: Mapping[str, Callable[[DataRequest], Dataset]] = field(default_factory=dict)
    """More datasets, each measured once with the default loader (the built-in image models'
    PNG files beside their JPEGs)."""
    stages: Callable[[nn.Module, int], list[nn.Module]] | None = None
    """Optional: ``stages(model, n)`` splits the built model into ``n`` modules run in order,
    each taking the previous one's output (the first takes the input tensor, the last's output
    goes to ``loss_fn``), for model and pipeline parallelism. None: those cases skip. Raise
    ``ValueError`` for an ``n`` the model cannot be split into."""
    checkpointing: Callable[[nn.Module], None] | None = None
    """Optional: turn on activation checkpointing in the built model, in place. None: every
    block of the model's longest ``nn.ModuleList``/``nn.Sequential`` is recomputed in backward
    (``checkpoint_blocks``)."""
    tolerances: Mapping[str, float] = field(default_factory=dict)
    """Relative tolerance of the training check per precision (``{"bf16": 0.08}``), overriding
    the suite's defaults (fp32 1e-4, tf32 5e-3, fp16 1e-2, bf16 4e-2)."""
    channels_last: bool | None = None
    """Whether the channels_last layout applies; None: when the inputs are one 4-D tensor."""
    imports: tuple[str, ...] = ()
    """Modules ``build_model`` imports (``"transformers.models.bert.modeling_bert"``): the fork
    server of a run's CPU rank processes imports them once, before it forks the first rank,
    instead of every rank importing them as it builds (transformers' BERT: 2-3 s of a 2-core
    CPU per rank). A module whose import fails (in any way) is skipped; the ranks then import
    what they need themselves."""
    spec: str = ""
    """How the workload was named (set by ``resolve``; rebuilds it in worker processes)."""
    profile: str = ""
    """The profile it was sized for (set by ``resolve``; part of its facts' cache key)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in " /:"):
            raise WorkloadError(f"Workload.name must be a non-empty string without spaces, '/' "
                                f"or ':'; got {self.name!r}")
        if not isinstance(self.micro_batch, int) or self.micro_batch < 1:
            raise WorkloadError(f"Workload {self.name}: micro_batch must be a positive integer; "
                                f"got {self.micro_batch!r}")
        for attr in ("build_model", "make_batch"):
            if not callable(getattr(self, attr)):
                raise WorkloadError(f"Workload {self.name}: {attr} must be callable")
        if isinstance(self.imports, str) or not all(isinstance(m, str) for m in self.imports):
            raise WorkloadError(f"Workload {self.name}: imports must be a tuple of module names "
                                f"such as ('transformers.models.bert.modeling_bert',); got "
                                f"{self.imports!r}")
        reserved = {"synthetic", "device-resident"}
        names = [self.dataset_name, *self.extra_datasets]
        if reserved & set(names):
            raise WorkloadError(f"Workload {self.name}: dataset names {sorted(reserved)} are "
                                f"reserved; got {names}")

    @property
    def dataset_names(self) -> tuple[str, ...]:
        """Names of the workload's own datasets, the main one first."""
        main = (self.dataset_name,) if self.dataset is not None else ()
        return (*main, *self.extra_datasets)

    def dataset_factory(self, name: str) -> Callable[[DataRequest], Dataset]:
        if self.dataset is not None and name == self.dataset_name:
            return self.dataset
        if name in self.extra_datasets:
            return self.extra_datasets[name]
        raise WorkloadError(f"workload {self.name} has no dataset {name!r}; it has "
                            f"{', '.join(self.dataset_names) or 'none'}")

    def sample_batch(self, batch_size: int, seed: int = 0) -> tuple[Any, Any]:
        return _user_call(self, f"make_batch({batch_size}, generator)", self.make_batch,
                          batch_size, torch.Generator().manual_seed(seed))

    @functools.cached_property
    def facts(self) -> WorkloadFacts:
        """What one probe build tells (cached in this object, and on disk for the other
        processes of a run, ``gpubench.workloads.factcache``): input layout, BatchNorm,
        parameter count, the blocks the default checkpointing would wrap. A ``build_model`` or
        ``make_batch`` that raises is a one-line ``WorkloadError``; one that blocks, after
        ``VALIDATE_TIMEOUT_S``."""
        from gpubench.workloads import factcache

        key = factcache.facts_key(self, tuple(f.name for f in fields(WorkloadFacts)))
        stored = _stored_facts(key)
        if stored is not None:
            return stored
        # Missed: one process of those missing it at once probes, the others read its entry.
        with factcache.probing(key, probe_timeout_s() + PROBE_LOCK_GRACE_S):
            stored = _stored_facts(key)
            if stored is not None:
                return stored
            facts = self._probe_facts()
            if key is not None:
                factcache.write_facts(key, asdict(facts))
            return facts

    def _probe_facts(self) -> WorkloadFacts:
        """``facts`` from one probe build of the model and a batch of two samples."""
        from gpubench.util.watchdog import time_limit

        limit = probe_timeout_s()
        with time_limit(limit, f"workload {self.spec or self.name}: its probe "
                        f"build (build_model, make_batch) did not finish within "
                        f"{limit:g} s (hung?)", error=WorkloadError):
            inputs, targets = self.sample_batch(2)
            torch.manual_seed(0)
            model = _user_call(self, "build_model()", self.build_model)
        leaves = [x for x in tree_flatten(inputs)[0] if isinstance(x, torch.Tensor)]
        blocks = _block_list(model)
        uses_sdpa = _calls_sdpa(model, inputs)
        sample_bytes = sum(t.element_size() * t.nelement()
                           for t in (*tree_flatten(inputs)[0], *tree_flatten(targets)[0])
                           if isinstance(t, torch.Tensor)) // 2
        return WorkloadFacts(
            single_tensor_input=isinstance(inputs, torch.Tensor),
            input_dims=leaves[0].dim() if leaves else 0,
            batch_norm=any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                           for m in model.modules()),
            parameters=sum(p.numel() for p in model.parameters()),
            blocks=len(blocks) if blocks is not None else 0,
            sample_bytes=sample_bytes,
            uses_sdpa=uses_sdpa,
            hf_attention=_hf_attention(model),
            linears=tuple((name, *m.weight.shape) for name, m in model.named_modules()
                          if isinstance(m, nn.Linear)),
        )

    @property
    def uses_channels_last(self) -> bool:
        if self.channels_last is not None:
            return self.channels_last
        return self.facts.single_tensor_input and self.facts.input_dims == 4

    @property
    def min_batch(self) -> int:
        """Smallest micro-batch (or pipeline chunk) that trains: BatchNorm needs two samples."""
        return 2 if self.facts.batch_norm else 1

    def input_shape(self, batch_size: int) -> list[int]:
        """Shape of the first input tensor of a batch of ``batch_size``."""
        inputs, _ = self.sample_batch(batch_size)
        leaves = [x for x in tree_flatten(inputs)[0] if isinstance(x, torch.Tensor)]
        return list(leaves[0].shape) if leaves else []


@dataclass(frozen=True)
class WorkloadFacts:
    single_tensor_input: bool
    input_dims: int
    batch_norm: bool
    parameters: int
    blocks: int = 0
    """Blocks the default checkpointing wraps (``checkpoint_blocks``); 0: it finds none."""
    sample_bytes: int = 0
    """Bytes of one sample's tensors from ``make_batch`` (inputs and targets)."""
    uses_sdpa: bool = False
    """Its forward calls ``torch.nn.functional.scaled_dot_product_attention`` (the attention
    backend cases pin its kernel)."""
    hf_attention: str | None = None
    """The attention implementation of its Hugging Face transformers model (``eager``,
    ``sdpa``, ...: ``config._attn_implementation``), None for a model of another library."""
    linears: tuple[tuple[str, int, int], ...] = ()
    """Each ``nn.Linear`` of the model: (module name, out features, in features), what the fp8
    precisions choose the linears they convert from."""

    @classmethod
    def from_json(cls, data: dict) -> WorkloadFacts:
        """The facts from ``dataclasses.asdict``'s fields as JSON gives them back (lists for
        tuples); a ``TypeError`` or ``ValueError`` where they are not these facts' fields."""
        facts = cls(**{**data, "linears": tuple((str(n), int(o), int(i))
                                                for n, o, i in data.get("linears", ()))})
        return facts


def hf_model(model: nn.Module) -> nn.Module | None:
    """The outermost Hugging Face ``PreTrainedModel`` inside ``model``, or None."""
    transformers = sys.modules.get("transformers")  # a model of it has imported it
    if transformers is None:
        return None
    return next((m for m in model.modules() if isinstance(m, transformers.PreTrainedModel)),
                None)


def _hf_attention(model: nn.Module) -> str | None:
    found = hf_model(model)
    return None if found is None else found.config._attn_implementation


class _SawSdpa(BaseException):  # noqa: N818 - a signal, not an error
    """Raised by ``_calls_sdpa``'s spy at the first ``scaled_dot_product_attention`` call (a
    ``BaseException``: a forward's own ``except Exception`` fallback must not swallow it)."""


def _calls_sdpa(model: nn.Module, inputs: Any) -> bool:
    """Whether a forward of ``model`` on ``inputs`` calls ``scaled_dot_product_attention``
    (seen at the Python level, before it picks a kernel; the forward stops there, so a
    transformer's probe runs up to its first attention only); a forward that needs the targets
    or raises counts as not calling it."""
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is sdpa:
                raise _SawSdpa
            return func(*args, **(kwargs or {}))

    try:
        with torch.no_grad(), Spy():
            call_model(model, inputs)
    except _SawSdpa:
        return True
    except Exception:  # noqa: BLE001 - a forward that needs more than its inputs
        return False
    return False


def call_model(model: nn.Module, inputs: Any, *extra: Any) -> Any:
    """``model`` applied to ``inputs`` as the Workload contract says (tensor, tuple, dict)."""
    if isinstance(inputs, Mapping):
        return model(**inputs) if not extra else model(inputs, *extra)
    if isinstance(inputs, tuple | list) and not extra:
        return model(*inputs)
    return model(inputs, *extra)


class TrainModule(nn.Module):
    """A workload's network plus its loss: ``forward(inputs, targets) -> scalar loss``, so the
    training step, DDP, DataParallel and checkpointing treat every workload alike."""

    def __init__(self, net: nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor] | None):
        super().__init__()
        self.net = net
        self.loss_fn = loss_fn

    def forward(self, inputs: Any, targets: Any) -> torch.Tensor:
        if self.loss_fn is None:
            return call_model(self.net, inputs, targets)
        return self.loss_fn(call_model(self.net, inputs), targets)


class Checkpointed(nn.Module):
    """Recompute a block's activations in backward instead of storing them."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        # use_reentrant=False: the supported mode, works with inputs that need no grad.
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def _block_list(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The model's longest ``nn.ModuleList`` or ``nn.Sequential`` of more than one module (its
    repeated layers), or None."""
    containers = [m for m in model.modules()
                  if isinstance(m, nn.ModuleList | nn.Sequential) and len(m) > 1]
    return max(containers, key=len) if containers else None


NO_BLOCKS = ("no nn.ModuleList/nn.Sequential of blocks to checkpoint; give the Workload a "
             "checkpointing function")


def checkpoint_blocks(model: nn.Module) -> None:
    """Activation checkpointing of every block of the model's longest ``nn.ModuleList`` or
    ``nn.Sequential`` (its repeated layers), in place."""
    longest = _block_list(model)
    if longest is None:
        raise WorkloadError(NO_BLOCKS)
    for i, block in enumerate(list(longest)):
        longest[i] = Checkpointed(block)


def build_train_module(workload: Workload, checkpointing: bool = False) -> TrainModule:
    """The workload's model (seed the RNG first), dropout off, optionally checkpointed. A
    ``build_model`` that raises is a one-line ``WorkloadError``."""
    net = _user_call(workload, "build_model()", workload.build_model)
    if not isinstance(net, nn.Module):
        raise WorkloadError(f"workload {workload.name}: build_model() must return an nn.Module; "
                            f"got {type(net).__name__}")
    for module in net.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
    if checkpointing:
        (workload.checkpointing or checkpoint_blocks)(net)
    return TrainModule(net, workload.loss_fn)


_INITIAL: dict[tuple, tuple[TrainModule, torch.Tensor]] = {}
"""The last workload's initial module and the RNG state after its build, by workload and seed."""


def initial_train_module(workload: Workload, seed: int, checkpointing: bool = False
                         ) -> TrainModule:
    """``build_train_module`` after ``torch.manual_seed(seed)``, the random initialisation paid
    once per workload: later calls copy the first build (a CPU deep copy; GPT-2 124M's
    initialisation takes seconds, its copy a fraction of one) and leave the RNG where a fresh
    build would have. One workload is kept (cases run grouped by model); a model that cannot be
    deep-copied is built each time."""
    key = (id(workload), workload.spec, seed)  # resolve() keeps one object per spec and profile
    if key not in _INITIAL:
        _INITIAL.clear()
        torch.manual_seed(seed)
        module = build_train_module(workload)
        state = torch.get_rng_state()
        try:
            _INITIAL[key] = (copy.deepcopy(module), state)
        except Exception:  # noqa: BLE001 - an uncopyable user model: no cache, same result
            if checkpointing:
                (workload.checkpointing or checkpoint_blocks)(module.net)
            return module
    else:
        module = copy.deepcopy(_INITIAL[key][0])
    torch.set_rng_state(_INITIAL[key][1])
    if checkpointing:
        (workload.checkpointing or checkpoint_blocks)(module.net)
    return module


def prime_initial_module(workload: Workload, seed: int) -> None:
    """Make ``initial_train_module``'s copy of ``workload`` at ``seed`` now, if it has none:
    the suite's state, resident before a case measures the memory above what it found."""
    key = (id(workload), workload.spec, seed)
    if key not in _INITIAL and key not in _UNCOPYABLE:
        initial_train_module(workload, seed)
        if key not in _INITIAL:  # built, but cannot be copied: each case builds its own
            _UNCOPYABLE.add(key)


_UNCOPYABLE: set = set()
"""Workloads whose model ``initial_train_module`` could not copy (not primed again)."""


class BatchDataset(Dataset):
    """Samples cut from one large ``make_batch`` batch held in host memory; reading is an index."""

    def __init__(self, workload: Workload, length: int, seed: int):
        self.inputs, self.targets = workload.sample_batch(length, seed)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return (tree_map(lambda t: t[index], self.inputs),
                tree_map(lambda t: t[index], self.targets))


# -- naming a workload ------------------------------------------------------------------------


def parse_overrides(spec: str, text: str) -> dict[str, Any]:
    """``a=1&b=x&c=0.5`` -> {"a": 1, "b": "x", "c": 0.5} (ints, floats, true/false, strings)."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split("&")):
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise WorkloadError(f"workload {spec!r}: override {item!r} is not KEY=VALUE")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def validate(workload: Workload, timeout_s: float | None = None) -> None:
    """One real forward and backward at the smallest batch on the CPU, and ``make_batch`` at
    the largest (``micro_batch``): each batch must be an ``(inputs, targets)`` pair of
    ``n`` samples, the loss a finite scalar tensor that depends on the parameters; otherwise a
    one-line ``WorkloadError``, also when ``build_model``, ``make_batch`` or the forward raises,
    or when it all takes more than ``timeout_s`` (default ``probe_timeout_s()``: something
    blocks)."""
    from gpubench.util.watchdog import time_limit

    name = workload.spec or workload.name
    timeout_s = probe_timeout_s() if timeout_s is None else timeout_s
    with time_limit(timeout_s, f"workload {name}: checking it (build_model, make_batch, one "
                    f"forward) did not finish within {timeout_s or 0:g} s (hung?)",
                    error=WorkloadError):
        loss = _validation_loss(workload, name)
        if workload.micro_batch > max(2, workload.min_batch):
            _checked_batch(workload, name, workload.micro_batch)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        what = type(loss).__name__ if not isinstance(loss, torch.Tensor) else \
            f"a tensor of shape {list(loss.shape)}"
        raise WorkloadError(f"workload {workload.spec or workload.name}: the loss must be a "
                            f"scalar tensor; got {what}")
    if not torch.isfinite(loss):
        raise WorkloadError(f"workload {workload.spec or workload.name}: the loss is not "
                            f"finite ({loss.item()})")
    if not loss.requires_grad:
        raise WorkloadError(f"workload {workload.spec or workload.name}: the loss does not "
                            "depend on any parameter (no gradient)")


def _checked_batch(workload: Workload, name: str, n: int) -> tuple[Any, Any]:
    """``make_batch(n, generator)``, checked against the contract: a pair ``(inputs,
    targets)`` whose tensors hold ``n`` samples (the first dimension of at least one)."""
    batch = workload.sample_batch(n)
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        got = (f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (tuple, list))
               else f"a tensor of shape {list(batch.shape)}" if isinstance(batch, torch.Tensor)
               else type(batch).__name__)
        raise WorkloadError(f"workload {name}: make_batch({n}, generator) must return a pair "
                            f"(inputs, targets); got {got}")
    tensors = [t for t in tree_flatten(list(batch))[0] if isinstance(t, torch.Tensor)]
    firsts = sorted({t.shape[0] for t in tensors if t.dim() > 0})
    if tensors and firsts and n not in firsts:
        raise WorkloadError(f"workload {name}: make_batch({n}, generator) must return {n} "
                            f"samples; its tensors' first dimensions are "
                            f"{', '.join(map(str, firsts))} (does it ignore n?)")
    return batch[0], batch[1]


def _validation_loss(workload: Workload, name: str) -> Any:
    torch.manual_seed(0)
    module = build_train_module(workload)
    inputs, targets = _checked_batch(workload, name, max(2, workload.min_batch))
    try:
        return module(inputs, targets)
    except Exception as err:  # noqa: BLE001
        from gpubench.util.watchdog import is_time_limit

        if is_time_limit(err):
            raise
        raise WorkloadError(f"workload {name}: forward on a batch from make_batch raised "
                            f"{type(err).__name__}: {err}") from None
