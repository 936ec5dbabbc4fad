"""The training methods a sweep compares, one module each, behind one interface (`base.Method`).

`REGISTRY` maps each method's name (the `name:` of a conf/method file) to its class, and
`SUMMARIES` says in one line what each is (`python -m harness list` prints them). A conf/method
file picks one and sets its options; many files share one method (forge_bf16 and forge_int8 are
both `forge`, with other `state_dtype`s).

Modules are imported lazily (`get`), and each imports its package only in `setup`, so listing and
validating methods costs nothing and a missing package becomes an `unavailable` record, not a crash.
A method outside this package can be named as "package.module:Class" in `method.name`.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, fields
from typing import Any

from harness.run.errors import ConfigError
from harness.run.methods.base import Method

REGISTRY = {
    "fused_adamw": "harness.run.methods.fused_adamw:FusedAdamW",
    "fused_adamw_fp32grad": "harness.run.methods.fp32grad:FusedAdamWFp32Grad",
    "adamw_in_backward_fp32grad": "harness.run.methods.fp32grad:AdamWInBackwardFp32Grad",
    "adamw_in_backward": "harness.run.methods.adamw_in_backward:AdamWInBackward",
    "no_optimizer": "harness.run.methods.no_optimizer:NoOptimizer",
    "lomo": "harness.run.methods.lomo:LomoMethod",
    "flashoptim": "harness.run.methods.flashoptim:FlashOptimMethod",
    "adamw8bit_bnb": "harness.run.methods.adamw8bit_bnb:BnbAdamW8bit",
    "adamw8bit_torchao": "harness.run.methods.adamw8bit_torchao:TorchaoAdamW8bit",
    "forge": "harness.run.methods.forge:Forge",
    "torch_rule": "harness.run.methods.torch_rule:TorchRule",
}

SUMMARIES = {
    "fused_adamw": "torch.optim.AdamW(fused=True): the reference every ratio is taken against",
    "fused_adamw_fp32grad": "AdamW from fp32 main_grad buffers the wgrad GEMM writes (bf16 weights "
    "and states, 10 B/param): the paper's Megatron-style baseline",
    "adamw_in_backward_fp32grad": "the same AdamW from fp32 wgrad GEMM gradients, stepped inside "
    "backward, one fp32 gradient alive at a time",
    "adamw_in_backward": "torch's post-accumulate-grad hook pattern, one AdamW per parameter",
    "no_optimizer": "forward + backward, gradients dropped as they appear: the floor",
    "lomo": "lomo-optim's Lomo (SGD) or AdaLomo, the update fused into backward hooks",
    "flashoptim": "FlashOptim's FlashAdamW, optionally with enable_gradient_release (CUDA)",
    "adamw8bit_bnb": "bitsandbytes' AdamW8bit: block-wise 8-bit moments",
    "adamw8bit_torchao": "torchao.optim.AdamW8bit: 8-bit moments as tensor subclasses (CUDA)",
    "forge": "forge.attach: the update fused into the weight-gradient GEMM",
    "torch_rule": "torch.optim's twin of a FORGE rule (FORGE's test oracle), stepped after backward",
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
        capturable = ", ".join(n for n in REGISTRY if get(n).graph_capturable)
        return (
            f"method {cls.name or cls.__name__!r} cannot capture its step in a CUDA graph; "
            f"set method.cuda_graph=false, or use one that can: {capturable}"
        )
    reason = cls.unavailable_reason(device, make_options(name, options))
    return reason or (cls.graph_unavailable_reason(device) if cuda_graph else None)
