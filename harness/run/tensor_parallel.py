"""Tensor parallelism for the harness's decoders: the process group, the mesh and the TP plan.

A multi-GPU point runs under torchrun, one process per GPU (`harness.run.launch`). Each process calls
`init()` (NCCL on GPUs, gloo on CPUs), builds the whole model on its own device, and
`parallelize(model, mesh)` shards it with PyTorch's own plans, the Megatron layout:

    q/k/v_proj, gate/up_proj   ColwiseParallel    weight rows (heads, MLP columns) split
    o_proj, down_proj          RowwiseParallel    weight columns split; output all-reduced
    embed_tokens               RowwiseParallel    vocabulary rows split; output all-reduced
    lm_head                    ColwiseParallel    vocabulary rows split; logits all-gathered

Norms stay plain, replicated tensors (every rank computes the same update from the same
replicated activations). Attention keeps working on the local heads because transformers reshapes
with `-1` heads. With `sequence_parallel=True` the norms see only their rank's slice of the sequence
(SequenceParallel), the block inputs are sequence-sharded, and the norm weights get Partial
gradients that FORGE's hook reduces (`forge.distributed.local_grad`).
"""

from __future__ import annotations

import os

import torch
from torch import nn

_MESH = None  # the 1-D mesh of this process, once init() ran (models.build shards onto it)


def world_size() -> int:
    """The number of processes torchrun started (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def init(device: str):
    """Join torchrun's process group and return a 1-D device mesh over all ranks (also kept as
    `current_mesh()`, which `harness.run.models.build` shards the model onto)."""
    global _MESH
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    _MESH = init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("tp",))
    return _MESH


def current_mesh():
    """The mesh `init()` made in this process, or None (a single-process point)."""
    return _MESH


def barrier() -> None:
    """Line the ranks up (before timing); nothing outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def finish() -> None:
    """Leave the process group (before the worker exits)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def layout_groups(params) -> list[dict]:
    """torch.optim param groups that keep sharded (DTensor) and plain parameters apart.

    Under this plan the norms stay plain tensors beside DTensor weights. A for-each or fused
    torch.optim step runs one multi-tensor kernel per param group, and DTensor refuses a kernel
    over both kinds ("got mixed torch.Tensor and DTensor"); one group per kind runs the same
    update. Outside tensor parallelism this is one group of every parameter.
    """
    from torch.distributed.tensor import DTensor

    params = list(params)
    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": group} for group in (sharded, plain) if group]


def decoder_plan(model: nn.Module, sequence_parallel: bool = False) -> dict:
    """The TP plan of a transformers Llama/Qwen3 causal LM (keys relative to `model`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq = Shard(1)
    act = seq if sequence_parallel else Replicate()
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=act),
        "lm_head": ColwiseParallel(input_layouts=act, output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        layer = f"model.layers.{i}"
        for name in ("q_proj", "k_proj", "v_proj"):
            plan[f"{layer}.self_attn.{name}"] = ColwiseParallel()
        plan[f"{layer}.self_attn.o_proj"] = RowwiseParallel(output_layouts=act)
        for name in ("gate_proj", "up_proj"):
            plan[f"{layer}.mlp.{name}"] = ColwiseParallel()
        plan[f"{layer}.mlp.down_proj"] = RowwiseParallel(output_layouts=act)
        if sequence_parallel:
            plan[f"{layer}.input_layernorm"] = SequenceParallel()
            plan[f"{layer}.post_attention_layernorm"] = SequenceParallel()
            for block in ("self_attn", "mlp"):
                plan[f"{layer}.{block}"] = PrepareModuleInput(
                    input_kwarg_layouts={"hidden_states": seq},
                    desired_input_kwarg_layouts={"hidden_states": Replicate()},
                )
    if sequence_parallel:
        plan["model.norm"] = SequenceParallel()
    return plan


def parallelize(model: nn.Module, mesh, sequence_parallel: bool = False) -> nn.Module:
    """Shard `model` in place over `mesh` with `decoder_plan`; returns it."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, decoder_plan(model, sequence_parallel))
