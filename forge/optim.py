"""ForgeOptimizer: the torch.optim.Optimizer face of FORGE.

With FORGE the update happens during `loss.backward()`: each nn.Linear weight inside its fused
weight-gradient kernel (`forge.nn`), every other parameter in a post-accumulate-grad hook that runs
the element-wise kernel and drops the gradient at once. This class owns what an optimizer owns
(param groups with their hyperparameters, per-parameter state and step counters, `state_dict`) so
that the tools built around torch.optim keep working:

* LR schedulers change `param_groups[i]["lr"]`; the next backward reads it.
* `state_dict()` / `load_state_dict()` round-trip the states bit for bit, in their storage dtype
  (torch.optim's loader would cast them to the parameter's dtype: here it does not).
* `step()` and `zero_grad()` are allowed and do nothing (the step already happened), so an
  ordinary training loop runs unchanged.

CUDA graphs. With `capturable=True` every update reads its coefficients and seed from a row of
device memory (one int32 row per parameter) instead of taking them as launch arguments, so a
forward + backward captured once under `torch.cuda.graph` can be replayed for every later step:

    opt = forge.attach(model, "adamw", lr=1e-4, capturable=True)
    ...eager warm-up steps on a side stream, then: with torch.cuda.graph(g): model(x).loss.backward()
    for batch in data:
        static_x.copy_(batch)
        opt.prepare_replay()  # advance every captured parameter's step, upload the step's values
        g.replay()

Outside a capture, an update in capturable mode advances its step on the host and writes its row
just before its kernel (so warm-up steps run the same kernels the graph will); inside a capture it
only records the parameter, and `prepare_replay` does the host's part for all of them at once.
Replayed steps are bit-identical to eager ones: the same host arithmetic, the same fp32 values.

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

States per parameter, named as torch.optim names them (`exp_avg`, `exp_avg_sq`, `momentum_buffer`,
`square_avg`, `grad_avg`, `sum`), are allocated when the optimizer is built, in `state_dtype`:
fp32, bf16, or int8 codes plus `<name>_absmax` scales (one per `int8_group` elements along the
last dim: 64 by default, or 128 for half the scales' memory at ~20% more quantization error,
docs/how-forge-works.md).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable

import torch

from forge.backend import interpreting
from forge.data_parallel import REPLICAS, SHARDS, DataParallel, GradientReducer
from forge.distributed import check_param, check_sharded_param, is_dtensor, like_param, local, local_grad
from forge.streams import UpdateStream

STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": None}
# how bf16 weights keep their precision: stochastic rounding, round to nearest, or a bf16 residual
# (None: as `stochastic_rounding` says)
MASTER_WEIGHTS = (None, "bf16+sr", "bf16", "bf16+kahan")
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)
INT8_GROUPS = (64, 128)  # elements per int8 scale (forge.kernels.quant)


class ForgeOptimizer(torch.optim.Optimizer):
    """Holds FORGE's param groups and states; the updates themselves run inside backward."""

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
        **hparams,
    ):
        # FORGE's first use of Triton: its kernels load here (`forge.backend` decides, as they do,
        # whether they run compiled or in Triton's CPU interpreter), never at `import forge`.
        from forge import kernels
        from forge.rules import get_rule, resolve_hparams

        self._kernels = kernels
        self._resolve_hparams = resolve_hparams
        self.rule = get_rule(rule)
        if state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"state_dtype={state_dtype!r} is not supported; choose one of {list(STATE_DTYPES)}"
            )
        if int8_group not in INT8_GROUPS:
            raise ValueError(
                f"int8_group={int8_group!r} is not supported; choose one of {list(INT8_GROUPS)} "
                "(elements per int8 scale)"
            )
        self.state_dtype = state_dtype
        self.int8_group = int(int8_group)
        if master_weights not in MASTER_WEIGHTS:
            raise ValueError(
                f"master_weights={master_weights!r} is not supported; choose one of {list(MASTER_WEIGHTS)} "
                "(None: as stochastic_rounding says)"
            )
        if master_weights is not None:
            stochastic_rounding = master_weights == "bf16+sr"
        # compensated bf16 weights: a bf16 residual beside each weight (forge.kernels.update_tile)
        self.kahan = master_weights == "bf16+kahan"
        self.stochastic_rounding = bool(stochastic_rounding) and not self.kahan
        self.seed = int(seed)
        # data parallelism (`forge.data_parallel`): None, replicas (FORGE all-reduces each gradient
        # before its update) or FSDP2 shards (FSDP2 reduce-scatters, FORGE updates the local shard)
        self.data_parallel = data_parallel
        self._reducer: GradientReducer | None = None
        _check_data_parallel_options(data_parallel, capturable, update_stream, max_grad_norm)
        self._version: dict[torch.Tensor, int] = {}
        self._index: dict[torch.Tensor, int] = {}
        self._group_of: dict[torch.Tensor, dict] = {}
        self._slot_cache: dict[torch.Tensor, tuple] = {}
        # capturable: each parameter's step row on the device, and the parameters updated inside a
        # capture (in order; a dict as an ordered set), which `prepare_replay` advances
        self.capturable = bool(capturable)
        self._step_rows: torch.Tensor | None = None
        self._captured: dict[torch.Tensor, None] = {}
        # update_stream: fused updates on a second CUDA stream, beside the dX GEMMs (forge.streams)
        self._update_stream = UpdateStream() if update_stream else None
        # max_grad_norm: global-norm clipping, the updates deferred to the end of backward (forge.clip)
        self._clip = None
        if max_grad_norm is not None:
            from forge.clip import GlobalNormClip, check_clip_options

            if update_stream:
                raise ValueError(
                    "update_stream=True overlaps each fused update with the dX GEMMs below it, but with "
                    "max_grad_norm every update waits for the end of backward: there is nothing to overlap. "
                    "Leave update_stream off with clipping."
                )
            self._clip = GlobalNormClip(self, *check_clip_options(max_grad_norm, norm_type))
        # Names for messages (and checkpoint keys); forge.attach fills them in before __init__.
        self.param_names: dict[torch.Tensor, str] = getattr(self, "param_names", {})
        # Wiring (see `_wire`): forge.attach sets `_owner` (a weak reference to the model) before
        # __init__ and fuses or hooks the first groups itself; built directly, the optimizer hooks
        # every parameter itself. Either way a later add_param_group wires its parameters too.
        self._owner = getattr(self, "_owner", None)
        self._hooks: list = []
        self._wired = False
        self._checked_task = -1  # the last backward (autograd graph task) whose groups were checked
        # an integer that names this optimizer where an object cannot go: torch.compile's custom ops
        self.handle = next(_HANDLES)
        _BY_HANDLE[self.handle] = self
        super().__init__(params, resolve_hparams(self.rule, hparams))
        if data_parallel is not None and data_parallel.kind == REPLICAS:
            params_in_order = [p for g in self.param_groups for p in g["params"]]
            self._reducer = GradientReducer(
                params_in_order, data_parallel.group, data_parallel.bucket_cap_mb, self._apply_gradient
            )
        self._wired = True
        if self._owner is None:
            self._wire([p for g in self.param_groups for p in g["params"]])

    # ------------------------------------------------------------------ groups and states

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_wired", False) and self.data_parallel is not None:
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
        if self._wired:
            self._wirable()
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.update(self._resolve_hparams(self.rule, {k: group[k] for k in self.rule.defaults}))
        for p in group["params"]:
            self._check_param(p)
            self._index[p] = len(self._index)
            self._group_of[p] = group
            self._version[p] = 0
            self._init_state(p, group)
        if self._wired:  # added after construction: its parameters train from the next backward on
            self._wire(group["params"])

    def _wirable(self) -> None:
        """Refuse a new group that could not be trained (the model FORGE was attached to is gone)."""
        from forge.attach import attached_model  # forge.attach imports this module

        if self._owner is not None:
            attached_model(self)

    def _wire(self, params: list) -> None:
        """Make `params` train: fused into the kernel of their nn.Linear where the model is known,
        updated from a post-accumulate-grad hook otherwise (see `forge.attach`)."""
        from forge.attach import wire  # forge.attach imports this module

        wire(self, params)

    def _check_param(self, p: torch.Tensor) -> None:
        name = self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")
        if self.data_parallel is not None and self.data_parallel.kind == SHARDS:
            check_sharded_param(name, p)  # FSDP2: sharded over its mesh (2-D with TP), any placement
        else:
            check_param(name, p)  # a tensor-parallel DTensor: 1-D mesh, sharded or replicated
        if self._clip is not None and is_dtensor(p):
            raise NotImplementedError(
                f"{name} is a tensor-parallel DTensor, and FORGE's max_grad_norm does not yet reduce the "
                "norm over the ranks of a mesh. Attach without max_grad_norm for tensor-parallel training."
            )
        if self.kahan and p.dtype != torch.bfloat16:
            raise TypeError(
                f"{name} has dtype {p.dtype}; master_weights='bf16+kahan' compensates bf16 weights. Convert "
                "the model to bf16 (model.to(torch.bfloat16)) first, or leave master_weights unset for "
                "fp32 weights, which need no compensation."
            )
        if p.dtype not in WEIGHT_DTYPES:
            raise TypeError(
                f"{name} has dtype {p.dtype}; FORGE updates fp32 and bf16 weights only. "
                "Convert the model (model.to(torch.bfloat16) or .float()) before forge.attach."
            )
        if not p.is_contiguous():
            raise ValueError(
                f"{name} is not contiguous; FORGE updates weights in place and needs them contiguous"
            )
        if p.device.type == "cpu" and not interpreting():
            raise RuntimeError(
                f"{name} is on the CPU but Triton's interpreter is off. Move the model to a CUDA device, "
                "or set TRITON_INTERPRET=1 before FORGE's first use to run the kernels on the CPU (slow)."
            )
        if p.device.type not in ("cuda", "cpu"):
            raise RuntimeError(
                f"{name} is on {p.device}; FORGE's kernels run on CUDA devices (or the CPU interpreter)"
            )

    def _slots(self, group: dict):
        return self.rule.slots(group)

    def state_dtype_of(self, p: torch.Tensor) -> str:
        """The storage of p's states: `state_dtype`, but int8 quantizes weights of two or more
        dimensions only; a vector (norm weight, bias: a few thousandths of a percent of a transformer's
        parameters) keeps bf16 states, so that its 64-element scale groups never straddle the shards
        of FSDP2, which splits vectors along their one dimension."""
        return "bf16" if self.state_dtype == "int8" and p.dim() < 2 else self.state_dtype

    def _init_state(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        state["step"] = 0
        state.update(self.rule.host_state)
        shard = local(p)  # a DTensor's states hold only this rank's shard, laid out like p
        if self.kahan:  # what the weight's rounding to bf16 lost: nothing yet
            state["weight_residual"] = like_param(p, torch.zeros_like(shard))
        state_dtype = self.state_dtype_of(p)
        for slot in self._slots(group):
            if slot is None:
                continue
            init = group.get("initial_accumulator_value", 0.0) if slot.name == "sum" else 0.0
            if state_dtype == "int8":
                values = torch.full_like(shard, init, dtype=torch.float32)
                codes, scale = self._kernels.quant.quantize(values, slot.signed, self.int8_group)
                state[slot.name] = like_param(p, codes)
                state[slot.name + "_absmax"] = like_param(p, scale, scale_group=self.int8_group)
            else:
                state[slot.name] = like_param(
                    p, torch.full_like(shard, init, dtype=STATE_DTYPES[state_dtype])
                )

    def _slot_tensors(self, p: torch.Tensor, group: dict):
        """(states, scales, signed) for the kernels, cached: the tensors are updated in place only."""
        cached = self._slot_cache.get(p)
        if cached is None:
            state = self.state[p]
            slots = self._slots(group)
            states = tuple(local(state[s.name]) if s else None for s in slots)
            scales = tuple(local(state.get(s.name + "_absmax")) if s else None for s in slots)
            signed = tuple(bool(s and s.signed) for s in slots)
            cached = self._slot_cache[p] = (states, scales, signed)
        return cached

    # ------------------------------------------------------------------ the updates (called in backward)

    def _begin_update(self, p: torch.Tensor):
        """(group, coefficients, seed, step row) of p's next update; advances its step. The row is
        None unless capturable; inside a CUDA-graph capture nothing advances (the replays will)."""
        group = self._group_of[p]
        self._check_once()
        if not self.capturable:
            return (group, *self._advance(p, group), None)
        row = self._step_row(p)
        if _capturing(p):
            self._captured[p] = None
            return group, self._no_coefficients(), 0, row
        coefficients, seed = self._advance(p, group)
        row.copy_(_step_values([coefficients], [seed], row.shape[0])[0], non_blocking=True)
        return group, coefficients, seed, row

    def _check_backward(self) -> None:
        """At this optimizer's first update in a backward, before it touches anything: every group's
        hyperparameters (a scheduler or a user may have changed them since construction) and every
        fused nn.Linear this backward will reach (each used once, from a forward at its current
        step). A refusal here leaves every weight, state and step count as it was."""
        task = torch._C._current_graph_task_id()
        if task >= 0:  # else a direct call, outside any backward
            from forge.rules import check_hparams

            for group in self.param_groups:
                check_hparams(self.rule.name, group)
            _check_linear_uses(task)
        self._checked_task = task  # only once passed: a refused backward is refused at every update

    def record_use(self, node) -> None:
        """ForgeLinearFunction's forward: `node` (its ctx, the graph's backward node) may run a fused
        update of `node.weight` in a later backward."""
        _LINEAR_USES.add(node)

    def release_use(self, node) -> None:
        """ForgeLinearFunction's backward, after the update: its graph is freed, so `node` cannot run
        again, unless the backward retains the graph (then a second backward is refused)."""
        if not _keep_graph():
            _LINEAR_USES.discard(node)

    def _advance(self, p: torch.Tensor, group: dict) -> tuple[tuple, int]:
        """Count one more step of p; return its coefficients and seed for that step."""
        state = self.state[p]
        state["step"] += 1
        self._version[p] += 1
        return self.rule.coefficients(group, state["step"], state), self._seed_for(p, state["step"])

    def _step_row(self, p: torch.Tensor) -> torch.Tensor:
        """p's row of the step values (allocated, for every parameter, at the first update)."""
        rows = self._step_rows
        if rows is None or rows.shape[0] < len(self._index):
            device = local(p).device
            if _capturing(p):
                raise RuntimeError(
                    "FORGE: the first update of a capturable optimizer happened inside a CUDA-graph "
                    "capture. Run at least one eager step (the usual warm-up on a side stream) before "
                    "capturing, so that its buffers and kernels exist outside the graph."
                )
            devices = {local(q).device for q in self._index}
            if len(devices) != 1 or (device.type != "cuda" and not interpreting()):
                raise RuntimeError(
                    "FORGE: capturable=True needs every parameter on one CUDA device, found "
                    f"{sorted(map(str, devices))}"
                )
            rows = torch.zeros((len(self._index), self._kernels.STEP_ROW), dtype=torch.int32, device=device)
            self._step_rows = rows
        return rows[self._index[p]]

    def prepare_replay(self) -> None:
        """Before each replay of a captured step: advance every parameter updated inside the capture
        by one step, and upload their coefficients and seeds to the device in one copy."""
        if not self.capturable:
            raise RuntimeError(
                "prepare_replay() is for capturable optimizers: forge.attach(..., capturable=True)"
            )
        if not self._captured:
            raise RuntimeError(
                "prepare_replay(): no FORGE update has been captured yet. Capture a forward and backward "
                "under torch.cuda.graph with this optimizer attached, then call it before each replay."
            )
        rows = self._step_rows
        coefficient_rows = [self._no_coefficients()] * rows.shape[0]  # rows the graph does not read stay zero
        seeds = [0] * rows.shape[0]
        for p in self._captured:
            i = self._index[p]
            coefficient_rows[i], seeds[i] = self._advance(p, self._group_of[p])
        rows.copy_(_step_values(coefficient_rows, seeds, rows.shape[1]), non_blocking=True)

    def _no_coefficients(self) -> tuple:
        """The coefficients a captured launch is given: zeros (it reads its own from its step row)."""
        from forge.rules import NUM_COEFFICIENTS

        return (0.0,) * NUM_COEFFICIENTS

    def _seed_for(self, p: torch.Tensor, step: int) -> int:
        """A per-step, per-tensor Philox seed: fixed seed -> reproducible bits. An FSDP2 shard mixes in
        its rank, so that shards draw independent bits (replicas must draw the same ones)."""
        x = (self.seed * 0x9E3779B1 + self._index[p] * 0x85EBCA77 + step * 0xC2B2AE3D) & 0xFFFFFFFF
        if self.data_parallel is not None and self.data_parallel.kind == SHARDS and is_dtensor(p):
            x = (x + _mesh_rank(p) * 0x27D4EB2F) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
        return (x ^ (x >> 13)) & 0x7FFFFFFF

    def _kernel_options(self, group: dict, p: torch.Tensor | None = None) -> dict:
        """The kernels' rule options for a parameter of `group` (`p`: its states' storage; a weight's
        by default)."""
        return dict(
            rule=self.rule.name,
            flags=self.rule.flags(group),
            state_dtype=self.state_dtype if p is None else self.state_dtype_of(p),
            stochastic_rounding=self.stochastic_rounding,
            int8_group=self.int8_group,
        )

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
        shipped table's choice. `into`: (w, states, scales[, residual]), tensors to write the step
        into instead of `weight`'s own (torch.compile's custom op is handed functional copies:
        `forge.ops`), three slots each as `_slot_tensors` gives them; `weight` still names the
        parameter whose step count, hyperparameters and seed apply. With max_grad_norm `into` is
        not used: the step runs when the backward ends, after the compiled graph has written its
        copies back. `grad_scale`: a one-element fp32 tensor the product dy^T x is multiplied by
        (FP8 operands, T-contiguous, and their dequantization scale: `forge.fp8`).

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
                self._fused_update(weight, dy, x, config, grad_scale, into=into)
        else:
            self._fused_update(weight, dy, x, config, grad_scale, into=into)

    def _fused_update(
        self,
        weight: torch.Tensor,
        dy: torch.Tensor,
        x: torch.Tensor,
        config=None,
        grad_scale: torch.Tensor | None = None,
        into: tuple | None = None,
    ) -> None:
        group, coefficients, seed, row = self._begin_update(weight)
        states, scales, signed = self._slot_tensors(weight, group)
        target, residual = local(weight), self._residual(weight)
        if into is not None:
            target, states, scales, residual = _unpack_into(into, residual)
        options = dict(
            self._kernel_options(group, weight), step_values=row, config=config, grad_scale=grad_scale
        )
        self._kernels.wgrad_update(
            target, states, scales, signed, dy, x, coefficients, seed, residual=residual, **options
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
            self._elementwise_step(p, grad, into=into)

    def _elementwise_step(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        grad_scale: torch.Tensor | None = None,
        into: tuple | None = None,
    ) -> None:
        group, coefficients, seed, row = self._begin_update(p)
        states, scales, signed = self._slot_tensors(p, group)
        grad = local_grad(p, grad)  # a Partial gradient (sequence parallel) is all-reduced first
        target, residual = local(p), self._residual(p)
        if into is not None:
            target, states, scales, residual = _unpack_into(into, residual)
        if target.numel() == 0:  # an FSDP2 shard with no elements on this rank: its step still counts
            return
        options = dict(self._kernel_options(group, p), step_values=row, grad_scale=grad_scale)
        self._kernels.elementwise_update(
            target, grad, states, scales, signed, coefficients, seed, residual=residual, **options
        )

    def _residual(self, p: torch.Tensor) -> torch.Tensor | None:
        """p's bf16 residual with compensated weights (master_weights='bf16+kahan'), else None."""
        return local(self.state[p]["weight_residual"]) if self.kahan else None

    def op_tensors(self, p: torch.Tensor) -> list[torch.Tensor]:
        """The tensors p's update mutates besides p: its state slots, their int8 scales, and its
        residual with compensated weights, in that order (torch.compile's ops declare them, `forge.ops`)."""
        states, scales, _ = self._slot_tensors(p, self._group_of[p])
        residual = self._residual(p)
        return [t for t in (*states, *scales, residual) if t is not None]

    def _check_once(self) -> None:
        """`_check_backward` at this backward's first deferred update, as `_begin_update` does."""
        if torch._C._current_graph_task_id() != self._checked_task:
            self._check_backward()

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

    def version(self, p: torch.Tensor) -> int:
        """How many updates `p` has received from this optimizer (guards double backward)."""
        return self._version[p]

    # ------------------------------------------------------------------ torch.optim surface

    @torch.no_grad()
    def step(self, closure=None):
        """Nothing to do: FORGE applied the step during backward. Runs `closure` if given."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def load_state_dict(self, state_dict: dict, convert: bool = False) -> None:
        """Restore states in their own dtype (torch.optim's loader would cast them to the param's).

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
        load = self._convert_param_state if convert else self._load_param_state
        for pid, saved_state in state_dict["state"].items():
            load(id_to_param[pid], saved_state)
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != "params" and (not convert or k in group)})

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
                name = self.param_names.get(p, "a parameter")
                raise ValueError(
                    f"the master weight for {name} has shape {tuple(master.shape)}, not {tuple(p.shape)}"
                )
        for p, master in zip(params, weights):
            master = master.to(device=p.device, dtype=torch.float32)
            local(p).copy_(master)
            if self.kahan:
                local(self.state[p]["weight_residual"]).copy_(master - local(p).float())

    @torch.no_grad()
    def _convert_param_state(self, p: torch.Tensor, saved: dict) -> None:
        """One parameter's torch.optim state, converted into this optimizer's slots."""
        state = self.state[p]
        name = self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")
        slots = {slot.name: slot for slot in self._slots(self._group_of[p]) if slot is not None}
        host = {k for k, v in state.items() if not isinstance(v, torch.Tensor)}  # step, NAdam's mu_product
        unknown = sorted(set(saved) - set(slots) - host)
        missing = sorted(set(slots) - set(saved))
        if unknown or missing:
            raise ValueError(
                f"the state of {name} has {sorted(saved)}, this optimizer's {self.rule.name} keeps "
                f"{sorted(slots)}: convert=True loads the state of the same rule (with its options, e.g. no "
                "amsgrad), as torch.optim saves it"
            )
        if is_dtensor(p):
            raise ValueError(f"{name} is a DTensor: convert=True loads the states of plain tensors")
        for key in host & set(saved):
            value = saved[key]
            state[key] = type(state[key])(value.item() if isinstance(value, torch.Tensor) else value)
        for key, slot in slots.items():
            value = saved[key]
            if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                shape = tuple(getattr(value, "shape", ()))
                raise ValueError(
                    f"state {key!r} of {name} is {type(value).__name__} {shape}, "
                    f"not a tensor of shape {tuple(p.shape)}"
                )
            value = value.to(device=p.device, dtype=torch.float32)
            if self.state_dtype_of(p) == "int8":
                codes, scale = self._kernels.quant.quantize(value, slot.signed, self.int8_group)
                state[key].copy_(codes)
                state[key + "_absmax"].copy_(scale)
            else:
                state[key].copy_(value)

    def _load_param_state(self, p: torch.Tensor, saved: dict) -> None:
        state = self.state[p]
        name = self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")
        for key, value in saved.items():
            current = state.get(key)
            if isinstance(current, torch.Tensor):
                if (
                    not isinstance(value, torch.Tensor)
                    or value.shape != current.shape
                    or value.dtype != current.dtype
                ):
                    raise ValueError(
                        f"state {key!r} of {name} was saved as {getattr(value, 'dtype', type(value))} "
                        f"{tuple(getattr(value, 'shape', ()))}, this optimizer holds {current.dtype} "
                        f"{tuple(current.shape)}: attach with the same rule, options, state_dtype and "
                        "int8_group as the run that saved it"
                    )
                current.copy_(value)
            else:
                state[key] = value


