"""Rounding fp32 to bf16 in registers: stochastic for weights, nearest-even for the rest.

A bf16 weight cannot hold an update smaller than half its unit in the last place (ulp): rounding
to nearest drops it, every step, and training on bf16 weights stalls (the "dead zone"). Stochastic
rounding rounds up with probability equal to the dropped fraction of an ulp, so the expected stored
value equals the fp32 value and small updates accumulate on average.

How: bf16 is the top 16 bits of fp32. Add a uniform random 16-bit integer to the fp32 bit pattern
and clear the low 16 bits: the carry into bit 16 happens with probability (low bits) / 2^16. The
sign is a separate bit, so this rounds the magnitude and is unbiased for negative values too.
NaN and Inf keep their value. The random bits come from Philox (`tl.randint4x`) with 6 rounds,
keyed by a per-step, per-tensor seed and by the element's row and group of 8 columns: one call
gives the eight 16-bit noises of a group. Measured on the interpreter (65536 draws, rounding up
with probability 0.3): one 3-round call per element, as before, let decisions 1 to 9 elements
apart correlate by up to 0.09 (noise level 0.02); a 4-round call per 8 leaves the third word
far from uniform (17% and 0% of its half-words below 0.3) and groups 8 apart correlated by 0.10;
6 rounds per 8 correlate by at most 0.007. In the warp-specialized kernel's fast epilogue the
rounding took 800 of 3360 SASS instructions as before, 624 of 3184 at 87bf521. Results do not depend on
tile shapes, and a rerun with the same seed reproduces every bit. Few Philox rounds diffuse a
small change of the key poorly (seeds 7 and 8 give nearly the same low bits), so callers pass
well-mixed seeds: ForgeOptimizer hashes (seed, parameter, step) into the key.

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
    """x: fp32 tile; seed: int scalar; index: uint32 tile, each element's `noise_index`. Returns bf16.

    Elements 8j..8j+7 of the index share one Philox call (`tl.randint4x`: four 32-bit words, eight
    16-bit noises), element 8j + i taking the i-th half-word. Written element by element: where a
    thread holds 8 aligned consecutive columns, the compiler sees 8 calls with one key and keeps one."""
    return round_to_bf16_with(x, stochastic_noise(seed, index))


@triton.jit
def stochastic_noise(seed, index):
    """The 16-bit noise (uint32 in [0, 2^16)) each element of `round_to_bf16_stochastic` adds: the
    half-word of its group's Philox call that its place in the group names. Apart from the
    rounding so that a kernel can draw it in one register layout and round in another."""
    r0, r1, r2, r3 = tl.randint4x(seed, index >> 3, n_rounds=6)
    position = index & 7
    word = tl.where(position < 4, tl.where(position < 2, r0, r1), tl.where(position < 6, r2, r3))
    return (word.to(tl.uint32, bitcast=True) >> ((position & 1) * 16)) & 0xFFFF


@triton.jit
def round_to_bf16_with(x, noise):
    """x (fp32) rounded to bf16 by adding `noise` (`stochastic_noise`) to its bits and truncating."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + noise) & 0xFFFF0000).to(tl.float32, bitcast=True)
    finite = tl.abs(x) < float("inf")
    return tl.where(finite, rounded, x).to(tl.bfloat16)


@triton.jit
def noise_index(rows, cols, K):
    """The stochastic rounding's key of elements (rows[:, None], cols[None, :]) of a (.., K) tensor:
    row * K8 + col, K8 = K rounded up to a multiple of 8, as uint32 (wrapping past 2^32 elements).
    Each group of 8 aligned columns of a row gets its own key (index >> 3), whatever K."""
    k8 = ((K + 7) >> 3) << 3
    return rows.to(tl.uint32)[:, None] * k8.to(tl.uint32) + cols.to(tl.uint32)[None, :]


@triton.jit
def to_float(x, NATIVE: tl.constexpr = False):
    """x (bf16 or fp32 tile) as fp32; exact: bf16 is fp32's top half. NATIVE (GPU only): a bf16
    tile is widened one instruction per element, a shift for the low half of each 32-bit register
    and a mask for the high half, where `.to` extracts the high half first (1.5 an element)."""
    if NATIVE and x.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(
            "{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x],
            dtype=tl.float32, is_pure=True, pack=2)
    return x.to(tl.float32)


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
    offs,  # int64 element offsets
    mask,
    w,  # fp32 new values
    seed,  # int scalar, per step and tensor
    rows_cols,  # (rows, cols, K): the elements' row and column vectors and row length (`noise_index`)
    STOCHASTIC_ROUNDING: tl.constexpr,
    NATIVE: tl.constexpr = False,  # GPU only: round to nearest by the hardware's conversion (same bits)
):
    if ptr.dtype.element_ty == tl.bfloat16:
        if STOCHASTIC_ROUNDING:
            rows, cols, K = rows_cols
            tl.store(ptr + offs, round_to_bf16_stochastic(w, seed, noise_index(rows, cols, K)), mask=mask)
        elif NATIVE:
            tl.store(ptr + offs, w.to(tl.bfloat16), mask=mask)
        else:
            tl.store(ptr + offs, round_to_bf16_nearest(w), mask=mask)
    else:
        tl.store(ptr + offs, w.to(ptr.dtype.element_ty), mask=mask)
