"""The vector parameters' updates of a backward, gathered and launched together when it ends.

A transformer's vectors (RMSNorm and LayerNorm weights, q/k norms, biases: Llama-3.1-8B has 65,
Qwen3-0.6B 113) each reach the optimizer through a post-accumulate-grad hook (`forge.wiring`).
Launched one at a time, each costs the host a kernel launch for a few kilobytes of work. Instead,
`VectorBatch.add` keeps the gradient and the backward's end launches the steps of all of them in one
launch per kind of update (`forge.functional.vector_update`), as torch's `_foreach` and fused
optimizers do: one launch a step for the vectors of a model in one dtype.

What changes and what does not:
- The arithmetic: none. Each vector's step is the element-wise kernel's, to the bit: the same
  coefficients and seed, counted and computed when its launch runs (`forge.kernels.vector_update`).
- Memory: a vector's gradient lives until the backward ends, instead of until its hook returns;
  vectors are a model's smallest tensors (Llama-3.1-8B's 65 hold 266k elements).
- When: the vectors are updated when the backward ends, before `backward()` returns, as a
  torch.optim step after backward would update them.

A parameter joins the batch when it is a plain 1-D contiguous tensor (not a DTensor shard), trained by
an element-wise rule, of an optimizer that is not capturable, updated inside a backward. Everything
else launches at once (`forge.updates`). The step's checks (`forge.guards.BackwardCheck`) run when a
vector is added, so a refused backward refuses before anything is gathered; a backward that fails
after gathering leaves its vectors to the next backward's first gathered vector, which launches them
first (a reentrant checkpoint's inner backward does the same with the outer one's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from forge.distributed import is_dtensor
from forge.guards import at_backward_end, backward_task

if TYPE_CHECKING:
    from forge.functional import Launcher


class VectorBatch:
    """The vectors of `launcher`'s optimizer gathered in the running backward (see the module)."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (vector, its gradient)
        self.task = -1  # the backward that gathered `pending`, whose end launches it
        self.joins: dict[torch.Tensor, bool] = {}  # whether each parameter seen can join, decided once

    def add(self, p: torch.Tensor, grad: torch.Tensor) -> bool:
        """Gather p's update from `grad` for the end of this backward; False (nothing done) where p
        does not join a batch (see the module): the caller launches it at once."""
        joins = self.joins.get(p)
        if joins is None:
            joins = self.joins[p] = self._can_join(p)
        if not joins:
            return False
        task = backward_task()
        if task < 0:
            return False
        self.launcher.check.once()  # a refused backward refuses here, before anything is gathered
        if task != self.task:
            if (
                self.pending
            ):  # another backward's: failed after gathering, or the outer one of a reentrant checkpoint
                self.flush()
            self.task = task
            at_backward_end(self.flush)
        self.pending.append((p, grad if grad.is_contiguous() else grad.contiguous()))
        return True

    def flush(self) -> None:
        """Launch every gathered update (when the backward ends)."""
        pending, self.pending, self.task = self.pending, [], -1
        if pending:
            self.launcher.vectors(pending)

    def _can_join(self, p: torch.Tensor) -> bool:
        launcher = self.launcher
        return (
            p.dim() == 1
            and p.is_contiguous()
            and not is_dtensor(p)
            and not launcher.steps.capturable
            and not launcher.table.rule_of(p).whole_matrix
        )
