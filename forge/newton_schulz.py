"""Newton-Schulz orthogonalization for Muon: torch's iteration, and faster or sharper variants.

Muon steps a weight by ~U V^T of its update's SVD U S V^T. Newton-Schulz gets there with matrix
products only: X <- X / |X|_F (every singular value at most 1), then k times

    A = X X^T,   B = b A + c A A,   X <- a X + B X        (X (n, m) with n <= m: the wide side)

which applies the odd polynomial p(s) = a s + b s^3 + c s^5 to every singular value. Per
iteration that is 2 n^2 m + 2 n^3 + 2 n^2 m multiply-adds, the third of which (B X) is the only
one whose result is not symmetric. `forge.attach(model, "muon", newton_schulz=...)` picks how:

- "torch" (the default): `torch.optim.Muon`'s iteration op for op (`orthogonalize`): bf16, one
  fixed coefficient triple (`ns_coefficients`, Jordan's (3.4445, -4.7750, 2.0315)), plain GEMMs.
  FORGE's Muon with it equals torch's to the bf16 rounding of the update.
- "symmetric": the same iteration and coefficients, with A = X X^T and A A computed one triangle
  at a time in a Triton kernel (`forge.kernels.symmetric_product`) and mirrored: 2/3 of the
  multiply-adds on a square matrix, about 0.72 on Llama's 4096 x 14336 MLP matrices.
- "gram": Gram Newton-Schulz (Zhang, Amsel, Chen, Dao 2026; Dao-AILab/gram-newton-schulz): the
  same polynomial, carried on the small n x n Gram matrix R = X X^T instead of on X. With
  Z = b R + c R R the iteration is X <- (a I + Z) X, so X_k = Q X_0 with Q the product of the
  (a I + Z) and R <- (a I + Z) R (a I + Z); every factor is a polynomial in R, so all of them
  commute and every product is symmetric. X is multiplied only to start, at a restart and at the
  end. The restart (X <- Q X, R <- X X^T, Q <- I after iteration 2, `GRAM_RESTARTS`) is what the
  authors found keeps the Gram form stable in half precision: R's small eigenvalues are s^2, and
  rounding errors in them grow with every factor of Q. As they do, it runs in fp16 (three more
  mantissa bits than bf16; |X|_F <= 1 keeps every entry far from fp16's range), and every n x n
  product is made exactly symmetric (`mirrored_products`): without that, fp16 loses the accuracy.
  Multiply-adds for 5 iterations: four n x m products of 2 n^2 m (R at the start and the restart,
  Q X at the restart and the end) and 14 n x n ones of 2 n^3, against torch's 5 (4 n^2 m + 2 n^3):
  0.70 of torch's on a 4096 x 14336 matrix, 1.2 on a square one.
- "gram_symmetric": the Gram iteration with every symmetric product (all but the two Q X) in
  the triangle kernel: about 0.4 of torch's multiply-adds on a 4096 x 14336 matrix.
- "polar_express": torch's iteration with a different coefficient triple at each step, the
  5-iteration sequence of Polar Express (Amsel, Persson, Musco, Gower, arXiv 2505.16932): each
  polynomial is the minimax-optimal quintic for the interval the singular values lie in after
  the previous ones, so the result is much closer to U V^T (torch's fixed triple leaves singular
  values anywhere in about [0.7, 1.2]). The same cost as "torch"; a different, sharper update.
- "auto": per shape, the variant measured fastest among those whose output lies no farther from
  the fp64 polar factor than torch's does (`AUTO`, filled from `python -m
  harness.kernels.newton_schulz`'s measurements; a shape not measured gets "torch").

Every variant takes the (rows, cols) update in any float dtype and returns bf16 of that shape;
rows > cols is transposed first, as torch does. `ns_steps` and `eps` apply to each; the
coefficient triple `ns_coefficients` to all but "polar_express", which brings its own sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults (its source names Jordan's post)

# Polar Express's published 5-iteration sequence (arXiv 2505.16932, the authors' polar_express.py
# in NoahAmsel/PolarExpress; the same numbers modded-nanogpt and nanochat ship): the paper's
# `optimal_composition` with l = 1e-3 (the smallest singular value it plans for), a cushion of
# 0.02 and a safety factor 1 + 2e-2 folded into every polynomial but the last (a / s, b / s^3,
# c / s^5), for inputs normalized to |X|_F (1 + 2e-2). Recomputed from that construction, each
# agrees to all printed digits. More iterations repeat the last polynomial, as the authors' code does.
POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_SAFETY = 2e-2  # the input is normalized to |X|_F (1 + this)
GRAM_RESTARTS = (2,)  # iterations that start from X <- Q X, Q <- I (Dao-AILab's recommended one restart)
GRAM_DTYPE = torch.float16

VARIANTS = ("torch", "symmetric", "gram", "gram_symmetric", "polar_express")
CHOICES = (*VARIANTS, "auto")

# "auto"'s choice per weight shape, keyed by (min(rows, cols), max(rows, cols)): the fastest variant
# that computes torch's polynomial within twice torch's own rounding of it, written between the
# markers from a GPU run's records by `python -m harness.kernels.newton_schulz --auto FILE` (FILE
# names the run); a shape not in it gets "torch".
# generated: newton-schulz-auto (python -m harness.kernels.newton_schulz --auto FILE)
# FILE: results/device-logs/newton-schulz-20261206-1abd8ba.jsonl
AUTO: dict[tuple[int, int], str] = {
    (1024, 4096): "torch",
    (1024, 5120): "torch",
    (4096, 4096): "symmetric",
    (4096, 14336): "gram_symmetric",
    (5120, 5120): "symmetric",
    (5120, 17408): "gram_symmetric",
}
# end generated: newton-schulz-auto

Products = Callable[..., torch.Tensor]  # (p, q=None, d=None, *, alpha, beta) -> beta d + alpha p q^T


def check_variant(name: object) -> str:
    """`name` if it is one of `CHOICES`, else a ValueError that lists them."""
    if name not in CHOICES:
        choices = ", ".join(map(repr, CHOICES))
        raise ValueError(
            f"newton_schulz={name!r} is not a Newton-Schulz variant; choose one of {choices} ('torch' is "
            "torch.optim.Muon's arithmetic, 'auto' the measured fastest safe one for each shape)"
        )
    return name  # type: ignore[return-value]


def pick(variant: str, shape: Sequence[int]) -> str:
    """The variant that runs for a (rows, cols) weight: `variant`, or for "auto" the shape's entry of
    `AUTO` ("torch" where the shape was not measured)."""
    if variant != "auto":
        return variant
    rows, cols = int(shape[0]), int(shape[1])
    return AUTO.get((min(rows, cols), max(rows, cols)), "torch")


def orthogonalize(
    u: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """NS_steps(u) in bf16, as `torch.optim.Muon` computes it: `u` is the (rows, cols) update, any
    float dtype; the result is bf16 of the same shape."""
    a, b, c = coefficients
    x = u.bfloat16()
    tall = u.size(0) > u.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        gram_update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, gram_update, x, beta=a)
    return x.T if tall else x


def newton_schulz(
    u: torch.Tensor, variant: str, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """NS_steps(u) by `variant` (one of `VARIANTS`, or "auto": `pick`), bf16 of u's shape."""
    variant = pick(variant, u.shape)
    if variant == "torch":
        return orthogonalize(u, coefficients, steps, eps)
    tall = u.size(0) > u.size(1)
    x = u.T if tall else u
    if variant == "polar_express":
        x = _normalized(x, torch.bfloat16, eps, 1 + POLAR_EXPRESS_SAFETY)
        x = _standard(x, polar_express_sequence(steps), plain_products)
    elif variant == "symmetric":
        x = _standard(_normalized(x, torch.bfloat16, eps), [coefficients] * steps, triangle_products())
    elif variant in ("gram", "gram_symmetric"):
        products = triangle_products() if variant == "gram_symmetric" else mirrored_products
        x = _gram(_normalized(x, GRAM_DTYPE, eps), [coefficients] * steps, products).bfloat16()
    else:
        check_variant(variant)
        raise ValueError(f"newton_schulz={variant!r} cannot be run here")  # "auto" resolved above
    return x.T if tall else x


