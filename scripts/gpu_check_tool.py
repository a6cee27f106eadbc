"""The Python half of ``scripts/gpu_check.sh``: its bookkeeping and its two small measurement
steps. The shell script sequences the steps and time-boxes each with ``timeout``; this file

- ``setup``: checks that python3 has gpubench's dependencies and can import gpubench from the
  checkout, records their versions, and writes each case step's selection (case ids, checked
  against the profile's case lists, and the ``-k`` expression that picks exactly them);
- ``peaks``: the driver facts (nvidia-smi, ``torch.cuda.init()``) and the measured matmul peak
  per precision (``gpubench.measure.flops.matmul_peak_flops``, the ceilings MFU divides by), written
  after each precision;
- ``reap``: ends whatever a step left running (the processes carrying its marker in their
  environment), so that the next step starts on an idle machine;
- ``status``: one step's status file (what it finished, what failed or was skipped, and why);
- ``publish``: ``gpu_check.md`` and ``gpu_check.json`` (the summary, headline first) and
  ``gpu_check.tar.gz`` (everything the steps wrote) into OUT, each replaced atomically, so a
  kill at any moment leaves the previous step's complete set.

Only ``setup`` and ``peaks`` import torch; the bookkeeping commands start in a fraction of a
second and import nothing but the standard library.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

TARBALL = "gpu_check.tar.gz"
SUMMARY_MD = "gpu_check.md"
SUMMARY_JSON = "gpu_check.json"
TARBALL_LIMIT = 15 * 2**20
"""The tarball stays below this (the machine brings back files of up to 16 MiB): the largest
files are left out, and listed, when everything does not fit."""
MARK_ENV = "GPU_CHECK_STEP"
"""Set for each step's command (inherited by every process it starts): what ``reap`` looks for."""

PUBLISHED = {
    # (model, precision, channels_last): (what, images/s) from Lambda's H200 benchmark table
    # (ResNet-50 training, PyTorch NGC, one GPU), the anchors the measured figures stand beside
    ("resnet50", "tf32", False): ("H200 2,259 img/s (Lambda, TF32)", 2259.0),
    ("resnet50", "bf16", False): ("H200 3,079 img/s (Lambda, AMP)", 3079.0),
    ("resnet50", "bf16", True): ("H200 3,079 img/s (Lambda, AMP)", 3079.0),
}

# -- selections -------------------------------------------------------------------------------

# Each case step of the GPU run: gpubench run's --groups, --models (None: the profile's own,
# whose validation and hygiene measurements it pays for), and the cases, in the order gpubench
# runs them (model by model, then group). "{K}": the loader knobs' worker count on this machine
# (gpubench.suite.cases.knob_workers: 8 on a 16-core, 1-GPU host; ``knob_workers`` below says it
# without importing torch). Setup imports neither torch nor a workload: the ids are checked
# against the profile by the step that runs them (an id gpubench did not collect is said in
# "Not reached") and by tests/test_gpu_check.py on the CPU.
GPU_STEPS = {
    "headline": {"groups": "precision,layout", "models": None, "test": "test_step", "ids": [
        "resnet50-fp32", "resnet50-tf32", "resnet50-bf16", "resnet50-bf16-cl",
        "bert-fp32", "bert-bf16", "gpt2-fp32", "gpt2-bf16"]},
    "more": {"groups": "accumulation,optimizer,memory", "models": "resnet50,gpt2",
             "test": "test_step",
             "ids": ["resnet50-fp32-accum4-mb64", "gpt2-fp32-adamw", "gpt2-fp32-adamw_fused",
                     "gpt2-fp32-ckpt", "gpt2-bf16-ckpt"]},
    "loader": {"groups": "loader", "models": "resnet50", "test": "test_step", "ids": [
        "resnet50-fp32-images-jpeg-w{K}", "resnet50-fp32-images-jpeg-w{K}-pin-nb"]},
    "claims": {"groups": "precision", "models": "bert", "test": "test_claim",
               "ids": ["claim-adamw-bert"]},
}
# The rehearsal on the CPU: the same steps, one smoke-profile resnet18 case each.
REHEARSE_STEPS = {
    "headline": {"groups": "precision,layout", "models": "resnet18", "test": "test_step",
                 "ids": ["resnet18-fp32"]},
    "more": {"groups": "accumulation,optimizer,memory", "models": "resnet18",
             "test": "test_step", "ids": ["resnet18-fp32-ckpt"]},
    "loader": {"groups": "loader", "models": "resnet18", "test": "test_step",
               "ids": ["resnet18-fp32-images-jpeg-w{K}"]},
    "claims": {"groups": "precision", "models": "resnet18", "test": "test_claim",
               "ids": ["claim-adamw-resnet18"]},
}
PROFILE = {"gpu": ("gpu-small", "cuda"), "rehearse": ("smoke", "cpu")}


