"""Loading a FORGE optimizer's state dict: checked whole before anything changes, states kept in
their own storage dtype, or converted from torch.optim's.

`ForgeOptimizer.state_dict()` is torch.optim's (parameters by their index in `param_groups`) with
two entries more: "forge", the options its states only make sense under (rule, state dtype, int8
group, weight format: `ForgeOptimizer.storage_options`), and, under data-parallel replicas,
"bucket_order" (`forge.updates.Updates.bucket_order`). Loading it goes in this order:

1. `saved_params`: the saved indices matched to this optimizer's parameters, group by group;
2. `check_saved`: refuses, whole, a state dict saved under other options or holding other shapes;
3. `load_states`: every tensor copied into the optimizer's own, in place, in its own dtype
   (torch.optim's loader would cast a state to its parameter's dtype);
4. `load_groups`: the groups' hyperparameters (a scheduler's lr included).

`convert_states` replaces 2 and 3 for a torch.optim state dict of the same rule (such as
`torch.optim.AdamW(...).state_dict()`), to continue its run with FORGE: each state is converted into
this optimizer's format (fp32 copied, bf16 rounded to nearest, int8 quantized with fresh scales),
a tensor step becomes a count, and of each group's settings only those FORGE has are taken.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from forge.states import StateStorage


def saved_params(state_dict: dict, groups: list[dict]) -> dict[int, torch.Tensor]:
    """{saved index: parameter}, the saved groups matched to `groups` in order, or a ValueError."""
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    param_of = {}
    for saved, group in zip(saved_groups, groups):
        if len(saved["params"]) != len(group["params"]):
            raise ValueError("loaded state dict has a group of a different size than this optimizer's")
        param_of.update(zip(saved["params"], group["params"]))
    return param_of


def check_saved(state_dict: dict, param_of: dict, ours: dict, state: dict, name_of: Callable) -> None:
    """Refuse a FORGE state dict saved under options other than `ours` or holding other shapes, whole."""
    saved_options = state_dict.get("forge")
    if saved_options is not None and saved_options != ours:
        differ = ", ".join(
            f"{k}={saved_options.get(k)!r} (here {v!r})" for k, v in ours.items() if saved_options.get(k) != v
        )
        raise ValueError(
            f"this state dict was saved by FORGE with {differ}: attach with the same rule, options, "
            "state_dtype and int8_group (and master_weights) as the run that saved it; nothing was loaded"
        )
    for pid, saved_state in state_dict["state"].items():
        p = param_of[pid]
        StateStorage.check_saved(state[p], saved_state, name_of(p))


def load_states(state_dict: dict, param_of: dict, state: dict) -> None:
    """Every saved state into the optimizer's `state`, once `check_saved` has passed."""
    for pid, saved_state in state_dict["state"].items():
        StateStorage.load(state[param_of[pid]], saved_state)


def convert_states(
    state_dict: dict,
    param_of: dict,
    state: dict,
    storage: StateStorage,
    slots_of: Callable[[torch.Tensor], tuple],
    name_of: Callable[[torch.Tensor], str],
    rule: str,
) -> None:
    """A torch.optim state dict of `rule` into the optimizer's `state` (see the module);
    `slots_of(p)`: p's slots under its group's hyperparameters."""
    for pid, saved_state in state_dict["state"].items():
        p = param_of[pid]
        storage.convert(p, state[p], saved_state, slots_of(p), name_of(p), rule)


def load_groups(state_dict: dict, groups: list[dict], convert: bool) -> None:
    """The saved groups' settings into `groups` (converting: only the keys FORGE's groups have)."""
    for saved, group in zip(state_dict["param_groups"], groups):
        group.update({k: v for k, v in saved.items() if k != "params" and (not convert or k in group)})
