"""How exact is each FORGE? The paper's code and ours, against the fp64 step and torch.optim's own.

torch.optim in fp32 is itself some distance from the exact step: its GEMM rounds the gradient and
the rule's arithmetic rounds again. A fused update that accumulates dW in fp32 registers in
another order and applies the same rule in fp32 should sit about as far from the truth. Measured
here, on one layer of Llama-3.1-8B's q_proj size (4096 x 4096, 1,024 tokens), after `STEPS` AdamW
steps on fresh random data, each side's distance ||w - w64|| to the weights of AdamW run in fp64
on the fp64 gradient (torch.optim's own class), for three settings:

    bf16_operands   fp32 weights and states, x and dy in bf16 (as under autocast): the project's
                    GPU exactness check (tests/forge/test_gpu_exactness.py) with the paper's kernel
                    beside ours. torch's gradient is the tensor-core GEMM of the same bf16 values
                    (exact products, fp32 sums), and, as a second yardstick, cuBLAS's CUDA-core SGEMM.
                    Ours: `ForgeOptimizer.update_linear`; the paper's: its kernel's launcher,
                    `fused_grad_optimizer.kernel.fused_grad_adamw` (what its backward calls).
    fp32            fp32 everywhere, each FORGE through its module as a user trains it: ours
                    `forge.attach(linear, "adamw", state_dtype="fp32")`, the paper's
                    `FusedLinear.from_linear(linear)` (its states take the weight's dtype) with
                    `FusedOptimizerManager.pre_step`; torch's gradient is cuBLAS's fp32 SGEMM.
    bf16            bf16 weights and states, bf16 operands, through the modules as above: ours with
                    stochastic rounding (as shipped) and without, the paper's, and torch's AdamW on
                    bf16 weights (its default, for-each) on the bf16 GEMM's gradient; also the
                    distance between the paper's weights and ours.

Where a gradient is within the GEMM's rounding of zero at some step (below 1e-4 of the gradient's
RMS), an Adam-like rule steps by about lr * sign(g) with either sign, which measures the data, not
the kernel: those weights (a few thousand of 16.8 million) are left out of every distance, as in
the project's check. AdamW's hyperparameters are that check's (lr 1e-2, weight decay 0.1).

    python -m harness.kernels.reference_exactness     # on a CUDA GPU, with fused_grad_optimizer
                                                      # installed; JSON to $OUT (or results/out)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import forge

T, N, K = 1024, 4096, 4096
STEPS = 6
HPARAMS = dict(lr=1e-2, weight_decay=0.1)  # the project's GPU exactness check's AdamW case
BETAS, EPS = (0.9, 0.999), 1e-8
NEAR_ZERO = 1e-4  # of the gradient's RMS
DEVICE = "cuda"  # the tests set "cpu" (with small shapes) to check the procedure on our side alone

Stepper = Callable[[torch.Tensor, torch.Tensor], None]  # one step from (x, dy)


def _tensor_core_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b on tensor cores, fp32 accumulation; exact products where a and b hold bf16 values."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _torch_side(w0: torch.Tensor, dtype: torch.dtype, grad: Callable) -> tuple[nn.Parameter, Stepper]:
    """torch.optim.AdamW (its default implementation) on a copy of w0 in `dtype`, stepped on
    grad(x, dy)."""
    p = nn.Parameter(w0.to(dtype, copy=True))  # never w0 itself: the distances are measured from it
    opt = torch.optim.AdamW([p], betas=BETAS, eps=EPS, **HPARAMS)

    def step(x, dy):
        p.grad = grad(x, dy).to(dtype)
        opt.step()

    return p, step


def _ours_kernel(w0: torch.Tensor) -> tuple[torch.Tensor, Stepper]:
    layer = nn.Linear(K, N, bias=False, device=w0.device)
    with torch.no_grad():
        layer.weight.copy_(w0)
    opt = forge.attach(
        layer, "adamw", state_dtype="fp32", stochastic_rounding=False, betas=BETAS, eps=EPS, **HPARAMS
    )
    return layer.weight, lambda x, dy: opt.update_linear(layer.weight, dy, x)


def _paper_kernel(w0: torch.Tensor) -> tuple[torch.Tensor, Stepper]:
    from fused_grad_optimizer.kernel import fused_grad_adamw

    w, m, v = w0.clone(), torch.zeros_like(w0), torch.zeros_like(w0)
    count = [0]

    def step(x, dy):
        count[0] += 1
        fused_grad_adamw(
            dy.contiguous(), x.contiguous(), w, m, v,
            lr=HPARAMS["lr"], beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
            weight_decay=HPARAMS["weight_decay"], step=count[0],
        )  # fmt: skip

    return w, step


def _ours_module(w0: torch.Tensor, stochastic_rounding: bool = False) -> tuple[torch.Tensor, Stepper]:
    layer = nn.Linear(K, N, bias=False, device=w0.device, dtype=w0.dtype)
    with torch.no_grad():
        layer.weight.copy_(w0)
    states = "fp32" if w0.dtype == torch.float32 else "bf16"
    forge.attach(
        layer,
        "adamw",
        state_dtype=states,
        stochastic_rounding=stochastic_rounding,
        betas=BETAS,
        eps=EPS,
        **HPARAMS,
    )
    return layer.weight, lambda x, dy: layer(x).backward(dy)


def _paper_module(w0: torch.Tensor) -> tuple[torch.Tensor, Stepper]:
    from fused_grad_optimizer import FusedLinear, FusedOptimizerManager

    linear = nn.Linear(K, N, bias=False, device=w0.device, dtype=w0.dtype)
    with torch.no_grad():
        linear.weight.copy_(w0)
    with torch.device(w0.device):
        layer = FusedLinear.from_linear(
            linear, optimizer_type="adamw", state_mode="bf16"
        )  # states: w's dtype
    manager = FusedOptimizerManager(layer)

    def step(x, dy):
        manager.pre_step(
            lr=HPARAMS["lr"], beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=HPARAMS["weight_decay"]
        )
        layer(x).backward(dy)

    return layer.weight, step


def _run(sides: dict[str, tuple[torch.Tensor, Stepper]], operands: torch.dtype, w0: torch.Tensor) -> dict:
    """Step every side and the fp64 truth on the same data; each side's distance to the truth."""
    ref64, step64 = _torch_side(w0, torch.float64, lambda x, dy: dy.double().t() @ x.double())
    ambiguous = torch.zeros(N, K, dtype=torch.bool, device=w0.device)
    for _ in range(STEPS):
        x = torch.randn(T, K, device=w0.device).to(operands)
        dy = (torch.randn(T, N, device=w0.device) / math.sqrt(T)).to(operands)
        g64 = dy.double().t() @ x.double()
        ambiguous |= g64.abs() < NEAR_ZERO * g64.pow(2).mean().sqrt()
        for _, step in sides.values():
            step(x, dy)
        step64(x, dy)
    keep = ~ambiguous
    truth = ref64.detach()[keep]
    out = {name: float((w.detach().double()[keep] - truth).norm()) for name, (w, _) in sides.items()}
    out["update"] = float((truth - w0.double()[keep]).norm())
    out["left_out"] = int(ambiguous.sum())
    return out


