#!/usr/bin/env bash
# One device call for kernel work: GPU tests, offline config tuning, then the kernel benchmark.
# Run from the repository root on the GPU machine, with .whl carried:
#   bash scripts/gpu_kernels.sh [quick|full|tune-only]
# Logs and JSONL results are copied into $OUT (when set) so they come back.
set -uo pipefail
mode=${1:-quick}
. scripts/device_setup.sh || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out" results/kernels
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/nvidia-smi.txt"
python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$out/test_gpu.log" | tail -15
if [ "$mode" != "full" ]; then
  python3 -m harness kernels --tune 2>&1 | tee "$out/tune.log" | tail -5
fi
if [ "$mode" = "quick" ]; then
  python3 -m harness kernels --quick --models llama3.1-8b 2>&1 | tee "$out/kernels.log" | tail -40
elif [ "$mode" = "full" ]; then
  python3 -m harness kernels 2>&1 | tee "$out/kernels.log" | tail -20
fi
cp results/kernels/*.jsonl "$out/" 2>/dev/null
ls -la "$out"
