"""What one launch of the fused kernel costs the host before the driver, measured without a GPU.

    python scripts/measure_launch_host.py            # Llama k_proj at T = 1024, AdamW, bf16 states

Two figures, medians over a few thousand calls of `forge.kernels.wgrad_update.wgrad_update` on CPU
tensors (nothing runs; the launcher is replaced by a recorder):

- FORGE's wrapper: the problem's key and cached plan, the two TMA tensor descriptors, the argument
  list (what a launch costs before `forge.kernels.launch.DirectLauncher` calls Triton's C launcher);
- the same plus Triton's own Python dispatch (the binder that specializes every argument, then the
  compiled-kernel cache key), as `JITFunction.run` does it for Hopper before calling its C launcher:
  what each launch paid before the direct launches, and what the first launch of a key still pays.

What it cannot see: the C launcher (argument packing, encoding the TMA descriptors) and the
driver's launch call. On the GPU machine small FORGE kernels show a floor of about 0.12-0.15 ms a
call whatever their work (docs/perf-notes.md); this says how much of that is Python.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # build Triton's real (GPU) dispatch, not the interpreter's
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere, installed or not

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

import forge.kernels.wgrad_update as wu  # noqa: E402
from forge.rules import get_rule, resolve_hparams  # noqa: E402


class _Recorder:
    """Stands in for the wrapper's launcher: runs Triton's binder and cache key, or nothing."""

    def __init__(self, kernel) -> None:
        self.binder = create_function_from_signature(
            kernel.signature, kernel.params, make_backend(GPUTarget("cuda", 90, 32))
        )
        self.key_cache: dict = {}
        self.bind = False

    def __call__(self, key, grid, args, constexprs, options):
        if self.bind:
            # what JITFunction.run adds to the options
            _bound, specialization, opts = self.binder(
                *args, **constexprs, **options, debug=False, instrumentation_mode=""
            )
            compute_cache_key(self.key_cache, specialization, opts)


def _median_us(call, n: int = 3000) -> float:
    for _ in range(200):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    recorder = _Recorder(wu._wgrad_update_kernel)
    wu._launch = recorder
    wu._can_use_tma = lambda t: True  # CPU tensors: build the descriptors as on a Hopper GPU
    wu.interpreting = lambda: False
    T, N, K = 1024, 1024, 4096
    dy, x = torch.randn(T, N, dtype=torch.bfloat16), torch.randn(T, K, dtype=torch.bfloat16)
    w = torch.randn(N, K, dtype=torch.bfloat16)
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    rule = get_rule("adamw")
    h = resolve_hparams(rule, dict(lr=1e-3))
    coefficients, flags = rule.coefficients(h, 3, {}), rule.flags(h)

    def call():
        wu.wgrad_update(
            w,
            (m, v, None),
            (None,) * 3,
            (True, False, False),
            dy,
            x,
            coefficients,
            7,
            rule="adamw",
            flags=flags,
            state_dtype="bf16",
            stochastic_rounding=True,
        )

    wrapper, dispatch = [], []
    for _ in range(5):  # interleaved rounds; the fastest median of each is the least disturbed
        recorder.bind = False
        wrapper.append(_median_us(call))
        recorder.bind = True
        dispatch.append(_median_us(call))
    w_us, d_us = min(wrapper), min(dispatch)
    print(
        f"FORGE wrapper: {w_us:.1f} us a launch; with Triton's binder and cache key: {d_us:.1f} us "
        f"(Triton's Python dispatch {d_us - w_us:.1f} us); C launcher and driver not included"
    )


if __name__ == "__main__":
    main()
