"""AdamW on bf16 weights and bf16 states from fp32 weight gradients: the FORGE paper's baseline.

Megatron-LM's default for bf16 training without fp32 master weights: the weight-gradient GEMM of
every linear layer writes fp32 into a persistent `main_grad` buffer, and AdamW keeps bf16 moments
(`harness.run.main_grad` builds the gradients). Per parameter: 2 bytes of weight, 4 of gradient, 2 + 2
of states, 10 in all (Llama-3.1-8B: 74.8 GiB; Qwen3-14B: 137.5 GiB before any activation, more than
an H200 holds with them). `fused_adamw` keeps bf16 gradients instead: 8 bytes.

The update. torch's fused AdamW (`torch._fused_adamw_`) needs one dtype for params, grads and
states: CUDA checks it and refuses, and the CPU kernel fails ("expected scalar type BFloat16 but
found Float"), so it cannot step bf16 weights from an fp32 gradient (Megatron calls Apex's or
Transformer Engine's FusedAdam for that). Here each parameter is stepped by FORGE's element-wise
AdamW kernel (`forge.ForgeOptimizer.update_elementwise`, the kernel FORGE runs for its embeddings and
norms), stochastic rounding off: one launch per parameter reads the fp32 gradient and the bf16
weight and moments, applies AdamW in fp32 arithmetic (torch's formula, decoupled weight decay) and
rounds weight and moments to the nearest bf16: 10 bytes read and 6 written per parameter, no
temporary. That is torch's fused AdamW applied to the fp32 gradient: the CPU test compares it with
torch.optim.AdamW stepped on fp32 copies and rounded to bf16. (Upcasting chunks to fp32 for
torch's own fused kernel would be exact too, but moves about 64 bytes a parameter instead of 16:
a baseline four times slower at its update than it needs to be.)

Two methods:
- `fused_adamw_fp32grad`: the gradients of the whole backward in persistent buffers, then one
  update of every parameter after it (the paper's baseline). Under `method.cuda_graph` the
  optimizer is capturable (each step's coefficients in device memory, uploaded by `before_replay`).
- `adamw_in_backward_fp32grad`: the same update applied inside backward, as soon as a parameter's
  fp32 gradient exists; that gradient is freshly allocated and dropped right after, so only one
  parameter's fp32 gradient is alive at a time (4 bytes times the largest parameter).

On a CPU the kernel runs in Triton's interpreter (slow: its times say nothing about speed).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.run.methods.base import AdamWOptions, Method, state_tensors_of
from harness.run.methods.footprint import Footprint, element_bytes, separate


def adamw_bf16(method: Method, params: list[torch.Tensor], capturable: bool) -> Any:
    """FORGE's element-wise AdamW over `params`: bf16 states, round-to-nearest bf16 weights."""
    import forge

    o = method.options
    return forge.ForgeOptimizer(
        params,
        "adamw",
        lr=method.lr,
        betas=tuple(o.betas),
        eps=o.eps,
        weight_decay=o.weight_decay,
        state_dtype="bf16",
        stochastic_rounding=False,
        capturable=capturable,
    )


class FusedAdamWFp32Grad(Method):
    """fp32 gradients in persistent main_grad buffers; AdamW on every parameter after backward."""

    name = "fused_adamw_fp32grad"
    title = "fused AdamW, fp32 gradients"
    summary = (
        "AdamW from fp32 main_grad buffers the wgrad GEMM writes (bf16 weights and states, "
        "10 B/param): the paper's Megatron-style baseline"
    )
    order = 1
    graph_capturable = True
    triton_kernels = True
    refuses_chunked_head = "its main_grad comes from lm_head's own dW GEMM"
    Options = AdamWOptions

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return separate(weights, 4.0, 2 * element_bytes("bf16"), grads_persist=True)

    def setup(self) -> None:
        from harness.run.main_grad import MainGrads

        params = self.params()
        self.grads = MainGrads(self.model, params)  # its hooks before the optimizer's (see there)
        self.opt = adamw_bf16(self, params, capturable=self.cuda_graph)
        self.notes.append(self.grads.note)

    def update(self) -> None:
        for p in self.grads.written():
            self.opt.update_elementwise(p, self.grads.main_grad[p])
        self.grads.end_step()

    def before_replay(self) -> None:
        self.opt.prepare_replay()

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)

    def gradient_bytes(self) -> int:
        return self.grads.gradient_bytes()

    def master_weights(self) -> str:
        return "bf16"  # rounded to nearest


class AdamWInBackwardFp32Grad(FusedAdamWFp32Grad):
    """The same AdamW, applied inside backward as each fp32 gradient appears, then dropped."""

    name = "adamw_in_backward_fp32grad"
    title = "AdamW in backward, fp32 gradients"
    summary = (
        "the same AdamW from fp32 wgrad GEMM gradients, stepped inside backward, one fp32 gradient "
        "alive at a time"
    )
    order = 3
    graph_capturable = False  # as adamw_in_backward

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return Footprint(weights, 0.0, 4.0, 8.0 + 2 * weights + 8.0)

    def setup(self) -> None:
        from harness.run.main_grad import MainGrads

        params = self.params()
        self.grads = MainGrads(self.model, params, persistent=False, on_ready=self._step)
        self.opt = adamw_bf16(self, params, capturable=False)
        self.notes.append(self.grads.note)

    def _step(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        self.opt.update_elementwise(p, grad)

    def update(self) -> None:
        """Nothing after backward: every parameter was stepped inside it."""
