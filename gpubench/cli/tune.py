"""The ``gpubench tune`` command line: options, progress, and the outputs of
``gpubench.diagnostics.tune`` (``tune.md``, ``tune.json``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpubench.cli.compare import PRICE_HELP, price_per_hour
from gpubench.cli.options import add_target_arguments, resolve_target
from gpubench.train.techniques import DEFAULT_SEARCH
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
    p.add_argument("--techniques", type=name_list(DIMENSIONS), default=DEFAULT_SEARCH,
                   help=f"the techniques combined, comma-separated from {', '.join(DIMENSIONS)} "
                   f"(default: {', '.join(DEFAULT_SEARCH)}; --compile adds compile)")
    p.add_argument("--compile", action="store_true",
                   help="add torch.compile to the space (minutes of compilation per try)")
    p.add_argument("--out", default=None,
                   help="folder of tune.md and tune.json (default: results/<profile>/tune-<model>, "
                   "where the report of a gpubench run of that profile shows its winner first)")
    p.add_argument("--parity", action="store_true",
                   help="then train the winner and FP32 for --parity-steps steps from the same "
                   "weights on the same data and compare their loss curves (parity.json, "
                   "parity.png, a section of tune.md)")
    p.add_argument("--parity-steps", type=positive_int, default=None, metavar="N",
                   help="optimizer steps of --parity (default: the profile's parity steps)")
    p.add_argument("--resume", action="store_true",
                   help="continue the tune stopped in --out, reusing what it measured")
    p.add_argument("--price-per-hour", type=price_per_hour, metavar="PRICE",
                   help=PRICE_HELP + " of each confirmed configuration and the baseline, to "
                   "tune.md's finalists and tune.json (the tune uses one device: a per-GPU "
                   "price counts one GPU)")


def tune_main(args: argparse.Namespace) -> int:
    from gpubench.diagnostics.tune import TuneError, Tuner, case_command, write_tune

    device, profile = resolve_target(args.device, args.profile)
    dims = tuple(args.techniques)
    if args.compile and "compile" not in dims:
        dims += ("compile",)
    name = args.model.split("?")[0].replace("/", "-").replace(":", "-").replace(".py", "")
    out = Path(args.out) if args.out else Path("results") / profile / f"tune-{name}"
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
        if (out / "tune.json").is_file():
            print(f"gpubench tune: interrupted (SIGINT); what was measured is in "
                  f"{out}/tune.json: the same command with --resume continues it",
                  file=sys.stderr)
        else:
            print("gpubench tune: interrupted (SIGINT) before the first measurement; no "
                  "tune.json was written: run the same command again (without --resume)",
                  file=sys.stderr)
        return 130
    w = result.winner
    cost = None
    if args.price_per_hour is not None:
        from gpubench.analysis.cost import tune_cost

        cost = tune_cost(result, args.price_per_hour)
        _keep_result(out, "cost", cost)
    path = write_tune(result, out, cost=cost)  # now: a parity run may be stopped
    if args.parity:
        try:
            parity = _parity(args, tuner, result, profile, device, out)
        except KeyboardInterrupt:
            print(f"gpubench tune: interrupted during --parity; the tune is in {path}",
                  file=sys.stderr)
            return 130
        path = write_tune(result, out, parity, cost=cost)
    print(f"gpubench tune: winner {w['case_id']} "
          + (f"{w['speedup']:.2f}x [{w['low']:.2f}-{w['high']:.2f}]"
             if w["case_id"] != result.baseline else f"(the baseline: {w.get('why', '')})")
          + f"; {result.measured_s:.0f} s measured")
    if cost is not None:
        figure = cost["cases"].get(w["case_id"], {}).get("cost_per_m_samples")
        print("gpubench tune: the winner costs "
              + ("-" if figure is None else f"{figure:.4g}")
              + f" per million samples at {cost['price']}")
    print(f"gpubench tune: re-measure it with: {case_command(result)}")
    print(f"gpubench tune: wrote {path} and {out / 'tune.json'}")
    return 0


def _parity(args, tuner, result, profile: str, device: str, out: Path) -> str:
    """The winner's convergence parity against FP32 (``gpubench.diagnostics.parity``), written
    into ``out``; its Markdown for ``tune.md`` (a line saying why not, where it is not run)."""
    from gpubench.analysis.parity import judge, parity_markdown, write_parity
    from gpubench.diagnostics.parity import run_parity
    from gpubench.launchers.workers import WorkerError

    if result.winner["case_id"] == result.baseline:
        print("gpubench tune: --parity: the winner is the FP32 baseline; nothing to compare",
              flush=True)
        return "The winner is the FP32 baseline: nothing to compare.\n"
    print(f"gpubench tune: convergence parity of {result.winner['case_id']} against FP32 ...",
          flush=True)
    try:
        report = judge(run_parity(args.model, profile, device, ["fp32"], args.parity_steps,
                                  extra={"tuned": tuner.winner_config},
                                  micro_batch=result.global_batch))
    except (ValueError, RuntimeError, WorkerError) as err:
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"gpubench tune: --parity failed: {line}", file=sys.stderr)
        return f"Not measured: {line}.\n"
    write_parity(report, out)
    tuned = next((r for r in report["techniques"] if r["technique"] == "tuned"), None)
    _keep_result(out, "parity", None if tuned is None else {
        "verdict": str(tuned["verdict"]), "reason": tuned["reason"], "gap": tuned["gap"],
        "steps": report["steps"]})
    if tuned is None:
        why = report.get("left_out", {}).get("tuned", "not trained")
        print(f"gpubench tune: --parity: the winner was not trained: {why}", flush=True)
    else:
        print(f"gpubench tune: parity of the winner: {tuned['verdict']} (final loss "
              f"{tuned['gap']:+.2%} of FP32's initial loss from FP32's)", flush=True)
    return parity_markdown(report).split("\n", 2)[-1] + "\n![parity](parity.png)\n"


def _keep_result(out: Path, key: str, value) -> None:
    """``value`` as ``key`` of ``tune.json``'s result: the winner's parity verdict (the
    report's answer shows it), the cost of the confirmed configurations at a price."""
    import json

    from gpubench.util import atomic

    path = out / "tune.json"
    state = json.loads(path.read_text())
    state.setdefault("result", {})[key] = value
    atomic.write_json(path, state, indent=1)
