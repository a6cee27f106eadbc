"""``gpubench memory``: the OOM frontier per technique, the leak check of the classic leaky
loops, the memory hygiene of the training loop (``no_grad``, ``del``:
``gpubench.diagnostics.hygiene``), the
allocator's figures, and the verdicts on the memory claims these answer, for one model on this
machine. ``memory.json`` holds the figures; ``gpubench advise --memory`` judges them beside a
run's results."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from gpubench.cli.failure import finished_kept
from gpubench.cli.options import add_target_arguments, resolve_target
from gpubench.suite.cases import baseline
from gpubench.train.config import RunConfig
from gpubench.train.techniques import variants
from gpubench.util import atomic
from gpubench.util.argtypes import BYTE_SIZE_HELP, byte_size, name_list, positive_int

TECHNIQUES = {"fp32": {}, **{name: dict(v.changes) for name, v in variants("frontier").items()}}
"""Technique sets the frontier can compare, by name: the FP32 baseline and every variant the
techniques declare for it (``Technique.variants``; ``emptycache``: ``torch.cuda.empty_cache()``
after every step, against ``fp32`` the claim that it avoids running out of memory)."""

FRONTIER_COLUMNS = ("technique", "largest micro-batch that fits", "tries")
LEAK_COLUMNS = ("loop", "growth per step (MiB)", "verdict")
HYGIENE_COLUMNS = ("loop", "saved for backward (MiB)", "held at once (MiB)", "kept (MiB)",
                   "CUDA peak (MiB)")
VERDICT_COLUMNS = ("claim", "measured", "verdict", "why")

MAX_BATCH = {"cuda": 65536, "cpu": 1024}
"""Default upper limit of the frontier search per device: on CUDA large enough that a small
model on a 141 GB H200 meets the device's limit before the search's (the search doubles, so
the limit costs a few tries, not a sweep)."""


def technique_config(base: RunConfig, name: str) -> RunConfig:
    if name not in TECHNIQUES:
        raise ValueError(f"technique must be one of {', '.join(TECHNIQUES)}; got {name!r}")
    return base.with_(**TECHNIQUES[name])


def hygiene_reports(models: dict[str, str], profile: str, device: str) -> list[dict]:
    """``gpubench run``'s memory reports: the loop-hygiene measurements (``no_grad``, ``del``:
    ``gpubench.diagnostics.hygiene``, seconds per model) of each model (name -> workload spec),
    with no frontier (``gpubench memory`` searches it). A model whose measurement fails is left out
    with a one-line warning."""
    from gpubench.diagnostics.hygiene import measure

    reports = []
    for name, spec in models.items():
        try:
            hygiene = measure(spec, profile, device)
        except Exception as err:  # noqa: BLE001 - the run's results must still be written
            print(f"gpubench: warning: no_grad/del measurement of {name} failed: "
                  f"{type(err).__name__}: {err}".splitlines()[0], file=sys.stderr)
            continue
        reports.append({"model": name, "workload": spec, "profile": profile, "device": device,
                        "budget_bytes": None, "frontier": [], "leaks": [], "hygiene": hygiene,
                        "allocator": None})
    return reports


HYGIENE_FILE = ".hygiene.json"
"""Where a run's pytest child writes its no_grad / del measurements (``--gpubench-hygiene``)."""


def run_hygiene(models: dict[str, str], out: Path, profile: str, device: str) -> list[dict]:
    """The run's no_grad / del reports of ``models`` (name -> workload spec): those its pytest
    child measured after its cases (``HYGIENE_FILE`` in ``out``, taken out), and what it did
    not measure (a child stopped early, the cases a resumed run kept from before) measured
    here."""
    path = out / HYGIENE_FILE
    try:
        child = json.loads(path.read_text())
    except (OSError, ValueError):
        child = []
    path.unlink(missing_ok=True)
    reports = [r for r in child if isinstance(r, dict) and r.get("model") in models] \
        if isinstance(child, list) else []
    missing = {m: spec for m, spec in models.items() if m not in {r["model"] for r in reports}}
    return reports + (hygiene_reports(missing, profile, device) if missing else [])


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f}"


