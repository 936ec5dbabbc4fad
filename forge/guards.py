"""What the first FORGE update of each backward checks, before anything is updated.

`BackwardCheck.once()` runs at an optimizer's first update in a backward: every group's
hyperparameters (a scheduler or a user may have changed them since construction) and every fused
nn.Linear this backward will reach, each used once since its forward (below). A refusal there
leaves every weight, state and step count as it was, and refuses every later update of that
backward too. `backward_task()` names the backward running now and `at_backward_end` queues work
for its end, for the parts of forge that defer work to it (`forge.clip`, `forge.streams`,
`forge.data_parallel`): this module is where forge touches autograd's engine.

One backward per forward: the guard that keeps a fused weight from being stepped twice.

A fused nn.Linear weight is updated by raw Triton writes inside its backward, which autograd's
version counters do not see. Two graphs could then step a weight twice, or compute dx from an
already-updated weight: a second backward through a retained graph (`retain_graph=True`), or one
weight used twice in a graph (one nn.Linear called twice, two forwards before one backward).

Every ForgeLinear forward records its backward node here (`record_use`, with the weight, its
optimizer as a `forge.interface.FusedUpdater` and the update count it saw) and its backward
releases it (`release_use`) unless the graph is retained. At the first FORGE update of each
backward the optimizer calls `check_uses` (through `BackwardCheck`), which looks at every recorded
node this backward will run, over every optimizer, and refuses the whole backward before any
parameter of any model has been updated. The ForgeLinear backward keeps its own check as well
(`forge.nn`), for what this one cannot see (compiled autograd).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.autograd import Variable
from torch.autograd.function import BackwardCFunction

from forge.rules import check_hparams

if TYPE_CHECKING:
    from forge.param_table import ParamTable

# Fused-linear backward nodes that may still run, as weak references that leave the set when their
# node dies: a WeakSet's own, without its Python methods on every layer's path.
_USES: set = set()
_forget = _USES.discard
_checked_task = [-1]  # the last backward (autograd graph task) whose uses were checked

_UNTOUCHED = "; nothing has been updated by this backward (weights, states and steps are as they were)"


def record_use(node) -> None:
    """A ForgeLinear forward: `node` may run a fused update of `node.weight` later: its Function's
    ctx, which is its backward node, or a use whose `graph_node` is the torch GEMM node it hooks
    (`forge.nn`), each with `weight`, `updater`, `version` and `name`."""
    _USES.add(weakref.ref(node, _forget))


def release_use(node) -> bool:
    """A ForgeLinear backward, after its update: the node cannot run again, unless its graph is kept.
    Whether it was released (False: kept, for a second backward that `check_uses` refuses)."""
    if _KEEP_GRAPH is not None and not _KEEP_GRAPH():
        _USES.discard(weakref.ref(node))  # equal to the recorded reference while the node lives
        return True
    return False


# Whether the backward running now keeps its graph (retain_graph); None: a torch that cannot say,
# where every use stays recorded until its node is freed.
_KEEP_GRAPH = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)


def check_uses(task: int) -> None:
    """Refuse backward `task` if a fused weight it reaches was stepped since its forward, or is
    reached twice; once per backward."""
    if _checked_task[0] == task:
        return
    seen = {}
    for ref in list(_USES):
        node = ref()
        if node is None:
            continue
        graph_node = node if isinstance(node, BackwardCFunction) else node.graph_node
        try:
            if graph_node is None or not torch._C._will_engine_execute_node(graph_node):
                continue
        except RuntimeError:  # not the eager autograd engine (compiled autograd): the backward's own guard
            return
        weight, updater = node.weight, node.updater
        if updater.version(weight) != node.version:
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


def backward_task() -> int:
    """The autograd graph task (one backward) running now; -1 outside any backward."""
    return torch._C._current_graph_task_id()


def at_backward_end(callback: Callable[[], None]) -> None:
    """Run `callback` when the backward running now ends (autograd's engine queues it)."""
    Variable._execution_engine.queue_callback(callback)


# The types of hyperparameter values that cannot change in place (tuples of them neither, betas).
_IMMUTABLE = (float, int, bool, str, type(None))


def settled_values(group: dict) -> tuple | None:
    """`group`'s values as a tuple, equal to a later one while no value has changed, or None where
    one could change in place unseen (a tensor's learning rate, a list): what a check that reads a
    group's hyperparameters alone may skip while it stays equal. The parameter list is compared by
    identity first, as tuples compare their items."""
    for key, value in group.items():
        if type(value) in _IMMUTABLE or key == "params":
            continue
        if type(value) is not tuple or any(type(v) not in _IMMUTABLE for v in value):
            return None
    return tuple(group.values())


def unchanged(settled: tuple | None, group: dict) -> bool:
    """Whether `group`'s values equal `settled`, what `settled_values` returned for it (or for a
    group before it under its id: equal values pass the same checks); never where that was None."""
    if settled is None:
        return False
    try:
        return settled == tuple(group.values())
    except RuntimeError:  # another parameter list, whose tensors compared elementwise
        return False


class BackwardCheck:
    """An optimizer's checks at its first update in each backward (see the module): the
    hyperparameters of each of `table`'s param groups by its rule (skipped for a group whose values
    passed them unchanged: `settled_values`), then `check_uses`."""

    def __init__(self, table: ParamTable):
        self.table = table
        self.checked_task = -1  # the last backward whose groups were checked
        self.passed: dict[int, tuple] = {}  # id(group) -> its settled values when they passed

    def once(self) -> int:
        """The checks, at this backward's first update only (a direct call, outside any backward,
        checks nothing: there is no graph to refuse). Returns the backward's task (-1: none)."""
        task = torch._C._current_graph_task_id()  # `backward_task()`, at every update
        if task == self.checked_task:
            return task
        if task >= 0:
            passed = self.passed
            for group in self.table.param_groups:
                if not unchanged(passed.get(id(group)), group):
                    check_hparams(self.table.rule_of_group(group).name, group)
                    passed[id(group)] = settled_values(group)
            check_uses(task)
        self.checked_task = task  # only once passed: a refused backward is refused at every update
        return task
