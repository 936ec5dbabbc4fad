"""FORGE's updates as torch.library custom ops: the path a ForgeLinear takes under torch.compile.

Eager training runs `forge.nn.ForgeLinearFunction`, whose backward launches the fused kernel
through raw pointers, invisible to autograd. A compiler must instead see what a step reads and
writes, so while torch.compile traces, `ForgeLinear.forward` calls these ops, whose schemas say so:

    forge::linear(x, weight, bias, states, handle, index) -> y
        y = x W^T + b (F.linear); mutates nothing. Its autograd formula (`register_autograd`)
        saves x, W and the states, and its backward is the next op.
    forge::linear_backward(dy, x, weight!, states!, handle, index, needs_dx, has_bias) -> (dx, db)
        dx = dy W with the OLD weight and db = dy.sum(0), then one launch of the fused dW GEMM +
        update kernel (`forge.kernels.wgrad_update`), which writes W and the states in place: both
        are arguments of the op, declared mutated (`mutates_args`).
    forge::linear_backward_unlisted_weight(dy, x, weight, states!, ...) -> (dx, db)
        the same on torch 2.11, whose AOTAutograd traces the write-back of a backward's mutation
        into a Parameter with grad mode on and so refuses it ("a leaf Variable that requires grad
        is being used in an in-place operation"; torch 2.13 traces it under no_grad): the weight
        is written as the eager Function writes it, unseen by the compiler, and an empty per-layer
        marker, declared mutated with the states, keeps the op alive and its guards working.
    forge::elementwise_update(param!, grad, states!, handle, index)
        the element-wise step of a parameter that is not a fused weight, for a post-accumulate-grad
        hook traced by compiled autograd (`elementwise_update_op`).

So Dynamo traces a FORGE model into one graph: the forward ops in it, the optimizer's state
tensors read as graph inputs, and AOTAutograd puts the update ops into the compiled backward,
functionalized (`auto_functionalized`) and written back like any mutation of an input; Inductor
re-inplaces them into the Parameter and its states where it can. The version counters of the
tensors an op mutates move, so autograd's own saved-tensor check refuses a second backward through
a retained graph, and AOTAutograd refuses, while compiling, a graph that uses one nn.Linear twice
(the eager Function's guards in `forge.nn`, with autograd's message).

The optimizer is no op argument. `handle` is an integer into a registry of weak references (a
garbage-collected optimizer drops out of it), found at trace time and guarded by the optimizer's
identity; `index` is the parameter's position in the optimizer (`index_of`), not its identity, since
the op may be handed functional copies of the tensors it mutates. The implementation therefore
writes into the tensors it is given and takes only the step count, the hyperparameters and the
step's coefficients from the optimizer, when the op runs, not when it is traced: every backward
advances the step, and an LR scheduler's change applies from the next backward, without a recompile.

What it costs: one Python call per op when the graph runs, and the states' guards (tensor checks,
as for any input). Eager training never imports this module: `forge.nn` does, at the first forward
that torch.compile traces.

Not covered yet. Inductor's CUDA graphs (mode="reduce-overhead") would replay the ops without their
host half (the step count, the lr): the update ops are tagged `cudagraph_unsafe`, which Inductor's
graph partitioning (on by default) reads to leave them out of the graphs it captures; not yet
verified on a GPU. Tensor-parallel (DTensor) weights keep the eager Function, behind a graph break.
Compiled autograd traces post-accumulate-grad hooks too, and `forge.attach`'s calls the optimizer's
launcher, which Dynamo cannot trace: under compiled autograd only models whose every trained
parameter is a fused weight train; `elementwise_update_op` is what such a hook would call instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from forge.functional import Slots
from forge.handles import optimizer_of
from forge.interface import CompiledUpdater

_NOT_NEEDED = (0,)  # the shape of an output the backward does not need (an op returns tensors)
_UPDATE_TAGS = (torch.Tag.cudagraph_unsafe,)  # host work at each run: never replayed from a graph
# torch 2.12 and later trace a backward op that writes a Parameter; 2.11 gets the op below that
# does not list the weight among its mutations (`linear_backward_unlisted_weight`)
WEIGHT_LISTED = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 12)


# ---------------------------------------------------------------------- the optimizer by handle


def _lookup(handle: int, index: int) -> tuple[CompiledUpdater, Tensor]:
    """(optimizer, its parameter number `index`), when an op runs."""
    optimizer = optimizer_of(handle)
    return optimizer, optimizer.param_at(index)


def _kernel_slots(optimizer: CompiledUpdater, p: Tensor, tensors: list[Tensor]) -> Slots:
    """p's `Slots` for a kernel (`forge.functional`), with `tensors` (in the order of
    `Slots.tensors`) in place of p's own."""
    return optimizer.slots_of(p).with_tensors(tensors)


# ---------------------------------------------------------------------- the updates


def _linear_update(
    optimizer: CompiledUpdater, p: Tensor, weight: Tensor, tensors: list[Tensor], dy: Tensor, x: Tensor
) -> None:
    """`ForgeOptimizer.update_linear` of p, written into `weight` and `tensors` (p and its states,
    or functional copies of them)."""
    optimizer.update_linear(p, dy, x, into=(weight, _kernel_slots(optimizer, p, tensors)))


# ---------------------------------------------------------------------- the ops


