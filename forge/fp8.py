"""FP8 linear layers: the forward, dX and fused dW GEMMs of a ForgeLinear on FP8 tensor cores.

`forge.attach(model, rule, fp8="tensorwise")` runs every fused linear layer (both dimensions
multiples of 16, names outside `fp8_skip`) the way torchao's Float8Linear runs its "tensorwise"
recipe, and fuses its weight gradient as FORGE fuses a bf16 one:

* Each operand is cast to FP8 with one scale per tensor, from its current absolute maximum
  (dynamic scaling): scale = FP8_MAX / max(amax, 1e-12) (taken in fp64 and rounded to fp32, as
  torchao does, so the two cast every tensor to the same bits), values saturated to +-FP8_MAX.
  The input x and the weight W are cast to float8_e4m3fn (more precision), the output gradient
  dy to float8_e5m2 (more range).
* forward: y = (x8 W8^T) / (sx sw), on FP8 tensor cores (`torch._scaled_mm`), in x's dtype, with
  the MMA's fast accumulation as torchao's forward (its backward GEMMs accumulate in fp32);
* backward: dx = (dy8 W8) / (sdy sw) with the old W, then the fused kernel
  (`forge.kernels.wgrad_update`) accumulates dW = dy8^T x8 in fp32 registers from T-major copies
  (T contiguous: the layout Hopper's FP8 tensor cores read both operands in), multiplies the
  finished tile by 1 / (sdy sx), the two scales' product, and applies the optimizer update as for a
  bf16 layer. dW is never stored in any precision.

The fused update therefore equals torch.optim's step on the fp32 result of
`torch._scaled_mm(dy8^T, x8, 1/sdy, 1/sx)` on the same quantized operands, up to the order of the
sum over T (tests/forge/test_fp8.py).

What is saved for the backward: the T-major FP8 copy of x that the forward's one cast of x writes
beside the row-major one, with its scale, 1 byte an element where Float8Linear keeps x in its own
dtype and casts it again (2 bytes). Layers that read the same x (a Llama block's q, k and v; gate
and up) share that cast and that copy (`InputCasts`), so of a Llama block's saved inputs FP8 keeps
one byte an element of the attention input, of o's, of the MLP input and of down's, where bf16
keeps two. Under activation checkpointing x itself is saved ahead of the layer (`forge.nn`) and
cast again in the backward, to the same bits. The weight is cast again there too (the same value
as in the forward: nothing has updated it yet). On a GPU each
cast is two launches of `forge.kernels.fp8_cast` (the tensor's maximum, then the cast, row-major,
transposed or both), equal bit for bit to `cast`, the PyTorch ops kept as its reference. On a
machine without CUDA the FP8 GEMMs are emulated: the FP8 values, exactly representable in fp32, are
multiplied in fp32 and scaled, what `torch._scaled_mm` computes up to its summation order.
"""

from __future__ import annotations

import weakref

import torch

RECIPES = ("tensorwise",)
INPUT_DTYPE = torch.float8_e4m3fn  # x and W
GRAD_DTYPE = torch.float8_e5m2  # dy
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
EPS = 1e-12  # the smallest amax a scale is taken from (an all-zero tensor casts to zeros)
MULTIPLE = 16  # torch._scaled_mm's dimensions must be multiples of this


def check_recipe(fp8: str | None) -> str | None:
    """`fp8` if FORGE knows the recipe, else a ValueError that lists the ones it does."""
    if fp8 is not None and fp8 not in RECIPES:
        raise ValueError(
            f"fp8={fp8!r} is not a recipe FORGE runs; choose one of {list(RECIPES)}, or None (bf16 GEMMs)"
        )
    return fp8


def eligible(weight: torch.Tensor) -> bool:
    """Whether a (N, K) weight's GEMMs can run in FP8: both dimensions multiples of 16."""
    return weight.dim() == 2 and weight.shape[0] % MULTIPLE == 0 and weight.shape[1] % MULTIPLE == 0


