#!/usr/bin/env bash
# The first GPU run of gpubench: a prioritized, time-boxed check (at most 7 minutes of device
# time) that writes its partial results after every step, so that a run cut short keeps what
# it measured.
#
#   scripts/gpu_check.sh OUT              on a CUDA machine
#   scripts/gpu_check.sh --rehearse OUT   the same steps on the CPU: smoke profile, one or two
#                                         cases per step, small budgets (tests/test_gpu_check.py)
#
# Steps in priority order, each under `timeout` (TERM, then KILL a few seconds later), so that a
# hung step cannot eat the budget; budgets in seconds on the GPU (420 in all):
#   00 setup            80  python3 with gpubench's dependencies importable, else
#                           pip install torch==2.14.1 torchvision==0.29.1 -e . (only -e . where
#                           torch is installed already: it matches the machine's driver)
#   01 driver           15  nvidia-smi, torch.cuda.init() (the torch wheel is built for CUDA 13,
#                           which needs a recent driver: said plainly if it is too old), /dev/shm
#   02 peaks            20  gpubench.flops.matmul_peak_flops per precision (bf16, fp16, tf32, fp32)
#   03 core            115  gpu-small precision and layout cases, every model
#   04 loader           55  gpu-small loader cases (generating, in parallel, the data they read)
#   05 more             75  gpu-small optimizer, accumulation and memory cases
#   06 parallel_claims  45  gpu-small parallel cases (those this machine's GPUs allow), then the
#                           claims pairs (alternating rounds)
#   07 transfer         15  the host-to-device copy benchmark (benchmarks/test_transfer.py)
# then the summary (gpu_check.md, gpu_check.json: ResNet-50 AMP images/s, the best transformer
# MFU against the measured bf16 peak, the best loader case's stall). Each gpubench step costs
# its own start (workload checks, pytest, the paired-baseline worker: 15-20 s), hence few of them.
#
# After every step: OUT/NN-step.json (status, exit code, seconds, budget, what it wrote, cases
# finished), OUT/NN-step.log (its output) and OUT/progress.md. A gpubench step writes OUT/<step>/
# (JSON and summary; charts left out to save device time: `gpubench report OUT/core/benchmark.json
# -o DIR` draws them anywhere); a step stopped by its budget keeps the cases that had finished in
# OUT/<step>-interrupted/benchmark.json. Data is generated into $GPUBENCH_DATA_DIR (default
# ${TMPDIR:-/tmp}/gpubench-data), never into OUT.
#
# Environment: GPU_CHECK_STEPS=core,loader runs only those steps; GPU_CHECK_BUDGET_<step>=S
# overrides one budget; GPU_CHECK_TOTAL=S the whole budget.
set -uo pipefail

usage="usage: scripts/gpu_check.sh [--rehearse] OUT"
MODE=gpu
if [[ "${1:-}" == "--rehearse" ]]; then
    MODE=rehearse
    shift
