"""Data parallelism for the harness's multi-GPU points: DDP replicas or FSDP2 shards.

A method whose options say `data_parallel: ddp` or `fsdp2` (forge_bf16_ddp, fused_adamw_fsdp2...)
runs with `gpus=N` under torchrun like a tensor-parallel point (`harness.run.launch`), but each rank
builds the whole model without the TP plan and trains it on a batch of its own (the point's seed
plus the rank), and the runner wraps the model before the method's `setup`:

    ddp    DistributedDataParallel(model, gradient_as_bucket_view=True): the gradients live in
           DDP's buckets only (the default keeps a second copy in .grad), the fair baseline;
           forge.attach takes the wrapper over and reduces each gradient itself
    fsdp2  fully_shard on every decoder layer, then on the model (torchtitan's layout), over all
           ranks: weights, gradients and optimizer states sharded

`batch_size` stays the per-rank micro-batch; a record's throughput counts every rank's tokens and
its MFU every GPU's peak. What FORGE does under each wrapper: docs/distributed.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

KINDS = (None, "ddp", "fsdp2")


def kind_of(options: Any) -> str | None:
    """The data-parallel wrapper a method's options ask for (a dataclass or a dict), or None."""
    if isinstance(options, dict):
        return options.get("data_parallel")
    return getattr(options, "data_parallel", None)


def wrap(model: nn.Module, kind: str) -> nn.Module:
    """`model` under DDP or FSDP2 over every rank of the process group torchrun started."""
    if kind == "ddp":
        device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        from harness.run.tensor_parallel import current_mesh

        for layer in decoder_layers(model):
            fully_shard(layer, mesh=current_mesh())
        return fully_shard(model, mesh=current_mesh())
    raise ValueError(f"data_parallel={kind!r}: choose one of {', '.join(str(k) for k in KINDS)}")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a transformers causal LM (the units FSDP2 shards one by one)."""
    return list(model.model.layers)


def batch_seed(seed: int, kind: str | None) -> int:
    """The seed of this rank's batch: under data parallelism every rank trains on its own data."""
    if kind is None:
        return seed
    from harness.run.tensor_parallel import rank

    return seed + rank()


def ranks_of_tokens(kind: str | None) -> int:
    """How many ranks' batches one step trains on: all of them under data parallelism, else one
    (tensor-parallel ranks share a batch)."""
    if kind is None:
        return 1
    from harness.run.tensor_parallel import world_size

    return world_size()