def cast(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in FP8 `dtype`, its inverse scale): t ~ t8 * inverse, one fp32 scale for the whole tensor
    from its absolute maximum, computed on the device (nothing syncs: a CUDA graph captures it)."""
    fp8_max = torch.finfo(dtype).max
    amax = t.detach().abs().amax().to(torch.float64)  # as torchao takes it, so the casts agree
    scale = (fp8_max / amax.clamp(min=EPS)).to(torch.float32)
    t8 = (t.detach().float() * scale).clamp(-fp8_max, fp8_max).to(dtype)
    return t8, scale.reciprocal()


def scaled_mm(
    a8: torch.Tensor,
    b8: torch.Tensor,
    a_inv: torch.Tensor,
    b_inv: torch.Tensor,
    out_dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """(a8 @ b8) * a_inv * b_inv in `out_dtype`: `torch._scaled_mm` on a GPU (a8 row-major, b8
    column-major; `fast_accum`: cuBLAS keeps the FP8 MMA's own accumulator throughout, as torchao's
    forward does, where the backward's GEMMs add it into fp32 as they go), the fp32 emulation
    elsewhere."""
    if a8.is_cuda:
        return torch._scaled_mm(
            a8, b8, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype, use_fast_accum=fast_accum
        )
    return (torch.mm(a8.float(), b8.float()) * (a_inv * b_inv)).to(out_dtype)


def cast_for_gemm(t: torch.Tensor, dtype: torch.dtype, *, rows: bool = True, transposed: bool = False):
    """(t8 row-major or None, its transpose row-major or None, inverse scale) of a 2-D tensor, the
    values of `cast`: on a GPU two launches of `forge.kernels.fp8_cast` (the tensor read twice, each
    copy written once), elsewhere `cast` and a transposed copy."""
    t = t.detach().contiguous()
    if t.is_cuda:
        from forge.functional import fp8_cast

        return fp8_cast(t, dtype, rows=rows, transposed=transposed)
    t8, inverse = cast(t, dtype)
    return (t8 if rows else None), (t8.t().contiguous() if transposed else None), inverse


class InputCasts:
    """The FP8 casts of layer inputs, by input tensor, for as long as the input lives: layers that
    read one input (a Llama block's q, k and v; gate and up) cast it once and keep one copy.

    Keyed by the tensor's identity and version (an in-place change makes a new cast), never by its
    values; an entry goes when its tensor does."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple] = {}

    def get(self, x: torch.Tensor, make):
        """The cast of x: the one made for it before, or `make()`."""
        key = id(x)
        entry = self._by_id.get(key)
        if entry is not None and entry[0]() is x and entry[1] == x._version:
            return entry[2]
        value = make()
        self._by_id[key] = (weakref.ref(x, lambda _, key=key: self._by_id.pop(key, None)), x._version, value)
        return value

    def __len__(self) -> int:
        return len(self._by_id)


INPUT_CASTS = InputCasts()


def forward(x: torch.Tensor, weight: torch.Tensor, save_input: bool = False):
    """(y = x W^T through FP8 (x: (..., K)) in x's dtype, (..., N), and what the backward needs of x).

    With `save_input` the one cast of x writes its T-major copy too, and the second item is that
    copy with its inverse scale: the backward reads it instead of casting x again (the same bits,
    x has not changed), so a layer keeps 1 byte an input element instead of x's 2, and layers that
    read the same x share one cast and one copy (`INPUT_CASTS`; not while torch.compile traces).
    Else None: the caller keeps x (under activation checkpointing, `forge.nn`)."""
    x2 = x.reshape(-1, x.shape[-1])
    if save_input and not torch.compiler.is_compiling():
        x8, x8_t, x_inv = INPUT_CASTS.get(x, lambda: cast_for_gemm(x2, INPUT_DTYPE, transposed=True))
    else:
        x8, x8_t, x_inv = cast_for_gemm(x2, INPUT_DTYPE, transposed=save_input)
    w8, _, w_inv = cast_for_gemm(weight, INPUT_DTYPE)
    y = scaled_mm(x8, w8.t(), x_inv, w_inv, x.dtype, fast_accum=True)
    return y.reshape(*x.shape[:-1], weight.shape[0]), ((x8_t, x_inv) if save_input else None)


def backward(dy2: torch.Tensor, x, weight: torch.Tensor, need_dx: bool):
    """(dx or None, dy8 (T, N), x8 (T, K), dequantization scale) for the backward of `forward`:
    dx = dy W in FP8 with the old W, in dy2's dtype; dy8 and x8 are views of T-contiguous copies
    (what the fused kernel reads), and the scale (a one-element fp32 tensor) is what their product
    dy8^T x8 is multiplied by to give dW. `x`: the input (T, K) itself, cast here, or what
    `forward(..., save_input=True)` kept of it (its T-major FP8 copy and inverse scale)."""
    dy8, dy8_t, dy_inv = cast_for_gemm(dy2, GRAD_DTYPE, rows=need_dx, transposed=True)
    dx = None
    if need_dx:
        _, w8_t, w_inv = cast_for_gemm(weight, INPUT_DTYPE, rows=False, transposed=True)
        dx = scaled_mm(dy8, w8_t.t(), dy_inv, w_inv, dy2.dtype)  # W8 (N, K) column-major
    if isinstance(x, torch.Tensor):
        _, x8_t, x_inv = cast_for_gemm(x, INPUT_DTYPE, rows=False, transposed=True)
    else:
        x8_t, x_inv = x
    return dx, dy8_t.t(), x8_t.t(), (dy_inv * x_inv).reshape(1)
