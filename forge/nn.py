"""ForgeLinear: an nn.Linear whose backward applies its optimizer step inside the dW GEMM.

Backward of `y = x W^T + b` for x (T, K), W (N, K), dy (T, N), in this order:
  1. dx = dy W with the OLD weight (cuBLAS), because the next step overwrites W;
  2. one launch of the fused kernel (`forge.kernels.wgrad_update`): dW accumulates tile by tile in
     fp32 registers and is consumed there by the optimizer update; W and the states are written
     back; dW is never stored and the weight's `.grad` stays None;
  3. the bias gradient dy.sum(0) is returned as usual: a post-accumulate-grad hook on the bias
     hands it to the optimizer, which updates it with the backward's other vectors when the
     backward ends (`forge.wiring`, `forge.vectors`).

The layer knows its optimizer only as a `forge.interface.FusedUpdater`: the backward asks it for
the weight's update count (`version`) and hands it dy and x (`update_linear`).

Host cost. Eagerly this module runs at every layer of every step, on the host's critical path
where a layer's GPU work is short, so it does little: `ForgeLinear.forward` reads its parameters
from `_parameters` (not through nn.Module's `__getattr__`) and asks for autocast once, and the
backward hands dy and x to the optimizer, whose launch for this weight is kept from step to step
(`forge.functional`).

Eager training (the module in training mode) with an input that requires grad (every layer of a
model above its embedding), a plain weight and no saved-tensor hooks takes no Python autograd node
at all (`_hooked_linear`): the forward is torch's own linear of the weight detached (kept from step
to step while the weight's storage stays where it was), so torch's C++ GEMM node computes dx from
the old W and no dW, and a post-hook on that node (`_FusedUse`, called once dx exists) hands dy and x to the
optimizer. The same arithmetic as the Function below (torch's dx and bias-gradient GEMMs and
reductions, the same fused launch), without its Python node in the forward and the backward. The
use the guards record (`_FusedUse`) holds the node until its hook has run, and the node holds it:
a graph dropped without a backward is freed by Python's garbage collector, not at once, which is
why a module in eval mode (where forwards without a backward are the rule) keeps the Function. The
Function stays for every other case: an input that requires no grad, saved-tensor hooks, FP8,
tensor-parallel shards, functorch transforms and tracing, where `forge_linear` calls autograd's
own apply (torch's Python wrapper only hands the arguments on, in eager mode without functorch
transforms), and a 2-D layer takes no reshape.
`tests/forge/test_launch_counts.py` counts what a layer calls.

Mixed precision. Under torch.autocast the input is cast to the autocast dtype before the
Function (as autocast's linear does), the forward's F.linear casts the weight, and the backward
gets dy and the saved x in that dtype: the kernel's tensor-core path, with dW accumulated in fp32
and applied to the fp32 weight without ever being rounded to bf16.

Activation checkpointing. Torch's non-reentrant checkpoint stops recomputing a region as soon as
every tensor its backward needs is back. An aten matmul saves its input before it computes, so
the recompute stops in front of a region's last linear; a custom autograd.Function saves its
inputs only after its forward has returned, so that linear's GEMM would run and be thrown away
(measured: 32 GEMMs, ~43 ms a step on Llama-3.1-8B at batch 4, seq 2048). Under saved-tensor hooks
(checkpointing, offloading) `forge_linear` therefore saves x in a small identity Function in front
of the GEMM (`_SavedInput`), whose save ends the recompute there, and the backward reads x from
that node; without hooks one node does both (a second Python node costs the host ~30-50 us).

Guards. A raw Triton write does not bump a tensor's autograd version counter, so autograd would not
notice a weight updated twice. The forward records how many updates the weight had (the Function's
ctx, or the hooked path's `_FusedUse`); the backward refuses to run if that number moved (a second
backward through a retained graph, or one weight used twice in a graph): applying the step twice,
or computing dx from an already-updated weight, would silently train something else. The forward also records its node, and the first FORGE update of
each backward refuses such a graph before any parameter is updated (`forge.optim`), so a refusal
never leaves a half-stepped model. Activation checkpointing re-runs only the forward, which has no side
effects here, so it composes.

torch.compile. While Dynamo traces (torch 2.11 and later: `COMPILE_OPS`), `ForgeLinear.forward`
calls the custom ops of `forge.ops` instead of this Function: `forge::linear`, whose backward
`forge::linear_backward` computes dx from the old weight and runs the fused update with the weight
and its states as arguments declared mutated (on torch 2.11 the states only; `forge.ops` says
why). A compiled model is one graph, with no graph break at its linear layers, and trains as the
eager one: the same step counts and learning rates (a scheduler's change applies at the next
backward), the same updates up to the summation order of the kernels Inductor generates. Eager
training keeps the Function, and so do the tensor-parallel and FP8 forwards and torch before 2.11,
compiled or not: while compiling, its backward calls the optimizer through
`torch.compiler.disable`, a graph break per linear (measured on torch 2.11 before its ops: it
trains as eager, to the summation order of Inductor's kernels).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from forge import fp8 as forge_fp8
from forge import guards
from forge.distributed import COLWISE, is_dtensor, linear_layout, local
from forge.interface import CompiledUpdater, FusedUpdater

_PLAIN = (torch.Tensor, nn.Parameter)  # the types of a weight that is no DTensor, told apart without a call

# torch.compile traces the custom ops from torch 2.11 on (2.11 with the weight left out of the
# backward op's declared mutations, `forge.ops.WEIGHT_LISTED`); before, this Function runs between
# compiled regions instead, behind a graph break per linear.
COMPILE_OPS = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 11)


_UPDATED_TWICE = (
    "FORGE: {} was already updated since this forward pass. A second backward through the same graph "
    "(retain_graph=True), or one nn.Linear called twice in a forward, would apply the optimizer step "
    "twice. FORGE needs one backward per forward and one use of each fused weight; leave this "
    "parameter out of forge.attach(params=...) to give it an ordinary gradient."
)


class ForgeLinearFunction(torch.autograd.Function):
    """y = x W^T + b whose backward updates W in place instead of returning dW."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias,
        updater: FusedUpdater,
        name: str,
        saved_ahead: bool,
        fp8: bool = False,
    ):
        # saved_ahead: x is the output of `_SavedInput`, whose node holds x for the backward
        # fp8: the three GEMMs on FP8 tensor cores (`forge.fp8`)
        if saved_ahead:
            ctx.input_node = x.grad_fn
        else:
            ctx.input_node = None
            if not fp8:
                ctx.save_for_backward(x)
        # The Parameter itself, not a saved tensor: under activation checkpointing saved tensors come
        # back as recomputed aliases, and the optimizer keys its state by the Parameter object.
        ctx.weight, ctx.updater, ctx.name, ctx.fp8 = weight, updater, name, fp8
        ctx.version = updater.version(weight)
        # a tensor-parallel shard: its local rows or columns (a plain tensor's type says it is none)
        ctx.sharded = sharded = type(weight) not in _PLAIN and is_dtensor(weight)
        if not torch.compiler.is_compiling():
            guards.record_use(ctx)  # checked at the backward's first update (`forge.guards`)
        if fp8:  # saves x's FP8 copy (1 byte an element) instead of x, unless x is saved ahead
            y, x8 = forge_fp8.forward(x, weight, save_input=not saved_ahead)
            if x8 is not None:
                ctx.save_for_backward(*x8)
            ctx.input_shape = x.shape
            return y if bias is None else y + bias.to(y.dtype)
        return F.linear(x, weight.to_local() if sharded else weight, bias)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        # The host's path between autograd and the kernel launch: every line here runs for each
        # fused layer of every step, on the autograd engine's thread, under the GIL.
        weight, updater = ctx.weight, ctx.updater
        if updater.version(weight) != ctx.version:
            raise RuntimeError(_UPDATED_TWICE.format(ctx.name))
        input_node, needs = ctx.input_node, ctx.needs_input_grad
        saved = ctx.saved_tensors if input_node is None else input_node.saved_tensors
        dy2 = dy if dy.dim() == 2 else dy.reshape(-1, dy.shape[-1])  # (T, N)
        dx = db = grad_scale = None
        if needs[2]:  # a bias that requires grad
            db = dy2.sum(0)
        if ctx.fp8:  # dx in FP8; dy and x as T-major FP8 copies for the fused kernel, with their scale
            if input_node is not None:  # x itself, saved ahead: cast again
                saved = saved[0].reshape(-1, ctx.input_shape[-1])
            dx, dy2, x2, grad_scale = forge_fp8.backward(dy2, saved, weight, needs[0])
            dx = None if dx is None else dx.reshape(ctx.input_shape)
        else:
            (x,) = saved
            x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # (T, K)
            if needs[0]:
                w = weight.to_local() if ctx.sharded else weight  # the old W, before the update
                # dy of any rank against W (cast only under autocast): matmul folds the leading dims
                # into the GEMM's rows, the same mm as on (T, N), without a reshape from Python
                dx = dy @ (w if w.dtype == dy.dtype else w.to(dy.dtype))
                if dx.dtype != x.dtype:
                    dx = dx.to(x.dtype)
        if torch.compiler.is_compiling():
            _fused_step_outside_graph(updater, weight, dy2, x2, grad_scale)
        else:  # eager: no disable wrapper (4% of a profiled ForgeLinear step on the GPU)
            updater.update_linear(weight, dy2, x2, grad_scale=grad_scale)
        guards.release_use(ctx)
        return dx, None, db, None, None, None, None


