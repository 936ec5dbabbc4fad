"""The update of one (rows, cols) tile of a parameter from its finished gradient tile.

Every update kernel ends here: the fused weight-gradient kernels (Triton and Gluon) hand over the
tile they accumulated in registers, the element-wise kernel one it loaded from the gradient tensor.
The tile's weights and states are loaded, the rule is applied in fp32
(`forge.kernels.rules.apply_rule`), and the weights (bf16 with optional stochastic rounding, or
fp32) and states (fp32, bf16 or int8) are stored back.

Compensated bf16 weights (KAHAN): beside each bf16 weight a bf16 residual holds what its rounding
lost. The update reads the weight as bf16 + residual in fp32 (about 16 significant bits), and
writes back the bf16 nearest to the new value and the new value's remainder, rounded to bf16: the
pair carries the fp32 master weight to a relative 2^-17, for 2 bytes a parameter more, where a
plain bf16 write-back drops every update below half a bf16 step.

Layout shared by every parameter: a tensor is viewed as (rows, cols) = (numel / last dim, last dim)
(a vector as one row), row-major and contiguous; int8 states have one bf16 scale per QGROUP (64
or 128) contiguous elements of a row, in a (rows, ceil(cols / QGROUP)) tensor. A tile starts at a
column that is a multiple of QGROUP and spans whole groups, so its scales are its own.

Every kernel hands the update the same three bundles, which each layer passes on unopened:
    params  (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr): the parameter, its
            three state slots, their int8 scales and the weight's bf16 residual (`slot_arguments`:
            a slot the rule lacks holds the weight's pointer, never dereferenced)
    step    (h0, ..., h8, seed): this step's rule coefficients (`forge.rules.Rule.coefficients`)
            and stochastic-rounding seed, from the launch (`step_arguments`) or from device memory
            (`load_step_values`)
    UPDATE  the compile-time description of the update (`epilogue_constexprs`), a tuple of
            constexprs in this order:
             0 RULE, 1 HAS_MOMENTUM, 2 CENTERED    the rule (`forge.kernels.rules.apply_rule`)
             3-5 HAS_S1, HAS_S2, HAS_S3            which state slots the rule has
             6-8 S1_SIGNED, S2_SIGNED, S3_SIGNED   which of them can be negative (int8 codes)
             9 STATE_DTYPE                         "fp32" | "bf16" | "int8"
            10 QGROUP                              int8: elements per scale (64 or 128)
            11 STOCHASTIC_ROUNDING                 bf16 weights rounded stochastically
            12 KAHAN                               compensated bf16 weights (above)
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
def load_tile(n_start, k_start, params, N, K, NUM_GROUPS, UPDATE, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """What `finish_tile` reads for the (BLOCK_N, BLOCK_K) tile at (n_start, k_start), as stored
    (nothing decoded, so a caller can issue these loads early and hold them in few registers)."""
    QGROUP: tl.constexpr = UPDATE[10]
    offsets = tile_offsets(n_start, k_start, N, K, NUM_GROUPS, QGROUP, BLOCK_N, BLOCK_K)
    return load_tile_at(offsets, params, UPDATE)


@triton.jit
def load_tile_at(
    offsets,  # (offs, mask, scale_offs, scale_mask, rows_cols) of the tile: `tile_offsets` or `offsets_of`
    params,  # the parameter's pointers (module docstring)
    UPDATE,  # the update's compile-time description (module docstring)
):
    """`load_tile` at offsets the caller built: (w, s1, q1, s2, q2, s3, q3), a slot the rule lacks
    holding w again."""
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, _ = params
    offs, mask, _, _, _ = offsets
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    s1, q1 = _load_slot(s1_ptr, q1_ptr, offsets, w, UPDATE, 0)
    s2, q2 = _load_slot(s2_ptr, q2_ptr, offsets, w, UPDATE, 1)
    s3, q3 = _load_slot(s3_ptr, q3_ptr, offsets, w, UPDATE, 2)
    return w, s1, q1, s2, q2, s3, q3


@triton.jit
def finish_tile(
    acc,  # (BLOCK_N, BLOCK_K) fp32: the finished gradient tile
    n_start, k_start,
    loaded,  # what `load_tile` returned for this tile
    params, N, K, NUM_GROUPS, step, UPDATE,  # as `update_tile`
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Decode the loaded tile, apply the rule to the gradient in `acc` in fp32, store W and states."""
    QGROUP: tl.constexpr = UPDATE[10]
    offsets = tile_offsets(n_start, k_start, N, K, NUM_GROUPS, QGROUP, BLOCK_N, BLOCK_K)
    finish_tile_at(acc, offsets, loaded, params, step, UPDATE, BLOCK_N, BLOCK_K)