def exact_k(test: str, ids: list[str]) -> str:
    """The ``-k`` expression selecting exactly ``ids`` of ``test``: each as the whole test name
    ``test[id]`` (pytest's -k matches substrings, and the closing bracket keeps
    ``gpt2-fp32-adamw`` from picking ``gpt2-fp32-adamw_fused``)."""
    if not ids:
        return f"{test} and nothing_selected"
    return " or ".join(f"{test}[{i}]" for i in ids)


def visible_gpus() -> int:
    """CUDA devices this process would see, without importing torch: CUDA_VISIBLE_DEVICES where
    set, else the lines of ``nvidia-smi -L``; 1 when neither says (knob_workers' floor)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return max(1, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    listed = _run(["nvidia-smi", "-L"], timeout=5)
    return max(1, len(re.findall(r"^GPU \d+:", listed, flags=re.M)))


def knob_workers(device: str) -> int:
    """``gpubench.suite.cases.knob_workers`` without torch (the same rule: the cores per GPU,
    2 to 8, on CUDA; 2 at most on the CPU)."""
    cores = os.cpu_count() or 1
    if device != "cuda":
        return min(2, cores)
    return max(2, min(8, cores // visible_gpus()))


def selections(mode: str) -> dict:
    """Each case step's selection: its ids and the ``-k`` picking exactly them (no torch, no
    workload: nothing is built)."""
    profile, device = PROFILE[mode]
    k = knob_workers(device)
    out = {}
    for step, spec in (GPU_STEPS if mode == "gpu" else REHEARSE_STEPS).items():
        ids = [i.replace("{K}", str(k)) for i in spec["ids"]]
        out[step] = {**spec, "profile": profile, "device": device, "ids": ids, "missing": [],
                     "k": exact_k(spec["test"], ids)}
    return out


def cmd_setup(args) -> int:
    """Dependencies, versions, gpubench importable; the selections. Imports neither torch nor
    a workload (the versions come from the packages' metadata), so it builds no model."""
    import importlib.metadata as md
    import importlib.util

    work = Path(args.work)
    folder = work / "setup"
    folder.mkdir(parents=True, exist_ok=True)
    modules = {"torch": "torch", "torchvision": "torchvision", "transformers": "transformers",
               "pytest": "pytest", "pytest_benchmark": "pytest-benchmark", "pandas": "pandas",
               "scipy": "scipy", "seaborn": "seaborn", "matplotlib": "matplotlib",
               "markdown": "markdown", "psutil": "psutil", "tqdm": "tqdm",
               "tabulate": "tabulate", "pynvml": "nvidia-ml-py", "torchao": "torchao"}
    # Not needed by the check's steps: charts and report (--no-charts), NVML telemetry, FP8
    # (torchao: from a wheel carried into vendor/, which gpu_check.sh unpacks onto the path).
    optional = {"seaborn", "matplotlib", "markdown", "pynvml", "tqdm", "psutil", "torchao"}
    info = {"python": sys.version.split()[0], "executable": sys.executable, "versions": {},
            "missing": [], "optional_missing": [], "mode": args.mode}
    for module, dist in modules.items():
        if importlib.util.find_spec(module) is None:
            info["optional_missing" if module in optional else "missing"].append(module)
            continue
        try:
            info["versions"][dist] = md.version(dist)
        except md.PackageNotFoundError:
            info["versions"][dist] = "?"
    info["floors"] = floor_problems(info["versions"])
    problems = [f"missing: {', '.join(info['missing'])}"] if info["missing"] else []
    try:
        import gpubench

        info["gpubench"] = {"version": gpubench.__version__, "from": str(Path(
            gpubench.__file__).resolve().parent)}
        if not problems:
            info["selections"] = selections(args.mode)
    except Exception as err:  # noqa: BLE001 - said in the status, then the run stops
        problems.append(f"gpubench does not import: {type(err).__name__}: {err}")
    info["problems"] = problems
    write_json(folder / "setup.json", info)
    for step, sel in info.get("selections", {}).items():
        for what in ("k", "groups", "models"):  # read by gpu_check.sh
            (folder / f"{step}.{what}").write_text((sel[what] or "") + "\n")
        print(f"{step}: {len(sel['ids'])} case(s): {', '.join(sel['ids'])}"
              + (f" (not in this profile here: {', '.join(sel['missing'])})"
                 if sel["missing"] else ""))
    print(json.dumps({k: info[k] for k in ("python", "versions", "floors", "problems")},
                     indent=1))
    return 1 if problems else 0


def floor_problems(versions: dict) -> list[str]:
    """Installed versions below pyproject.toml's floors (said, not fatal: the machine's
    packages are what there is)."""
    try:
        import tomllib

        deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                             .read_text())["project"]["dependencies"]
    except (OSError, KeyError, ImportError, ValueError):
        return []
    low = []
    for dep in deps:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", dep)
        if m and m.group(1) in versions and versions[m.group(1)] != "?":
            if _version_tuple(versions[m.group(1)]) < _version_tuple(m.group(2)):
                low.append(f"{m.group(1)} {versions[m.group(1)]} is below {m.group(2)}")
    return low


