#!/usr/bin/env bash
# Run steps of measurement on a GPU machine that reaches no package index, inside one time budget,
# and hand back what they wrote. From the repository root, after `scripts/device_wheels.sh` and
# `scripts/stamp_commit.sh` on a connected machine, with .whl/ and .device-commit copied along
# (and, for convergence sweeps, the prepared corpora under .cache/convergence/, or `python3 -m
# harness data` run there first: docs/offline-gpu.md):
#
#   bash scripts/device_sweep.sh '+exp=llama8b_h200 sweep.batch_sizes=[1,2] sweep.seq_lens=[1024]'
#   bash scripts/device_sweep.sh tests '+exp=convergence' '+exp=qwen3_scaling_h200'
#   bash scripts/device_sweep.sh 'tests | +exp=convergence sweep.methods=[torch_adamw_fp32]'
#
# Each argument is one step, run in order:
#   tests [PATHS]        the GPU tests (`pytest -m gpu PATHS`, default tests/; files or node ids,
#                        e.g. 'tests tests/forge/test_gpu_muon.py')
#   overlap [ARGS]       where the fused kernel's time goes and its design candidates
#                        (`python -m harness.kernels.overlap ARGS`; JSONL to $OUT), e.g.
#                        'overlap --update-programs --shapes gate --tokens 1024 4096'
#   kernels [ARGS]       the kernel benchmark (`python -m harness kernels ARGS`, e.g. 'kernels --quick')
#   tune [GROUPS]        times candidate launch configs (`python -m harness kernels --tune`; GROUPS
#                        from harness.kernels.build.candidate_groups, e.g. 'tune wide', default all;
#                        or the tuner's options, e.g. 'tune --groups narrow --points k qwen_k')
#   profile OVERRIDES    where one point's step time goes (`python -m harness.kernels.profile`; JSON
#                        to $OUT), e.g. 'profile method=forge_bf16 model=llama3.1-8b seq_len=2048';
#                        with gpus=N (N > 1) under torchrun, one process per GPU
#   graph-peak OVERRIDES why one point's graphed peak differs from its eager one
#                        (`python -m harness.kernels.graph_peak`; JSON to $OUT), e.g.
#                        'graph-peak method=no_optimizer model=llama3.1-8b batch_size=4'
#   launch               the host cost of a FORGE layer, layer by layer (harness.kernels.launch_breakdown
#                        on Llama-3.1-8B's k_proj and Qwen3-0.6B's q_proj; JSON to $OUT)
#   elementwise          the element-wise update at other block shapes (harness.kernels.elementwise)
#   newton-schulz [ARGS] each Newton-Schulz variant of FORGE's Muon per hidden matrix shape
#                        (`python -m harness.kernels.newton_schulz ARGS`; JSONL to $OUT), then
#                        `--auto` on its records: the steps after it run with forge's AUTO table
#                        filled from them (commit the same table with `--auto` on the copied file)
#   tp-exactness         tensor-parallel FORGE == torch.optim at a real size (2 GPUs, torchrun)
#   reference-exactness  the paper's FORGE and ours against the fp64 AdamW step, beside torch.optim
#                        (`python -m harness.kernels.reference_exactness`; JSON to $OUT; needs the
#                        fused_grad_optimizer wheel in .whl/)
#   anything else        the overrides of one `python -m harness sweep` (split on spaces, never
#                        glob-expanded)
# Parts joined by ' | ' inside one step run at the same time (`tests` among them too): only for
# convergence sweeps and tests, which claim losses and correctness, not step times. The step ends
# when all its parts have.
#
# All steps share SWEEP_BUDGET_S seconds (default 540); at the deadline a running sweep gets a
# Ctrl-C (its running points' workers are killed; every finished point is already on disk) and
# the steps not started are listed. The JSONL files written here and the log go to $OUT (default
# results/out); put the JSONL back under results/ and the same command resumes where it stopped.
# A copy of every results file written is also kept in .device-results/ (ignored by git): where the
# machine keeps its disk between runs but the results/ tree is replaced by each copy of the
# checkout, its records come back before the steps start, so a resumed sweep skips them.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_setup.sh || exit 1
set -f  # from here on, overrides like sweep.batch_sizes=[1,2] are not file patterns
out=${OUT:-results/out}
mkdir -p "$out"
log="$out/device_sweep.log"
marker=$(mktemp)
kept=.device-results
python3 - "$kept/results" results <<'PY' | tee -a "$log"
import sys
from pathlib import Path

from harness.results import merge_missing_records

kept, results = sys.argv[1:]
if Path(kept).is_dir():
    for name, count in merge_missing_records(kept, results).items():
        print(f"device_sweep: {count} records kept from an earlier run back in {results}/{name}")
PY
deadline=$(($(date +%s) + ${SWEEP_BUDGET_S:-540}))
rc=0

# The number N of gpus=N among the overrides of a step (1 without one).
gpus_of() {
  local word
  for word in "$@"; do
    case "$word" in gpus=*) echo "${word#gpus=}"; return ;; esac
  done
  echo 1
}

