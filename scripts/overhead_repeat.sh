#!/usr/bin/env bash
# Repeat the harness-overhead benchmark (benchmarks/test_overhead.py: gpubench's step against a
# hand-written loop, interleaved in one process) N times on the cpu profile and report, per
# model, how many runs read within +-1% and every run's figure. Each run is a fresh process, so
# the count says how often a user's run would. Usage: scripts/overhead_repeat.sh [N] [OUT]
set -euo pipefail
N=${1:-10}
OUT=${2:-/tmp/gpubench-overhead}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
for i in $(seq 1 "$N"); do
  python -m pytest benchmarks/test_overhead.py -q -p no:cacheprovider --gpubench-profile cpu \
    -k test_harness_overhead --benchmark-json="$OUT/run$i.json" > "$OUT/run$i.log"
  echo "run $i done"
done
python - "$OUT" "$N" <<'PY'
import json, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for i in range(1, n + 1):
    for b in json.loads((out / f"run{i}.json").read_text())["benchmarks"]:
        e = b["extra_info"]
        if "harness_overhead" in e:
            rows.setdefault(e["model"], []).append(e["harness_overhead"])
for model, values in sorted(rows.items()):
    good = sum(abs(v) <= 0.01 for v in values)
    shown = ", ".join(f"{v:+.2%}" for v in values)
    print(f"{model:10s} {good}/{len(values)} within +-1%; runs: {shown}")
PY