fi
[[ $# -eq 1 && -n "$1" && "$1" != -* ]] || { echo "$usage" >&2; exit 2; }
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
export OUT MODE ROOT
export GPUBENCH_DATA_DIR=${GPUBENCH_DATA_DIR:-${TMPDIR:-/tmp}/gpubench-data}
export PYTHONUNBUFFERED=1

declare -A BUDGET
if [[ $MODE == gpu ]]; then
    BUDGET=([setup]=80 [driver]=15 [peaks]=20 [core]=115 [loader]=55 [more]=75
            [parallel_claims]=45 [transfer]=15)
    TOTAL=${GPU_CHECK_TOTAL:-420}
    DEVICE=cuda
else
    # The rehearsal: the same steps and commands on the CPU, with the smoke profile's resnet18
    # and a -k selection of one case per step; budgets for a slow 2-core CI machine.
    BUDGET=([setup]=30 [driver]=30 [peaks]=60 [core]=120 [loader]=120 [more]=120
            [parallel_claims]=150 [transfer]=60)
    TOTAL=${GPU_CHECK_TOTAL:-1200}
    DEVICE=cpu
fi
export DEVICE
START=$SECONDS
STOP_REASON=""  # set when nothing further can run (no gpubench, no usable CUDA)

# gpubench run with the mode's profile and settings (the GPU's gpu-small on CUDA, the
# rehearsal's smoke resnet18 on the CPU), plus "$@".
gpubench_run() {
    if [[ $MODE == gpu ]]; then
        python3 -m gpubench run --profile gpu-small --device cuda --rounds 20 --warmup 3 \
            --timeout 60 --no-charts "$@"
    else
        python3 -m gpubench run --profile smoke --device cpu --models resnet18 --rounds 3 \
            --warmup 0 --timeout 60 --no-charts "$@"
    fi
}

selected() {
    [[ -z "${GPU_CHECK_STEPS:-}" ]] && return 0
    [[ ",${GPU_CHECK_STEPS}," == *",$1,"* ]]
}

# write_status TAG STATUS RC SECONDS BUDGET TIMEOUT NOTE [RESULT_DIR...]
write_status() {
    python3 - "$@" <<'PY'
import json, os, sys, time
tag, status, rc, seconds, budget, limit, note, *dirs = sys.argv[1:]
out = os.environ["OUT"]
record = {"step": tag, "status": status, "exit_code": None if rc == "" else int(rc),
          "seconds": None if seconds == "" else int(seconds), "budget_s": int(budget),
          "timeout_s": None if limit == "" else int(limit), "note": note or None,
          "mode": os.environ["MODE"], "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime())}
results = {}
for d in dirs:
    for folder in (d, d + "-interrupted"):
        path = os.path.join(out, folder, "benchmark.json")
        if os.path.exists(path):
            try:
                benches = json.load(open(path)).get("benchmarks", [])
                cases = [b.get("extra_info", {}).get("case_id") or b.get("name")
                         for b in benches if b.get("extra_info")]
            except (OSError, ValueError, AttributeError):
                cases = None
            results[os.path.relpath(path, out)] = {"cases": None if cases is None else len(cases),
                                                   "case_ids": cases}
    folder = os.path.join(out, d)
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if not name.endswith("benchmark.json"):
                results.setdefault(os.path.join(d, name), {})
record["outputs"] = results
log = os.path.join(out, tag + ".log")
if os.path.exists(log):
    with open(log, errors="replace") as f:
        record["log_tail"] = f.read()[-3000:].splitlines()[-25:]
tmp = os.path.join(out, f".{tag}.json.tmp")
with open(tmp, "w") as f:
    json.dump(record, f, indent=1)
os.replace(tmp, os.path.join(out, tag + ".json"))
# progress.md: one line per step so far
rows = []
for name in sorted(os.listdir(out)):
    if name[:2].isdigit() and name.endswith(".json"):
        r = json.load(open(os.path.join(out, name)))
        cases = sum((v.get("cases") or 0) for v in r.get("outputs", {}).values())
        rows.append(f"| {r['step']} | {r['status']} | {r['seconds'] if r['seconds'] is not None else ''}"
                    f" / {r['budget_s']} | {cases or ''} | {r.get('note') or ''} |")
text = ("# gpu_check progress\n\n| step | status | seconds / budget | cases | note |\n"
        "|---|---|---|---:|---|\n" + "\n".join(rows) + "\n")
tmp = os.path.join(out, ".progress.md.tmp")
with open(tmp, "w") as f:
    f.write(text)
os.replace(tmp, os.path.join(out, "progress.md"))
PY
}

# run_step NUM NAME NOTE RESULT_DIRS FUNCTION: FUNCTION (exported) under the step's time box.
run_step() {
    local num=$1 name=$2 note=$3 dirs=$4 fn=$5
    local tag="$num-$name"
    selected "$name" || return 0
    local override="GPU_CHECK_BUDGET_$name"
    local budget=${!override:-${BUDGET[$name]}}
    if [[ -n $STOP_REASON && $name != driver ]]; then
        write_status "$tag" skipped "" "" "$budget" "" "$STOP_REASON"
        echo "gpu_check: step $tag: skipped ($STOP_REASON)"
        return 0
    fi
    local left=$(( TOTAL - (SECONDS - START) ))
    local limit=$(( budget < left ? budget : left ))
    if (( limit < 3 )); then
        write_status "$tag" skipped "" "" "$budget" "" "no time left of the ${TOTAL} s budget"
        return 0
    fi
    local grace=$(( limit / 4 ))
    (( grace > 10 )) && grace=10
    (( grace < 1 )) && grace=1
    echo "gpu_check: step $tag (budget ${budget} s, time box ${limit} s) ..."
    write_status "$tag" running "" "" "$budget" "$limit" "$note"
    local t0=$SECONDS
    # TERM first (gpubench run keeps its finished cases), KILL `grace` seconds later.
    timeout --signal=TERM --kill-after="$grace" "$(( limit - grace ))" bash -c "$fn" \
        >"$OUT/$tag.log" 2>&1
    local rc=$?
    local status=ok
    if (( rc == 124 || rc == 137 )); then
        status="timed out"
    elif (( rc != 0 )); then
        status=failed
    fi
    # shellcheck disable=SC2086  # dirs is a list of words
    write_status "$tag" "$status" "$rc" "$(( SECONDS - t0 ))" "$budget" "$limit" "$note" $dirs
    echo "gpu_check: step $tag: $status (exit $rc, $(( SECONDS - t0 )) s)"
}

# Whether python3 can import these (without importing them: quick).
have_modules() {
    python3 - "$@" <<'PY'
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
print("missing:", " ".join(missing) if missing else "nothing")
sys.exit(1 if missing else 0)
PY
}

step_setup() {
    # gpubench imports from the checkout itself (the current folder); its dependencies must be
    # installed.
    local deps=(gpubench torch torchvision transformers pytest pytest_benchmark pandas seaborn
                matplotlib scipy markdown)
    if have_modules "${deps[@]}"; then
        python3 -c "import torch; print('ready; torch', torch.__version__)"
        return 0
    fi
    if [[ $MODE == rehearse ]]; then
        echo "gpubench's dependencies are not importable by python3 (the rehearsal installs nothing)"
        return 1
    fi
    if have_modules torch torchvision; then
        # A torch already here was installed for this machine's driver: keep it (gpubench
        # accepts torch >= 2.4) and install the rest.
        echo "installing: pip install -e . (keeping the installed torch)"
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
            -e . || return 1
    else
        echo "installing: pip install torch==2.14.1 torchvision==0.29.1 -e ."
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
            torch==2.14.1 torchvision==0.29.1 -e . || return 1
    fi
    python3 -c "import torch, gpubench.cli; print('installed; torch', torch.__version__)"
}

step_driver() {
    mkdir -p "$OUT/driver"
    if command -v nvidia-smi >/dev/null; then
        timeout 10 nvidia-smi >"$OUT/driver/nvidia-smi.txt" 2>&1
        timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
            --format=csv >"$OUT/driver/nvidia-smi-query.csv" 2>&1
    else
        echo "nvidia-smi: not found" >"$OUT/driver/nvidia-smi.txt"
    fi
    python3 - <<'PY'
import json, os, re, shutil, sys

out, mode = os.environ["OUT"], os.environ["MODE"]
info = {"mode": mode, "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
try:
    import torch
except Exception as err:  # noqa: BLE001
    info.update(torch_import_error=repr(err), cuda_usable=False)
    torch = None
smi = open(os.path.join(out, "driver", "nvidia-smi.txt"), errors="replace").read()
driver = re.search(r"Driver Version:\s*([0-9.]+)", smi)
smi_cuda = re.search(r"CUDA Version:\s*([0-9.]+)", smi)
info["nvidia_smi_driver"] = driver.group(1) if driver else None
info["nvidia_smi_cuda"] = smi_cuda.group(1) if smi_cuda else None
problems = []
if torch is not None:
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                else None)
    try:
        version = torch._C._cuda_getDriverVersion()  # what the driver supports, no context
        info["driver_cuda_api"] = f"{version // 1000}.{version % 1000 // 10}" if version else None
    except Exception as err:  # noqa: BLE001
        info["driver_cuda_api"] = None
    try:
        torch.cuda.init()
        info["cuda_usable"] = True
        info["devices"] = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append({"name": p.name, "capability": f"{p.major}.{p.minor}",
                                    "memory_gib": round(p.total_memory / 2**30, 1),
                                    "multiprocessors": p.multi_processor_count})
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        a = torch.randn(1024, 1024, device="cuda")
        info["matmul_ok"] = bool(torch.isfinite(a @ a).all().item())
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        info["cuda_usable"] = False
        message = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        info["cuda_error"] = message
        if "too old" in message or "insufficient" in message.lower():
            info["driver_too_old"] = True
            problems.append(
                f"the NVIDIA driver is too old for this torch: torch {torch.__version__} is "
                f"built for CUDA {torch.version.cuda}, the driver "
                f"({info['nvidia_smi_driver'] or 'version unknown'}) supports CUDA "
                f"{info.get('driver_cuda_api') or info['nvidia_smi_cuda'] or '?'}. CUDA 13 "
                "needs an R580 or newer driver: update the driver, or install a torch wheel "
                "built for the driver's CUDA version (download.pytorch.org/whl/cuXYZ).")
        else:
            problems.append(f"CUDA does not initialise: {message}")
try:
    shm = shutil.disk_usage("/dev/shm")
    info["dev_shm_gib"] = round(shm.total / 2**30, 2)
    info["dev_shm_free_gib"] = round(shm.free / 2**30, 2)
    if shm.total < 2 * 2**30:
        problems.append(f"/dev/shm holds only {shm.total / 2**20:.0f} MiB: DataLoader workers "
                        "pass batches through it and fail ('bus error', 'No space left on "
                        "device') when it is small (a container's default is 64 MiB); start "
                        "the container with --shm-size=16g or --ipc=host")
except OSError as err:
    info["dev_shm_error"] = str(err)
try:
    with open("/proc/meminfo") as f:
        info["host_memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
except (OSError, ValueError, IndexError):
    pass
info["problems"] = problems
if mode == "rehearse":
    info["note"] = "rehearsal on the CPU: CUDA is not expected to initialise here"
with open(os.path.join(out, "driver", "driver.json"), "w") as f:
    json.dump(info, f, indent=1)
print(json.dumps(info, indent=1))
for p in problems:
    print("PROBLEM:", p)
expected_cpu = mode == "rehearse"
sys.exit(0 if info.get("cuda_usable") or expected_cpu else 3)
PY
}

step_peaks() {
    mkdir -p "$OUT/peaks"
    python3 - <<'PY'
import json, os, time

from gpubench.flops import matmul_peak_flops
from gpubench.precision import unsupported_reason

out, device = os.environ["OUT"], os.environ["DEVICE"]
target = f"{device}:0" if device == "cuda" else device
result = {"device": target, "peak_tflops": {}, "seconds": {}, "skipped": {}}
for precision in ("bf16", "fp16", "tf32", "fp32"):  # MFU's ceilings first
    reason = unsupported_reason(precision, device)
    if reason:
        result["skipped"][precision] = reason
    else:
        start = time.perf_counter()
        result["peak_tflops"][precision] = matmul_peak_flops(target, precision) / 1e12
        result["seconds"][precision] = round(time.perf_counter() - start, 2)
    tmp = os.path.join(out, "peaks", ".peaks.json.tmp")
    with open(tmp, "w") as f:  # after every precision: partial results survive a time-out
        json.dump(result, f, indent=1)
    os.replace(tmp, os.path.join(out, "peaks", "peaks.json"))
    print(precision, result["peak_tflops"].get(precision), result["skipped"].get(precision),
          flush=True)
PY
}

# gpubench run for one step: its groups and -k expression, the GPU's max-time; the rehearsal
# narrows -k to one case per step (REHEARSE_K).
gpubench_step() {
    local name=$1 groups=$2 max_time=$3 k=$4 rehearse_k=$5
    if [[ $MODE == rehearse ]]; then
        k=$rehearse_k
        max_time=0.5
    fi
    gpubench_run --groups "$groups" --max-time "$max_time" -k "$k" --out "$OUT/$name"
}
step_core() {
    gpubench_step core precision,layout 2 test_step "test_step and not fp16 and not bf16 and not cl"
}
step_loader() {
    gpubench_step loader loader 2 test_step "test_step and jpeg and not w2 and not cached"
}
step_more() {
    gpubench_step more optimizer,accumulation,memory,recipe 1 test_step "test_step and zerofill"
}
step_parallel_claims() {
    # The claims pairs do not depend on --groups; pytest runs them after the cases.
    gpubench_step parallel_claims parallel 1 "test_step or test_claim" \
        "(test_step and model2) or (test_claim and adamw)"
}

step_transfer() {
    mkdir -p "$OUT/transfer"
    local profile=gpu-small
    [[ $MODE == rehearse ]] && profile=smoke
    python3 -m pytest benchmarks/test_transfer.py -v -p no:cacheprovider -rs \
        --rootdir="$ROOT" --benchmark-json="$OUT/transfer/benchmark.json" \
        --gpubench-profile="$profile" --gpubench-device="$DEVICE"
}

summary() {
    python3 - <<'PY'
import glob, json, os

out, mode = os.environ["OUT"], os.environ["MODE"]
steps = []
for path in sorted(glob.glob(os.path.join(out, "[0-9][0-9]-*.json"))):
    with open(path) as f:
        steps.append(json.load(f))
records = []
for path in sorted(glob.glob(os.path.join(out, "*", "benchmark.json"))):
    try:
        with open(path) as f:
            benches = json.load(f).get("benchmarks", [])
    except (OSError, ValueError):
        continue
    for b in benches:
        info = dict(b.get("extra_info") or {})
        if info:
            info["_file"] = os.path.relpath(path, out)
            records.append(info)
def load(path):
    try:
        with open(os.path.join(out, path)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
peaks = load("peaks/peaks.json").get("peak_tflops", {})
driver = load("driver/driver.json")
steps_only = [r for r in records if r.get("kind", "step") == "step"]
headline = {}
image = [r for r in steps_only if r.get("model") in ("resnet50", "resnet18")
         and r.get("parallel") == "single" and r.get("group") == "precision"]
for r in image:
    headline[f"{r['model']} {r['precision']} samples/s"] = r.get("samples_per_s")
text_models = [r for r in steps_only if r.get("model") in ("bert", "gpt2")
               and r.get("mfu") is not None]
if text_models:
    best = max(text_models, key=lambda r: r["mfu"])
    headline["best transformer MFU"] = {
        "case": best.get("case_id"), "mfu": best["mfu"], "tflops": best.get("tflops"),
        "ceiling_tflops": best.get("peak_tflops"), "measured_bf16_peak_tflops": peaks.get("bf16"),
        "tflops_over_bf16_peak": (best.get("tflops") / peaks["bf16"]) if peaks.get("bf16")
        and best.get("tflops") else None}
loader = [r for r in steps_only if r.get("group") == "loader"
          and r.get("loader_stall_fraction") is not None and r.get("samples_per_s")]
if loader:
    best = max(loader, key=lambda r: r["samples_per_s"])
    headline["best loader case"] = {"case": best.get("case_id"),
                                    "samples_per_s": best["samples_per_s"],
                                    "loader_stall_fraction": best["loader_stall_fraction"]}
report = {"mode": mode, "driver": driver, "matmul_peak_tflops": peaks, "headline": headline,
          "steps": [{k: s.get(k) for k in ("step", "status", "seconds", "budget_s", "note")}
                    for s in steps],
          "cases": len(records)}
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(report, f, indent=1)
lines = [f"# gpubench gpu_check ({'rehearsal on the CPU' if mode == 'rehearse' else 'GPU'})",
         "", "| step | status | seconds / budget | note |", "|---|---|---|---|"]
for s in steps:
    lines.append(f"| {s['step']} | {s['status']} | {s.get('seconds') or ''} / {s['budget_s']} "
                 f"| {s.get('note') or ''} |")
lines += ["", f"Device: {', '.join(d['name'] for d in driver.get('devices', [])) or 'none'}; "
          f"torch {driver.get('torch')} (CUDA {driver.get('torch_cuda')}), driver "
          f"{driver.get('nvidia_smi_driver')}; /dev/shm {driver.get('dev_shm_gib')} GiB."]
for p in driver.get("problems", []):
    lines.append(f"- PROBLEM: {p}")
lines += ["", "Matmul peaks (TFLOP/s): " + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()),
          "", "Headline figures:", "", "```", json.dumps(headline, indent=1), "```",
          "", f"{len(records)} records in {out}/*/benchmark.json"]
with open(os.path.join(out, "gpu_check.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
}

export -f have_modules gpubench_run step_setup step_driver step_peaks gpubench_step step_core \
    step_loader step_more step_parallel_claims step_transfer

step_ok() {  # step_ok TAG: the step ran (or was not selected) and succeeded
    [[ ! -f "$OUT/$1.json" ]] || grep -q '"status": "ok"' "$OUT/$1.json"
}

echo "gpu_check: $MODE run into $OUT (budget ${TOTAL} s); data in $GPUBENCH_DATA_DIR"
run_step 00 setup "gpubench importable (installs it on the GPU machine if not)" "" step_setup
step_ok 00-setup || STOP_REASON="gpubench is not importable: see 00-setup"
run_step 01 driver "nvidia-smi, torch.cuda.init(), /dev/shm" "" step_driver
if [[ -z $STOP_REASON ]] && ! step_ok 01-driver; then
    STOP_REASON="CUDA is not usable here: see 01-driver and driver/driver.json"
fi
run_step 02 peaks "matmul peak per precision" "" step_peaks
run_step 03 core "precision and layout cases" "core" step_core
run_step 04 loader "loader cases (generates their data)" "loader" step_loader
run_step 05 more "optimizer, accumulation, memory and recipe cases" "more" step_more
run_step 06 parallel_claims "parallel cases this machine allows, claims pairs" \
    "parallel_claims" step_parallel_claims
run_step 07 transfer "host-to-device copies" "transfer" step_transfer
summary >"$OUT/summary.log" 2>&1
cat "$OUT/gpu_check.md" 2>/dev/null
echo "gpu_check: done in $(( SECONDS - START )) s; results in $OUT"
# Exit 1 when a step failed or could not run; a step stopped by its time box is planned.
[[ -z $STOP_REASON ]] && ! grep -l '"status": "failed"' "$OUT"/[0-9][0-9]-*.json >/dev/null
