"""Exact global gradient-norm clipping, with no weight gradient ever stored.

`torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)` multiplies every gradient by
c = min(1, max_norm / (total_norm + 1e-6)), total_norm being the norm of all gradients together.
c depends on every gradient, so no parameter may be updated before the whole backward has run,
while in FORGE a weight gradient exists only inside the kernel that consumes it. With
`forge.attach(model, rule, max_grad_norm=1.0)` the step is therefore split in two:

1. During backward, each fused linear layer computes dx as usual, then only the norm of its dW
   (below), and keeps dy and x; every other parameter adds the norm of its materialized gradient
   and keeps that gradient.
2. When the backward ends (a callback queued on the autograd engine), total_norm and c are
   computed on the device, and each kept layer runs the ordinary fused GEMM-and-update kernel,
   which multiplies its fp32 gradient tile by c before the rule, as clip_grad_norm_ multiplies an
   fp32 gradient. The other parameters run the element-wise kernel likewise.
Nothing is read back to the host in between, so a clipped step can be captured in a CUDA graph.

The norm of dW = dy^T x for dy (T, N), x (T, K), without dW, one of two ways, the cheaper for
each layer (`norm_method`):
* Gram: ||dy^T x||^2 = sum((dy dy^T) * (x x^T)), two (T, T) GEMMs: T^2 (N + K) multiply-adds
  against the T N K of dW, and the x x^T of an input that feeds several layers in a row (v, k and
  q; up and gate) computed once. Its sum is rounded differently from dW's: measured on bf16
  operands, 1e-5 to 7e-5 of the norm (3e-4 for a 128k-row lm_head at T = 4096), far inside what
  moves a clip coefficient.
* direct: the fused kernel's main loop with a reducing epilogue (`forge.kernels.wgrad_norm`):
  T N K multiply-adds, for large T and for every norm type other than 2; 1e-6 of the norm.
The total is then formed as torch forms it: the norm of the per-parameter norms.

Memory: the kept dy's, and the x's, which the backward would otherwise free layer by layer, live
until the backward ends; they are the operands of the layer GEMMs (about 2 bytes x T x the sum of
all in- and out-features), far less than the gradients they stand for at ordinary T.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from forge.guards import at_backward_end, backward_task

if TYPE_CHECKING:
    from forge.functional import Launcher

# The norm-only kernel's time per multiply-add against the Gram GEMMs' (cuBLAS): measured on the
# H200 on Llama-3.1-8B's layers at T = 1024 and 4096 (results/kernels/clip-norms-*.jsonl), the
# kernel runs at 1.2-1.4x the dW GEMM's time, the Gram GEMMs near cuBLAS's rate.
DIRECT_COST = 1.5


def norm_method(T: int, N: int, K: int, x_gram_known: bool, norm_type: float = 2.0) -> str:
    """ "gram" or "direct" for the norm of dy^T x, dy (T, N), x (T, K): the cheaper one."""
    if norm_type != 2.0:
        return "direct"
    gram_cost = T * T * (N + (0 if x_gram_known else K))
    return "gram" if gram_cost < DIRECT_COST * T * N * K else "direct"


def check_clip_options(max_grad_norm, norm_type) -> tuple[float, float]:
    """(max_norm, p) as floats, or a ValueError saying what is allowed."""
    try:
        max_norm = float(max_grad_norm)
    except (TypeError, ValueError):
        max_norm = math.nan
    if not (max_norm > 0 and math.isfinite(max_norm)):
        raise ValueError(
            f"max_grad_norm={max_grad_norm!r}: give a positive finite number (the largest total gradient "
            "norm allowed), or None for no clipping"
        )
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        p = math.nan
    if not p > 0:  # NaN too
        raise ValueError(f"norm_type={norm_type!r}: give a positive number or float('inf') (2.0 by default)")
    return max_norm, p


class GlobalNormClip:
    """The deferred half of a clipped FORGE step: norms gathered in backward, updates at its end,
    launched by `launcher` (None for a clip that only takes norms: a benchmark of `linear_power_sum`)."""

    def __init__(self, launcher: Launcher | None, max_norm: float, norm_type: float):
        self.launcher = launcher
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.method = "auto"  # how a layer's dW norm is computed: "auto" (`norm_method`), "gram" or "direct"
        self.total_norm: torch.Tensor | None = None  # the last step's norm before clipping (0-dim)
        self.coefficient: torch.Tensor | None = None  # the last step's c, (1,) fp32 on the device
        self._task = None  # the backward (autograd graph task) the pending work belongs to
        self._pending: list[tuple] = []  # (param, dy or grad, x or None, kernel config)
        self._sums: list[torch.Tensor] = []  # per fused layer: sum |dW|^p (max |dW| for inf), 0-dim fp32
        self._norms: list[torch.Tensor] = []  # per other parameter: its gradient's norm, 0-dim fp32
        self._gram_x: tuple | None = None  # (key of x, x x^T) of the last layer input seen

    # ------------------------------------------------------------------ during backward

    def add_linear(self, weight: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, config) -> None:
        """A fused layer's backward: the norm of dy^T x now, its update at the end of backward."""
        self._begin()
        self._sums.append(self.linear_power_sum(dy, x))
        self._pending.append((weight, dy, x, config))
        self._finish_direct_call()

    def add_elementwise(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Any other parameter's hook: its gradient's norm now, kept for its update at the end."""
        self._begin()
        self._norms.append(torch.linalg.vector_norm(grad, self.norm_type, dtype=torch.float32))
        self._pending.append((p, grad, None, None))
        self._finish_direct_call()

    def _begin(self) -> None:
        """Before the first deferred update of a backward: what a failed backward left is dropped
        (it updated nothing), and the end-of-backward step is queued (run at once outside one)."""
        task = backward_task()
        if task != self._task or task == -1:
            self._pending.clear()
            self._sums.clear()
            self._norms.clear()
            self._gram_x = None
            self._task = task
            if task != -1:
                at_backward_end(self.finish)

    def _finish_direct_call(self) -> None:
        """Outside any backward (a benchmark, a test calling the optimizer directly) one update is
        the whole step: clipped by its own norm, at once."""
        if self._task == -1:
            self.finish()

    # ------------------------------------------------------------------ the norm of dW = dy^T x

    def forget_input(self) -> None:
        """Drop the x x^T kept for the next layer that reads the same input."""
        self._gram_x = None

    def linear_power_sum(self, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """sum |dy^T x|^p (max |dy^T x| for p = inf), 0-dim fp32."""
        from forge.functional import wgrad_norm_power_sum

        T, N = dy.shape
        K = x.shape[1]
        key = (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype)
        cached = self._gram_x is not None and self._gram_x[0] == key
        method = norm_method(T, N, K, cached, self.norm_type) if self.method == "auto" else self.method
        if method == "direct" or self.norm_type != 2.0:
            return wgrad_norm_power_sum(dy, x, self.norm_type)
        if not cached:
            self._gram_x = (key, gram(x))
        return torch.dot(gram(dy).view(-1), self._gram_x[1].view(-1))

    def _roots(self, power_sums: torch.Tensor) -> torch.Tensor:
        """The layers' norms from their power sums, all at once (the inf norm's max is the norm
        already; a Gram sum rounded below zero, a norm of ~0, is 0)."""
        p = self.norm_type
        if p == math.inf or p == 1.0:
            return power_sums
        power_sums = power_sums.clamp_min(0.0)
        return power_sums.sqrt() if p == 2.0 else power_sums.pow(1.0 / p)

    # ------------------------------------------------------------------ at the end of backward

    def finish(self) -> None:
        """total_norm and c on the device, then every deferred update, scaled by c."""
        pending, sums, norms = self._pending, self._sums, self._norms
        self._pending, self._sums, self._norms, self._gram_x, self._task = [], [], [], None, None
        if not pending:
            return
        parts = ([self._roots(torch.stack(sums))] if sums else []) + ([torch.stack(norms)] if norms else [])
        total = torch.linalg.vector_norm(torch.cat(parts), self.norm_type)
        coefficient = torch.clamp(self.max_norm / (total + 1e-6), max=1.0).reshape(1)
        if self.total_norm is None or self.total_norm.device != total.device:
            self.total_norm = torch.empty_like(total)
            self.coefficient = torch.empty_like(coefficient)
        self.total_norm.copy_(total)  # persistent buffers: a CUDA graph's replays refresh them
        self.coefficient.copy_(coefficient)
        for param, a, b, config in pending:
            if b is None:
                self.launcher.elementwise(param, a, grad_scale=self.coefficient)
            else:
                self.launcher.fused(param, a, b, config, grad_scale=self.coefficient)


def gram(a: torch.Tensor) -> torch.Tensor:
    """a a^T in fp32: (T, T) from (T, F); bf16 operands on the tensor cores with fp32 output."""
    if a.dtype == torch.float32:
        return a @ a.T
    if a.is_cuda:
        return torch.mm(a, a.T, out_dtype=torch.float32)
    a = a.float()  # the CPU has no bf16 x bf16 -> fp32 GEMM: the products of bf16 values are exact in fp32
    return a @ a.T
