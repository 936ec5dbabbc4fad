"""The FORGE kernel: the weight-gradient GEMM of a linear layer fused with its optimizer update.

Shapes: T tokens (all leading dims of the input flattened), N output features, K input features.
    x_TK   the layer's input            dy_TN  the gradient of its output
    w_NK   the weight, updated in place s*_NK  the optimizer states, updated in place

A plain backward computes dW = dy^T x (N x K, written to memory), and later the optimizer reads dW,
W and the states and writes W and the states back. Here one launch does both, tile by tile: each
program owns one (BLOCK_N, BLOCK_K) tile of W, accumulates its gradient over all T tokens in fp32
registers (the GEMM's main loop), then loads the matching tiles of W and of the states, applies the
rule in fp32 (`forge.rules.apply_rule`), and stores W and the states. dW never exists in memory:
the gradient memory of a layer drops from N*K elements to one tile per running program, and the
optimizer's second pass over memory (read dW, W, states; write W, states) shrinks to one read and
one write of W and the states, done while the tile's operands are still on chip.

Cost: the GEMM's 2*T*N*K FLOPs, plus the update's bytes, which for bf16 weights and bf16 states are
2 + 2*2 bytes read and the same written per element (fp32 states: 2 + 2*4). For T of a few thousand
the update's bytes take about as long as the matrix work; the epilogue is the part to hide.

Exactness: with fp32 inputs the dot is asked for IEEE fp32 (not tf32), so the update equals
torch.optim's on the full fp32 gradient up to the order of the sum over T. bf16 inputs use the
tensor cores with fp32 accumulation, exactly as cuBLAS does.

This kernel updates W and the states in place: it must never be re-run by an autotuner (each run
would apply another optimizer step). Block shapes come from `_pick_config`, a table measured
offline (see docs/perf-notes.md). A `KernelConfig` may also ask for a persistent grid (a few
programs per multiprocessor, each looping over tiles), or another way to read dy and x (`tma`:
descriptors built on the host, in the kernel, or masked pointers, which cost the host less per
launch): the same arithmetic per tile, another schedule, offered to the offline tuner.

Host cost: a launch's plan (config, operand path, grid, compile-time arguments) is cached under a
key of every fact it depends on, and on a GPU the launch itself skips Triton's per-call dispatch
once the key has been seen (`forge.kernels.launch`).

On Hopper, with bf16 operands on large enough grids, `wgrad_update` launches the
warp-specialized twin of this kernel instead (`forge.kernels.wgrad_update_ws`: the same tile update,
run by other warps while the next tile's GEMM runs; where it wins is measured, see `_HOPPER_WS_DEFAULTS`);
`FORGE_WARP_SPECIALIZED=0` in the environment, read at a problem's first launch, keeps this one.
"""

import functools
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from forge.kernels import _cdiv, interpreting
from forge.kernels.launch import DirectLauncher, tensor_facts

try:  # Gluon (Triton >= 3.5): the warp-specialized kernel for Hopper
    from forge.kernels import wgrad_update_ws
except ImportError:
    wgrad_update_ws = None
from forge.kernels.update_tile import (
    epilogue_constexprs,
    finish_tile,
    load_step_values,
    load_tile,
    slot_arguments,
    step_arguments,
    update_tile,
)


