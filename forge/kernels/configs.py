"""Launch configurations of the fused kernel, and which kernel a launch takes.

`wgrad_update` (the launcher) asks `plan` once per problem: which kernel (the Triton kernel of
`forge.kernels.wgrad_update`, or its warp-specialized Gluon twin, `forge.kernels.wgrad_update_ws`),
under which `KernelConfig`, how the main loop reads dy and x, the grid, and every compile-time
argument. The launcher caches the answer under a key of every fact it depends on.

The kernels update W and the states in place, so they are never autotuned at run time (each trial
would apply another optimizer step): the configs below were measured offline, on an H200 with
`python -m harness kernels --tune` (records under results/tuning/ and results/kernels/, reasoning
in docs/performance.md), and are picked by shape:

* The Triton kernel (`pick_config`): 128 x 128 tiles, registers capped at 128 so that two programs
  share a multiprocessor and one's memory-bound epilogue runs beside the other's tensor-core main
  loop; three stages keep both within shared memory. The epilogue updates a tile in row slices:
  16-row slices (no spills) for fp32 and int8 states and for bf16 states at T <= 2048, 32-row ones
  for bf16 states above. int8 states at T <= 2048 take 64-row tiles (no spills, 15-29% faster on
  the Llama-3.1-8B gate and q shapes) whose next slice loads before the one above is stored.
* Below `_HOST_BOUND_FLOPS` the GEMM is shorter than its launch: the kernel reads dy and x by
  masked pointers, 5-9 us more GPU time and 27-47 us less host time per launch than encoding two
  TMA descriptors.
* The warp-specialized kernel (`WARP_SPECIALIZED_DEFAULTS`) runs where it measured faster, on
  Hopper with bf16 operands and a grid of at least `_WS_MIN_TILES_PER_SM` tiles per
  multiprocessor, or with bf16 states on smaller grids too (`_WS_SMALL_GRID`, in 128 x 64 tiles
  where 128 x 128 ones would leave half the multiprocessors idle), never under `_HOST_BOUND_FLOPS`:
  8 epilogue warps, overlapped slices, 32-row slices with the fast epilogue for bf16 and int8 states
  (0.67-0.85x the Triton kernel's time at T <= 4096 on the large Llama-3.1-8B layers), 16-row
  slices with the exact epilogue for fp32 states (0.89-0.95x at T <= 2048).
  FP8 operands (`forge.fp8`) take it too, with every state dtype (`fp8_warp_specialized`):
  128 x 128 tiles of two 64-row MMA warpgroups and 4 epilogue warps for fp32 states (8-row
  slices), and for bf16 states above T = 1024 (16-row slices: 0.83-0.91x the 64-row tiles' time
  at T = 2048); 64 x 128 tiles of one MMA warpgroup and 8 epilogue warps for bf16 states up to
  T = 1024 (0.77-0.83x the 128-row tiles) and for int8 states at every T, their promotion
  overlapped with the MMAs (0.88-0.95x the time without it at T = 4096).
  From T = 4096 tokens (`_PINGPONG_MIN_T`), bf16 states on grids of at least 4 tiles a
  multiprocessor take its ping-pong schedule (`PINGPONG_CONFIGS`, `forge.kernels.wgrad_update_pingpong`):
  0.91-1.00x its time there on an H100, 1.29-1.37x at T = 1024. The same steps to the bit.
  `FORGE_WARP_SPECIALIZED=0` in the environment, read at a problem's first launch, keeps the
  Triton kernel.

On Triton's CPU interpreter every problem takes the Triton kernel with small tiles (the
interpreter's cost is per program and per operation) and pointer loads.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch

from forge.backend import interpreting
from forge.kernels.launch import cdiv
from forge.kernels.update_tile import epilogue_constexprs

try:  # Gluon (Triton >= 3.5): the warp-specialized kernel for Hopper
    from forge.kernels import wgrad_update_ws
except ImportError:  # pragma: no cover - an older Triton: the Triton kernel everywhere
    wgrad_update_ws = None


@dataclass(frozen=True)
class KernelConfig:
    """Launch shape of the fused kernel (chosen per problem shape, never by re-running it)."""

    block_n: int
    block_k: int
    block_t: int
    group_n: int = 8  # tiles of N walked together, for L2 reuse of x
    epilogue_split: int = 1  # the Triton kernel updates a tile in this many row slices (1, 2, 4, 8)
    num_warps: int = 8
    num_stages: int = 3
    maxnreg: int | None = None  # a register cap lets two programs share a multiprocessor
    # How the Triton kernel's main loop reads dy and x on Hopper: "host", bulk tensor copies (TMA)
    # through descriptors built on the host, which Triton's launcher encodes on every call (~35 us
    # of host); "none", masked pointer loads (a slower main loop, a cheaper launch).
    tma: str = "host"
    # Load each epilogue slice's W and states before the slice above it is updated and stored (two
    # slices' loads in flight instead of one; a few more registers). In the warp-specialized kernel
    # a tile's first slice is also loaded before its gradient is ready.
    overlap_slices: bool = False
    # The warp-specialized kernel (Hopper, bf16 operands, every state dtype): `num_warps` epilogue
    # warps beside 4 MMA warps and a loader, a ring of `num_stages` dy and x tiles, the update
    # `epilogue_rows` rows at a time. Tile shape as above; one program per multiprocessor.
    warp_specialized: bool = False
    epilogue_rows: int = 32
    # Warp-specialized only: approximate sqrt and division (a few fp32 ulps) and the hardware's
    # round-to-nearest for bf16 stores. For bf16 and int8 states, whose own rounding is ~2^14 times
    # coarser or more (their default on Hopper); off, the epilogue matches torch.optim's arithmetic.
    fast_epilogue: bool = False
    # FP8 operands (the Triton kernel): keep the FP8 MMA's own accumulator over the whole T loop
    # (cuBLAS's fast accumulation) instead of adding each T tile into fp32. Fewer registers, fewer
    # bits: a candidate to time, never FORGE's choice (the update would no longer equal torch.optim's
    # on the fp32-accumulated FP8 GEMM).
    fp8_fast_accum: bool = False
    # Warp-specialized, FP8 operands on 64-row tiles: each stage's MMAs run into a partial tile while
    # the stage before's is added into the fp32 accumulator (`wgrad_update_ws._promoting_mma_partition`),
    # instead of the MMAs waiting for each add. The same sums, added in the same order.
    overlap_promotion: bool = False
    # Warp-specialized, bf16 operands, 128-row tiles: Hopper's ping-pong schedule
    # (`forge.kernels.wgrad_update_pingpong`): two MMA warpgroups of 4 warps each own every other
    # tile, take turns at the tensor cores and update their tile from their own accumulator
    # registers (no staging buffer); `num_warps` must be 4 (one consumer), `epilogue_rows` is unused:
    # the consumers update 32-row pieces of `pingpong_cols` columns (32 or 64; int8: a whole group).
    pingpong: bool = False
    pingpong_cols: int = 32
    # Ping-pong, fp32 or bf16 states: one piece loader per consumer brings each 64-row piece of W
    # and the states by bulk tensor copies into its consumer's ring of this many slots (a power of
    # 2), and the consumers update from shared memory (`forge.kernels.wgrad_update_pingpong_fed`;
    # pieces of 16, 32 or 64 columns) instead of loading into registers. 0: loads.
    update_stages: int = 0
    # With update_stages: each consumer updates a piece in the accumulator's own register layout,
    # writes the new W and states back into the piece's slot and has them stored by bulk copies
    # (`wgrad_update_pingpong_fed.update_in_slots`), instead of converting the gradient to a blocked
    # layout and storing from registers.
    update_in_slot: bool = False


# The Triton kernel on Hopper (results/tuning/tuning-spill_free-20261129-e32ca29.jsonl,
# tuning-fp32-20261130-6a4fc43.jsonl, tuning-warp_specialized-20261130-9a6af47.jsonl): 16-row slices unless named otherwise below; in 32-row ones the fp32 and int8
# epilogues spill (triton 3.6) and ran slower on 23 of 24 tuned points above T = 2048.
_HOPPER = KernelConfig(block_n=128, block_k=128, block_t=64, group_n=8, epilogue_split=8, num_warps=8,
                       num_stages=3, maxnreg=128)
_HOPPER_SMALL_T = {"int8": replace(_HOPPER, block_n=64, epilogue_split=4, overlap_slices=True)}  # T <= 2048
_HOPPER_LARGE_T = {"bf16": replace(_HOPPER, epilogue_split=4)}  # T > 2048: spill-free for bf16 states
_HOST_BOUND_FLOPS = 2e10  # 2 T N K below this: pointer loads (Llama's k and v at T <= 2048)

# The warp-specialized kernel on Hopper (results/tuning/tuning-warp_specialized-20261130-455f24b.jsonl;
# results/archive/kernels/kernels-llama3.1-8b-20261130-fd4010f.jsonl against -0e3145e.jsonl, superseded kernel
# tables in git history at 28a71c4). int8 states take bf16's
# config: their codes step by ~1/254 of a group's maximum, so the fast epilogue's few fp32 ulps move
# a code only on a rounding boundary, and it builds without spills.
_HOPPER_WS = KernelConfig(block_n=128, block_k=128, block_t=64, num_warps=8, num_stages=4, warp_specialized=True,
                          epilogue_rows=32, overlap_slices=True)
WARP_SPECIALIZED_DEFAULTS = {  # state dtype -> config, at every T
    "fp32": replace(_HOPPER_WS, epilogue_rows=16),  # 32-row overlapped slices spill 56-80 bytes
    "bf16": replace(_HOPPER_WS, fast_epilogue=True),
    "int8": replace(_HOPPER_WS, fast_epilogue=True),
}
# The ping-pong kernel (`forge.kernels.wgrad_update_pingpong`), per state dtype. Two consumers of 4
# warps beside the loader, 6 stages of dy and x (192 KiB: no staging buffer), the update in pieces
# of 32 x 32 (int8: 32 x 64); as `python -m harness.kernels.build` finds them without spills under triton 3.6 and 3.9: bf16 states with the fast epilogue and
# overlapped pieces, fp32 states with the exact epilogue and int8 states with the fast one, both
# piece after piece (their overlapped pieces spill 24-432 bytes).
_PINGPONG = KernelConfig(block_n=128, block_k=128, block_t=64, num_warps=4, num_stages=6, warp_specialized=True,
                         pingpong=True)
PINGPONG_CONFIGS = {
    "fp32": _PINGPONG,
    "bf16": replace(_PINGPONG, fast_epilogue=True, overlap_slices=True),
    "int8": replace(_PINGPONG, fast_epilogue=True),
}
# The ping-pong kernel with its update fed by bulk copies (`forge.kernels.wgrad_update_pingpong_fed`),
# per state dtype: bf16 states with the fast epilogue, 5 stages of dy and x beside two rings of 2
# slots of 64 x 32 pieces; fp32 states with the exact epilogue in 64 x 16 pieces (in 32 columns it
# spills), 4 stages beside rings of 2 slots; as `python -m harness.kernels.build` finds them without
# spills under triton 3.6 (fp32 under triton 3.9: 24 bytes). An option FORGE never takes unasked: on
# one H100 (AdamW, bf16 states, Llama-3.1-8B's gate, q and down;
# results/device-logs/overlap-fed-20261207-d9f2083.jsonl) it took 1.62-1.71x the warp-specialized
# kernel's time at T = 1024, 1.12-1.14x at 4096 and 0.97-1.01x at 16384, the same steps to the bit.
PINGPONG_FED_CONFIGS = {
    "bf16": replace(_PINGPONG, fast_epilogue=True, num_stages=5, update_stages=2),
    "fp32": replace(_PINGPONG, num_stages=4, update_stages=2, pingpong_cols=16),
}
# Where FORGE launches it unasked: bf16 states from this many tokens, on grids of at least
# `_PINGPONG_MIN_TILES_PER_SM` tiles a multiprocessor, as measured (one H100, AdamW, Llama-3.1-8B's
# gate, q and down, 7.8-27 tiles a multiprocessor; results/device-logs/overlap-pingpong-20261206-522087f.jsonl):
# 0.93-0.98x the warp-specialized kernel's time at T = 4096 and 0.91-1.00x at 16384, but 1.29-1.37x
# at 1024, where one consumer's 4 warps update a tile 2.6x slower than the 8 update warps do.
# fp32 and int8 states, fewer tiles and 2048 tokens were not timed.
_PINGPONG_MIN_T = {"bf16": 4096}
_PINGPONG_MIN_TILES_PER_SM = 4
# FP8 operands: two MMA warpgroups of 64 rows each hold the accumulator and the FP8 MMA's partial
# one, which leaves 168 registers to 4 epilogue warps; in 8-row overlapped slices every state dtype
# builds without spills, with the exact epilogue too (`python -m harness.kernels.build`, triton 3.6
# and 3.9); 4 stages of 128 tokens (32 KiB each) and the staging buffer take 194 KiB of shared
# memory. fp32 states keep the exact epilogue, as above. On the H200, bf16 states
# (results/kernels/fp8-kernels-20261201-577582c.jsonl, -d77a596.jsonl, in git history at 28a71c4): 0.80-0.90x the Triton
# kernel's time at T = 4096 on Llama-3.1-8B's large layers, 0.98-1.01x at T = 1024.
_HOPPER_WS_FP8 = KernelConfig(block_n=128, block_k=128, block_t=128, num_warps=4, num_stages=4,
                              warp_specialized=True, epilogue_rows=8, overlap_slices=True)
# 64-row tiles: one MMA warpgroup (184 registers) leaves 8 epilogue warps, as the bf16 kernel has,
# in 32-row slices with the fast epilogue. Where the update bounds the kernel it wins: at T = 1024
# 0.77-0.83x the 128-row tiles' time with bf16 states; with int8 states (whose epilogue issues about
# twice bf16's instructions) 0.74-0.79x the Triton kernel's at T = 1024, 0.73-0.76x at 2048 and
# 0.83-0.86x at 4096 (results/kernels/fp8-kernels-20261201-ab135d3.jsonl, -9c28709.jsonl, in git history at 28a71c4;
# Llama-3.1-8B's q, o, gate, up and down).
_HOPPER_WS_FP8_NARROW = replace(_HOPPER_WS_FP8, block_n=64, num_warps=8, epilogue_rows=32, fast_epilogue=True)
# Above T = 1024 bf16 states take the 128-row tiles in 16-row slices: 0.83-0.91x the 64-row tiles'
# time at T = 2048 and 0.96-1.00x the 8-row slices' at T = 4096, where the 64-row tiles read each x
# tile twice as often through L2 (1.13-1.22x). int8 states keep the 64-row tiles at every T, with the
# promotion overlapped (`KernelConfig.overlap_promotion`: the same sums): 0.88-0.95x without it at
# T = 4096, 0.97-1.01x at T <= 2048 (results/kernels/fp8-kernels-20261202-e02182b.jsonl; q, o,
# gate, up, down and lm_head).
FP8_WARP_SPECIALIZED = {  # state dtype -> config above _FP8_SMALL_T tokens
    "fp32": _HOPPER_WS_FP8,
    "bf16": replace(_HOPPER_WS_FP8, epilogue_rows=16, fast_epilogue=True),
    "int8": replace(_HOPPER_WS_FP8_NARROW, overlap_promotion=True),
}
FP8_WARP_SPECIALIZED_SMALL_T = {"bf16": _HOPPER_WS_FP8_NARROW}  # up to _FP8_SMALL_T tokens
_FP8_SMALL_T = 1024


def fp8_warp_specialized(T: int, state_dtype: str) -> KernelConfig | None:
    """The warp-specialized config of FP8 operands at T tokens with `state_dtype` states."""
    small = FP8_WARP_SPECIALIZED_SMALL_T if T <= _FP8_SMALL_T else {}
    return small.get(state_dtype, FP8_WARP_SPECIALIZED.get(state_dtype))


# Smaller grids keep the Triton kernel. bf16 and int8 states gain from one tile per multiprocessor
# (results/tuning/tuning-warp_specialized-20261130-9e79388.jsonl, tuning-evict_first-20261130-3115a49.jsonl: Qwen3-14B's k, 320 tiles, 0.77-0.93x;
# Llama-3.1-8B's k, 256 tiles, 0.76-1.05x); fp32 states were not timed there.
_WS_MIN_TILES_PER_SM = {"fp32": 4, "bf16": 1, "int8": 1}
# Grids under one tile per multiprocessor (layers 1,024 wide, as in Qwen3-0.6B and 1.7B) take it
# too with bf16 states, in 128 x 64 tiles where 128 x 128 ones would fill at most half the
# multiprocessors (results/tuning/tuning-small_grid-pointers-narrow-20261203-214339-91a6269.jsonl,
# against the fastest Triton candidate: 2,048 x 1,024 (128 tiles) 0.83x at T = 4096 and 0.80x at
# 8192; 1,024 x 1,024 (64 tiles) in 128 x 64 tiles 0.80x and 0.78x, where 128 x 128 ones gave
# 0.98x and 0.83x). int8 and fp32 states were not timed there.
_WS_SMALL_GRID = {"bf16"}


@functools.lru_cache(maxsize=256)  # asked on every first launch of a problem; a few shapes per model
def pick_config(T: int, N: int, K: int, state_dtype: str, on_interpreter: bool, int8_group: int = 64) -> KernelConfig:
    """The Triton kernel's config for a (T, N, K) problem: the Hopper table above, or on the
    interpreter a few small programs whose tiles span whole int8 groups."""
    if on_interpreter:
        block_n = 16 if N <= 16 else 32
        block_k = int8_group if state_dtype == "int8" else 64
        return KernelConfig(block_n=block_n, block_k=block_k, block_t=32 if T > 16 else 16, group_n=4, num_warps=4)
    cfg = (_HOPPER_SMALL_T if T <= 2048 else _HOPPER_LARGE_T).get(state_dtype, _HOPPER)
    if 2 * T * N * K < _HOST_BOUND_FLOPS:
        cfg = replace(cfg, tma="none")
    return cfg


def _warp_specialized_config(T: int, N: int, K: int, state_dtype: str, dy: torch.Tensor, x: torch.Tensor,
                             on_interpreter: bool) -> KernelConfig | None:
    """The warp-specialized config where FORGE launches that kernel (or its ping-pong schedule) unasked,
    else None."""
    if (on_interpreter or os.environ.get("FORGE_WARP_SPECIALIZED", "1") == "0"
            or not _can_run_warp_specialized(state_dtype, dy, x) or 2 * T * N * K < _HOST_BOUND_FLOPS):
        return None
    config = fp8_warp_specialized(T, state_dtype) if is_fp8(dy) else WARP_SPECIALIZED_DEFAULTS.get(state_dtype)
    if config is None:
        return None
    tiles = cdiv(N, config.block_n) * cdiv(K, config.block_k)
    multiprocessors = _multiprocessors(dy.device)
    if not is_fp8(dy) and pingpong_wins(T, state_dtype, tiles / multiprocessors):
        return PINGPONG_CONFIGS[state_dtype]
    if tiles >= _WS_MIN_TILES_PER_SM[state_dtype] * multiprocessors:
        return config
    if is_fp8(dy) or state_dtype not in _WS_SMALL_GRID:
        return None
    return replace(config, block_k=64) if 2 * tiles <= multiprocessors else config


def pingpong_wins(T: int, state_dtype: str, tiles_per_sm: float) -> bool:
    """Whether the ping-pong kernel measured faster than the warp-specialized one for bf16 operands
    at T tokens with `state_dtype` states, on a grid of `tiles_per_sm` 128 x 128 tiles a
    multiprocessor (`_PINGPONG_MIN_T`)."""
    min_t = _PINGPONG_MIN_T.get(state_dtype)
    return min_t is not None and min_t <= T and tiles_per_sm >= _PINGPONG_MIN_TILES_PER_SM


def _can_run_warp_specialized(state_dtype: str, dy: torch.Tensor, x: torch.Tensor) -> bool:
    """Gluon installed, a Hopper GPU, bf16 dy and x that TMA can read (or FP8 ones contiguous along
    T that it can read transposed), states the kernel knows."""
    if wgrad_update_ws is None or state_dtype not in WARP_SPECIALIZED_DEFAULTS:
        return False
    if is_fp8(dy):
        operands = is_fp8(x) and _can_use_tma_t_major(dy) and _can_use_tma_t_major(x)
    else:
        operands = dy.dtype == x.dtype == torch.bfloat16 and _can_use_tma(dy) and _can_use_tma(x)
    return operands and _is_hopper(dy.device)


def _copy_engine_reads(weight, states) -> bool:
    """Whether bulk tensor copies can read W and its states: each contiguous, of W's shape, rows of a
    multiple of 16 bytes, 16-byte aligned."""
    return all(t.shape == weight.shape and t.is_contiguous() and (t.shape[1] * t.element_size()) % 16 == 0
               and t.data_ptr() % 16 == 0 for t in (weight, *(s for s in states if s is not None)))


def _check_update_stages(config: KernelConfig, weight, states, state_dtype: str, fp8: bool, kahan: bool) -> None:
    """Refuse a `KernelConfig.update_stages` config the fed ping-pong kernel cannot run, saying why."""
    from forge.kernels.wgrad_update_pingpong_fed import SHARED_BYTES, shared_bytes

    if not (config.warp_specialized and config.pingpong) or fp8:
        raise ValueError("KernelConfig.update_stages is an option of the ping-pong kernel on bf16 operands "
                         f"(warp_specialized=True, pingpong=True; got warp_specialized={config.warp_specialized}, "
                         f"pingpong={config.pingpong}, FP8 operands: {fp8})")
    if state_dtype not in ("fp32", "bf16") or kahan:
        raise ValueError(f"KernelConfig.update_stages reads W and fp32 or bf16 states by bulk copies; {state_dtype} "
                         f"states{' and compensated weights' if kahan else ''} take update_stages=0")
    if not _copy_engine_reads(weight, states):
        raise ValueError("KernelConfig.update_stages needs W and its states contiguous and 16-byte aligned, with rows "
                         f"of a multiple of 16 bytes (got W {tuple(weight.shape)} {weight.dtype}); take update_stages=0")
    if config.update_stages & (config.update_stages - 1):
        raise ValueError(f"KernelConfig.update_stages={config.update_stages}: the piece ring's slots are a power of 2")
    needed = shared_bytes(config, weight.element_size(), tuple(s.element_size() for s in states if s is not None))
    if needed > SHARED_BYTES:
        raise ValueError(f"KernelConfig(update_stages={config.update_stages}, pingpong_cols={config.pingpong_cols}, "
                         f"num_stages={config.num_stages}) takes {needed} bytes of shared memory, more than the "
                         f"{SHARED_BYTES} a Hopper multiprocessor gives a program: fewer stages, slots or columns")


def _check_pingpong(config: KernelConfig, state_dtype: str, int8_group: int, fp8: bool) -> None:
    """Refuse a `KernelConfig.pingpong` config the ping-pong kernel cannot run, saying why."""
    if not config.warp_specialized or fp8:
        raise ValueError("KernelConfig.pingpong is a schedule of the warp-specialized kernel on bf16 operands "
                         f"(warp_specialized=True; got warp_specialized={config.warp_specialized}, FP8 operands: "
                         f"{fp8}); FP8 operands take the warp-specialized kernel (pingpong=False)")
    if config.overlap_promotion:
        raise ValueError("KernelConfig.pingpong takes no overlap_promotion (an option of FP8 operands)")
    if config.block_n != 128 or config.block_k % 64 or not 64 <= config.block_k <= 128 or config.num_warps != 4:
        raise ValueError("KernelConfig.pingpong runs 128-row tiles of 128 or 64 columns with 4 warps a consumer "
                         f"(got block_n={config.block_n}, block_k={config.block_k}, num_warps={config.num_warps})")
    if state_dtype == "int8" and config.block_k % int8_group:
        raise ValueError(f"block_k={config.block_k} does not span whole int8 groups of {int8_group}")
    widths = (16, 32, 64) if config.update_stages else (32, 64)
    if config.pingpong_cols not in widths or config.block_k % config.pingpong_cols:
        raise ValueError(f"KernelConfig.pingpong_cols={config.pingpong_cols}: one of {widths}, dividing "
                         f"block_k={config.block_k}")


@functools.cache
def _is_hopper(device: torch.device) -> bool:
    """sm_90 exactly: wgmma, which the warp-specialized kernel is written with, is Hopper's alone."""
    return torch.cuda.get_device_capability(device)[0] == 9


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of the device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """Hopper or newer (asked once per device: the query costs microseconds on every launch)."""
    return torch.cuda.get_device_capability(device)[0] >= 9


