"""The main loop every weight-gradient kernel shares: one tile of dW = dy^T x, in fp32 registers.

Shapes: T tokens (all leading dims of the input flattened), N output features, K input features.
    dy_TN  the gradient of the layer's output    x_TK  the layer's input
    dy_NT  dy^T, contiguous along T (FP8)        x_KT  x^T, contiguous along T (FP8)

A plain backward computes all of dW = dy^T x with cuBLAS and writes its N*K elements to memory.
FORGE's kernels never do: each program owns one (BLOCK_N, BLOCK_K) tile of dW, runs the GEMM's
main loop for that tile alone (`wgrad_tile`: BLOCK_T tokens at a time, each step one `tl.dot` into
an fp32 accumulator), and then consumes the finished tile in registers. What it does with it is
the kernel's epilogue: the optimizer update (`forge.kernels.wgrad_update`) or a reduction to a norm
(`forge.kernels.wgrad_norm`, for global-norm clipping). Both call this loop, so the gradient whose
norm is clipped is, bit for bit, the gradient that is then applied.

How the operands are read (compile-time choices, made by the launchers):
- TMA "host": dy and x blocks arrive by bulk tensor copies through descriptors the host built
  (Hopper); rows and columns out of bounds read as zeros. TMA "none": masked pointer loads, with
  int64 offsets along the long stride (a (T, N) operand can pass 2^31 elements).
- Row-major dy_TN and x_TK (bf16, fp32): (BLOCK_T, BLOCK_N) and (BLOCK_T, BLOCK_K) blocks,
  acc += dy^T x.
- T_MAJOR, FP8 (`forge.fp8`: e5m2 dy_NT, e4m3 x_KT, the layout Hopper's FP8 MMA reads both
  operands in): (BLOCK_N, BLOCK_T) and (BLOCK_K, BLOCK_T) blocks, acc += dy x^T. Each block's
  products are added into the fp32 accumulator (`max_num_imprecise_acc` of one block: the FP8
  MMA keeps fewer bits in its own accumulator, and cuBLAS adds into fp32 the same way), unless
  FAST_ACCUM keeps the MMA's own accumulator over all of T (cuBLAS's fast accumulation).

Precision, as cuBLAS: bf16 operands on the tensor cores with fp32 accumulation; fp32 operands with
DOT_PRECISION "ieee" (exact fp32 products, not tf32), so that the update equals torch.optim's on
the fp32 gradient up to the order of the sum over T. Triton's CPU interpreter computes `tl.dot`
on bf16 wrongly, so there the blocks are widened to fp32 first (UPCAST_DOT).

Cost: 2*T*BLOCK_N*BLOCK_K FLOPs a program, and T*(BLOCK_N + BLOCK_K) operand elements read, most
of them from L2: `tile_origin` walks GROUP_N tiles of N down one column of K tiles together, so
the programs running at once share x's blocks.

The warp-specialized Gluon kernel (`forge.kernels.wgrad_update_ws`) runs its own main loop (TMA
loader and wgmma warps), but takes its tiles in `tile_origin`'s order too.
"""

import triton
import triton.language as tl


