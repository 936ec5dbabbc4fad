"""torch.optim.AdamW with fused=True: the usual way to train, and the baseline of every ratio.

All gradients exist at once between backward and `step()`, so its peak holds weights, gradients
and both moments together. On a machine without CUDA the fused kernel is not what we compare, so
the point runs the plain (for-each) AdamW and says so in its notes. Under `method.cuda_graph` it is
built `capturable=True` (step counts on the device), and `step()` and `zero_grad()` are captured
with the forward and backward (harness.run.graphs).

`max_grad_norm` (None: off): `torch.nn.utils.clip_grad_norm_` over every parameter before each
step, as training recipes do; it reads the gradients once more and syncs nothing with the host, so
it is captured in the graph too. FORGE's `max_grad_norm` is compared against this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.run.methods.base import AdamWOptions, StepOptimizerMethod, check_max_grad_norm
from harness.run.tensor_parallel import layout_groups


@dataclass
class FusedAdamWOptions(AdamWOptions):
    max_grad_norm: float | None = None  # clip_grad_norm_ before each step; None: no clipping

    def __post_init__(self) -> None:
        check_max_grad_norm(self.max_grad_norm)


class FusedAdamW(StepOptimizerMethod):
    name = "fused_adamw"
    tensor_parallel = True
    graph_capturable = True
    Options = FusedAdamWOptions

    def setup(self) -> None:
        fused = self.device == "cuda"
        if not fused:
            self.notes.append("no CUDA: plain torch.optim.AdamW (foreach) instead of fused=True")
        o = self.options
        self.opt = torch.optim.AdamW(
            layout_groups(self.params()),
            lr=self.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=fused,
            foreach=None if fused else True,  # the multi-tensor path on a CPU too, as the note says
            capturable=self.cuda_graph,
        )

    def update(self) -> None:
        if self.options.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params(), self.options.max_grad_norm, foreach=True)
        super().update()