class _SavedInput(torch.autograd.Function):
    """x unchanged; saves it for the ForgeLinearFunction that consumes it (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor):
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx: torch.Tensor):
        return dx


# The saved-tensor hooks in force here (activation checkpointing, offloading), or None where there
# are none; None itself on a torch that cannot say.
_TOP_SAVED_TENSOR_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def forge_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    updater: FusedUpdater,
    name: str,
    fp8: bool = False,
):
    """y = x W^T + b through ForgeLinearFunction, with x saved ahead of the GEMM under saved-tensor
    hooks (x must require grad for `_SavedInput` to keep a node); `fp8`: its GEMMs in FP8."""
    saved_ahead = (
        x.requires_grad and _TOP_SAVED_TENSOR_HOOKS is not None and _TOP_SAVED_TENSOR_HOOKS(False) is not None
    )
    if saved_ahead:
        x = _SavedInput.apply(x)
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return ForgeLinearFunction.apply(x, weight, bias, updater, name, saved_ahead, fp8)
    return _APPLY(x, weight, bias, updater, name, saved_ahead, fp8)


# The nodes of torch's own linear that compute dx from W (x @ W^T, with or without a bias).
_GEMM_NODES = frozenset(("MmBackward0", "AddmmBackward0"))


def _hooked_linear(x: torch.Tensor, weight: torch.Tensor, detached: torch.Tensor, bias, updater: FusedUpdater,
                   name: str):
    """y = x W^T + b as torch's linear of `detached` (W detached), whose GEMM node computes dx from
    the old W and, in a post-hook, hands dy and x to the fused update (`_FusedUse`); None, nothing
    recorded, where that node is not found within the views that fold x's leading dimensions (then
    `ForgeLinearFunction` computes y again). No Python autograd node, and no dW GEMM in torch's
    backward (the detached W takes no gradient): see `ForgeLinear.forward` for when it runs."""
    y = F.linear(x, detached, bias)
    node = y.grad_fn
    for _ in range(3):  # 2-D: the GEMM's own node; N-D: below the view that unfolds its rows
        if type(node).__name__ in _GEMM_NODES:
            break
        functions = node.next_functions
        node = functions[0][0] if functions else None
        if node is None:
            return None
    else:
        return None
    use = _FusedUse()  # its fields set here rather than by an __init__: one frame less a layer
    use.weight, use.updater, use.name, use.version = weight, updater, name, updater.version(weight)
    use.x, use.x_version, use.graph_node = x, x._version, node
    node.register_hook(use)
    guards.record_use(use)
    return y


class _FusedUse:
    """One forward's use of a fused weight through torch's GEMM node (`_hooked_linear`): what the
    guards read (`forge.guards`: the weight, its optimizer, its update count at the forward, its
    name, and the node as `graph_node`), and, called as the node's post-hook once it has computed
    dx, the fused update of W from dy (the node's output gradient) and x (while compiled autograd
    traces the hook, outside its graph, as the Function's backward steps while compiling)."""

    __slots__ = ("weight", "updater", "name", "version", "x", "x_version", "graph_node", "__weakref__")

    def __call__(self, grad_inputs, grad_outputs) -> None:
        weight, updater, x = self.weight, self.updater, self.x
        if updater.version(weight) != self.version:
            raise RuntimeError(_UPDATED_TWICE.format(self.name))
        if x._version != self.x_version:
            raise RuntimeError(
                f"FORGE: the input of {self.name}'s layer was modified by an inplace operation after its "
                "forward; its fused update needs that input as the forward saw it (clone it before "
                "modifying it)"
            )
        dy = grad_outputs[0]  # (T, N): the GEMM's rows, x's leading dimensions folded
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if torch.compiler.is_compiling():  # compiled autograd traces this hook: the step outside its graph
            _fused_step_outside_graph(updater, weight, dy, x2, None)
        else:
            updater.update_linear(weight, dy, x2)
        if guards.release_use(self):  # no second backward: drop x, and the node (a reference cycle)
            self.x = self.graph_node = None


# `ForgeLinearFunction.apply` past torch's Python wrapper, which in eager mode without functorch
# transforms only hands its arguments on to this, autograd's own apply (Dynamo and functorch see
# the wrapper: `forge_linear` calls it for them).
_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, ForgeLinearFunction)


