"""``gpubench case``: one command-line flag per ``RunConfig`` / ``LoaderConfig`` field, with the
field's documentation as its help text, so any single configuration can be run by hand."""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
from dataclasses import MISSING, fields

from gpubench.train import config
from gpubench.train.config import (
    DEVICES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PARALLELS,
    PRECISIONS,
    PROFILES,
    SCHEDULES,
    LoaderConfig,
    RunConfig,
)
from gpubench.util.argtypes import non_negative_int, positive_int

CHOICES = {
    "profile": ("auto", *PROFILES),
    "device": ("auto", *DEVICES),
    "precision": PRECISIONS,
    "optimizer": OPTIMIZERS,
    "optimizer_impl": OPTIMIZER_IMPLS,
    "parallel": PARALLELS,
    "schedule": SCHEDULES,
}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal under each field)."""
    tree = ast.parse(inspect.getsource(config)) if cls.__module__ == config.__name__ else None
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs, last = {}, None
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            last = item.target.id
        elif (last and isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant)
              and isinstance(item.value.value, str)):
            docs[last] = " ".join(item.value.value.split())
            last = None
        else:
            last = None
    return docs


def _add(parser: argparse.ArgumentParser, f, doc: str) -> None:
    flag = "--" + f.name.replace("_", "-")
    default = f.default if f.default is not MISSING else None
    help_text = doc.replace("%", "%%")
    if f.name in ("profile", "device"):
        parser.add_argument(flag, default="auto", choices=CHOICES[f.name],
                            help=help_text + " (default: auto)")
    elif isinstance(default, bool):
        parser.add_argument(flag, default=default, action=argparse.BooleanOptionalAction,
                            help=help_text)
    elif f.name in CHOICES:
        parser.add_argument(flag, default=default, choices=CHOICES[f.name],
                            help=f"{help_text} (default: {default})")
    elif f.name in ("num_workers", "seed"):
        parser.add_argument(flag, type=non_negative_int, default=default,
                            help=f"{help_text} (default: {default})")
    elif f.type in ("int", "int | None"):
        parser.add_argument(flag, type=positive_int, default=default,
                            help=f"{help_text} (default: {default})")
    else:
        parser.add_argument(flag, default=default, help=f"{help_text} (default: {default})")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (required) and one flag per other field of RunConfig and LoaderConfig."""
    run_docs, loader_docs = field_docs(RunConfig), field_docs(LoaderConfig)
    for f in fields(RunConfig):
        if f.name == "loader":
            continue
        if f.name == "model":
            parser.add_argument("--model", required=True, help=run_docs["model"])
            continue
        _add(parser, f, run_docs.get(f.name, ""))
    group = parser.add_argument_group("data loading (LoaderConfig)")
    for f in fields(LoaderConfig):
        _add(group, f, loader_docs.get(f.name, ""))


def config_from_args(args: argparse.Namespace, *, profile: str, device: str) -> RunConfig:
    """The validated RunConfig the flags describe (``ValueError`` names a bad combination)."""
    loader = LoaderConfig(**{f.name: getattr(args, f.name) for f in fields(LoaderConfig)})
    run = {f.name: getattr(args, f.name) for f in fields(RunConfig)
           if f.name not in ("loader", "profile", "device")}
    return RunConfig(**run, profile=profile, device=device, loader=loader)
