"""The FORGE kernel: the weight-gradient GEMM of a linear layer fused with its optimizer update.

Shapes: T tokens (all leading dims of the input flattened), N output features, K input features.
    x_TK   the layer's input            dy_TN  the gradient of its output
    w_NK   the weight, updated in place s*_NK  the optimizer states, updated in place

A plain backward computes dW = dy^T x (N x K, written to memory), and later the optimizer reads dW,
W and the states and writes W and the states back. Here one launch does both, tile by tile: each
program owns one (BLOCK_N, BLOCK_K) tile of W, accumulates its gradient over all T tokens in fp32
registers (the GEMM's main loop, `forge.kernels.wgrad_tile`), then loads the matching tiles of W
and of the states, applies the rule in fp32 (`forge.kernels.rules.apply_rule`, through
`update_tile`), and stores W and the states. dW never exists in memory: the gradient memory of a
layer drops from N*K elements to one tile per running program, and the optimizer's second pass
over memory (read dW, W, states; write W, states) shrinks to one read and one write of W and the
states, done while the tile's operands are still on chip.

Cost: the GEMM's 2*T*N*K FLOPs, plus the update's bytes, which for bf16 weights and bf16 states are
2 + 2*2 bytes read and the same written per element (fp32 states: 2 + 2*4). For T of a few thousand
the update's bytes take about as long as the matrix work; the epilogue is the part to hide.

Exactness: with fp32 inputs the dot is asked for IEEE fp32 (not tf32), so the update equals
torch.optim's on the full fp32 gradient up to the order of the sum over T. bf16 inputs use the
tensor cores with fp32 accumulation, exactly as cuBLAS does.

This kernel updates W and the states in place: it must never be re-run by an autotuner (each run
would apply another optimizer step). `wgrad_update`, the launcher, takes its plan from
`forge.kernels.configs` (configs measured offline, picked by shape), which may send the launch to
the warp-specialized Gluon twin on Hopper (`forge.kernels.wgrad_update_ws`) instead.

Host cost: a launch's plan is cached under a key of every fact it depends on, and on a GPU the
launch itself skips Triton's per-call dispatch once the key has been seen (`forge.kernels.launch`).
`WgradUpdate` keeps one weight's part of that key and of the argument list from step to step (an
optimizer holds one per fused weight), so a step works out only what dy and x bring.
"""

import itertools

import torch
import triton
import triton.language as tl

from forge.kernels import configs
from forge.kernels.configs import KernelConfig
from forge.kernels.launch import DirectLauncher, tensor_facts
from forge.kernels.update_tile import (
    epilogue_facts,
    finish_tile,
    load_step_values,
    load_tile,
    slot_arguments,
    step_arguments,
    update_tile,
)
from forge.kernels.wgrad_tile import tile_origin, wgrad_tile

try:  # Gluon (Triton >= 3.5): the warp-specialized kernels for Hopper
    from forge.kernels import (
        wgrad_update_pingpong,
        wgrad_update_pingpong_fed,
        wgrad_update_ws,
    )
except ImportError:  # pragma: no cover - an older Triton: configs never plans them
    wgrad_update_ws = wgrad_update_pingpong = wgrad_update_pingpong_fed = None


