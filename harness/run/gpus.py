"""The kinds of GPU a point is measured as: each conf/gpu/NAME.yaml owns one kind's facts.

A kind's file says how the card names itself (`device_name`, a regular expression found in
`torch.cuda.get_device_name()`), the memory it gives a process, its dense bf16 peak (what MFU is
of) and the matmul and copy rates measured on it (what the report's floors are drawn at); an
emulated kind (`memory_cap_gib`) is a smaller card's memory on a larger one. Everything that needs
such a fact reads it here, or from a record: a record keeps its kind's facts in `config.gpu`, and
one written before a fact existed takes it from its kind's file (`of_record`). A new GPU kind is
one file in conf/gpu/ (or in a folder a `hydra.searchpath` override adds).

    kinds()            every kind, by name
    recognize(name)    the kind of a card from its name ("NVIDIA H200" -> h200)
    of_record(record)  the kind a record was measured as, its own facts over its file's
    ran_on(record)     the kind of the card that ran it (for an emulated kind, the card under the cap)
    title(kind)        how text names the card ("H200")
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.run.config import GpuConfig, config_file, group_choices


def _load(name: str, overrides: Sequence[str] = ()) -> GpuConfig | None:
    path = config_file("gpu", name, overrides)
    return None if path is None else _read(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read(path: Path, mtime_ns: int) -> GpuConfig:
    """One kind's file through the schema (a key it lacks fails here), read once while unchanged."""
    merged = OmegaConf.merge(OmegaConf.structured(GpuConfig), OmegaConf.load(path))
    return GpuConfig(**OmegaConf.to_container(merged, resolve=True))  # type: ignore[arg-type]


def kinds(overrides: Sequence[str] = ()) -> dict[str, GpuConfig]:
    """Every conf/gpu kind, by name (`overrides`: a `hydra.searchpath` adds folders to look in)."""
    found = {name: _load(name, overrides) for name in group_choices("gpu", overrides)}
    return {name: kind for name, kind in found.items() if kind is not None}


def matches(kind: Any, device_name: str | None) -> bool:
    """Whether a card called `device_name` is of `kind` (its `device_name` pattern, case ignored)."""
    pattern = kind.device_name
    return bool(pattern and device_name and re.search(pattern, device_name, re.IGNORECASE))


def recognize(device_name: str | None, overrides: Sequence[str] = ()) -> GpuConfig | None:
    """The kind of the card called `device_name`: a real card's kind (no memory cap) before an
    emulated one's, then by name; None for no name or a card no kind describes."""
    found = [kind for kind in kinds(overrides).values() if matches(kind, device_name)]
    found.sort(key=lambda kind: (kind.memory_cap_gib is not None, kind.name))
    return found[0] if found else None


def of_record(record: Mapping[str, Any]) -> GpuConfig | None:
    """The kind a record was measured as (its `gpu`): the facts its `config.gpu` keeps, and for any
    it lacks (a record older than the fact) those of the kind's file. A record that names no kind
    (a kernel record) is of the kind its `gpu_name` is."""
    config = record.get("config")
    kept = config.get("gpu") if isinstance(config, Mapping) else None
    known = {f.name for f in fields(GpuConfig)}
    kept = (
        {k: v for k, v in kept.items() if k in known and v is not None} if isinstance(kept, Mapping) else {}
    )
    name = record.get("gpu") or kept.get("name")
    kind = _load(str(name)) if name else recognize(record.get("gpu_name"))
    if kind is None:  # a kind whose file is not here: what the record keeps of it, if anything
        return GpuConfig(**kept) if "name" in kept else None
    return replace(kind, **kept)


def ran_on(record: Mapping[str, Any]) -> GpuConfig | None:
    """The kind of the card a record ran on: its own kind, or for an emulated one (a memory cap on
    a larger card) the kind its `gpu_name` is."""
    kind = of_record(record)
    if kind is not None and kind.memory_cap_gib is None:
        return kind
    return recognize(record.get("gpu_name"))


def title(kind: Any) -> str:
    """How text names a kind's card: the first word of its name, upper case ("h100_80gb" -> "H100")."""
    return "CPU" if kind.name == "cpu" else kind.name.split("_")[0].upper()
