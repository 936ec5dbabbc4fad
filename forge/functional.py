"""FORGE's launches: its kernels as plain functions (explicit tensors in, tensors updated in
place), and an optimizer's `Launcher`, which hands them a parameter's step.

This module is forge's one door to its Triton kernels (`forge.kernels`): the optimizer, the layers
and the tools (the harness's kernel lab, the benchmarks) call these functions, and nothing else in
forge launches a kernel (`forge.states` quantizes its int8 states with `forge.kernels.quant`, and
`forge.steps` reads a step row's width from `forge.kernels.update_tile`, the kernels' layout). Each
takes what one step needs and nothing of the optimizer:

    fused_wgrad_update(weight, dy, x, slots, coefficients, seed, options)   an nn.Linear weight's
        step inside its dW GEMM: dW = dy^T x accumulated tile by tile in fp32 registers and
        consumed there by the rule; dW is never stored
    fused_wgrad_launch(weight, slots, options)   the same launch with the weight's side bound once,
        called with dy, x and the step's scalars at every step (what an optimizer keeps per weight)
    elementwise_update(param, grad, slots, coefficients, seed, options)     any parameter's step
        from its materialized gradient (embeddings, norms, biases; every parameter under data
        parallelism, from the reduced gradient)
    vector_update(params, grads, slots, step_rows, options)     the steps of many vectors (norm
        weights, biases) in one launch, each with its own coefficients and seed (`forge.vectors`)
    wgrad_norm_power_sum(dy, x, norm_type)     sum |dy^T x|^p without storing dy^T x (clipping)
    quantize(values, signed, group), dequantize(codes, scales, signed, group)   int8 states
    fp8_cast(t, dtype, rows, transposed)       the FP8 copies of a GEMM operand (two launches)

What the arguments are:
- `slots`: a `Slots` (`forge.states` lays them out), the tensors a step writes besides the weight:
  up to three state tensors (None where the rule has fewer), their int8 block scales (None unless
  int8), whether each state is signed (int8 codes: companded signed or square-root unsigned), and
  the compensated weight's bf16 residual (None unless master_weights="bf16+kahan").
  `ForgeOptimizer.slots_of(p)` gives a parameter's.
- `coefficients`: the rule's nine fp32 scalars for this step (lr, betas' powers, weight decay...,
  `forge.rules`), and `seed` the step's stochastic-rounding seed; with `step_row` (an int32 row of
  `forge.steps.step_row_words()` words on the device) the kernel reads both from memory instead, so
  a CUDA graph can replay the launch with each step's values.
- `options`: an `UpdateOptions`, how the rule runs: its name and flags, the states' storage, the
  rounding of bf16 weights, the int8 group. `ForgeOptimizer.options_of(p)` gives a parameter's.
- `grad_scale`: a one-element fp32 tensor the gradient is multiplied by first (the clip
  coefficient; FP8 operands' dequantization scale).

Importing this module imports no Triton: the kernels load at the first call (`forge.backend` decides
then whether they run compiled or in Triton's CPU interpreter), so `import forge` stays light.

An optimizer's launches (`Launcher`). What one update of a parameter launches needs four things,
each from its owner:

    coefficients, seed, step row   `forge.steps.Steps.begin(p)`: the step counted, the rule's nine
                                   scalars from p's param group as it is now, the rounding seed
    slots                          p's state tensors as the kernels take them (`forge.states`)
    options                        how the rule runs for p: its flags, the states' storage, the
                                   rounding of bf16 weights (`UpdateOptions`)
    the kernel                     `fused_wgrad_update` (an nn.Linear weight, from dy and x) or
                                   `elementwise_update` (any parameter, from its gradient)

A rule that finishes on the whole matrix (Muon, `forge.rules.Rule.whole_matrix`) launches its tile
half into a scratch the size of the weight and then runs its whole-matrix half (`forge.muon.finish`),
which updates the weight; the scratch lives for that one update.

A `Launcher` puts them together, now: when an update runs (at once, on a second stream, after the
clip norm or the data-parallel reduction) is `forge.updates`' decision. It also takes each new
parameter in (`add`): its param group, its step count and its state tensors. Before the first step of
each backward it runs the backward's checks (`forge.guards.BackwardCheck`), so that a refused
backward counts no step. Every launch may write into tensors other than the parameter's own (`into`:
torch.compile's ops hand functional copies, `forge.ops`); the step count, hyperparameters and seed
are still the parameter's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from forge import muon
from forge.distributed import is_dtensor, local, local_grad
from forge.guards import settled_values, unchanged
from forge.rules import NUM_COEFFICIENTS
from forge.states import Slots
from forge.steps import for_row_block, step_row_words, step_rows

if TYPE_CHECKING:
    from forge.guards import BackwardCheck
    from forge.param_table import ParamTable
    from forge.states import StateStorage
    from forge.steps import Steps
    from forge.weights import WeightFormat


class UpdateOptions(NamedTuple):
    """How a rule's step runs (see the module): the same for every launch of one parameter."""

    rule: str
    flags: dict  # the rule's structural options (momentum, nesterov, centered...: `forge.rules`)
    state_dtype: str  # "fp32" | "bf16" | "int8"
    stochastic_rounding: bool  # bf16 weights rounded stochastically (else to nearest)
    int8_group: int = 64  # elements per int8 scale