@triton.jit
def finish_tile_at(
    acc, offsets, loaded,  # the gradient tile, `offsets_of` it, and what `load_tile_at` returned
    params, step, UPDATE,  # as `update_tile`
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FAST: tl.constexpr = False,  # GPU only: approximate sqrt and division, the hardware's bf16 rounding and widening
    LAYOUTS: tl.constexpr = False,  # a Gluon caller: int8 states convert between register layouts
):
    """`finish_tile` at offsets the caller built."""
    RULE: tl.constexpr = UPDATE[0]
    HAS_MOMENTUM: tl.constexpr = UPDATE[1]
    CENTERED: tl.constexpr = UPDATE[2]
    STOCHASTIC_ROUNDING: tl.constexpr = UPDATE[11]
    KAHAN: tl.constexpr = UPDATE[12]
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr = params
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed = step
    offs, mask, _, _, rows_cols = offsets
    w_raw, s1_raw, q1_raw, s2_raw, q2_raw, s3_raw, q3_raw = loaded
    w = to_float(w_raw, FAST)
    if KAHAN:  # the weight's fp32 value, to ~16 bits: its bf16 part plus the bf16 residual
        w = w + to_float(tl.load(r_ptr + offs, mask=mask, other=0.0), FAST)
    s1 = _decoded_slot(s1_raw, q1_raw, acc, UPDATE, 0, BLOCK_N, BLOCK_K, FAST, LAYOUTS)
    s2 = _decoded_slot(s2_raw, q2_raw, acc, UPDATE, 1, BLOCK_N, BLOCK_K, FAST, LAYOUTS)
    s3 = _decoded_slot(s3_raw, q3_raw, acc, UPDATE, 2, BLOCK_N, BLOCK_K, FAST, LAYOUTS)

    w, s1, s2, s3 = apply_rule(w, acc, s1, s2, s3, h0, h1, h2, h3, h4, h5, h6, h7, h8, RULE, HAS_MOMENTUM, CENTERED, FAST)

    # The states first: their tiles are dead before the weight's stochastic rounding needs registers.
    _store_slot(s1_ptr, q1_ptr, offsets, s1, UPDATE, 0, BLOCK_N, BLOCK_K, FAST, LAYOUTS)
    _store_slot(s2_ptr, q2_ptr, offsets, s2, UPDATE, 1, BLOCK_N, BLOCK_K, FAST, LAYOUTS)
    _store_slot(s3_ptr, q3_ptr, offsets, s3, UPDATE, 2, BLOCK_N, BLOCK_K, FAST, LAYOUTS)
    if KAHAN:  # bf16 rounded to nearest, and what that rounding lost, itself rounded to bf16
        high = _nearest_bf16(w, FAST)
        tl.store(w_ptr + offs, high, mask=mask)
        tl.store(r_ptr + offs, _nearest_bf16(w - high.to(tl.float32), FAST), mask=mask)
    else:
        store_weight(w_ptr, offs, mask, w, seed, rows_cols, STOCHASTIC_ROUNDING, FAST)


# State slot SLOT (0, 1 or 2) of a tile: UPDATE[3 + SLOT] says whether the rule has it (a slot it
# lacks is neither read nor written), UPDATE[6 + SLOT] whether it is signed.


