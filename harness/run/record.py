"""A sweep point's record, made in one place: what both sides of a sweep need of it.

The record's fields are typed in `harness.results.Record`; this module fills them from a point's
config and machine, and is all the sweep's parent process and the worker share of a record:

    for_point(cfg, point, device)     the fields known before anything runs (the config)
    Record.set / stamp_env(r, ...)     the environment: GPU, driver, versions, git commit
    failed(cfg, point, device, git, status, error)
                                       a point that left no record of its own (its method cannot
                                       run here, its worker died or timed out, Slurm ended its job)
    merge_ranks(records)               one record from the per-rank records of a multi-GPU point
    job_fields(launcher, job_id)       where the point ran

The worker (`harness.run.runner`) starts from `for_point` and sets what it measured; the parent
(`harness.run.local`, `harness.run.slurm`) makes `failed` records and merges ranks, without
importing the worker's modules.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

from omegaconf import DictConfig

from harness.results import PEAK_FIELDS, Record, worst_status
from harness.run import config as config_mod
from harness.run import env, methods

ATTENTION_MASK = "is_causal"  # the mask the models give SDPA (harness.run.models): records say so


def point_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config a record keeps: all but `launcher` (where the point ran is the record's
    `launcher`, `slurm_job_id` and `node`; a point run locally or on Slurm is the same point)."""
    config = config_mod.to_dict(cfg)
    config.pop("launcher", None)
    return config


def for_point(cfg: DictConfig, point: str, device: str) -> Record:
    """The fields known before anything runs: what the point is, from its config."""
    options = methods.resolved_options(cfg.method.name, config_mod.to_dict(cfg.method.options), cfg.method.lr)
    if cfg.method.autocast is not None:  # mixed precision: the same weights, another configuration
        options["autocast"] = cfg.method.autocast
    if cfg.method.cuda_graph:  # the same method, its step captured once and replayed: recorded only when on
        options["cuda_graph"] = True
    if cfg.method.compile:  # likewise: its forward and backward compiled by torch.compile
        options["compile"] = True
    if cfg.model.chunked_loss:  # another loss, so another configuration: recorded only when on
        options["chunked_loss"] = True
    if cfg.model.chunked_head:  # likewise: lm_head and the loss over vocabulary chunks
        options["chunked_head"] = True
    dtype = config_mod.weight_dtype(cfg)
    if cfg.convergence.enabled:  # the weight dtype tells fused AdamW fp32 from pure bf16 apart
        options["weights"] = dtype
    r = Record(
        sweep=cfg.sweep.name,
        point=point,
        sweep_mode=cfg.sweep.mode,
        concurrent_points=cfg.sweep.concurrent_points,
        time=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        method=cfg.method.name,
        method_label=cfg.method.label,
        method_options=options,
        model=cfg.model.name,
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len,
        activation_checkpointing=cfg.activation_checkpointing,
        gpu=cfg.gpu.name,
        device=device,
        memory_cap_gib=cfg.gpu.memory_cap_gib,
        emulated=cfg.gpu.memory_cap_gib is not None,
        # the CUDA allocator's settings the point ran under (the worker inherits them from the sweep)
        cuda_alloc_conf=cfg.gpu.allocator or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        steps=cfg.steps,
        warmup_steps=cfg.warmup_steps,
        dtype=dtype,
        attention_mask=ATTENTION_MASK,
        notes=[],
        config=point_config(cfg),
    )
    r.set(chunked_loss=bool(cfg.model.chunked_loss))
    if cfg.model.chunked_head:
        r.set(chunked_head=True)
    if cfg.convergence.enabled:
        r.set(convergence_reference=cfg.method.label == cfg.convergence.reference)
    return r


def stamp_env(record: Record, device: str, git: dict[str, Any] | None) -> Record:
    """Add env metadata and the GPU fields, the same for every record of a point, whatever its
    status (the report and the regression check match points on gpu_name)."""
    record.env = env.collect(git)
    record.gpu_name = record.env["gpu_name"] if device == "cuda" else None
    record.gpu_count = 1 if device == "cuda" else 0  # GPUs this point used (env: all visible)
    return record


def failed(
    cfg: DictConfig, point: str, device: str, git: dict[str, Any] | None, status: str, error: str
) -> Record:
    """The record of a point that left none of its own: its config, the environment, why."""
    return stamp_env(for_point(cfg, point, device), device, git).set(status=status, error=error)


def merge_ranks(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from the ranks' records: rank 0's times and losses, the max of the peaks, the
    worst status (with its error), and the per-rank peaks for the record's reader."""
    by_rank = sorted(records, key=lambda r: r.get("rank", 0))
    merged = Record.from_json(by_rank[0])
    for name in PEAK_FIELDS:
        values = [r.get(name) for r in by_rank]
        known = [v for v in values if v is not None]
        merged.set(**{f"{name}_per_rank": values, name: max(known) if known else None})
    status = worst_status(r.get("status", "error") for r in by_rank)
    worst = next(r for r in by_rank if r.get("status", "error") == status)
    merged.set(status=worst.get("status"), error=worst.get("error"), ranks_reported=len(by_rank))
    world = merged.extra.get("world_size") or len(by_rank)
    merged.gpu_count = (merged.gpu_count or 0) * world  # 0 on CPUs (gloo), else world
    return merged.to_json()


def job_fields(launcher: str, job_id: str | None = None) -> dict[str, Any]:
    """Where a point ran: the record's `launcher`, `slurm_job_id` and `node` (this host)."""
    return {"launcher": launcher, "slurm_job_id": job_id, "node": socket.gethostname()}
