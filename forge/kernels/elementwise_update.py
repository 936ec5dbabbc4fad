"""The optimizer update for parameters that are not nn.Linear weights, from their gradient.

Embeddings, norms, biases and tied weights get their gradient the ordinary way; a
post-accumulate-grad hook hands it to this kernel during the backward pass and drops it right after,
so at most one such gradient exists at a time. Each program loads one tile of the gradient and hands
it to `update_tile`, the fused kernel's own epilogue: same rule, same state storage, same layout.

Shapes: the parameter and its gradient viewed as (R, C) = (numel / last dim, last dim), a vector as
(1, numel); int8 scales (R, ceil(C / int8_group)), int8_group 64 or 128.
"""

import torch
import triton
import triton.language as tl

from forge.backend import interpreting
from forge.kernels.launch import DirectLauncher, cdiv, next_power_of_2, tensor_facts
from forge.kernels.quant import GROUP
from forge.kernels.update_tile import (
    epilogue_constexprs,
    epilogue_facts,
    load_step_values,
    slot_arguments,
    step_arguments,
    update_tile,
)


# `seed` changes every step: specializing on its value (== 1, divisible by 16) would compile a new
# variant whenever a step's seed first falls in another class, in the middle of training.
@triton.jit(do_not_specialize=["seed"])
def elementwise_update_kernel(
    w_ptr,  # (R, C) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (R, C) state slots, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # (R, NUM_GROUPS) bf16 int8 block scales, updated in place
    r_ptr,  # KAHAN: (R, C) bf16 residual of the weight, updated in place; else unread
    g_ptr,  # (R, C) the gradient, contiguous, any float dtype
    R, C, NUM_GROUPS,
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 rule coefficients for this step
    seed,  # int32 stochastic-rounding seed
    step_ptr,  # STEPS_IN_MEMORY: an int32 row holding this step's h0..h8 and seed; else unread
    scale_ptr,  # GRAD_SCALE: one fp32 the gradient is multiplied by (the clip coefficient); else unread
    UPDATE: tl.constexpr,  # the update: rule, state slots, storage (`update_tile.epilogue_constexprs`)
    GRAD_SCALE: tl.constexpr,  # scale the gradient by *scale_ptr (global-norm clipping)
    STEPS_IN_MEMORY: tl.constexpr,  # read the step's scalars from step_ptr (a launch a CUDA graph replays)
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,  # BLOCK_C a multiple of QGROUP
):
    """One program per (BLOCK_R, BLOCK_C) tile of the parameter: load its gradient, update it."""
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    if STEPS_IN_MEMORY:
        step = load_step_values(step_ptr)
    r_start = tl.program_id(0) * BLOCK_R
    c_start = tl.program_id(1) * BLOCK_C
    offs_r = r_start + tl.arange(0, BLOCK_R)
    offs_c = c_start + tl.arange(0, BLOCK_C)
    offs = offs_r.to(tl.int64)[:, None] * C + offs_c[None, :]
    g = tl.load(g_ptr + offs, mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0).to(tl.float32)
    if GRAD_SCALE:
        g = g * tl.load(scale_ptr)
    update_tile(g, r_start, c_start, params, R, C, NUM_GROUPS, step, UPDATE, BLOCK_R, BLOCK_C)


_launch = DirectLauncher(elementwise_update_kernel)


def num_warps(block_c: int) -> int:
    """Warps of a program: 8 for the 512-column blocks of parameters wider than 1024 (measured on
    the H200 at Llama-3.1-8B's embedding: 8 x 512 blocks moved 4.09 TB/s with 8 warps against 3.66
    with 4 for bf16 states, 1.97 against 1.55 for int8), 4 below."""
    return 8 if block_c >= 512 else 4


def as_rows(t: torch.Tensor) -> tuple[int, int]:
    """The (rows, cols) view FORGE uses for a parameter of any shape."""
    cols = t.shape[-1] if t.dim() > 1 else t.numel()
    return t.numel() // max(cols, 1), cols


def elementwise_update(
    param: torch.Tensor, grad: torch.Tensor, states: tuple, scales: tuple, signed: tuple,
    coefficients: tuple, seed: int,
    *, rule: str, flags: dict, state_dtype: str, stochastic_rounding: bool, int8_group: int = 64,
    step_values: torch.Tensor | None = None, grad_scale: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    """Apply one optimizer step to `param` from `grad`, in place (states and scales too).
    `step_values`, `grad_scale`: as for `wgrad_update` (the step's scalars read from device memory
    instead; a coefficient the gradient is multiplied by; the weight's bf16 residual)."""
    assert param.is_contiguous(), "FORGE updates parameters in place and needs them contiguous"
    grad = grad.contiguous()
    rows, cols = as_rows(param)
    if interpreting():  # the interpreter's cost is per program: wide rows (vectors) in long blocks
        block_c = 64 if cols <= 64 else 128 if cols <= 1024 else 1024
    else:
        block_c = 64 if cols <= 64 else 256 if cols <= 1024 else 512
    if state_dtype == "int8":
        block_c = max(block_c, int8_group)  # a tile spans whole int8 groups
    else:
        int8_group = GROUP  # no scales: any group size that divides the block (64) does
    block_r = max(1, min(next_power_of_2(rows), 4096 // block_c))
    grid = (cdiv(rows, block_r), cdiv(cols, block_c))
    slots = slot_arguments(param, states, scales, residual)
    args = (param, *slots, grad, rows, cols, cdiv(cols, int8_group),
            *step_arguments(param, coefficients, seed, step_values, grad_scale))
    constexprs = dict(
        **epilogue_constexprs(states, signed, rule=rule, flags=flags, state_dtype=state_dtype,
                              stochastic_rounding=stochastic_rounding, int8_group=int8_group,
                              grad_scale=grad_scale is not None, kahan=residual is not None),
        STEPS_IN_MEMORY=step_values is not None, BLOCK_R=block_r, BLOCK_C=block_c,
    )
    # Every fact the launch depends on (`forge.kernels.launch`): the block shape and compile-time
    # arguments above follow from these.
    key = (rows, cols, param.get_device(), tensor_facts(param, *slots, grad),
           epilogue_facts(states, signed, rule, flags, state_dtype, stochastic_rounding, int8_group, step_values,
                          grad_scale, residual))
    _launch(key, grid, args, constexprs, dict(num_warps=num_warps(block_c)))
