"""AdamW applied inside backward, one parameter at a time, with torch's post-accumulate-grad hooks.

The pattern of PyTorch's tutorial "How to save memory by fusing the optimizer step into the
backward pass": one torch.optim.AdamW per parameter, stepped and zeroed from
`Tensor.register_post_accumulate_grad_hook`, so only one parameter's gradient is alive at a time.
FORGE goes further: for linear weights, not even that one gradient is written to memory.

The tutorial builds each optimizer with `foreach=False` (about ten kernels per parameter and
step); `fused: true` (the default on CUDA) gives each parameter torch's one-kernel fused AdamW
instead, the fastest way to run this pattern and so the fair rival. The option is recorded with
the point, so the two variants never mix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.run.methods.base import AdamWOptions, Method, largest_param_bytes, state_tensors_of
from harness.run.methods.footprint import Footprint, weight_state_bytes


@dataclass
class InBackwardOptions(AdamWOptions):
    fused: bool = True  # per-parameter fused AdamW on CUDA; False: the tutorial's foreach=False


class AdamWInBackward(Method):
    name = "adamw_in_backward"
    title = "AdamW in backward"
    summary = "torch's post-accumulate-grad hook pattern, one AdamW per parameter"
    order = 2
    tensor_parallel = True
    Options = InBackwardOptions

    @classmethod
    def ran_as(cls, options, device: str) -> str | None:
        """Without CUDA each parameter's AdamW is the tutorial's foreach=False (its notes say so)."""
        return None if device == "cuda" else "AdamW per parameter in backward (foreach=False; no CUDA)"

    @classmethod
    def torch_reference(cls, options):
        return options.as_torch_rule()

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        state = weight_state_bytes(options, weights)
        return Footprint(weights, 0.0, 2 * state, 4.0 + 2 * weights + 4 * state)

    def setup(self) -> None:
        o = self.options
        fused = o.fused and self.device == "cuda"
        if o.fused and not fused:
            self.notes.append("no CUDA: per-parameter AdamW with foreach=False instead of fused=True")
        kind = {"fused": True} if fused else {"foreach": False}
        self.opts = {
            p: torch.optim.AdamW(
                [p], lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, **kind
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
