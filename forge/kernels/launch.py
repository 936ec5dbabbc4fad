"""Launching a compiled Triton kernel again without Triton's per-call dispatch.

`kernel[grid](*args, **constexprs)` runs Triton's binder on every call: each argument is classified
(dtype and 16-byte alignment of a tensor, divisibility of an integer by 16) to find the compiled
specialization, a cache key is hashed, launch metadata and hooks are prepared, and only then the C
launcher packs the arguments and calls the driver. On the H200 machine's host that Python costs
17-24 us of a 32-47 us launch (results/device-logs/launch-breakdown-1024x1024x4096-20261129-053e2b9.json),
and a Llama-3.1-8B step launches the fused
kernel 225 times, on the host's critical path at batch 1.

`DirectLauncher` remembers, per device and per key the caller computes, the CompiledKernel Triton
returned the first time, and afterwards calls its C launcher directly. The key must determine the
specialization: callers put in it every compile-time argument and launch option, the exact value
of every integer argument, and `tensor_facts` of every tensor argument (a superset of what Triton
looks at, so two calls with one key always share one compiled kernel). The first call of a key,
any call while a Triton launch hook is installed (a profiler such as proton), and every call on
Triton's CPU interpreter take Triton's own path.
"""

from __future__ import annotations

import torch
from triton.runtime import driver

from forge.backend import interpreting

try:
    from triton import knobs  # Triton 3.4 and newer, where these launches were checked (3.6, 3.9)
except ImportError:
    knobs = None


# Host-side integer helpers: triton.cdiv is a @jit function, and calling it from Python costs
# microseconds per call on the launch path (measured: 10 us of 27 us host overhead per launch).
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 that is >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def tensor_facts(*tensors: torch.Tensor) -> tuple:
    """What Triton specializes a pointer argument on: its dtype and whether it is 16-byte aligned."""
    return tuple((t.dtype, t.data_ptr() % 16 == 0) for t in tensors)


def _launch_hooks_installed() -> bool:
    """A launch hook expects Triton's launch metadata (Triton 3.6 and newer hold an empty chain)."""
    if knobs is None:
        return True  # an older Triton: always its own path
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


# Whether the compiler may contract a * b + c into one fma. Triton's default has been on and turns
# off in 3.10, and either way the bits of a step move with it: FORGE's rules write as an explicit
# fma every sum of products torch.optim rounds as one, and were checked against it on the GPU with
# contraction on for the rest. Every launch and every offline build asks for it by name, so that a
# Triton upgrade cannot change the arithmetic unasked.
FP_FUSION = True


class DirectLauncher:
    """`kernel[grid](*args, **constexprs, **options)`, through Triton's dispatch once per key.

    `grid`: a tuple of one to three program counts. `args` are the kernel's runtime arguments in
    signature order and must come before all of its compile-time ones (`constexprs`, by name);
    `options` are launch options (num_warps, ...); `enable_fp_fusion` is always `FP_FUSION`.
    """

    max_entries = 4096  # exact integers in keys: a run of ever-new shapes must not grow it forever

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._interpreted = interpreting()  # as Triton decided when it decorated the kernel
        self._compiled: dict = {}
        self.direct_launches = 0  # for tests and benchmarks: calls that skipped Triton's dispatch

    def __call__(self, key, grid: tuple, args: tuple, constexprs: dict, options: dict) -> None:
        if self._interpreted:
            self.kernel[grid](*args, **constexprs, **options, enable_fp_fusion=FP_FUSION)
            return
        device = driver.active.get_current_device()
        entry = self._compiled.get((device, key))
        if entry is None or _launch_hooks_installed():  # Triton's own path: the options matter here only
            compiled = self.kernel[grid](*args, **constexprs, **options, enable_fp_fusion=FP_FUSION)
            if entry is None:
                self._remember(device, key, compiled, len(args), constexprs)
            return
        run, function, metadata, compile_time = entry
        stream = driver.active.get_current_stream(device)
        grid_x, grid_y, grid_z = grid + (1,) * (3 - len(grid))
        run(grid_x, grid_y, grid_z, stream, function, metadata, None, None, None, *args, *compile_time)
        self.direct_launches += 1

    def _remember(self, device, key, compiled, runtime_args: int, constexprs: dict) -> None:
        function = getattr(compiled, "function", None)
        if function is None:  # a Triton whose launch returns no compiled kernel
            return
        names = self.kernel.arg_names[runtime_args:]
        if set(names) != set(constexprs):
            raise ValueError(f"compile-time arguments must follow the runtime ones: expected {names}")
        if len(self._compiled) >= self.max_entries:
            self._compiled.clear()
        compile_time = tuple(constexprs[name] for name in names)
        self._compiled[(device, key)] = (compiled.run, function, compiled.packed_metadata, compile_time)
