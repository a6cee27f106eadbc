"""The ``gpubench parity`` command line and ``gpubench run --parity``: options, a progress line
on a terminal, and the outputs of ``gpubench.analysis.parity``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpubench.analysis.parity import judge, parity_markdown, write_parity
from gpubench.cli.failure import finished_kept
from gpubench.cli.options import add_target_arguments, resolve_target
from gpubench.diagnostics.parity import DEFAULT_STEPS, TECHNIQUES


def _progress_bar():
    """A live tqdm line on stderr where that is a terminal (logs and pipes get none), or None."""
    from gpubench.util.progress import is_terminal

    if not is_terminal(sys.stderr):
        return None
    from tqdm import tqdm

    return tqdm(total=0, file=sys.stderr, leave=False, unit="step", dynamic_ncols=True)


def run_parity_for(specs, profile: str, device: str, out: Path, chart: bool = True,
                   steps: int | None = None, techniques: list[str] | None = None
                   ) -> list[Path]:
    """``gpubench run --parity``: the default techniques of every model in ``specs`` (workload
    specs; anything else, such as a record without a model, is passed over), into ``out``
    (``write_parity``: a list, empty when no model could be trained), a progress line per model
    on a terminal. A model whose training fails is left out with a one-line warning, so that
    the run's other results are still written."""
    import warnings

    from gpubench.diagnostics.parity import run_parity
    from gpubench.launchers.workers import WorkerError

    reports = []
    for spec in dict.fromkeys(s for s in specs if isinstance(s, str) and s):
        print(f"gpubench: convergence parity of {spec} ...", flush=True)
        bar = _progress_bar()
        try:
            reports.append(judge(run_parity(spec, profile, device, techniques, steps,
                                            progress=bar)))
        except (ValueError, RuntimeError, WorkerError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"convergence parity of {spec} failed: {type(err).__name__}: "
                          f"{first}", stacklevel=2)
        finally:
            if bar is not None:
                bar.close()
    return write_parity(reports, out, chart)


def add_parity_arguments(p: argparse.ArgumentParser) -> None:
    from gpubench.util.argtypes import name_list, non_negative_int, positive, positive_int

    add_target_arguments(p, model=True)
    p.add_argument("--techniques", type=name_list(TECHNIQUES), default=None,
                   help=f"comma-separated, from {', '.join(TECHNIQUES)}; fp32 (the reference) "
                   "is always trained (default: all; on a CPU that emulates fp16, all but fp16)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="optimizer steps per technique (default: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()) + ")")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the initial weights and the data (default 0)")
    p.add_argument("--timeout", type=positive, default=300.0,
                   help="seconds a DDP rank may take per command (default 300)")
    p.add_argument("--threads", type=non_negative_int, default=0,
                   help="torch.set_num_threads for the techniques trained in this process "
                   "(default, or 0: torch's choice; DDP ranks split the cores)")
    p.add_argument("--no-chart", action="store_true", help="skip parity.png/.svg")
    p.add_argument("--out", help="folder for parity.json, parity.md and the chart "
                   "(default: results/parity-<model>-<profile>)")


def parity_main(args: argparse.Namespace) -> int:
    from gpubench.diagnostics.parity import run_parity
    from gpubench.workloads.registry import checked

    device, profile = resolve_target(args.device, args.profile)
    workload = checked(args.model, profile)  # a bad spec: one line, exit 2, nothing trained
    out = Path(args.out or f"results/parity-{workload.name}-{profile}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    steps = args.steps or DEFAULT_STEPS[profile]
    print(f"gpubench parity: {workload.name} ({profile}, {device}), {steps} steps per "
          "technique ...", flush=True)
    bar = _progress_bar()

    def keep(err: BaseException) -> list[Path]:  # Ctrl-C: the techniques that finished
        partial = getattr(err, "partial", None)
        if bar is not None:
            bar.close()
        return [] if partial is None else write_parity(judge(partial), out,
                                                       chart=not args.no_chart)

    try:
        with finished_kept("parity", keep):
            report = run_parity(args.model, profile, device, args.techniques, steps,
                                args.seed, args.timeout, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    report = judge(report)
    written = write_parity(report, out, chart=not args.no_chart)
    print(parity_markdown(report))
    print("gpubench parity: wrote " + ", ".join(str(p) for p in written))
    return 0
