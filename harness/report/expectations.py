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

The ceilings are those measured on the card the records ran on, as its conf/gpu file states them
(`matmul_tflops`, `copy_tbps`; `ceilings`): for the H200, 800 TFLOP/s and 4.27 TB/s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.points import options_dict
from harness.run import gpus, methods
from harness.run.methods.footprint import DTYPE_BYTES, Footprint

GIB = 2**30


@dataclass(frozen=True)
class Ceilings:
    """The rates a step's floors are drawn at: a card's measured bf16 matmul and device copy."""

    gpu: str  # how text names the card ("H200")
    matmul_tflops: float
    copy_tbps: float

    @property
    def matmul_flops(self) -> float:
        return float(round(self.matmul_tflops * 1e12))  # whole FLOP/s: 4.27 * 1e12 is off by an ulp

    @property
    def copy_bytes_per_s(self) -> float:
        return float(round(self.copy_tbps * 1e12))

    @property
    def rates(self) -> str:
        """The two rates as text: "800 TFLOP/s, 4.27 TB/s"."""
        return f"{self.matmul_tflops:g} TFLOP/s, {self.copy_tbps:g} TB/s"


def ceilings(records: Iterable[Mapping[str, Any]]) -> Ceilings | None:
    """The ceilings of the card the records ran on (`gpus.ran_on`: its conf/gpu file, or the copy a
    record keeps), the card most of them ran on where several did; None where no record ran on a
    card whose ceilings are known (CPU points, a card without measured ceilings)."""
    found: Counter[Ceilings] = Counter()
    for record in records:
        kind = gpus.ran_on(record)
        if kind is not None and kind.matmul_tflops is not None and kind.copy_tbps is not None:
            found[Ceilings(gpus.title(kind), float(kind.matmul_tflops), float(kind.copy_tbps))] += 1
    return found.most_common(1)[0][0] if found else None


def footprint(method: str, options: Any = None, master_weights: Any = None) -> Footprint | None:
    """Expected bytes per parameter of `method` (its class's `Method.footprint`, from the options
    and master weights a record keeps), or None for a method without a model or not registered."""
    opts = options_dict(options)
    w = DTYPE_BYTES.get(str(master_weights or opts.get("master_weights") or "bf16").split("+")[0], 2.0)
    known = methods.registry().get(str(method))
    return known.footprint(opts, w) if known is not None else None


def static_gib(fp: Footprint, n_params: float) -> float:
    """Weights + gradients + states in GiB for `n_params` parameters."""
    return static_gib_of(fp.total, n_params)


def static_gib_of(bytes_per_param: float, n_params: float) -> float:
    return bytes_per_param * n_params / GIB


def update_floor_ms(fp: Footprint, n_params: float, ceilings: Ceilings) -> float:
    """Least time the optimizer update's memory traffic takes at the copy rate, in ms."""
    return fp.update_traffic * n_params / ceilings.copy_bytes_per_s * 1e3


def compute_floor_ms(
    n_params: float, tokens: float, ceilings: Ceilings, checkpointing: bool = False
) -> float:
    """Least time the step's matrix work takes (6 or 8 FLOPs per parameter per token) at the matmul
    rate, in ms."""
    per_token = 8.0 if checkpointing else 6.0
    return per_token * n_params * tokens / ceilings.matmul_flops * 1e3
