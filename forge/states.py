"""How a FORGE optimizer stores its states: per parameter, in fp32, bf16 or int8, laid out like it.

Each parameter's state (`optimizer.state[p]`) holds its step count, the rule's host values (NAdam's
mu product) and the rule's slots, named as torch.optim names them (`exp_avg`, `exp_avg_sq`,
`momentum_buffer`, `square_avg`, `grad_avg`, `sum`), allocated when the optimizer is built:

    fp32, bf16   a tensor like the parameter (its local shard, for a DTensor), in that dtype
    int8         codes like the parameter (int8 for signed states, uint8 for positive ones) and
                 `<name>_absmax`, one bf16 scale per `int8_group` (64 or 128) elements of a row;
                 weights only: a vector (norm weight, bias) keeps bf16 states, so that a scale
                 group never straddles two FSDP2 shards, which split a vector along its length
    residual     `weight_residual`, bf16, with master_weights="bf16+kahan": what rounding the
                 weight to bf16 lost (`forge.kernels.update_tile`)

A sharded parameter's states are DTensors laid out like it, so torch.distributed.checkpoint saves
and reshards them as it does the weights. Loading keeps every tensor's own dtype (torch.optim's
loader would cast a state to its parameter's), and `convert` takes a torch.optim state of the same
rule into this storage (fp32 copied, bf16 rounded to nearest, int8 quantized with fresh scales).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from forge.distributed import is_dtensor, like_param, local

STATE_DTYPES = ("fp32", "bf16", "int8")  # what `state_dtype` may name (forge.STATE_DTYPES)
INT8_GROUPS = (64, 128)  # what `int8_group` may name: elements per int8 scale (forge.kernels.quant)
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # int8: codes and scales (`quantize`)


class Slots(NamedTuple):
    """The tensors one parameter's step writes besides the parameter (see the module)."""

    states: tuple  # three state tensors or None, laid out like the parameter (its local shard)
    scales: tuple  # their int8 block scales (rows, ceil(cols / group)) bf16, or None
    signed: tuple  # whether each state's int8 codes are signed
    residual: torch.Tensor | None = None  # bf16 residual of a compensated bf16 weight

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step writes besides the parameter, in one order: the states, their
        scales, the residual (torch.compile's ops declare them mutated, `forge.ops`)."""
        return [t for t in (*self.states, *self.scales, self.residual) if t is not None]

    def with_tensors(self, tensors: list[torch.Tensor]) -> Slots:
        """These slots with `tensors`, in the order of `tensors()`, in place of their own (the
        functional copies torch.compile's ops are handed)."""
        given = iter(tensors)
        states = tuple(None if t is None else next(given) for t in self.states)
        scales = tuple(None if t is None else next(given) for t in self.scales)
        residual = None if self.residual is None else next(given)
        return Slots(states, scales, self.signed, residual)


def quantize(values: torch.Tensor, signed: bool, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes and bf16 scales (rows, ceil(cols / group)) of `values`, as the kernels store them:
    `forge.kernels.quant`, loaded at the first int8 state."""
    from forge.kernels.quant import quantize as quantize_codes

    return quantize_codes(values, signed, group)


def stored(values: torch.Tensor, state_dtype: str, signed: bool, group: int = 64) -> torch.Tensor:
    """`values` (fp32) as a state of `state_dtype` holds them, read back in fp32: fp32 as they are,
    bf16 rounded to nearest, int8 through the kernels' codes and scales (`quantize`), as the
    kernels round them. A vector's int8 state is kept in bf16 (see the module)."""
    if state_dtype == "fp32":
        return values.float()
    if state_dtype == "int8" and values.dim() > 1:
        from forge.kernels.quant import dequantize

        codes, scales = quantize(values.float(), signed, group)
        return dequantize(codes, scales, signed, group)
    return values.to(torch.bfloat16).float()


def state_bytes(state_dtype: str, int8_group: int = 64) -> float:
    """Bytes a state tensor takes per element of its parameter: 4, 2, or an int8 code and its share
    of a bf16 scale (a memory model's figure; vectors keep bf16 states under int8, `dtype_of`)."""
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype={state_dtype!r} is not supported; choose one of {list(STATE_DTYPES)}")
    return {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 2.0 / int8_group}[state_dtype]


class StateStorage:
    """The storage of one optimizer's states: `state_dtype`, `int8_group`, and whether bf16 weights
    carry a residual (`kahan`)."""

    def __init__(self, state_dtype: str, int8_group: int, kahan: bool):
        if state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"state_dtype={state_dtype!r} is not supported; choose one of {list(STATE_DTYPES)}"
            )
        if int8_group not in INT8_GROUPS:
            raise ValueError(
                f"int8_group={int8_group!r} is not supported; choose one of {list(INT8_GROUPS)} "
                "(elements per int8 scale)"
            )
        self.state_dtype = state_dtype
        self.int8_group = int(int8_group)
        self.kahan = kahan

    def options(self) -> dict:
        """The choices a saved state only makes sense under (`ForgeOptimizer.storage_options`)."""
        return {"state_dtype": self.state_dtype, "int8_group": self.int8_group}

    def dtype_of(self, p: torch.Tensor) -> str:
        """The storage of p's states: `state_dtype`, but bf16 for a vector under int8 (see the module)."""
        return "bf16" if self.state_dtype == "int8" and p.dim() < 2 else self.state_dtype

    def allocate(self, p: torch.Tensor, state: dict, slots: tuple, group: dict) -> None:
        """p's state tensors into `state`: every slot of the rule at its initial value, and the residual."""
        shard = local(p)  # a DTensor's states hold only this rank's shard, laid out like p
        if self.kahan:  # what the weight's rounding to bf16 lost: nothing yet
            state["weight_residual"] = like_param(p, torch.zeros_like(shard))
        dtype = self.dtype_of(p)
        for slot in slots:
            if slot is None:
                continue
            init = group["initial_accumulator_value"] if slot.name == "sum" else 0.0
            if dtype == "int8":
                values = torch.full_like(shard, init, dtype=torch.float32)
                codes, scale = quantize(values, slot.signed, self.int8_group)
                state[slot.name] = like_param(p, codes)
                state[slot.name + "_absmax"] = like_param(p, scale, scale_group=self.int8_group)
            else:
                state[slot.name] = like_param(p, torch.full_like(shard, init, dtype=_TORCH_DTYPES[dtype]))

    def slots_of(self, state: dict, slots: tuple) -> Slots:
        """The kernels' view of a state: local tensors, three slots each (None where the rule has none)."""
        return Slots(
            states=tuple(local(state[s.name]) if s else None for s in slots),
            scales=tuple(local(state.get(s.name + "_absmax")) if s else None for s in slots),
            signed=tuple(bool(s and s.signed) for s in slots),
            residual=local(state["weight_residual"]) if self.kahan else None,
        )

    @torch.no_grad()
    def convert(self, p: torch.Tensor, state: dict, saved: dict, slots: tuple, name: str, rule: str) -> None:
        """A torch.optim state of the same rule (`saved`) into p's own slots (see the module)."""
        slots = {slot.name: slot for slot in slots if slot is not None}
        host = {k for k, v in state.items() if not isinstance(v, torch.Tensor)}  # step, NAdam's mu_product
        unknown = sorted(set(saved) - set(slots) - host)
        missing = sorted(set(slots) - set(saved))
        if unknown or missing:
            raise ValueError(
                f"the state of {name} has {sorted(saved)}, this optimizer's {rule} keeps "
                f"{sorted(slots)}: convert=True loads the state of the same rule (with its options, e.g. no "
                "amsgrad), as torch.optim saves it"
            )
        if is_dtensor(p):
            raise ValueError(f"{name} is a DTensor: convert=True loads the states of plain tensors")
        for key in host & set(saved):
            value = saved[key]
            state[key] = type(state[key])(value.item() if isinstance(value, torch.Tensor) else value)
        if "step" in host and "step" not in saved and slots:  # torch's SGD: a buffer means a step was taken
            state["step"] = type(state["step"])(max(state["step"], 1))
        for key, slot in slots.items():
            value = saved[key]
            if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                shape = tuple(getattr(value, "shape", ()))
                raise ValueError(
                    f"state {key!r} of {name} is {type(value).__name__} {shape}, "
                    f"not a tensor of shape {tuple(p.shape)}"
                )
            value = value.to(device=p.device, dtype=torch.float32)
            if self.dtype_of(p) == "int8":
                codes, scale = quantize(value, slot.signed, self.int8_group)
                state[key].copy_(codes)
                state[key + "_absmax"].copy_(scale)
            else:
                state[key].copy_(value)

    @staticmethod
    def check_saved(state: dict, saved: dict, name: str) -> None:
        """Refuse a saved state whose tensors are not p's own in shape and dtype, saying which."""
        for key, value in saved.items():
            current = state.get(key)
            if not isinstance(current, torch.Tensor):
                continue
            if (
                not isinstance(value, torch.Tensor)
                or value.shape != current.shape
                or value.dtype != current.dtype
            ):
                raise ValueError(
                    f"state {key!r} of {name} was saved as {getattr(value, 'dtype', type(value))} "
                    f"{tuple(getattr(value, 'shape', ()))}, this optimizer holds {current.dtype} "
                    f"{tuple(current.shape)}: attach with the same rule, options, state_dtype and "
                    "int8_group as the run that saved it"
                )

    @staticmethod
    def load(state: dict, saved: dict) -> None:
        """FORGE's own saved state (checked by `check_saved`) into p's: tensors copied in place."""
        for key, value in saved.items():
            current = state.get(key)
            if isinstance(current, torch.Tensor):
                current.copy_(value)
            else:
                state[key] = value
