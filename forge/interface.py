"""What FORGE's layers, hooks, ops and losses need of an optimizer: the update interface, typed.

During backward the parts of forge that see a gradient hand it to the optimizer that trains the
parameter, and need nothing else of it. Each part names exactly what it calls, as a Protocol:

    FusedUpdater      forge.nn (a ForgeLinear's backward), forge.guards: `version`, `update_linear`
    HookUpdater       forge.wiring's post-accumulate-grad hooks: `update_elementwise`
    RowBlockUpdater   forge.head (lm_head a block of rows at a time): `row_block_updater`
    CompiledUpdater   forge.ops (torch.compile's custom ops) and the layers forge.wiring fuses: the
                      parameters by index, their state tensors, and both updates

`forge.optim.ForgeOptimizer` is all four: each of these methods hands the call to the object that
does the job (`forge.updates.Updates`: when an update runs; `forge.functional.Launcher`: its launch;
`forge.steps.Steps`: the counts); `update_linear` is `Updates.update_linear` itself, bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from forge.functional import RowBlockUpdate, Slots


class FusedUpdater(Protocol):
    """What a fused linear layer's backward calls (`forge.nn`)."""

    def version(self, p: torch.Tensor) -> int:
        """How many updates `p` has received (the forward records it, the backward compares)."""
        ...

    def update_linear(self, weight: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, **options) -> None:
        """One step of `weight` from the gradient dy^T x, fused into its dW GEMM where it can be: a
        ForgeOptimizer's is `forge.updates.Updates.update_linear`, whose options it takes."""
        ...


class HookUpdater(Protocol):
    """What a post-accumulate-grad hook calls (`forge.wiring`)."""

    def update_elementwise(self, p: torch.Tensor, grad: torch.Tensor, *, into: tuple | None = None) -> None:
        """One step of `p` from its materialized gradient."""
        ...


class RowBlockUpdater(Protocol):
    """What a loss that gets a weight's gradient a block of rows at a time calls (`forge.head`)."""

    def version(self, p: torch.Tensor) -> int: ...

    def check_row_blocks(self, weight: torch.Tensor) -> None:
        """Refuse, before the forward's work, what `row_block_updater` cannot do for `weight`."""
        ...

    def row_block_updater(self, weight: torch.Tensor) -> RowBlockUpdate:
        """Count one step of `weight` and return the function that applies it block by block."""
        ...


class CompiledUpdater(FusedUpdater, HookUpdater, Protocol):
    """What torch.compile's ops (`forge.ops`) and the layers `forge.wiring` fuses read: the
    optimizer by `handle` (`forge.handles`), a parameter by its index, its state tensors."""

    handle: int

    def index_of(self, p: torch.Tensor) -> int: ...

    def param_at(self, index: int) -> torch.Tensor: ...

    def slots_of(self, p: torch.Tensor) -> Slots: ...
