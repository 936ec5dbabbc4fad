"""What a method should cost before we measure it: bytes per parameter and the step's floors.

Memory. At the peak of a training step every method holds its weights and optimizer states; a
method that runs the optimizer after backward also holds the whole weight gradient (the "gradient
floor"). Each method declares its model (`Method.footprint`, harness.run.methods.footprint). Per
parameter, with bf16 weights:

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

from typing import Any

from harness.points import options_dict
from harness.run import methods
from harness.run.methods.footprint import DTYPE_BYTES, Footprint

GIB = 2**30
H200_MATMUL_FLOPS = 800e12
H200_COPY_BYTES_PER_S = 4.27e12


def footprint(method: str, options: Any = None, master_weights: Any = None) -> Footprint | None:
    """Expected bytes per parameter of `method` (its class's `Method.footprint`, from the options
    and master weights a record keeps), or None for a method without a model or not registered."""
    opts = options_dict(options)
    w = DTYPE_BYTES.get(str(master_weights or opts.get("master_weights") or "bf16").split("+")[0], 2.0)
    known = methods.registry().get(str(method))
    return known.footprint(opts, w) if known is not None else None


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
