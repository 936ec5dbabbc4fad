"""GPU: every rule's fp32 step through the warp-specialized kernel, against the fp64 truth.

torch.optim in fp32 is itself some distance from the exact step: its cuBLAS GEMM rounds the
gradient, and the rule's arithmetic rounds again. FORGE accumulates dW in fp32 registers in another
order and applies the same rule in fp32, so it should sit about as far from the truth, and never
much farther. Measured here: the distance of each to the step computed in fp64 (torch.optim on fp64
weights, states and gradient), after several steps on fresh random data, and FORGE's may be at most
twice torch's.

The layer is large enough (4096 x 4096, T = 1024, bf16 operands as under autocast) for FORGE to
launch its warp-specialized Gluon kernel on Hopper with fp32 weights and fp32 states; the test
checks that it did.

Run on the device: `pytest tests/forge/test_gpu_exactness.py -q`.
"""

import importlib
import math

import pytest
import torch
from torch import nn

import forge
from tests.helpers import RULE_CASES

pytestmark = pytest.mark.gpu

T, N, K = 1024, 4096, 4096
STEPS = 6  # past RAdam's rectification threshold (rho_t > 5 from step 6 on with its default betas)


@pytest.mark.parametrize("case", sorted(RULE_CASES))
def test_every_rule_is_no_farther_from_the_fp64_step_than_torch_fp32(case, monkeypatch):
    rule, hp = case.split("-")[0], RULE_CASES[case]
    ws = importlib.import_module("forge.kernels.wgrad_update_ws")
    launches = []
    launch = ws.launch
    monkeypatch.setattr(ws, "launch", lambda *a, **kw: (launches.append(1), launch(*a, **kw))[1])

    w0 = torch.randn(N, K, device="cuda") * 0.02
    layer = nn.Linear(K, N, bias=False, device="cuda")
    with torch.no_grad():
        layer.weight.copy_(w0)
    opt = forge.attach(layer, rule, state_dtype="fp32", stochastic_rounding=False, **hp)
    ref32 = nn.Parameter(w0.clone())
    ref64 = nn.Parameter(w0.double())
    opt32 = forge.torch_optimizer(rule, [ref32], **hp)
    opt64 = forge.torch_optimizer(rule, [ref64], **hp)

    for _ in range(STEPS):
        x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        dy = (torch.randn(T, N, device="cuda") / math.sqrt(T)).bfloat16()
        opt.update_linear(layer.weight, dy, x)
        ref32.grad = dy.float().t() @ x.float()
        ref64.grad = dy.double().t() @ x.double()
        opt32.step()
        opt64.step()

    assert launches, "FORGE did not launch its warp-specialized kernel for this layer"
    d_forge = float((layer.weight.detach().double() - ref64.detach()).norm())
    d_torch = float((ref32.detach().double() - ref64.detach()).norm())
    moved = float((ref64.detach() - w0.double()).norm())
    assert 0 < d_torch < moved, f"{case}: torch fp32 {d_torch:.3g} from fp64, update {moved:.3g}"
    assert d_forge <= 2 * d_torch, (
        f"{case}: FORGE {d_forge:.3g} from the fp64 step, torch fp32 {d_torch:.3g} (update {moved:.3g})"
    )
