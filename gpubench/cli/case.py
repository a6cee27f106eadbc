"""``gpubench case``: one command-line flag per ``RunConfig`` / ``LoaderConfig`` field (a declared
technique's flag from its kind and choices), with the field's documentation as its help text, so
any single configuration can be run by hand."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from gpubench.train.config import DEVICES, PROFILES, LoaderConfig, RunConfig, field_docs
from gpubench.train.techniques import BY_FIELD
from gpubench.util.argtypes import non_negative_int, positive_int

TARGET_CHOICES = {"profile": ("auto", *PROFILES), "device": ("auto", *DEVICES)}


def _add(parser: argparse.ArgumentParser, f, doc: str) -> None:
    flag = "--" + f.name.replace("_", "-")
    default = f.default if f.default is not MISSING else None
    help_text = doc.replace("%", "%%")
    technique = BY_FIELD.get(f.name)
    kind = technique.kind if technique else None
    if f.name in TARGET_CHOICES:
        parser.add_argument(flag, default="auto", choices=TARGET_CHOICES[f.name],
                            help=help_text + " (default: auto)")
    elif kind == "bool":
        parser.add_argument(flag, default=default, action=argparse.BooleanOptionalAction,
                            help=help_text)
    elif kind == "choice":
        parser.add_argument(flag, default=default, choices=technique.choices,
                            help=f"{help_text} (default: {default})")
    elif kind == "count0" or f.name == "seed":
        parser.add_argument(flag, type=non_negative_int, default=default,
                            help=f"{help_text} (default: {default})")
    elif kind == "count":
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