def _can_use_tma(t: torch.Tensor) -> bool:
    """A CUDA tensor that a Hopper (or newer) GPU can read by bulk tensor copies: 2-D, 16-bit, unit
    last stride, 16-byte aligned rows and base."""
    return (
        t.is_cuda
        and t.dtype in (torch.bfloat16, torch.float16)
        and t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
        and _has_tma(t.device)
    )


def _tma_mode(requested: str, dy: torch.Tensor, x: torch.Tensor, exact: bool) -> str:
    """The config's `tma` where the operands allow it, else "none". Exact fp32 products always read
    by pointers, and so does the interpreter (its tensors are on the CPU)."""
    if requested == "none" or exact:
        return "none"
    if is_fp8(dy):  # T-major: descriptors of the transposed (N, T) and (K, T) tensors
        return requested if _can_use_tma_t_major(dy) and _can_use_tma_t_major(x) else "none"
    if dy.dtype != x.dtype:
        return "none"
    return requested if _can_use_tma(dy) and _can_use_tma(x) else "none"


def is_fp8(t: torch.Tensor) -> bool:
    """An FP8 operand (`forge.fp8`): e4m3 or e5m2, the floating-point dtypes of one byte."""
    return t.dtype.is_floating_point and t.dtype.itemsize == 1


