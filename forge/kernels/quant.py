"""Int8 optimizer states: one absmax scale per group of 64 (or 128) elements, quantized in registers.

FORGE stores a state tensor of shape (N, K) as int8 or uint8 codes of the same shape plus one bf16
scale per group of contiguous elements along K (64 by default, 128 with `int8_group=128`), a scales
tensor of shape (N, ceil(K / group)): 1.03 (1.016) bytes per element instead of 4 (fp32) or 2 (bf16). A scale is rounded UP to bf16 before the codes are
computed against it, so |x| / scale never exceeds 1 and the codes stay in range (bf16 keeps fp32's
exponent range, so tiny second moments do not underflow as they would in fp16). The fused kernel dequantizes a tile's states after its
gradient is complete, updates them in fp32 and quantizes them again before the store; nothing but
the codes and scales ever reaches memory. Blocks of 64 keep the quantization error local (the
paper contrasts this with the 2048-element blocks of common 8-bit optimizers; bitsandbytes and
torchao use 256 with a 256-entry lookup table, which costs a binary search per element inside a
GEMM epilogue). There are no table lookups here, only arithmetic:

* signed states (first moments, momentum buffers): code = round(127 * 2u / (1 + |u|)) with
  u = x / absmax, a companding curve that spends more of the 255 codes near zero; decode
  u = y / (2 - |y|), y = code / 127.
* positive states (second moments, sums of squares): code = round(255 * sqrt(x) / max sqrt(x)),
  in uint8, and a non-zero state never rounds to code 0. Linear codes for v put most small entries
  at zero, and a zero second moment turns Adam's step into m / eps, a blow-up.

The choice was made by measurement (docs/how-forge-works.md, "int8 states"): against fp32 states, AdamW's per-step update error was 3.7% for this scheme
when gradient scales vary mildly, and linear codes for v diverged (error of 1700%).

The PyTorch functions at the bottom are the same arithmetic, for tests and for tensors that are
quantized outside a kernel (state initialisation, state_dict loading).
"""

import torch
import triton
import triton.language as tl

from forge.kernels.rounding import round_to_bf16_nearest, to_float

try:  # Gluon (the warp-specialized kernel's language) names its register layouts; Triton infers them
    from triton.experimental.gluon import language as gl
except ImportError:  # pragma: no cover - a Triton without Gluon never asks for LAYOUTS
    gl = None

GROUP = 64  # elements per scale when none is given (the group sizes FORGE offers: `forge.states.INT8_GROUPS`)


@triton.jit
def _round_up_to_bf16(x):
    """x: fp32 >= 0. The smallest bf16 value >= x, as fp32 (clear the low 16 bits, carrying up)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0xFFFF) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _round_half_away(x):
    return tl.where(x >= 0, tl.floor(x + 0.5), -tl.floor(0.5 - x))


@triton.jit
def _divide(a, b, FAST: tl.constexpr):
    """a / b; FAST (GPU only, `KernelConfig.fast_epilogue`): `div.approx.ftz`, a reciprocal and a
    product, 2 ulps where |b| lies in [2^-126, 2^126] (every denominator here does), instead of
    `div.full`'s ~8 instructions. A code moves only where its value sits within a few ulps of a
    rounding boundary, a step of ~1/254 of its group's maximum."""
    if FAST:
        return tl.extra.cuda.libdevice.fast_dividef(a, b)
    return a / b


@triton.jit
def _scaled(x, group_max, FAST: tl.constexpr):
    """x / group_max[:, :, None] (group_max clamped away from 0); FAST: one reciprocal per group and
    a product per element."""
    group_max = tl.maximum(group_max, 1e-30)
    if FAST:
        return x * tl.extra.cuda.libdevice.fast_dividef(1.0, group_max)[:, :, None]
    return x / group_max[:, :, None]


@triton.jit
def dequantize_signed(q, absmax, FAST: tl.constexpr):
    """q: int8 codes (..., G); absmax: fp32 (..., 1). Returns fp32 values."""
    y = q.to(tl.float32) * (1.0 / 127.0)
    return _divide(y, 2.0 - tl.abs(y), FAST) * absmax


