"""LOMO and AdaLomo (the `lomo-optim` package): SGD or factored Adam fused into backward hooks.

Called the way its README says: `opt = Lomo(model, lr=...)`, then per step
`opt.grad_norm(loss)` (only when clipping, which costs a second backward) and
`opt.fused_backward(loss, lr)`. Its hooks update and free each gradient as backward produces it,
so about one parameter's gradient is alive at a time. AdaLomo keeps factored second moments in
fp32 and allocates them with `.cuda()`, so it needs CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.run.methods.base import Method, check_choice, largest_param_bytes
from harness.run.methods.footprint import Footprint


@dataclass
class LomoOptions:
    variant: str = "lomo"  # lomo | adalomo
    clip_grad_norm: float | None = None
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, ("lomo", "adalomo"))


class LomoMethod(Method):
    name = "lomo"
    title = "LOMO"
    summary = "lomo-optim's Lomo (SGD) or AdaLomo, the update fused into backward hooks"
    order = 7
    Options = LomoOptions
    requires = ("lomo-optim",)

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return Footprint(weights, 0.0, 0.0, 4.0 + 2 * weights)

    @classmethod
    def unavailable_reason(cls, device: str, options: Any = None) -> str | None:
        if options is not None and options.variant == "adalomo" and device != "cuda":
            return "AdaLomo allocates its states with .cuda(): it needs CUDA"
        return super().unavailable_reason(device, options)

    def setup(self) -> None:
        from lomo_optim import AdaLomo, Lomo

        cls = Lomo if self.options.variant == "lomo" else AdaLomo
        self.opt = cls(
            self.model,
            lr=self.lr,
            clip_grad_norm=self.options.clip_grad_norm,
            weight_decay=self.options.weight_decay,
        )

    def eager_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        loss = self.loss(input_ids)
        if self.options.clip_grad_norm:
            self.opt.grad_norm(loss)
        self.opt.fused_backward(loss, self.lr)
        return loss.detach()

    def optimizer_state_tensors(self):
        for name in ("exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col"):
            yield from getattr(self.opt, name, {}).values()

    def gradient_bytes(self) -> int:
        return largest_param_bytes(self.params())
