"""One backward per forward: the guard that keeps a fused weight from being stepped twice.

A fused nn.Linear weight is updated by raw Triton writes inside its backward, which autograd's
version counters do not see. Two graphs could then step a weight twice, or compute dx from an
already-updated weight: a second backward through a retained graph (`retain_graph=True`), or one
weight used twice in a graph (one nn.Linear called twice, two forwards before one backward).

Every ForgeLinear forward records its backward node here (`record_use`, with the weight, its
optimizer and the update count it saw) and its backward releases it (`release_use`) unless the
graph is retained. At the first FORGE update of each backward the optimizer calls `check_uses`,
which looks at every recorded node this backward will run, over every optimizer, and refuses the
whole backward before any parameter of any model has been updated. The ForgeLinear backward keeps
its own check as well (`forge.nn`), for what this one cannot see (compiled autograd).
"""

from __future__ import annotations

import weakref

import torch

_USES: weakref.WeakSet = weakref.WeakSet()  # fused-linear backward nodes that may still run
_checked_task = [-1]  # the last backward (autograd graph task) whose uses were checked

_UNTOUCHED = "; nothing has been updated by this backward (weights, states and steps are as they were)"


def record_use(node) -> None:
    """A ForgeLinear forward: `node` (its ctx) may run a fused update of `node.weight` later."""
    _USES.add(node)


def release_use(node) -> None:
    """A ForgeLinear backward, after its update: the node cannot run again, unless its graph is kept."""
    if not _keep_graph():
        _USES.discard(node)


def _keep_graph() -> bool:
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if keep is None else bool(keep())


def check_uses(task: int) -> None:
    """Refuse backward `task` if a fused weight it reaches was stepped since its forward, or is
    reached twice; once per backward."""
    if _checked_task[0] == task:
        return
    seen = {}
    for node in list(_USES):
        try:
            if not torch._C._will_engine_execute_node(node):
                continue
        except RuntimeError:  # not the eager autograd engine (compiled autograd): the backward's own guard
            return
        weight, optimizer = node.weight, node.optimizer
        if optimizer.version(weight) != node.version:
            raise RuntimeError(
                f"FORGE: {node.name} was already updated since this forward pass: a second backward through "
                "the same graph (retain_graph=True) would apply the optimizer step twice, and compute the "
                f"input gradient from the updated weight. FORGE needs one backward per forward{_UNTOUCHED}."
            )
        if id(weight) in seen:
            raise RuntimeError(
                f"FORGE: {node.name} is used twice in this graph (one nn.Linear called twice in a forward, "
                "or two forwards through it before one backward). Its fused update consumes the gradient of "
                "one use, and dx of the other would come from the updated weight. Leave this parameter out "
                "of forge.attach(params=...) to give it an ordinary gradient, or call the module once per "
                f"forward{_UNTOUCHED}."
            )
        seen[id(weight)] = node
    _checked_task[0] = task