def _fused_step_outside_graph(
    updater: FusedUpdater,
    weight: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    grad_scale: torch.Tensor | None,
) -> None:
    """The fused step while torch.compile traces the backward: outside its graph."""
    _outside_graph()(updater, weight, dy, x, grad_scale)


@functools.cache
def _outside_graph():
    """`update_linear` under `torch.compiler.disable`, built on first use: the decorator imports
    torch._dynamo (a second of import), which eager training never needs."""
    return torch.compiler.disable(
        lambda updater, weight, dy, x, scale: updater.update_linear(weight, dy, x, grad_scale=scale)
    )


# What fusing adds to an nn.Linear module (`ForgeLinear.fuse`) and `unfuse` removes. The first is
# also the attribute a model holds its optimizer in (`forge.wiring.ATTACHED`): a model that is itself
# a fused nn.Linear loses both at once.
_FUSED_ATTRIBUTES = (
    "_forge_optimizer",
    "_forge_name",
    "_forge_handle",
    "_forge_index",
    "_forge_states",
    "_forge_marker",
    "_forge_fp8",
    "_forge_detached",
)


class ForgeLinear(nn.Linear):
    """nn.Linear trained by FORGE. `forge.attach` turns nn.Linear modules into this class in place
    (same parameters, same module object, `fuse`) and `forge.detach` turns them back (`unfuse`).

    Beside the optimizer, a fused layer carries what torch.compile's ops read instead of it
    (`forge.ops`): the optimizer's handle, the weight's index in it and its state tensors, plain
    attributes Dynamo reads as constants and graph inputs."""

    _forge_optimizer: CompiledUpdater | None = None
    _forge_name = "weight"
    _forge_fp8 = False  # its GEMMs in FP8 (`forge.attach(..., fp8=...)`, `forge.fp8`)
    _forge_detached: torch.Tensor | None = None  # the weight detached, for `_hooked_linear` (`forward`)

    @classmethod
    def fuse(cls, module: nn.Linear, updater: CompiledUpdater, name: str, fp8: bool = False) -> ForgeLinear:
        """Make the nn.Linear `module` a ForgeLinear whose weight `updater` trains; `name`: the
        weight's name in messages; `fp8`: its GEMMs in FP8."""
        module.__class__ = cls
        module.bind(updater, name, fp8)
        return module

    def bind(self, updater: CompiledUpdater, name: str, fp8: bool) -> None:
        """Train this layer's weight with `updater` from the next forward on (see `fuse`)."""
        weight = self.weight
        self._forge_fp8 = fp8
        self._forge_optimizer = updater
        self._forge_name = name
        self._forge_handle, self._forge_index = updater.handle, updater.index_of(weight)
        self._forge_states = updater.slots_of(weight).tensors()
        self._forge_marker = torch.empty(0, device=weight.device)  # torch 2.11's op (`forge.ops`) mutates it

    def unfuse(self) -> None:
        """A plain nn.Linear again, its weight as trained."""
        self.__class__ = nn.Linear
        for attr in _FUSED_ATTRIBUTES:
            self.__dict__.pop(attr, None)

    @property
    def fp8(self) -> bool:
        """Whether this layer's three GEMMs run in FP8 (`forge.attach(..., fp8=...)`, `forge.fp8`)."""
        return self._forge_fp8

    @property
    def forge_updater(self) -> CompiledUpdater | None:
        """The optimizer that trains this layer's weight inside its backward (None once detached)."""
        return self.__dict__.get("_forge_optimizer")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        opt = self._forge_optimizer
        params = self._parameters  # what `self.weight` finds after nn.Module's __getattr__, directly
        weight, bias = params["weight"], params["bias"]
        if opt is None or not torch.is_grad_enabled():
            return F.linear(x, weight, bias)
        if type(weight) not in _PLAIN and is_dtensor(weight):  # sharded by a tensor-parallel plan
            return tp_linear_forward(x, weight, bias, opt, self._forge_name)
        fp8 = self._forge_fp8
        if torch.compiler.is_compiling():
            x = autocast_input(x)
            if COMPILE_OPS and not fp8:  # traced: the custom ops of `forge.ops`
                from forge.ops import forge_linear_op

                states, handle, index = self._forge_states, self._forge_handle, self._forge_index
                return forge_linear_op(x, weight, bias, states, handle, index, self._forge_marker)
        else:
            if torch._C._is_any_autocast_enabled():  # eager: one call says there is no autocast to follow
                x = autocast_input(x)
            if (
                self.training and not fp8 and x.requires_grad and type(weight) in _PLAIN
                and _TOP_SAVED_TENSOR_HOOKS is not None
                and _TOP_SAVED_TENSOR_HOOKS(False) is None and not torch._C._are_functorch_transforms_active()
            ):  # fmt: skip
                detached = self._forge_detached  # W detached, kept while W's storage stays where it was
                if detached is None or detached.data_ptr() != weight.data_ptr():
                    detached = self._forge_detached = weight.detach()
                y = _hooked_linear(x, weight, detached, bias, opt, self._forge_name)
                if y is not None:
                    return y
        return forge_linear(x, weight, bias, opt, self._forge_name, fp8)


