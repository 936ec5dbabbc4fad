"""Kernel micro-benchmarks (pytest-benchmark): FORGE's fused dW-GEMM + update against cuBLAS.

GPU only: skipped without CUDA or without pytest-benchmark (`pip install -e .[bench]`). Every timed
function ends with `torch.cuda.synchronize()`, so a round measures the kernels, not their launch.

    pytest benchmarks --benchmark-autosave                      # record a run (.benchmarks/)
    pytest benchmarks --benchmark-compare --benchmark-compare-fail=median:5%   # against the last

Per (shape, T), in one benchmark group so the table reads side by side:
- `cublas_gemm`: the weight-gradient GEMM alone, `torch.mm(dy.t(), x)` (bf16 out);
- `gemm_adamw`: what a separate optimizer pays: that GEMM, then `torch.optim.AdamW(fused=True)`
  on the gradient it wrote (bf16 weights, bf16 states);
- `torch_layer`: one nn.Linear, forward + backward + fused AdamW step (the full baseline);
- `forge_layer`: the same nn.Linear after `forge.attach`, forward + backward, the update fused
  into the dW GEMM (public API; the same work as `torch_layer`).

The expectation: `forge_layer` <= `torch_layer`, and `forge_layer` - (forward + dX GEMM) near
`cublas_gemm` once T is large enough for the GEMM to hide the update (issue 3). Shapes are
Llama-3.1-8B's q and down projections; inputs are fresh random draws, never zeros.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pytest_benchmark")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="kernel benchmarks need a CUDA device"),
]

SHAPES = [("q", 4096, 4096), ("down", 4096, 14336)]  # (name, N out features, K in features)
TOKENS = [2048, 8192]
ROUNDS, WARMUP = 30, 5
CASES = [pytest.param(s, t, id=f"{s[0]}-{s[1]}x{s[2]}-T{t}") for s in SHAPES for t in TOKENS]


def _timed(benchmark, fn, group: str, **info) -> None:
    """Run `fn` (which synchronizes) for a fixed number of rounds after warm-up."""
    benchmark.group = group
    benchmark.extra_info.update(info)
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)


def _inputs(tokens: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) * 1e-3
    return x, dy


def _linear(n: int, k: int) -> torch.nn.Linear:
    return torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_cublas_gemm(benchmark, shape, tokens):
    name, n, k = shape
    x, dy = _inputs(tokens, n, k)

    def run():
        torch.mm(dy.t(), x)
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", variant="cublas_gemm", N=n, K=k, T=tokens)


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_gemm_plus_fused_adamw(benchmark, shape, tokens):
    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    weight = torch.nn.Parameter(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    opt = torch.optim.AdamW([weight], lr=1e-4, weight_decay=0.01, fused=True)

    def run():
        weight.grad = torch.mm(dy.t(), x)
        opt.step()
        weight.grad = None
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", variant="gemm_plus_fused_adamw", N=n, K=k, T=tokens)


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_torch_layer_step(benchmark, shape, tokens):
    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    x.requires_grad_(True)
    layer = _linear(n, k)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def run():
        layer(x).backward(dy)
        opt.step()
        opt.zero_grad(set_to_none=True)
        x.grad = None
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", variant="torch_layer", N=n, K=k, T=tokens)


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_forge_layer_step(benchmark, shape, tokens, state_dtype):
    import forge

    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    x.requires_grad_(True)
    layer = torch.nn.Sequential(_linear(n, k))
    forge.attach(layer, "adamw", lr=1e-4, weight_decay=0.01, state_dtype=state_dtype)
    before = layer[0].weight.detach().clone()

    def run():
        layer(x).backward(dy)  # the update happens here
        x.grad = None
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", variant=f"forge_{state_dtype}", N=n, K=k, T=tokens)
    assert not torch.equal(before, layer[0].weight.detach()), "FORGE did not update the weight"
