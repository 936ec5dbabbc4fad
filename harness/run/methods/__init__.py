"""The training methods a sweep compares, one module each, behind one interface (`base.Method`).

Each method is a `Method` subclass that declares what it is: its `name` (the `name:` of a
conf/method file), `title`, `summary`, display `order`, the packages it `requires`, and its memory
model (`footprint`). Defining such a class registers it; `registry()` imports every module of
this package once, so the harness's own methods are found without a table to keep in step, and
returns them in display order. A conf/method file picks one and sets its options; many files
share one method (forge_bf16 and forge_int8 are both `forge`, with other `state_dtype`s).

A method's module imports its package only in `setup`, so listing and validating methods costs
nothing and a missing package becomes an `unavailable` record, not a crash. A method outside this
package can be named as "package.module:Class" in `method.name` (importing the module registers
it, if its class has a name).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from harness.records import on_cpu
from harness.run.errors import ConfigError
from harness.run.methods.base import Method, registered

_discovered = False


def _discover() -> None:
    """Import every module of this package once: each method class registers itself."""
    global _discovered
    if not _discovered:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _discovered = True


def registry() -> dict[str, type[Method]]:
    """Every method the harness knows, by name, in display order (`Method.order`, then name)."""
    _discover()
    return dict(sorted(registered().items(), key=lambda item: (item[1].order, item[0])))


def get(name: str) -> type[Method]:
    """The Method class for a registered name or a "package.module:Class" path."""
    known = registry()
    if name in known:
        return known[name]
    if ":" not in name:
        raise ConfigError(f"method.name={name!r} is not valid; choose one of: {', '.join(known)}")
    module_name, class_name = name.split(":", 1)
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"method.name={name!r}: cannot import {name}: {e}") from None


def make_options(name: str, options: dict[str, Any]) -> Any:
    """Build the method's Options dataclass from a dict; unknown keys and bad values fail clearly."""
    cls = get(name).Options
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(
            f"method.options for {name!r}: unknown option(s) {', '.join(unknown)}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"method.options for {name!r}: {e}") from None


# Options recorded only when set (not None): a point without them is the same configuration as one
# measured before they existed (committed baselines among them).
RECORDED_WHEN_SET = ("max_grad_norm", "master_weights", "fp8", "data_parallel", "bucket_cap_mb")


def resolved_options(name: str, options: dict[str, Any], lr: float) -> dict[str, Any]:
    """What a record stores as method_options: lr and every option with its default filled in,
    the same for a point that ran and one that failed (so they match as the same configuration)."""
    resolved = asdict(make_options(name, options))
    return {"lr": lr, **{k: v for k, v in resolved.items() if not (k in RECORDED_WHEN_SET and v is None)}}


def validate(name: str, options: dict[str, Any]) -> None:
    """Raise ConfigError unless `name` is a method and `options` are valid for it."""
    make_options(name, options)


def unavailable_reason(
    name: str, options: dict[str, Any], device: str, cuda_graph: bool = False
) -> str | None:
    """Why the method cannot run on this device with these options, or with its step captured in
    a CUDA graph (`method.cuda_graph`); None when it can."""
    cls = get(name)
    if cuda_graph and not cls.graph_capturable:  # on no device, with no package: say this first
        capturable = ", ".join(n for n, c in registry().items() if c.graph_capturable)
        return (
            f"method {cls.name or cls.__name__!r} cannot capture its step in a CUDA graph; "
            f"set method.cuda_graph=false, or use one that can: {capturable}"
        )
    reason = cls.unavailable_reason(device, make_options(name, options))
    return reason or (cls.graph_unavailable_reason(device) if cuda_graph else None)


def packages() -> list[str]:
    """The pip distributions the registered methods require, each once, in display order."""
    return list(dict.fromkeys(p for cls in registry().values() for p in cls.requires))


def interpreted(record: Mapping[str, Any]) -> bool:
    """True when a record's point ran Triton kernels in Triton's CPU interpreter (TRITON_INTERPRET=1):
    its step time says nothing about speed, only that the method trains."""
    if not on_cpu(record):
        return False
    try:
        return get(str(record.get("method"))).triton_kernels
    except ValueError:  # a method this checkout no longer has (a record of an earlier run)
        return False