@triton.jit
def _halves(tile, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Split a (ROWS, COLS) register tile into its top and bottom (ROWS // 2, COLS) halves."""
    return tl.split(tl.permute(tl.reshape(tile, (2, ROWS // 2, COLS)), (1, 2, 0)))


# `seed` changes every step: specializing on its value (== 1, divisible by 16) would compile a new
# variant whenever a step's seed first falls in another class, in the middle of training.
@triton.jit(do_not_specialize=["seed"])
def _wgrad_update_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16 | int8/uint8 codes, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # (N, NUM_GROUPS) bf16 int8 block scales, updated in place
    dy_src,  # (T, N) bf16 | fp32 gradient of the layer's output: a TMA descriptor (TMA "host") or a pointer
    x_src,  # (T, K) bf16 | fp32 input of the layer: a TMA descriptor (TMA "host") or a pointer
    T, N, K, NUM_GROUPS,
    stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,  # element strides (pointer path only)
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 rule coefficients for this step (forge.rules)
    seed,  # int32 stochastic-rounding seed for this step and tensor
    step_ptr,  # STEPS_IN_MEMORY: an int32 row holding this step's h0..h8 and seed; else unread
    RULE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    S1_SIGNED: tl.constexpr, S2_SIGNED: tl.constexpr, S3_SIGNED: tl.constexpr,
    STATE_DTYPE: tl.constexpr,  # "fp32" | "bf16" | "int8"
    QGROUP: tl.constexpr,  # int8: elements per scale along K (64 or 128)
    STOCHASTIC_ROUNDING: tl.constexpr,
    STEPS_IN_MEMORY: tl.constexpr,  # read the step's scalars from step_ptr (a launch a CUDA graph replays)
    TMA: tl.constexpr,  # dy and x by bulk tensor copies, descriptors built on the "host" or on the "device"; "none"
    UPCAST_DOT: tl.constexpr,  # interpreter: tl.dot on bf16 is wrong there, so dot in fp32
    DOT_PRECISION: tl.constexpr,  # "ieee" for exact fp32 products
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
    GROUP_N: tl.constexpr,  # tiles of N walked together, for L2 reuse of x
    EPILOGUE_SPLIT: tl.constexpr,  # 1, 2, 4 or 8: update the tile in this many row slices (registers)
    OVERLAP_SLICES: tl.constexpr,  # load slice i + 1 before slice i is updated and stored
    PERSISTENT: tl.constexpr,  # a fixed grid whose programs loop over tiles (else one tile each)
    FLATTEN: tl.constexpr,  # persistent: let the pipeliner run the next tile's loads under this epilogue
):
    if STEPS_IN_MEMORY:
        h0, h1, h2, h3, h4, h5, h6, h7, h8, seed = load_step_values(step_ptr)
    tiles = tl.cdiv(N, BLOCK_N) * tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
            _one_tile(tile, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, dy_src, x_src,
                      T, N, K, NUM_GROUPS, stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,
                      h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                      RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                      STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, TMA, UPCAST_DOT, DOT_PRECISION,
                      BLOCK_N, BLOCK_K, BLOCK_T, GROUP_N, EPILOGUE_SPLIT, OVERLAP_SLICES)
    else:
        _one_tile(tl.program_id(0), w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, dy_src, x_src,
                  T, N, K, NUM_GROUPS, stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,
                  h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                  RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                  STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, TMA, UPCAST_DOT, DOT_PRECISION,
                  BLOCK_N, BLOCK_K, BLOCK_T, GROUP_N, EPILOGUE_SPLIT, OVERLAP_SLICES)


@triton.jit
def _one_tile(
    tile, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, dy_src, x_src,
    T, N, K, NUM_GROUPS, stride_dy_t, stride_dy_n, stride_x_t, stride_x_k,
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
    RULE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    S1_SIGNED: tl.constexpr, S2_SIGNED: tl.constexpr, S3_SIGNED: tl.constexpr,
    STATE_DTYPE: tl.constexpr, QGROUP: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    TMA: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
    GROUP_N: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr, OVERLAP_SLICES: tl.constexpr,
):
    """Accumulate the gradient of one (BLOCK_N, BLOCK_K) tile of W over all T, then update it."""
    # Grouped ordering: GROUP_N consecutive tiles share a column of x tiles in L2.
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_k = tl.cdiv(K, BLOCK_K)
    per_group = GROUP_N * tiles_k
    first_n = (tile // per_group) * GROUP_N
    group_rows = min(tiles_n - first_n, GROUP_N)
    pid_n = first_n + (tile % per_group) % group_rows
    pid_k = (tile % per_group) // group_rows
    n0 = pid_n * BLOCK_N
    k0 = pid_k * BLOCK_K

    # Main loop: the gradient tile dW[n, k] = sum_t dy[t, n] x[t, k], in fp32 registers.
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if TMA != "none":  # out-of-bounds rows and columns read as zeros
        if TMA == "device":  # plain pointers crossed the launch: each program builds its descriptors
            dy_src = tl.make_tensor_descriptor(dy_src, [T, N], [stride_dy_t, 1], [BLOCK_T, BLOCK_N])
            x_src = tl.make_tensor_descriptor(x_src, [T, K], [stride_x_t, 1], [BLOCK_T, BLOCK_K])
        for t0 in range(0, T, BLOCK_T):
            dy = dy_src.load([t0, n0])
            x = x_src.load([t0, k0])
            if UPCAST_DOT:
                dy = dy.to(tl.float32)
                x = x.to(tl.float32)
            acc = tl.dot(tl.trans(dy), x, acc, input_precision=DOT_PRECISION)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_t = tl.arange(0, BLOCK_T)
        dy_ptrs = dy_src + offs_t.to(tl.int64)[:, None] * stride_dy_t + offs_n[None, :] * stride_dy_n
        x_ptrs = x_src + offs_t.to(tl.int64)[:, None] * stride_x_t + offs_k[None, :] * stride_x_k
        for t0 in range(0, T, BLOCK_T):
            t_ok = (t0 + offs_t) < T
            dy = tl.load(dy_ptrs, mask=t_ok[:, None] & (offs_n[None, :] < N), other=0.0)
            x = tl.load(x_ptrs, mask=t_ok[:, None] & (offs_k[None, :] < K), other=0.0)
            if UPCAST_DOT:
                dy = dy.to(tl.float32)
                x = x.to(tl.float32)
            acc = tl.dot(tl.trans(dy), x, acc, input_precision=DOT_PRECISION)
            dy_ptrs += BLOCK_T * stride_dy_t
            x_ptrs += BLOCK_T * stride_x_t

    # Epilogue: the optimizer update on the finished tile, in row slices that bound the registers
    # held by W and state tiles; the gradient dies in registers.
    _update_in_slices(acc, n0, k0, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                      N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                      RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                      STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, EPILOGUE_SPLIT, OVERLAP_SLICES, BLOCK_N, BLOCK_K)


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
def _update_in_slices(
    acc, n0, k0, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
    N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
    RULE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr,
    HAS_S1: tl.constexpr, HAS_S2: tl.constexpr, HAS_S3: tl.constexpr,
    S1_SIGNED: tl.constexpr, S2_SIGNED: tl.constexpr, S3_SIGNED: tl.constexpr,
    STATE_DTYPE: tl.constexpr, QGROUP: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    SPLIT: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Update the tile in SPLIT (1, 2, 4 or 8) row slices, top first. In slice order a slice's
    loads wait for the stores of the slice before it, so every slice pays a full memory latency;
    with OVERLAP each slice's W and states are loaded before the slice above it is updated and
    stored (a slice's loads do not depend on its gradient): two slices' loads in flight."""
    ROWS: tl.constexpr = BLOCK_N // SPLIT
    parts = _slices(acc, BLOCK_N, BLOCK_K, SPLIT)
    if OVERLAP:
        loaded = load_tile(n0, k0, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, N, K, NUM_GROUPS,
                           HAS_S1, HAS_S2, HAS_S3, STATE_DTYPE, QGROUP, ROWS, BLOCK_K)
        for i in tl.static_range(SPLIT):
            if i + 1 < SPLIT:
                following = load_tile(n0 + (i + 1) * ROWS, k0, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                                      N, K, NUM_GROUPS, HAS_S1, HAS_S2, HAS_S3, STATE_DTYPE, QGROUP, ROWS, BLOCK_K)
            finish_tile(parts[i], n0 + i * ROWS, k0, loaded, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                        N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                        RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                        STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, ROWS, BLOCK_K)
            if i + 1 < SPLIT:
                loaded = following
    else:
        for i in tl.static_range(SPLIT):
            update_tile(parts[i], n0 + i * ROWS, k0, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                        N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                        RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                        STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, ROWS, BLOCK_K)


@dataclass(frozen=True)
class KernelConfig:
    """Launch shape of the fused kernel (chosen per problem shape, never by re-running it)."""

    block_n: int
    block_k: int
    block_t: int
    group_n: int = 8
    epilogue_split: int = 1
    num_warps: int = 8
    num_stages: int = 3
    maxnreg: int | None = None  # a register cap lets two programs share a multiprocessor
    # A fixed grid of `programs_per_sm` programs per multiprocessor looping over the tiles (0: one
    # program per tile); with `flatten`, Triton pipelines the tile loop and the T loop as one, so
    # the next tile's first loads are in flight during this tile's epilogue.
    programs_per_sm: int = 0
    flatten: bool = False
    # Hopper, how the main loop reads dy and x: "host", bulk tensor copies (TMA) through
    # descriptors built on the host, which Triton's launcher encodes on every call (~35 us of
    # host); "device", the same copies through descriptors each program builds in global scratch
    # (a launch of plain pointers); "none", masked pointer loads (a slower main loop). The host's
    # cost matters where the GEMM is shorter than its launch.
    tma: str = "host"
    # Load each epilogue slice's W and states before the slice above it is updated and stored (two
    # slices' loads in flight instead of one; a few more registers). In the warp-specialized kernel
    # a tile's first slice is also loaded before its gradient is ready.
    overlap_slices: bool = False
    # The warp-specialized kernel (`forge.kernels.wgrad_update_ws`; Hopper, bf16 operands, every
    # state dtype): `num_warps` epilogue warps beside 4 MMA warps and a loader, a ring of
    # `num_stages` dy and x tiles, the update `epilogue_rows` rows at a time. Tile shape and ring
    # depth as the fields above; one program per multiprocessor.
    warp_specialized: bool = False
    epilogue_rows: int = 32
    # Warp-specialized only: approximate sqrt and division (a few fp32 ulps) and the hardware's
    # round-to-nearest for bf16 stores (the same bits as the integer form the interpreter needs).
    # For bf16 and int8 states, whose own rounding is ~2^14 times coarser or more (their default on Hopper);
    # off, the epilogue matches torch.optim's arithmetic as the Triton kernel does.
    fast_epilogue: bool = False


# Hopper, measured offline (`python -m harness kernels --tune`, results/tuning/, docs/perf-notes.md):
# capping registers at 128 lets two programs share a multiprocessor, so one's epilogue (memory-bound)
# overlaps the other's main loop (tensor cores); three stages keep both within shared memory. At
# T <= 2048 the epilogue weighs more than the main loop: 16-row slices (no spills) gain 3-9% with
# bf16 states, and 64-row tiles (no spills) 15-29% with int8 states on the Llama-3.1-8B gate and q
# shapes; at T = 8192 both lose to the 128 x 128 tile in 32-row slices. The int8 64-row tiles also
# load each slice before the one above is stored (1-3.5% on every point at T <= 2048). fp32 and
# int8 states take 16-row slices at every other T too: in 32-row ones their epilogue spills (fp32:
# 39 stores and loads, int8: 23 stores, 45 loads, triton 3.6), and 16-row ones ran faster on 23 of
# the 24 tuned points above T = 2048 and fp32's at T <= 2048: fp32 0.93-0.97x bar q at T = 16384
# (1.02x), int8 0.85-0.99x (results/tuning/tuning-20261130-034728.jsonl, -034119.jsonl). Below
# _HOST_BOUND_FLOPS the GEMM is shorter than the launch: masked pointer loads cost the GPU 5-9 us
# there (k at T = 1024 and 2048) and the host 27-47 us less per launch than two TMA descriptors.
_HOPPER = KernelConfig(block_n=128, block_k=128, block_t=64, group_n=8, epilogue_split=8, num_warps=8,
                       num_stages=3, maxnreg=128)
_HOPPER_SMALL_T = {"int8": replace(_HOPPER, block_n=64, epilogue_split=4, overlap_slices=True)}
_HOPPER_LARGE_T = {"bf16": replace(_HOPPER, epilogue_split=4)}  # spill-free for bf16 states
_HOST_BOUND_FLOPS = 2e10
# The warp-specialized kernel (docs/perf-notes.md, tenth to fourteenth sessions), launched by
# default where it measured faster than the Triton kernel on the H200 (`_WS_MIN_TILES_PER_SM`).
# Both state dtypes take 8 epilogue warps and overlapped slices at every T
# (results/tuning/tuning-20261130-040116.jsonl, twelfth session): fp32 states the exact epilogue in
# 16-row slices, 0.957-0.989x the previous table on the 8 gate and q points (8 warps in 32-row
# slices at T <= 2048, 4 warps above); bf16 states the fast epilogue in 32-row slices,
# 0.956-0.997x the fast epilogue without overlap at T <= 2048 and 0.962-1.006x the exact epilogue
# above. Against the Triton kernel: 0.71-0.85x (bf16) and 0.89-0.95x (fp32) at T <= 2048. GEMMs
# shorter than their launch take the Triton kernel unless a config asks. int8 states (thirteenth
# session) take bf16's config: their codes step by ~1/254 of a group's maximum, so the fast
# epilogue's few fp32 ulps move a code only on a rounding boundary; it builds without spills
# (5480 SASS instructions against 9144 for the exact epilogue in 16-row slices, triton 3.6: the
# fast quantization divides by one reciprocal per group, `quant._scaled`). Measured against the
# Triton kernel on the large Llama-3.1-8B layers: 0.67-0.82x at T <= 4096, 0.83-0.94x above
# (results/kernels/kernels-20261130-061909.jsonl against -054537.jsonl).
_HOPPER_WS = KernelConfig(block_n=128, block_k=128, block_t=64, num_warps=8, num_stages=4, warp_specialized=True,
                          epilogue_rows=32, overlap_slices=True)
_HOPPER_WS_DEFAULTS = {  # state dtype -> config, at every T
    "fp32": replace(_HOPPER_WS, epilogue_rows=16),  # 32-row overlapped slices spill 56-80 bytes
    "bf16": replace(_HOPPER_WS, fast_epilogue=True),
    "int8": replace(_HOPPER_WS, fast_epilogue=True),
}
_WS_STATE_DTYPES = tuple(_HOPPER_WS_DEFAULTS)  # what the kernel can run
# Grids smaller than this many tiles per multiprocessor keep the Triton kernel. bf16 and int8
# states take the warp-specialized one from one tile per multiprocessor (fourteenth session,
# results/kernels/tuning-20261130-073825.jsonl and -080010.jsonl): against the Triton kernel, on
# Qwen3-14B's k (320 tiles) 0.77-0.93x (bf16) and 0.77-0.91x (int8) at T = 1024-16384; on
# Llama-3.1-8B's k (256 tiles) 0.91-1.05x (bf16) and 0.76-1.04x (int8) over the two runs. fp32
# states are not timed there.
_WS_MIN_TILES_PER_SM = {"fp32": 4, "bf16": 1, "int8": 1}


@functools.lru_cache(maxsize=256)  # asked on every launch; a few shapes per model
def _pick_config(
    T: int, N: int, K: int, state_dtype: str, on_interpreter: bool, int8_group: int = 64
) -> KernelConfig:
    if on_interpreter:
        # Few, small programs: the interpreter's cost is per program and per operation. A tile
        # spans whole int8 groups.
        block_n = 16 if N <= 16 else 32
        block_k = int8_group if state_dtype == "int8" else 64
        return KernelConfig(block_n=block_n, block_k=block_k, block_t=32 if T > 16 else 16, group_n=4, num_warps=4)
    cfg = (_HOPPER_SMALL_T if T <= 2048 else _HOPPER_LARGE_T).get(state_dtype, _HOPPER)
    if 2 * T * N * K < _HOST_BOUND_FLOPS:
        cfg = replace(cfg, tma="none")
    return cfg


def _warp_specialized_config(T: int, N: int, K: int, state_dtype: str, dy: torch.Tensor, x: torch.Tensor,
                             on_interpreter: bool) -> KernelConfig | None:
    """The warp-specialized config where FORGE launches that kernel unasked, else None (the Triton
    kernel's table): see `_HOPPER_WS_DEFAULTS`."""
    if (wgrad_update_ws is None or on_interpreter or os.environ.get("FORGE_WARP_SPECIALIZED", "1") == "0"
            or state_dtype not in _WS_STATE_DTYPES or dy.dtype != torch.bfloat16 or x.dtype != torch.bfloat16
            or 2 * T * N * K < _HOST_BOUND_FLOPS or not (_can_use_tma(dy) and _can_use_tma(x))
            or not _is_hopper(dy.device)):
        return None
    config = _HOPPER_WS_DEFAULTS[state_dtype]
    if _cdiv(N, config.block_n) * _cdiv(K, config.block_k) < _WS_MIN_TILES_PER_SM[state_dtype] * _multiprocessors(dy.device):
        return None
    return config


@functools.cache
def _is_hopper(device: torch.device) -> bool:
    """sm_90 exactly: wgmma, which the warp-specialized kernel is written with, is Hopper's alone."""
    return torch.cuda.get_device_capability(device)[0] == 9


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of the device (the CPU interpreter: a few, to exercise the loop)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """Hopper or newer (asked once per device: the query costs microseconds on every launch)."""
    return torch.cuda.get_device_capability(device)[0] >= 9


def _tma_layout(t: torch.Tensor) -> bool:
    """Bulk tensor copies need a 2-D 16-bit tensor with unit last stride, 16-byte aligned rows and base."""
    return (
        t.dtype in (torch.bfloat16, torch.float16)
        and t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def _can_use_tma(t: torch.Tensor) -> bool:
    """A CUDA tensor that a Hopper (or newer) GPU can read by bulk tensor copies."""
    return t.is_cuda and _tma_layout(t) and _has_tma(t.device)


def _tma_mode(requested: str, dy: torch.Tensor, x: torch.Tensor, exact: bool, on_interpreter: bool) -> str:
    """The config's `tma` where the operands allow it, else "none". Exact fp32 products always read
    by pointers; the interpreter has no host descriptors of its own but builds device ones."""
    if requested == "none" or exact or dy.dtype != x.dtype:
        return "none"
    if on_interpreter:
        return requested if requested == "device" and _tma_layout(dy) and _tma_layout(x) else "none"
    return requested if _can_use_tma(dy) and _can_use_tma(x) else "none"


_scratch: dict[int | None, torch.Tensor] = {}


def _descriptor_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for the descriptors that programs build ("device" TMA): one buffer per
    stream, reused, since launches on a stream run one after another (torch.empty per launch would
    cost the host what the device descriptors save)."""
    buffer = _scratch.get(stream)
    if buffer is None or buffer.numel() < size:
        buffer = _scratch[stream] = torch.empty(max(size, 1 << 20), dtype=torch.int8, device="cuda")
    return buffer


@dataclass(frozen=True)
class _Plan:
    """What a launch of one problem needs besides its tensors and this step's scalars."""

    config: KernelConfig
    tma: str  # how the main loop reads dy and x, where the operands allow the config's choice; "gluon": wgrad_update_ws
    grid: tuple
    num_groups: int
    constexprs: dict
    options: dict
    on_interpreter: bool


_plans: dict = {}
_launch = DirectLauncher(_wgrad_update_kernel)
_launch_ws = DirectLauncher(wgrad_update_ws.wgrad_update_ws_kernel) if wgrad_update_ws is not None else None


def _plan(weight, states, signed, dy, x, *, rule, flags, state_dtype, stochastic_rounding, int8_group, config,
          steps_in_memory):
    """Config, operand path, grid and compile-time arguments of a launch (once per problem key)."""
    T, N = dy.shape
    K = x.shape[1]
    assert weight.shape == (N, K) and weight.is_contiguous(), "weight must be a contiguous (N, K) tensor"
    on_interpreter = interpreting()
    if config is None:
        config = _warp_specialized_config(T, N, K, state_dtype, dy, x, on_interpreter)
    elif config.warp_specialized and not (state_dtype in _WS_STATE_DTYPES and _can_use_tma(dy) and _can_use_tma(x)
                                          and _is_hopper(dy.device) and wgrad_update_ws is not None):
        raise ValueError(
            "a warp_specialized KernelConfig needs a Hopper GPU (sm_90), bf16 dy and x that TMA can read, and "
            f"{'/'.join(_WS_STATE_DTYPES)} states (got {state_dtype} states, dy {dy.dtype} on {dy.device}); leave config=None to let "
            "FORGE choose the kernel"
        )
    if config is not None and config.fast_epilogue and not config.warp_specialized:
        raise ValueError("KernelConfig.fast_epilogue is an option of the warp-specialized kernel (warp_specialized=True)")
    if config is not None and config.warp_specialized:
        return _warp_specialized_plan(config, dy, x, weight, states, signed, rule=rule, flags=flags,
                                      state_dtype=state_dtype, stochastic_rounding=stochastic_rounding,
                                      int8_group=int8_group, steps_in_memory=steps_in_memory)
    cfg = config or _pick_config(T, N, K, state_dtype, on_interpreter, int8_group)
    if state_dtype == "int8" and cfg.block_k % int8_group:
        raise ValueError(f"block_k={cfg.block_k} does not span whole int8 groups of {int8_group}")
    exact = dy.dtype == torch.float32 or x.dtype == torch.float32
    tma = _tma_mode(cfg.tma, dy, x, exact, on_interpreter)
    tiles = _cdiv(N, cfg.block_n) * _cdiv(K, cfg.block_k)
    persistent = cfg.programs_per_sm > 0
    grid = (min(tiles, cfg.programs_per_sm * _multiprocessors(dy.device)) if persistent else tiles,)
    constexprs = dict(
        **epilogue_constexprs(states, signed, rule=rule, flags=flags, state_dtype=state_dtype,
                              stochastic_rounding=stochastic_rounding, int8_group=int8_group),
        STEPS_IN_MEMORY=steps_in_memory, TMA=tma,
        UPCAST_DOT=on_interpreter or exact, DOT_PRECISION="ieee" if (exact or on_interpreter) else "tf32",
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_T=cfg.block_t, GROUP_N=cfg.group_n,
        EPILOGUE_SPLIT=cfg.epilogue_split, OVERLAP_SLICES=cfg.overlap_slices, PERSISTENT=persistent,
        FLATTEN=cfg.flatten,
    )
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.maxnreg and not on_interpreter:
        options["maxnreg"] = cfg.maxnreg
    return _Plan(cfg, tma, grid, _cdiv(K, int8_group), constexprs, options, on_interpreter)


def _warp_specialized_plan(cfg, dy, x, weight, states, signed, *, rule, flags, state_dtype, stochastic_rounding,
                           int8_group, steps_in_memory) -> "_Plan":
    """The plan of a `wgrad_update_ws` launch: one program per multiprocessor (fewer for few tiles)."""
    T, N = dy.shape
    K = x.shape[1]
    tiles = _cdiv(N, cfg.block_n) * _cdiv(K, cfg.block_k)
    constexprs = dict(
        **epilogue_constexprs(states, signed, rule=rule, flags=flags, state_dtype=state_dtype,
                              stochastic_rounding=stochastic_rounding, int8_group=int8_group),
        STEPS_IN_MEMORY=steps_in_memory, STAGES=cfg.num_stages, ROWS=cfg.epilogue_rows,
        FAST_EPILOGUE=cfg.fast_epilogue, OVERLAP_SLICES=cfg.overlap_slices,
    )
    options = dict(num_warps=cfg.num_warps, maxnreg=wgrad_update_ws.max_registers(cfg.num_warps, cfg.block_n))
    grid = (min(tiles, _multiprocessors(dy.device)),)
    return _Plan(cfg, "gluon", grid, _cdiv(K, int8_group), constexprs, options, False)


def wgrad_update(
    weight: torch.Tensor,
    states: tuple,
    scales: tuple,
    signed: tuple,
    dy: torch.Tensor,
    x: torch.Tensor,
    coefficients: tuple,
    seed: int,
    *,
    rule: str,
    flags: dict,
    state_dtype: str,
    stochastic_rounding: bool,
    int8_group: int = 64,
    config: KernelConfig | None = None,
    step_values: torch.Tensor | None = None,
) -> None:
    """Apply one optimizer step to `weight` (N, K) from the gradient dy^T x, without storing it.

    dy: (T, N) and x: (T, K), any strides. `states`, `scales`, `signed`: three slots each (None
    where the rule has no such state; scales only for int8). Updates `weight`, `states` and
    `scales` in place. `coefficients` come from `forge.rules.Rule.coefficients`. `int8_group`:
    elements per int8 scale along K (64 or 128); a config's BLOCK_K must be a multiple of it.
    `step_values`: an int32 row (`update_tile.STEP_ROW` words) the kernel reads `coefficients`
    and `seed` from instead, so that a CUDA graph can replay the launch with new values.

    The key below holds every fact the launch depends on (shapes, strides, dtypes, alignments,
    device, options): a problem seen before skips the planning and, on a GPU, Triton's dispatch.
    """
    T, N = dy.shape
    K = x.shape[1]
    slots = slot_arguments(weight, states, scales)
    key = (
        T, N, K, dy.stride(), x.stride(), weight.stride(), dy.get_device(), tensor_facts(weight, *slots, dy, x),
        tuple(s is None for s in states), signed, rule, tuple(flags.items()), state_dtype, stochastic_rounding,
        int8_group, config, step_values is None,
    )
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= DirectLauncher.max_entries:
            _plans.clear()
        plan = _plans[key] = _plan(weight, states, signed, dy, x, rule=rule, flags=flags, state_dtype=state_dtype,
                                   stochastic_rounding=stochastic_rounding, int8_group=int8_group, config=config,
                                   steps_in_memory=step_values is not None)
    if plan.tma == "gluon":
        cfg = plan.config
        dy_desc = wgrad_update_ws.descriptor(dy, (cfg.block_t, cfg.block_n))
        x_desc = wgrad_update_ws.descriptor(x, (cfg.block_t, cfg.block_k))
        args = (weight, *slots, dy_desc, x_desc, T, N, K, plan.num_groups,
                *step_arguments(weight, coefficients, seed, step_values))
        _launch_ws(key, plan.grid, args, plan.constexprs, plan.options)
        return
    dy_src, x_src = dy, x
    if plan.tma == "host":
        from triton.tools.tensor_descriptor import TensorDescriptor

        dy_src = TensorDescriptor.from_tensor(dy, [plan.config.block_t, plan.config.block_n])
        x_src = TensorDescriptor.from_tensor(x, [plan.config.block_t, plan.config.block_k])
    elif plan.tma == "device" and not plan.on_interpreter:
        # Set on every launch: Triton's allocator is a context variable, and the backward runs on
        # autograd's device thread, whose context is not the caller's.
        triton.set_allocator(_descriptor_scratch)
    args = (weight, *slots, dy_src, x_src, T, N, K, plan.num_groups, *dy.stride(), *x.stride(),
            *step_arguments(weight, coefficients, seed, step_values))
    _launch(key, plan.grid, args, plan.constexprs, plan.options)