def _version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


# -- driver and peaks -------------------------------------------------------------------------


def _run(cmd: list[str], timeout: float = 10) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return done.stdout + done.stderr
    except (OSError, subprocess.SubprocessError) as err:
        return f"{cmd[0]}: {err}"


def cmd_peaks(args) -> int:
    """nvidia-smi, torch, CUDA initialisation, device facts; then the matmul peaks."""
    folder = Path(args.work) / "peaks"
    folder.mkdir(parents=True, exist_ok=True)
    smi = _run(["nvidia-smi"])
    (folder / "nvidia-smi.txt").write_text(smi)
    info = {"mode": args.mode, "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    m = re.search(r"Driver Version:\s*([0-9.]+)", smi)
    info["nvidia_smi_driver"] = m.group(1) if m else None
    m = re.search(r"CUDA Version:\s*([0-9.]+)", smi)
    info["nvidia_smi_cuda"] = m.group(1) if m else None
    problems = []
    start = time.perf_counter()
    import torch

    info["torch_import_s"] = round(time.perf_counter() - start, 2)
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                else None)
    try:
        start = time.perf_counter()
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        info["cuda_init_s"] = round(time.perf_counter() - start, 2)
        info["cuda_usable"] = True
        info["devices"] = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append({"name": p.name, "capability": f"{p.major}.{p.minor}",
                                    "memory_gib": round(p.total_memory / 2**30, 1),
                                    "multiprocessors": p.multi_processor_count})
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    except Exception as err:  # noqa: BLE001 - said plainly; the CUDA steps are then skipped
        info["cuda_usable"] = False
        message = (str(err).strip().splitlines() or [repr(err)])[0]
        info["cuda_error"] = message
        if args.mode == "gpu":
            if "too old" in message or "insufficient" in message.lower():
                problems.append(
                    f"the NVIDIA driver ({info['nvidia_smi_driver'] or 'version unknown'}, CUDA "
                    f"{info['nvidia_smi_cuda'] or '?'}) is too old for torch {torch.__version__}"
                    f" (built for CUDA {torch.version.cuda})")
            else:
                problems.append(f"CUDA does not initialise: {message}")
    try:
        shm = os.statvfs("/dev/shm")
        info["dev_shm_gib"] = round(shm.f_blocks * shm.f_frsize / 2**30, 2)
        info["dev_shm_free_gib"] = round(shm.f_bavail * shm.f_frsize / 2**30, 2)
    except OSError:
        info["dev_shm_gib"] = info["dev_shm_free_gib"] = None
    info["problems"] = problems
    write_json(folder / "driver.json", info)
    print(json.dumps(info, indent=1), flush=True)
    device = "cuda" if info["cuda_usable"] else "cpu"
    if args.mode == "gpu" and device != "cuda":
        return 3
    from gpubench.measure.flops import device_key, fp8_peak_flops, matmul_peak_flops
    from gpubench.train.precision import unsupported_reason

    target = device_key(device)
    # The later steps read this file (GPUBENCH_MATMUL_PEAKS) instead of measuring again.
    peaks = {"device": device, "device_key": target,
             "device_name": torch.cuda.get_device_name(target) if device == "cuda" else "cpu",
             "peak_tflops": {}, "fp8_tflops": None, "seconds": {}, "skipped": {},
             "timing": "CUDA events around a loop of matmuls, best of 3 loops" if device
             == "cuda" else "wall clock around a loop of matmuls, best of 3 loops"}
    for precision in ("bf16", "fp16", "tf32", "fp32", "fp8"):  # MFU's ceilings, bf16 first
        # The float8 matmul (torch._scaled_mm) needs FP8 units, not torchao.
        reason = None if precision == "fp8" else unsupported_reason(precision, device)
        start = time.perf_counter()
        if reason:
            peaks["skipped"][precision] = reason
        elif precision == "fp8":
            fp8 = fp8_peak_flops(target)
            peaks["fp8_tflops"] = None if fp8 is None else fp8 / 1e12
            if fp8 is None:
                peaks["skipped"][precision] = "no FP8 units on this device"
        else:
            peaks["peak_tflops"][precision] = matmul_peak_flops(target, precision) / 1e12
        peaks["seconds"][precision] = round(time.perf_counter() - start, 2)
        write_json(folder / "peaks.json", peaks)  # after each: a time-out keeps the others
        print(precision, peaks["peak_tflops"].get(precision, peaks["fp8_tflops"]),
              peaks["skipped"].get(precision), flush=True)
    return 0


# -- processes a step left behind -------------------------------------------------------------