def _can_use_tma_t_major(t: torch.Tensor) -> bool:
    """A (T, cols) FP8 CUDA tensor contiguous along T that Hopper's bulk copies can read as (cols, T)."""
    return (
        t.is_cuda
        and t.stride(0) == 1
        and t.stride(1) % 16 == 0
        and t.data_ptr() % 16 == 0
        and _has_tma(t.device)
    )


def fp8_config(cfg: KernelConfig, on_interpreter: bool) -> KernelConfig:
    """FP8 operands on a GPU: 64 x 128 tiles, T tiles of 128 (a multiple of the FP8 MMA's 32-deep
    step), 16-row slices. The main loop adds each tile's products into the fp32 accumulator
    (Hopper's FP8 MMA keeps fewer bits in its own), which takes a second accumulator's registers:
    at 128 x 128 under the 128-register cap that spills, at 64 x 128 it builds in 80-106 registers
    for every state dtype, with no spills and two or three programs a multiprocessor
    (`python -m harness.kernels.build`, triton 3.9). Not yet tuned on a GPU."""
    if on_interpreter:
        return cfg
    return replace(_HOPPER, block_n=64, block_t=128, epilogue_split=4, tma=cfg.tma)


@dataclass(frozen=True)
class Plan:
    """What a launch of one problem needs besides its tensors and this step's scalars."""

    # "triton" (forge.kernels.wgrad_update), "gluon" (forge.kernels.wgrad_update_ws), "pingpong"
    # (forge.kernels.wgrad_update_pingpong) or "pingpong_fed" (forge.kernels.wgrad_update_pingpong_fed)
    kernel: str
    config: KernelConfig
    tma: str  # the Triton kernel's operand path: "host" descriptors or "none" (pointers)
    grid: tuple
    num_groups: int  # int8 scales per row of W
    constexprs: dict
    options: dict


