"""The torch.optim optimizer that each FORGE rule must match, in one place.

Tests use these as the oracle and the harness as its "torch" baselines, so the two cannot drift
apart. Each rule names its class (`forge.rules.Rule.torch_class`): torch.optim's own, except Lion,
which torch does not ship: `Lion` below follows the paper (Chen et al. 2023, "Symbolic Discovery of
Optimization Algorithms").
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class Lion(torch.optim.Optimizer):
    """Lion: u = sign(beta1 m + (1 - beta1) g); w <- w (1 - lr wd) - lr u; m <- beta2 m + (1 - beta2) g."""

    def __init__(self, params: Iterable, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        from forge.rules import check_hparams

        check_hparams("lion", dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))  # FORGE's checks
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                update = torch.sign(m * beta1 + p.grad * (1 - beta1))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


def torch_optimizer(rule: str, params: Iterable, **hparams) -> torch.optim.Optimizer:
    """The reference optimizer for `rule` with torch.optim's defaults overridden by `hparams`."""
    from forge.rules import IGNORED_OPTIONS, UNSUPPORTED_OPTIONS, get_rule

    optimizer_class = get_rule(rule).torch_class()  # a clear error for unknown names
    if optimizer_class.__module__ == __name__:  # Lion, defined here, takes none of torch.optim's flags:
        # the no-ops are dropped, and so are the unsupported ones where off
        dropped = lambda k, v: k in IGNORED_OPTIONS or (k in UNSUPPORTED_OPTIONS and not v)  # noqa: E731
        hparams = {k: v for k, v in hparams.items() if not dropped(k, v)}
    return optimizer_class(params, **hparams)