def marked_pids(mark: str, env: str = MARK_ENV) -> list[int]:
    """Processes whose environment holds ``env=mark`` (every process a step started, however
    deep: the variable is inherited), this one excepted."""
    needle = f"{env}={mark}".encode()
    pids = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        pid = int(path.split("/")[2])
        if pid == os.getpid():
            continue
        try:
            with open(path, "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(pid)
        except OSError:  # gone, or not ours
            continue
    return pids


def reap(mark: str, wait_s: float = 2.0, env: str = MARK_ENV) -> dict:
    """Wait up to ``wait_s`` for a step's leftover processes to exit, then SIGKILL the rest and
    wait for them to go; returns how many there were and how many outlived the kill."""
    deadline = time.monotonic() + wait_s
    left = marked_pids(mark, env)
    found = len(left)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_pids(mark, env)
    killed = 0
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_pids(mark, env)
    return {"found_after_exit": found, "killed": killed, "still_alive": len(left)}


def cmd_reap(args) -> int:
    result = reap(args.mark, args.wait, args.env)
    print(json.dumps(result))
    return 0 if result["still_alive"] == 0 else 1


# -- what a step finished ----------------------------------------------------------------------

LOG_LINE = re.compile(r"::(?P<test>test_\w+)\[(?P<id>[^\]\s]+)\] (?P<outcome>PASSED|FAILED|"
                      r"SKIPPED|ERROR)(?: \((?P<reason>.*)\))?(?=\s+\[\s*\d+%\]|\s*$)")
SUMMARY_LINE = re.compile(r"^(?P<outcome>FAILED|ERROR) \S+::(?P<test>test_\w+)\[(?P<id>[^\]]+)\]"
                          r"(?: - (?P<reason>.*))?$")


def read_records(folder: Path) -> dict[str, dict]:
    """case id -> record (pytest-benchmark's ``extra_info`` plus its ``stats``) of every
    finished case a gpubench step wrote: its ``benchmark.json`` and ``cases.jsonl`` journal,
    and, from gpubench versions that kept results elsewhere while running, the staging and
    ``-interrupted`` folders beside it."""
    paths = []
    for base in [folder, Path(f"{folder}-interrupted"),
                 *sorted(folder.parent.glob(f".{folder.name}.*"))]:
        if base.is_dir():
            paths += sorted(base.glob("*benchmark.json")) + sorted(base.glob("*cases.jsonl"))
    records: dict[str, dict] = {}
    for path in paths:
        for bench in _benchmarks(path):
            info = bench.get("extra_info") if isinstance(bench, dict) else None
            if isinstance(info, dict) and info.get("case_id"):
                stats = bench.get("stats") if isinstance(bench.get("stats"), dict) else {}
                records[info["case_id"]] = {**info, "_median_s": stats.get("median"),
                                            "_file": str(path.relative_to(folder.parent))}
    return records


def _benchmarks(path: Path) -> list:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    if path.suffix == ".jsonl":
        out = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(entry, dict) and entry.get("outcome") == "passed":
                out.append(entry.get("record"))
        return out
    try:
        data = json.loads(text)
    except ValueError:
        return []
    return data.get("benchmarks", []) if isinstance(data, dict) else []


def read_outcomes(folder: Path, log: Path) -> dict[str, dict]:
    """case id -> {"outcome", "reason"} of the tests the log (pytest -v) and the journal say
    failed, errored or were skipped."""
    outcomes: dict[str, dict] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        m = LOG_LINE.search(line) or SUMMARY_LINE.match(line.strip())
        if m and m.group("outcome") != "PASSED":
            reason = m.group("reason") or outcomes.get(m.group("id"), {}).get("reason")
            outcomes[m.group("id")] = {"outcome": m.group("outcome").lower(), "reason": reason}
    for journal in sorted(folder.glob("*cases.jsonl")) if folder.is_dir() else []:
        for line in journal.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("outcome") not in (None, "passed") \
                    and entry.get("case_id"):
                outcomes[entry["case_id"]] = {"outcome": entry["outcome"],
                                              "reason": entry.get("reason")}
    return outcomes


def cmd_status(args) -> int:
    work = Path(args.work)
    tag = f"{args.num}-{args.step}"
    folder = work / args.step
    log = work / f"{tag}.log"
    records = read_records(folder) if args.results else {}
    outcomes = read_outcomes(folder, log) if args.results else {}
    selection = {}
    try:
        selection = json.loads((work / "setup" / "setup.json").read_text()).get(
            "selections", {}).get(args.step, {})
    except (OSError, ValueError):
        pass
    status = {
        "step": tag, "status": args.status,
        "exit_code": int(args.rc) if args.rc not in ("", None) else None,
        "seconds": float(args.seconds) if args.seconds not in ("", None) else None,
        "budget_s": int(args.budget), "box_s": int(args.box) if args.box else None,
        "note": args.note or None, "mode": args.mode,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "selected": selection.get("ids"),
        "finished": list(records),
        "outcomes": outcomes,
        "leftovers": json.loads(args.leftovers) if args.leftovers else None,
    }
    try:
        status["log_tail"] = log.read_text(errors="replace").splitlines()[-30:]
    except OSError:
        pass
    write_json(work / f"{tag}.json", status)
    return 0


# -- the summary and the tarball ----------------------------------------------------------------


def load_steps(work: Path) -> list[dict]:
    steps = []
    for path in sorted(work.glob("[0-9][0-9]-*.json")):
        try:
            steps.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return steps


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def collect(work: Path) -> dict:
    """Everything the summary needs from the work folder."""
    steps = load_steps(work)
    records = {}
    for s in steps:
        name = s["step"].split("-", 1)[1]
        for cid, r in read_records(work / name).items():
            records[cid] = {**r, "_step": name}
    return {"steps": steps, "records": records, "setup": _load(work / "setup" / "setup.json"),
            "driver": _load(work / "peaks" / "driver.json"),
            "peaks": _load(work / "peaks" / "peaks.json").get("peak_tflops", {})}


def _fmt(value, spec: str = ",.0f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ratio(a, b):
    return a / b if a and b else None


def headline(data: dict) -> dict:
    """The headline figures as data (gpu_check.json) and the md tables' rows."""
    records, peaks = data["records"], data["peaks"]
    steps = [r for r in records.values() if r.get("kind", "step") == "step"
             and r.get("parallel", "single") == "single" and r.get("_step") == "headline"]
    image = next((m for m in ("resnet50", "resnet18") if any(r.get("model") == m
                                                             for r in steps)), None)
    rows = []
    by_id = {r["case_id"]: r for r in steps}
    for r in steps:
        if r.get("model") != image:
            continue
        key = (r.get("model"), r.get("precision"), bool(r.get("channels_last")))
        anchor, anchor_ips = PUBLISHED.get(key, (None, None))
        rows.append({"case": r["case_id"], "precision": r.get("precision"),
                     "layout": "channels_last" if r.get("channels_last") else "NCHW",
                     "images_per_s": r.get("samples_per_s"),
                     "step_ms": _ms(r.get("step_time_s")), "mfu": r.get("mfu"),
                     "peak_gib": _gib(r.get("peak_memory_bytes")),
                     "step_gib": _gib(r.get("step_memory_bytes")),
                     "published": anchor, "published_images_per_s": anchor_ips,
                     "of_published": _ratio(r.get("samples_per_s"), anchor_ips)})
    speedups = {}
    if image:
        fp32, tf32 = by_id.get(f"{image}-fp32"), by_id.get(f"{image}-tf32")
        for amp in (f"{image}-bf16", f"{image}-bf16-cl"):
            r = by_id.get(amp)
            if r:
                speedups[amp] = {
                    "over_fp32": _ratio(r.get("samples_per_s"), fp32 and fp32.get(
                        "samples_per_s")),
                    "over_tf32": _ratio(r.get("samples_per_s"), tf32 and tf32.get(
                        "samples_per_s"))}
    text = []
    bf16_peak = peaks.get("bf16")
    for model in ("bert", "gpt2"):
        r, base = by_id.get(f"{model}-bf16"), by_id.get(f"{model}-fp32")
        if r is None and base is None:
            continue
        shape = (r or base).get("input_shape") or []
        seq = shape[1] if len(shape) > 1 else None
        entry = {"model": model, "shape": shape, "bf16_case": r and r["case_id"]}
        if r:
            entry.update(
                samples_per_s=r.get("samples_per_s"),
                tokens_per_s=(r.get("samples_per_s") or 0) * seq if seq else None,
                tflops=r.get("tflops"), bf16_peak_tflops=bf16_peak,
                mfu_vs_bf16_peak=_ratio(r.get("tflops"), bf16_peak),
                mfu_record=r.get("mfu"), record_peak_tflops=r.get("peak_tflops"))
        if base:
            entry.update(fp32_samples_per_s=base.get("samples_per_s"),
                         fp32_mfu=base.get("mfu"))
        entry["bf16_over_fp32"] = _ratio(r and r.get("samples_per_s"),
                                         base and base.get("samples_per_s"))
        text.append(entry)
    memory = [{"case": r["case_id"], "peak_gib": _gib(r.get("peak_memory_bytes")),
               "step_gib": _gib(r.get("step_memory_bytes")),
               "peak_method": r.get("peak_memory_method")} for r in steps]
    return {"peaks_tflops": peaks, "image_model": image, "image_rows": rows,
            "amp_speedup": speedups, "transformers": text, "memory": memory}


def _gib(value):
    return None if value is None else value / 2**30


def against_fp32(records: dict, r: dict) -> tuple[float | None, str]:
    """A case's speedup against its model's fp32 case, and how it was measured: the paired
    ratio where the case ran paired with its baseline (rounds alternated in one run), else its
    samples/s over the fp32 case's from another step (a separate process: machine drift between
    the two is in the ratio)."""
    if r.get("speedup_paired") is not None:
        return r["speedup_paired"], "paired"
    base = records.get(f"{r.get('model')}-fp32")
    if base is None or base is r:
        return None, "-"
    where = ("same run" if base.get("_step") == r.get("_step")
             else f"separate process ({base.get('_step')} step)")
    return _ratio(r.get("samples_per_s"), base.get("samples_per_s")), where


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def not_reached(data: dict) -> list[str]:
    """What the check did not measure, and why, one line each (cases that share the reason
    on one line)."""
    lines = []
    for s in data["steps"]:
        if s["status"] == "skipped":
            lines.append(f"step {s['step']} did not run: {s.get('note') or 'skipped'}")
            continue
        if s["status"] == "running":
            lines.append(f"step {s['step']} was cut off while running (the whole check was "
                         "stopped): its finished cases are kept")
        selected = s.get("selected") or []
        finished = set(s.get("finished") or [])
        outcomes = s.get("outcomes") or {}
        why: dict[str, list[str]] = {}
        for cid in [*selected, *(c for c in outcomes if c not in selected)]:
            if cid in finished:
                continue
            o = outcomes.get(cid)
            if o:
                text = f"{o['outcome']}: {o.get('reason') or 'see ' + s['step'] + '.log'}"
            elif s["status"] == "timed out":
                text = f"not reached: step {s['step']} stopped at its {s.get('box_s')} s box"
            elif s["status"] == "running":
                text = "not reached"
            elif s["status"] == "ok":
                text = (f"not collected by step {s['step']}: not a case of its profile on this "
                        "machine")
            else:
                text = (f"not reached: step {s['step']} {s['status']} (exit "
                        f"{s.get('exit_code')}; see {s['step']}.log)")
            why.setdefault(text, []).append(cid)
        for text, ids in why.items():
            lines.append(f"{', '.join(ids)}: {text}")
        if s["status"] in ("failed", "timed out") and not selected and not why:
            tail = next((t for t in reversed(s.get("log_tail") or []) if t.strip()), "")
            lines.append(f"step {s['step']} {s['status']} (exit {s.get('exit_code')}): "
                         f"{tail[:200]}")
        left = s.get("leftovers") or {}
        if left.get("found_after_exit"):
            lines.append(f"step {s['step']} left {left['found_after_exit']} process(es) "
                         f"running: {left.get('killed', 0)} killed, {left.get('still_alive', 0)}"
                         " still alive")
    for sel_step, sel in (data["setup"].get("selections") or {}).items():
        for cid in sel.get("missing") or []:
            lines.append(f"{cid}: not in the {sel['profile']} profile's cases on this "
                         f"machine (step {sel_step})")
    return lines


def summary_markdown(data: dict, mode: str, elapsed: float | None, total: int | None,
                     final: bool) -> str:
    h = headline(data)
    driver = data["driver"]
    devices = ", ".join(d["name"] for d in driver.get("devices", [])) or "no CUDA device"
    lines = [f"# gpubench gpu_check ({'rehearsal on the CPU' if mode == 'rehearse' else 'GPU'}"
             f"): {devices}", ""]
    when = "done" if final else "in progress (written after every step)"
    lines.append(f"{when}; {len(data['records'])} record(s); "
                 + (f"{elapsed:.0f} s of the {total} s budget; " if elapsed is not None else "")
                 + f"torch {driver.get('torch')} (CUDA {driver.get('torch_cuda')}), driver "
                 f"{driver.get('nvidia_smi_driver')}, Python {driver.get('python')}.")
    lines += ["", "## Headline", ""]
    peaks = h["peaks_tflops"]
    lines.append("Measured matmul peaks (TFLOP/s; square matmuls up to 8192, best of several; "
                 "the ceilings MFU divides by): "
                 + (", ".join(f"{p} {_fmt(peaks.get(p), '.1f')}"
                              for p in ("bf16", "fp16", "tf32", "fp32")) if peaks
                    else "not measured (see 01-peaks)") + ".")
    lines.append("")
    if h["image_rows"]:
        rows = h["image_rows"]
        lines += [f"{h['image_model']} images/s (device-resident synthetic batches of "
                  f"{_shape(data, rows[0]['case'])}):", "",
                  "| case | precision | layout | images/s | step (ms) | MFU | peak memory (GiB) | "
                  "step memory (GiB) | published | of published |",
                  "|---|---|---|---:|---:|---:|---:|---:|---|---:|"]
        for r in rows:
            lines.append(f"| {r['case']} | {r['precision']} | {r['layout']} | "
                         f"{_fmt(r['images_per_s'])} | {_fmt(r['step_ms'], '.1f')} | "
                         f"{_fmt(r['mfu'], '.1%')} | {_fmt(r['peak_gib'], '.2f')} | "
                         f"{_fmt(r['step_gib'], '.2f')} | {r['published'] or '-'} | "
                         f"{_fmt(r['of_published'], '.0%')} |")
        for amp, s in h["amp_speedup"].items():
            lines.append(f"\nAMP speedup of {amp}: {_times(s['over_fp32'])} over fp32, "
                         f"{_times(s['over_tf32'])} over tf32.")
    else:
        lines.append("No image-model headline case finished.")
    lines.append("")
    if h["transformers"]:
        lines += ["Transformers, bf16 cases against the measured bf16 peak:", "",
                  "| model (shape) | bf16 samples/s | tokens/s | TFLOP/s | measured bf16 peak "
                  "(TFLOP/s) | MFU vs bf16 peak | record's MFU | bf16 over fp32 | fp32 MFU |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for t in h["transformers"]:
            lines.append(
                f"| {t['model']} {t['shape']} | {_fmt(t.get('samples_per_s'), ',.1f')} | "
                f"{_fmt(t.get('tokens_per_s'))} | {_fmt(t.get('tflops'), '.1f')} | "
                f"{_fmt(t.get('bf16_peak_tflops'), '.1f')} | "
                f"{_fmt(t.get('mfu_vs_bf16_peak'), '.1%')} | {_fmt(t.get('mfu_record'), '.1%')}"
                f" | {_times(t.get('bf16_over_fp32'))} | {_fmt(t.get('fp32_mfu'), '.1%')} |")
    else:
        lines.append("No transformer headline case finished.")
    if h["memory"]:
        lines += ["", "Memory of every headline case (peak: the most allocated in the timed "
                  "window; per step: what one step adds to what is resident):", "",
                  "| case | peak memory (GiB) | step memory (GiB) | peak measured by |",
                  "|---|---:|---:|---|"]
        lines += [f"| {m['case']} | {_fmt(m['peak_gib'], '.2f')} | {_fmt(m['step_gib'], '.2f')}"
                  f" | {m['peak_method'] or '-'} |" for m in h["memory"]]
    missing = not_reached(data)
    lines += ["", "## Not reached", ""]
    lines += [f"- {m}" for m in missing] if missing else ["Everything selected finished."]
    for p in driver.get("problems", []) + data["setup"].get("problems", []):
        lines.append(f"- PROBLEM: {p}")
    lines += ["", "## Steps", "", "| step | status | seconds / box (budget) | cases | note |",
              "|---|---|---|---:|---|"]
    for s in data["steps"]:
        lines.append(f"| {s['step']} | {s['status']} | {_fmt(s.get('seconds'), '.0f', '')} / "
                     f"{s.get('box_s') or '-'} ({s['budget_s']}) | {len(s.get('finished') or [])}"
                     f" | {s.get('note') or ''} |")
    lines += _other_tables(data)
    lines += ["", f"Everything the steps wrote (results JSON and journals, logs, summaries, "
              f"advice, status files) is in {TARBALL} (gpu_check/<step>/...)."]
    return "\n".join(lines) + "\n"


def _shape(data: dict, cid: str) -> str:
    r = data["records"].get(cid, {})
    return "x".join(map(str, r.get("input_shape") or [])) or "?"


def _section(title: str, header: str, rows: list[str], left: int = 1) -> list[str]:
    """A Markdown section: ``title``, a table of ``header`` ("| a | b |", the first ``left``
    columns left-aligned, the others right) and ``rows``; nothing when there are no rows."""
    if not rows:
        return []
    aligns = "|" + "---|" * left + "---:|" * (header.count("|") - 1 - left)
    return ["", f"## {title}", "", header, aligns, *rows]


def _other_tables(data: dict) -> list[str]:
    records = list(data["records"].values())
    step = {name: [r for r in records if r.get("_step") == name] for name in ("more", "loader")}
    kind = {name: [r for r in records if r.get("kind") == name] for name in ("transfer", "claim")}
    by_id = {r["case_id"]: r for r in records if r.get("case_id")}
    more = []
    for r in step["more"]:
        speedup, how = against_fp32(by_id, r)
        more.append(f"| {r['case_id']} | {_fmt(r.get('samples_per_s'), ',.1f')} | "
                    f"{_fmt(_ms(r.get('step_time_s')), '.1f')} | "
                    f"{_fmt(_gib(r.get('peak_memory_bytes')), '.2f')} | "
                    f"{_fmt(r.get('mfu'), '.1%')} | {_times(speedup)} | {how} |")
    out = _section("More cases", "| case | samples/s | step (ms) | peak memory (GiB) | MFU | "
                   "speedup over its fp32 | measured |", more, left=1)
    out += _section("Loader", "| case | samples/s | loader stall | cold resident |", [
        f"| {r['case_id']} | {_fmt(r.get('samples_per_s'), ',.1f')} | "
        f"{_fmt(r.get('loader_stall_fraction'), '.1%')} | "
        f"{_fmt(r.get('cold_resident_fraction'), '.1%')} |" for r in step["loader"]])
    out += _section("Host-to-device copies", "| case | GB/s | overlap |", [
        f"| {r['case_id']} | {_fmt(r.get('bandwidth_gb_s'), '.1f')} | "
        f"{_fmt(r.get('overlap_fraction'), '.2f')} |" for r in kind["transfer"]])
    out += _section("Claims pairs", "| pair | base | new | base/new step time |", [
        f"| {r['case_id']} | {r.get('case_id_base')} | {r.get('case_id_new')} | "
        f"{_fmt(_ratio(_median(r.get('rounds_base_s')), _median(r.get('rounds_new_s'))), '.2f')}"
        " |" for r in kind["claim"]], left=3)
    return out


def _median(values):
    values = sorted(values or [])
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def pack(work: Path, dest: Path, limit: int = TARBALL_LIMIT) -> dict:
    """``dest`` (a .tar.gz of everything under ``work``, as ``gpu_check/...``), written to a
    temporary file and renamed over the old one; the largest files are left out (and named in
    ``gpu_check/left_out.txt``) while it would exceed ``limit``."""
    files = sorted(p for p in work.rglob("*") if p.is_file() and not p.is_symlink()
                   and not p.name.endswith((".lock", ".tmp")) and p.name != ".stop-republish")
    left_out: list[Path] = []
    while True:
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")  # one per writer
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for p in files:
                if p in left_out:
                    continue
                try:
                    tar.add(p, arcname=f"gpu_check/{p.relative_to(work)}", recursive=False)
                except OSError:  # removed while packing (a staging folder)
                    continue
            if left_out:
                note = "".join(f"{p.relative_to(work)} ({p.stat().st_size} bytes)\n"
                               for p in left_out if p.exists()).encode()
                entry = tarfile.TarInfo("gpu_check/left_out.txt")
                entry.size, entry.mtime = len(note), int(time.time())
                tar.addfile(entry, io.BytesIO(note))
        size = tmp.stat().st_size
        rest = [p for p in files if p not in left_out and p.exists()]
        if size < limit or not rest:
            break
        left_out.append(max(rest, key=lambda p: p.stat().st_size))
    os.replace(tmp, dest)
    return {"bytes": size, "files": len(files) - len(left_out),
            "left_out": [str(p.relative_to(work)) for p in left_out]}


def cmd_publish(args) -> int:
    work, out = Path(args.work), Path(args.out)
    data = collect(work)
    final = args.final
    elapsed = float(args.elapsed) if args.elapsed else None
    text = summary_markdown(data, args.mode, elapsed, args.total, final)
    report = {"mode": args.mode, "final": final, "elapsed_s": elapsed, "budget_s": args.total,
              "headline": headline(data), "not_reached": not_reached(data),
              "steps": [{k: s.get(k) for k in ("step", "status", "seconds", "box_s", "budget_s",
                                               "note", "finished")} for s in data["steps"]],
              "more": [{"case": r["case_id"], "samples_per_s": r.get("samples_per_s"),
                        "peak_memory_gib": _gib(r.get("peak_memory_bytes")),
                        **dict(zip(("speedup_over_fp32", "measured"),
                                   against_fp32(data["records"], r), strict=True))}
                       for r in data["records"].values() if r.get("_step") == "more"],
              "driver": data["driver"], "versions": data["setup"].get("versions"),
              "cases": len(data["records"])}
    for folder in (work, out):
        write_text(folder / SUMMARY_MD, text)
        write_json(folder / SUMMARY_JSON, report)
    packed = pack(work, out / TARBALL)
    if final:
        print(text)
        print(f"gpu_check: {TARBALL}: {packed['bytes'] / 2**20:.2f} MiB, {packed['files']} "
              f"files" + (f", left out: {', '.join(packed['left_out'])}"
                          if packed["left_out"] else ""))
    return 0 if data["records"] or not final else 1


# -- helpers ------------------------------------------------------------------------------------


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per writer
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check_tool.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup")
    p.add_argument("work")
    p.add_argument("mode", choices=("gpu", "rehearse"))
    p.set_defaults(fn=cmd_setup)
    p = sub.add_parser("peaks")
    p.add_argument("work")
    p.add_argument("mode", choices=("gpu", "rehearse"))
    p.set_defaults(fn=cmd_peaks)
    p = sub.add_parser("reap")
    p.add_argument("mark")
    p.add_argument("--wait", type=float, default=2.0)
    p.add_argument("--env", default=MARK_ENV)
    p.set_defaults(fn=cmd_reap)
    p = sub.add_parser("status")
    for name in ("work", "mode", "num", "step", "status", "rc", "seconds", "budget", "box",
                 "note"):
        p.add_argument(name)
    p.add_argument("--results", action="store_true")
    p.add_argument("--leftovers", default="")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("publish")
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("mode", choices=("gpu", "rehearse"))
    p.add_argument("--elapsed", default="")
    p.add_argument("--total", type=int, default=None)
    p.add_argument("--final", action="store_true")
    p.set_defaults(fn=cmd_publish)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
