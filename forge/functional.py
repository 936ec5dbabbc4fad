"""FORGE's kernels as plain functions: explicit tensors in, tensors updated in place.

This module is forge's one door to its Triton kernels (`forge.kernels`): the optimizer, the layers
and the tools (the harness's kernel lab, the benchmarks) call these functions, and nothing else in
forge imports a kernel. Each takes what one step needs and nothing of the optimizer:

    fused_wgrad_update(weight, dy, x, slots, coefficients, seed, options)   an nn.Linear weight's
        step inside its dW GEMM: dW = dy^T x accumulated tile by tile in fp32 registers and
        consumed there by the rule; dW is never stored
    elementwise_update(param, grad, slots, coefficients, seed, options)     any parameter's step
        from its materialized gradient (embeddings, norms, biases; every parameter under data
        parallelism, from the reduced gradient)
    wgrad_norm_power_sum(dy, x, norm_type)     sum |dy^T x|^p without storing dy^T x (clipping)
    quantize(values, signed, group), dequantize(codes, scales, signed, group)   int8 states
    fp8_cast(t, dtype, rows, transposed)       the FP8 copies of a GEMM operand (two launches)

What the arguments are:
- `slots`: a `Slots`, the tensors a step writes besides the weight: up to three state tensors
  (None where the rule has fewer), their int8 block scales (None unless int8), whether each state is
  signed (int8 codes: companded signed or square-root unsigned), and the compensated weight's bf16
  residual (None unless master_weights="bf16+kahan"). `ForgeOptimizer.slots_of(p)` gives a
  parameter's.
- `coefficients`: the rule's nine fp32 scalars for this step (lr, betas' powers, weight decay...,
  `forge.rules`), and `seed` the step's stochastic-rounding seed; with `step_row` (an int32 row of
  `step_row_words()` words on the device) the kernel reads both from memory instead, so a CUDA graph
  can replay the launch with each step's values.
- `options`: an `UpdateOptions`, how the rule runs: its name and flags, the states' storage, the
  rounding of bf16 weights, the int8 group. `ForgeOptimizer.options_of(p)` gives a parameter's.
- `grad_scale`: a one-element fp32 tensor the gradient is multiplied by first (the clip
  coefficient; FP8 operands' dequantization scale).

Importing this module imports no Triton: the kernels load at the first call (`forge.backend` decides
then whether they run compiled or in Triton's CPU interpreter), so `import forge` stays light.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


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


class UpdateOptions(NamedTuple):
    """How a rule's step runs (see the module): the same for every launch of one parameter."""

    rule: str
    flags: dict  # the rule's structural options (momentum, nesterov, centered...: `forge.rules`)
    state_dtype: str  # "fp32" | "bf16" | "int8"
    stochastic_rounding: bool  # bf16 weights rounded stochastically (else to nearest)
    int8_group: int = 64  # elements per int8 scale


def step_row_words() -> int:
    """int32 words in one parameter's step row: h0..h8 as fp32 bits, the seed, then padding."""
    from forge.kernels.update_tile import STEP_ROW

    return STEP_ROW


def fused_wgrad_update(
    weight: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    slots: Slots,
    coefficients: tuple,
    seed: int,
    options: UpdateOptions,
    *,
    step_row: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
    config=None,
) -> None:
    """One step of `weight` (N, K) from dW = dy^T x, fused into the dW GEMM (dy: (T, N), x: (T, K);
    FP8 operands T-contiguous with `grad_scale`). `config`: a `forge.kernels.KernelConfig` to launch
    under (benchmarks, the tuner); by default the shipped table's choice."""
    from forge.kernels.wgrad_update import wgrad_update  # loaded at the first launch (see the module)

    wgrad_update(
        weight, slots.states, slots.scales, slots.signed, dy, x, coefficients, seed,
        rule=options.rule, flags=options.flags, state_dtype=options.state_dtype,
        stochastic_rounding=options.stochastic_rounding, int8_group=options.int8_group,
        step_values=step_row, config=config, grad_scale=grad_scale, residual=slots.residual,
    )  # fmt: skip


def elementwise_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    slots: Slots,
    coefficients: tuple,
    seed: int,
    options: UpdateOptions,
    *,
    step_row: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
) -> None:
    """One step of `param` (any shape, contiguous) from its gradient `grad` (its shape, any float dtype)."""
    from forge.kernels.elementwise_update import elementwise_update as update

    update(
        param, grad, slots.states, slots.scales, slots.signed, coefficients, seed,
        rule=options.rule, flags=options.flags, state_dtype=options.state_dtype,
        stochastic_rounding=options.stochastic_rounding, int8_group=options.int8_group,
        step_values=step_row, grad_scale=grad_scale, residual=slots.residual,
    )  # fmt: skip


def wgrad_norm_power_sum(dy: torch.Tensor, x: torch.Tensor, norm_type: float = 2.0) -> torch.Tensor:
    """sum |dy^T x|^p (the max of |dy^T x| for p = inf) as a 0-dim fp32 tensor, dy^T x never stored:
    the fused kernel's main loop with a reducing epilogue. dy: (T, N), x: (T, K), one dtype."""
    from forge.kernels.wgrad_norm import wgrad_norm_partial

    return wgrad_norm_partial(dy, x, norm_type)


def quantize(values: torch.Tensor, signed: bool, group: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes shaped like `values` and bf16 scales (rows, ceil(cols / group)), as kernels store them."""
    from forge.kernels.quant import quantize as quantize_codes

    return quantize_codes(values, signed, group)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, signed: bool, group: int = 64) -> torch.Tensor:
    """fp32 values from int8 codes and their scales (the inverse of `quantize`, to its rounding)."""
    from forge.kernels.quant import dequantize as dequantize_codes

    return dequantize_codes(codes, scales, signed, group)


def fp8_cast(t: torch.Tensor, dtype: torch.dtype, *, rows: bool = True, transposed: bool = False):
    """(t8 row-major or None, its transpose row-major or None, inverse scale) of a 2-D CUDA tensor:
    its maximum, then the casts, in two launches (`forge.fp8` on a GPU)."""
    from forge.kernels import fp8_cast as kernel

    return kernel.cast(t, dtype, rows=rows, transposed=transposed)
