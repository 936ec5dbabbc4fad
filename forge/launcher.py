"""What one update launches: a parameter's next step through the fused or the element-wise kernel.

A launch needs four things, each from its owner:

    coefficients, seed, step row   `forge.steps.Steps.begin(p)`: the step counted, the rule's nine
                                   scalars from p's param group as it is now, the rounding seed
    slots                          p's state tensors as the kernels take them (`forge.states`)
    options                        how the rule runs for p: its flags, the states' storage, the
                                   rounding of bf16 weights (`forge.functional.UpdateOptions`)
    the kernel                     `forge.functional.fused_wgrad_update` (an nn.Linear weight, from
                                   dy and x) or `elementwise_update` (any parameter, from its gradient)

A rule that finishes on the whole matrix (Muon, `forge.rules.Rule.whole_matrix`) launches its tile
half into a scratch the size of the weight and then runs its whole-matrix half (`forge.muon.finish`),
which updates the weight; the scratch lives for that one update.

A `Launcher` puts them together, now: when an update runs (at once, on a second stream, after the
clip norm or the data-parallel reduction) is `forge.updates`' decision. It also takes each new
parameter in (`add`): its param group, its step count and its state tensors. Before the first step of
each backward it runs the backward's checks (`forge.guards.BackwardCheck`), so that a refused
backward counts no step.

Every launch may write into tensors other than the parameter's own (`into`: torch.compile's ops
hand functional copies, `forge.ops`); the step count, hyperparameters and seed are still the
parameter's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from forge import functional, muon
from forge.distributed import local, local_grad
from forge.guards import BackwardCheck
from forge.rules import NUM_COEFFICIENTS, Rule
from forge.states import StateStorage
from forge.steps import Steps, for_row_block
from forge.weights import WeightFormat

# A block of a weight's rows updated by its own launch (`Launcher.row_blocks`): (block, first row, dy, x).
RowBlockUpdate = Callable[[int, int, torch.Tensor, torch.Tensor], None]


def scratch_for(weight: torch.Tensor) -> torch.Tensor:
    """Where a whole-matrix rule's tile half writes (Muon: the update Newton-Schulz orthogonalizes):
    a bf16 tensor of the weight's shape, freed once its whole-matrix half has run."""
    return torch.empty(weight.shape, dtype=torch.bfloat16, device=weight.device)


def whole_matrix_scalars(coefficients: tuple, row: torch.Tensor | None) -> tuple:
    """(decay, step) of a whole-matrix half: coefficients h3 and h4 (`forge.rules`' muon), as host
    floats, or, for a capturable optimizer, read from its step row on the device, so that a replayed
    graph applies each step's own (eager steps of a capturable optimizer read them there too)."""
    if row is None:
        return coefficients[3], coefficients[4]
    values = row[:NUM_COEFFICIENTS].view(torch.float32)  # words 0-8: the coefficients' fp32 bits
    return values[3], values[4]


