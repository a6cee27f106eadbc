#!/usr/bin/env bash
# Does `gpubench compare --confirm` pass runs of one commit and still catch a planted slowdown?
# TRIES+1 runs back to back; each run compared with the one before, with and without
# --confirm, and (from the third run) with --confirm against the two before pooled; then a run
# with a 10% slowdown planted in one bf16 case (scripts/planted_slowdown_workload.py),
# compared with --confirm against the last run and the last two (its re-measurement keeps the
# slowdown, as new code would).
#   scripts/confirm_gate_trials.sh OUT [TRIES] [extra gpubench run options]
# What runs:
#   default      a slice: the planted-slowdown MLP's precision and optimizer cases at 5 rounds
#                (MODEL=SPEC and GROUPS_=a,b choose another model and groups)
#   PROFILE=cpu  the whole cpu profile at its defaults (resnet18, bert, gpt2, every group;
#                charts off), the slowdown planted in bert-bf16 through a bert that can sleep
# COMPARE_ONLY=1 redoes the comparisons on the runs already in OUT; ONE_BASE=1 skips the tries'
# comparisons against two base runs (each --confirm re-measures the flagged cases on the base
# code and the new code, alternating: a minute or two a comparison).
set -uo pipefail
OUT=${1:?usage: $0 OUT [TRIES] [run options]}
TRIES=${2:-10}
shift 2 2>/dev/null || shift $#
PLANTED=scripts/planted_slowdown_workload.py
if [ -n "${PROFILE:-}" ]; then
  RUN=(--profile "$PROFILE" --no-charts "$@")
  SLOW_RUN=(--models "resnet18,$PLANTED:bert,gpt2")
  CONFIRM=(--confirm)
  SLOWED=bert-bf16
else
  MODEL=${MODEL:-$PLANTED:workload}
  RUN=(--profile cpu --model "$MODEL" --groups "${GROUPS_:-precision,optimizer}" --rounds 5
       --no-charts --no-hygiene "$@")
  SLOW_RUN=()
  CONFIRM=(--confirm --confirm-args "--rounds 5")
  SLOWED=-bf16
fi
mkdir -p "$OUT"
run() {  # run NAME [options]: one run into OUT/NAME, unless only comparing
  local name=$1
  shift
  [ -n "${COMPARE_ONLY:-}" ] || gpubench run "${RUN[@]}" "$@" --out "$OUT/$name" \
    > "$OUT/$name.log" 2>&1
}
rm -f "$OUT/trials.txt"
run r0
for i in $(seq 1 "$TRIES"); do
  run "r$i"
  gpubench compare "$OUT/r$((i-1))/benchmark.json" "$OUT/r$i/benchmark.json" --new-only \
    > "$OUT/plain$i.txt" 2>&1
  plain=$?
  gpubench compare "$OUT/r$((i-1))/benchmark.json" "$OUT/r$i/benchmark.json" --new-only \
    "${CONFIRM[@]}" > "$OUT/confirm$i.txt" 2>&1
  confirmed=$?
  two=-
  if [ "$i" -ge 2 ] && [ -z "${ONE_BASE:-}" ]; then
    gpubench compare "$OUT/r$((i-2))/benchmark.json" "$OUT/r$((i-1))/benchmark.json" \
      "$OUT/r$i/benchmark.json" --new-only "${CONFIRM[@]}" > "$OUT/confirm2-$i.txt" 2>&1
    two=$?
  fi
  echo "try $i: plain gate exit $plain, confirmed gate exit $confirmed, confirmed on two base runs exit $two" \
    | tee -a "$OUT/trials.txt"
done
SLOW=$(python -c "import json,sys; d=json.load(open(sys.argv[1])); print(0.10*next(
  b['extra_info']['step_time_s'] for b in d['benchmarks']
  if b['extra_info'].get('case_id','').endswith(sys.argv[2])))" "$OUT/r$TRIES/benchmark.json" \
  "$SLOWED")
export GPUBENCH_PLANTED_SLOW_S=$SLOW
run slow "${SLOW_RUN[@]}"
gpubench compare "$OUT/r$TRIES/benchmark.json" "$OUT/slow/benchmark.json" --new-only \
  "${CONFIRM[@]}" > "$OUT/confirm-slow.txt" 2>&1
one=$?
gpubench compare "$OUT/r$((TRIES-1))/benchmark.json" "$OUT/r$TRIES/benchmark.json" \
  "$OUT/slow/benchmark.json" --new-only "${CONFIRM[@]}" > "$OUT/confirm2-slow.txt" 2>&1
echo "planted ${SLOW}s (10% of the $SLOWED step): confirmed gate exit $one, on two base runs exit $?" \
  | tee -a "$OUT/trials.txt"
