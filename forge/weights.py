"""The weights FORGE trains: their dtypes, how bf16 ones keep their precision, and what a parameter
must be before an optimizer takes it.

FORGE updates fp32 and bf16 weights (`WEIGHT_DTYPES`). An fp32 weight holds every update. A bf16
weight cannot hold an update smaller than half its last place, so FORGE offers three ways to write
one back (`MASTER_WEIGHTS`, `forge.attach(..., master_weights=...)`):

    "bf16+sr"      stochastic rounding: the stored value equals the fp32 result in expectation
    "bf16"         round to nearest (updates below half an ulp are lost)
    "bf16+kahan"   a bf16 residual beside each weight keeps what rounding lost (2 bytes a parameter,
                   the optimizer state `weight_residual`, `forge.kernels.update_tile`)
    None           as the older switch `stochastic_rounding` says ("bf16+sr" or "bf16")

`weight_format` resolves the two options into a `WeightFormat`, whose `name` is what a state dict
and a checkpoint record (`ForgeOptimizer.storage_options`): a run resumed under another format is
refused. `check_param` refuses, naming the parameter and saying what to do, a tensor the kernels
cannot update in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge.backend import interpreting
from forge.distributed import check_param as check_tensor_parallel_param
from forge.distributed import check_sharded_param, is_dtensor

MASTER_WEIGHTS = (None, "bf16+sr", "bf16", "bf16+kahan")
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class WeightFormat:
    """How bf16 weights are written back: rounded stochastically, or compensated by a residual
    (`kahan`), else rounded to nearest."""

    stochastic_rounding: bool
    kahan: bool

    @property
    def name(self) -> str:
        """The `MASTER_WEIGHTS` entry this format is (never None)."""
        return "bf16+kahan" if self.kahan else "bf16+sr" if self.stochastic_rounding else "bf16"


def weight_format(master_weights: str | None, stochastic_rounding: bool = True) -> WeightFormat:
    """The format `master_weights` names (None: as `stochastic_rounding` says), or a ValueError."""
    if master_weights not in MASTER_WEIGHTS:
        raise ValueError(
            f"master_weights={master_weights!r} is not supported; choose one of {list(MASTER_WEIGHTS)} "
            "(None: as stochastic_rounding says)"
        )
    if master_weights is not None:
        stochastic_rounding = master_weights == "bf16+sr"
    kahan = master_weights == "bf16+kahan"
    return WeightFormat(stochastic_rounding=bool(stochastic_rounding) and not kahan, kahan=kahan)


def check_param(name: str, p: torch.Tensor, weights: WeightFormat, *, sharded: bool, clipped: bool) -> None:
    """Refuse a parameter FORGE cannot update, before anything is built for it. `sharded`: under
    FSDP2 (every parameter a DTensor from `fully_shard`); `clipped`: with `max_grad_norm`."""
    if sharded:
        check_sharded_param(name, p)  # FSDP2: sharded over its mesh (2-D with TP), any placement
    else:
        check_tensor_parallel_param(name, p)  # a tensor-parallel DTensor: 1-D mesh, sharded or replicated
    if clipped and is_dtensor(p):
        raise NotImplementedError(
            f"{name} is a tensor-parallel DTensor, and FORGE's max_grad_norm does not yet reduce the "
            "norm over the ranks of a mesh. Attach without max_grad_norm for tensor-parallel training."
        )
    if weights.kahan and p.dtype != torch.bfloat16:
        raise TypeError(
            f"{name} has dtype {p.dtype}; master_weights='bf16+kahan' compensates bf16 weights. Convert "
            "the model to bf16 (model.to(torch.bfloat16)) first, or leave master_weights unset for "
            "fp32 weights, which need no compensation."
        )
    if p.dtype not in WEIGHT_DTYPES:
        raise TypeError(
            f"{name} has dtype {p.dtype}; FORGE updates fp32 and bf16 weights only. "
            "Convert the model (model.to(torch.bfloat16) or .float()) before forge.attach."
        )
    if not p.is_contiguous():
        raise ValueError(
            f"{name} is not contiguous; FORGE updates weights in place and needs them contiguous"
        )
    _check_device(name, p)


def checked_params(params, name_of, weights: WeightFormat, *, sharded: bool, clipped: bool) -> list:
    """A param group's `params` (a tensor or an iterable, consumed once) as a list, each tensor among
    them passed by `check_param` under the name `name_of(p)` (anything else torch.optim refuses)."""
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    for p in params:
        if isinstance(p, torch.Tensor):
            check_param(name_of(p), p, weights, sharded=sharded, clipped=clipped)
    return params


def _check_device(name: str, p: torch.Tensor) -> None:
    if p.device.type == "cpu" and not interpreting():
        raise RuntimeError(
            f"{name} is on the CPU but Triton's interpreter is off. Move the model to a CUDA device, "
            "or set TRITON_INTERPRET=1 before FORGE's first use to run the kernels on the CPU (slow)."
        )
    if p.device.type not in ("cuda", "cpu"):
        raise RuntimeError(
            f"{name} is on {p.device}; FORGE's kernels run on CUDA devices (or the CPU interpreter)"
        )


@torch.no_grad()
def load_master_weights(
    groups: list[dict], masters: list[torch.Tensor], states: dict, name_of, weights: WeightFormat
) -> None:
    """Set every parameter of `groups` from its fp32 master in `masters`, in order
    (`ForgeOptimizer.load_master_weights`): fp32 weights copied, bf16 ones rounded to nearest, and
    compensated ones keeping what that rounding lost as their residual (the state `weight_residual`
    in `states`). Everything is checked before any weight changes."""
    params = [p for group in groups for p in group["params"]]
    if len(masters) != len(params):
        raise ValueError(
            f"got {len(masters)} master weights for {len(params)} parameters: give one per "
            "parameter, in the order of param_groups"
        )
    for p, master in zip(params, masters):
        if is_dtensor(p):
            raise ValueError("load_master_weights sets plain tensors; a DTensor parameter holds a shard")
        if tuple(master.shape) != tuple(p.shape):
            raise ValueError(
                f"the master weight for {name_of(p)} has shape {tuple(master.shape)}, not {tuple(p.shape)}"
            )
    for p, master in zip(params, masters):
        master = master.to(device=p.device, dtype=torch.float32)
        p.copy_(master)
        if weights.kahan:
            states[p]["weight_residual"].copy_(master - p.float())
