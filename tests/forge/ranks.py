"""Run one function on several CPU processes joined by gloo, as torchrun would, and collect what
each rank returns. The distributed tests spawn once per module (the Triton interpreter is slow:
each training run is done once) and check the results in the parent."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp


def run_on_ranks(worker, world: int, tmp: Path, *args) -> list:
    """`worker(rank, world, tmp, *args)` on `world` gloo processes; their return values by rank.
    A worker that fails fails the caller with every failing rank's traceback."""
    try:
        mp.spawn(_entry, args=(worker, world, str(tmp), args), nprocs=world, join=True)
    except Exception as e:
        errors = "\n".join(p.read_text() for p in sorted(Path(tmp).glob("rank*.err")))
        raise AssertionError(f"a rank failed:\n{errors or e}") from None
    return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _entry(rank: int, worker, world: int, tmp: str, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world)
    try:
        torch.save(worker(rank, world, Path(tmp), *args), Path(tmp) / f"rank{rank}.pt")
    except BaseException:
        (Path(tmp) / f"rank{rank}.err").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def full(model) -> dict[str, torch.Tensor]:
    """Every parameter of `model` (a DDP wrapper: of its module) as a whole tensor, by the model's
    own names (a DTensor gathered: every rank must call it)."""
    model = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return {n: _full(p).detach().clone() for n, p in model.named_parameters()}


def full_states(optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of a FORGE optimizer's state, whole, by `<parameter name>.<state name>`."""
    out = {}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value):
                out[f"{optimizer.param_names[p]}.{key}"] = _full(value).detach().clone()
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t
