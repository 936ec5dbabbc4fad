"""The norm of a linear layer's weight gradient dW = dy^T x, without storing dW.

Global-norm clipping (`forge.clip`) needs every gradient's norm before any parameter is updated.
This kernel is the fused kernel's main loop with a reducing epilogue: each program accumulates one
(BLOCK_N, BLOCK_K) tile of dW over all T tokens in fp32 registers with the code `wgrad_update` runs
(`forge.kernels.wgrad_tile`, by pointers, so the norm is that of the gradient the update applies),
then reduces it to one number (the sum of |g|^p, or the max of |g| for the infinity norm) and writes
that number to its own slot of a partials vector; nothing else is written. The launcher sums the
partials with torch, in a fixed order, so the norm is the same bits every run (atomics would not be).

Shapes and precision as `wgrad_update`: dy (T, N), x (T, K), bf16 on the tensor cores with fp32
accumulation, fp32 asked for IEEE products.
"""

import torch
import triton
import triton.language as tl

from forge.backend import interpreting
from forge.kernels.launch import DirectLauncher, cdiv, tensor_facts
from forge.kernels.wgrad_tile import wgrad_tile

NORMS = ("l2", "l1", "inf", "p")  # what a program reduces its tile to (NORM)


@triton.jit
def wgrad_norm_kernel(
    dy_ptr,  # (T, N) bf16 | fp32
    x_ptr,  # (T, K) bf16 | fp32
    partial_ptr,  # (tiles,) fp32: this program's sum of |g|^p (or max |g|)
    T, N, K,
    stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,
    p,  # NORM "p": the exponent
    NORM: tl.constexpr,  # "l2" | "l1" | "inf" | "p"
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
):
    tile = tl.program_id(0)
    tiles_k = tl.cdiv(K, BLOCK_K)  # tiles row by row
    n0 = (tile // tiles_k) * BLOCK_N
    k0 = (tile % tiles_k) * BLOCK_K
    acc = wgrad_tile(dy_ptr, x_ptr, T, N, K, n0, k0, stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,
                     "none", False, False, UPCAST_DOT, DOT_PRECISION, BLOCK_N, BLOCK_K, BLOCK_T)
    # Out-of-range rows and columns accumulated zeros: they add nothing to any of the reductions.
    g = tl.abs(acc)
    if NORM == "l2":
        partial = tl.sum(tl.sum(acc * acc, axis=1), axis=0)
    elif NORM == "l1":
        partial = tl.sum(tl.sum(g, axis=1), axis=0)
    elif NORM == "inf":
        partial = tl.max(tl.max(g, axis=1), axis=0)
    else:
        tl.static_assert(NORM == "p", "NORM must be l2, l1, inf or p")
        powered = tl.where(g > 0, tl.exp2(p * tl.log2(tl.where(g > 0, g, 1.0))), 0.0)
        partial = tl.sum(tl.sum(powered, axis=1), axis=0)
    tl.store(partial_ptr + tile, partial)


def norm_kind(norm_type: float) -> str:
    """The kernel's NORM for a norm type (2, 1, inf, or another positive p)."""
    if norm_type == 2.0:
        return "l2"
    if norm_type == 1.0:
        return "l1"
    if norm_type == float("inf"):
        return "inf"
    return "p"


_launch = DirectLauncher(wgrad_norm_kernel)


def wgrad_norm_partial(dy: torch.Tensor, x: torch.Tensor, norm_type: float = 2.0) -> torch.Tensor:
    """sum(|dy^T x|^p) as a 0-dim fp32 tensor (the max of |dy^T x| for p = inf), dW never stored.
    dy: (T, N), x: (T, K), any strides, one dtype (bf16 or fp32)."""
    T, N = dy.shape
    K = x.shape[1]
    on_interpreter = interpreting()
    exact = dy.dtype == torch.float32 or x.dtype == torch.float32
    if on_interpreter:  # the interpreter's cost is per program: few, large tiles
        block_n, block_k, block_t, warps = 64, 64, 64, 4
    else:
        block_n, block_k, block_t, warps = (64, 64, 32, 4) if exact else (128, 128, 64, 8)
    block_n = min(block_n, max(16, triton.next_power_of_2(N)))
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    block_t = min(block_t, max(16, triton.next_power_of_2(T)))
    tiles = cdiv(N, block_n) * cdiv(K, block_k)
    partials = torch.empty(tiles, dtype=torch.float32, device=dy.device)
    kind = norm_kind(norm_type)
    constexprs = dict(
        NORM=kind, UPCAST_DOT=on_interpreter or exact, DOT_PRECISION="ieee" if (exact or on_interpreter) else "tf32",
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_T=block_t,
    )
    # every fact the launch depends on (`forge.kernels.launch`): a problem seen before skips Triton's dispatch
    key = (T, N, K, dy.stride(), x.stride(), dy.get_device(), tensor_facts(dy, x, partials), kind)
    args = (dy, x, partials, T, N, K, *dy.stride(), *x.stride(), float(norm_type))
    _launch(key, (tiles,), args, constexprs, dict(num_warps=warps, num_stages=1 if on_interpreter else 3))
    return partials.max() if kind == "inf" else partials.sum()