def polar_express_sequence(steps: int) -> list[tuple[float, float, float]]:
    """Polar Express's first `steps` polynomials, the last repeated beyond its five."""
    known = list(POLAR_EXPRESS_COEFFICIENTS)
    return known[:steps] + [known[-1]] * (steps - len(known))  # a count below 1 repeats nothing


def _normalized(x: torch.Tensor, dtype: torch.dtype, eps: float, margin: float = 1.0) -> torch.Tensor:
    """x / (margin |x|_F) as a new `dtype` tensor, x taken in bf16 and its norm in bf16 (clamped at
    eps) as torch computes them; divided before any cast to fp16, whose range a raw update may pass."""
    x = x.bfloat16()
    scale = (x.norm() * margin).clamp(min=eps)
    return torch.div(x, scale, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def plain_products(p, q=None, d=None, *, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
    """beta d + alpha p q^T by cuBLAS (every tile computed), as `torch.addmm`."""
    q = p if q is None else q
    if d is None:
        return torch.mm(p, q.T) if alpha == 1.0 else torch.mm(p, q.T).mul_(alpha)
    return torch.addmm(d, p, q.T, beta=beta, alpha=alpha)


def mirrored_products(p, q=None, d=None, *, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
    """`plain_products` made exactly symmetric, its lower triangle mirrored: the Gram iteration
    needs it. Each element of a cuBLAS or CPU product is summed on its own, so C and C^T differ in
    the last bits; in fp16, Q built from such products drifts from a polynomial in R and the
    iteration loses several times torch's accuracy (tests/forge/test_newton_schulz.py shows it)."""
    c = plain_products(p, q, d, alpha=alpha, beta=beta).tril_()
    return c.add_(c.tril(-1).T)


def triangle_products() -> Products:
    """beta d + alpha p q^T for a symmetric result, one triangle computed (`symmetric_product`)."""
    from forge.kernels.symmetric_product import symmetric_product

    return symmetric_product


def _standard(
    x: torch.Tensor, coefficients: Sequence[tuple[float, float, float]], sym: Products
) -> torch.Tensor:
    """Newton-Schulz on a normalized (n, m) X, n <= m, one (a, b, c) per iteration; the symmetric
    products A = X X^T and B = b A + c A A^T by `sym`."""
    for a, b, c in coefficients:
        gram = sym(x)
        gram_update = sym(gram, gram, gram, alpha=c, beta=b)
        x = torch.addmm(x, gram_update, x, beta=a)
    return x


def _gram(x: torch.Tensor, coefficients: Sequence[tuple[float, float, float]], sym: Products) -> torch.Tensor:
    """Gram Newton-Schulz on a normalized (n, m) X, n <= m (the module docstring): R = X X^T,
    Z = b R + c R R, Q <- Q (Z + a I), R <- (Z + a I) R (Z + a I), X <- Q X at each restart and at
    the end. Every product of n x n matrices is symmetric (polynomials in one R) and goes to `sym`;
    R is not advanced after the last iteration nor before a restart, which recomputes it."""
    r, q = sym(x), None
    last = len(coefficients) - 1
    for t, (a, b, c) in enumerate(coefficients):
        if t in GRAM_RESTARTS and q is not None:
            x = q @ x
            r, q = sym(x), None
        z = sym(r, r, r, alpha=c, beta=b)
        if q is None:  # Q = Z + a I
            q = z.clone()
            q.diagonal().add_(a)
        else:  # Q (Z + a I)
            q = sym(q, z, q, beta=a)
        if t < last and t + 1 not in GRAM_RESTARTS:
            rz = sym(r, z, r, beta=a)  # R (Z + a I)
            r = sym(z, rz, rz, beta=a)  # (Z + a I) R (Z + a I)
    return x if q is None else q @ x
