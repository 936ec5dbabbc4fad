"""The update of one (rows, cols) tile of a parameter from its finished gradient tile.

Both kernels end here: the fused weight-gradient kernel hands over the tile it accumulated in
registers, the element-wise kernel one it loaded from the gradient tensor. The tile's weights and
states are loaded, the rule is applied in fp32 (`forge.kernels.rules.apply_rule`), and the weights (bf16
with optional stochastic rounding, or fp32) and states (fp32, bf16 or int8) are stored back.

Compensated bf16 weights (KAHAN): beside each bf16 weight a bf16 residual holds what its rounding
lost. The update reads the weight as bf16 + residual in fp32 (about 16 significant bits), and
writes back the bf16 nearest to the new value and the new value's remainder, rounded to bf16: the
pair carries the fp32 master weight to a relative 2^-17, for 2 bytes a parameter more, where a
plain bf16 write-back drops every update below half a bf16 step.

Layout shared by every parameter: a tensor is viewed as (rows, cols) = (numel / last dim, last dim)
(a vector as one row), row-major and contiguous; int8 states have one bf16 scale per QGROUP (64
or 128) contiguous elements of a row, in a (rows, ceil(cols / QGROUP)) tensor. A tile starts at a
column that is a multiple of QGROUP and spans whole groups, so its scales are its own.
"""

import triton
import triton.language as tl

from forge.kernels.quant import decode_state, load_state_raw, store_state
from forge.kernels.rounding import round_to_bf16_nearest, store_weight, to_float
from forge.kernels.rules import apply_rule