def add_memory_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, model=True)
    p.add_argument("--techniques", default="fp32,bf16,bf16+ckpt",
                   type=name_list(TECHNIQUES, joined=True),
                   help=f"comma-separated, from {', '.join(TECHNIQUES)}")
    p.add_argument("--budget", type=byte_size,
                   help="memory budget standing in for the device on the CPU (process peak), "
                   "e.g. 2G; on CUDA the device is the limit; " + BYTE_SIZE_HELP)
    p.add_argument("--max-batch", type=positive_int, default=None,
                   help="upper limit of the search (default: "
                   f"{MAX_BATCH['cuda']} on CUDA, enough for a 141 GB H200, "
                   f"{MAX_BATCH['cpu']} on the CPU)")
    p.add_argument("--no-leaks", action="store_true", help="skip the leak check")
    p.add_argument("--no-hygiene", action="store_true",
                   help="skip the no_grad / del measurements of the training loop")
    p.add_argument("--snapshot", metavar="PATH",
                   help="CUDA only: write a memory snapshot (pickle for "
                   "https://pytorch.org/memory_viz) of the first technique's first "
                   "out-of-memory try and one step at its largest micro-batch")
    p.add_argument("--out", help="folder for memory.json and memory.md")


def memory_main(args: argparse.Namespace) -> int:
    from gpubench.util.argtypes import parse_bytes
    from gpubench.util.tables import markdown_table  # pandas

    device, profile = resolve_target(args.device, args.profile)
    if getattr(args, "snapshot", None) and device != "cuda":
        from gpubench.diagnostics.snapshot import CPU_MESSAGE

        raise ValueError(CPU_MESSAGE)  # one line, exit 2, before anything runs
    budget = parse_bytes(args.budget) if args.budget else None
    max_batch = args.max_batch or MAX_BATCH[device]
    base = baseline(args.model, profile, device)
    names = [t for t in args.techniques.split(",") if t]
    configs = [technique_config(base, t) for t in names]
    lines = [f"# gpubench memory: {base.name} ({profile}, {device})", "",
             "## OOM frontier", ""]
    report = {"model": base.name, "workload": args.model, "profile": profile, "device": device,
              "budget_bytes": budget, "frontier": [], "leaks": [], "hygiene": None,
              "allocator": None}
    frontier_rows = []

    def keep(err: BaseException) -> list[Path]:  # Ctrl-C: the techniques searched so far
        if not (args.out and report["frontier"]):
            return []
        searched = [f["technique"] for f in report["frontier"]]
        why = "SIGINT" if isinstance(err, KeyboardInterrupt) else str(err.args[0])
        partial = {**report, "interrupted": why}
        text = "\n".join([*lines[:4], markdown_table(frontier_rows, ["left", "right", "right"],
                                                     FRONTIER_COLUMNS), "",
                          f"Interrupted ({why}) after the frontier of {', '.join(searched)}; "
                          "memory.json holds what finished."]) + "\n"
        folder = Path(args.out)
        atomic.write_text(folder / "memory.md", text)
        atomic.write_json(folder / "memory.json", partial, indent=1)
        return [folder / "memory.md", folder / "memory.json"]

    with finished_kept("memory", keep):
        _measure(args, report, lines, frontier_rows, names, configs, budget, max_batch, base,
                 device, profile)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic.write_text(Path(args.out) / "memory.md", text)
        atomic.write_json(Path(args.out) / "memory.json", report, indent=1)
    return 0


