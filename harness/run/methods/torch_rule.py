"""The torch.optim twin of a FORGE rule: `forge.torch_optimizer(rule, params, **hparams)`.

The same optimizer the tests use as FORGE's oracle (`forge/baseline.py`: torch.optim's classes,
and Lion from its paper since torch ships none), stepped after backward with every gradient in
memory. Convergence runs pair it with FORGE on the same rule (Lion, SGD with momentum) so that the
two curves differ only by where the update happens. Registered as `torch_rule`; results written
before it was registered name it by its import path, `harness.methods.torch_rule:TorchRule`
(`harness.points.METHOD_ALIASES` reads them as the same method).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import forge
from harness.run.methods.base import Method, check_choice, state_tensors_of


@dataclass
class TorchRuleOptions:
    rule: str = "adamw"
    hparams: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        element_wise = tuple(name for name, rule in forge.RULES.items() if not rule.whole_matrix)
        if self.rule not in element_wise and self.rule in forge.RULES:  # Muon trains a split of the model
            raise ValueError(f"rule={self.rule!r} trains the hidden matrices of a split: use method=muon")
        check_choice("rule", self.rule, element_wise)


class TorchRule(Method):
    name = "torch_rule"
    title = "torch.optim twin"
    summary = "torch.optim's twin of a FORGE rule (FORGE's test oracle), stepped after backward"
    order = 10
    Options = TorchRuleOptions

    @classmethod
    def torch_reference(cls, options: TorchRuleOptions) -> tuple[str, dict[str, Any]]:
        return cls.name, {"rule": options.rule, "hparams": dict(options.hparams)}

    def setup(self) -> None:
        hparams = {k: tuple(v) if isinstance(v, list) else v for k, v in self.options.hparams.items()}
        self.opt = forge.torch_optimizer(self.options.rule, self.params(), lr=self.lr, **hparams)

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)