def fused_wgrad_update(
    weight: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    slots: Slots,
    coefficients: tuple,
    seed: int,
    options: UpdateOptions,
    *,
    step_row: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
    config=None,
) -> None:
    """One step of `weight` (N, K) from dW = dy^T x, fused into the dW GEMM (dy: (T, N), x: (T, K);
    FP8 operands T-contiguous with `grad_scale`). `config`: a `forge.kernels.KernelConfig` to launch
    under (benchmarks, the tuner); by default the shipped table's choice."""
    from forge.kernels.wgrad_update import wgrad_update  # loaded at the first launch (see the module)

    wgrad_update(
        weight, slots.states, slots.scales, slots.signed, dy, x, coefficients, seed,
        rule=options.rule, flags=options.flags, state_dtype=options.state_dtype,
        stochastic_rounding=options.stochastic_rounding, int8_group=options.int8_group,
        step_values=step_row, config=config, grad_scale=grad_scale, residual=slots.residual,
    )  # fmt: skip


def fused_wgrad_launch(weight: torch.Tensor, slots: Slots, options: UpdateOptions) -> Callable:
    """`fused_wgrad_update` of `weight` with its slots and options bound, and what the launch takes
    of them worked out once (`forge.kernels.wgrad_update.WgradUpdate`): call it as
    `launch(dy, x, coefficients, seed, step_row, grad_scale)` at each step. The tensors must keep
    their storage (an optimizer's states do: it updates them in place)."""
    from forge.kernels.wgrad_update import WgradUpdate

    return WgradUpdate(
        weight, slots.states, slots.scales, slots.signed, rule=options.rule, flags=options.flags,
        state_dtype=options.state_dtype, stochastic_rounding=options.stochastic_rounding,
        int8_group=options.int8_group, residual=slots.residual,
    )  # fmt: skip


def elementwise_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    slots: Slots,
    coefficients: tuple,
    seed: int,
    options: UpdateOptions,
    *,
    step_row: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
) -> None:
    """One step of `param` (any shape, contiguous) from its gradient `grad` (its shape, any float dtype)."""
    from forge.kernels.elementwise_update import elementwise_update as update

    update(
        param, grad, slots.states, slots.scales, slots.signed, coefficients, seed,
        rule=options.rule, flags=options.flags, state_dtype=options.state_dtype,
        stochastic_rounding=options.stochastic_rounding, int8_group=options.int8_group,
        step_values=step_row, grad_scale=grad_scale, residual=slots.residual,
    )  # fmt: skip