def _measure(args, report: dict, lines: list[str], frontier_rows: list[dict], names, configs,
             budget, max_batch: int, base: RunConfig, device: str, profile: str) -> None:
    """``memory_main``'s measurements, into ``report``, ``lines`` (memory.md) and
    ``frontier_rows`` as each finishes."""
    import torch

    from gpubench.diagnostics.frontier import find_frontier
    from gpubench.diagnostics.leaks import allocator_stats, check_loops
    from gpubench.train.build import build
    from gpubench.util.tables import markdown_table

    snapshot_line = None
    for name, cfg in zip(names, configs, strict=True):
        print(f"gpubench memory: searching the frontier of {cfg.id} ...", flush=True)
        if getattr(args, "snapshot", None) and cfg is configs[0]:
            from gpubench.diagnostics.snapshot import frontier_with_snapshot

            frontier, snapshot_line = frontier_with_snapshot(cfg, budget, max_batch,
                                                             args.snapshot)
            report["snapshot"] = str(args.snapshot)
        else:
            frontier = find_frontier(cfg, budget, limit=max_batch)
        capped = f" (search limit {max_batch})" if frontier.capped else ""
        frontier_rows.append({"technique": cfg.id,
                              "largest micro-batch that fits": f"{frontier.max_batch}{capped}",
                              "tries": len(frontier.tries)})
        report["frontier"].append({"technique": name, **asdict(frontier)})
    lines.append(markdown_table(frontier_rows, ["left", "right", "right"], FRONTIER_COLUMNS))
    if snapshot_line:
        lines += ["", snapshot_line]
    if not args.no_leaks:
        lines += ["", "## Leak check (classic leaky loops and their fixes)", ""]
        leak_rows = []
        # On the CPU the budget stands in for the device: a leaky loop stops when above it.
        leak_budget = budget if device == "cpu" else None
        for r in check_loops(lambda: build(base), budget_bytes=leak_budget):
            leak_rows.append({"loop": r.name,
                              "growth per step (MiB)": f"{r.growth_bytes_per_step / 2**20:.2f}",
                              "verdict": r.verdict})
            report["leaks"].append({**asdict(r), "leaks": r.leaks,
                                    "out_of_memory": r.out_of_memory})
        lines.append(markdown_table(leak_rows, ["left", "right", "left"], LEAK_COLUMNS))
    if not getattr(args, "no_hygiene", False):
        from gpubench.diagnostics.hygiene import measure as measure_hygiene

        print("gpubench memory: measuring no_grad and del ...", flush=True)
        hygiene = measure_hygiene(args.model, profile, device)
        report["hygiene"] = hygiene
        lines += ["", f"## Memory hygiene of the loop ({hygiene['micro_batch']} samples; "
                  "exact saved bytes, CUDA allocator peak)", ""]
        rows = []
        for group, sides in (("evaluation", ("grad", "no_grad", "inference_mode")),
                             ("kept_graph", ("kept", "deleted")),
                             ("kept_outputs", ("kept", "deleted"))):
            for side in sides:
                m = hygiene[group][side]
                rows.append({"loop": m["name"],
                             "saved for backward (MiB)": _mib(m["saved_bytes"]),
                             "held at once (MiB)": _mib(m["held_saved_bytes"]),
                             "kept (MiB)": _mib(m["kept_bytes"]),
                             "CUDA peak (MiB)": _mib(m["peak_bytes"])})
        lines.append(markdown_table(rows, ["left", "right", "right", "right", "right"],
                                    HYGIENE_COLUMNS))
    from gpubench.analysis.advice import memory_verdicts

    verdict_rows = [{"claim": v.claim, "measured": v.measured, "verdict": f"**{v.verdict}**",
                     "why": v.why} for v in memory_verdicts(report)]
    lines += ["", "## Verdicts on the memory claims", "",
              markdown_table(verdict_rows, columns=VERDICT_COLUMNS)]
    stats = allocator_stats(torch.device(device))
    report["allocator"] = stats
    lines += ["", "## Allocator", ""]
    if stats["reserved_bytes"] is None:
        lines.append("The CPU allocator keeps no cache: allocated = reserved, nothing to empty.")
    else:
        lines.append(f"allocated {stats['allocated_bytes'] / 2**20:,.1f} MiB, reserved "
                     f"{stats['reserved_bytes'] / 2**20:,.1f} MiB, fragmentation "
                     f"{stats['fragmentation']:.1%}, allocation retries {stats['alloc_retries']}")