@triton.jit
def quantize_signed(x, FAST: tl.constexpr):
    """x: fp32 (R, groups, G). Returns int8 codes and the absmax (R, groups), rounded up to bf16."""
    absmax = _round_up_to_bf16(tl.max(tl.abs(x), axis=2))
    u = _scaled(x, absmax, FAST)
    code = _round_half_away(_divide(254.0 * u, 1.0 + tl.abs(u), FAST))
    return code.to(tl.int8), absmax


@triton.jit
def dequantize_positive(q, rootmax):
    """q: uint8 codes (..., G) of sqrt(x); rootmax: fp32 (..., 1). Returns fp32 values."""
    r = q.to(tl.float32) * (1.0 / 255.0) * rootmax
    return r * r


@triton.jit
def quantize_positive(x, FAST: tl.constexpr):
    """x: fp32 (R, groups, G), >= 0. Returns uint8 codes of sqrt(x) and the max of sqrt(x) (R, groups);
    FAST: the hardware's approximate square root as well."""
    if FAST:
        r = tl.sqrt(tl.maximum(x, 0.0))
    else:
        r = tl.sqrt_rn(tl.maximum(x, 0.0))
    rootmax = _round_up_to_bf16(tl.max(r, axis=2))
    code = tl.floor(_scaled(r, rootmax, FAST) * 255.0 + 0.5)
    code = tl.where(r > 0, tl.maximum(code, 1.0), code)
    return code.to(tl.uint8), rootmax


@triton.jit
def load_state_raw(
    ptr,  # state codes or values, same layout as the weight
    scale_ptr,  # (rows, ceil(cols / QGROUP)) bf16 block scales; only read for int8
    offs,  # (ROWS, COLS) int64 element offsets
    scale_offs,  # (ROWS, COLS // QGROUP) int64 scale offsets
    mask,  # (ROWS, COLS) bool
    scale_mask,  # (ROWS, COLS // QGROUP) bool
    STATE_DTYPE: tl.constexpr,  # "fp32" | "bf16" | "int8"
):
    """A tile of one state slot as stored: (values, scales), the scales only for int8 (else the
    values again). Loading apart from decoding lets a caller issue the loads early."""
    values = tl.load(ptr + offs, mask=mask, other=0)
    scales = values
    if STATE_DTYPE == "int8":
        scales = tl.load(scale_ptr + scale_offs, mask=scale_mask, other=0.0)
    return values, scales