@triton.jit
def _halves(tile, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Split a (ROWS, COLS) register tile into its top and bottom (ROWS // 2, COLS) halves."""
    return tl.split(tl.permute(tl.reshape(tile, (2, ROWS // 2, COLS)), (1, 2, 0)))


# `seed` changes every step: specializing on its value (== 1, divisible by 16) would compile a new
# variant whenever a step's seed first falls in another class, in the middle of training.
@triton.jit(do_not_specialize=["seed"])
def wgrad_update_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16 | int8/uint8 codes, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # (N, NUM_GROUPS) bf16 int8 block scales, updated in place
    r_ptr,  # KAHAN: (N, K) bf16 residual of the weight, updated in place; else unread
    dy_src,  # (T, N) bf16 | fp32 | fp8 gradient of the layer's output: a TMA descriptor (TMA "host") or a pointer
    x_src,  # (T, K) bf16 | fp32 | fp8 input of the layer: a TMA descriptor (TMA "host") or a pointer
    T, N, K, NUM_GROUPS,
    stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,  # element strides (pointer path only)
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 rule coefficients for this step (forge.rules)
    seed,  # int32 stochastic-rounding seed for this step and tensor
    step_ptr,  # STEPS_IN_MEMORY: an int32 row holding this step's h0..h8 and seed; else unread
    scale_ptr,  # GRAD_SCALE: one fp32 the gradient tile is multiplied by (the clip coefficient); else unread
    UPDATE: tl.constexpr,  # the update: rule, state slots, storage (`update_tile.epilogue_constexprs`)
    GRAD_SCALE: tl.constexpr,  # scale the finished gradient tile by *scale_ptr (global-norm clipping)
    STEPS_IN_MEMORY: tl.constexpr,  # read the step's scalars from step_ptr (a launch a CUDA graph replays)
    TMA: tl.constexpr,  # "host": dy and x by bulk tensor copies through host-built descriptors; "none": pointers
    T_MAJOR: tl.constexpr,  # dy and x T-contiguous (FP8): read as (BLOCK_N, BLOCK_T) and (BLOCK_K, BLOCK_T) tiles
    FP8_FAST_ACCUM: tl.constexpr,  # T_MAJOR: the MMA's own accumulator over all T (`KernelConfig.fp8_fast_accum`)
    UPCAST_DOT: tl.constexpr,  # interpreter: tl.dot on bf16 is wrong there, so dot in fp32
    DOT_PRECISION: tl.constexpr,  # "ieee" for exact fp32 products
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
    GROUP_N: tl.constexpr,  # tiles of N walked together, for L2 reuse of x
    EPILOGUE_SPLIT: tl.constexpr,  # 1, 2, 4 or 8: update the tile in this many row slices (registers)
    OVERLAP_SLICES: tl.constexpr,  # load slice i + 1 before slice i is updated and stored
):
    """One program per (BLOCK_N, BLOCK_K) tile of W: accumulate its gradient over all T, update it."""
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    if STEPS_IN_MEMORY:
        step = load_step_values(step_ptr)
    # The gradient tile dW[n, k] = sum_t dy[t, n] x[t, k] in fp32 registers (the GEMM's main loop),
    # tiles in grouped order (GROUP_N tiles of N share x's blocks in L2).
    n0, k0 = tile_origin(tl.program_id(0), N, K, BLOCK_N, BLOCK_K, GROUP_N)
    acc = wgrad_tile(dy_src, x_src, T, N, K, n0, k0, stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,
                     TMA, T_MAJOR, FP8_FAST_ACCUM, UPCAST_DOT, DOT_PRECISION, BLOCK_N, BLOCK_K, BLOCK_T)
    if GRAD_SCALE:  # fp32 g * c, rounded once, as clip_grad_norm_'s multiply of an fp32 gradient
        acc = acc * tl.load(scale_ptr)
    # Epilogue: the optimizer update on the finished tile, in row slices that bound the registers
    # held by W and state tiles; the gradient dies in registers.
    _update_in_slices(acc, n0, k0, params, N, K, NUM_GROUPS, step, UPDATE, EPILOGUE_SPLIT, OVERLAP_SLICES,
                      BLOCK_N, BLOCK_K)


@triton.jit
def _slices(tile, ROWS: tl.constexpr, COLS: tl.constexpr, PARTS: tl.constexpr):
    """A (ROWS, COLS) register tile as a tuple of PARTS (1, 2, 4 or 8) row slices, top first."""
    tl.static_assert(PARTS == 1 or PARTS == 2 or PARTS == 4 or PARTS == 8, "EPILOGUE_SPLIT must be 1, 2, 4 or 8")
    if PARTS == 1:
        parts = (tile,)
    else:
        top, bottom = _halves(tile, ROWS, COLS)
        parts = _slices(top, ROWS // 2, COLS, PARTS // 2) + _slices(bottom, ROWS // 2, COLS, PARTS // 2)
    return parts


@triton.jit
def _update_in_slices(acc, n0, k0, params, N, K, NUM_GROUPS, step, UPDATE, SPLIT: tl.constexpr,
                      OVERLAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """`update_tile` on the (BLOCK_N, BLOCK_K) tile at (n0, k0) in SPLIT (1, 2, 4 or 8) row slices,
    top first. In slice order a slice's loads wait for the stores of the slice before it, so every
    slice pays a full memory latency; with OVERLAP each slice's W and states are loaded before the
    slice above it is updated and stored (a slice's loads do not depend on its gradient): two
    slices' loads in flight."""
    ROWS: tl.constexpr = BLOCK_N // SPLIT
    parts = _slices(acc, BLOCK_N, BLOCK_K, SPLIT)
    if OVERLAP:
        loaded = load_tile(n0, k0, params, N, K, NUM_GROUPS, UPDATE, ROWS, BLOCK_K)
        for i in tl.static_range(SPLIT):
            if i + 1 < SPLIT:
                following = load_tile(n0 + (i + 1) * ROWS, k0, params, N, K, NUM_GROUPS, UPDATE, ROWS, BLOCK_K)
            finish_tile(parts[i], n0 + i * ROWS, k0, loaded, params, N, K, NUM_GROUPS, step, UPDATE, ROWS, BLOCK_K)
            if i + 1 < SPLIT:
                loaded = following
    else:
        for i in tl.static_range(SPLIT):
            update_tile(parts[i], n0 + i * ROWS, k0, params, N, K, NUM_GROUPS, step, UPDATE, ROWS, BLOCK_K)


_plans: dict = {}
_launch = DirectLauncher(wgrad_update_kernel)


def wgrad_update(
    weight: torch.Tensor, states: tuple, scales: tuple, signed: tuple,  # the parameter and its optimizer state
    dy: torch.Tensor, x: torch.Tensor,  # the layer's operands: its gradient is dy^T x
    coefficients: tuple, seed: int,  # this step's
    *, rule: str, flags: dict, state_dtype: str, stochastic_rounding: bool, int8_group: int = 64,
    config: KernelConfig | None = None,
    step_values: torch.Tensor | None = None, grad_scale: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    """Apply one optimizer step to `weight` (N, K) from the gradient dy^T x, without storing it.

    dy: (T, N) and x: (T, K), any strides; FP8 ones (`forge.fp8`) with a unit stride along T, and
    `grad_scale` their dequantization scale. `states`, `scales`, `signed`: three slots each (None
    where the rule has no such state; scales only for int8). Updates `weight`, `states` and
    `scales` in place. `coefficients` come from `forge.rules.Rule.coefficients`. `int8_group`:
    elements per int8 scale along K (64 or 128); a config's BLOCK_K must be a multiple of it.
    `config`: a `KernelConfig` to launch under (default: `forge.kernels.configs.plan` chooses).
    `step_values`: an int32 row (`update_tile.STEP_ROW` words) the kernel reads `coefficients`
    and `seed` from instead, so that a CUDA graph can replay the launch with new values.
    `grad_scale`: a one-element fp32 tensor on the device the gradient is multiplied by before
    the rule (the clip coefficient of `forge.clip`), or None. `residual`: with bf16 compensated
    weights, the (N, K) bf16 tensor of what the weight's rounding to bf16 lost, read and written
    with it (the weight rounds to nearest then), or None.

    One launch of `WgradUpdate`, which a caller that updates the same tensors every step keeps.
    """
    WgradUpdate(
        weight, states, scales, signed, rule=rule, flags=flags, state_dtype=state_dtype,
        stochastic_rounding=stochastic_rounding, int8_group=int8_group, config=config, residual=residual,
    )(dy, x, coefficients, seed, step_values, grad_scale)  # fmt: skip


class WgradUpdate:
    """`wgrad_update` of one weight and its states (the arguments `wgrad_update` takes before dy),
    with what they contribute to a launch worked out once: their pointers in argument order and
    their part of the launch key. Each call is then one launch from dy, x and the step's scalars.

    The key holds every fact the launch depends on (shapes, strides, dtypes, alignments, device,
    options): a problem seen before skips the planning and, on a GPU, Triton's dispatch. The
    weight's and the states' facts are taken when this is built, so the tensors must keep their
    storage (the optimizer's do: it updates them in place)."""

    __slots__ = ("weight", "states", "signed", "slots", "facts", "update")

    def __init__(
        self, weight: torch.Tensor, states: tuple, scales: tuple, signed: tuple,
        *, rule: str, flags: dict, state_dtype: str, stochastic_rounding: bool, int8_group: int = 64,
        config: KernelConfig | None = None, residual: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        self.weight, self.states, self.signed = weight, states, signed
        self.slots = tuple(slot_arguments(weight, states, scales, residual))
        self.facts = _facts_id((
            weight.stride(), tensor_facts(weight, *self.slots), config,
            epilogue_facts(states, signed, rule, flags, state_dtype, stochastic_rounding, int8_group, None, None,
                           residual),
        ))  # fmt: skip
        self.update = (rule, flags, state_dtype, stochastic_rounding, int8_group, config, residual is not None)

    def __call__(
        self, dy: torch.Tensor, x: torch.Tensor, coefficients: tuple, seed: int,
        step_values: torch.Tensor | None = None, grad_scale: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """One step from dy^T x (the arguments as `wgrad_update` takes them)."""
        T, N = dy.shape
        key = (T, N, x.shape[1], dy.stride(), x.stride(), dy.get_device(), dy.dtype, dy.data_ptr() % 16 == 0,
               x.dtype, x.data_ptr() % 16 == 0, step_values is None, grad_scale is None, self.facts)  # `tensor_facts`, inline
        plan = _plans.get(key)
        if plan is None:
            if len(_plans) >= DirectLauncher.max_entries:
                _plans.clear()
            rule, flags, state_dtype, stochastic_rounding, int8_group, config, kahan = self.update
            plan = _plans[key] = configs.plan(self.weight, self.states, self.signed, dy, x, rule=rule, flags=flags,
                                              state_dtype=state_dtype, stochastic_rounding=stochastic_rounding,
                                              int8_group=int8_group, config=config,
                                              steps_in_memory=step_values is not None,
                                              grad_scale=grad_scale is not None, kahan=kahan)  # fmt: skip
        weight = self.weight
        if step_values is None:  # `step_arguments`, inline: an eager step's scalars
            step = (*coefficients, seed, weight, weight if grad_scale is None else grad_scale)
        else:
            step = step_arguments(weight, coefficients, seed, step_values, grad_scale)
        _launch_plan(key, plan, weight, self.slots, dy, x, step)


# A weight's facts (`WgradUpdate.facts`) -> the number that stands for them in launch keys: hashing
# one integer at every launch instead of the nested tuple. Numbers are never reused, so a key names
# one weight's facts even after the table is cleared.
_facts_ids: dict = {}
_next_facts_id = itertools.count()


def _facts_id(facts: tuple) -> int:
    """The number standing for `facts` in launch keys (one per distinct facts)."""
    found = _facts_ids.get(facts)
    if found is None:
        if len(_facts_ids) >= DirectLauncher.max_entries:
            _facts_ids.clear()
        found = _facts_ids[facts] = next(_next_facts_id)
    return found


def _launch_plan(key, plan, weight, slots, dy, x, step: tuple) -> None:
    """Launch `plan` on its kernel: this module's, or a Gluon one's `launch` (same arguments); `key`
    begins with T, N, K and dy's and x's strides (`WgradUpdate.__call__`)."""
    if plan.kernel == "gluon":
        wgrad_update_ws.launch(key, plan, weight, slots, dy, x, step)
        return
    if plan.kernel == "pingpong":
        wgrad_update_pingpong.launch(key, plan, weight, slots, dy, x, step)
        return
    if plan.kernel == "pingpong_fed":
        wgrad_update_pingpong_fed.launch(key, plan, weight, slots, dy, x, step)
        return
    T, N, K, dy_stride, x_stride = key[:5]
    dy_src, x_src = dy, x
    if plan.tma == "host":
        from triton.tools.tensor_descriptor import TensorDescriptor

        cfg = plan.config
        if plan.constexprs["T_MAJOR"]:  # descriptors of the T-contiguous (N, T) and (K, T) tensors
            dy_src = TensorDescriptor.from_tensor(dy.t(), [cfg.block_n, cfg.block_t])
            x_src = TensorDescriptor.from_tensor(x.t(), [cfg.block_k, cfg.block_t])
        else:
            dy_src = TensorDescriptor.from_tensor(dy, [cfg.block_t, cfg.block_n])
            x_src = TensorDescriptor.from_tensor(x, [cfg.block_t, cfg.block_k])
    args = (weight, *slots, dy_src, x_src, T, N, K, plan.num_groups, *dy_stride, *x_stride, *step)
    _launch(key, plan.grid, args, plan.constexprs, plan.options)
