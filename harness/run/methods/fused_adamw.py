"""torch.optim.AdamW with fused=True: the usual way to train, and the baseline of every ratio.

All gradients exist at once between backward and `step()`, so its peak holds weights, gradients
and both moments together. On a machine without CUDA the fused kernel is not what we compare, so
the point runs the plain (for-each) AdamW and says so in its notes. Under `method.cuda_graph` it is
built `capturable=True` (step counts on the device), and `step()` and `zero_grad()` are captured
with the forward and backward (harness.run.graphs).
"""

from __future__ import annotations

import torch

from harness.run.methods.base import AdamWOptions, StepOptimizerMethod
from harness.run.tensor_parallel import layout_groups


class FusedAdamW(StepOptimizerMethod):
    name = "fused_adamw"
    tensor_parallel = True
    graph_capturable = True
    Options = AdamWOptions

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