def vector_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    slots: list[Slots],
    step_rows: np.ndarray,
    options: UpdateOptions,
) -> None:
    """One step of each vector in `params` (1-D, contiguous, one dtype and device) from its gradient
    in `grads` (contiguous, one dtype), in one launch; `slots`: each one's (one layout for all),
    `step_rows`: each one's coefficients and seed (`forge.steps.step_rows`)."""
    from forge.kernels.vector_update import update_vectors

    update_vectors(
        params, grads, [s.states for s in slots], [s.residual for s in slots], step_rows, slots[0].signed,
        rule=options.rule, flags=options.flags, state_dtype=options.state_dtype,
        stochastic_rounding=options.stochastic_rounding,
    )  # fmt: skip


def wgrad_norm_power_sum(dy: torch.Tensor, x: torch.Tensor, norm_type: float = 2.0) -> torch.Tensor:
    """sum |dy^T x|^p (the max of |dy^T x| for p = inf) as a 0-dim fp32 tensor, dy^T x never stored:
    the fused kernel's main loop with a reducing epilogue. dy: (T, N), x: (T, K), one dtype."""
    from forge.kernels.wgrad_norm import wgrad_norm_partial

    return wgrad_norm_partial(dy, x, norm_type)


def quantize(values: torch.Tensor, signed: bool, group: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes shaped like `values` and bf16 scales (rows, ceil(cols / group)), as kernels store them."""
    from forge.kernels.quant import quantize as quantize_codes

    return quantize_codes(values, signed, group)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, signed: bool, group: int = 64) -> torch.Tensor:
    """fp32 values from int8 codes and their scales (the inverse of `quantize`, to its rounding)."""
    from forge.kernels.quant import dequantize as dequantize_codes

    return dequantize_codes(codes, scales, signed, group)


def fp8_cast(t: torch.Tensor, dtype: torch.dtype, *, rows: bool = True, transposed: bool = False):
    """(t8 row-major or None, its transpose row-major or None, inverse scale) of a 2-D CUDA tensor:
    its maximum, then the casts, in two launches (`forge.fp8` on a GPU)."""
    from forge.kernels import fp8_cast as kernel

    return kernel.cast(t, dtype, rows=rows, transposed=transposed)


class KeptLaunch(NamedTuple):
    """A fused weight's launch, kept from step to step (`Launcher.kept_launch`): valid while the
    weight's storage is at `address` (and its rule's flags as they were: `Launcher.check_flags`)."""

    launch: Callable  # (dy, x, coefficients, seed, step_row, grad_scale): a `WgradUpdate`
    address: int


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
    """The kernel launches of one optimizer's parameters (see the module). `table` gives each
    parameter's group, rule and state (`forge.param_table`; `add` enters it there); `check` runs
    before each backward's first step."""

    def __init__(
        self,
        table: ParamTable,
        storage: StateStorage,
        steps: Steps,
        weights: WeightFormat,
        check: BackwardCheck,
    ):
        self.table, self.storage, self.steps, self.weights = table, storage, steps, weights
        self.check = check
        self.slot_cache: dict[torch.Tensor, Slots] = {}
        self.kept: dict[torch.Tensor, KeptLaunch | None] = {}  # fused weights' launches (`kept_launch`)
        self.kinds: dict[torch.Tensor, tuple] = {}  # vectors' options, slots and kind (`vector_kind`)
        self.group_flags: dict[int, dict] = {}  # each group's rule's flags when its launches were kept
        self.group_values: dict[int, tuple | None] = {}  # each group's values then (`guards.settled_values`)
        self.flags_task = -1  # the backward whose first update checked them (`check_flags`)

    def add(self, p: torch.Tensor, group: dict) -> None:
        """A new parameter p of `group`: its step count (`forge.steps`) and its state tensors, now."""
        self.table.add(p, group)
        state = self.table.state_of(p)
        self.steps.add(p, state)
        self.storage.allocate(p, state, self.table.rule_of(p).slots(group), group)

    # ------------------------------------------------------------------ what a launch takes

    def state_slots(self, p: torch.Tensor) -> tuple:
        """p's rule's state slots (`forge.rules.StateSlot`) under its group's hyperparameters."""
        return self.table.rule_of(p).slots(self.table.group_of(p))

    def slots_of(self, p: torch.Tensor) -> Slots:
        """p's state tensors as the kernels take them, cached: they are updated in place only."""
        slots = self.slot_cache.get(p)
        if slots is None:
            slots = self.storage.slots_of(self.table.state_of(p), self.state_slots(p))
            self.slot_cache[p] = slots
        return slots

    def options_of(self, p: torch.Tensor) -> UpdateOptions:
        """How p's rule runs now (its group's flags as they are)."""
        rule = self.table.rule_of(p)
        # a whole-matrix rule's tile half writes a bf16 scratch, rounded to nearest as torch rounds it
        rounding = self.weights.stochastic_rounding and not rule.whole_matrix
        return UpdateOptions(
            rule.device_name, rule.flags(self.table.group_of(p)), self.storage.dtype_of(p), rounding,
            self.storage.int8_group,
        )  # fmt: skip

    def begin(self, p: torch.Tensor) -> tuple[tuple, int, torch.Tensor | None]:
        """(coefficients, seed, step row) of p's next update, its step counted (`forge.steps`),
        once this backward has passed its checks."""
        task = self.check.once()
        if task != self.flags_task or task < 0:
            self.check_flags(task)
        return self.steps.begin(p, task)

    def check_flags(self, task: int) -> None:
        """At the first update of backward `task` (and at every update outside one): what is kept
        for the parameters of a group whose rule's flags changed since it was built (launches,
        vector kinds) is dropped, and built again with the flags as they are."""
        for group in self.table.param_groups:
            if unchanged(self.group_values.get(id(group)), group):
                continue  # its flags as they were: the values they derive from have not changed
            self.group_values[id(group)] = settled_values(group)
            flags = self.table.rule_of_group(group).flags(group)
            if self.group_flags.get(id(group)) != flags:
                self.group_flags[id(group)] = flags
                for p in group["params"]:
                    self.kept.pop(p, None)
                    self.kinds.pop(p, None)
        self.flags_task = task

    def kept_launch(self, weight: torch.Tensor) -> KeptLaunch | None:
        """The fused kernel's launch for `weight` with its tensors and options bound
        (`forge.kernels.wgrad_update.WgradUpdate`), built at its first step and kept while its storage
        stays where it was and its rule's flags as they were (`check_flags`); None where a step is not
        one launch on the weight itself (a whole-matrix rule, a DTensor shard)."""
        kept = self.kept.get(weight)
        if kept is not None:
            if kept.address == weight.data_ptr():
                return kept
        elif weight in self.kept:
            return None
        rule = self.table.rule_of(weight)
        if rule.whole_matrix or is_dtensor(weight):
            self.kept[weight] = None
            return None
        options = self.options_of(weight)
        launch = fused_wgrad_launch(weight, self.slots_of(weight), options)
        kept = self.kept[weight] = KeptLaunch(launch, weight.data_ptr())
        return kept

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
        task = torch._C._current_graph_task_id()
        if task >= 0 and task == self.check.checked_task and task == self.flags_task:
            coefficients, seed, row = self.steps.begin(weight, task)  # `begin`, its checks passed in this backward
        else:
            coefficients, seed, row = self.begin(weight)
        if into is None and config is None and row is None:  # an eager step (a capturable one is a warm-up)
            kept = self.kept.get(weight)  # `kept_launch`'s first lines, without its frame
            if kept is None or kept.address != weight.data_ptr():
                kept = self.kept_launch(weight)
            if kept is not None:
                kept.launch(dy, x, coefficients, seed, None, grad_scale)
                return
        target, slots = (local(weight), self.slots_of(weight)) if into is None else into
        tiles = scratch_for(target) if self.table.rule_of(weight).whole_matrix else target
        fused_wgrad_update(
            tiles, dy, x, slots, coefficients, seed, self.options_of(weight),
            step_row=row, grad_scale=grad_scale, config=config,
        )  # fmt: skip
        if tiles is not target:
            muon.finish(target, tiles, self.table.group_of(weight), *whole_matrix_scalars(coefficients, row))

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
        tiles = scratch_for(target) if self.table.rule_of(p).whole_matrix else target
        elementwise_update(
            tiles, grad, slots, coefficients, seed, self.options_of(p), step_row=row, grad_scale=grad_scale
        )
        if tiles is not target:
            muon.finish(target, tiles, self.table.group_of(p), *whole_matrix_scalars(coefficients, row))

    def vectors(self, updates: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The steps of vectors from their gradients ((p, grad) pairs, `forge.vectors`), each counted
        now, in one launch per kind of update (rule and flags, dtypes, state layout)."""
        batches: dict[tuple, list] = {}
        for p, grad in updates:
            coefficients, seed, _ = self.begin(p)
            if p.numel() == 0:  # an FSDP2 shard with no elements on this rank: its step still counts
                continue
            options, slots, kind = self.vector_kind(p)
            batch = batches.get((kind, grad.dtype))
            if batch is None:
                batch = batches[kind, grad.dtype] = [options, [], [], [], [], []]
            batch[1].append(p)
            batch[2].append(grad)
            batch[3].append(slots)
            batch[4].append(coefficients)
            batch[5].append(seed)
        for options, params, grads, slots, coefficients, seeds in batches.values():
            vector_update(params, grads, slots, step_rows(coefficients, seeds, step_row_words()), options)

    def vector_kind(self, p: torch.Tensor) -> tuple[UpdateOptions, Slots, tuple]:
        """(options, slots, kind) of a vector's update, kept while its rule's flags stay as they
        were (`check_flags`): the vectors of one kind (and gradient dtype) share a launch."""
        kept = self.kinds.get(p)
        if kept is not None:
            return kept
        options, slots = self.options_of(p), self.slots_of(p)
        kind = (
            options.rule, tuple(options.flags.items()), options.state_dtype, options.stochastic_rounding,
            p.dtype, p.device, tuple(s is None for s in slots.states), slots.signed, slots.residual is None,
        )  # fmt: skip
        kept = self.kinds[p] = (options, slots, kind)
        return kept

    def row_blocks(self, weight: torch.Tensor, fork: Callable | None = None) -> RowBlockUpdate:
        """Counts one step of `weight` now and returns `update(block, start, dy, x)`, which applies
        it to rows start : start + dy.shape[1] from dy^T x inside their dW GEMM (dy: (T, rows),
        x: (T, K)). Each block is its own launch with its own stochastic-rounding seed
        (`forge.steps.for_row_block`); `fork(*reads)`: a context to launch it in (the update stream)."""
        coefficients, seed, row = self.begin(weight)
        target, slots, options = local(weight), self.slots_of(weight), self.options_of(weight)

        def update(block: int, start: int, dy: torch.Tensor, x: torch.Tensor) -> None:
            rows = slice(start, start + dy.shape[1])
            block_slots = Slots(
                tuple(None if s is None else s[rows] for s in slots.states),
                tuple(None if s is None else s[rows] for s in slots.scales),
                slots.signed,
                None if slots.residual is None else slots.residual[rows],
            )
            block_seed, block_row = for_row_block(seed, row, block)
            launch = lambda: fused_wgrad_update(
                target[rows], dy, x, block_slots, coefficients, block_seed, options, step_row=block_row
            )
            if fork is not None and dy.is_cuda:
                reads = (dy, x) if block_row is None else (dy, x, block_row)  # a block's row: a copy
                with fork(*reads):
                    launch()
            else:
                launch()

        return update
