#!/usr/bin/env bash
# Repeat the no-op techniques of the cpu profile (tf32 and empty_cache do nothing on a CPU;
# zero_grad fill costs little on these small models, and measurably on resnet18) N times and report how often
# each reads 1.00x within +-3% with a paired interval that contains 1.0 (README, "How speedups
# are measured"). Usage: [ROUNDS=R] scripts/noop_repeat.sh [N] [OUT] (ROUNDS fixes the timed
# rounds per case; default: the cpu profile's budget, 12 rounds, more for fast steps up to 0.6 s)
set -euo pipefail
N=${1:-10}
OUT=${2:-/tmp/gpubench-noop}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
for i in $(seq 1 "$N"); do
  python -m pytest benchmarks/test_training_step.py -q -p no:cacheprovider \
    --gpubench-profile cpu --gpubench-groups precision,memory ${ROUNDS:+--gpubench-rounds $ROUNDS} \
    -k "tf32 or emptycache or zerofill" --benchmark-json="$OUT/run$i.json" > "$OUT/run$i.log"
  echo "run $i done"
done
python - "$OUT" "$N" <<'PY'
import json, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
hits = {}
for i in range(1, n + 1):
    for b in json.loads((out / f"run{i}.json").read_text())["benchmarks"]:
        e = b["extra_info"]
        if "speedup_paired" not in e:
            continue
        ok = abs(e["speedup_paired"] - 1) <= 0.03 and \
            e["speedup_paired_low"] <= 1 <= e["speedup_paired_high"]
        hits.setdefault(e["case_id"], []).append(
            (ok, e["speedup_paired"], e["speedup_paired_low"], e["speedup_paired_high"]))
for case, rows in sorted(hits.items()):
    good = sum(r[0] for r in rows)
    spread = ", ".join(f"{r[1]:.3f}" for r in rows)
    print(f"{case:32s} {good}/{len(rows)} within +-3% with 1.0 in the interval; speedups {spread}")
PY
