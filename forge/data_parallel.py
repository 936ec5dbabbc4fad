"""FORGE under data parallelism: replicas (DDP) and shards (FSDP2), built on torch.distributed.

Why the fused kernel does not run here. Under data parallelism the step must use the MEAN of the
weight gradient over the ranks, dW = (1/P) sum_r dy_r^T x_r, and a rank's registers only ever hold
its own tokens' term. Either dW crosses the network (an all-reduce or a reduce-scatter of every
layer's gradient), or the operands dy and x do (each rank gathers every rank's and runs the fused
kernel over P x T tokens). docs/distributed.md compares the two; FORGE reduces the gradient, so each
parameter's gradient exists for a short, bounded window, and the update is FORGE's element-wise
kernel (the same rule, states, stochastic rounding and int8 storage as the fused one) applied to the
reduced gradient. What survives of FORGE's saving is that no rank ever holds the whole model's
gradient, where DDP + AdamW holds it from the backward to `step()`.

Replicas, `forge.attach(model, ..., process_group=pg)` or `forge.attach(DDP(model), ...)`. Every
trained parameter gets FORGE's post-accumulate-grad hook; the hook hands its gradient to
`GradientReducer`, which groups gradients into buckets (`bucket_cap_mb`, DDP's default of 25 MiB),
multiplies each by 1/P and all-reduces the bucket asynchronously, as DDP's reducer does, and, once
the bucket is reduced, updates its parameters from the mean and drops the gradients. Buckets are
launched in one fixed order on every rank (so the collectives pair up whatever order the gradients
arrive in): the reverse of the parameters' order for the first backward, then the order in which
rank 0's gradients arrived in it, an order saved and restored with the optimizer's state (a resumed
run must sum as the saved one did). At most `MAX_IN_FLIGHT` buckets are being reduced while the next
fills, so the gradients alive at once are bounded by (MAX_IN_FLIGHT + 1) buckets, and one bucket more
for the moment a bucket's gradients are concatenated (`GradientReducer.bound_bytes`; a parameter
larger than a bucket is a bucket of its own). A DDP wrapper handed to `attach` is taken over: its
own gradient synchronization is switched off and its reducer, whose bucket buffers hold a whole
gradient, is released (`take_over_ddp`); its forward stays as it was, and so does its broadcast of
rank 0's buffers before each forward.

Shards, FSDP2 (`torch.distributed.fsdp.fully_shard`, then `forge.attach(model, ...)`). FSDP2
reduce-scatters each group's gradients itself and, since torch 2.5, runs the post-accumulate-grad
hooks of the sharded parameters right after it assigns their sharded gradient. FORGE's hook updates
the rank's shard from it with the rank's own sharded states and frees it: weights, states and
gradients stay sharded, and no sharded gradient outlives its group's reduce-scatter.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from forge.guards import at_backward_end, backward_task

# What the reducer calls for each parameter once its gradient's mean over the ranks is known: its step.
Apply = Callable[[torch.Tensor, torch.Tensor], None]

REPLICAS, SHARDS = "replicas", "shards"
MAX_IN_FLIGHT = 2  # buckets being all-reduced while the next one fills
DEFAULT_BUCKET_CAP_MB = 25.0  # DDP's default bucket size


@dataclass(frozen=True)
class DataParallel:
    """How an optimizer's gradients are shared between ranks: `kind` REPLICAS (FORGE all-reduces
    them over `group`, in buckets of `bucket_cap_mb`) or SHARDS (FSDP2 reduce-scatters them)."""

    kind: str
    group: Any = None
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB

    @property
    def world_size(self) -> int:
        """Ranks of the replicas' group (FSDP2's mesh is its own affair)."""
        import torch.distributed as dist

        return dist.get_world_size(self.group)


# ---------------------------------------------------------------------------------- finding out


def resolve(
    model: nn.Module, process_group: Any, bucket_cap_mb: float
) -> tuple[nn.Module, DataParallel | None]:
    """(the module to attach to, how its gradients are shared) for `forge.attach`'s arguments.

    A DDP wrapper gives its module and process group (and is taken over); a model holding FSDP2
    modules gives SHARDS; `process_group` gives REPLICAS over it (None: no data parallelism, as
    for a group of one rank). Refuses, before anything changes, what FORGE cannot train this way."""
    _check_bucket_cap(bucket_cap_mb)
    if isinstance(model, nn.DataParallel):
        raise RuntimeError(
            "forge.attach got an nn.DataParallel model (one process driving several GPUs). Use "
            "DistributedDataParallel with one process per GPU (torchrun) and attach FORGE to it, or pass "
            "the plain model with process_group=..."
        )
    _refuse_fsdp1(model)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        if process_group is not None and process_group is not model.process_group:
            raise ValueError(
                "forge.attach got a DDP-wrapped model and a process_group that is not the wrapper's: "
                "leave process_group out (FORGE reduces over the wrapper's group)"
            )
        parallel = DataParallel(REPLICAS, model.process_group, bucket_cap_mb)
        take_over_ddp(model)
        return model.module, (parallel if parallel.world_size > 1 else None)
    if is_fully_sharded(model):
        if process_group is not None:
            raise ValueError(
                "forge.attach got a model sharded with FSDP2 (fully_shard) and a process_group: FSDP2 "
                "reduce-scatters the gradients over its own mesh; leave process_group out"
            )
        return model, DataParallel(SHARDS)
    if process_group is None:
        return model, None
    parallel = DataParallel(REPLICAS, process_group, bucket_cap_mb)
    if parallel.world_size == 1:
        return model, None
    broadcast_from_first_rank(model, process_group)
    return model, parallel


def check_new_group(parallel: DataParallel | None) -> None:
    """Refuse a param group added after construction under data parallelism: every rank must reduce
    the same parameters in the same buckets from the first backward on."""
    if parallel is not None:
        raise RuntimeError(
            "add_param_group under data parallelism: every rank must reduce the same parameters in the "
            "same buckets from the first backward on. Give every group to forge.attach(model, rule, "
            "params=[...]) instead; nothing was added."
        )


def _check_bucket_cap(bucket_cap_mb: Any) -> None:
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, int | float) or not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r}: give a positive size in MiB (DDP's default: 25)")


def is_fully_sharded(model: nn.Module) -> bool:
    """Whether `model` holds modules sharded by FSDP2's `fully_shard`."""
    if "torch.distributed.fsdp" not in sys.modules:  # nothing was sharded without importing it
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def _refuse_fsdp1(model: nn.Module) -> None:
    if "torch.distributed.fsdp" not in sys.modules:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    for module in model.modules():
        if isinstance(module, FullyShardedDataParallel):
            raise RuntimeError(
                "forge.attach got a model wrapped in FullyShardedDataParallel (FSDP1), whose flat "
                "parameters FORGE cannot address one by one. Shard it with FSDP2 instead "
                "(torch.distributed.fsdp.fully_shard on each block, then on the model) and attach FORGE "
                "after sharding."
            )


