"""Each parameter's param group, rule and state: what an optimizer's parts look up by parameter.

`forge.steps.Steps` (the step counts), `forge.functional.Launcher` (the launches) and
`forge.guards.BackwardCheck` (the checks before a backward's first update) each need to know, for a
parameter, which param group it is in, which rule that group runs and where its state lives, and,
for the checks, every group as it is now. `ParamTable` is that one lookup, handed to each of them
by the optimizer that owns the groups and the state:

    table.add(p, group)       p joins `group` (the optimizer's `add_param_group`)
    table.group_of(p)         its param group
    table.rule_of(p)          its group's rule (`forge.rules.rule_of_group`: the group's own, else
                              the optimizer's), fixed when p joins the group: its states are that
                              rule's
    table.state_of(p)         its state dict, the optimizer's `state[p]`
    table.param_groups        every group, as the optimizer holds them now

The optimizer's `state` and `param_groups` are read through it each time, never copied: a loaded
state dict or an added group is what the next update sees.
"""

from __future__ import annotations

import torch

from forge.rules import Rule, rule_of_group


class ParamTable:
    """The lookups by parameter of `optimizer` (see the module), whose rule is `rule` by default."""

    def __init__(self, optimizer: torch.optim.Optimizer, rule: Rule):
        self.optimizer = optimizer
        self.rule = rule
        self.groups: dict[torch.Tensor, dict] = {}
        self.rules: dict[torch.Tensor, Rule] = {}  # p's group's rule, as it was when p joined it

    def add(self, p: torch.Tensor, group: dict) -> None:
        self.groups[p] = group
        self.rules[p] = rule_of_group(group, self.rule)

    def group_of(self, p: torch.Tensor) -> dict:
        return self.groups[p]

    def rule_of(self, p: torch.Tensor) -> Rule:
        return self.rules[p]

    def rule_of_group(self, group: dict) -> Rule:
        return rule_of_group(group, self.rule)

    def state_of(self, p: torch.Tensor) -> dict:
        return self.optimizer.state[p]

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups
