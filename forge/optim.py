"""ForgeOptimizer: the torch.optim.Optimizer face of FORGE.

With FORGE the update happens during `loss.backward()`: each nn.Linear weight inside its fused
weight-gradient kernel (`forge.nn`), every other parameter from a post-accumulate-grad hook that
runs the element-wise kernel and drops the gradient at once (`forge.wiring`). This class owns what
an optimizer owns, param groups with their hyperparameters and per-parameter state, and decides how
each update runs; the rest is in modules of their own:

    forge.rules       a rule's hyperparameters resolved into the nine coefficients of a step
    forge.steps       step counts and seeds, and the step rows CUDA graphs replay (capturable)
    forge.states      the states' storage: fp32, bf16 or int8 with scales, and loading them
    forge.functional  the kernels, called with explicit tensors and coefficients
    forge.wiring      which parameters are fused and which hooked
    forge.clip        global-norm clipping (updates deferred to the end of backward)
    forge.streams     fused updates on a second CUDA stream
    forge.data_parallel   each gradient reduced over the ranks before its update
    forge.guards      one backward per forward

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
Hyperparameters are checked as torch.optim checks them, for the defaults and every group, at
construction and again at the first update of each backward (before anything is updated there).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from forge import functional, guards, handles
from forge.data_parallel import REPLICAS, SHARDS, DataParallel, GradientReducer
from forge.distributed import is_dtensor, local, local_grad
from forge.states import StateStorage
from forge.steps import Steps, for_row_block
from forge.streams import UpdateStream
from forge.weights import check_param, weight_format
from forge.wiring import HookWiring

__all__ = ["ForgeOptimizer"]


class ForgeOptimizer(torch.optim.Optimizer):
    """Holds FORGE's param groups and states; the updates themselves run inside backward.

    `wiring`: what makes each parameter train (`forge.wiring`; `forge.attach` gives its
    ModelWiring, by default every parameter is hooked). `param_names`: names for messages and
    checkpoints. `data_parallel`: how gradients are shared between ranks (`forge.data_parallel`)."""

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
        from forge.rules import get_rule, resolve_hparams  # Triton code: loaded here, never at `import forge`

        self._resolve_hparams = resolve_hparams
        self.rule = get_rule(rule)
        self.weights = weight_format(master_weights, stochastic_rounding)  # forge.weights
        self.kahan, self.stochastic_rounding = self.weights.kahan, self.weights.stochastic_rounding
        self.storage = StateStorage(state_dtype, int8_group, self.kahan)
        _check_data_parallel_options(data_parallel, capturable, update_stream, max_grad_norm)
        self.data_parallel = data_parallel
        sharded = data_parallel is not None and data_parallel.kind == SHARDS
        self.steps = Steps(
            self.rule, seed, capturable, self._group_of_param, self._state_of, _mesh_rank if sharded else None
        )
        self._group_of: dict[torch.Tensor, dict] = {}
        self._slot_cache: dict[torch.Tensor, functional.Slots] = {}
        self._update_stream = UpdateStream() if update_stream else None
        self._clip = self._make_clip(max_grad_norm, norm_type, update_stream)
        self.param_names: dict[torch.Tensor, str] = dict(param_names or {})
        self._wiring = wiring if wiring is not None else HookWiring()
        self._wired = False  # until construction ends: then each new group is wired as it comes
        self._backward_check = guards.BackwardCheck(self.rule.name, lambda: self.param_groups)
        self.handle = handles.register(self)  # what torch.compile's ops name this optimizer by (forge.ops)
        super().__init__(params, resolve_hparams(self.rule, hparams))
        everything = [p for g in self.param_groups for p in g["params"]]
        self._reducer = None
        if data_parallel is not None and data_parallel.kind == REPLICAS:
            self._reducer = GradientReducer(
                everything, data_parallel.group, data_parallel.bucket_cap_mb, self._apply_gradient
            )
        self._wiring.wire(self, everything)
        self._wired = True

    def _make_clip(self, max_grad_norm, norm_type, update_stream):
        """max_grad_norm: global-norm clipping, the updates deferred to the end of backward (forge.clip)."""
        if max_grad_norm is None:
            return None
        from forge.clip import GlobalNormClip, check_clip_options

        if update_stream:
            raise ValueError(
                "update_stream=True overlaps each fused update with the dX GEMMs below it, but with "
                "max_grad_norm every update waits for the end of backward: there is nothing to overlap. "
                "Leave update_stream off with clipping."
            )
        return GlobalNormClip(self, *check_clip_options(max_grad_norm, norm_type))

    # ------------------------------------------------------------------ options

    @property
    def state_dtype(self) -> str:
        return self.storage.state_dtype

    @property
    def int8_group(self) -> int:
        return self.storage.int8_group

    @property
    def seed(self) -> int:
        """The seed every stochastic rounding draws from (with the parameter and the step)."""
        return self.steps.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.steps.seed = int(value)

    @property
    def capturable(self) -> bool:
        return self.steps.capturable

    # ------------------------------------------------------------------ groups and states

    def add_param_group(self, param_group: dict) -> None:
        if self._wired and self.data_parallel is not None:
            raise RuntimeError(
                "add_param_group under data parallelism: every rank must reduce the same parameters in the "
                "same buckets from the first backward on. Give every group to forge.attach(model, rule, "
                "params=[...]) instead; nothing was added."
            )
        options = {k: v for k, v in param_group.items() if k != "params"}
        # Reject unknown, unsupported or out-of-range options, and parameters FORGE cannot update,
        # before the group is added: a refused group leaves the optimizer as it was. The options are
        # checked with this optimizer's defaults filled in, as torch.optim fills them.
        defaults = {k: v for k, v in self.defaults.items() if k in self.rule.defaults}
        self._resolve_hparams(self.rule, {**defaults, **options})
        params = param_group["params"]
        if not isinstance(params, set):  # torch.optim refuses sets itself, with its message
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            param_group = {**param_group, "params": params}
            for p in params:
                if isinstance(p, torch.Tensor):
                    self._check_param(p)
        if self._wired:  # added after construction: the model must still be there to train them
            self._wiring.check_attached(self)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.update(self._resolve_hparams(self.rule, {k: group[k] for k in self.rule.defaults}))
        for p in group["params"]:
            self._check_param(p)
            self._group_of[p] = group
            self.steps.add(p)
            state = self.state[p]
            state["step"] = 0
            state.update(self.rule.host_state)
            self.storage.allocate(p, state, self.rule.slots(group), group)
        if self._wired:  # they train from the next backward on
            self._wiring.wire(self, group["params"])

    def _check_param(self, p: torch.Tensor) -> None:
        sharded = self.data_parallel is not None and self.data_parallel.kind == SHARDS
        check_param(self.name_of(p), p, self.weights, sharded=sharded, clipped=self._clip is not None)

    def name_of(self, p: torch.Tensor) -> str:
        return self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")

    def _group_of_param(self, p: torch.Tensor) -> dict:
        return self._group_of[p]

    def _state_of(self, p: torch.Tensor) -> dict:
        return self.state[p]

    def index_of(self, p: torch.Tensor) -> int:
        """p's position in this optimizer (the order parameters were added)."""
        return self.steps.index[p]

    def params_in_order(self) -> list[torch.Tensor]:
        """Every parameter, by `index_of`."""
        return list(self.steps.index)

    def state_dtype_of(self, p: torch.Tensor) -> str:
        """The storage of p's states (`forge.states`: a vector keeps bf16 states under int8)."""
        return self.storage.dtype_of(p)

    def slots_of(self, p: torch.Tensor) -> functional.Slots:
        """p's state tensors as the kernels take them, cached: they are updated in place only."""
        slots = self._slot_cache.get(p)
        if slots is None:
            slots = self.storage.slots_of(self.state[p], self.rule.slots(self._group_of[p]))
            self._slot_cache[p] = slots
        return slots

    def options_of(self, p: torch.Tensor) -> functional.UpdateOptions:
        """How p's rule runs now (its group's flags as they are)."""
        return functional.UpdateOptions(
            self.rule.device_name, self.rule.flags(self._group_of[p]), self.storage.dtype_of(p),
            self.stochastic_rounding, self.storage.int8_group,
        )  # fmt: skip

    def op_tensors(self, p: torch.Tensor) -> list[torch.Tensor]:
        """The tensors p's update mutates besides p: its state slots, their int8 scales, and its
        residual with compensated weights, in that order (torch.compile's ops declare them, `forge.ops`)."""
        slots = self.slots_of(p)
        return [t for t in (*slots.states, *slots.scales, slots.residual) if t is not None]

    def version(self, p: torch.Tensor) -> int:
        """How many updates `p` has received from this optimizer (guards double backward)."""
        return self.steps.version[p]

    # ------------------------------------------------------------------ the updates (called in backward)

    def update_linear(
        self,
        weight: torch.Tensor,
        dy: torch.Tensor,
        x: torch.Tensor,
        *,
        config=None,
        into: tuple | None = None,
        grad_scale: torch.Tensor | None = None,
    ) -> None:
        """One step of `weight` (N, K) from the gradient dy^T x (dy: (T, N), x: (T, K)), fused: what
        a ForgeLinear's backward runs. Advances the weight's step as a backward does. `config`: a
        `forge.kernels.KernelConfig` to launch under (benchmarks, the offline tuner); by default the
        shipped table's choice. `into`: (w, slots), the tensors to write the step into instead of
        `weight`'s own (torch.compile's custom op is handed functional copies: `forge.ops`); `weight`
        still names the parameter whose step count, hyperparameters and seed apply. With
        max_grad_norm `into` is not used: the step runs when the backward ends, after the compiled
        graph has written its copies back. `grad_scale`: a one-element fp32 tensor the product
        dy^T x is multiplied by (FP8 operands, T-contiguous, and their dequantization scale: `forge.fp8`).

        No torch.no_grad() here: nothing below is a torch op that autograd could record (the
        kernel writes through raw pointers), and the context manager cost each of the 225 calls of
        a Llama-3.1-8B step a few microseconds of host."""
        if self._reducer is not None:  # replicas: dW itself must be averaged over the ranks first
            if grad_scale is not None:
                raise ValueError("FORGE's data-parallel reducer takes bf16 or fp32 operands, not FP8 ones")
            self.update_elementwise(weight, (dy.t() @ x).to(local(weight).dtype))
            return
        if self._clip is not None:  # the norm now, the update when the backward ends (forge.clip)
            if grad_scale is not None:
                raise ValueError("FORGE's clipping takes bf16 or fp32 operands, not FP8 ones (forge.fp8)")
            self._check_once()
            self._clip.add_linear(weight, dy, x, config)
        elif self._update_stream is not None and dy.is_cuda:
            reads = (dy, x) if grad_scale is None else (dy, x, grad_scale)  # FP8: its scale too
            with self._update_stream.fork(*reads):
                self.fused_step(weight, dy, x, config, grad_scale, into=into)
        else:
            self.fused_step(weight, dy, x, config, grad_scale, into=into)

    def fused_step(self, weight, dy, x, config=None, grad_scale=None, *, into: tuple | None = None) -> None:
        """The fused kernel's launch for `weight`'s next step, now (`update_linear` decides when)."""
        coefficients, seed, row = self._begin_update(weight)
        target, slots = (local(weight), self.slots_of(weight)) if into is None else into
        functional.fused_wgrad_update(
            target, dy, x, slots, coefficients, seed, self.options_of(weight),
            step_row=row, grad_scale=grad_scale, config=config,
        )  # fmt: skip

    def row_block_updater(self, weight: torch.Tensor):
        """For a weight whose gradient comes a block of rows at a time (`forge.head`: lm_head a chunk
        of the vocabulary at a time): counts one step of `weight` now and returns
        `update(block, start, dy, x)`, which applies that step to rows start : start + dy.shape[1]
        from dy^T x inside their dW GEMM (dy: (T, rows), x: (T, K)). Each block is its own launch,
        its own stochastic-rounding seed (`forge.steps.for_row_block`); on the update stream where
        the optimizer has one. Refused, before anything is counted, with clipping (the global norm
        needs every gradient first), under data parallelism (the gradient is reduced whole) and for
        a sharded weight (`check_row_blocks`)."""
        self.check_row_blocks(weight)
        coefficients, seed, row = self._begin_update(weight)
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
            if self._update_stream is not None and dy.is_cuda:
                reads = (dy, x) if block_row is None else (dy, x, block_row)  # a block's row: a copy
                with self._update_stream.fork(*reads):
                    launch()
            else:
                launch()

        return update

    def check_row_blocks(self, weight: torch.Tensor) -> None:
        """Refuses what `row_block_updater` cannot do for `weight`, saying what to do instead."""
        if self._clip is not None:
            raise ValueError(
                "FORGE: a weight updated a block of rows at a time (forge.head) cannot be clipped by the "
                "global norm, which needs every gradient before any update. Drop max_grad_norm, or compute "
                "the loss from the logits (the head as an ordinary ForgeLinear)."
            )
        if self._reducer is not None:
            raise ValueError(
                "FORGE: under data parallelism a weight's gradient is reduced whole before its update, "
                "so forge.head cannot update lm_head a block of rows at a time: compute the loss from the "
                "logits (the head as an ordinary ForgeLinear)."
            )
        if is_dtensor(weight):
            raise ValueError(
                "FORGE: forge.head takes a whole lm_head weight, not a sharded (DTensor) one: leave "
                "lm_head out of the tensor-parallel plan, or compute the loss from the logits."
            )

    @torch.no_grad()
    def update_elementwise(self, p: torch.Tensor, grad: torch.Tensor, *, into: tuple | None = None) -> None:
        """One step of any parameter from its materialized gradient (element-wise kernel); with
        max_grad_norm, its norm now and the step when the backward ends (the gradient kept till then).
        Data-parallel replicas: the gradient goes to the reducer first, and the step follows once
        its mean over the ranks is known (`forge.data_parallel`). `into`: as for `update_linear`."""
        if self._reducer is not None:
            if into is not None:
                raise NotImplementedError(
                    "FORGE under data parallelism updates each parameter when its gradient's all-reduce "
                    "completes, outside any compiled graph: train the data-parallel model without "
                    "torch.compile's FORGE ops (or compile only its forward)"
                )
            self._check_once()
            self._reducer.add(p, grad)
        else:
            self._apply_gradient(p, grad, into=into)

    def _apply_gradient(self, p: torch.Tensor, grad: torch.Tensor, *, into: tuple | None = None) -> None:
        """The step of p from its complete gradient (reduced over the ranks where that applies)."""
        if self._clip is not None:
            self._check_once()
            self._clip.add_elementwise(p, grad)
        else:
            self.elementwise_step(p, grad, into=into)

    def elementwise_step(self, p, grad, grad_scale=None, *, into: tuple | None = None) -> None:
        """The element-wise kernel's launch for p's next step, now (`update_elementwise` decides when)."""
        coefficients, seed, row = self._begin_update(p)
        grad = local_grad(p, grad)  # a Partial gradient (sequence parallel) is all-reduced first
        target, slots = (local(p), self.slots_of(p)) if into is None else into
        if target.numel() == 0:  # an FSDP2 shard with no elements on this rank: its step still counts
            return
        functional.elementwise_update(
            target, grad, slots, coefficients, seed, self.options_of(p), step_row=row, grad_scale=grad_scale
        )

    def _begin_update(self, p: torch.Tensor) -> tuple[tuple, int, torch.Tensor | None]:
        """(coefficients, seed, step row) of p's next update, its step counted (`forge.steps`),
        once this backward has passed its checks."""
        self._check_once()
        return self.steps.begin(p)

    def _check_once(self) -> None:
        """This backward's checks, at its first update (`forge.guards.BackwardCheck`)."""
        self._backward_check.once()

    def prepare_replay(self) -> None:
        """Before each replay of a captured step: advance every parameter updated inside the capture
        by one step, and upload their coefficients and seeds to the device in one copy."""
        self.steps.prepare_replay()

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """With max_grad_norm: the total gradient norm of the last step, before clipping (a 0-dim
        fp32 tensor on the device, what clip_grad_norm_ returns); None before the first step."""
        return None if self._clip is None else self._clip.total_norm

    @property
    def last_clip_coefficient(self) -> torch.Tensor | None:
        """With max_grad_norm: the factor the last step's gradients were multiplied by,
        min(1, max_grad_norm / (norm + 1e-6)), a one-element fp32 tensor; None before the first step."""
        return None if self._clip is None else self._clip.coefficient

    # ------------------------------------------------------------------ torch.optim surface

    @torch.no_grad()
    def step(self, closure=None):
        """Nothing to do: FORGE applied the step during backward. Runs `closure` if given."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def state_dict(self) -> dict:
        """torch.optim's state dict, and under "forge" the options its states only make sense
        under (rule, state dtype, int8 group, weight format): `load_state_dict` checks them. Under
        data-parallel replicas, "bucket_order" too: the reducer's learned order (parameter indices,
        None before the first backward), which a resumed run needs to sum as the saved run did."""
        state = {**super().state_dict(), "forge": self.storage_options()}
        if self._reducer is not None:
            order, index = self._reducer.bucket_order(), {p: i for i, p in enumerate(self.params_in_order())}
            state["bucket_order"] = None if order is None else [index[p] for p in order]
        return state

    def storage_options(self) -> dict:
        return {"rule": self.rule.name, **self.storage.options(), "weights": self.weights.name}

    def load_state_dict(self, state_dict: dict, convert: bool = False) -> None:
        """Restore states in their own dtype (torch.optim's loader would cast them to the param's).
        A state dict saved under other options, or of other shapes, is refused before anything loads.

        convert=True loads a torch.optim state dict of the same rule instead, such as
        `torch.optim.AdamW(...).state_dict()`, to continue its run with FORGE: each state is
        converted into this optimizer's format (fp32 copied, bf16 rounded to nearest, int8
        quantized with fresh scales), a tensor step becomes a count, and of each group's settings
        only those this optimizer has are taken (lr, betas, weight_decay...). The parameters must
        come in the same groups and order as the saved optimizer's. Compensated weights keep
        their residual (the weights carry no more than the model holds)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        id_to_param = {}
        for saved, group in zip(saved_groups, self.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("loaded state dict has a group of a different size than this optimizer's")
            id_to_param.update(zip(saved["params"], group["params"]))
        bucket_order = self._saved_bucket_order(state_dict, id_to_param)
        if convert:
            for pid, saved_state in state_dict["state"].items():
                p = id_to_param[pid]
                slots = self.rule.slots(self._group_of[p])
                self.storage.convert(p, self.state[p], saved_state, slots, self.name_of(p), self.rule.name)
        else:
            self._check_saved(state_dict, id_to_param)
            for pid, saved_state in state_dict["state"].items():
                p = id_to_param[pid]
                self.storage.load(self.state[p], saved_state)
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != "params" and (not convert or k in group)})
        if self._reducer is not None:
            self._reducer.restore_bucket_order(bucket_order)

    def _saved_bucket_order(self, state_dict: dict, id_to_param: dict) -> list | None:
        """The reducer's saved order as parameters (None: none saved, learned in the next backward),
        checked before anything loads."""
        saved = state_dict.get("bucket_order")
        if self._reducer is None or saved is None:
            return None
        order = [id_to_param.get(i) for i in saved]
        self._reducer.check_bucket_order(order)
        return order

    def _check_saved(self, state_dict: dict, id_to_param: dict) -> None:
        """Refuse a FORGE state dict saved under other options or holding other shapes, whole."""
        saved_options, ours = state_dict.get("forge"), self.storage_options()
        if saved_options is not None and saved_options != ours:
            differ = ", ".join(f"{k}={saved_options.get(k)!r} (here {v!r})" for k, v in ours.items()
                               if saved_options.get(k) != v)  # fmt: skip
            raise ValueError(
                f"this state dict was saved by FORGE with {differ}: attach with the same rule, options, "
                "state_dtype and int8_group (and master_weights) as the run that saved it; nothing was loaded"
            )
        for pid, saved_state in state_dict["state"].items():
            p = id_to_param[pid]
            StateStorage.check_saved(self.state[p], saved_state, self.name_of(p))

    @torch.no_grad()
    def load_master_weights(self, weights: Iterable[torch.Tensor]) -> None:
        """Set every parameter from fp32 master weights, one per parameter in the order of
        `param_groups` (with `load_state_dict(..., convert=True)`, to continue an fp32-master run
        under FORGE). fp32 weights are copied; bf16 weights are rounded to nearest, and compensated
        ones (master_weights='bf16+kahan') keep what that rounding lost as their residual, so that
        weight + residual is the master to within bf16's precision of that difference."""
        params = [p for group in self.param_groups for p in group["params"]]
        weights = list(weights)
        if len(weights) != len(params):
            raise ValueError(
                f"got {len(weights)} master weights for {len(params)} parameters: give one per "
                "parameter, in the order of param_groups"
            )
        for p, master in zip(params, weights):
            if is_dtensor(p):
                raise ValueError("load_master_weights sets plain tensors; a DTensor parameter holds a shard")
            if tuple(master.shape) != tuple(p.shape):
                raise ValueError(
                    f"the master weight for {self.param_names.get(p, 'a parameter')} has shape "
                    f"{tuple(master.shape)}, not {tuple(p.shape)}"
                )
        for p, master in zip(params, weights):
            master = master.to(device=p.device, dtype=torch.float32)
            local(p).copy_(master)
            if self.kahan:
                local(self.state[p]["weight_residual"]).copy_(master - local(p).float())


