"""GPU: every rule's fp32 step through the warp-specialized kernel, against the fp64 truth.

torch.optim in fp32 is itself some distance from the exact step: its GEMM rounds the gradient,
and the rule's arithmetic rounds again. FORGE accumulates dW in fp32 registers in another order
and applies the same rule in fp32, so it should sit about as far from the truth, and never much
farther. Measured here: the distance of each to the step computed in fp64 (torch.optim on fp64
weights, states and gradient), after several steps on fresh random data.

The layer is large enough (4096 x 4096, T = 1024, bf16 operands as under autocast) for FORGE to
launch its warp-specialized Gluon kernel on Hopper with fp32 weights and fp32 states; the test
checks that it did. That kernel multiplies on tensor cores, whose fp32 accumulation rounds
differently from the CUDA cores' fp32 FMAs. So torch's reference gradient is the tensor-core GEMM
of the same bf16 operands (cuBLAS in TF32 mode, whose products of bf16 values are exact), and
FORGE may be at most twice as far from fp64 as torch.optim on that gradient. On the H200 FORGE
measured 0.68-0.93x torch's distance for every rule; against cuBLAS's CUDA-core SGEMM of the same
operands it is 1.5-4x as far for SGD, AdaGrad, RAdam, AdamW and Lion, a property of tensor cores
that every bf16 GEMM with fp32 accumulation shares (results/device-logs/gpu-exactness-every-rule-*.json).

Adam-like rules take steps of about lr * sign(g) at first: where a gradient is within the GEMM's
rounding of zero, either side may flip its sign and move that weight by ~2 lr, which measures the
data, not FORGE. Weights whose gradient at any step is that close to zero (below 1e-4 of the
gradient's RMS: a few thousand of 16.8 million) are left out of the distances.

Run on the device, in one process (its image has no pytest-xdist):
`pytest -o addopts="" tests/forge/test_gpu_exactness.py -q`.
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


def _tensor_core_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b on tensor cores with fp32 accumulation; exact products where a and b hold bf16 values."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def distances(case: str) -> dict:
    """FORGE's, torch fp32's (tensor-core and CUDA-core gradients) distances to the fp64 step, the
    update's own size, and the number of warp-specialized launches."""
    rule, hp = case.split("-")[0], RULE_CASES[case]
    ws = importlib.import_module("forge.kernels.wgrad_update_ws")
    launches = []
    launch = ws.launch

    def counted(*args, **kwargs):
        launches.append(1)
        return launch(*args, **kwargs)

    ws.launch = counted
    try:
        w0 = torch.randn(N, K, device="cuda") * 0.02
        layer = nn.Linear(K, N, bias=False, device="cuda")
        with torch.no_grad():
            layer.weight.copy_(w0)
        opt = forge.attach(layer, rule, state_dtype="fp32", stochastic_rounding=False, **hp)
        refs = {name: nn.Parameter(w0.clone()) for name in ("tensor_cores", "cuda_cores")}
        ref64 = nn.Parameter(w0.double())
        opts = {name: forge.torch_optimizer(rule, [p], **hp) for name, p in refs.items()}
        opt64 = forge.torch_optimizer(rule, [ref64], **hp)
        ambiguous = torch.zeros(N, K, dtype=torch.bool, device="cuda")
        for _ in range(STEPS):
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            dy = (torch.randn(T, N, device="cuda") / math.sqrt(T)).bfloat16()
            opt.update_linear(layer.weight, dy, x)
            refs["tensor_cores"].grad = _tensor_core_mm(dy.float().t(), x.float())
            refs["cuda_cores"].grad = dy.float().t() @ x.float()
            ref64.grad = dy.double().t() @ x.double()
            ambiguous |= ref64.grad.abs() < 1e-4 * ref64.grad.pow(2).mean().sqrt()
            for o in (*opts.values(), opt64):
                o.step()
    finally:
        ws.launch = launch
    keep = ~ambiguous
    truth = ref64.detach()[keep]
    far = lambda w: float((w.detach().double()[keep] - truth).norm())  # noqa: E731
    return dict(
        forge=far(layer.weight),
        torch_tensor_cores=far(refs["tensor_cores"]),
        torch_cuda_cores=far(refs["cuda_cores"]),
        update=float((truth - w0.double()[keep]).norm()),
        left_out=int(ambiguous.sum()),
        warp_specialized_launches=len(launches),
    )


@pytest.mark.parametrize("case", sorted(RULE_CASES))
def test_every_rule_is_no_farther_from_the_fp64_step_than_torch_fp32(case):
    d = distances(case)
    assert d["warp_specialized_launches"] == STEPS, f"{case}: the warp-specialized kernel did not run: {d}"
    assert 0 < d["torch_tensor_cores"] < d["update"], f"{case}: {d}"
    assert d["left_out"] < N * K // 1000, f"{case}: too many sign-ambiguous gradients to mean much: {d}"
    assert d["forge"] <= 2 * d["torch_tensor_cores"], f"{case}: FORGE is farther from the fp64 step: {d}"
