"""Kernel micro-benchmarks (pytest-benchmark): FORGE's fused dW GEMM + update against cuBLAS.

GPU only: skipped without CUDA or without pytest-benchmark (`pip install -e ".[bench]"`). Every
timed function ends with `torch.cuda.synchronize()`, so a round measures the kernels, not their
launch.

    pytest benchmarks --benchmark-autosave                      # record a run (.benchmarks/)
    pytest benchmarks --benchmark-compare --benchmark-compare-fail=median:5%   # against the last

Per (shape, T), in one benchmark group so the table reads side by side:
- `cublas_gemm`: the weight-gradient GEMM alone, `torch.mm(dy.t(), x)` (bf16 out);
- `gemm_adamw`: what a separate optimizer pays: that GEMM, then `torch.optim.AdamW(fused=True)`
  on the gradient it wrote (bf16 weights, bf16 states);
- `forge_update`: FORGE's fused kernel alone, the same step with the gradient never written
  (`ForgeOptimizer.update_linear`, the launch config shipped for the shape);
- `torch_layer`: one nn.Linear, forward + backward + fused AdamW step (the full baseline);
- `forge_layer`: the same nn.Linear after `forge.attach`, forward + backward, the update fused
  into the dW GEMM (the same work as `torch_layer`).

The expectation: `forge_update` <= `gemm_adamw` and `forge_layer` <= `torch_layer`, and
`forge_update` near `cublas_gemm` once T is large enough for the GEMM to hide the update. Each
benchmark checks that its step did its work (weights moved and stayed finite); the FORGE ones
record their median over the baseline's in `extra_info` when the baseline ran earlier in the same
pytest run. Shapes are Llama-3.1-8B's q and down projections; inputs are fresh random
draws, never zeros.
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
# median seconds of the baselines, by (variant, group): the FORGE benchmarks record their ratio
MEDIANS: dict[tuple[str, str], float] = {}


def _timed(benchmark, fn, group: str, variant: str, baseline: str | None = None, **info) -> None:
    """Run `fn` (which synchronizes) for a fixed number of rounds after warm-up; keep its median,
    and record the ratio to `baseline`'s median where that ran in this process."""
    benchmark.group = group
    benchmark.extra_info.update(info, variant=variant)
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable: nothing timed
        return
    median = stats.stats.median
    MEDIANS[(variant, group)] = median
    if baseline is not None and (baseline, group) in MEDIANS:
        benchmark.extra_info[f"ratio_to_{baseline}"] = median / MEDIANS[(baseline, group)]


def _inputs(tokens: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) * 1e-3
    return x, dy


def _linear(n: int, k: int) -> torch.nn.Linear:
    return torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)


def _moved(before: torch.Tensor, after: torch.Tensor) -> None:
    assert torch.isfinite(after).all(), "the weight became non-finite"
    assert not torch.equal(before, after), "the step did not update the weight"


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_cublas_gemm(benchmark, shape, tokens):
    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    out = {}

    def run():
        out["dw"] = torch.mm(dy.t(), x)
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", "cublas_gemm", N=n, K=k, T=tokens)
    assert out["dw"].shape == (n, k) and torch.isfinite(out["dw"]).all()


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_gemm_plus_fused_adamw(benchmark, shape, tokens):
    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    weight = torch.nn.Parameter(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    opt = torch.optim.AdamW([weight], lr=1e-4, weight_decay=0.01, fused=True)
    before = weight.detach().clone()

    def run():
        weight.grad = torch.mm(dy.t(), x)
        opt.step()
        weight.grad = None
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", "gemm_plus_fused_adamw", N=n, K=k, T=tokens)
    _moved(before, weight.detach())


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_forge_update(benchmark, shape, tokens, state_dtype):
    import forge

    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    layer = torch.nn.Sequential(_linear(n, k))
    opt = forge.attach(layer, "adamw", lr=1e-4, weight_decay=0.01, state_dtype=state_dtype)
    weight = layer[0].weight
    before = weight.detach().clone()

    def run():
        opt.update_linear(weight, dy, x)
        torch.cuda.synchronize()

    variant = f"forge_update_{state_dtype}"
    _timed(benchmark, run, f"{name}-T{tokens}", variant, "gemm_plus_fused_adamw", N=n, K=k, T=tokens)
    _moved(before, weight.detach())


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_torch_layer_step(benchmark, shape, tokens):
    name, n, k = shape
    x, dy = _inputs(tokens, n, k)
    x.requires_grad_(True)
    layer = _linear(n, k)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    before = layer.weight.detach().clone()

    def run():
        layer(x).backward(dy)
        opt.step()
        opt.zero_grad(set_to_none=True)
        x.grad = None
        torch.cuda.synchronize()

    _timed(benchmark, run, f"{name}-T{tokens}", "torch_layer", N=n, K=k, T=tokens)
    _moved(before, layer.weight.detach())


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

    variant = f"forge_layer_{state_dtype}"
    _timed(benchmark, run, f"{name}-T{tokens}", variant, "torch_layer", N=n, K=k, T=tokens)
    _moved(before, layer[0].weight.detach())