@triton.jit
def decode_state(
    values, scales,  # as `load_state_raw` returns them
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    STATE_DTYPE: tl.constexpr,
    SIGNED: tl.constexpr,
    QGROUP: tl.constexpr,  # int8: elements per scale (64 or 128)
    LAYOUTS: tl.constexpr,  # in a Gluon kernel: convert between the tile's and the groups' layouts
    FAST: tl.constexpr,  # GPU only: approximate division (`_divide`), bf16 widened natively (`to_float`)
):
    """The stored tile as fp32 (ROWS, COLS)."""
    if STATE_DTYPE == "int8":
        q = tl.reshape(values, (ROWS, COLS // QGROUP, QGROUP))
        scale = scales.to(tl.float32)
        if LAYOUTS:  # the scales, loaded in the tile's layout, broadcast over the grouped codes
            scale = gl.convert_layout(scale, gl.SliceLayout(2, q.type.layout))
        if SIGNED:
            x = dequantize_signed(q, scale[:, :, None], FAST)
        else:
            x = dequantize_positive(q, scale[:, :, None])
        x = tl.reshape(x, (ROWS, COLS))
        if LAYOUTS:
            x = gl.convert_layout(x, values.type.layout)
        return x
    else:
        return to_float(values, FAST)


@triton.jit
def store_state(
    ptr, scale_ptr, offs, scale_offs, mask, scale_mask,  # as in load_state_raw
    x,  # (ROWS, COLS) fp32 new values
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    STATE_DTYPE: tl.constexpr,
    SIGNED: tl.constexpr,
    QGROUP: tl.constexpr,
    FAST: tl.constexpr,  # GPU only. bf16: the hardware's round-to-nearest (`rounding.store_weight`);
    # int8: approximate division and square root (`_divide`)
    LAYOUTS: tl.constexpr,  # in a Gluon kernel: convert the grouped results to the offsets' layouts
):
    """Write a tile of one state slot back (int8: quantize with fresh per-group scales)."""
    if STATE_DTYPE == "int8":
        x3 = tl.reshape(tl.where(mask, x, 0.0), (ROWS, COLS // QGROUP, QGROUP))
        if SIGNED:
            q, scale = quantize_signed(x3, FAST)
        else:
            q, scale = quantize_positive(x3, FAST)
        q = tl.reshape(q, (ROWS, COLS))
        if LAYOUTS:
            q = gl.convert_layout(q, offs.type.layout)
            scale = gl.convert_layout(scale, scale_offs.type.layout)
        tl.store(ptr + offs, q, mask=mask)
        tl.store(scale_ptr + scale_offs, scale.to(tl.bfloat16), mask=scale_mask)  # exact: rounded up
    elif STATE_DTYPE == "bf16":
        if FAST:
            tl.store(ptr + offs, x.to(tl.bfloat16), mask=mask)
        else:
            tl.store(ptr + offs, round_to_bf16_nearest(x), mask=mask)
    else:
        tl.store(ptr + offs, x, mask=mask)


# ----------------------------------------------------------------------------------------------
# PyTorch twins, on tensors whose last dimension is split into groups (padded with zeros).
# ----------------------------------------------------------------------------------------------


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, cols) along its last dimension: a vector is one row, a 0-d tensor one element."""
    x = torch.atleast_1d(x)
    return x.reshape(-1, x.shape[-1])


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    rows = _rows(x)
    pad = (-rows.shape[1]) % group
    rows = torch.nn.functional.pad(rows.float(), (0, pad))
    return rows.reshape(rows.shape[0], -1, group)


def code_dtype(signed: bool) -> torch.dtype:
    return torch.int8 if signed else torch.uint8


def round_up_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """The smallest bf16 value >= x (x >= 0, fp32), as fp32: the kernels' `_round_up_to_bf16`."""
    bits = x.float().contiguous().view(torch.int32).to(torch.int64)
    return ((bits + 0xFFFF) & 0xFFFF0000).to(torch.int32).view(torch.float32)


def quantize(x: torch.Tensor, signed: bool, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes shaped like x and bf16 scales shaped (rows, ceil(cols / group)), rows = numel // cols."""
    g = _grouped(x, group)
    if signed:
        absmax = round_up_to_bf16(g.abs().amax(-1))
        u = g / absmax.clamp_min(1e-30)[..., None]
        y = 254.0 * u / (1 + u.abs())
        code = torch.where(y >= 0, torch.floor(y + 0.5), -torch.floor(0.5 - y))
        scale = absmax
    else:
        r = g.clamp_min(0).sqrt()
        scale = round_up_to_bf16(r.amax(-1))
        code = torch.floor(r / scale.clamp_min(1e-30)[..., None] * 255 + 0.5)
        code = torch.where(r > 0, code.clamp_min(1), code)
    cols = _rows(x).shape[1]
    codes = code.reshape(code.shape[0], -1)[:, :cols].to(code_dtype(signed))
    return codes.reshape(x.shape), scale.to(torch.bfloat16)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, signed: bool, group: int = GROUP) -> torch.Tensor:
    """fp32 values from codes and per-group scales (the inverse of `quantize`, up to rounding)."""
    g = _grouped(codes, group)
    scale = scale.float()
    if signed:
        y = g / 127.0
        x = y / (2 - y.abs()) * scale[..., None]
    else:
        x = (g / 255.0 * scale[..., None]) ** 2
    cols = _rows(codes).shape[1]
    return x.reshape(x.shape[0], -1)[:, :cols].reshape(codes.shape)