class Launcher:
    """The kernel launches of one optimizer's parameters. `groups` maps each parameter to its param
    group (filled by `add`), `state_of(p)` gives its state dict (the optimizer's); `check` runs
    before each backward's first step."""

    def __init__(
        self,
        rule_of: Callable[[torch.Tensor], Rule],
        storage: StateStorage,
        steps: Steps,
        weights: WeightFormat,
        groups: dict[torch.Tensor, dict],
        state_of: Callable[[torch.Tensor], dict],
        check: BackwardCheck,
    ):
        self.rule_of, self.storage, self.steps, self.weights = rule_of, storage, steps, weights
        self.groups, self.state_of = groups, state_of
        self.check = check
        self.slot_cache: dict[torch.Tensor, functional.Slots] = {}

    def add(self, p: torch.Tensor, group: dict) -> None:
        """A new parameter p of `group`: its step count (`forge.steps`) and its state tensors, now."""
        self.groups[p] = group
        state = self.state_of(p)
        self.steps.add(p, state)
        self.storage.allocate(p, state, self.rule_of(p).slots(group), group)

    # ------------------------------------------------------------------ what a launch takes

    def state_slots(self, p: torch.Tensor) -> tuple:
        """p's rule's state slots (`forge.rules.StateSlot`) under its group's hyperparameters."""
        return self.rule_of(p).slots(self.groups[p])

    def slots_of(self, p: torch.Tensor) -> functional.Slots:
        """p's state tensors as the kernels take them, cached: they are updated in place only."""
        slots = self.slot_cache.get(p)
        if slots is None:
            slots = self.storage.slots_of(self.state_of(p), self.state_slots(p))
            self.slot_cache[p] = slots
        return slots

    def options_of(self, p: torch.Tensor) -> functional.UpdateOptions:
        """How p's rule runs now (its group's flags as they are)."""
        rule = self.rule_of(p)
        # a whole-matrix rule's tile half writes a bf16 scratch, rounded to nearest as torch rounds it
        rounding = self.weights.stochastic_rounding and not rule.whole_matrix
        return functional.UpdateOptions(
            rule.device_name, rule.flags(self.groups[p]), self.storage.dtype_of(p), rounding,
            self.storage.int8_group,
        )  # fmt: skip

    def begin(self, p: torch.Tensor) -> tuple[tuple, int, torch.Tensor | None]:
        """(coefficients, seed, step row) of p's next update, its step counted (`forge.steps`),
        once this backward has passed its checks."""
        self.check.once()
        return self.steps.begin(p)

    # ------------------------------------------------------------------ the launches

    def fused(
        self,
        weight: torch.Tensor,
        dy: torch.Tensor,
        x: torch.Tensor,
        config=None,
        grad_scale: torch.Tensor | None = None,
        *,
        into: tuple | None = None,
    ) -> None:
        """The fused kernel's launch for `weight`'s next step from dW = dy^T x, now (a whole-matrix
        rule's: its tile half into a scratch, then its whole-matrix half, `forge.muon`)."""
        coefficients, seed, row = self.begin(weight)
        target, slots = (local(weight), self.slots_of(weight)) if into is None else into
        tiles = scratch_for(target) if self.rule_of(weight).whole_matrix else target
        functional.fused_wgrad_update(
            tiles, dy, x, slots, coefficients, seed, self.options_of(weight),
            step_row=row, grad_scale=grad_scale, config=config,
        )  # fmt: skip
        if tiles is not target:
            muon.finish(target, tiles, self.groups[weight], *whole_matrix_scalars(coefficients, row))

    def elementwise(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        grad_scale: torch.Tensor | None = None,
        *,
        into: tuple | None = None,
    ) -> None:
        """The element-wise kernel's launch for p's next step from its gradient, now."""
        coefficients, seed, row = self.begin(p)
        grad = local_grad(p, grad)  # a Partial gradient (sequence parallel) is all-reduced first
        target, slots = (local(p), self.slots_of(p)) if into is None else into
        if target.numel() == 0:  # an FSDP2 shard with no elements on this rank: its step still counts
            return
        tiles = scratch_for(target) if self.rule_of(p).whole_matrix else target
        functional.elementwise_update(
            tiles, grad, slots, coefficients, seed, self.options_of(p), step_row=row, grad_scale=grad_scale
        )
        if tiles is not target:
            muon.finish(target, tiles, self.groups[p], *whole_matrix_scalars(coefficients, row))

    def row_blocks(self, weight: torch.Tensor, fork: Callable | None = None) -> RowBlockUpdate:
        """Counts one step of `weight` now and returns `update(block, start, dy, x)`, which applies
        it to rows start : start + dy.shape[1] from dy^T x inside their dW GEMM (dy: (T, rows),
        x: (T, K)). Each block is its own launch with its own stochastic-rounding seed
        (`forge.steps.for_row_block`); `fork(*reads)`: a context to launch it in (the update stream)."""
        coefficients, seed, row = self.begin(weight)
        target, slots, options = local(weight), self.slots_of(weight), self.options_of(weight)

        def update(block: int, start: int, dy: torch.Tensor, x: torch.Tensor) -> None:
            rows = slice(start, start + dy.shape[1])
            block_slots = functional.Slots(
                tuple(None if s is None else s[rows] for s in slots.states),
                tuple(None if s is None else s[rows] for s in slots.scales),
                slots.signed,
                None if slots.residual is None else slots.residual[rows],
            )
            block_seed, block_row = for_row_block(seed, row, block)
            launch = lambda: functional.fused_wgrad_update(
                target[rows], dy, x, block_slots, coefficients, block_seed, options, step_row=block_row
            )
            if fork is not None and dy.is_cuda:
                reads = (dy, x) if block_row is None else (dy, x, block_row)  # a block's row: a copy
                with fork(*reads):
                    launch()
            else:
                launch()

        return update
