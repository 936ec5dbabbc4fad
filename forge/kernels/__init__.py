"""FORGE's Triton kernels.

- `wgrad_update`: the fused weight-gradient GEMM + optimizer update of one nn.Linear weight.
- `elementwise_update`: the same update for any other parameter, from its gradient.
- `quant`: int8 block quantization of optimizer states (one scale per 64 elements).
- `rounding`: fp32 -> bf16 rounding, stochastic for weights, nearest-even (also on the interpreter).
- `launch`: launches of a compiled kernel that skip Triton's per-call dispatch (host time).

On a machine without CUDA, `forge` sets TRITON_INTERPRET=1 before these modules are imported and
the same kernels run in Triton's interpreter on CPU tensors (slowly: test at small shapes).
"""

import os


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Host-side integer helpers: triton.cdiv is a @jit function, and calling it from Python costs
# microseconds per call on the launch path (measured: 10 us of 27 us host overhead per launch).
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
