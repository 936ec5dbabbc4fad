#!/usr/bin/env bash
# Tensor-parallel runs on the 2-GPU device kind (nvidia-h200-x2), from the repository root with
# .whl carried (scripts/device_wheels.sh). One device command each (10 minutes at most):
#
#   bash scripts/device_tp2.sh exactness            # TP=2 FORGE == TP torch.optim == 1-GPU FORGE, real size
#   bash scripts/device_tp2.sh +exp=tp2_h200        # the sweep (resumable: bring results/ back, rerun)
#   bash scripts/device_tp2.sh +exp=tp2_capacity_40gb
#
# NVLink multicast stays off (device_setup.sh exports the NCCL settings; the harness launcher
# sets them again for its torchrun workers).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "exactness" ]; then
  shift
  . scripts/device_setup.sh || exit 1
  out=${OUT:-results/out}
  mkdir -p "$out"
  torchrun --standalone --nproc-per-node=2 scripts/gpu_tp_exactness.py "$@" 2>&1 | tee "$out/tp_exactness.txt"
  exit "${PIPESTATUS[0]}"
fi
exec bash scripts/device_sweep.sh "$@"