def plan(weight, states, signed, dy, x, *, rule, flags, state_dtype, stochastic_rounding, int8_group, config,
         steps_in_memory, grad_scale=False, kahan=False) -> Plan:
    """Kernel, config, operand path, grid and compile-time arguments of a launch. `config` None:
    FORGE's choice (the warp-specialized kernel where it wins, else `pick_config`)."""
    T, N = dy.shape
    K = x.shape[1]
    assert weight.shape == (N, K) and weight.is_contiguous(), "weight must be a contiguous (N, K) tensor"
    on_interpreter = interpreting()
    fp8 = is_fp8(dy)
    if fp8 != is_fp8(x) or (fp8 and (dy.stride(0) != 1 or x.stride(0) != 1)):
        raise ValueError(
            f"FP8 operands come in pairs, contiguous along T (forge.fp8.backward makes them); got dy {dy.dtype} with "
            f"strides {dy.stride()} and x {x.dtype} with strides {x.stride()}"
        )
    if config is None:
        config = _warp_specialized_config(T, N, K, state_dtype, dy, x, on_interpreter)
    elif config.warp_specialized and not _can_run_warp_specialized(state_dtype, dy, x):
        raise ValueError(
            "a warp_specialized KernelConfig needs a Hopper GPU (sm_90), Triton's Gluon, bf16 dy and x that TMA "
            f"can read (or FP8 ones contiguous along T), and {'/'.join(WARP_SPECIALIZED_DEFAULTS)} states "
            f"(got {state_dtype} states, dy {dy.dtype} on {dy.device}); leave config=None to let FORGE choose the kernel"
        )
    if config is not None and config.fast_epilogue and not config.warp_specialized:
        raise ValueError("KernelConfig.fast_epilogue is an option of the warp-specialized kernel (warp_specialized=True)")
    if config is not None and config.overlap_promotion and not (config.warp_specialized and fp8 and config.block_n == 64):
        raise ValueError("KernelConfig.overlap_promotion is an option of the warp-specialized kernel on FP8 operands "
                         f"in 64-row tiles (warp_specialized=True, block_n=64; got block_n={config.block_n}, "
                         f"warp_specialized={config.warp_specialized}, dy {dy.dtype})")
    if config is not None and config.update_in_slot and not config.update_stages:
        raise ValueError("KernelConfig.update_in_slot is an option of the fed ping-pong kernel: it updates the pieces "
                         "the copy engine brought (update_stages > 0, pingpong=True)")
    if config is not None and config.update_stages:
        _check_update_stages(config, weight, states, state_dtype, fp8, kahan)
    if config is not None and config.pingpong:
        _check_pingpong(config, state_dtype, int8_group, fp8)
    if config is not None and config.fp8_fast_accum and config.warp_specialized:
        raise ValueError("KernelConfig.fp8_fast_accum is an option of the Triton kernel: the warp-specialized one "
                         "always adds each T tile into fp32 (set warp_specialized=False)")
    epilogue = epilogue_constexprs(states, signed, rule=rule, flags=flags, state_dtype=state_dtype,
                                   stochastic_rounding=stochastic_rounding, int8_group=int8_group,
                                   grad_scale=grad_scale, kahan=kahan)
    if config is not None and config.warp_specialized:
        return _warp_specialized_plan(config, T, N, K, dy.device, epilogue, int8_group, steps_in_memory, fp8)
    cfg = config or pick_config(T, N, K, state_dtype, on_interpreter, int8_group)
    if fp8 and config is None:
        cfg = fp8_config(cfg, on_interpreter)
    if state_dtype == "int8" and cfg.block_k % int8_group:
        raise ValueError(f"block_k={cfg.block_k} does not span whole int8 groups of {int8_group}")
    exact = dy.dtype == torch.float32 or x.dtype == torch.float32
    tma = _tma_mode(cfg.tma, dy, x, exact)
    constexprs = dict(
        **epilogue,
        STEPS_IN_MEMORY=steps_in_memory, TMA=tma, T_MAJOR=fp8, FP8_FAST_ACCUM=cfg.fp8_fast_accum,
        UPCAST_DOT=on_interpreter or exact, DOT_PRECISION="ieee" if (exact or on_interpreter) else "tf32",
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_T=cfg.block_t, GROUP_N=cfg.group_n,
        EPILOGUE_SPLIT=cfg.epilogue_split, OVERLAP_SLICES=cfg.overlap_slices,
    )
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.maxnreg and not on_interpreter:
        options["maxnreg"] = cfg.maxnreg
    tiles = cdiv(N, cfg.block_n) * cdiv(K, cfg.block_k)
    return Plan("triton", cfg, tma, (tiles,), cdiv(K, int8_group), constexprs, options)