# ---------------------------------------------------------------------------------- replicas


class _NoReducer:
    """Stands in for a taken-over DDP wrapper's reducer: its forward asks only whether to rebuild
    buckets (no); anything else would mean DDP synchronizing gradients FORGE already reduced."""

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str):
        raise RuntimeError(
            f"DDP tried to use its reducer ({name}) after forge.attach took over its gradient "
            "synchronization. FORGE reduces and applies every gradient during backward; do not re-enable "
            "require_backward_grad_sync or register DDP comm hooks on a FORGE-attached model."
        )


def take_over_ddp(ddp: nn.parallel.DistributedDataParallel) -> None:
    """Switch off `ddp`'s own gradient synchronization and release its reducer (and the bucket
    buffers it allocated, a whole gradient's size); its forward keeps working, and so does its
    broadcast of rank 0's buffers before each forward (`_sync_buffers_as_ddp_does`).

    Refused, before anything changes: a wrapper built with static_graph=True (its first backward
    goes through the reducer FORGE releases), a Python reducer or delayed all-reduce (compiled DDP)."""
    remove_hooks = getattr(ddp, "_remove_autograd_hooks", None)
    if remove_hooks is None or not hasattr(ddp, "reducer"):
        raise RuntimeError(
            "this torch's DistributedDataParallel has no reducer FORGE knows how to switch off. Attach "
            "FORGE to the plain model instead: forge.attach(model, ..., process_group=pg)."
        )
    if getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "_delay_all_reduce_all_params", False):
        raise RuntimeError(
            "FORGE cannot take over a DDP wrapper built with a Python reducer or delayed all-reduce "
            "(compiled DDP). Attach FORGE to the plain model instead: forge.attach(model, ..., "
            "process_group=pg)."
        )
    if getattr(ddp, "static_graph", False):
        raise RuntimeError(
            "FORGE cannot take over a DDP wrapper built with static_graph=True: in static-graph mode DDP "
            "all-reduces the first backward's gradients from its own reducer, which FORGE releases. Wrap "
            "the model without it (DistributedDataParallel(model)); FORGE's reducer fixes its bucket order "
            "after the first backward by itself. Or attach FORGE to the plain model: forge.attach(model, "
            "..., process_group=pg). The wrapper was left as it was."
        )
    ddp.require_backward_grad_sync = False
    if not isinstance(ddp.reducer, _NoReducer):
        remove_hooks()
        ddp.reducer = _NoReducer()
        ddp.logger = None  # it holds the reducer too
        ddp.register_forward_hook(_sync_buffers_as_ddp_does)


