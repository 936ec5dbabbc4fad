#!/usr/bin/env bash
# Run (or resume) sweeps on the GPU machine inside one device command's time limit, and hand back
# the results files they wrote. From the repository root, with .whl (and, for convergence sweeps,
# .cache/convergence/v8192) carried:
#
#   bash scripts/device_sweep.sh '+exp=llama8b_h200 sweep.batch_sizes=[1,2] sweep.seq_lens=[1024]'
#   bash scripts/device_sweep.sh tests '+exp=convergence' '+exp=qwen3_scaling_h200'
#
# Each argument is one step, run in order: `tests` runs tests/test_gpu.py and tests/test_gpu_graphs.py;
# `tune [GROUPS]` times the fused kernel's candidate launch configs (`python -m harness kernels
# --tune`, results/kernels/tuning-*; GROUPS: names from harness.kernel_build.candidate_groups,
# e.g. 'tune wide', default all; or the tuner's own options, e.g.
# 'tune --groups narrow --points k qwen_k');
# `profile OVERRIDES` profiles one point (scripts/gpu_profile_step.py: GPU busy time, top kernels,
# host time per autograd node; its JSON goes to $OUT), e.g.
# 'profile method=forge_bf16 model=llama3.1-8b seq_len=2048 activation_checkpointing=true';
# `launch` times the fused update's launch path layer by layer (scripts/measure_launch_breakdown.py
# on two shapes, then scripts/measure_launch_host.py; JSON to $OUT);
# anything else is the overrides of one `python -m harness sweep` (split on spaces, never
# glob-expanded). Parts joined
# by ' | ' inside one step run at the same time (`tests` among them too): only for convergence
# sweeps and tests, which claim losses and correctness, not step times. The step ends when all
# its parts have, e.g.
#
#   bash scripts/device_sweep.sh 'tests | +exp=convergence sweep.methods=[torch_adamw_fp32]'

#
# All steps share SWEEP_BUDGET_S seconds (default 540); at the deadline a running sweep gets a
# Ctrl-C (its running points' workers are killed; every finished point is already on disk) and
# the steps not started are listed. The JSONL files written during this call and the log go to
# $OUT; put the JSONL back under results/ here, and the same command resumes where it stopped
# (on a machine still warm it resumes even before that: .device-results/, below).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_setup.sh || exit 1
set -f  # from here on, overrides like sweep.batch_sizes=[1,2] are not file patterns
out=${OUT:-results/out}
mkdir -p "$out"
log="$out/device_sweep.log"
marker=$(mktemp)
# Each call replaces results/ with the sender's tree; .device-results/ (ignored by git) outlives
# the call on a warm machine, so an earlier call's records come back here even if they were not
# copied home in between (a resumed sweep would otherwise run its finished points again).
kept=.device-results
python3 scripts/merge_device_results.py "$kept/results" results | tee -a "$log"
deadline=$(($(date +%s) + ${SWEEP_BUDGET_S:-540}))
rc=0
for step in "$@"; do
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt 20 ]; then
    echo "device_sweep: out of time, not started: $step" | tee -a "$log"
    rc=124
    continue
  fi
  echo "device_sweep: [$step] with ${left} s left" | tee -a "$log"
  start=$(($(wc -l <"$log") + 1))
  if [ "${step%% *}" = tune ]; then
    options=${step#tune}
    options=${options# }
    case "$options" in
      "" | --*) ;;                       # nothing, or the tuner's own options
      *) options="--groups $options" ;;  # candidate group names
    esac
    # shellcheck disable=SC2086  # one option or name per word
    timeout -k 10 "$left" python3 -m harness kernels --tune $options >>"$log" 2>&1 || rc=$?
    tail -n +"$start" "$log" | tail -n 25
    continue
  fi
  if [ "$step" = launch ]; then
    for shape in "1024 1024 4096" "1024 2048 1024"; do  # Llama-3.1-8B's k_proj, Qwen3-0.6B's q_proj
      # shellcheck disable=SC2086  # three words: T N K
      OUT="$out" timeout -k 10 "$left" python3 scripts/measure_launch_breakdown.py --shape $shape >>"$log" 2>&1 || rc=$?
      mv "$out/launch_breakdown.json" "$out/launch_breakdown_${shape// /x}.json" 2>/dev/null
    done
    timeout -k 10 "$left" python3 scripts/measure_launch_host.py >>"$log" 2>&1 || rc=$?
    tail -n +"$start" "$log" | tail -n 20
    continue
  fi
  if [ "${step%% *}" = profile ]; then
    # shellcheck disable=SC2086  # one override per word
    OUT="$out" timeout -k 10 "$left" python3 scripts/gpu_profile_step.py ${step#profile} >>"$log" 2>&1 || rc=$?
    tail -n +"$start" "$log" | grep -E '"(point|step_ms|gpu_busy_ms|idle_frac)"' | head -n 8
    continue
  fi
  IFS='|' read -ra parts <<<"$step"
  pids=()
  tests_log=
  for overrides in "${parts[@]}"; do
    if [ "$(echo $overrides)" = tests ]; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >>"$log"
      tests_log=$(mktemp)
      timeout -k 10 "$left" python3 -m pytest tests/test_gpu.py tests/test_gpu_graphs.py -q -p no:cacheprovider >"$tests_log" 2>&1 &
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
