#!/usr/bin/env bash
# Download the wheels a GPU machine without a package index lacks into .whl/ (Python 3.12,
# manylinux x86_64), for scripts/device_setup.sh to install there: the part of the `harness` extra
# its image does not have (hydra-core, omegaconf and antlr4-python3-runtime, built here from its
# sdist) and the rival methods of the `baselines` extra.
#
#   bash scripts/device_wheels.sh            # once; then copy .whl/ along with the tree
#   FORGE_REFERENCE_SRC=../FORGE bash scripts/device_wheels.sh   # also the paper's own FORGE
#
# The paper's implementation (package fused_grad_optimizer, Apache-2.0) is not on the package
# index: with FORGE_REFERENCE_SRC naming a checkout of it (`git clone https://github.com/dk4248/FORGE`),
# a pure-Python wheel of it is built here from that checkout, without its dependencies (torch,
# triton, ninja; ninja only serves its optional CUTLASS kernels, which the harness does not use).
#
# Expected on the GPU image (not fetched): torch, triton, numpy (the core), transformers,
# tokenizers, pandas, matplotlib, nvidia-ml-py (the rest of the `harness` extra), PyYAML,
# packaging, tqdm. bitsandbytes ships one CUDA library per CUDA version (43 MB); only the CPU,
# CUDA 13.0 and 13.2 libraries are kept (the image's torch is cu130), so the bundle stays far
# under a 64 MiB transfer limit.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl

PY=${PYTHON:-python3}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
WHEELS=(
  hydra-core==1.3.2            # needs omegaconf, antlr4 4.9.*, packaging (on the image)
  omegaconf==2.3.0             # needs antlr4 4.9.*, PyYAML (on the image)
  bitsandbytes==0.50.2         # needs torch, numpy, packaging (on the image)
  torchao==0.18.0
  lomo-optim==0.1.1            # needs torch, transformers (on the image)
  flashoptim==0.1.4            # needs torch, triton (on the image)
)

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"

# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 pins) exists only as an sdist: build a
# pure-Python wheel from it here.
ls .whl/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 ||
  "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w .whl antlr4-python3-runtime==4.9.3

if [ -n "${FORGE_REFERENCE_SRC:-}" ]; then
  [ -f "$FORGE_REFERENCE_SRC/src/fused_grad_optimizer/__init__.py" ] || {
    echo "device_wheels: FORGE_REFERENCE_SRC=$FORGE_REFERENCE_SRC is not a checkout of" \
      "https://github.com/dk4248/FORGE (no src/fused_grad_optimizer/); clone it and point there" >&2
    exit 1
  }
  rm -f .whl/fused_grad_optimizer-*.whl
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$FORGE_REFERENCE_SRC"
fi

# Strip bitsandbytes' libraries for other CUDA versions, ROCm and XPU.
"$PY" - <<'PY'
import glob, os, re, zipfile
for path in glob.glob(".whl/bitsandbytes-*.whl"):
    keep = re.compile(r"libbitsandbytes_(cpu|cuda130|cuda132)\.so$")
    drop = re.compile(r"libbitsandbytes_\w+\.so$")
    with zipfile.ZipFile(path) as src:
        names = [n for n in src.namelist() if not drop.search(n) or keep.search(n)]
        if len(names) == len(src.namelist()):
            continue
        tmp = path + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for n in names:
                dst.writestr(src.getinfo(n), src.read(n))
    os.replace(tmp, path)
PY
ls -la .whl
du -sh .whl
