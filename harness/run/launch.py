"""Launching a point: one Python process, or torchrun with one process per GPU (`gpus=N`).

    command(2, args)      torchrun (python -m torch.distributed.run) --nproc-per-node=2 -m harness.run.worker
    child_env(env, gpus)  the worker's environment (NCCL settings for multi-GPU points)
    rank_records(path, n) the per-rank records the ranks wrote

Every point is still one fresh launch: torchrun starts N fresh workers and tears all of them down
when one fails, so nothing of a point reaches the next. Each rank writes its own record
(`rank_record_path`); the parent merges them (`harness.run.record.merge_ranks`): rank 0's step
times (its CUDA events bracket whole steps, after a barrier that lines the ranks up), the per-GPU
peak memory as the maximum over ranks (with the per-rank figures kept), the world size as
`gpu_count`, and the worst status of any rank (an OOM on rank 1 is the point's OOM).

NCCL: NVLink multicast (NVLS) and symmetric-memory multicast stay off on the device machines
(their README: multicast objects leak across jobs there), so NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set for every multi-GPU worker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def command(gpus: int, args: list[str]) -> list[str]:
    """The worker's command line: plain for one GPU, torchrun (standalone rendezvous) for several."""
    if gpus <= 1:
        return [sys.executable, "-m", "harness.run.worker", *args]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
        "-m", "harness.run.worker", *args,
    ]  # fmt: skip


def child_env(base: dict[str, str], gpus: int) -> dict[str, str]:
    """Add the multi-GPU settings (NCCL multicast off, one OpenMP thread per rank) to `base`."""
    env = dict(base)
    if gpus > 1:
        env.update(NCCL_ENV)
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def rank_record_path(record_path: Path, rank: int, world_size: int) -> Path:
    """Where rank `rank` writes its record: RECORD.json itself for one process, RECORD.rankR.json else."""
    return record_path if world_size <= 1 else record_path.with_suffix(f".rank{rank}.json")


def rank_records(record_path: Path, gpus: int) -> list[dict[str, Any]]:
    """The per-rank records that exist (a rank killed by torchrun wrote none), by rank."""
    from harness import results

    paths = [rank_record_path(record_path, r, gpus) for r in range(gpus)]
    return [results.read_one(p) for p in paths if p.exists()]


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))