def _sync_buffers_as_ddp_does(ddp: nn.parallel.DistributedDataParallel, args, output) -> None:
    """After each forward of a taken-over wrapper: whether its next forward broadcasts rank 0's
    buffers, as DDP decides it when it synchronizes gradients itself.

    DDP broadcasts its buffers (BatchNorm's running statistics) at the start of a forward when
    `require_forward_param_sync` is set, and its forward sets that flag to whether this forward will
    synchronize gradients: `torch.is_grad_enabled() and require_backward_grad_sync`. FORGE turns
    `require_backward_grad_sync` off for good, which alone would stop the broadcast after the first
    forward and let each replica's statistics drift on its own data. FORGE reduces every gradient of
    every backward, so the flag is set as plain DDP sets it: from grad mode alone. `broadcast_buffers=
    False` (`forward_sync_buffers`) still turns the broadcast off, in DDP's own check."""
    ddp.require_forward_param_sync = torch.is_grad_enabled()


@torch.no_grad()
def broadcast_from_first_rank(model: nn.Module, group: Any) -> None:
    """Every parameter and buffer of `model` from the group's first rank, as DDP's constructor
    does: replicas start equal, so equal updates keep them equal."""
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    source = dist.get_global_rank(group, 0)
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=source, group=group)


def bound_bytes(params: list[torch.Tensor], cap_bytes: int) -> int:
    """The most gradient bytes a `GradientReducer` over `params` with buckets of `cap_bytes` holds at
    once, its order learned: (MAX_IN_FLIGHT + 1) x max(cap, the largest parameter) + cap (see the class)."""
    largest = max((p.numel() * p.element_size() for p in params), default=0)
    return (MAX_IN_FLIGHT + 1) * max(cap_bytes, largest) + cap_bytes


