#!/usr/bin/env bash
# Run (or resume) a sweep on the GPU machine inside one device command's time limit, and hand
# back the results files it wrote. From the repository root, with .whl carried:
#
#   bash scripts/device_sweep.sh +exp=llama8b_h200 'sweep.batch_sizes=[1,2]' 'sweep.seq_lens=[1024]'
#
# The sweep gets SWEEP_BUDGET_S seconds (default 540), then a Ctrl-C: the running point's worker
# is killed, every finished point is already on disk. The JSONL files written during this call
# are copied to $OUT; put them back under results/ here and the same command resumes the sweep.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_setup.sh || exit 1
marker=$(mktemp)
timeout -s INT -k 30 "${SWEEP_BUDGET_S:-540}" python3 -m harness sweep "$@"
rc=$?
out=${OUT:-results/out}
mkdir -p "$out"
find results -name '*.jsonl' -newer "$marker" -exec cp {} "$out"/ \; -print
exit $rc
