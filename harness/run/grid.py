"""The grid: the points a sweep runs, each composed and validated through Hydra before any runs.

A sweep's `sweep` lists are the axes (methods x models x sequence lengths x activation
checkpointing x batch sizes; an empty list means the composed value). `expand` takes their
product, composes each point's own config from the sweep's overrides plus its values
(`make_point`), so a bad name or value fails before the first point runs, and drops the points
`sweep.exclude` matches. A capacity search composes one group per combination of every axis but
the batch size (`capacity_groups`). A point's id (`point_id`) names what defines it and is the
key a resumed sweep skips on.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from harness.run import config as config_mod
from harness.run.config import compose_config


@dataclass
class Point:
    """One point: its id, the Hydra overrides that make it, and its composed config."""

    id: str
    overrides: list[str]
    cfg: DictConfig


def point_id(cfg: DictConfig) -> str:
    """A stable id from what defines the point (the resume key)."""
    ac = "/ac" if cfg.activation_checkpointing else ""
    ac += "/chunked" if cfg.model.chunked_loss else ""  # another loss: another point, not a resume
    ac += "/chunked-head" if cfg.model.chunked_head else ""
    wrapper = cfg.method.options.get("data_parallel")  # DDP or FSDP2 (e.g. /fsdp2x2), else the TP plan
    tp = "" if cfg.gpus <= 1 else f"/{wrapper}x{cfg.gpus}" if wrapper else f"/tp{cfg.gpus}"
    seed = f"/seed{cfg.seed}" if cfg.seed else ""  # the default seed 0 keeps the ids of old results
    shape = f"b{cfg.batch_size}/s{cfg.seq_len}"
    allocator = f"/alloc={cfg.gpu.allocator}" if cfg.gpu.allocator else ""  # another search, not a resume
    return f"{cfg.method.label}/{cfg.model.name}/{shape}{ac}{tp}{seed}/{cfg.gpu.name}{allocator}"


def _axes(cfg: DictConfig) -> dict[str, list[Any]]:
    """The grid's axes as Hydra override keys; an empty sweep list means the composed value."""
    s = cfg.sweep
    return {
        "method": list(s.methods) or [cfg.method.label],
        "model": list(s.models) or [cfg.model.name],
        "seq_len": list(s.seq_lens) or [cfg.seq_len],
        "activation_checkpointing": list(s.activation_checkpointing) or [cfg.activation_checkpointing],
        "batch_size": list(s.batch_sizes) or [cfg.batch_size],
    }


def make_point(base_overrides: list[str], **values: Any) -> Point:
    """Compose (and validate) one point's config from the sweep's overrides plus its own values."""
    overrides = [*base_overrides, *(f"{k}={_hydra_value(v)}" for k, v in values.items())]
    cfg = compose_config(overrides)
    return Point(point_id(cfg), overrides, cfg)


def _hydra_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def expand(cfg: DictConfig, base_overrides: list[str]) -> list[Point]:
    """Every point of a grid sweep, composed and validated (raises ConfigError on the first bad one)."""
    axes = _axes(cfg)
    points = [
        make_point(base_overrides, **dict(zip(axes, combo))) for combo in itertools.product(*axes.values())
    ]
    points = [p for p in points if not excluded(p.id, cfg)]
    ids = [p.id for p in points]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise config_mod.ConfigError(
            f"sweep has duplicate points (give methods distinct labels): {duplicates}"
        )
    return points


def excluded(pid: str, cfg: DictConfig) -> bool:
    """True when the point id matches one of sweep.exclude's fnmatch patterns."""
    return any(fnmatch.fnmatchcase(pid, pattern) for pattern in cfg.sweep.exclude)


def capacity_groups(cfg: DictConfig, overrides: list[str]) -> list[tuple[dict[str, Any], Point]]:
    """A capacity search's groups (every axis but the batch size), each with its batch-1 point
    (composed, so validated), excluded ones left out."""
    axes = _axes(cfg)
    axes.pop("batch_size")
    groups = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    firsts = [(v, make_point(overrides, batch_size=1, **v)) for v in groups]
    return [(v, p) for v, p in firsts if not excluded(p.id, cfg)]
