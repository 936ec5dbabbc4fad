"""forge.newton_schulz's variants against their definitions, and the symmetric-product kernel against torch.

Each variant orthogonalizes in half precision with products of known depth: it must be the
definition's iteration with every product rounded where its arithmetic rounds it
(`tests.forge.reference.rounded_newton_schulz`: torch's loop in bf16, the Gram iteration in fp16),
within what fp32 accumulation can move such a rounding (`reference.flip_allowance`, from the
products' depth and the dtype's unit roundoff): measured, the code lands within 0.025 of that
allowance-free distance, where a missing normalization margin or iteration moves it by 0.15 to
0.6 of the rounding's own distance and more. Its distance from the fp64 polar factor U V^T of the
SVD may then be at most the fp64 polynomial's own plus twice the rounding's. Inputs have singular
values spread over three decades, the range Muon's polynomials are built for.
"""

from __future__ import annotations

import pytest
import torch

from forge import newton_schulz as ns
from forge.kernels.symmetric_product import symmetric_product
from tests.forge import reference as ref

SHAPES = [(1, 1), (17, 23), (23, 17), (29, 29), (9, 41), (41, 9)]
IDS = [f"{r}x{c}" for r, c in SHAPES]
STEPS = 5
EPS = 1e-7


def _update(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """A (rows, cols) fp32 matrix with singular values log-spaced from 1 down to 1e-3."""
    g = torch.Generator().manual_seed(seed)
    u, _, vh = torch.linalg.svd(
        torch.randn(rows, cols, generator=g, dtype=torch.float64), full_matrices=False
    )
    s = torch.logspace(0, -3, min(rows, cols), dtype=torch.float64)
    return (u @ torch.diag(s) @ vh).float()


def _polar(u: torch.Tensor) -> torch.Tensor:
    left, _, right = torch.linalg.svd(u.double(), full_matrices=False)
    return left @ right


def _exact(u: torch.Tensor, variant: str) -> torch.Tensor:
    d = ref.newton_schulz_definition(variant, STEPS)
    return ref.newton_schulz_fp64(u, d["sequence"], d.get("margin", 1.0))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("variant", ns.VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_each_variant_rounds_where_its_arithmetic_does_and_nowhere_else(shape, variant, seed):
    u = _update(*shape, seed=seed)
    out = ns.newton_schulz(u, variant, ns.NS_COEFFICIENTS, STEPS, EPS)
    assert out.dtype == torch.bfloat16 and out.shape == u.shape
    d = ref.newton_schulz_definition(variant, STEPS)
    rounded = ref.rounded_newton_schulz(u, **d)
    exact = _exact(u, variant)
    rounding = ref.distance(rounded, exact)
    allowed = ref.flip_allowance(max(shape), d.get("dtype", torch.bfloat16)) * rounding + 1e-6
    own = ref.distance(out, rounded)
    assert own <= allowed, (
        f"{variant}: {own:.3g} from its definition rounded as its arithmetic rounds (allowed {allowed:.3g})"
    )
    assert ref.distance(out, _polar(u)) <= ref.distance(exact, _polar(u)) + 2 * rounding + 1e-6


@pytest.mark.parametrize("shape", [(29, 29), (17, 41)], ids=["29x29", "17x41"])
def test_polar_express_lands_closer_to_the_polar_factor_than_torchs_triple(shape):
    u = _update(*shape, seed=3)
    polar = _polar(u)
    sharper = ns.newton_schulz(u, "polar_express", ns.NS_COEFFICIENTS, STEPS, EPS)
    default = ns.newton_schulz(u, "torch", ns.NS_COEFFICIENTS, STEPS, EPS)
    assert ref.distance(sharper, polar) < 0.8 * ref.distance(default, polar)


def test_the_published_polar_express_sequence_keeps_three_decades_near_one():
    """The sequence's composition maps every singular value in [1e-3, 1] / (1 + 2e-2) (the
    normalization's margin) into a band around 1: what the paper builds it for. Scalars in fp64."""
    s = torch.logspace(-3, 0, 2001, dtype=torch.float64) / ref.POLAR_EXPRESS_MARGIN
    for a, b, c in ns.POLAR_EXPRESS_COEFFICIENTS:
        s = a * s + b * s**3 + c * s**5
    assert float(s.min()) > 0.7 and float(s.max()) < 1.15


def test_the_gram_iteration_needs_exactly_symmetric_products():
    """Unmirrored cuBLAS/CPU products (C and C^T differ in their last bits) let Q drift from a
    polynomial in R in fp16: the Gram iteration lands several times farther from its fp64 twin."""
    u = _update(33, 33, seed=1)
    exact = _exact(u, "gram")
    x = ns._normalized(u, ns.GRAM_DTYPE, EPS)
    coefficients = [ns.NS_COEFFICIENTS] * STEPS
    mirrored = ref.distance(ns._gram(x, coefficients, ns.mirrored_products), exact)
    unmirrored = ref.distance(ns._gram(x, coefficients, ns.plain_products), exact)
    assert unmirrored > 2 * mirrored


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize("n, k", [(1, 1), (17, 23), (41, 9), (70, 33)], ids=["1x1", "17x23", "41x9", "70x33"])
def test_the_symmetric_kernel_is_torchs_product_to_fp32_rounding_and_exactly_symmetric(n, k, dtype):
    """beta D + alpha P Q^T with P Q^T symmetric (Q = P S, S symmetric, as Q Z in the Gram
    iteration), against fp64 on the triangle the kernel computes (Q's rounding leaves the exact
    product a hair from symmetric), and exactly symmetric. The kernel sums in fp32 and rounds once:
    fp32's error bound for a K-term dot product (K 2^-24 |P| |Q|^T) plus half a unit in the last
    place of the output dtype."""
    g = torch.Generator().manual_seed(n * 100 + k)
    p = torch.randn(n, k, generator=g, dtype=torch.float64)
    sym = torch.randn(k, k, generator=g, dtype=torch.float64)
    q = p @ (sym + sym.T) / k
    d = torch.randn(n, n, generator=g, dtype=torch.float64)
    d = d + d.T
    p, q, d = p.to(dtype), q.to(dtype), d.to(dtype)
    alpha, beta = 0.75, -1.5
    out = symmetric_product(p, q, d, alpha=alpha, beta=beta)
    exact = beta * d.double() + alpha * p.double() @ q.double().T
    fp32_bound = (
        k * 2**-24 * (abs(alpha) * p.double().abs() @ q.double().abs().T + abs(beta) * d.double().abs())
    )
    half_ulp = {torch.float32: 2**-24, torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    lower = torch.ones(n, n, dtype=torch.bool).tril()
    error = (out.double() - exact).abs()
    assert torch.all(error[lower] <= (fp32_bound + half_ulp * exact.abs())[lower])
    assert torch.equal(out, out.T)
    plain = symmetric_product(p)
    assert torch.allclose(plain.double(), p.double() @ p.double().T, rtol=2 * half_ulp, atol=k * 2**-20)


def test_the_symmetric_kernel_refuses_mismatched_operands():
    with pytest.raises(ValueError, match="one shape"):
        symmetric_product(torch.ones(3, 4), torch.ones(4, 3))
    with pytest.raises(ValueError, match="one dtype"):
        symmetric_product(torch.ones(3, 4), torch.ones(3, 4, dtype=torch.bfloat16))


def test_auto_runs_torchs_iteration_on_a_shape_not_measured(monkeypatch):
    monkeypatch.setattr(ns, "AUTO", {(9, 41): "gram"})
    assert ns.pick("auto", (41, 9)) == "gram" and ns.pick("auto", (9, 41)) == "gram"
    assert ns.pick("auto", (17, 23)) == "torch"
    assert ns.pick("symmetric", (17, 23)) == "symmetric"


def test_an_unknown_variant_is_refused_with_the_choices():
    with pytest.raises(
        ValueError, match="'torch', 'symmetric', 'gram', 'gram_symmetric', 'polar_express', 'auto'"
    ):
        ns.check_variant("fast")


def test_polar_express_repeats_its_last_polynomial_beyond_five_iterations():
    """As the authors' code does: a shorter run takes the first polynomials, a longer one the five
    and then the last again; and the iteration runs exactly that sequence."""
    known = list(ns.POLAR_EXPRESS_COEFFICIENTS)
    assert ns.polar_express_sequence(3) == known[:3]
    assert ns.polar_express_sequence(7) == known + [known[-1]] * 2
    u = _update(17, 23)
    d = ref.newton_schulz_definition("polar_express", 7)
    out = ns.newton_schulz(u, "polar_express", ns.NS_COEFFICIENTS, 7, EPS)
    rounded = ref.rounded_newton_schulz(u, **d)
    exact = ref.newton_schulz_fp64(u, d["sequence"], d["margin"])
    assert ref.distance(out, rounded) <= ref.flip_allowance(23) * ref.distance(rounded, exact) + 1e-6


@pytest.mark.parametrize("products", [ns.plain_products, ns.mirrored_products], ids=["plain", "mirrored"])
def test_the_product_helpers_compute_beta_d_plus_alpha_p_q_transposed(products):
    """Each helper is `beta d + alpha p q^T` for every alpha (0 too) and beta (0 where not given),
    with d or without, q and d given by name as the `Products` signature names them (fp32
    operands: to fp32's rounding of a 9-term dot product)."""
    g = torch.Generator().manual_seed(4)
    p = torch.randn(5, 9, generator=g)
    s = torch.randn(9, 9, generator=g)
    q = p @ (s + s.T)  # p q^T symmetric, as the Gram iteration's products are
    d = torch.randn(5, 5, generator=g)
    d = d + d.T
    for alpha, beta, with_d in [
        (1.0, 0.0, False),
        (0.0, 0.0, False),
        (0.5, 0.0, False),
        (3.0, 0.0, False),
        (-2.0, 1.5, True),
        (1.0, -1.0, True),
        (2.0, None, True),  # beta not given: 0, the product alone
    ]:
        given = {} if beta is None else dict(beta=beta)
        out = products(p, q=q, d=d if with_d else None, alpha=alpha, **given)  # the operands by name too
        exact = alpha * p.double() @ q.double().T + (beta * d.double() if with_d and beta else 0.0)
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


@pytest.mark.parametrize("variant, kind", [("gram", "mirrored"), ("gram_symmetric", "triangle")])
def test_the_gram_iteration_advances_r_only_where_a_later_iteration_reads_it(variant, kind, monkeypatch):
    """The Gram iteration's n x n products, counted, all by the variant's own helper (torch's
    mirrored products for "gram", the triangle kernel for "gram_symmetric"): R = X X^T once, then
    at each iteration Z = b R + c R R (one) and Q (one, none where Q starts as Z + a I: the first
    iteration and the restart's), and R advanced (two) only where the next iteration reads it: not
    after the last, not before the restart, which takes R = X X^T anew (one). Five iterations, the
    restart before the third: 1 + (1 + 2) + (1 + 1) + (1 + 1 + 2) + (1 + 1 + 2) + (1 + 1) = 16
    products; R advanced after every iteration would be 20."""
    calls = []
    mirrored = ns.mirrored_products
    monkeypatch.setattr(
        ns, "mirrored_products", lambda *a, **k: calls.append("mirrored") or mirrored(*a, **k)
    )
    counted = lambda *a, **k: calls.append("triangle") or symmetric_product(*a, **k)  # noqa: E731
    monkeypatch.setattr(ns, "triangle_products", lambda: counted)
    assert ref.GRAM_RESTART == 2
    ns.newton_schulz(_update(17, 23), variant, ns.NS_COEFFICIENTS, 5, EPS)
    assert calls == [kind] * 16, f"{variant}: {len(calls)} products, {sorted(set(calls))}"
