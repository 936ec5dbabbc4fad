"""FORGE under tensor parallelism: nn.Linear weights sharded as DTensors by PyTorch's TP plans.

Why it is exact. `parallelize_module(model, mesh, {...: ColwiseParallel(), ...: RowwiseParallel()})`
turns each planned nn.Linear's weight into a DTensor sharded over a 1-D mesh of `P` ranks:

    colwise  W (N, K) as Shard(0): rank r holds rows W_r (N/P, K); x is replicated (T, K);
             y_r = x W_r^T is the local slice of y, and dW_r = dy_r^T x is COMPLETE on the rank;
             dx = sum_r dy_r W_r needs an all-reduce (DTensor does it: the grad of x is Partial).
    rowwise  W (N, K) as Shard(1): rank r holds columns W_r (N, K/P); x is sharded on its last dim;
             y = sum_r x_r W_r^T needs an all-reduce (the output is Partial); dy is replicated, so
             dW_r = dy^T x_r is COMPLETE on the rank and dx_r = dy W_r is the local slice of dx.

Either way the fused kernel can run on the local shard, from local tensors only, and its update
is the update a single GPU would apply to those rows or columns. `forge.nn.tp_linear_forward` is the
ForgeLinear forward for such a weight: it takes the layer's input as a DTensor (the plan's input
hook made it one), redistributes it to the layout the shard needs, runs `forge_linear` on
`.to_local()` tensors, and hands back a DTensor with the output's placement (Shard on the last dim
for colwise, Partial for rowwise), declaring the gradient placements so that DTensor inserts the
same collectives in backward as for a plain nn.Linear. The optimizer states of a sharded weight
are DTensors with the weight's placements (each rank allocates only its shard), so
`torch.distributed.checkpoint` saves and loads them as sharded tensors (`save_optimizer`,
`load_optimizer`).

Parameters that are not fused (norms, embeddings, biases, replicated weights) are updated by
FORGE's post-accumulate-grad hook from the gradient DTensor gives them. Where that gradient is
Partial (a replicated norm weight under sequence parallelism: each rank saw its own tokens), the
hook reduces it first (`local_grad`: one all-reduce per such parameter, in backward), so the
update is again the single-GPU one. What FORGE refuses, naming the parameter: a DTensor on a mesh
of more than one dimension (data parallelism across one of them would need a gradient all-reduce
before the update), and a parameter that is itself Partial.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

COLWISE, ROWWISE = "colwise", "rowwise"


def is_dtensor(t: Any) -> bool:
    """True for a DTensor (or a Parameter wrapping one). Asked of every tensor FORGE touches, without
    importing torch.distributed.tensor (a second of import): no DTensor exists before that module is
    imported, by whoever made one."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(t, dtensor)


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """The local shard of a DTensor (sharing its storage: kernels write through it); else `t`."""
    return t.to_local() if is_dtensor(t) else t


