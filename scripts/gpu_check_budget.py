"""The CPU-side work of each step of ``scripts/gpu_check.sh``, run here at the gpu-small shapes
and printed against the step's budget (docs/gpu.md quotes its output).

What a step of the check does on the host, apart from the device's own work: setup's
bookkeeping (no torch); the peaks step's torch import; each ``gpubench run`` step's imports
(torch, torchvision, transformers, gpubench's CLI), its case enumeration and, per model it
validates, the probe build and a build at the real shape (what the suite does on the CPU before
the model moves to the GPU) and a batch made by ``make_batch``. A model's facts (its probe build)
are kept on disk for the run (``gpubench.workloads.factcache``): the first step that meets a
model pays its probe build and the case enumeration's, the later ones read the facts (both
measured, in an empty cache folder of the script's own, then with it filled); the loader step's JPEG
generation (measured on a slice and scaled to its 4,096 images over the GPU host's 16 cores).
Each part runs in a fresh interpreter, as on the GPU machine. A part whose CPU work alone exceeds
its step's budget would lose that step; the device work comes on top (the budget arithmetic in
the script's header).

    python scripts/gpu_check_budget.py [--json FILE]

Timings here are of a shared 2-core machine: an upper bound for the GPU host's CPU side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = dict(re.findall(r"\[(\w+)\]=(\d+)", re.search(
    r"if \[\[ \$MODE == gpu \]\]; then\s+BUDGET=\(([^)]*)\)",
    (ROOT / "scripts" / "gpu_check.sh").read_text()).group(1)))
"""The GPU budgets, read from the script itself (one home)."""

IMPORTS = "import torch, torchvision, transformers, gpubench.cli.main"
MODELS = {"headline": ("resnet50", "bert", "gpt2"), "more": ("resnet50", "gpt2"),
          "loader": ("resnet50",), "claims": ("bert",)}
JPEG_SLICE, JPEG_COUNT, GPU_HOST_CORES = 64, 4096, 16


CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_budget.cache.{os.getpid()}"
"""The parts' facts cache (``GPUBENCH_CACHE_DIR``), empty when the script starts."""


def timed(code: str, *args: str) -> tuple[float, str]:
    """Wall seconds of ``python -c code`` in a fresh interpreter, and its last output line."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                         "GPUBENCH_CACHE_DIR": str(CACHE)}, timeout=1200)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"part failed: {code[:80]}...\n{done.stderr[-2000:]}")
    return seconds, (done.stdout.strip().splitlines() or [""])[-1]


def model_part(model: str) -> str:
    """The workload's facts (a probe build, or a read where they are cached), a build at the
    gpu-small shape, a batch."""
    return (f"{IMPORTS}\nimport time\nfrom gpubench.train.config import RunConfig\n"
            f"w = RunConfig(model={model!r}, profile='gpu-small', device='cuda').workload\n"
            "t = time.perf_counter(); w.facts; probe = time.perf_counter() - t\n"
            "t = time.perf_counter(); import torch; torch.manual_seed(0); w.build_model()\n"
            "build = time.perf_counter() - t\n"
            "t = time.perf_counter(); w.sample_batch(w.micro_batch)\n"
            "batch = time.perf_counter() - t\n"
            "print(f'{probe:.2f} {build:.2f} {batch:.2f}')\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    rows: list[tuple[str, str, float]] = []
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_budget.{os.getpid()}"
    tool = str(ROOT / "scripts" / "gpu_check_tool.py")
    s, _ = timed("import runpy, sys; sys.argv = ['t', 'setup', sys.argv[1], 'gpu']\n"
                 f"runpy.run_path({tool!r}, run_name='__main__')", str(work))
    rows.append(("setup", "bookkeeping, package metadata, selections (no torch)", s))
    s, _ = timed("import torch")
    rows.append(("peaks", "torch import (CUDA init and the peaks are device work)", s))
    s, _ = timed(IMPORTS)
    imports = s
    enumerate_code = (f"{IMPORTS}\nfrom gpubench.suite.cases import profile_cases\n"
                      "print(len(profile_cases('gpu-small', 'cuda', "
                      "('resnet50', 'bert', 'gpt2'))))")
    s, _ = timed(enumerate_code)  # the first step's: every model's probe build
    enumerate_s = {"first": s - imports}
    s, _ = timed(enumerate_code)  # a later step's: the facts read from the cache
    enumerate_s["later"] = s - imports
    per_model, builds = {}, {}
    for model in ("resnet50", "bert", "gpt2"):
        s, line = timed(model_part(model))  # facts cached by the enumeration: a read
        read, build, batch = map(float, line.split())
        per_model[model] = read
        builds[model] = build + batch
        rows.append((f"({model})", f"facts read {read:.2f} s, build at gpu-small {build:.1f} "
                     f"s, a batch {batch:.1f} s", read + build + batch))
    seen: set[str] = set()
    for step, models in MODELS.items():
        cases = {"headline": 8, "more": 5, "loader": 2, "claims": 2}[step]
        when = "later" if seen else "first"
        # The probe builds happen once per model and run (in the first step's case lists);
        # each case builds its model once more (the first initialises it, later ones copy).
        facts_s = sum(per_model[m] for m in models)
        work_s = imports + enumerate_s[when] + facts_s + sum(builds[m] for m in models) \
            + cases * max(builds[m] for m in models) / 3
        what = (f"imports {imports:.1f} s + case lists {enumerate_s[when]:.1f} s ("
                f"{'probe builds' if when == 'first' else 'facts read from the cache'}) + "
                f"{'/'.join(models)} validated + {cases} case builds")
        seen.update(models)
        if step == "loader":
            code = ("import sys, tempfile, time\nfrom pathlib import Path\n"
                    "from gpubench.workloads.datasets import _generate_images\n"
                    "d = Path(tempfile.mkdtemp()); t = time.perf_counter()\n"
                    f"_generate_images(d, 'images-jpeg', {JPEG_SLICE}, 384, 1000, 0, 1)\n"
                    "print(time.perf_counter() - t)\n")
            _, line = timed(code)
            jpeg = float(line) * JPEG_COUNT / JPEG_SLICE / GPU_HOST_CORES
            work_s += jpeg
            what += (f" + {JPEG_COUNT:,} JPEGs {jpeg:.1f} s ({JPEG_SLICE} on one core, scaled "
                     f"to {GPU_HOST_CORES} cores)")
        rows.append((step, what, work_s))
    rows.append(("transfer", "pytest start, no model (the copies are device work)", imports))
    print("| step | budget (s) | CPU-side work here (s) | share | what |")
    print("|---|---:|---:|---:|---|")
    out = []
    for step, what, seconds in rows:
        budget = BUDGETS.get(step)
        share = f"{seconds / int(budget):.0%}" if budget else "-"
        print(f"| {step} | {budget or '-'} | {seconds:.1f} | {share} | {what} |")
        out.append({"step": step, "budget_s": budget and int(budget), "cpu_s": seconds,
                    "what": what})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    shutil.rmtree(CACHE, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