@triton.jit
def _load_slot(ptr, scale_ptr, offsets, w, UPDATE, SLOT: tl.constexpr):
    """A slot's codes and scales as stored, or (w, w) where the rule has no such slot."""
    HAS: tl.constexpr = UPDATE[3 + SLOT]
    STATE_DTYPE: tl.constexpr = UPDATE[9]
    offs, mask, scale_offs, scale_mask, _ = offsets
    raw, scales = w, w
    if HAS:
        raw, scales = load_state_raw(ptr, scale_ptr, offs, scale_offs, mask, scale_mask, STATE_DTYPE)
    return raw, scales


@triton.jit
def _decoded_slot(raw, scales, acc, UPDATE, SLOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  FAST: tl.constexpr, LAYOUTS: tl.constexpr):
    """A slot in fp32 from what `_load_slot` returned, or `acc` (unread) where the rule has none."""
    HAS: tl.constexpr = UPDATE[3 + SLOT]
    SIGNED: tl.constexpr = UPDATE[6 + SLOT]
    STATE_DTYPE: tl.constexpr = UPDATE[9]
    QGROUP: tl.constexpr = UPDATE[10]
    state = acc
    if HAS:
        state = decode_state(raw, scales, BLOCK_N, BLOCK_K, STATE_DTYPE, SIGNED, QGROUP, LAYOUTS, FAST)
    return state


@triton.jit
def _store_slot(ptr, scale_ptr, offsets, state, UPDATE, SLOT: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, FAST: tl.constexpr, LAYOUTS: tl.constexpr):
    """Store a slot's new fp32 values in its storage dtype (int8: codes and scales)."""
    HAS: tl.constexpr = UPDATE[3 + SLOT]
    SIGNED: tl.constexpr = UPDATE[6 + SLOT]
    STATE_DTYPE: tl.constexpr = UPDATE[9]
    QGROUP: tl.constexpr = UPDATE[10]
    offs, mask, scale_offs, scale_mask, _ = offsets
    if HAS:
        store_state(ptr, scale_ptr, offs, scale_offs, mask, scale_mask, state, BLOCK_N, BLOCK_K, STATE_DTYPE, SIGNED,
                    QGROUP, FAST, LAYOUTS)


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
    words 0-8 and the seed in word 9, written before each replay. Returns `step`, (h0, ..., h8, seed)."""
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
    params,  # (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr) of the (N, K) parameter
    N, K, NUM_GROUPS,
    step,  # (h0, ..., h8, seed): this step's rule coefficients and stochastic-rounding seed
    UPDATE,  # the update's compile-time description (module docstring)
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Load W and the states of one tile, apply the rule to the gradient in `acc`, store them."""
    loaded = load_tile(n_start, k_start, params, N, K, NUM_GROUPS, UPDATE, BLOCK_N, BLOCK_K)
    finish_tile(acc, n_start, k_start, loaded, params, N, K, NUM_GROUPS, step, UPDATE, BLOCK_N, BLOCK_K)


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


def epilogue_facts(states: tuple, signed: tuple, rule: str, flags: dict, state_dtype: str, stochastic_rounding: bool,
                   int8_group: int, step_values, grad_scale, residual) -> tuple:
    """What the compiled update depends on besides the tensors' facts (`launch.tensor_facts`): the
    epilogue's part of a launcher's key (`forge.kernels.launch`), from the launcher's own arguments."""
    return (tuple(s is None for s in states), signed, rule, tuple(flags.items()), state_dtype, stochastic_rounding,
            int8_group, step_values is None, grad_scale is None, residual is None)


def epilogue_constexprs(states: tuple, signed: tuple, *, rule: str, flags: dict, state_dtype: str,
                        stochastic_rounding: bool, int8_group: int = 64, grad_scale: bool = False,
                        kahan: bool = False) -> dict:
    """The compile-time arguments every update kernel takes: UPDATE, the update's description (the
    module docstring gives its order; KAHAN: compensated bf16 weights, a residual at `r_ptr`), and
    GRAD_SCALE (the gradient is multiplied by the value at `scale_ptr` before the rule:
    `step_arguments`)."""
    update = (
        rule, flags["momentum"], flags["centered"],
        states[0] is not None, states[1] is not None, states[2] is not None,
        signed[0], signed[1], signed[2],
        state_dtype, int8_group, stochastic_rounding, kahan,
    )
    return dict(UPDATE=update, GRAD_SCALE=grad_scale)
