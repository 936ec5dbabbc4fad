"""FORGE's Triton kernels, and what a tool needs to launch, build or time them.

- `wgrad_update`: the fused weight-gradient GEMM + optimizer update of one nn.Linear weight (the
  Triton kernel and its launcher), which hands Hopper launches to `wgrad_update_ws`, its
  warp-specialized Gluon twin, where `configs` says so.
- `wgrad_tile`: the main loop both weight-gradient kernels run, one fp32 tile of dW = dy^T x
  summed over all tokens in registers, and the grouped order of the tiles (which the Gluon twin
  takes too).
- `wgrad_norm`: the same tiles reduced to a norm instead of applied (global-norm clipping).
- `configs`: `KernelConfig`, the launch configs measured offline, and the plan of a launch.
- `elementwise_update`: the same update for any other parameter, from its gradient.
- `vector_update`: the same update for many vectors (norm weights, biases) in one launch, each
  with its own step's scalars (`forge.vectors`).
- `update_tile`: the tile update every update kernel ends in, and the arguments the launchers
  build for it (`epilogue_constexprs`, `slot_arguments`, `step_arguments`); `rules` (the eight
  rules on fp32 tiles, whose host half and PyTorch references are `forge.rules`), `quant` (int8
  states, one scale per 64 or 128 elements) and `rounding` (fp32 -> bf16, stochastic for weights)
  beneath it.
- `launch`: launches of a compiled kernel that skip Triton's per-call dispatch (host time).
- `fp8_cast`: the FP8 casts of `forge.fp8` (a tensor's maximum, then the cast) in two launches.

Importing this package is FORGE's first use of Triton: `forge.backend.prepare` decides here,
before Triton is imported, whether the kernels run compiled or in Triton's CPU interpreter (on a
machine without CUDA: the same kernels on CPU tensors, slowly; test at small shapes). A tool that
wants compiled kernels on a CPU machine sets TRITON_INTERPRET=0 before importing it.

The names below are the public ones: `forge.kernels.wgrad_update` is the launcher function, not its
module.
"""

from forge.backend import interpreting, prepare

prepare()  # before the first import of Triton below

from forge.kernels.configs import (  # noqa: E402
    FP8_WARP_SPECIALIZED,
    FP8_WARP_SPECIALIZED_SMALL_T,
    PINGPONG_CONFIGS,
    PINGPONG_FED_CONFIGS,
    WARP_SPECIALIZED_DEFAULTS,
    KernelConfig,
    fp8_config,
    fp8_warp_specialized,
    pick_config,
)
from forge.kernels.elementwise_update import elementwise_update, elementwise_update_kernel  # noqa: E402
from forge.kernels.elementwise_update import num_warps as elementwise_num_warps  # noqa: E402
from forge.kernels.update_tile import STEP_ROW, epilogue_constexprs, slot_arguments, step_arguments  # noqa: E402
from forge.kernels.wgrad_update import wgrad_update, wgrad_update_kernel  # noqa: E402

try:  # Gluon (Triton >= 3.5): the warp-specialized kernel for Hopper
    from forge.kernels.wgrad_update_ws import max_registers as ws_max_registers
    from forge.kernels.wgrad_update_ws import wgrad_update_ws_kernel
except ImportError:  # pragma: no cover - an older Triton
    wgrad_update_ws_kernel = ws_max_registers = None

__all__ = [
    "FP8_WARP_SPECIALIZED",
    "FP8_WARP_SPECIALIZED_SMALL_T",
    "PINGPONG_CONFIGS",
    "PINGPONG_FED_CONFIGS",
    "STEP_ROW",
    "WARP_SPECIALIZED_DEFAULTS",
    "KernelConfig",
    "elementwise_num_warps",
    "elementwise_update",
    "elementwise_update_kernel",
    "epilogue_constexprs",
    "fp8_config",
    "fp8_warp_specialized",
    "interpreting",
    "pick_config",
    "slot_arguments",
    "step_arguments",
    "wgrad_update",
    "wgrad_update_kernel",
    "wgrad_update_ws_kernel",
    "ws_max_registers",
]