@triton.jit
def tile_origin(tile, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr):
    """(n0, k0), the first row and column of dW's `tile`-th tile: GROUP_N consecutive tiles of N
    share a column of x's blocks in L2, then the next column."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_N * tl.cdiv(K, BLOCK_K)
    first_n = (tile // per_group) * GROUP_N
    group_rows = min(tiles_n - first_n, GROUP_N)
    pid_n = first_n + (tile % per_group) % group_rows
    pid_k = (tile % per_group) // group_rows
    return pid_n * BLOCK_N, pid_k * BLOCK_K


@triton.jit
def wgrad_tile(
    dy_src,  # (T, N) dy, or T_MAJOR (N, T) dy^T; bf16 | fp32 | fp8: a TMA descriptor (TMA "host") or a pointer
    x_src,  # (T, K) x, or T_MAJOR (K, T) x^T; bf16 | fp32 | fp8: likewise
    T, N, K,
    n0, k0,  # the tile's first row (of N) and column (of K)
    stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,  # element strides (pointers only)
    TMA: tl.constexpr,  # "host": bulk tensor copies through host-built descriptors; "none": pointers
    T_MAJOR: tl.constexpr,  # dy and x contiguous along T (FP8)
    FAST_ACCUM: tl.constexpr,  # T_MAJOR: the MMA's own accumulator over all of T
    UPCAST_DOT: tl.constexpr,  # interpreter (and fp32): widen the blocks to fp32 before the dot
    DOT_PRECISION: tl.constexpr,  # "ieee" for exact fp32 products
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """The (BLOCK_N, BLOCK_K) fp32 tile of dW at (n0, k0), summed over all T tokens in BLOCK_T
    steps; rows and columns past N and K hold zeros."""
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if TMA == "host":
        for t0 in range(0, T, BLOCK_T):
            if T_MAJOR:
                dy = dy_src.load([n0, t0])
                x = x_src.load([k0, t0])
            else:
                dy = dy_src.load([t0, n0])
                x = x_src.load([t0, k0])
            acc = _add_products(acc, dy, x, T_MAJOR, FAST_ACCUM, UPCAST_DOT, DOT_PRECISION, BLOCK_T)
    else:
        dy_ptrs = _first_block(dy_src, n0, stride_dy_t, stride_dy_n, T_MAJOR, BLOCK_N, BLOCK_T)
        x_ptrs = _first_block(x_src, k0, stride_x_t, stride_x_k, T_MAJOR, BLOCK_K, BLOCK_T)
        for t0 in range(0, T, BLOCK_T):
            dy = tl.load(dy_ptrs, mask=_in_bounds(t0, n0, T, N, T_MAJOR, BLOCK_N, BLOCK_T), other=0.0)
            x = tl.load(x_ptrs, mask=_in_bounds(t0, k0, T, K, T_MAJOR, BLOCK_K, BLOCK_T), other=0.0)
            acc = _add_products(acc, dy, x, T_MAJOR, FAST_ACCUM, UPCAST_DOT, DOT_PRECISION, BLOCK_T)
            dy_ptrs += BLOCK_T * stride_dy_t
            x_ptrs += BLOCK_T * stride_x_t
    return acc


@triton.jit
def _first_block(src, i0, stride_t, stride_i, T_MAJOR: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_T: tl.constexpr):
    """Pointers to an operand's first block of tokens, for its BLOCK_I features from i0 (dy's along
    N, x's along K): (BLOCK_T, BLOCK_I), or T_MAJOR (BLOCK_I, BLOCK_T). The long stride in int64."""
    offs_i = i0 + tl.arange(0, BLOCK_I)
    offs_t = tl.arange(0, BLOCK_T)
    if T_MAJOR:
        ptrs = src + offs_i.to(tl.int64)[:, None] * stride_i + offs_t[None, :] * stride_t
    else:
        ptrs = src + offs_t.to(tl.int64)[:, None] * stride_t + offs_i[None, :] * stride_i
    return ptrs


@triton.jit
def _in_bounds(t0, i0, T, LIMIT, T_MAJOR: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_T: tl.constexpr):
    """The mask of `_first_block`'s block moved on to token t0: tokens below T, features below LIMIT."""
    i_ok = (i0 + tl.arange(0, BLOCK_I)) < LIMIT
    t_ok = (t0 + tl.arange(0, BLOCK_T)) < T
    if T_MAJOR:
        mask = i_ok[:, None] & t_ok[None, :]
    else:
        mask = t_ok[:, None] & i_ok[None, :]
    return mask


@triton.jit
def _add_products(acc, dy, x, T_MAJOR: tl.constexpr, FAST_ACCUM: tl.constexpr, UPCAST_DOT: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, BLOCK_T: tl.constexpr):
    """acc + dy^T x for one block of each operand (T_MAJOR: acc + dy x^T)."""
    if UPCAST_DOT:
        dy = dy.to(tl.float32)
        x = x.to(tl.float32)
    if not T_MAJOR:
        acc = tl.dot(tl.trans(dy), x, acc, input_precision=DOT_PRECISION)
    elif FAST_ACCUM:
        acc = tl.dot(dy, tl.trans(x), acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(dy, tl.trans(x), acc, input_precision=DOT_PRECISION, max_num_imprecise_acc=BLOCK_T)
    return acc
