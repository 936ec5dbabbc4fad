"""The training methods a sweep compares, one module each, behind one interface (`base.Method`).

    fused_adamw         torch.optim.AdamW(fused=True): the reference everything is a ratio of
    adamw_in_backward   torch's post-accumulate-grad hook pattern, one AdamW per parameter
    no_optimizer        forward + backward, gradients dropped as they appear: the floor
    lomo                lomo-optim's Lomo (SGD) or AdaLomo, the update fused into backward hooks
    flashoptim          FlashOptim's FlashAdamW, optionally with enable_gradient_release
    adamw8bit_bnb       bitsandbytes AdamW8bit
    adamw8bit_torchao   torchao.optim.AdamW8bit
    forge               forge.attach: the update fused into the weight-gradient GEMM

Modules are imported lazily (`get`), and each imports its package only in `setup`, so listing and
validating methods costs nothing and a missing package becomes an `unavailable` record, not a crash.
A method outside this package can be named as "package.module:Class" in `method.name`.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, fields
from typing import Any

from harness.config import ConfigError
from harness.methods.base import Method

REGISTRY = {
    "fused_adamw": "harness.methods.fused_adamw:FusedAdamW",
    "adamw_in_backward": "harness.methods.adamw_in_backward:AdamWInBackward",
    "no_optimizer": "harness.methods.no_optimizer:NoOptimizer",
    "lomo": "harness.methods.lomo:LomoMethod",
    "flashoptim": "harness.methods.flashoptim:FlashOptimMethod",
    "adamw8bit_bnb": "harness.methods.adamw8bit_bnb:BnbAdamW8bit",
    "adamw8bit_torchao": "harness.methods.adamw8bit_torchao:TorchaoAdamW8bit",
    "forge": "harness.methods.forge:Forge",
}


def get(name: str) -> type[Method]:
    """The Method class for a registry name or a "package.module:Class" path."""
    target = REGISTRY.get(name, name)
    if ":" not in target:
        raise ConfigError(f"method.name={name!r} is not valid; choose one of: {', '.join(REGISTRY)}")
    module_name, class_name = target.split(":", 1)
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"method.name={name!r}: cannot import {target}: {e}") from None


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


def resolved_options(name: str, options: dict[str, Any], lr: float) -> dict[str, Any]:
    """What a record stores as method_options: lr and every option with its default filled in,
    the same for a point that ran and one that failed (so they match as the same configuration)."""
    return {"lr": lr, **asdict(make_options(name, options))}


def validate(name: str, options: dict[str, Any]) -> None:
    """Raise ConfigError unless `name` is a method and `options` are valid for it."""
    make_options(name, options)


def unavailable_reason(
    name: str, options: dict[str, Any], device: str, cuda_graph: bool = False
) -> str | None:
    """Why the method cannot run on this device with these options, or with its step captured in
    a CUDA graph (`method.cuda_graph`); None when it can."""
    cls = get(name)
    reason = cls.unavailable_reason(device, make_options(name, options))
    return reason or (cls.graph_unavailable_reason(device) if cuda_graph else None)


def check_choice(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    """For Options.__post_init__: a ValueError naming the valid choices."""
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")