def _check_data_parallel_options(
    data_parallel: DataParallel | None, capturable: bool, update_stream: bool, max_grad_norm
) -> None:
    """Refuse the options FORGE does not run under data parallelism, saying what to do instead."""
    if data_parallel is None:
        return
    how = "data-parallel replicas" if data_parallel.kind == REPLICAS else "FSDP2"
    if capturable:
        raise ValueError(
            f"capturable=True under {how}: the updates wait for collectives issued from the host as the "
            "backward goes, which a captured CUDA graph would replay without their host side. Train "
            "eagerly (capturable=False)."
        )
    if update_stream:
        raise ValueError(
            f"update_stream=True under {how}: it overlaps the fused dW kernel, which data parallelism "
            "does not run (each gradient is reduced first). Leave update_stream off."
        )
    if max_grad_norm is not None and data_parallel.kind == SHARDS:
        raise NotImplementedError(
            "max_grad_norm under FSDP2: the global norm needs every rank's shard norms summed before any "
            "update, which FORGE does not yet do. Train FSDP2 without max_grad_norm, or clip under DDP "
            "(forge.attach(DDP(model), ..., max_grad_norm=...)), where it is exact."
        )


def _mesh_rank(p: torch.Tensor) -> int:
    """A number for this rank's shard of the DTensor p (0 for a plain tensor): its mesh coordinate."""
    if not is_dtensor(p):
        return 0
    coordinate = p.device_mesh.get_coordinate() or [0]
    rank = 0
    for size, c in zip(p.device_mesh.shape, coordinate):
        rank = rank * size + c
    return rank