def _unpack_into(into: tuple, residual):
    """(w, states, scales, residual) from an `into` of three (the residual as it was) or four."""
    return (*into, residual) if len(into) == 3 else into


_HANDLES = itertools.count(1)
_BY_HANDLE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def optimizer_of(handle: int) -> ForgeOptimizer:
    """The live optimizer whose `handle` this is (`forge.ops`), or a RuntimeError."""
    optimizer = _BY_HANDLE.get(handle)
    if optimizer is None:
        raise RuntimeError("FORGE: the optimizer of this compiled model has been garbage-collected")
    return optimizer


# Fused-linear uses (ForgeLinearFunction nodes) whose backward may still run, over every optimizer:
# one weight used twice in a graph, or a retained graph run again, is refused at the first FORGE
# update of that backward, before any parameter of any model has been updated.
_LINEAR_USES: weakref.WeakSet = weakref.WeakSet()
_checked_uses_task = [-1]


def _keep_graph() -> bool:
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if keep is None else bool(keep())


def _check_linear_uses(task: int) -> None:
    if _checked_uses_task[0] == task:
        return
    seen = {}
    for node in list(_LINEAR_USES):
        try:
            if not torch._C._will_engine_execute_node(node):
                continue
        except RuntimeError:  # not the eager autograd engine (compiled autograd): the backward's own guard
            return
        weight, optimizer = node.weight, node.optimizer
        untouched = "; nothing has been updated by this backward (weights, states and steps are as they were)"
        if optimizer.version(weight) != node.version:
            raise RuntimeError(
                f"FORGE: {node.name} was already updated since this forward pass: a second backward through "
                "the same graph (retain_graph=True) would apply the optimizer step twice, and compute the "
                f"input gradient from the updated weight. FORGE needs one backward per forward{untouched}."
            )
        if id(weight) in seen:
            raise RuntimeError(
                f"FORGE: {node.name} is used twice in this graph (one nn.Linear called twice in a forward, "
                "or two forwards through it before one backward). Its fused update consumes the gradient of "
                "one use, and dx of the other would come from the updated weight. Leave this parameter out "
                "of forge.attach(params=...) to give it an ordinary gradient, or call the module once per "
                f"forward{untouched}."
            )
        seen[id(weight)] = node
    _checked_uses_task[0] = task