def updater_of(module: nn.Module) -> CompiledUpdater | None:
    """The optimizer that trains `module`'s weight inside its backward, or None (not a ForgeLinear)."""
    return module.forge_updater if isinstance(module, ForgeLinear) else None


def _global_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of a tensor of `shape`."""
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(stride))


def tp_linear_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, updater: FusedUpdater, name: str
) -> torch.Tensor:
    """ForgeLinear's forward when its weight is sharded colwise (Shard(0)) or rowwise (Shard(1)), on
    the local shards (`forge.distributed` says why that is exact)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    if not is_dtensor(x):
        raise RuntimeError(
            f"FORGE: {name} has a sharded DTensor weight but received a plain tensor. Parallelize the layer "
            "with ColwiseParallel/RowwiseParallel (their input hooks hand it a DTensor) so that FORGE knows "
            "the input's layout."
        )
    mesh, layout = weight.device_mesh, linear_layout(name, weight)
    last = x.ndim - 1
    out_shape = (*x.shape[:-1], weight.shape[0])
    if layout == COLWISE:
        # x replicated; dx = sum_r dy_r W_r is a partial sum on each rank: DTensor all-reduces it.
        x_local = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
        y_local = forge_linear(x_local, weight, local(bias), updater, name)
        return DTensor.from_local(
            y_local, mesh, [Shard(last)], run_check=False, shape=out_shape, stride=_global_stride(out_shape)
        )
    # ROWWISE: x sharded on its last dim; y is a partial sum (DTensor reduces it in the output hook);
    # its gradient comes back replicated (DTensor's rule for Partial), so dW_r = dy^T x_r is complete.
    x_local = x.redistribute(mesh, [Shard(last)]).to_local(grad_placements=[Shard(last)])
    y_local = forge_linear(x_local, weight, None, updater, name)
    y = DTensor.from_local(
        y_local, mesh, [Partial()], run_check=False, shape=out_shape, stride=_global_stride(out_shape)
    )
    return y if bias is None else y + bias  # a replicated bias: added once, by DTensor's rules


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """Under torch.autocast, x in the autocast dtype, as autocast's own linear casts it: the forward
    saves that copy, so the backward hands the fused kernel bf16 operands (tensor cores, fp32
    accumulation) and keeps half the activation bytes; the weight stays the fp32 Parameter."""
    device_type = x.device.type
    if not x.is_floating_point() or not torch.is_autocast_enabled(device_type):
        return x
    return x.to(torch.get_autocast_dtype(device_type))
