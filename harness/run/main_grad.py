"""fp32 gradients for bf16 weights, written by the weight-gradient GEMM itself: Megatron's `main_grad`.

Megatron-LM and Transformer Engine train bf16 weights from fp32 gradients: every parameter owns a
persistent fp32 buffer, `main_grad`, and the backward of each linear layer runs its weight-gradient
GEMM on the bf16 inputs with fp32 accumulation and an fp32 output, straight into that buffer
(Megatron's `gradient_accumulation_fusion`). A bf16 gradient of a linear weight never exists.
Every other parameter (embeddings, norms, biases, a weight tied to the embedding) gets its gradient
from autograd in bf16, one at a time, and a post-accumulate-grad hook adds it into its `main_grad`
and drops it, as Megatron's gradient hooks do.

    grads = MainGrads(model, params)     # nn.Linear modules swapped to MainGradLinear, hooks set
    loss.backward()                      # grads.main_grad[p]: p's fp32 gradient, for p in grads.written()
    grads.end_step()                     # the next backward writes the buffers anew

The GEMM of a linear layer y = x W^T, for dy (T, N), x (T, K), W (N, K): dW = dy^T x, (N, K).
- On CUDA: `torch.mm(dy^T, x, out_dtype=torch.float32, out=main_grad)` for the weight's first
  gradient of the step, `torch.addmm(main_grad, dy^T, x, out_dtype=torch.float32, out=main_grad)`
  (beta = 1) for a further one: cuBLAS multiplies bf16 with fp32 accumulation and writes fp32 in
  place, with no temporary and no rounding to bf16. We chose these over a bf16 GEMM upcast
  afterwards (which rounds dW to bf16 first, the very thing an fp32-gradient baseline avoids) and
  over `addmm` into a zeroed buffer (Megatron's accumulate-always GEMM: the same product, plus a
  memset of 4 bytes a parameter every step, ~7 ms on Llama-3.1-8B at an H200's bandwidth, which
  writing the first gradient skips: this baseline is, if anything, a little faster than Megatron's).
  A tiny probe checks once, on the device, that torch has these mixed-dtype GEMMs and that they
  agree with the fp32 product.
- On a CPU, where torch implements no mixed-dtype GEMM (`mm.dtype` is CUDA-only), and on a CUDA
  build whose probe fails: the fp32 GEMM of upcast copies of dy and x. A bf16 x bf16 product is
  exact in fp32, so the result is the same fp32 GEMM of the bf16 inputs up to summation order, at
  the cost of fp32 copies of dy and x; the point's notes say which GEMM ran.

With `persistent=False` (AdamW in backward) no buffer persists: each fp32 gradient is allocated
when its GEMM (or its hook) runs, handed to `on_ready` and dropped, so one parameter's fp32
gradient exists at a time. Only nn.Linear modules whose weight appears once in the model are
swapped (a tied lm_head takes the hook path, like the embedding it shares its weight with), and a
swapped module must be called once per forward in that mode (each call hands over a gradient).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], None]

CUDA_NOTE = (
    "wgrad GEMM: torch.mm/addmm(dy^T, x, out_dtype=float32, out=main_grad): bf16 inputs, fp32 "
    "accumulate and output, in place"
)
UPCAST_NOTE = (
    "wgrad GEMM: fp32 matmul of upcast dy and x (exact bf16 products, fp32 sums), because {why}; "
    "it costs fp32 copies of dy and x"
)


def _gemm_mixed(out: torch.Tensor, dy_t: torch.Tensor, x: torch.Tensor, accumulate: bool) -> None:
    """out (fp32) = dy_t @ x, or += with `accumulate`: bf16 x bf16 -> fp32 in cuBLAS."""
    if accumulate:
        torch.addmm(out, dy_t, x, out_dtype=torch.float32, out=out)
    else:
        torch.mm(dy_t, x, out_dtype=torch.float32, out=out)


def _gemm_upcast(out: torch.Tensor, dy_t: torch.Tensor, x: torch.Tensor, accumulate: bool) -> None:
    """The same product from fp32 copies of the inputs (where no mixed-dtype GEMM exists)."""
    if accumulate:
        out.addmm_(dy_t.float(), x.float())
    else:
        torch.mm(dy_t.float(), x.float(), out=out)


def choose_gemm(device: torch.device) -> tuple[Gemm, str]:
    """The wgrad GEMM for `device` and the note that names it (a tiny probe on CUDA)."""
    if device.type != "cuda":
        return _gemm_upcast, UPCAST_NOTE.format(why=f"torch has no mixed-dtype GEMM on {device.type}")
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        dy = torch.randn(32, 24, device=device, generator=gen).to(torch.bfloat16)
        x = torch.randn(32, 40, device=device, generator=gen).to(torch.bfloat16)
        out = torch.empty(24, 40, device=device)
        _gemm_mixed(out, dy.t(), x, False)
        _gemm_mixed(out, dy.t(), x, True)
        expected = 2 * (dy.t().float() @ x.float())
        if not torch.allclose(out, expected, rtol=1e-5, atol=1e-5):
            raise RuntimeError("the mixed-dtype GEMM disagrees with the fp32 product")
    except torch.OutOfMemoryError:
        raise  # a point out of memory is a result (`oom`), never a reason to change the GEMM
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return _gemm_upcast, UPCAST_NOTE.format(why=f"the mixed-dtype GEMM failed its probe ({e})")
    return _gemm_mixed, CUDA_NOTE


class MainGradLinearFunction(torch.autograd.Function):
    """y = x W^T + b whose backward writes dW in fp32 into the weight's `main_grad` (returns None)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias, grads: MainGrads):
        ctx.save_for_backward(x)
        ctx.weight, ctx.grads, ctx.has_bias = weight, grads, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (x,) = ctx.saved_tensors
        dx = dy @ ctx.weight if ctx.needs_input_grad[0] else None  # the weight before any update
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        ctx.grads.linear_grad(ctx.weight, dy2, x2)
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None  # to the hook, as usual
        return dx, None, db, None


