"""References the tests hold FORGE to, written from their definitions, never from the code under test.

int8 states (`forge.kernels.quant`'s scheme, from its definition, in fp64): each row split into
groups of `group` contiguous elements; a group's scale is its largest magnitude (of sqrt(x) for a
positive state) rounded UP to bf16. A signed state's code is round-half-away(127 * 2u / (1 + |u|)),
u = x / scale, and decodes as y / (2 - |y|) * scale with y = code / 127; a positive state's code
is floor(255 sqrt(x) / scale + 1/2), at least 1 where x > 0, and decodes as (code / 255 * scale)^2.
Which torch.optim states are positive is named here too (`POSITIVE_STATES`), not taken from
`forge.rules`.

Newton-Schulz (`forge.newton_schulz`'s variants, from their definitions): the polynomial each one
computes, in fp64 with nothing rounded (`newton_schulz_fp64`), and the same iteration with every
matrix product rounded once to its working dtype, as a GEMM that accumulates in fp32 and rounds its
output does (`rounded_newton_schulz`). The code under test rounds where the second rounds, so the
two differ only where fp32's accumulation of a product of depth K (its error at most K 2^-24 of
the terms' magnitudes) lands on the other side of a rounding boundary than the exact product: at
most a fraction K 2^-24 / u of the elements (u: the dtype's unit roundoff, 2^-8 for bf16, 2^-11 for
fp16), each moved by one unit in the last place where rounding moves every element by up to half
of one, uniformly (RMS ulp / sqrt(12)). Such flips pass through the later iterations as the
rounding itself does, so their distance is at most sqrt(12 K 2^-24 / u) times the rounding's
distance from the fp64 polynomial, with a factor 4 for how unevenly they land (`flip_allowance`).
"""

from __future__ import annotations

import math

import torch

# ----------------------------------------------------------------------------------------------
# int8 states
# ----------------------------------------------------------------------------------------------

POSITIVE_STATES = frozenset({"exp_avg_sq", "square_avg", "sum"})  # torch.optim's sums of squares
# Codes whose exact value lies this close to a rounding boundary may land on either side of it in
# the kernels' fp32 arithmetic (a division, a product and a sum, each rounded to 2^-24 of values
# up to 255): the reference marks them, and a comparison allows one code either way there.
TIE_MARGIN = 1e-4


def grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    """x (rows, cols) as fp64 (rows, ceil(cols / group), group), the last group padded with zeros."""
    rows = x.reshape(-1, x.shape[-1]).double()
    pad = (-rows.shape[-1]) % group
    return torch.nn.functional.pad(rows, (0, pad)).reshape(rows.shape[0], -1, group)