def _warp_specialized_plan(cfg: KernelConfig, T: int, N: int, K: int, device: torch.device, epilogue: dict,
                           int8_group: int, steps_in_memory: bool, fp8: bool) -> Plan:
    """A `wgrad_update_ws` launch: one program per multiprocessor (fewer for few tiles)."""
    constexprs = dict(
        **epilogue,
        STEPS_IN_MEMORY=steps_in_memory, STAGES=cfg.num_stages, ROWS=cfg.epilogue_rows,
        FAST_EPILOGUE=cfg.fast_epilogue, OVERLAP_SLICES=cfg.overlap_slices, OVERLAP_PROMOTION=cfg.overlap_promotion,
    )
    options = dict(num_warps=cfg.num_warps, maxnreg=wgrad_update_ws.max_registers(cfg.num_warps, cfg.block_n, fp8))
    tiles = cdiv(N, cfg.block_n) * cdiv(K, cfg.block_k)
    grid = (min(tiles, _multiprocessors(device)),)
    if cfg.pingpong and cfg.update_stages:
        from forge.kernels import wgrad_update_pingpong_fed

        for name in ("ROWS", "OVERLAP_SLICES", "OVERLAP_PROMOTION"):  # the pieces: the descriptors' blocks
            constexprs.pop(name)
        return Plan("pingpong_fed", cfg, "host", grid, cdiv(K, int8_group),
                    dict(constexprs, UPDATE_STAGES=cfg.update_stages, IN_SLOT=cfg.update_in_slot),
                    dict(num_warps=cfg.num_warps, maxnreg=wgrad_update_pingpong_fed.max_registers()))
    if cfg.pingpong:
        from forge.kernels import wgrad_update_pingpong

        for name in ("ROWS", "OVERLAP_PROMOTION"):  # the consumers update in pieces of their own
            constexprs.pop(name)
        constexprs["PIECE_COLS"] = cfg.pingpong_cols
        return Plan("pingpong", cfg, "host", grid, cdiv(K, int8_group), constexprs,
                    dict(num_warps=cfg.num_warps, maxnreg=wgrad_update_pingpong.max_registers()))
    return Plan("gluon", cfg, "host", grid, cdiv(K, int8_group), constexprs, options)
