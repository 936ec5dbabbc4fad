"""The Newton-Schulz variants compiled on a GPU, at sizes where tiles and pipelining are real.

The CPU tests run the symmetric-product kernel in Triton's interpreter at small shapes; here the
compiled kernel meets several tiles per side, a K loop of many steps and ragged edges, and each
variant a Llama-sized wide matrix and a CUDA graph: within twice its definition's rounding (each
product rounded once to its dtype, `tests.forge.reference`) of its fp64 polynomial.
"""

from __future__ import annotations

import pytest
import torch

from forge import newton_schulz as ns
from tests.forge import reference as ref

pytestmark = pytest.mark.gpu

STEPS, EPS = 5, 1e-7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "n, k", [(1000, 3000), (257, 64), (4096, 1024)], ids=["1000x3000", "257x64", "4096x1k"]
)
def test_the_compiled_symmetric_kernel_is_the_product_to_fp32_rounding(n, k, dtype):
    from forge.kernels.symmetric_product import symmetric_product

    g = torch.Generator(device="cuda").manual_seed(0)
    p = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k**0.5
    d = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    d = (d + d.T) / 2
    out = symmetric_product(p, p, d, alpha=0.5, beta=-1.25)
    exact = -1.25 * d.double() + 0.5 * p.double() @ p.double().T
    bound = k * 2**-24 * (0.5 * p.double().abs() @ p.double().abs().T + 1.25 * d.double().abs())
    half_ulp = {torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    assert torch.all((out.double() - exact).abs() <= bound + half_ulp * exact.abs())
    assert torch.equal(out, out.T)


@pytest.mark.parametrize("variant", ns.VARIANTS)
def test_each_variant_on_a_wide_llama_matrix_is_its_polynomial_to_bf16_rounding(variant):
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(1024, 3584, device="cuda", dtype=torch.bfloat16, generator=g)  # 3.5:1, as an MLP's
    d = ref.newton_schulz_definition(variant, STEPS)
    exact = ref.newton_schulz_fp64(u, d["sequence"], d.get("margin", 1.0))
    allowance = 2 * ref.distance(ref.rounded_newton_schulz(u, **d), exact)  # its products rounded once each
    own = ref.distance(ns.newton_schulz(u, variant, ns.NS_COEFFICIENTS, STEPS, EPS), exact)
    assert own <= allowance, f"{variant}: {own:.4f} from its fp64 polynomial, allowed {allowance:.4f}"


@pytest.mark.parametrize("variant", ["symmetric", "gram_symmetric"])
def test_a_variant_replays_from_a_cuda_graph_as_it_runs_eagerly(variant):
    g = torch.Generator(device="cuda").manual_seed(2)
    u = torch.randn(512, 1536, device="cuda", dtype=torch.bfloat16, generator=g)
    eager = ns.newton_schulz(u, variant, ns.NS_COEFFICIENTS, STEPS, EPS)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ns.newton_schulz(u, variant, ns.NS_COEFFICIENTS, STEPS, EPS)  # warm: compiled before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ns.newton_schulz(u, variant, ns.NS_COEFFICIENTS, STEPS, EPS)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
