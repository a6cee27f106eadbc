#!/usr/bin/env bash
# One-shot GPU check: the gpu-small profile on a CUDA machine, JSON + summary + charts into $1.
# Expects gpubench installed (README, command 1). Budget: under 8 minutes on one H100/H200.
set -euo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTPUT_DIR}
python - <<'PY'
import torch
assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device"
print("CUDA devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PY
timeout 460 gpubench run --profile gpu-small --device cuda --rounds 20 --out "$out"
