"""GPU-only checks of FORGE's FP8 layers (skipped without CUDA): on Hopper's FP8 tensor cores the
fused update equals torch.optim's step on the fp32 result of `torch._scaled_mm` over the same FP8
operands, and the forward and dX equal torchao's Float8Linear (to a bf16 rounding).

Run on the device, in one process (its image has no pytest-xdist):
`pytest -o addopts="" tests/forge/test_gpu_fp8.py -q`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import forge
from forge import fp8

pytestmark = pytest.mark.gpu


# (T, N, K): above and below the FLOP count where the kernel reads its operands by TMA, and a T
# that is no multiple of the kernel's T tile
@pytest.mark.parametrize("shape", [(1024, 4096, 4096), (1008, 1024, 4096), (2048, 1024, 512)], ids=str)
def test_the_fused_fp8_update_equals_adamw_on_scaled_mm(shape):
    T, N, K = shape
    torch.manual_seed(0)
    layer = nn.Linear(K, N, bias=False, device="cuda")
    nn.init.normal_(layer.weight, std=0.02)
    twin = copy.deepcopy(layer)
    hp = dict(lr=1e-3, weight_decay=0.01)
    forge.attach(layer, "adamw", state_dtype="fp32", stochastic_rounding=False, fp8="tensorwise", **hp)
    reference = torch.optim.AdamW(twin.parameters(), **hp)
    worst = 0.0
    for _ in range(2):
        x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / T**0.5
        dy8, dy_inv = fp8.cast(dy, fp8.GRAD_DTYPE)
        x8, x_inv = fp8.cast(x, fp8.INPUT_DTYPE)
        # torch's FP8 GEMM on the same operands, fp32 out: (N, T) row-major @ (T, K) column-major
        a, b = dy8.t().contiguous(), x8.t().contiguous().t()
        twin.weight.grad = torch._scaled_mm(a, b, scale_a=dy_inv, scale_b=x_inv, out_dtype=torch.float32)
        layer(x.float().requires_grad_()).backward(dy.float())  # fp32 weights: the layer casts fp32 inputs
        reference.step()
        worst = max(worst, float((layer.weight - twin.weight).abs().max()))
    print(f"{shape}: max |w_forge - w_torch| = {worst:.3e}")
    torch.testing.assert_close(layer.weight, twin.weight, rtol=1e-5, atol=1e-7)


def test_forward_and_dx_equal_torchao_float8linear():
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(1)
    ours = nn.Linear(4096, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    theirs = copy.deepcopy(ours)
    forge.attach(ours, "adamw", lr=0.0, fp8="tensorwise")
    float8.convert_to_float8_training(theirs, config=float8.Float8LinearConfig.from_recipe_name("tensorwise"))
    x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    y_ours.backward(dy)
    y_theirs.backward(dy)
    # the same casts and cuBLAS calls: equal but for a bf16 rounding where cuBLAS picks another kernel
    print(f"bitwise equal: y {torch.equal(y_ours, y_theirs)}, dx {torch.equal(x_ours.grad, x_theirs.grad)}")
    torch.testing.assert_close(y_ours, y_theirs)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