class GradientReducer:
    """The mean over the ranks of every gradient handed to `add`, in buckets, asynchronously; each
    bucket's parameters are then updated through `apply(p, mean)` and its gradients dropped.

    `params`: every parameter that will get a gradient, in the optimizer's order (all ranks alike).
    `peak_bytes` is the most gradient bytes this reducer held at once (kept since construction),
    a bucket's concatenated copy included; `bound_bytes` is what it stays within.

    The window. A bucket holds at most max(cap, the largest parameter) bytes (a parameter larger
    than the cap is a bucket of its own), and at most MAX_IN_FLIGHT buckets are being reduced while
    the next one fills: (MAX_IN_FLIGHT + 1) buckets of gradients. A bucket of several gradients is
    concatenated into one buffer before its all-reduce (a bucket of one is reduced in place), and
    for that moment its gradients and their copy are both alive: one bucket more, briefly, and no
    more than the cap, since only a bucket within the cap holds several. Hence `bound_bytes`,
    (MAX_IN_FLIGHT + 1) x max(cap, largest) + cap. It holds once the buckets follow the backward:
    in the first backward, in the static order, a gradient that arrives before the bucket it waits
    for is kept beside the window (at most about a layer's gradients: docs/distributed.md).

    The bucket order is state. With more than two ranks the all-reduce sums a gradient's terms in
    an order set by where the gradient sits in its bucket (a ring reduces each chunk of the buffer
    starting from another rank), so the same gradients bucketed in another order differ in the last
    bits. A run restarted from a checkpoint must therefore bucket its first backward as the run that
    never stopped did: `bucket_order` is saved with the optimizer's state (`ForgeOptimizer.state_dict`
    and `forge.checkpoint`'s manifest), by parameter, and `restore_bucket_order` puts it back, as the
    step counts and the seed are. (torch's DDP relearns its order after every restart instead; FORGE
    promises that a resumed run continues bit for bit.)"""

    def __init__(self, params: list[torch.Tensor], group: Any, bucket_cap_mb: float, apply: Apply):
        import torch.distributed as dist

        self.group = dist.group.WORLD if group is None else group
        self.world_size = dist.get_world_size(self.group)
        self.apply = apply
        self.cap_bytes = int(bucket_cap_mb * 2**20)
        self.params = list(params)
        self._index = {p: i for i, p in enumerate(self.params)}
        self._order: list[int] | None = None  # learned at the end of the first backward
        self.buckets = self._bucket(list(reversed(self.params)))
        self.live_bytes = 0
        self.peak_bytes = 0
        self._task: int | None = None
        self._ready: dict[torch.Tensor, torch.Tensor] = {}
        self._arrived: list[torch.Tensor] = []  # this backward's arrival order
        self._next = 0  # the next bucket to launch
        self._in_flight: deque = deque()

    @property
    def bound_bytes(self) -> int:
        """The most gradient bytes alive at once once the order is learned (see the class)."""
        return bound_bytes(self.params, self.cap_bytes)

    @property
    def learned_order(self) -> bool:
        """Whether the buckets follow the learned order (else the static one, until a backward ends)."""
        return self._order is not None

    def _bucket(self, ordered: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Consecutive parameters of one dtype, up to `cap_bytes` a bucket (at least one each)."""
        buckets, current, size = [], [], 0
        for p in ordered:
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > self.cap_bytes or p.dtype != current[0].dtype):
                buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(current)
        self._bucket_of = {p: i for i, bucket in enumerate(buckets) for p in bucket}
        return buckets

    # ------------------------------------------------------------------ during backward

    def add(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """p's gradient from this rank's backward: kept until its bucket is reduced and applied."""
        if grad.is_sparse:
            raise RuntimeError(
                "FORGE's data-parallel reducer takes dense gradients; build the embedding with sparse=False"
            )
        self._begin()
        if p in self._ready:
            raise RuntimeError(
                "FORGE: a parameter's gradient arrived twice in one backward; under data parallelism each "
                "parameter is reduced once per backward"
            )
        self._ready[p] = grad
        self._arrived.append(p)
        self._count(grad.numel() * grad.element_size())
        self._launch_ready()
        if self._task == -1:  # called outside any backward: the step is this gradient alone
            self.finish()

    def _count(self, nbytes: int) -> None:
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _begin(self) -> None:
        """At the first gradient of a backward: queue `finish` for when the backward ends."""
        task = backward_task()
        if task == self._task and task != -1:
            return
        self._task = task
        if task != -1:
            at_backward_end(self.finish)

    def _launch_ready(self) -> None:
        """Launch buckets in their fixed order while the next one has every gradient."""
        while self._next < len(self.buckets) and all(p in self._ready for p in self.buckets[self._next]):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, members: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        members = [p for p in members if p in self._ready]
        if not members:
            return
        grads = [self._ready.pop(p) for p in members]
        if len(grads) == 1:
            flat = grads[0]
        else:  # the copy and the gradients it was made from, both alive until `del grads`
            flat = torch.cat([g.reshape(-1) for g in grads])
            self._count(flat.numel() * flat.element_size())
            self.live_bytes -= sum(g.numel() * g.element_size() for g in grads)
        del grads
        flat.mul_(1.0 / self.world_size)  # as DDP's reducer scales each gradient before the sum
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._in_flight.append((work, members, flat))
        while len(self._in_flight) > MAX_IN_FLIGHT:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        work, members, flat = self._in_flight.popleft()
        work.wait()
        offset = 0
        for p in members:
            n = p.numel()
            self.apply(p, flat[offset : offset + n].view(p.shape) if len(members) > 1 else flat)
            offset += n
        self.live_bytes -= flat.numel() * flat.element_size()

    # ------------------------------------------------------------------ at the end of backward

    def finish(self) -> None:
        """Launch what is left (buckets with a parameter that got no gradient this time reduce the
        others: every rank must leave out the same ones), apply everything, learn the order."""
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next])
            self._next += 1
        while self._in_flight:
            self._complete_oldest()
        arrived, self._arrived = self._arrived, []
        self._ready.clear()
        self._next, self._task, self.live_bytes = 0, None, 0
        if self._order is None and arrived:
            self._learn_order(arrived)

    def _learn_order(self, arrived: list[torch.Tensor]) -> None:
        """Rebuild the buckets in the order rank 0's gradients arrived in its first backward (DDP's
        rebuild): the launch order then follows the backward, and the window stays one bucket wide."""
        import torch.distributed as dist

        order = [[self._index[p] for p in arrived]]
        dist.broadcast_object_list(order, src=dist.get_global_rank(self.group, 0), group=self.group)
        self._set_order(order[0])

    def _set_order(self, first: list[int]) -> None:
        """Buckets in the order of `first` (indices into `params`), then the parameters it leaves out
        (none got a gradient in that backward) in the static order."""
        seen = set(first)
        order = list(first) + [i for i in reversed(range(len(self.params))) if i not in seen]
        self.buckets = self._bucket([self.params[i] for i in order])
        self._order = order

    # ------------------------------------------------------------------ saved and restored

    def bucket_order(self) -> list[torch.Tensor] | None:
        """The parameters in the order the buckets follow, once learned; None before (the static
        order, learned at the end of the next backward)."""
        return None if self._order is None else [self.params[i] for i in self._order]

    def restore_bucket_order(self, order: list[torch.Tensor] | None) -> None:
        """Bucket as a saved `bucket_order` says (None: the static order, learned again in the next
        backward, as a run that had not yet finished a backward would). Between backwards only; an
        order `check_bucket_order` refuses changes nothing."""
        if self._task is not None or self._ready or self._in_flight:
            raise RuntimeError("FORGE: the bucket order can only be restored between backwards")
        if order is None:
            self.buckets = self._bucket(list(reversed(self.params)))
            self._order = None
            return
        self.check_bucket_order(order)
        self._set_order([self._index[p] for p in order])

    def check_bucket_order(self, order: list[torch.Tensor]) -> None:
        """Refuse an order that is not this reducer's parameters, each once."""
        indices = [self._index.get(p) for p in order]
        if None in indices or sorted(indices) != list(range(len(self.params))):
            raise ValueError(
                "the saved bucket order does not list this optimizer's parameters, each once: it was "
                "saved from another model or another choice of trained parameters; nothing was loaded"
            )
