#!/usr/bin/env bash
# The first GPU run of gpubench: one command of at most 6 minutes on one H200 (Python 3.12,
# torch 2.11, torchvision 0.26, transformers 5.17, no network) that brings back the answer:
# the matmul peaks, ResNet-50/BERT/GPT-2 throughput and MFU per precision, then the other
# techniques, the loader, host-to-device copies and the claims pairs, highest value first.
#
#   scripts/gpu_check.sh OUT              on the CUDA machine (at most 360 s; give it 400,
#                                         so that a rerun fits the same 15-minute window)
#   scripts/gpu_check.sh --rehearse OUT   the same steps on the CPU: smoke profile, one resnet18
#                                         case per step (tests/test_gpu_check.py)
#
# OUT receives three files, each replaced atomically after every step (a kill at any moment
# leaves the last complete set): gpu_check.md (the summary, headline first), gpu_check.json
# (the same as data) and gpu_check.tar.gz (everything the steps wrote: results JSON and
# journals, logs, summaries, advice, status files; under 15 MiB). The steps write into a work
# folder outside OUT ($GPU_CHECK_WORK, default a new ${TMPDIR:-/tmp}/gpu_check.XXXXXX), the
# generated data into $GPUBENCH_DATA_DIR (default ${TMPDIR:-/tmp}/gpubench-data).
#
# python3 is the machine's own, with its own packages: nothing is installed; gpubench is
# imported from this checkout (PYTHONPATH). Each step is one python3 process under `timeout`
# (SIGINT at its box less a grace, SIGKILL at the box): gpubench run stops its pytest child
# in order, and every case that finished is on disk already (benchmark.json and the
# cases.jsonl journal, rewritten after each case). Then every process still carrying the
# step's marker (GPU_CHECK_STEP, inherited by all it started: pytest, rank and baseline
# workers, DataLoader workers) is killed, so the next step starts on an idle GPU.
#
# Budgets on the H200, from the gpu-small shapes (ResNet-50 b256 at 224 px: 25 GFLOP per image,
# 6.3 TFLOP per step; BERT-base b128 at 128 tokens: 8.7 TFLOP; GPT-2 124M b16 at 1024: 14 TFLOP)
# and these step times: ResNet-50 fp32 0.22 s, tf32 0.11 s (Lambda's 2,259 img/s), bf16 0.083 s
# (3,079 img/s), bf16 + channels_last 0.075 s; BERT fp32 0.22 s, bf16 0.035 s; GPT-2 fp32
# 0.35 s, bf16 0.055 s. A case costs its build (1.5-2.5 s: the first of a model initialises it
# on the CPU, later ones copy it; ResNet-50 also makes 1,024 random images, 1 s), its check
# (3 steps + the FP32 reference's forward and backward: about 4.3 steps), cuDNN's autotuning
# at each new convolution configuration (about 5 s per precision/layout/batch), 2 warm-up
# steps and timed rounds (--max-time 1.5: 1.5 s, at least 6 steps; --unpaired: no baseline
# step per round). A gpubench run costs, besides its cases, about 8 s to start (CLI, pytest,
# torch and transformers imports, each of its models validated once on the CPU: 1-2 s each;
# the matmul peaks are not measured again: the peaks step passes them on in
# GPUBENCH_MATMUL_PEAKS) and 5 s after them (summary and advice), plus 5 s per model in the
# headline step (its no_grad/del measurement, which the later steps leave out). The headline
# step's case lists also probe-build its three models once (each model's facts, kept on disk
# for the later steps and case processes, which read them in 0.4 s): 26 s on the 2-core
# development machine (scripts/gpu_check_budget.py), counted in full (an upper bound).
# scripts/gpu_check_budget.py runs each step's CPU-side work here at these shapes (docs/gpu.md).
#
#   step        budget  estimate  arithmetic
#   00 setup        5        1    python3, package metadata, selections: no torch, no model
#   01 peaks       25       13    nvidia-smi 1 s, torch 3 s, CUDA init 3-5 s, 5 peaks (bf16,
#                                 fp16, tf32, fp32, fp8) each 3 loops of 0.1 s after its sizing
#   02 headline   140      130    8 cases: resnet50 fp32 12 + tf32 10 + bf16 8.5 + bf16-cl 12;
#                                 bert fp32 7 + bf16 3; gpt2 fp32 7.5 + bf16 3 = 63; run 8 + 5
#                                 + 3 models x 5 (hygiene) + validation 5 + CUDA start 3 = 41;
#                                 the case lists' 3 probe builds (resnet50, bert, gpt2) 26;
#                                 63 + 41 + 26 = 130 (done by 170 s: the headline is in the
#                                 first 3 minutes)
#   03 more        70       52    resnet50-fp32-accum4-mb64 11.5 (autotune at b64); gpt2 build
#                                 2.5, adamw 5.5, adamw_fused 5.5, ckpt 7 (0.47 s steps),
#                                 bf16-ckpt 3.5 = 35.5; run 8 + 5 + 2 models validated 3
#   04 loader      55       42    4,096 JPEGs at 384 px in 16 processes 6-10 s; 2 resnet50 cases
#                                 at 8 workers (5 ms per image, 0.16 s a batch): loader probe
#                                 (11 batches, 4 s), check, rounds: w8 14 (build, autotune),
#                                 w8-pin-nb 9 = 23; run 8 + 5 - overlap
#   05 transfer    25       25    pytest without the suite's conftest (no model built): 8 cases of
#                                 1 GB per round, pageable at ~10 GB/s 4.5 s each, pinned 1.2 s
#   06 claims      35       30    claim-adamw-bert, 10 alternating rounds of two fp32 sides (0.23 s
#                                 each): 11 + build 2; run 8 + 5 + validation 2
#   in all        355      293    + about 1 s of bookkeeping after each step; GPU_CHECK_TOTAL 360
#
# No step's result depends on its budget being right: a step over its box is stopped (SIGINT,
# then SIGKILL) with every case it finished kept, and the steps after it keep their own budgets
# (each step's box ends at the sum of the budgets so far, and a step that ends early leaves its
# time to the next); never past GPU_CHECK_TOTAL (360 s) less the final 5 s.
# Environment: GPU_CHECK_STEPS=headline,transfer runs only those steps; GPU_CHECK_BUDGET_<step>=S
# overrides one budget; GPU_CHECK_TOTAL=S the whole; GPU_CHECK_WORK=DIR the work folder;
# GPU_CHECK_BANK=0 gives each step its own budget only (the tests' fixed boxes).
# Wheels in vendor/ (an ignored folder: e.g. torchao's, for the FP8 cases; the machine has no
# network) are unpacked into the work folder and put on PYTHONPATH.
#
# Exit status: 0 when every step that ran finished or was stopped by its box with cases kept;
# 1 when no step produced a case; 3 when cases were produced but a step failed; 2 usage.
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
WORK=${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
mkdir -p "$WORK" || exit 2
WORK=$(cd "$WORK" && pwd)
case "$WORK/" in "$OUT"/*) echo "gpu_check: the work folder must not lie in OUT" >&2; exit 2;; esac
# COLUMNS: pytest's lines (a skip's or failure's reason) are cut at the terminal's width.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=240
export GPUBENCH_DATA_DIR=${GPUBENCH_DATA_DIR:-${TMPDIR:-/tmp}/gpubench-data}
export GPU_CHECK_RUN=${GPU_CHECK_RUN:-$$-$(date +%s)}
TOOL=(python3 "$ROOT/scripts/gpu_check_tool.py")
rm -f "$OUT/gpu_check.md" "$OUT/gpu_check.json" "$OUT/gpu_check.tar.gz"
# The peaks step's file: every later step's MFU divides by these (measured once).
export GPUBENCH_MATMUL_PEAKS="$WORK/peaks/peaks.json"
# Wheels carried in vendor/ (no network on the machine), unpacked onto the path.
shopt -s nullglob
wheels=("$ROOT"/vendor/*.whl)
shopt -u nullglob
if (( ${#wheels[@]} )); then
    mkdir -p "$WORK/vendor"
    for w in "${wheels[@]}"; do
        python3 -m zipfile -e "$w" "$WORK/vendor" >/dev/null 2>&1 \
            || echo "gpu_check: could not unpack $w" >&2
    done
    export PYTHONPATH="$WORK/vendor:$PYTHONPATH"
fi

STEPS=(setup peaks headline more loader transfer claims)
declare -A BUDGET NUM
if [[ $MODE == gpu ]]; then
    BUDGET=([setup]=5 [peaks]=25 [headline]=140 [more]=70 [loader]=55 [transfer]=25
            [claims]=35)
    TOTAL=${GPU_CHECK_TOTAL:-360}
    PROFILE=gpu-small DEVICE=cuda
    RUN_ARGS=(--rounds 20 --warmup 2 --max-time 1.5)
    # One command of a case (build, check, rounds) past this fails as hung; the next runs.
    CASE_TIMEOUT=${GPU_CHECK_CASE_TIMEOUT:-90}
else
    # The rehearsal tests the plumbing, not the speed: boxes and a case time limit no shared
    # CPU machine reaches however loaded (the same commands), so that it passes or fails by
    # what the steps do, never by how fast this machine is.
    BUDGET=([setup]=600 [peaks]=600 [headline]=900 [more]=900 [loader]=900 [transfer]=600
            [claims]=900)
    TOTAL=${GPU_CHECK_TOTAL:-5400}
    PROFILE=smoke DEVICE=cpu
    RUN_ARGS=(--rounds 3 --warmup 0 --max-time 0.5)
    CASE_TIMEOUT=${GPU_CHECK_CASE_TIMEOUT:-1800}
fi
FINAL_RESERVE=5
for i in "${!STEPS[@]}"; do NUM[${STEPS[$i]}]=$(printf %02d "$i"); done
selected() { [[ -z "${GPU_CHECK_STEPS:-}" || ",${GPU_CHECK_STEPS}," == *",$1,"* ]]; }
START=$SECONDS
DEADLINE=0        # the sum of the budgets of the selected steps so far
STOP_REASON=""    # set when nothing further can run
FAILED=0

publish() {  # publish [--final]: gpu_check.md, .json and .tar.gz into OUT
    "${TOOL[@]}" publish "$WORK" "$OUT" "$MODE" --elapsed "$(( SECONDS - START ))" \
        --total "$TOTAL" "$@" >>"$WORK/publish.log" 2>&1
}

# DataLoader workers send their batches through /dev/shm: (8 workers x 2 prefetched + 1) x
# 154 MB for ResNet-50's b256 at 224 px, 2.6 GB. A container's default is 64 MiB; as root the
# check enlarges it to 8 GiB (else the loader cases skip with the reason).
SHM_NEED_GIB=8
ensure_shm() {
    local free
    free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1) || return 0
    [[ $free =~ ^[0-9]+$ ]] || return 0
    if (( free < SHM_NEED_GIB * 1024 * 1024 )) && [[ $(id -u) == 0 ]]; then
        mount -o "remount,size=${SHM_NEED_GIB}g" /dev/shm >>"$WORK/shm.log" 2>&1 \
            && echo "gpu_check: /dev/shm enlarged to ${SHM_NEED_GIB} GiB (had $(( free / 1024 )) MiB free)" \
                | tee -a "$WORK/shm.log"
    fi
    df -h /dev/shm >>"$WORK/shm.log" 2>&1
}

# The command of each step, in CMD (one python3 process: timeout signals it directly).
step_command() {
    local name=$1
    case $name in
        setup) CMD=("${TOOL[@]}" setup "$WORK" "$MODE") ;;
        peaks) CMD=("${TOOL[@]}" peaks "$WORK" "$MODE") ;;
        transfer)
            mkdir -p "$WORK/transfer"
            CMD=(python3 -m pytest benchmarks/test_transfer.py --noconftest -v
                 -p no:cacheprovider --rootdir="$ROOT"
                 --benchmark-json="$WORK/transfer/benchmark.json") ;;
        *)
            local models groups k args=()
            models=$(<"$WORK/setup/$name.models") && groups=$(<"$WORK/setup/$name.groups") \
                && k=$(<"$WORK/setup/$name.k") || return 1
            [[ -n $models ]] && args+=(--models "$models")
            [[ $name != loader ]] && args+=(--no-storage-probe)
            [[ $name == loader && $MODE == gpu ]] && ensure_shm
            # The no_grad/del measurement of each model, once: in the headline step.
            [[ $name != headline ]] && args+=(--no-hygiene)
            local rounds=("${RUN_ARGS[@]}")
            [[ $name == claims && $MODE == gpu ]] && rounds=(--rounds 10 --warmup 1 --max-time 2)
            CMD=(python3 -m gpubench run --profile "$PROFILE" --device "$DEVICE" "${rounds[@]}"
                 --timeout "$CASE_TIMEOUT" --no-charts --unpaired --groups "$groups" "${args[@]}"
                 -k "$k" --out "$WORK/$name") ;;
    esac
}

run_step() {
    local name=$1 note=$2
    selected "$name" || return 0
    local num=${NUM[$name]} tag="${NUM[$name]}-$name"
    local override="GPU_CHECK_BUDGET_$name"
    local budget=${!override:-${BUDGET[$name]}}
    DEADLINE=$(( DEADLINE + budget ))
    local results=--results
    [[ $name == setup || $name == peaks ]] && results=""
    if [[ -n $STOP_REASON ]]; then
        "${TOOL[@]}" status "$WORK" "$MODE" "$num" "$name" skipped "" "" "$budget" "" \
            "$STOP_REASON"
        echo "gpu_check: $tag skipped: $STOP_REASON"
        publish
        return 0
    fi
    local elapsed=$(( SECONDS - START ))
    local box=$(( DEADLINE - elapsed ))
    [[ ${GPU_CHECK_BANK:-1} == 0 ]] && box=$budget
    local cap=$(( TOTAL - FINAL_RESERVE - elapsed ))
    (( cap < box )) && box=$cap
    if (( box < 3 )); then
        "${TOOL[@]}" status "$WORK" "$MODE" "$num" "$name" skipped "" "" "$budget" "" \
            "no time left of the $TOTAL s budget"
        publish
        return 0
    fi
    local grace=$(( box / 5 ))
    (( grace > 15 )) && grace=15
    (( grace < 2 )) && grace=2
    if ! step_command "$name"; then
        "${TOOL[@]}" status "$WORK" "$MODE" "$num" "$name" failed "" "" "$budget" "$box" \
            "no selection (see 00-setup)"
        FAILED=1
        publish
        return 0
    fi
    echo "gpu_check: $tag (budget $budget s, box $box s) ..."
    "${TOOL[@]}" status "$WORK" "$MODE" "$num" "$name" running "" "" "$budget" "$box" "$note"
    publish
    local t0=$SECONDS
    # While the step runs, OUT is refreshed every GPU_CHECK_REPUBLISH_S seconds too: a kill of
    # the whole command keeps the cases this step has finished so far.
    rm -f "$WORK/.stop-republish"
    (
        while true; do
            for (( i = 0; i < ${GPU_CHECK_REPUBLISH_S:-20}; i++ )); do
                sleep 1
                [[ -e "$WORK/.stop-republish" ]] && exit 0
            done
            "${TOOL[@]}" status "$WORK" "$MODE" "$num" "$name" running "" \
                "$(( SECONDS - t0 ))" "$budget" "$box" "$note" $results
            publish
        done
    ) &
    local republisher=$!
    # SIGINT at box - grace (gpubench run and pytest stop in order), SIGKILL at the box.
    GPU_CHECK_STEP="$GPU_CHECK_RUN:$tag" timeout --signal=INT --kill-after="$grace" \
        "$(( box - grace ))" "${CMD[@]}" >"$WORK/$tag.log" 2>&1
    local rc=$?
    local seconds=$(( SECONDS - t0 ))
    touch "$WORK/.stop-republish"
    wait "$republisher"
    local leftovers
    leftovers=$("${TOOL[@]}" reap "$GPU_CHECK_RUN:$tag")
    local status=ok
    if (( rc == 124 || rc == 137 )); then
        status="timed out"
    elif (( rc != 0 )); then
        status=failed
        FAILED=1
    fi
    "${TOOL[@]}" status "$WORK" "$MODE" "$num" "$name" "$status" "$rc" "$seconds" "$budget" \
        "$box" "$note" $results --leftovers "$leftovers"
    echo "gpu_check: $tag: $status (exit $rc, $seconds s; leftovers $leftovers)"
    publish
}

echo "gpu_check: $MODE run into $OUT (budget $TOTAL s); work in $WORK; data in $GPUBENCH_DATA_DIR"
publish
run_step setup "python3, its packages, gpubench from the checkout; the case selections"
if [[ -f "$WORK/00-setup.json" ]] && ! grep -q '"status": "ok"' "$WORK/00-setup.json"; then
    STOP_REASON="setup failed: see 00-setup.log"
fi
run_step peaks "nvidia-smi, CUDA initialisation, the matmul peak per precision"
if [[ -z $STOP_REASON && $MODE == gpu && -f "$WORK/peaks/driver.json" ]] \
        && grep -q '"cuda_usable": false' "$WORK/peaks/driver.json"; then
    STOP_REASON="CUDA is not usable here: see 01-peaks.log"
fi
run_step headline "ResNet-50 fp32/tf32/bf16/bf16+channels_last, BERT and GPT-2 fp32/bf16"
run_step more "accumulation, fused AdamW, empty_cache, expandable segments, checkpointing"
run_step loader "JPEG loader at the knob workers (pinned, cold), its data generated first"
run_step transfer "host-to-device copies, pageable/pinned, blocking/non_blocking"
run_step claims "claims pairs in alternating rounds"
publish --final
code=$?
cat "$OUT/gpu_check.md" 2>/dev/null
echo "gpu_check: done in $(( SECONDS - START )) s; OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
(( code != 0 )) && { echo "gpu_check: no step produced a case" >&2; exit 1; }
(( FAILED )) && exit 3
exit 0