class MainGradLinear(nn.Linear):
    """An nn.Linear (swapped in by class) whose weight gradient goes to `MainGrads` in fp32."""

    _main_grads: MainGrads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return MainGradLinearFunction.apply(x, self.weight, self.bias, self._main_grads)


class MainGrads:
    """fp32 gradients of `params`: persistent `main_grad` buffers (or, with `persistent=False`, one
    fresh gradient at a time handed to `on_ready(param, grad)`)."""

    def __init__(
        self,
        model: nn.Module,
        params: Iterable[torch.Tensor],
        *,
        persistent: bool = True,
        on_ready: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ) -> None:
        self.params = list(params)
        if not persistent and on_ready is None:
            raise ValueError("MainGrads(persistent=False) needs on_ready, which consumes each gradient")
        self.persistent, self.on_ready = persistent, on_ready
        device = self.params[0].device if self.params else torch.device("cpu")
        self.gemm, self.note = choose_gemm(device)
        self.main_grad: dict[torch.Tensor, torch.Tensor] = {}
        if persistent:
            self.main_grad = {p: torch.zeros_like(p, dtype=torch.float32) for p in self.params}
        self._written: set[int] = set()
        self.linear_weights = _swap_linears(model, self.params, self)
        fused = {id(w) for w in self.linear_weights}
        # Kept on self: a collected handle removes its hook. Registered before any optimizer's hooks,
        # so an optimizer hooked on p.grad (forge.ForgeOptimizer) finds it taken (None) and skips it.
        self.hooks = [
            p.register_post_accumulate_grad_hook(self._hook) for p in self.params if id(p) not in fused
        ]

    def linear_grad(self, weight: torch.Tensor, dy2: torch.Tensor, x2: torch.Tensor) -> None:
        """A swapped layer's backward: dW = dy2^T x2 in fp32, into main_grad or to on_ready."""
        if self.persistent:
            self.gemm(self.main_grad[weight], dy2.t(), x2, id(weight) in self._written)
            self._written.add(id(weight))
            return
        grad = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
        self.gemm(grad, dy2.t(), x2, False)
        self.on_ready(weight, grad)

    def _hook(self, p: torch.Tensor) -> None:
        """Any other parameter: its bf16 gradient from autograd, added into main_grad and dropped."""
        grad, p.grad = p.grad, None
        if grad is None:
            return
        if not self.persistent:
            self.on_ready(p, grad.float())
            return
        buffer = self.main_grad[p]
        if id(p) in self._written:
            buffer.add_(grad)
        else:
            buffer.copy_(grad)
        self._written.add(id(p))

    def written(self) -> list[torch.Tensor]:
        """The parameters whose main_grad this step's backward wrote (the others hold stale values)."""
        return [p for p in self.params if id(p) in self._written]

    def end_step(self) -> None:
        """After the update: the next backward overwrites each buffer instead of adding to it."""
        self._written.clear()

    def gradient_bytes(self) -> int:
        """fp32 gradient bytes alive at once: every buffer, or the largest single gradient."""
        sizes = [p.numel() * 4 for p in self.params]
        return sum(sizes) if self.persistent else max(sizes, default=0)


def _swap_linears(model: nn.Module, params: list[torch.Tensor], grads: MainGrads) -> list[torch.Tensor]:
    """Swap every plain nn.Linear whose weight is trained and appears once to MainGradLinear."""
    trained = {id(p) for p in params}
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    swapped = []
    for module in model.modules():
        w = getattr(module, "weight", None)
        if type(module) is not nn.Linear or w is None or id(w) not in trained or uses[id(w)] != 1:
            continue
        module.__class__ = MainGradLinear
        module._main_grads = grads
        swapped.append(w)
    return swapped
