"""GPU-only checks of FORGE's FP8 layers (skipped without CUDA): on Hopper's FP8 tensor cores the
fused update equals torch.optim's step on the fp32 result of `torch._scaled_mm` over the same FP8
operands, and the forward and dX, as torchao's Float8Linear's, are the FP8 GEMMs of those casts.

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
        worst = max(worst, float((layer.weight - twin.weight).detach().abs().max()))
    print(f"{shape}: max |w_forge - w_torch| = {worst:.3e}")
    torch.testing.assert_close(layer.weight, twin.weight, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize(
    "T, N, K", [(1024, 4096, 2048), (4096, 4096, 2048), (1008, 1000, 4096)], ids=["T1024", "T4096", "edges"]
)
def test_the_warp_specialized_fp8_kernel_applies_the_triton_kernels_step(T, N, K, state_dtype):
    """The FP8 path of `forge.kernels.wgrad_update_ws` against the Triton kernel's T-major loop on
    the same FP8 operands and random states, stochastic rounding on: both add each 128 tokens'
    products into fp32, but their FP8 MMAs are not the same instructions, and the FP8 accumulator
    inside an MMA keeps about 14 bits, so the sums differ in their last bits. fp32 weights and
    moments show that in many elements (21.5% of them on an H200), and in a few the gap is far
    larger: 2 and 4 of 8.4M beyond 2^-14 of the tensor's largest value (plus 10^-5 of their own),
    the largest 2^-9.7 of it (`_assert_within_the_fp8_mma`); bf16 and int8 states differ only
    where a sum rounds the other way, with the exact and the fast epilogue, on 128- and 64-row
    tiles, in 8- and 16-row slices; the overlapped promotion equals the 64-row tiles' to the bit.
    Edges: N and T no multiple of a tile."""
    from forge.kernels import (
        FP8_WARP_SPECIALIZED,
        FP8_WARP_SPECIALIZED_SMALL_T,
        KernelConfig,
        fp8_config,
        pick_config,
        quant,
    )
    from harness.kernels.fp8 import CANDIDATES
    from tests.forge.test_gpu import _assert_differ_only_in_rounding

    g = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = (torch.randn(T, N, device="cuda", generator=g) / T**0.5).bfloat16()
    weight = (torch.randn(N, K, device="cuda", generator=g) * 0.02).bfloat16()
    _, dy8, x8, scale = fp8.backward(dy, x, weight, need_dx=False)
    hp = dict(lr=1e-3, weight_decay=0.01)

    def step(config):
        layer = nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            layer.weight.copy_(weight)
        opt = forge.attach(layer, "adamw", state_dtype=state_dtype, **hp)
        state = opt.state[layer.weight]
        start = torch.Generator(device="cuda").manual_seed(13)
        matrices = sorted(n for n, v in state.items() if isinstance(v, torch.Tensor) and v.dim() == 2)
        for name in matrices:  # random states, as after some training (int8: codes and their scales)
            if name.endswith("_absmax"):
                continue
            values = torch.rand(state[name].shape, device="cuda", generator=start) * 1e-3
            if state_dtype == "int8":
                codes, absmax = quant.quantize(values, state[name].dtype == torch.int8)
                state[name].copy_(codes)
                state[name + "_absmax"].copy_(absmax)
            else:
                state[name].copy_(values)
        opt.update_linear(layer.weight, dy8, x8, config=config, grad_scale=scale)
        return [layer.weight.detach(), *(state[n] for n in matrices)]

    triton = fp8_config(pick_config(T, N, K, state_dtype, on_interpreter=False), on_interpreter=False)
    triton_step = step(triton)
    ws = FP8_WARP_SPECIALIZED["fp32"]  # the exact epilogue
    for got, want in zip(step(ws), triton_step):
        if state_dtype == "fp32":  # every bit of the sums shows, to the FP8 accumulator's ~14 bits
            _assert_within_the_fp8_mma(got, want)
        else:
            _assert_differ_only_in_rounding(got, want, "the FP8 warp-specialized kernel")
    if state_dtype != "fp32":
        for got, want in zip(step(FP8_WARP_SPECIALIZED["bf16"]), triton_step):
            _assert_differ_only_in_rounding(got, want, "the FP8 warp-specialized kernel's fast epilogue")
        # the FP8 kernel lab's 16-row slices (ws_16rows), a candidate for bf16 states above T = 1024
        sixteen = CANDIDATES["ws_16rows"]
        for got, want in zip(step(KernelConfig(**sixteen)), triton_step):
            _assert_differ_only_in_rounding(got, want, "the FP8 warp-specialized kernel in 16-row slices")
        # 64-row tiles, one MMA warpgroup, 8 epilogue warps: bf16 states up to T = 2048, int8 at every T
        narrow = step(FP8_WARP_SPECIALIZED_SMALL_T["bf16"])
        for got, want in zip(narrow, triton_step):
            _assert_differ_only_in_rounding(got, want, "the FP8 warp-specialized kernel on 64-row tiles")
        # the lab's overlapped promotion adds the same partial sums in the same order: to the bit
        overlapped = step(KernelConfig(**CANDIDATES["ws_64x128_overlap"]))
        for got, want in zip(overlapped, narrow):
            assert torch.equal(got, want), "the overlapped promotion changed the sums"


def _assert_within_the_fp8_mma(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 results of two FP8 kernels: all within 2^-8 of the tensor's largest value, and at
    most one element in 10^5 beyond 2^-14 of it. A wrong coefficient or a lost tile in the
    epilogue moves most elements far beyond both."""
    top = float(want.abs().max())
    gap = (got - want).abs()
    torch.testing.assert_close(got, want, rtol=0, atol=2**-8 * top)
    beyond = int((gap > 2**-14 * top).sum())
    assert beyond <= want.numel() // 10**5, f"{beyond} of {want.numel()} elements beyond 2^-14 of the largest"


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_forward_and_dx_are_the_fp8_gemms_as_torchao_computes_them():
    """FORGE's forward and dX against the exact product of the same FP8 casts (fp64), and torchao's
    Float8Linear against it too, norm-relative, within a few bf16 roundings: the forward keeps the
    FP8 MMA's own accumulator (fast accumulation, as torchao's does), dX adds into fp32, so the two
    layers need not agree to the bit on the GPU; on the CPU (`tests/forge/test_fp8.py`) they do."""
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(1)
    ours = nn.Linear(4096, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    theirs = copy.deepcopy(ours)
    w = ours.weight.detach().clone()
    forge.attach(ours, "adamw", lr=0.0, fp8="tensorwise")
    # a bare nn.Linear is replaced, not converted in place: keep what torchao returns
    theirs = float8.convert_to_float8_training(
        theirs, config=float8.Float8LinearConfig.from_recipe_name("tensorwise")
    )
    assert type(theirs).__name__ == "Float8Linear"
    x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    x8, x_inv = fp8.cast(x, fp8.INPUT_DTYPE)
    w8, w_inv = fp8.cast(w, fp8.INPUT_DTYPE)
    dy8, dy_inv = fp8.cast(dy, fp8.GRAD_DTYPE)
    y_exact = x8.double() @ w8.double().t() * (x_inv.double() * w_inv.double())
    dx_exact = dy8.double() @ w8.double() * (dy_inv.double() * w_inv.double())
    errors, y_of = {}, {}
    for name, layer in (("forge", ours), ("torchao", theirs)):
        xi = x.clone().requires_grad_()
        y = y_of[name] = layer(xi)
        y.backward(dy)
        errors[name] = (_relative(y, y_exact), _relative(xi.grad, dx_exact))
    print(f"norm-relative error of y and dx against the exact FP8 product: {errors}")
    print(f"forge and torchao bitwise equal: y {torch.equal(y_of['forge'], y_of['torchao'])}")
    for name, (y_error, dx_error) in errors.items():
        assert y_error < 5e-3 and dx_error < 5e-3, (name, errors)


@pytest.mark.parametrize("dtype", [fp8.INPUT_DTYPE, fp8.GRAD_DTYPE], ids=["e4m3", "e5m2"])
def test_the_fused_casts_equal_the_pytorch_casts_on_the_gpu(dtype):
    """`forge.kernels.fp8_cast` (what the FP8 layers run on a GPU) against `forge.fp8.cast`
    (PyTorch ops), bit for bit, on a Llama-sized bf16 weight and a ragged activation."""
    from forge.kernels import fp8_cast

    torch.manual_seed(2)
    for shape in ((14336, 4096), (1000, 1008)):
        t = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        expected, inverse = fp8.cast(t, dtype)
        rows, transposed, inv = fp8_cast.cast(t, dtype, rows=True, transposed=True)
        assert torch.equal(rows.view(torch.uint8), expected.view(torch.uint8)), shape
        assert torch.equal(transposed.view(torch.uint8), expected.t().contiguous().view(torch.uint8)), shape
        assert torch.equal(inv, inverse), shape
