"""GPU-only checks of FORGE's Muon (skipped without CUDA): the fused momentum on the GPU's kernels
against torch.optim.Muon, its CUDA-graph replays against its eager steps, and the memory it holds.

Run on the device, in one process: `pytest -o addopts="" tests/forge/test_gpu_muon.py -q`.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import forge

pytestmark = pytest.mark.gpu
HPARAMS = dict(lr=0.02, momentum=0.95, weight_decay=0.1)


def _stack(dtype: torch.dtype, widths=(1024, 2816, 1024, 512)) -> nn.Module:
    """Bias-free linear layers of Llama-like odd proportions (wide, tall) on the GPU."""
    torch.manual_seed(0)
    layers = [nn.Linear(a, b, bias=False) for a, b in zip(widths, widths[1:])]
    return nn.Sequential(*layers).to("cuda", dtype)


def _steps(model: nn.Module, n: int, tokens: int = 1024) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    dtype = next(model.parameters()).dtype
    for _ in range(n):
        x = torch.randn(tokens, model[0].in_features, device="cuda", dtype=dtype, generator=g)
        model(x).float().pow(2).mean().backward()


@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
def test_fp32_forge_muon_equals_torch_muon_on_gpu(nesterov):
    reference, model = _stack(torch.float32), _stack(torch.float32)
    opt = torch.optim.Muon(reference.parameters(), nesterov=nesterov, **HPARAMS)
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(4):
        x = torch.randn(1024, 1024, device="cuda", generator=g)
        reference(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    forge.attach(model, "muon", state_dtype="fp32", nesterov=nesterov, **HPARAMS)
    _steps(model, 4)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert a.grad is None
        assert float((a - b).norm() / b.norm()) <= 2e-3


def test_replayed_muon_steps_equal_eager_steps():
    """capturable=True: one forward and backward captured, replayed; the same weights and momentum
    as the same steps run eagerly (the decay and the step read from the step rows either way)."""
    eager, graphed = _stack(torch.bfloat16), _stack(torch.bfloat16)
    forge.attach(eager, "muon", state_dtype="fp32", capturable=True, **HPARAMS)
    opt = forge.attach(graphed, "muon", state_dtype="fp32", capturable=True, **HPARAMS)
    xs = [torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(5)]
    for x in xs:
        eager(x).float().pow(2).mean().backward()
    static = xs[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as graph capture asks
        graphed(static).float().pow(2).mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed(static).float().pow(2).mean().backward()
    for x in xs[1:]:
        static.copy_(x)
        opt.prepare_replay()
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(graphed.parameters(), eager.parameters()):
        assert torch.equal(a, b)


def test_the_backward_holds_no_gradient_only_one_layers_workspace():
    """FORGE Muon's backward peak over its start: at most the largest layer's Newton-Schulz
    workspace (its scratch, two iterates, two Gram matrices: 6 N K + 4 min(N, K)^2 bytes) and the
    activations' gradients. On 16 layers of 4096 x 1024 that is under half the weights' gradients
    torch keeps (128 MiB against one layer's 28 MiB)."""
    model = _stack(torch.bfloat16, widths=(1024,) + (4096, 1024) * 8)
    forge.attach(model, "muon", state_dtype="bf16", **HPARAMS)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    model(x).float().pow(2).mean().backward()  # states and kernels exist from here on
    torch.cuda.synchronize()
    loss = model(x).float().pow(2).mean()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    loss.backward()
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - start
    gradients = sum(p.numel() * p.element_size() for p in model.parameters())
    rows, cols = max((p.shape for p in model.parameters()), key=lambda shape: shape.numel())
    workspace = 6 * rows * cols + 4 * min(rows, cols) ** 2
    assert grown <= workspace + 16 * 2**20, f"{grown / 2**20:.0f} MiB grown"
    assert grown < 0.5 * gradients
    assert math.isfinite(float(model[0].weight.float().norm()))
