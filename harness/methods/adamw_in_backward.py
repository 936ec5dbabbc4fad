"""AdamW applied inside backward, one parameter at a time, with torch's post-accumulate-grad hooks.

The pattern of PyTorch's tutorial "How to save memory by fusing the optimizer step into the
backward pass": one torch.optim.AdamW per parameter, stepped and zeroed from
`Tensor.register_post_accumulate_grad_hook`, so only one parameter's gradient is alive at a time.
FORGE goes further: for linear weights, not even that one gradient is written to memory.
"""

from __future__ import annotations

import torch

from harness.methods.base import AdamWOptions, Method, largest_param_bytes, state_tensors_of


class AdamWInBackward(Method):
    name = "adamw_in_backward"
    tensor_parallel = True
    Options = AdamWOptions

    def setup(self) -> None:
        o = self.options
        self.opts = {
            p: torch.optim.AdamW(
                [p], lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, foreach=False
            )
            for p in self.params()
        }
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in self.opts]

    def _hook(self, p: torch.Tensor) -> None:
        self.opts[p].step()
        self.opts[p].zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        return (t for opt in self.opts.values() for t in state_tensors_of(opt))

    def gradient_bytes(self) -> int:
        return largest_param_bytes(self.params())