def ungrouped(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The inverse of `grouped` for a tensor shaped like `like`."""
    return g.reshape(g.shape[0], -1)[:, : like.shape[-1]].reshape(like.shape)


def round_up_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """The smallest bf16 value >= x (x >= 0), as fp64: bf16 keeps 8 significant bits, so within
    [2^e, 2^(e+1)) its values are the multiples of 2^(e-7)."""
    x = x.double()
    exponent = torch.floor(torch.log2(x.clamp_min(2.0**-126)))
    step = torch.exp2(exponent - 7)
    up = torch.ceil(x / step) * step
    return torch.where(x > 0, up, torch.zeros_like(x))


def _group_max(g: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(what each group's scale is taken of: |x| or sqrt(x), its maximum per group), fp64."""
    if signed:
        magnitude = g.abs()
    else:
        magnitude = torch.sqrt(g.clamp_min(0).float()).double()  # the kernels' correctly rounded fp32 sqrt
    return magnitude, magnitude.amax(-1)


def scales(
    x: torch.Tensor, signed: bool, group: int, slack: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lowest and highest scale per group (rows, groups) that the definition gives for values
    within `slack` (relative) of x's: a group's maximum that lies within that of a bf16 value may
    round up to it or to the next, as arithmetic a few fp32 ulps apart decides."""
    _, top = _group_max(grouped(x, group), signed)
    return round_up_to_bf16(top * (1 - slack)), round_up_to_bf16(top * (1 + slack))


def quantize(
    x: torch.Tensor, signed: bool, group: int, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes as int64 shaped like x, scales fp64 (rows, groups), where a code sits within
    `TIE_MARGIN` of a rounding boundary) of an fp32 state `x` (rows, cols); against `scale` where
    given (one of the definition's `scales` for x, which the caller checks), else x's own."""
    g = grouped(x, group)
    magnitude, top = _group_max(g, signed)
    scale = round_up_to_bf16(top) if scale is None else scale.double()
    u = magnitude / torch.where(scale > 0, scale, 1.0)[..., None]
    if signed:
        value = 127 * 2 * u / (1 + u)
        code = torch.sign(g) * torch.floor(value + 0.5)  # half away from zero
    else:
        value = 255 * u
        code = torch.floor(value + 0.5)
        code = torch.where(magnitude > 0, code.clamp_min(1), code)  # a non-zero state never decodes to 0
    tie = ((value - value.floor()) - 0.5).abs() < TIE_MARGIN
    return ungrouped(code, x).long(), scale, ungrouped(tie, x)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, signed: bool, group: int) -> torch.Tensor:
    """fp64 values of `codes` (rows, cols) under per-group `scale` (rows, groups)."""
    g = grouped(codes, group)
    scale = scale.double()[..., None]
    if signed:
        y = g / 127
        values = y / (2 - y.abs()) * scale
    else:
        values = (g / 255 * scale) ** 2
    return ungrouped(values, codes)


def assert_codes_match(codes: torch.Tensor, expected: torch.Tensor, tie: torch.Tensor, what: str) -> None:
    """Codes equal to the reference's, one code either way allowed only where it marks a tie."""
    diff = (codes.long() - expected).abs()
    wrong = (diff > 1) | ((diff == 1) & ~tie)
    where = wrong.flatten()
    got, want = codes.flatten()[where][:4].tolist(), expected.flatten()[where][:4].tolist()
    assert not bool(wrong.any()), (
        f"{what}: {int(wrong.sum())} of {codes.numel()} codes differ from the definition's: {got} for {want}"
    )


# ----------------------------------------------------------------------------------------------
# Newton-Schulz
# ----------------------------------------------------------------------------------------------

# torch.optim.Muon's coefficient triple, and Polar Express's normalization: the input divided by
# (1 + 0.02) |X|_F, the paper's safety factor (arXiv 2505.16932, its polar_express.py).
TORCH_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
POLAR_EXPRESS_MARGIN = 1.02
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
GRAM_RESTART = 2  # the Gram iteration restarts from X <- Q X before this iteration (Dao-AILab's one restart)


def _wide(u: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """u with its wide side along the rows' length (transposed where it is tall), and whether it was."""
    tall = u.size(0) > u.size(1)
    return (u.T if tall else u), tall


def newton_schulz_definition(variant: str, steps: int) -> dict:
    """What `forge.newton_schulz`'s `variant` computes in `steps` iterations, by its definition, as
    keyword arguments of `rounded_newton_schulz` (and of `newton_schulz_fp64`, but for dtype and
    gram): its coefficients per iteration (Polar Express's published sequence, its last repeated),
    its normalization's margin, and its working dtype and form (the Gram variants: fp16, on R)."""
    from forge.newton_schulz import POLAR_EXPRESS_COEFFICIENTS as published  # the paper's numbers

    if variant == "polar_express":  # its first `steps` polynomials, the last repeated past them
        sequence = list(published[:steps]) + [published[-1]] * max(0, steps - len(published))
        return dict(sequence=sequence, margin=POLAR_EXPRESS_MARGIN)
    gram = variant in ("gram", "gram_symmetric")
    return dict(
        sequence=[TORCH_COEFFICIENTS] * steps, dtype=torch.float16 if gram else torch.bfloat16, gram=gram
    )


def newton_schulz_fp64(u: torch.Tensor, sequence, margin: float = 1.0, eps: float = 1e-7) -> torch.Tensor:
    """The odd polynomial a s + b s^3 + c s^5 of each (a, b, c) in `sequence`, applied in turn to
    u / (margin |u|_F) in fp64 (u transposed while it is tall): the function every variant computes."""
    x, tall = _wide(u.double())
    x = x / (x.norm() * margin).clamp(min=eps)
    for a, b, c in sequence:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).double()


def _normalized(u: torch.Tensor, dtype: torch.dtype, margin: float, eps: float) -> torch.Tensor:
    """u in bf16, divided by its bf16 Frobenius norm times `margin` (that product rounded to bf16),
    the quotient rounded to bf16 and then to `dtype`: torch.optim.Muon's normalization."""
    x = _rounded(u, torch.bfloat16)
    norm = _rounded(_rounded(x.norm(), torch.bfloat16) * margin, torch.bfloat16).clamp(min=eps)
    return _rounded(_rounded(x / norm, torch.bfloat16), dtype)


def rounded_newton_schulz(
    u: torch.Tensor,
    sequence,
    margin: float = 1.0,
    dtype: torch.dtype = torch.bfloat16,
    gram: bool = False,
    eps: float = 1e-7,
) -> torch.Tensor:
    """`newton_schulz_fp64` with each product rounded once to `dtype` (fp64 values), the result
    rounded to bf16. gram=False: X X^T, b A + c A A and a X + B X, torch's loop. gram=True: the Gram
    iteration on R = X X^T (`forge.newton_schulz`'s docstring), every n x n product symmetric (its
    lower triangle mirrored), with Q = Z + a I formed by adding a to Z's diagonal in `dtype` (a
    tensor plus a Python scalar: a is rounded to `dtype` first)."""
    x, tall = _wide(u)
    x = _normalized(x, dtype, margin, eps)
    if gram:
        x = _gram_rounded(x, list(sequence), dtype)
    else:
        for a, b, c in sequence:
            g = _rounded(x @ x.T, dtype)
            x = _rounded(a * x + _rounded(b * g + c * g @ g, dtype) @ x, dtype)
    x = _rounded(x, torch.bfloat16)
    return x.T if tall else x


def _gram_rounded(x: torch.Tensor, sequence: list, dtype: torch.dtype) -> torch.Tensor:
    def sym(p, q=None, d=None, alpha=1.0, beta=0.0):  # beta d + alpha p q^T, rounded, mirrored
        c = _rounded(alpha * p @ (p if q is None else q).T + (0.0 if d is None else beta * d), dtype).tril()
        return c + c.tril(-1).T

    r, q = sym(x), None
    for t, (a, b, c) in enumerate(sequence):
        if t == GRAM_RESTART and q is not None:
            x = _rounded(q @ x, dtype)
            r, q = sym(x), None
        z = sym(r, r, r, alpha=c, beta=b)
        if q is None:
            q = _rounded(
                z
                + _rounded(torch.tensor(a, dtype=torch.float64), dtype)
                * torch.eye(len(z), dtype=z.dtype, device=z.device),
                dtype,
            )
        else:
            q = sym(q, z, q, beta=a)
        if t < len(sequence) - 1 and t + 1 != GRAM_RESTART:
            rz = sym(r, z, r, beta=a)
            r = sym(z, rz, rz, beta=a)
    return x if q is None else _rounded(q @ x, dtype)


def flip_allowance(depth: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """How far, relative to the rounding's own distance from the fp64 polynomial, products of depth
    up to `depth` accumulated in fp32 may carry an iteration from `rounded_newton_schulz` (the module
    docstring): 4 sqrt(12 depth 2^-24 / u)."""
    return 4 * math.sqrt(12 * min(1.0, depth * 2.0**-24 / UNIT_ROUNDOFF[dtype]))


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp64; NaN where either holds a NaN or an infinity (never within a bound)."""
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.nan
    return float((a - b).norm() / b.norm())
