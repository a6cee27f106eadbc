"""Every technique a case can turn on, declared once.

A technique is a field of ``RunConfig`` (or of its ``LoaderConfig``: how batches are loaded) whose
default is "off". Its declaration here says what the rest of the suite derives from it:

- how a value is checked (``kind``, ``choices``), with the one-line error naming the valid ones;
- its part of the case id (``tag``: shown where the value differs from the default);
- whether it changes the ops a step runs or the tensors autograd saves (``counted``: where it does
  not, a case reuses the FLOP and activation count of a case that differs only in it);
- why it does nothing on the CPU (``inert_on_cpu``), flagged in records and the advice;
- whether finding a case by configuration matches it against the baseline's value (``matched``);
- the type of its record column (from ``kind``).

Its object (what the value becomes) lives in ``gpubench.train.build``; its cases in
``gpubench.suite.cases``; the claim it answers, if any, in ``gpubench.suite.claims``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("bool", "choice", "count", "count0", "name")
"""``bool``: True or False; ``choice``: one of ``choices``; ``count``: a positive integer (or
None where the default is None); ``count0``: an integer >= 0; ``name``: a non-empty string."""


@dataclass(frozen=True)
class Technique:
    field: str
    """The ``RunConfig`` field (``loader``: a ``LoaderConfig`` field)."""
    kind: str
    choices: tuple = ()
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

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
OPTIMIZERS = ("sgd", "adam", "adamw")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
PARALLELS = ("single", "dp", "ddp", "fsdp", "model", "pipeline")
SCHEDULES = ("gpipe", "1f1b")

TECHNIQUES: tuple[Technique, ...] = (
    # In case-id order.
    Technique("precision", "choice", PRECISIONS, tag=lambda v, c: v, tag_doc="the value, always",
              count_as=lambda v: "fp32" if v == "tf32" else v,
              inert_on_cpu=lambda v: "tf32 (TF32 exists only on CUDA: identical to fp32)"
              if isinstance(v, str) and v == "tf32" else None),
    Technique("accum_steps", "count", tag="accum{}"),
    Technique("micro_batch", "count", tag="mb{}", matched=False),
    Technique("optimizer", "choice", OPTIMIZERS, tag=_optimizer_tag, counted=False,
              tag_doc="{optimizer}_{optimizer_impl}, the impl left out when default"),
    Technique("optimizer_impl", "choice", OPTIMIZER_IMPLS, counted=False),
    Technique("zero_grad_set_to_none", "bool", tag="zerofill", counted=False),
    Technique("empty_cache", "bool", tag="emptycache", counted=False,
              inert_on_cpu=lambda v: "empty_cache (the CPU allocator keeps no cache)"
              if v is True else None),
    Technique("expandable_segments", "bool", tag="expseg", counted=False),
    Technique("checkpointing", "bool", tag="ckpt"),
    Technique("channels_last", "bool", tag="cl"),
    Technique("compile", "bool", tag="compile"),
    Technique("parallel", "choice", PARALLELS,
              tag=lambda v, c: None if v == "single" else f"{v}{c.world_size}",
              tag_doc="{parallel}{world_size}"),
    Technique("world_size", "count", matched=False),
    Technique("ddp_no_sync", "bool", tag="nosync"),
    Technique("fsdp_mixed_precision", "bool", tag="mp"),
    Technique("chunks", "count", tag="chunks{}", matched=False),
    Technique("schedule", "choice", SCHEDULES, tag="{}", matched=False),
    # How batches reach the step (LoaderConfig).
    Technique("dataset", "name", tag="{}", loader=True),
    Technique("dataset_size", "count", tag="n{}", matched=False, loader=True),
    Technique("cached", "bool", tag=_cached_tag, counted=False, loader=True,
              tag_doc="cached, or cached{cache_items} with a bound"),
    Technique("cache_items", "count", counted=False, matched=False, loader=True),
    Technique("num_workers", "count0", tag="w{}", counted=False, loader=True),
    Technique("pin_memory", "bool", tag="pin", counted=False, loader=True,
              inert_on_cpu=lambda v: f"pin_memory ({_NO_ACCELERATOR})" if v is True else None),
    Technique("prefetch_factor", "count", tag="pf{}", counted=False, loader=True),
    Technique("persistent_workers", "bool", tag="persist", counted=False, loader=True),
    Technique("non_blocking", "bool", tag="nb", counted=False, loader=True,
              inert_on_cpu=lambda v: f"non_blocking ({_NO_ACCELERATOR})" if v is True else None),
    Technique("cold", "bool", tag="cold", counted=False, loader=True),
)
"""Every technique, run-level first, in the order their parts appear in case ids."""

BY_FIELD = {t.field: t for t in TECHNIQUES}


def column_type(technique: Technique) -> tuple[str, str]:
    """The record column type of a technique's field, as ``gpubench.analysis.results`` checks
    it: (type, range)."""
    return {"bool": ("bool", "any"), "choice": ("str", "any"), "name": ("str", "any"),
            "count": ("int", ">=1"), "count0": ("int", ">=0")}[technique.kind]
