"""The ``gpubench tune`` command line: options, progress, and the outputs of
``gpubench.diagnostics.tune`` (``tune.md``, ``tune.json``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpubench.cli.options import add_target_arguments, resolve_target
from gpubench.train.techniques import SEARCH_DIMENSIONS as DIMENSIONS


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    from gpubench.util.argtypes import (
        BYTE_SIZE_HELP,
        byte_size,
        name_list,
        positive,
        positive_int,
    )

    add_target_arguments(p, model=True)
    p.add_argument("--global-batch", type=positive_int, default=None,
                   help="samples per optimizer step, kept by every configuration (default: the "
                   "profile's batch)")
    p.add_argument("--budget", type=byte_size, default=None,
                   help="the memory a configuration may use: " + BYTE_SIZE_HELP + " (default: "
                   "the GPU's memory on CUDA, none on the CPU)")
    p.add_argument("--time", type=positive, default=None, metavar="MINUTES",
                   help="stop searching after this many minutes and confirm the best found")
    p.add_argument("--techniques", type=name_list(DIMENSIONS), default=DIMENSIONS[:-1],
                   help=f"the techniques combined, comma-separated from {', '.join(DIMENSIONS)} "
                   "(default: all but compile, which --compile adds)")
    p.add_argument("--compile", action="store_true",
                   help="add torch.compile to the space (minutes of compilation per try)")
    p.add_argument("--out", default=None,
                   help="folder of tune.md and tune.json (default: results/tune-<model>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the tune stopped in --out, reusing what it measured")


def tune_main(args: argparse.Namespace) -> int:
    from gpubench.diagnostics.tune import TuneError, Tuner, case_command, write_tune

    device, profile = resolve_target(args.device, args.profile)
    dims = tuple(args.techniques)
    if args.compile and "compile" not in dims:
        dims += ("compile",)
    name = args.model.split("?")[0].replace("/", "-").replace(":", "-").replace(".py", "")
    out = Path(args.out) if args.out else Path("results") / f"tune-{name}"
    try:
        tuner = Tuner(args.model, profile, device, out, global_batch=args.global_batch,
                      budget_bytes=args.budget, time_s=None if args.time is None
                      else args.time * 60, dims=dims, compile_="compile" in dims,
                      resume=args.resume, progress=lambda line: print(line, flush=True))
        result = tuner.run()
    except TuneError as err:
        print(f"gpubench tune: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gpubench tune: interrupted; what was measured is in {out}/tune.json: the same "
              "command with --resume continues it", file=sys.stderr)
        return 130
    path = write_tune(result, out)
    w = result.winner
    print(f"gpubench tune: winner {w['case_id']} "
          + (f"{w['speedup']:.2f}x [{w['low']:.2f}-{w['high']:.2f}]"
             if w["case_id"] != result.baseline else f"(the baseline: {w.get('why', '')})")
          + f"; {result.measured_s:.0f} s measured")
    print(f"gpubench tune: re-measure it with: {case_command(result)}")
    print(f"gpubench tune: wrote {path} and {out / 'tune.json'}")
    return 0