@triton.jit
def tile_offsets(n_start, k_start, N, K, NUM_GROUPS, QGROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """Element and scale offsets of the (BLOCK_N, BLOCK_K) tile at (n_start, k_start), with masks."""
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    groups = k_start // QGROUP + tl.arange(0, BLOCK_K // QGROUP)
    return offsets_of(offs_n, offs_k, groups, N, K, NUM_GROUPS)


@triton.jit
def offsets_of(offs_n, offs_k, groups, N, K, NUM_GROUPS):
    """Element and scale offsets, with masks, of the tile whose rows, columns and scale groups are
    the index vectors given (a Gluon kernel builds them in its own register layout), and what the
    stochastic rounding keys the elements by (`rounding.noise_index`; built where it is used, so
    that no tile of keys stays live through the update)."""
    offs = offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    scale_offs = offs_n.to(tl.int64)[:, None] * NUM_GROUPS + groups[None, :]
    scale_mask = (offs_n[:, None] < N) & (groups[None, :] < NUM_GROUPS)
    return offs, mask, scale_offs, scale_mask, (offs_n, offs_k, K)


@triton.jit
def load_tile(
    n_start, k_start, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, N, K, NUM_GROUPS,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    STATE_DTYPE: tl.constexpr, QGROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """What `finish_tile` reads for one tile, as stored (nothing decoded, so a caller can issue
    these loads early and hold them in few registers): (w, s1, q1, s2, q2, s3, q3), a slot the
    rule lacks holding w again."""
    offsets = tile_offsets(n_start, k_start, N, K, NUM_GROUPS, QGROUP, BLOCK_N, BLOCK_K)
    return load_tile_at(offsets, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                        HAS_S1, HAS_S2, HAS_S3, STATE_DTYPE)


@triton.jit
def load_tile_at(
    offsets,  # (offs, mask, scale_offs, scale_mask, rows_cols) of the tile: `tile_offsets` or `offsets_of`
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr, STATE_DTYPE: tl.constexpr,
):
    """`load_tile` at offsets the caller built."""
    offs, mask, scale_offs, scale_mask, _ = offsets
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    s1, q1, s2, q2, s3, q3 = w, w, w, w, w, w
    if HAS_S1:
        s1, q1 = load_state_raw(s1_ptr, q1_ptr, offs, scale_offs, mask, scale_mask, STATE_DTYPE)
    if HAS_S2:
        s2, q2 = load_state_raw(s2_ptr, q2_ptr, offs, scale_offs, mask, scale_mask, STATE_DTYPE)
    if HAS_S3:
        s3, q3 = load_state_raw(s3_ptr, q3_ptr, offs, scale_offs, mask, scale_mask, STATE_DTYPE)
    return w, s1, q1, s2, q2, s3, q3


@triton.jit
def finish_tile(
    acc,  # (BLOCK_N, BLOCK_K) fp32: the finished gradient tile
    n_start, k_start,
    loaded,  # what `load_tile` returned for this tile
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr,
    N, K, NUM_GROUPS,
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
    RULE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    S1_SIGNED: tl.constexpr, S2_SIGNED: tl.constexpr, S3_SIGNED: tl.constexpr,
    STATE_DTYPE: tl.constexpr, QGROUP: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr, KAHAN: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Decode the loaded tile, apply the rule to the gradient in `acc` in fp32, store W and states."""
    offsets = tile_offsets(n_start, k_start, N, K, NUM_GROUPS, QGROUP, BLOCK_N, BLOCK_K)
    finish_tile_at(acc, offsets, loaded, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr,
                   h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                   RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                   STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, KAHAN, BLOCK_N, BLOCK_K)


@triton.jit
def finish_tile_at(
    acc, offsets, loaded,  # the gradient tile, `offsets_of` it, and what `load_tile_at` returned
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr,
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
    RULE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    S1_SIGNED: tl.constexpr, S2_SIGNED: tl.constexpr, S3_SIGNED: tl.constexpr,
    STATE_DTYPE: tl.constexpr, QGROUP: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr, KAHAN: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FAST: tl.constexpr = False,  # GPU only: approximate sqrt and division, the hardware's bf16 rounding and widening
    LAYOUTS: tl.constexpr = False,  # a Gluon caller: int8 states convert between register layouts
):
    """`finish_tile` at offsets the caller built."""
    offs, mask, scale_offs, scale_mask, rows_cols = offsets
    w_raw, s1_raw, q1_raw, s2_raw, q2_raw, s3_raw, q3_raw = loaded
    w = to_float(w_raw, FAST)
    if KAHAN:  # the weight's fp32 value, to ~16 bits: its bf16 part plus the bf16 residual
        w = w + to_float(tl.load(r_ptr + offs, mask=mask, other=0.0), FAST)
    s1 = acc
    s2 = acc
    s3 = acc
    if HAS_S1:
        s1 = decode_state(s1_raw, q1_raw, BLOCK_N, BLOCK_K, STATE_DTYPE, S1_SIGNED, QGROUP, LAYOUTS, FAST)
    if HAS_S2:
        s2 = decode_state(s2_raw, q2_raw, BLOCK_N, BLOCK_K, STATE_DTYPE, S2_SIGNED, QGROUP, LAYOUTS, FAST)
    if HAS_S3:
        s3 = decode_state(s3_raw, q3_raw, BLOCK_N, BLOCK_K, STATE_DTYPE, S3_SIGNED, QGROUP, LAYOUTS, FAST)

    w, s1, s2, s3 = apply_rule(w, acc, s1, s2, s3, h0, h1, h2, h3, h4, h5, h6, h7, h8, RULE, HAS_MOMENTUM, CENTERED, FAST)

    # The states first: their tiles are dead before the weight's stochastic rounding needs registers.
    if HAS_S1:
        store_state(s1_ptr, q1_ptr, offs, scale_offs, mask, scale_mask, s1, BLOCK_N, BLOCK_K, STATE_DTYPE, S1_SIGNED, QGROUP, FAST, LAYOUTS)
    if HAS_S2:
        store_state(s2_ptr, q2_ptr, offs, scale_offs, mask, scale_mask, s2, BLOCK_N, BLOCK_K, STATE_DTYPE, S2_SIGNED, QGROUP, FAST, LAYOUTS)
    if HAS_S3:
        store_state(s3_ptr, q3_ptr, offs, scale_offs, mask, scale_mask, s3, BLOCK_N, BLOCK_K, STATE_DTYPE, S3_SIGNED, QGROUP, FAST, LAYOUTS)
    if KAHAN:  # bf16 rounded to nearest, and what that rounding lost, itself rounded to bf16
        high = _nearest_bf16(w, FAST)
        tl.store(w_ptr + offs, high, mask=mask)
        tl.store(r_ptr + offs, _nearest_bf16(w - high.to(tl.float32), FAST), mask=mask)
    else:
        store_weight(w_ptr, offs, mask, w, seed, rows_cols, STOCHASTIC_ROUNDING, FAST)


@triton.jit
def _nearest_bf16(x, NATIVE: tl.constexpr):
    """fp32 -> bf16 to nearest, ties to even: by the hardware's conversion (NATIVE, GPU only), or
    by bits (a plain `.to` truncates in Triton's interpreter)."""
    if NATIVE:
        return x.to(tl.bfloat16)
    return round_to_bf16_nearest(x)


@triton.jit
def load_step_values(step_ptr):
    """This step's coefficients and seed from device memory, for a launch captured in a CUDA graph
    (`ForgeOptimizer(capturable=True)`): an int32 row of STEP_ROW words, h0..h8 as fp32 bits in
    words 0-8 and the seed in word 9, written before each replay. Returns (h0, ..., h8, seed)."""
    h0 = tl.load(step_ptr + 0).to(tl.float32, bitcast=True)
    h1 = tl.load(step_ptr + 1).to(tl.float32, bitcast=True)
    h2 = tl.load(step_ptr + 2).to(tl.float32, bitcast=True)
    h3 = tl.load(step_ptr + 3).to(tl.float32, bitcast=True)
    h4 = tl.load(step_ptr + 4).to(tl.float32, bitcast=True)
    h5 = tl.load(step_ptr + 5).to(tl.float32, bitcast=True)
    h6 = tl.load(step_ptr + 6).to(tl.float32, bitcast=True)
    h7 = tl.load(step_ptr + 7).to(tl.float32, bitcast=True)
    h8 = tl.load(step_ptr + 8).to(tl.float32, bitcast=True)
    seed = tl.load(step_ptr + 9)
    return h0, h1, h2, h3, h4, h5, h6, h7, h8, seed


@triton.jit
def update_tile(
    acc,  # (BLOCK_N, BLOCK_K) fp32: the finished gradient tile
    n_start,  # first row of this tile
    k_start,  # first column of this tile, a multiple of QGROUP
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr,
    N, K, NUM_GROUPS,
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
    RULE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    S1_SIGNED: tl.constexpr, S2_SIGNED: tl.constexpr, S3_SIGNED: tl.constexpr,
    STATE_DTYPE: tl.constexpr, QGROUP: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr, KAHAN: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Load W and the states of one tile, apply the rule to the gradient in `acc`, store them."""
    loaded = load_tile(n_start, k_start, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, N, K, NUM_GROUPS,
                       HAS_S1, HAS_S2, HAS_S3, STATE_DTYPE, QGROUP, BLOCK_N, BLOCK_K)
    finish_tile(acc, n_start, k_start, loaded, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr,
                N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, KAHAN, BLOCK_N, BLOCK_K)


STEP_ROW = 16  # int32 words per parameter in a capturable optimizer's step rows (64-byte aligned rows)


def step_arguments(param, coefficients: tuple, seed: int, step_values, grad_scale=None) -> tuple:
    """The launch's per-step scalars, step-row pointer and gradient-scale pointer: the host's values
    with `param` as an unread pointer, or, when `step_values` (a row of STEP_ROW int32) is given,
    zeros and the row, which the kernel reads instead (`load_step_values`). `grad_scale`: a one-element
    fp32 tensor the gradient is multiplied by before the rule (global-norm clipping's coefficient,
    `forge.clip`), or None (`param`, unread: the kernel is built with GRAD_SCALE=False)."""
    scale = param if grad_scale is None else grad_scale
    if step_values is None:
        return (*coefficients, seed, param, scale)
    return (0.0,) * len(coefficients) + (0, step_values, scale)


def slot_arguments(param, states: tuple, scales: tuple, residual=None) -> list:
    """The seven state, scale and residual pointers of a launch: each slot's tensor, or `param`
    where the rule has no such slot (never dereferenced: its HAS_S* flag is False), and the weight's
    bf16 residual (compensated weights, KAHAN) or `param` again."""
    return [t if t is not None else param for t in (*states, *scales, residual)]


def epilogue_constexprs(states: tuple, signed: tuple, *, rule: str, flags: dict, state_dtype: str,
                        stochastic_rounding: bool, int8_group: int = 64, grad_scale: bool = False,
                        kahan: bool = False) -> dict:
    """The compile-time arguments shared by the kernels: `update_tile`'s (KAHAN: compensated bf16
    weights, a residual at `r_ptr`), and GRAD_SCALE (the gradient is multiplied by the value at
    `scale_ptr` before the rule: `step_arguments`)."""
    return dict(
        GRAD_SCALE=grad_scale, KAHAN=kahan,
        RULE=rule, HAS_MOMENTUM=flags["momentum"], CENTERED=flags["centered"],
        HAS_S1=states[0] is not None, HAS_S2=states[1] is not None, HAS_S3=states[2] is not None,
        S1_SIGNED=signed[0], S2_SIGNED=signed[1], S3_SIGNED=signed[2],
        STATE_DTYPE=state_dtype, QGROUP=int8_group, STOCHASTIC_ROUNDING=stochastic_rounding,
    )