def like_param(p: torch.Tensor, t: torch.Tensor, scale_group: int | None = None) -> torch.Tensor:
    """Wrap a per-rank state tensor `t` as a DTensor laid out like the parameter `p` (else `t`).

    A state of p's shape gets p's global shape. Block scales (`scale_group` elements of p's last dim
    to a scale, `forge.kernels.quant`) of a weight (rows, cols) are (rows, ceil(cols / group)), sharded
    on the same dims as p: their global shape follows p's (rows sharded unevenly by FSDP2 included)."""
    if not is_dtensor(p):
        return t
    from torch.distributed.tensor import DTensor

    mesh, placements = p.device_mesh, p.placements
    if t.shape == local(p).shape:
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=p.shape, stride=p.stride())
    if scale_group is not None and p.dim() >= 2:
        shape = (*p.shape[:-1], -(-p.shape[-1] // scale_group))
        rows = 1
        for size in shape[:-1]:
            rows *= size
        shape = torch.Size((rows, shape[-1])) if len(shape) > 2 else torch.Size(shape)
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=shape, stride=(shape[1], 1))
    return DTensor.from_local(t, mesh, placements, run_check=False)


def linear_layout(name: str, weight: torch.Tensor) -> str | None:
    """How FORGE can fuse an nn.Linear weight: None for a plain tensor, COLWISE / ROWWISE for a
    weight sharded on a 1-D mesh, "hook" for a replicated one (its gradient may be Partial: the
    hook path reduces it). Raises for what FORGE cannot do, naming the weight."""
    if not is_dtensor(weight):
        return None
    check_param(name, weight)
    placement = weight.placements[0]
    if placement.is_shard():
        return COLWISE if placement.dim == 0 else ROWWISE
    return "hook"


def mesh_rank(p: torch.Tensor) -> int:
    """A number for this rank's shard of the DTensor p (0 for a plain tensor): its mesh coordinate,
    row-major (FSDP2 shards mix it into their stochastic-rounding seeds, `forge.steps`)."""
    if not is_dtensor(p):
        return 0
    coordinate = p.device_mesh.get_coordinate() or [0]
    rank = 0
    for size, c in zip(p.device_mesh.shape, coordinate):
        rank = rank * size + c
    return rank


def check_param(name: str, p: torch.Tensor) -> None:
    """Refuse DTensor parameters whose update needs more than the local or reduced gradient."""
    if not is_dtensor(p):
        return
    if p.device_mesh.ndim != 1:
        raise NotImplementedError(
            f"{name} is a DTensor on a {p.device_mesh.ndim}-D device mesh {tuple(p.device_mesh.shape)}. "
            "FORGE fuses tensor/sequence-parallel shards on a 1-D mesh; a data-parallel mesh dimension "
            "needs the gradient reduced before the update: shard that dimension with FSDP2's fully_shard "
            "(FORGE then updates each rank's shard from FSDP2's reduce-scatter, docs/distributed.md)."
        )
    if p.placements[0].is_partial():
        raise NotImplementedError(f"{name} is a Partial DTensor: a parameter must be sharded or replicated")


def check_sharded_param(name: str, p: torch.Tensor) -> None:
    """Under FSDP2 every trained parameter is a DTensor sharded by `fully_shard` (on a 1-D mesh, or a
    2-D one with tensor parallelism): its gradient reaches FORGE reduce-scattered. A plain tensor
    would be updated from this rank's gradient alone, so it is refused."""
    if not is_dtensor(p):
        raise RuntimeError(
            f"{name} is not sharded by fully_shard, so its gradient would never be reduced over the ranks. "
            "Under FSDP2 apply fully_shard to the root module too (it takes every parameter left), or leave "
            "this parameter out of forge.attach(params=...)."
        )


def local_grad(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of the local shard of `p`, complete: a Partial gradient (a replicated parameter
    that saw only this rank's tokens, e.g. a norm weight under sequence parallelism) is all-reduced,
    and any other layout is redistributed to p's own placements."""
    if not is_dtensor(grad):
        return grad
    if tuple(grad.placements) != tuple(p.placements):
        grad = grad.redistribute(p.device_mesh, p.placements)
    return grad.to_local()


def optimizer_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, for torch.distributed.checkpoint: sharded
    states are DTensors (each rank writes its shard), plain ones are replicated on every rank."""
    sd = optimizer.state_dict()
    names = names_by_index(optimizer)
    return {
        "state": {names[i]: s for i, s in sd["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]],
    }


def load_optimizer_state_dict(optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> None:
    """Inverse of `optimizer_state_dict` (names back to the optimizer's own indices); a data-parallel
    reducer's "bucket_order" by name, where `sd` has one, likewise (`ForgeOptimizer.state_dict`)."""
    index = {n: i for i, n in names_by_index(optimizer).items()}
    loaded = {
        "state": {index[n]: s for n, s in sd["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]],
    }
    if sd.get("bucket_order") is not None:
        loaded["bucket_order"] = [index[n] for n in sd["bucket_order"]]
    optimizer.load_state_dict(loaded)


def names_by_index(optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """{index in the optimizer's state dict: the parameter's name} (`param_<i>` where it has none)."""
    names = getattr(optimizer, "param_names", {})
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return {i: names.get(p, f"param_{i}") for i, p in enumerate(params)}


def save_optimizer(optimizer: torch.optim.Optimizer, checkpoint_id: str) -> None:
    """Save FORGE's (sharded) states with torch.distributed.checkpoint; every rank calls it."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"optimizer": optimizer_state_dict(optimizer)}, checkpoint_id=checkpoint_id)


def load_optimizer(optimizer: torch.optim.Optimizer, checkpoint_id: str) -> None:
    """Load states saved by `save_optimizer` into this optimizer's own (sharded) tensors, in place."""
    import torch.distributed.checkpoint as dcp

    sd = {"optimizer": optimizer_state_dict(optimizer)}
    dcp.load(sd, checkpoint_id=checkpoint_id)
    load_optimizer_state_dict(optimizer, sd["optimizer"])
