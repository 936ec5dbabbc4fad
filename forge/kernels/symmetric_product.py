"""C = beta D + alpha P Q^T for a product known to be symmetric, computing one triangle of C.

Newton-Schulz spends most of its time on products whose result is symmetric: the Gram matrix
A = X X^T, its square A A (= A A^T, A being symmetric), and in the Gram iteration
(`forge.newton_schulz`) products of two polynomials in the same symmetric R, which commute
(R Z = (R Z)^T). cuBLAS computes every tile of such a product; this kernel computes only the tiles
on and below the diagonal and stores each one twice, at (i, j) and transposed at (j, i): half the
multiply-adds for the same bytes written (flash-muon and Dao-AILab's symmetric GEMMs do the same).

Each program owns one (BLOCK, BLOCK) tile (i, j) with i >= j of the lower triangle of tiles, found
from its program id by inverting the triangular numbers. It accumulates P[i rows] Q[j rows]^T over K
in fp32 on the tensor cores (bf16 or fp16 operands, as `torch.addmm` does), adds beta D[i, j] (D
symmetric, or no D), rounds once to C's dtype and stores the tile and its transpose. On the
diagonal tiles the upper half is replaced by the lower half's mirror, so C is exactly symmetric
whatever the summation order did. The result equals `torch.addmm(D, P, Q.T, beta=beta,
alpha=alpha)` to the rounding of the fp32 accumulation (its order differs from cuBLAS's).

Cost: (T (T + 1) / 2) tiles of K multiply-adds for T = ceil(N / BLOCK) tile rows, against T^2 for
a full GEMM: about half at large N. The kernel is pure (it writes only C), so nothing stops a tuner
from timing it; its configs are fixed by size here (`_config`) to keep launches capturable.

Shapes: p_NK (N, K), q_NK (N, K), d_NN and c_NN (N, N).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forge.backend import interpreting
from forge.kernels.launch import DirectLauncher, tensor_facts
from forge.kernels.rounding import round_to_bf16_nearest

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _symmetric_product_kernel(
    c_ptr,  # (N, N) bf16 | fp16 | fp32: written, both triangles
    p_ptr,  # (N, K) as c
    q_ptr,  # (N, K) as c: the product is P Q^T
    d_ptr,  # (N, N) as c, symmetric; read only when HAS_D
    N, K,
    stride_pn, stride_pk, stride_qn, stride_qk, stride_dn, stride_dm, stride_cn, stride_cm,
    alpha,  # fp32: the product's factor
    beta,  # fp32: D's factor
    HAS_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,  # the interpreter: fp32 operands (its dot takes no bf16) and rounding in integers
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    # tile (i, j), j <= i, of the lower triangle: pid = i (i + 1) / 2 + j
    i = ((tl.sqrt(8.0 * pid.to(tl.float32) + 1.0) - 1.0) * 0.5).to(tl.int32)
    i = tl.where((i + 1) * (i + 2) // 2 <= pid, i + 1, i)  # float rounding, either way
    i = tl.where(i * (i + 1) // 2 > pid, i - 1, i)
    j = pid - i * (i + 1) // 2
    rows = (i * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    cols = (j * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    ks = tl.arange(0, BLOCK_K).to(tl.int64)
    p_tile = p_ptr + rows[:, None] * stride_pn + ks[None, :] * stride_pk
    q_tile = q_ptr + cols[None, :] * stride_qn + ks[:, None] * stride_qk  # Q^T's (BLOCK_K, BLOCK) tile
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        in_k = (k0 + ks) < K
        a = tl.load(p_tile, mask=(rows[:, None] < N) & in_k[None, :], other=0.0)
        b = tl.load(q_tile, mask=in_k[:, None] & (cols[None, :] < N), other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        p_tile += BLOCK_K * stride_pk
        q_tile += BLOCK_K * stride_qk
    inside = (rows[:, None] < N) & (cols[None, :] < N)
    out = alpha * acc
    if HAS_D:
        d = tl.load(d_ptr + rows[:, None] * stride_dn + cols[None, :] * stride_dm, mask=inside, other=0.0)
        out += beta * d.to(tl.float32)
    if UPCAST and c_ptr.dtype.element_ty == tl.bfloat16:  # the interpreter truncates on .to(bf16)
        out = round_to_bf16_nearest(out)
    else:
        out = out.to(c_ptr.dtype.element_ty)
    if i == j:  # exactly symmetric: the upper half is the lower half's mirror
        out = tl.where(rows[:, None] >= cols[None, :], out, tl.trans(out))
    tl.store(c_ptr + rows[:, None] * stride_cn + cols[None, :] * stride_cm, out, mask=inside)
    if i != j:
        mirror = c_ptr + cols[:, None] * stride_cn + rows[None, :] * stride_cm
        tl.store(mirror, tl.trans(out), mask=(cols[:, None] < N) & (rows[None, :] < N))


_launch = DirectLauncher(_symmetric_product_kernel)


def _config(n: int, k: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK, BLOCK_K, num_warps, num_stages): large tiles for the tensor cores on a GPU; in the
    interpreter, whose cost is per program, small shapes at few programs."""
    if interpreting():
        block = min(32, max(16, triton.next_power_of_2(n)))
        return block, min(32, max(16, triton.next_power_of_2(k))), 4, 1
    if dtype == torch.float32:
        return 64, 32, 4, 3
    if n >= 1024:
        return 128, 64, 8, 3
    return 64, 64, 4, 3


def symmetric_product(
    p: torch.Tensor,
    q: torch.Tensor | None = None,
    d: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> torch.Tensor:
    """beta d + alpha p q^T (q defaults to p) as a new (N, N) tensor of p's dtype, computing only one
    triangle: the caller vouches that the product is symmetric (p q^T = q p^T) and so is d."""
    q = p if q is None else q
    if p.dim() != 2 or p.shape != q.shape:
        raise ValueError(f"symmetric_product takes two (N, K) matrices of one shape, got {tuple(p.shape)}, "
                         f"{tuple(q.shape)}")  # fmt: skip
    if p.dtype not in DTYPES or q.dtype != p.dtype or (d is not None and d.dtype != p.dtype):
        raise ValueError(f"symmetric_product takes bf16, fp16 or fp32 operands of one dtype, got {p.dtype}, "
                         f"{q.dtype}{'' if d is None else ', ' + str(d.dtype)}")  # fmt: skip
    n, k = p.shape
    if d is not None and d.shape != (n, n):
        raise ValueError(f"d must be ({n}, {n}), got {tuple(d.shape)}")
    c = torch.empty(n, n, dtype=p.dtype, device=p.device)
    if n == 0:
        return c
    block, block_k, warps, stages = _config(n, k, p.dtype)
    tiles = triton.cdiv(n, block)
    d_arg = c if d is None else d
    upcast = interpreting()
    precision = "ieee" if p.dtype == torch.float32 or upcast else "tf32"  # bf16/fp16 ignore it
    constexprs = dict(HAS_D=d is not None, DOT_PRECISION=precision, UPCAST=upcast, BLOCK=block, BLOCK_K=block_k)
    strides = (*p.stride(), *q.stride(), *d_arg.stride(), *c.stride())
    key = (n, k, strides, p.get_device(), tensor_facts(p, q, d_arg, c), d is not None)
    args = (c, p, q, d_arg, n, k, *strides, float(alpha), float(beta))
    _launch(key, (tiles * (tiles + 1) // 2,), args, constexprs, dict(num_warps=warps, num_stages=stages))
    return c