def bf16_operands() -> dict:
    w0 = torch.randn(N, K, device=DEVICE) * 0.02
    bf = lambda x, dy: _tensor_core_mm(dy.float().t(), x.float())  # noqa: E731
    sides = {
        "ours": _ours_kernel(w0),
        "paper": _paper_kernel(w0),
        "torch_tensor_cores": _torch_side(w0, torch.float32, bf),
        "torch_cuda_cores": _torch_side(w0, torch.float32, lambda x, dy: dy.float().t() @ x.float()),
    }
    return _run(sides, torch.bfloat16, w0)


def fp32() -> dict:
    w0 = torch.randn(N, K, device=DEVICE) * 0.02
    sides = {
        "ours": _ours_module(w0),
        "paper": _paper_module(w0),
        "torch": _torch_side(w0, torch.float32, lambda x, dy: dy.t() @ x),
    }
    return _run(sides, torch.float32, w0)


def bf16() -> dict:
    w0 = (torch.randn(N, K, device=DEVICE) * 0.02).bfloat16()
    sides = {
        "ours": _ours_module(w0, stochastic_rounding=True),
        "ours_nearest": _ours_module(w0, stochastic_rounding=False),
        "paper": _paper_module(w0),
        "torch": _torch_side(w0, torch.bfloat16, lambda x, dy: dy.t() @ x),
    }
    out = _run(sides, torch.bfloat16, w0)
    out["paper_to_ours"] = float((sides["paper"][0].double() - sides["ours"][0].double()).norm())
    out["paper_to_ours_nearest"] = float(
        (sides["paper"][0].double() - sides["ours_nearest"][0].double()).norm()
    )
    return out


CASES = {"bf16_operands": bf16_operands, "fp32": fp32, "bf16": bf16}


def refusal() -> str | None:
    """Why this cannot run here, or None."""
    from harness.run.methods import forge_reference

    if not torch.cuda.is_available():
        return "reference_exactness needs a CUDA GPU (the paper's kernels autotune and run there only)"
    if not forge_reference.installed():
        return forge_reference.INSTALL
    return None


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; choose from: {', '.join(CASES)}", file=sys.stderr)
        return 2
    why = refusal()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    from harness import sources
    from harness.run import env

    record = {
        "kind": "reference_exactness",
        "shape": {"T": T, "N": N, "K": K},
        "steps": STEPS,
        "hparams": {**HPARAMS, "betas": list(BETAS), "eps": EPS},
        "env": env.collect(),
        "cases": {},
    }
    for name in argv or list(CASES):
        torch.manual_seed(0)
        start = time.perf_counter()
        record["cases"][name] = CASES[name]()
        print(name, json.dumps(record["cases"][name]), f"({time.perf_counter() - start:.1f} s)", flush=True)
    out_dir = Path(os.environ.get("OUT", sources.OUT))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"reference-exactness-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
