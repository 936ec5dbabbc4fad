"""ForgeOptimizer: the torch.optim.Optimizer face of FORGE.

With FORGE the update happens during `loss.backward()`: each nn.Linear weight inside its fused
weight-gradient kernel (`forge.nn`), every other parameter from a post-accumulate-grad hook that
runs the element-wise kernel and drops the gradient at once (`forge.wiring`), the vectors among them
(norm weights, biases) in one launch when the backward ends (`forge.vectors`). This class owns what
an optimizer owns, param groups with their hyperparameters and per-parameter state, and hands
every update to the objects that do one job each:

    forge.rules        the rule: its hyperparameters, and the nine coefficients of a step
    forge.weights      which weights FORGE trains, and how bf16 ones keep their precision
    forge.states       the states' storage: fp32, bf16 or int8 with scales
    forge.steps        step counts and seeds, and the step rows CUDA graphs replay (capturable)
    forge.functional   one update's launch: coefficients, slots and options, and the kernel
    forge.param_table  each parameter's group, rule and state, the lookup the parts above share
    forge.updates      when each update runs: now, on the update stream (`forge.streams`), after
                       the clip norm (`forge.clip`) or the data-parallel reduction (`forge.data_parallel`),
                       or with the backward's other vectors (`forge.vectors`)
    forge.guards       what the first update of each backward checks
    forge.wiring       which parameters are fused and which hooked
    forge.state_dict   loading a state dict, checked whole before anything changes

The layers, hooks, ops and losses that call an optimizer during backward see it through the
Protocols of `forge.interface`, which this class implements by delegation.

The tools built around torch.optim keep working:
* LR schedulers change `param_groups[i]["lr"]`; the next backward reads it.
* `state_dict()` / `load_state_dict()` round-trip the states bit for bit, in their storage dtype
  (torch.optim's loader would cast them to the parameter's dtype: here it does not), and a state
  dict saved under other options (rule, state dtype, int8 group) is refused before anything loads.
* `step()` and `zero_grad()` are allowed and do nothing (the step already happened), so an
  ordinary training loop runs unchanged.

CUDA graphs. With `capturable=True` every update reads its coefficients and seed from a row of
device memory, so a forward + backward captured once under `torch.cuda.graph` can be replayed for
every later step:

    opt = forge.attach(model, "adamw", lr=1e-4, capturable=True)
    ...eager warm-up steps on a side stream, then: with torch.cuda.graph(g): model(x).loss.backward()
    for batch in data:
        static_x.copy_(batch)
        opt.prepare_replay()  # advance every captured parameter's step, upload the step's values
        g.replay()

With `update_stream=True` the fused updates run on a second CUDA stream, beside the dX GEMMs of
the layers below (`forge.streams`); the main stream waits for them when the backward ends.

What users must know: each backward IS an optimizer step, so there is no gradient accumulation over
micro-batches (a larger micro-batch with activation checkpointing gives the same update for a
mean-reduced loss); a second backward through the same graph (`retain_graph=True`) is refused
rather than applied twice.

Global gradient-norm clipping. With `max_grad_norm` (and `norm_type`, 2 by default) the update equals
torch.optim's after `clip_grad_norm_(params, max_grad_norm, norm_type)` over every parameter this
optimizer trains: the backward gathers each gradient's norm and keeps the layers' operands, and the
updates run when it ends, scaled by the clip coefficient (`forge.clip`). `last_grad_norm` then holds
the norm before clipping, as clip_grad_norm_ returns it, and `last_clip_coefficient` the factor.

Built directly, `ForgeOptimizer(model.parameters(), rule)` trains every parameter from a
post-accumulate-grad hook (element-wise kernel, the gradient materialized one parameter at a time);
only `forge.attach(model, ...)` knows the modules, and fuses nn.Linear weights into their dW kernel.
It passes three more arguments: `wiring`, what makes each parameter train (`forge.wiring`: its
ModelWiring; by default every parameter is hooked), `param_names`, names for messages and
checkpoints, and `data_parallel`, how gradients are shared between ranks (`forge.data_parallel`).
Hyperparameters are checked as torch.optim checks them, for the defaults and every group, at
construction and again at the first update of each backward (before anything is updated there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from forge import functional, handles
from forge.data_parallel import REPLICAS, SHARDS, DataParallel, check_new_group
from forge.distributed import mesh_rank
from forge.functional import Launcher, RowBlockUpdate
from forge.guards import BackwardCheck
from forge.param_table import ParamTable
from forge.rules import (
    check_whole_matrix,
    checked_group,
    get_rule,
    group_rules,
    resolve_hparams,
    rule_of_group,
    settle_group,
)
from forge.state_dict import check_saved, convert_states, load_groups, load_states, saved_params
from forge.states import StateStorage
from forge.steps import Steps
from forge.updates import Updates, check_options
from forge.weights import checked_params, load_master_weights, weight_format
from forge.wiring import HookWiring

__all__ = ["ForgeOptimizer"]


class ForgeOptimizer(torch.optim.Optimizer):
    """Holds FORGE's param groups and states; the updates themselves run inside backward. The
    arguments `forge.attach` adds (`wiring`, `param_names`, `data_parallel`): see the module."""

    def __init__(
        self,
        params: Iterable,
        rule: str = "adamw",
        *,
        state_dtype: str = "bf16",
        stochastic_rounding: bool = True,
        seed: int = 0,
        int8_group: int = 64,
        capturable: bool = False,
        update_stream: bool = False,
        max_grad_norm: float | None = None,
        norm_type: float = 2.0,
        master_weights: str | None = None,
        data_parallel: DataParallel | None = None,
        wiring=None,
        param_names: dict | None = None,
        **hparams,
    ):
        self.rule = get_rule(rule)
        self.weights = weight_format(master_weights, stochastic_rounding)
        self.kahan, self.stochastic_rounding = self.weights.kahan, self.weights.stochastic_rounding
        self.storage = StateStorage(state_dtype, int8_group, self.kahan)
        check_options(data_parallel, capturable, update_stream, max_grad_norm)
        self.data_parallel = data_parallel
        self.param_names: dict[torch.Tensor, str] = dict(param_names or {})
        table = ParamTable(self, self.rule)  # each parameter's group, rule and state
        self._sharded = data_parallel is not None and data_parallel.kind == SHARDS  # FSDP2
        self.steps = Steps(table, seed, capturable, mesh_rank if self._sharded else None)
        check = BackwardCheck(table)
        self.launcher = Launcher(table, self.storage, self.steps, self.weights, check)
        self.updates = Updates(self.launcher, check, max_grad_norm, norm_type, update_stream)
        self.update_linear = self.updates.update_linear
        self.wiring = wiring if wiring is not None else HookWiring()
        self._wired = False  # until construction ends: then each new group is wired as it comes
        self.handle = handles.register(self)  # what torch.compile's ops name this optimizer by (forge.ops)
        super().__init__(params, resolve_hparams(self.rule, hparams))
        if data_parallel is not None and data_parallel.kind == REPLICAS:
            self.updates.reduce_over(data_parallel, list(self.steps.params))
        self.wiring.wire(self, list(self.steps.params), fuse=data_parallel is None)
        self._wired = True

    # ------------------------------------------------------------------ options

    state_dtype = property(lambda self: self.storage.state_dtype, doc="How the states are stored.")
    int8_group = property(lambda self: self.storage.int8_group, doc="Elements per int8 scale.")
    capturable = property(lambda self: self.steps.capturable, doc="Whether CUDA graphs may capture steps.")

    seed = property(
        lambda self: self.steps.seed,
        lambda self, value: setattr(self.steps, "seed", int(value)),
        doc="The seed every stochastic rounding draws from (with the parameter and the step).",
    )

    def storage_options(self) -> dict:
        """What this optimizer's saved states only make sense under (state dicts, checkpoints)."""
        mixed = group_rules(self.param_groups, self.rule)
        return {"rule": self.rule.name, **mixed, **self.storage.options(), "weights": self.weights.name}

    # ------------------------------------------------------------------ groups and states

    def add_param_group(self, param_group: dict) -> None:
        if self._wired:  # added after construction: the model must still be there to train them
            check_new_group(self.data_parallel)
        # Its options and parameters are checked before it is added: a refused group changes nothing.
        rule = rule_of_group(param_group, self.rule)
        param_group = checked_group(rule, self.rule, self.defaults, param_group)
        params = param_group["params"]
        if not isinstance(params, set):  # torch.optim refuses sets itself, with its message
            clipped = self.updates.clip is not None
            params = checked_params(
                params, self.name_of, self.weights, sharded=self._sharded, clipped=clipped
            )
            param_group = {**param_group, "params": params}
        if self._wired:
            self.wiring.check_attached(self)
        if rule.whole_matrix and not isinstance(params, set):
            check_whole_matrix(rule, params, self.name_of, self.storage.state_dtype, self.weights.kahan)
        super().add_param_group(param_group)
        group = settle_group(self.param_groups[-1], rule, self.defaults)
        for p in group["params"]:
            self.launcher.add(p, group)
        if self._wired:  # they train from the next backward on
            self.wiring.wire(self, group["params"], fuse=self.data_parallel is None)

    def name_of(self, p: torch.Tensor) -> str:
        return self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")

    def index_of(self, p: torch.Tensor) -> int:
        """p's position in this optimizer (the order parameters were added)."""
        return self.steps.index[p]

    def param_at(self, index: int) -> torch.Tensor:
        """The parameter at position `index` (`index_of`)."""
        return self.steps.params[index]

    def state_dtype_of(self, p: torch.Tensor) -> str:
        """The storage of p's states (`forge.states`: a vector keeps bf16 states under int8)."""
        return self.storage.dtype_of(p)

    def slots_of(self, p: torch.Tensor) -> functional.Slots:
        """p's state tensors as the kernels take them (`forge.functional.Launcher`)."""
        return self.launcher.slots_of(p)

    def options_of(self, p: torch.Tensor) -> functional.UpdateOptions:
        """How p's rule runs now (its group's flags as they are)."""
        return self.launcher.options_of(p)

    def version(self, p: torch.Tensor) -> int:
        """How many updates `p` has received from this optimizer (guards double backward)."""
        return self.steps.version[p]

    # ------------------------------------------------------------------ the updates (called in backward)

    # `update_linear(weight, dy, x, *, config=None, into=None, grad_scale=None)`: one step of `weight`
    # (N, K) from dy^T x (dy: (T, N), x: (T, K)), what a ForgeLinear's backward runs: an attribute set
    # in __init__ to `forge.updates.Updates.update_linear` itself, bound (no frame of its own on the
    # path of every layer), which says when it runs and what the options do.
    update_linear: Callable[..., None]

    def update_elementwise(self, p: torch.Tensor, grad: torch.Tensor, *, into: tuple | None = None) -> None:
        """One step of any parameter from its materialized gradient (`forge.updates` decides when)."""
        self.updates.update_elementwise(p, grad, into=into)

    def row_block_updater(self, weight: torch.Tensor) -> RowBlockUpdate:
        """Count one step of `weight`, applied a block of its rows at a time (`forge.head`)."""
        return self.updates.row_block_updater(weight)

    def check_row_blocks(self, weight: torch.Tensor) -> None:
        """Refuse what `row_block_updater` cannot do for `weight`, saying what to do instead."""
        self.updates.check_row_blocks(weight)

    def prepare_replay(self) -> None:
        """Before each replay of a captured step: one more step of each parameter it updates (forge.steps)."""
        self.steps.prepare_replay()

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """With max_grad_norm: the total gradient norm of the last step, before clipping (a 0-dim
        fp32 tensor on the device, what clip_grad_norm_ returns); None before the first step."""
        return None if self.updates.clip is None else self.updates.clip.total_norm

    @property
    def last_clip_coefficient(self) -> torch.Tensor | None:
        """With max_grad_norm: the factor the last step's gradients were multiplied by,
        min(1, max_grad_norm / (norm + 1e-6)), a one-element fp32 tensor; None before the first step."""
        return None if self.updates.clip is None else self.updates.clip.coefficient

    # ------------------------------------------------------------------ torch.optim surface

    @torch.no_grad()
    def step(self, closure=None):
        """Nothing to do: FORGE applied the step during backward. Runs `closure` if given."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def state_dict(self) -> dict:
        """torch.optim's state dict, and under "forge" the `storage_options` `load_state_dict`
        checks; under data-parallel replicas "bucket_order" too (`forge.updates`)."""
        state = {**super().state_dict(), "forge": self.storage_options()}
        if self.updates.reducer is not None:
            state["bucket_order"] = self.updates.bucket_order(self.index_of)
        return state

    def load_state_dict(self, state_dict: dict, convert: bool = False) -> None:
        """Restore states in their own dtype; one saved under other options, or of other shapes, is
        refused before anything loads. convert=True loads a torch.optim state dict of the same rule
        (its parameters in the same groups and order) into this optimizer's format (`forge.state_dict`)."""
        param_of = saved_params(state_dict, self.param_groups)
        order = self.updates.saved_bucket_order(state_dict.get("bucket_order"), param_of)
        if convert:
            slots_of, rule = self.launcher.state_slots, self.rule.name
            convert_states(state_dict, param_of, self.state, self.storage, slots_of, self.name_of, rule)
        else:
            check_saved(state_dict, param_of, self.storage_options(), self.state, self.name_of)
            load_states(state_dict, param_of, self.state)
        load_groups(state_dict, self.param_groups, convert)
        self.updates.restore_bucket_order(order)

    def load_master_weights(self, weights: Iterable[torch.Tensor]) -> None:
        """Set every parameter from fp32 master weights, one per parameter in the order of
        `param_groups` (`forge.weights.load_master_weights`): to continue an fp32-master run."""
        load_master_weights(self.param_groups, list(weights), self.state, self.name_of, self.weights)
