"""What a method should cost before we measure it: bytes per parameter and the step's floors.

Memory. At the peak of a training step every method holds its weights and optimizer states; a
method that runs the optimizer after backward also holds the whole weight gradient (the "gradient
floor"). Per parameter, with bf16 weights:

    fused AdamW (bf16 states)   2 weights + 2 gradient + 2x2 states        = 8 B
    FORGE (bf16 states)         2 weights + 0 gradient + 2x2 states        = 6 B  (-2 B: the gradient)
    FORGE (int8 states)         2 weights + 0 gradient + 2x(1 + 2/64)      = 4.0625 B

FORGE saves the gradient's 2 B/param outright; state compression (int8) saves more on top, and is
orthogonal. At Llama-3.1-8B's 8.03 B parameters, 2 B/param is 15.0 GiB.

Time. A step cannot beat its matrix work: about 6 FLOPs per parameter per token for forward and
backward (8 with activation checkpointing, which re-runs the forward), at the GPU's measured bf16
matmul rate. The optimizer update is memory-bound: a separate optimizer moves
`2 x gradient + 2 x weights + 2 x states` bytes per parameter (the gradient written by backward
and read back, weights and states read and written); FORGE moves only `2 x weights + 2 x states`,
and can hide even that under the weight-gradient GEMM. So the best FORGE can do is the step time
of 'no optimizer' (forward + backward alone), and fused AdamW's best is that plus its update
traffic over the copy bandwidth.

The ceilings are H200 figures measured on the machines behind these results: 790-814 TFLOP/s bf16
matmul and 4.25-4.29 TB/s device copy; we use 800 TFLOP/s and 4.27 TB/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.points import options_dict

GIB = 2**30
H200_MATMUL_FLOPS = 800e12
H200_COPY_BYTES_PER_S = 4.27e12

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "int8": 1.0}
RULE_STATES = {"adamw": 2, "nadam": 2, "radam": 2, "lion": 1, "rmsprop": 1, "adagrad": 1, "sgd": 1}


@dataclass(frozen=True)
class Footprint:
    """Bytes per parameter held at the step's peak, and moved by the optimizer update."""

    weights: float
    grads: float
    states: float
    update_traffic: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.states


def _state_bytes(dtype: str, block: int | None = None, scale_bytes: float = 4.0) -> float:
    """Bytes per element of one optimizer state, with its per-block scale where quantized."""
    base = DTYPE_BYTES.get(dtype, 2.0)
    return base + scale_bytes / block if dtype == "int8" and block else base


def _separate(weights: float, grads: float, states: float) -> Footprint:
    """A method whose optimizer reads a gradient the backward wrote to memory."""
    return Footprint(weights, grads, states, 2 * grads + 2 * weights + 2 * states)


def footprint(method: str, options: Any = None, master_weights: Any = None) -> Footprint | None:
    """Expected bytes per parameter of `method`, or None for a method we have no model of."""
    opts = options_dict(options)
    w = DTYPE_BYTES.get(str(master_weights or opts.get("master_weights") or "bf16").split("+")[0], 2.0)
    adam_state = _state_bytes(str(opts.get("state_dtype") or ("fp32" if w == 4.0 else "bf16")))
    builders = {
        "fused_adamw": lambda: _separate(w, w, 2 * adam_state),
        "fused_adamw_fp32grad": lambda: _separate(w, 4.0, 2 * _state_bytes("bf16")),
        "adamw_in_backward": lambda: Footprint(w, 0.0, 2 * adam_state, 4.0 + 2 * w + 4 * adam_state),
        "adamw_in_backward_fp32grad": lambda: Footprint(w, 0.0, 4.0, 8.0 + 2 * w + 8.0),
        "adamw8bit_bnb": lambda: _separate(w, 2.0, 2 * _state_bytes("int8", 256)),
        "adamw8bit_torchao": lambda: _separate(w, 2.0, 2 * _state_bytes("int8", 256)),
        "flashoptim": lambda: _flashoptim(opts),
        "lomo": lambda: Footprint(w, 0.0, 0.0, 4.0 + 2 * w),
        "no_optimizer": lambda: Footprint(w, 0.0, 0.0, 2.0),
        "forge": lambda: _forge(opts, w),
    }
    build = builders.get(method)
    return build() if build else None


def _forge(opts: Mapping[str, Any], weights: float) -> Footprint:
    rule = str(opts.get("rule") or "adamw")
    n_states = RULE_STATES.get(rule, 2)
    hparams = opts.get("hparams") if isinstance(opts.get("hparams"), Mapping) else {}
    if rule == "sgd" and not (opts.get("momentum") or hparams.get("momentum")):
        n_states = 0
    block = int(opts.get("int8_group") or 64)
    states = n_states * _state_bytes(str(opts.get("state_dtype") or "bf16"), block=block, scale_bytes=2.0)
    return Footprint(weights, 0.0, states, 2 * weights + 2 * states)


def _flashoptim(opts: Mapping[str, Any]) -> Footprint:
    """FlashAdamW: int8 states with an fp16 scale per 32, bf16 weights + 8-bit master correction."""
    states = 2 * _state_bytes("int8", block=32, scale_bytes=2.0)
    if opts.get("gradient_release") or opts.get("enable_gradient_release"):
        return Footprint(3.0, 0.0, states, 4.0 + 6.0 + 2 * states)
    return _separate(3.0, 2.0, states)


def static_gib(fp: Footprint, n_params: float) -> float:
    """Weights + gradients + states in GiB for `n_params` parameters."""
    return fp.total * n_params / GIB


def update_floor_ms(fp: Footprint, n_params: float, bandwidth: float = H200_COPY_BYTES_PER_S) -> float:
    """Least time the optimizer update's memory traffic takes, in ms."""
    return fp.update_traffic * n_params / bandwidth * 1e3


def compute_floor_ms(
    n_params: float, tokens: float, checkpointing: bool = False, flops: float = H200_MATMUL_FLOPS
) -> float:
    """Least time the step's matrix work takes (6 or 8 FLOPs per parameter per token), in ms."""
    per_token = 8.0 if checkpointing else 6.0
    return per_token * n_params * tokens / flops * 1e3