def _capturing(p: torch.Tensor) -> bool:
    """Whether work issued now is being captured into a CUDA graph (never on a CPU tensor)."""
    return p.is_cuda and torch.cuda.is_current_stream_capturing()


def _step_values(coefficient_rows: list, seeds: list, words: int) -> torch.Tensor:
    """Step rows of `words` int32 in host memory, pinned where CUDA exists: the coefficients as fp32
    bits first (words 0-8, rounded from Python's floats as a launch argument is), then the seed. A
    fresh tensor each call: the pinned-memory allocator keeps it until the copy that reads it has run."""
    n = len(coefficient_rows[0])  # forge.rules.NUM_COEFFICIENTS
    values = torch.zeros((len(seeds), words), dtype=torch.int32)
    values[:, :n] = torch.tensor(coefficient_rows, dtype=torch.float32).view(torch.int32)
    values[:, n] = torch.tensor(seeds, dtype=torch.int32)
    return values.pin_memory() if torch.cuda.is_available() else values


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
    """A number for this rank's shard of the DTensor p: its coordinate on p's mesh, flattened."""
    coordinate = p.device_mesh.get_coordinate() or [0]
    rank = 0
    for size, c in zip(p.device_mesh.shape, coordinate):
        rank = rank * size + c
    return rank
