"""The FP8 casts of `forge.fp8` in two launches: the tensor's absolute maximum, then the cast.

`forge.fp8.cast` in PyTorch ops is six kernels (abs, max, fp32 copy, multiply, clamp, convert) that
read and write the tensor several times in fp32, plus a seventh for a transposed copy; a weight
goes through it in the forward and again in the backward. Here:

1. `absmax_kernel`: a fixed number of programs (at most `MAX_PARTIALS`) stride over the tensor and
   each writes the maximum of |t| it saw to its own slot: no atomics, the same bits every run.
2. `cast_kernel`: every program reduces those slots to amax, takes the scale as `forge.fp8.cast`
   does (FP8_MAX / max(amax, EPS) in fp64, rounded to fp32), casts its (rows, cols) tile
   (t * scale in fp32, saturated, rounded to nearest even in integer arithmetic: `fp8_bits`) and
   stores it row-major, transposed
   (the T-major copies the fused kernel reads, the column-major weight of dX), or both; the first
   program stores the inverse scale (1 / scale, correctly rounded).

Bytes: the tensor read twice and each FP8 copy written once, against about 33 bytes an element for
the PyTorch ops on a bf16 tensor. The results equal `forge.fp8.cast` bit for bit
(tests/forge/kernels/test_fp8_cast.py, in Triton's interpreter), so which one runs changes nothing
but the time. A CUDA graph captures both launches (nothing syncs with the host).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forge.backend import interpreting
from forge.kernels.launch import DirectLauncher, cdiv, tensor_facts

MAX_PARTIALS = 512  # programs of the absolute-maximum pass (the cast loads all their maxima)
INTERPRETER_PARTIALS = 8  # in Triton's interpreter, whose cost is per program
FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


@triton.jit
def absmax_kernel(t_ptr, partial_ptr, numel, PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """partial[pid] = max |t| over the blocks pid, pid + PROGRAMS, ... of the flat tensor."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    best = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid * BLOCK, numel, PROGRAMS * BLOCK):
        idx = start + offs
        values = tl.load(t_ptr + idx, mask=idx < numel, other=0.0)
        best = tl.maximum(best, tl.abs(values.to(tl.float32)))
    tl.store(partial_ptr + pid, tl.max(best, axis=0))


@triton.jit
def fp8_bits(v, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """The FP8 bits (as uint8) nearest to fp32 v, ties to even, for |v| at most the format's
    maximum: written out in integer and exact fp32 operations, so that Triton's CPU interpreter
    (whose own FP8 conversion rounds wrongly at binade edges) rounds exactly as a GPU and as torch's
    `.to(float8_*)` do."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    mag = bits & 0x7FFFFFFF
    shift: tl.constexpr = 23 - MBITS
    # normal: round the fp32 mantissa to MBITS bits (a carry moves into the exponent), rebias
    rounded = (mag + ((1 << (shift - 1)) - 1) + ((mag >> shift) & 1)) >> shift
    normal = rounded - ((127 - BIAS) << MBITS)
    # subnormal: |v| in units of the smallest subnormal, rounded to an integer by the fp32 adder
    units = tl.abs(v) * (2.0 ** (BIAS - 1 + MBITS))
    subnormal = ((units + 8388608.0) - 8388608.0).to(tl.int32)
    is_normal = mag >= ((127 - BIAS + 1) << 23)
    return ((sign << 7) | tl.where(is_normal, normal, subnormal)).to(tl.uint8)


@triton.jit
def cast_kernel(
    t_ptr,  # (R, C) row-major, bf16 | fp16 | fp32
    partial_ptr,  # (PARTIALS,) fp32 maxima from absmax_kernel
    out_ptr,  # (R, C) FP8 bits (uint8) row-major (ROWS), else unread
    out_t_ptr,  # (C, R) FP8 bits row-major: the transpose (TRANSPOSED), else unread
    inv_ptr,  # (1,) fp32: 1 / scale
    R, C, PARTIALS,
    FP8_MAX: tl.constexpr, EPS: tl.constexpr, FORMAT: tl.constexpr,  # "e4m3" | "e5m2"
    ROWS: tl.constexpr, TRANSPOSED: tl.constexpr, PARTIALS_BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Cast one (BLOCK_R, BLOCK_C) tile of t to FP8 with the tensor's scale."""
    slots = tl.arange(0, PARTIALS_BLOCK)
    amax = tl.max(tl.load(partial_ptr + slots, mask=slots < PARTIALS, other=0.0), axis=0)
    scale = (FP8_MAX / tl.maximum(amax.to(tl.float64), EPS)).to(tl.float32)
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    t = tl.load(t_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], mask=mask, other=0.0)
    scaled = tl.minimum(tl.maximum(t.to(tl.float32) * scale, -FP8_MAX), FP8_MAX)
    if FORMAT == "e4m3":
        t8 = fp8_bits(scaled, 3, 7)
    else:
        t8 = fp8_bits(scaled, 2, 15)
    if ROWS:
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], t8, mask=mask)
    if TRANSPOSED:
        tl.store(out_t_ptr + cols.to(tl.int64)[None, :] * R + rows[:, None], t8, mask=mask)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(inv_ptr, tl.math.div_rn(1.0, scale))


_absmax = DirectLauncher(absmax_kernel)
_cast = DirectLauncher(cast_kernel)


def cast(t: torch.Tensor, dtype: torch.dtype, *, rows: bool = True, transposed: bool = False):
    """(t8 or None, t8 transposed or None, inverse scale) of a 2-D contiguous tensor: t8 (R, C)
    row-major when `rows`, its transpose (C, R) row-major when `transposed`; the same values as
    `forge.fp8.cast`."""
    assert t.dim() == 2 and t.is_contiguous(), "cast takes a 2-D contiguous tensor"
    R, C = t.shape
    numel = t.numel()
    on_interpreter = interpreting()
    block = 1024 if on_interpreter else 4096
    programs = max(1, min(INTERPRETER_PARTIALS if on_interpreter else MAX_PARTIALS, cdiv(numel, block)))
    partials = torch.empty(programs, dtype=torch.float32, device=t.device)
    key = (numel, t.get_device(), tensor_facts(t, partials), programs, block)
    _absmax(key, (programs,), (t, partials, numel), dict(PROGRAMS=programs, BLOCK=block),
            dict(num_warps=8))
    out = torch.empty(R, C, dtype=dtype, device=t.device) if rows else None
    out_t = torch.empty(C, R, dtype=dtype, device=t.device) if transposed else None
    inv = torch.empty(1, dtype=torch.float32, device=t.device)
    block_r, block_c = (32, 64) if on_interpreter else (64, 128)
    grid = (cdiv(R, block_r), cdiv(C, block_c)) if rows or transposed else (1, 1)  # else: the scale alone
    unread = out if out is not None else out_t if out_t is not None else partials.view(dtype)  # a store off
    constexprs = dict(
        FP8_MAX=float(torch.finfo(dtype).max), EPS=1e-12, FORMAT=FORMATS[dtype], ROWS=rows,
        TRANSPOSED=transposed, PARTIALS_BLOCK=triton.next_power_of_2(programs), BLOCK_R=block_r, BLOCK_C=block_c,
    )
    targets = tuple((o if o is not None else unread).view(torch.uint8) for o in (out, out_t))
    key = (R, C, programs, t.get_device(), tensor_facts(t, partials, *targets, inv), dtype, rows, transposed)
    _cast(key, grid, (t, partials, *targets, inv, R, C, programs), constexprs, dict(num_warps=8))
    return out, out_t, inv.reshape(())
