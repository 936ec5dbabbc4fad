#!/usr/bin/env bash
# Tensor-parallel runs on the 2-GPU device kind (nvidia-h200-x2), from the repository root with
# .whl and .device-commit carried (scripts/device_wheels.sh, scripts/stamp_commit.sh). Steps run in
# order, in one device command (10 minutes at most):
#
#   exactness   TP=2 FORGE == TP torch.optim == 1-GPU FORGE at a real size, with torch.optim's own
#               TP-vs-one-GPU gap as the control (scripts/gpu_tp_exactness.py; 3 minutes at most)
#   profile     where a TP=2 step's time goes, fused AdamW and FORGE bf16 on Llama-3.1-8B, b1 s2048
#               (scripts/gpu_profile_step.py under torchrun; JSON to $OUT; 2 minutes each at most)
#   anything else: sweep steps for scripts/device_sweep.sh, which shares SWEEP_BUDGET_S among them
#
#   bash scripts/device_tp2.sh exactness profile '+exp=tp2_capacity_40gb sweep.models=[qwen3-14b]'
#   bash scripts/device_tp2.sh '+exp=tp2_h200'     # resumable: bring results/ back, rerun
#
# NVLink multicast stays off (device_setup.sh exports the NCCL settings; the harness launcher
# sets them again for its torchrun workers).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_setup.sh || exit 1
out=${OUT:-results/out}
mkdir -p "$out"
rc=0
sweeps=()
for step in "$@"; do
  case "$step" in
    exactness)
      timeout -k 10 180 torchrun --standalone --nproc-per-node=2 scripts/gpu_tp_exactness.py \
        >"$out/tp_exactness.txt" 2>&1 || rc=$?
      grep -E "^(hidden|TP |losses|       |DCP|PASS|FAIL)" "$out/tp_exactness.txt"
      ;;
    profile)
      for method in fused_adamw forge_bf16; do
        OUT="$out" PROFILE_WARMUP=3 PROFILE_STEPS=3 timeout -k 10 120 torchrun --standalone \
          --nproc-per-node=2 scripts/gpu_profile_step.py "method=$method" model=llama3.1-8b \
          batch_size=1 seq_len=2048 gpus=2 >"$out/profile_tp2_$method.log" 2>&1 || rc=$?
        grep -E '"(point|step_ms|gpu_busy_ms|idle_frac|kernels_per_step)"' "$out/profile_tp2_$method.log"
      done
      ;;
    *) sweeps+=("$step") ;;
  esac
done
if [ "${#sweeps[@]}" -gt 0 ]; then
  bash scripts/device_sweep.sh "${sweeps[@]}" || rc=$?
fi
exit $rc
