"""Rounding fp32 to bf16 in registers: stochastic for weights, nearest-even for the rest.

A bf16 weight cannot hold an update smaller than half its unit in the last place (ulp): rounding
to nearest drops it, every step, and training on bf16 weights stalls (the "dead zone"). Stochastic
rounding rounds up with probability equal to the dropped fraction of an ulp, so the expected stored
value equals the fp32 value and small updates accumulate on average.

How: bf16 is the top 16 bits of fp32. Add a uniform random 16-bit integer to the fp32 bit pattern
and clear the low 16 bits: the carry into bit 16 happens with probability (low bits) / 2^16. The
sign is a separate bit, so this rounds the magnitude and is unbiased for negative values too.
NaN and Inf keep their value. The random bits come from Philox (`tl.randint`) with 3 rounds
(1 round was measurably biased in a 4M-sample test; 10 rounds cost registers), keyed by a per-step,
per-tensor seed and by the element's global index, so results do not depend on tile shapes and a
rerun with the same seed reproduces every bit. Three Philox rounds diffuse a small change of the key
poorly (seeds 7 and 8 give nearly the same low bits), so callers pass well-mixed seeds: ForgeOptimizer
hashes (seed, parameter, step) into the key.

Round-to-nearest-even is written out in integer operations too (add 0x7FFF plus the lowest kept bit,
then truncate), because Triton's interpreter truncates on `.to(tl.bfloat16)`: with this, bf16 states
and non-stochastic weights round the same way on the CPU interpreter as on the GPU. A kernel that
only ever runs on a GPU (the warp-specialized one, with `KernelConfig.fast_epilogue`) may ask for the
hardware's conversion instead (`NATIVE`): the same bits for every finite value, in one instruction
per two elements instead of about seven per element.
"""

import triton
import triton.language as tl


@triton.jit
def round_to_bf16_stochastic(x, seed, index):
    """x: fp32 tile; seed: int scalar; index: int tile of global element indices. Returns bf16."""
    noise = tl.randint(seed, index.to(tl.uint32), n_rounds=3).to(tl.uint32, bitcast=True) & 0xFFFF
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + noise) & 0xFFFF0000).to(tl.float32, bitcast=True)
    finite = tl.abs(x) < float("inf")
    return tl.where(finite, rounded, x).to(tl.bfloat16)


@triton.jit
def round_to_bf16_nearest(x):
    """x: fp32 tile. Returns bf16, rounded to nearest, ties to even (NaN and Inf kept)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    finite = tl.abs(x) < float("inf")
    return tl.where(finite, rounded, x).to(tl.bfloat16)


@triton.jit
def store_weight(
    ptr,  # weight, fp32 or bf16, updated in place
    offs,  # int64 element offsets (the global element index too)
    mask,
    w,  # fp32 new values
    seed,  # int scalar, per step and tensor
    STOCHASTIC_ROUNDING: tl.constexpr,
    NATIVE: tl.constexpr = False,  # GPU only: round to nearest by the hardware's conversion (same bits)
):
    if ptr.dtype.element_ty == tl.bfloat16:
        if STOCHASTIC_ROUNDING:
            tl.store(ptr + offs, round_to_bf16_stochastic(w, seed, offs), mask=mask)
        elif NATIVE:
            tl.store(ptr + offs, w.to(tl.bfloat16), mask=mask)
        else:
            tl.store(ptr + offs, round_to_bf16_nearest(w), mask=mask)
    else:
        tl.store(ptr + offs, w.to(ptr.dtype.element_ty), mask=mask)
