# Set up a shell on a GPU machine that reaches no package index, for the harness. Source it from
# the repository root, with .whl/ (from scripts/device_wheels.sh) and .device-commit (from
# scripts/stamp_commit.sh) copied along:
#
#   . scripts/device_setup.sh && python -m harness sweep +exp=llama8b_h200
#
# It installs the wheels of .whl/ into /tmp/site (the machine's own packages stay untouched; they
# must already hold torch, triton, numpy and the rest of the `harness` extra but Hydra), puts
# /tmp/site and this checkout on PYTHONPATH (so `forge` and `harness` import without a pip install
# of the project), points the records' commit at .device-commit, and keeps NVLink multicast off.
# A script it starts that sources it again (scripts/device_sweep.sh) inherits all of that and
# skips the install.
if [ "${FORGE_DEVICE_SETUP_DONE:-}" = "$PWD" ]; then
  return 0 2>/dev/null || exit 0
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1 2>/dev/null || exit 1
else
  echo "device_setup: no .whl/ here (run scripts/device_wheels.sh and copy .whl along); Hydra will be missing" >&2
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# The records' commit: the stamp of scripts/stamp_commit.sh, not whatever .git the copy holds.
if [ -f .device-commit ]; then
  export FORGE_BENCH_COMMIT_STAMP="$PWD/.device-commit"
else
  echo "device_setup: no .device-commit (run scripts/stamp_commit.sh and copy it along); records get .git's commit" >&2
fi
# NVLink multicast off, also for the worker subprocesses and torchrun's ranks.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import torch, hydra; print('device_setup: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'hydra', hydra.__version__)"
export FORGE_DEVICE_SETUP_DONE="$PWD"