@torch.library.custom_op("forge::linear", mutates_args=())
def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, states: list[Tensor], handle: int, index: int
) -> Tensor:
    """y = x W^T + b. The states, handle and index are for the backward."""
    if weight.dtype != x.dtype:  # autocast: x comes cast (`forge.nn.autocast_input`), W is cast here
        weight = weight.to(x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
    return F.linear(x, weight, bias)


@linear.register_fake
def _(x, weight, bias, states, handle, index):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _fake_backward(dy, x, weight, states, handle, index, needs_dx, has_bias):
    dx = torch.empty_like(x) if needs_dx else dy.new_empty(_NOT_NEEDED)
    db = dy.new_empty(dy.shape[-1]) if has_bias else dy.new_empty(_NOT_NEEDED)
    return dx, db


def _backward_op(name: str, weight_listed: bool):
    """The backward op of `forge::linear`, declaring the weight mutated or not (`WEIGHT_LISTED`)."""

    @torch.library.custom_op(
        name, mutates_args=("weight", "states") if weight_listed else ("states",), tags=_UPDATE_TAGS
    )
    def backward(
        dy: Tensor,
        x: Tensor,
        weight: Tensor,
        states: list[Tensor],
        handle: int,
        index: int,
        needs_dx: bool,
        has_bias: bool,
    ) -> tuple[Tensor, Tensor]:
        """(dx, db) from the weight as the forward used it, then the fused update of the weight and
        `states` in place; dx or db is an empty tensor where not needed."""
        optimizer, p = _lookup(handle, index)
        if not weight_listed:
            weight = p  # written as the eager Function writes it (below)
        dy2 = dy.reshape(-1, dy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        dx = db = None
        if needs_dx:  # before the update
            dx = (dy2 @ (weight if weight.dtype == dy2.dtype else weight.to(dy2.dtype))).reshape(x.shape)
            dx = dx.to(x.dtype)
        if has_bias:
            db = dy2.sum(0)
        _linear_update(optimizer, p, weight, states, dy2, x2)
        # two distinct tensors where not needed: an op's outputs may not alias each other
        dx = dy.new_empty(_NOT_NEEDED) if dx is None else dx
        return dx, dy.new_empty(_NOT_NEEDED) if db is None else db

    backward.register_fake(_fake_backward)
    return backward


linear_backward = _backward_op("forge::linear_backward", weight_listed=True)
# torch 2.11's AOTAutograd cannot trace a backward that writes a Parameter (`forge.nn.COMPILE_OPS`),
# so there the op declares the states mutated, not the weight, and the update writes the weight
# through the registry, as the eager Function writes it behind autograd's back. Nothing else in a
# backward reads a fused weight (dx is taken in the op, before the update; a weight used twice is
# refused), so no other op can be ordered against that write. `states` always holds a tensor, the
# layer's empty `_forge_marker` (`forge_linear_op`): an op whose declared mutations were all empty
# and whose dx and db went unused would be dropped as dead code, and its update with it; and the
# marker's version, saved by the forward, is what refuses a second backward through a retained
# graph or a second use of one weight in a graph, where the weight's own version no longer moves.
linear_backward_unlisted_weight = _backward_op("forge::linear_backward_unlisted_weight", weight_listed=False)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, states, handle, index = inputs
    ctx.save_for_backward(x, weight, *states)
    ctx.handle, ctx.index, ctx.has_bias, ctx.num_states = handle, index, bias is not None, len(states)


def _backward(ctx, dy: Tensor):
    x, weight, *states = ctx.saved_tensors
    needs_dx, needs_db = ctx.needs_input_grad[0], ctx.has_bias and ctx.needs_input_grad[2]
    backward = linear_backward if WEIGHT_LISTED else linear_backward_unlisted_weight
    dx, db = backward(dy, x, weight, states, ctx.handle, ctx.index, needs_dx, needs_db)
    return (dx if needs_dx else None), None, (db if needs_db else None), [None] * ctx.num_states, None, None


linear.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("forge::elementwise_update", mutates_args=("param", "states"), tags=_UPDATE_TAGS)
def elementwise_update(param: Tensor, grad: Tensor, states: list[Tensor], handle: int, index: int) -> None:
    """`ForgeOptimizer.update_elementwise` of parameter `index`, written into `param` and `states`."""
    optimizer, p = _lookup(handle, index)
    optimizer.update_elementwise(p, grad, into=(param, _kernel_slots(optimizer, p, states)))


@elementwise_update.register_fake
def _(param, grad, states, handle, index):
    return None


# ---------------------------------------------------------------------- what forge calls


def forge_linear_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    states: list[Tensor],
    handle: int,
    index: int,
    marker: Tensor,
) -> Tensor:
    """A ForgeLinear's forward through `forge::linear` (`forge.nn` calls it while compiling), from
    what the layer carries: its optimizer's handle, the weight's index and state tensors, and the
    layer's empty marker (set by `ForgeLinear.bind`). Traced through the optimizer, Dynamo would
    guard on its state dicts (and recompile every step), and torch 2.11's cannot pass an optimizer
    object to a function it runs while tracing."""
    if not WEIGHT_LISTED:  # the marker stands in for the weight as the mutation a second use would see
        states = [*states, marker]
    return linear(x, weight, bias, states, handle, index)


def elementwise_update_op(optimizer: CompiledUpdater, p: Tensor, grad: Tensor) -> None:
    """`optimizer.update_elementwise(p, grad)` through `forge::elementwise_update`: for a
    post-accumulate-grad hook while compiled autograd traces it."""
    elementwise_update(p, grad, optimizer.slots_of(p).tensors(), optimizer.handle, optimizer.index_of(p))