for step in "$@"; do
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt 20 ]; then
    echo "device_sweep: out of time, not started: $step" | tee -a "$log"
    rc=124
    continue
  fi
  echo "device_sweep: [$step] with ${left} s left" | tee -a "$log"
  start=$(($(wc -l <"$log") + 1))
  first=${step%% *}
  rest=${step#"$first"}
  rest=${rest# }
  case "$first" in
    kernels)
      # shellcheck disable=SC2086  # one option per word
      timeout -k 10 "$left" python3 -m harness kernels $rest >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | tail -n 40
      continue
      ;;
    tune)
      case "$rest" in
        "" | --*) ;;                 # nothing, or the tuner's own options
        *) rest="--groups $rest" ;;  # candidate group names
      esac
      # shellcheck disable=SC2086  # one option or name per word
      timeout -k 10 "$left" python3 -m harness kernels --tune $rest >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | tail -n 25
      continue
      ;;
    graph-peak)
      # shellcheck disable=SC2086  # one override per word
      OUT="$out" timeout -k 10 "$left" python3 -m harness.kernels.graph_peak $rest >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | grep -E '"(point|peak_gib|phase|site|difference_gib)"' | head -n 16
      continue
      ;;
    profile)
      # shellcheck disable=SC2086  # one override per word
      gpus=$(gpus_of $rest)
      if [ "$gpus" -gt 1 ]; then
        # shellcheck disable=SC2086
        OUT="$out" timeout -k 10 "$left" torchrun --standalone --nproc-per-node="$gpus" \
          -m harness.kernels.profile $rest >>"$log" 2>&1 || rc=$?
      else
        # shellcheck disable=SC2086
        OUT="$out" timeout -k 10 "$left" python3 -m harness.kernels.profile $rest >>"$log" 2>&1 || rc=$?
      fi
      tail -n +"$start" "$log" | grep -E '"(point|step_ms|gpu_busy_ms|idle_frac)"' | head -n 8
      continue
      ;;
    launch)
      for shape in "1024 1024 4096" "1024 2048 1024"; do  # Llama-3.1-8B's k_proj, Qwen3-0.6B's q_proj
        # its record: $OUT/launch-breakdown-<T>x<N>x<K>-<date>-<commit>.json
        # shellcheck disable=SC2086  # three words: T N K
        OUT="$out" timeout -k 10 "$left" python3 -m harness.kernels.launch_breakdown --shape $shape \
          >>"$log" 2>&1 || rc=$?
      done
      tail -n +"$start" "$log" | grep -E '^(T=|path|mm|wgrad|update|nn\.|Forge|elementwise|vector)' | head -n 44
      continue
      ;;
    elementwise)
      OUT="$out" timeout -k 10 "$left" python3 -m harness.kernels.elementwise >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | tail -n 8
      continue
      ;;
    newton-schulz)
      # shellcheck disable=SC2086  # one option per word
      OUT="$out" timeout -k 10 "$left" python3 -m harness.kernels.newton_schulz $rest >>"$log" 2>&1 || rc=$?
      newest=$(ls -t "$out"/newton-schulz-*.jsonl 2>/dev/null | head -n 1)
      [ -n "$newest" ] && python3 -m harness.kernels.newton_schulz --auto "$newest" >>"$log" 2>&1
      tail -n +"$start" "$log" | tail -n 50
      continue
      ;;
    overlap)
      # shellcheck disable=SC2086  # one option per word
      timeout -k 10 "$left" python3 -m harness.kernels.overlap $rest --out "$out" >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | tail -n 20
      continue
      ;;
    reference-exactness)
      limit=$((left < 180 ? left : 180))
      # shellcheck disable=SC2086  # one case name per word
      OUT="$out" timeout -k 10 "$limit" python3 -m harness.kernels.reference_exactness $rest \
        >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | tail -n 6
      continue
      ;;
    tp-exactness)
      limit=$((left < 180 ? left : 180))
      timeout -k 10 "$limit" torchrun --standalone --nproc-per-node=2 -m harness.kernels.tp_exactness \
        >>"$log" 2>&1 || rc=$?
      tail -n +"$start" "$log" | grep -E "^(hidden|TP |losses|       |DCP|PASS|FAIL)"
      continue
      ;;
  esac
  IFS='|' read -ra parts <<<"$step"
  pids=()
  tests_log=
  for overrides in "${parts[@]}"; do
    # shellcheck disable=SC2086  # trims the part's spaces
    words=($overrides)
    if [ "${words[0]:-}" = tests ]; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >>"$log"
      tests_log=$(mktemp)
      paths=("${words[@]:1}")
      [ ${#paths[@]} -gt 0 ] || paths=(tests)
      timeout -k 10 "$left" python3 -m pytest -o addopts="-ra --strict-markers" -m gpu "${paths[@]}" -q \
        -p no:cacheprovider >"$tests_log" 2>&1 &
    else
      # shellcheck disable=SC2086  # word splitting is the point: one override per word
      timeout -s INT -k 30 "$left" python3 -m harness sweep $overrides >>"$log" 2>&1 &
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || rc=$?
  done
  if [ -n "$tests_log" ]; then
    cat "$tests_log" >>"$log"  # after the sweeps' lines, so the summary ends the tail below
  fi
  tail -n +"$start" "$log" | tr '\r' '\n' | grep -v 'point/s' | tail -n 40
done
mkdir -p "$kept"
find results -name '*.jsonl' -newer "$marker" -exec cp {} "$out"/ \; -exec cp --parents {} "$kept"/ \; -print
exit $rc
