"""What one FORGE layer costs the host on the GPU machine, step by step down the launch path.

    python -m harness.kernels.launch_breakdown                  # Llama k_proj: T=1024, N=1024, K=4096
    python -m harness.kernels.launch_breakdown --shape 1024 2048 1024   # Qwen3-0.6B's q_proj
    python -m harness.kernels.launch_breakdown --tiny           # a CPU dry run (Triton's interpreter)

Why: on small models a FORGE step is host-bound: a small model at batch 1 keeps the GPU busy for a
tenth of its profiled step, and each ForgeLinear backward costs the host more than torch's
MmBackward0. This times, on the real kernel and through forge's public API, each layer of the
path, so the difference between two rows is what that layer costs:

- `mm`: cuBLAS's dW GEMM (`torch.mm(dy.t(), x)`), the launch the baseline pays instead;
- `wgrad_update`: FORGE's launcher (`forge.functional.fused_wgrad_update`, which calls
  `forge.kernels.wgrad_update`: key, cached plan, descriptors,
  argument list, the direct launch past Triton's binder) under the config shipped for this shape;
- `wgrad_update, host TMA` and `wgrad_update, pointers`: the same under `KernelConfig(tma="host")`
  (dy and x through two TMA descriptors encoded on every call) and `tma="none"` (masked pointer
  loads, shipped for GEMMs shorter than their launch);
- `update_linear`: the optimizer's step of one weight around that launch (its coefficients, seed
  and states: `ForgeOptimizer.update_linear`);
- `nn.Linear fwd+bwd` and `ForgeLinear fwd+bwd`: one layer's forward and backward through
  autograd, torch's (dW materialized, no optimizer) against FORGE's (update fused);
- `... , backward on this thread`: the same two with `torch.autograd.set_multithreading_enabled
  (False)`: on CUDA the autograd engine otherwise runs backward on a device thread, where
  FORGE's backward (Python) must take the GIL and torch's (C++) need not;
- `elementwise_update, norm`: the element-wise kernel on a K-wide vector (what each norm weight's
  hook launches; a Llama-3.1-8B step has 65 of them);
- `nn.Linear stack of L, per layer` and `ForgeLinear stack of L, per layer` (`--layers`, default
  28): one forward and backward through L layers alternating (K -> N, N -> K), divided by L, on the
  device thread and on this one. A model's backward runs many nodes on one engine thread, so these
  rows weigh what a layer costs inside a step apart from what waking the engine costs once a
  backward, which the single-layer rows include.

Then a cProfile of ForgeLinear's forward + backward (backward on this thread, so the profiler sees
it): the 25 functions with the most own time, in the JSON under `profile`; and torch.profiler's
table of the same calls by own CPU time (aten ops and CUDA runtime calls, a synchronization
among them), under `torch_profile`.

Per row: `host_us`, the host's time per call over a loop without synchronizing (what the host
spends; the GPU runs behind it), and `wall_us`, the same loop closed by a synchronize (the larger
of host and GPU time per call). Results print as a table and go to $OUT/launch_breakdown.json.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import math
import os
import pstats
import sys
import time
from pathlib import Path

import torch

import forge
from forge import functional
from forge.kernels import pick_config
from forge.rules import get_rule, resolve_hparams


def _per_call_us(fn, n: int, sync) -> tuple[float, float]:
    """(host us, wall us) per call of `fn` over `n` back-to-back calls."""
    for _ in range(max(3, n // 10)):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - start
    sync()
    wall = time.perf_counter() - start
    return host / n * 1e6, wall / n * 1e6


def _profile(fn, n: int, sync, top: int = 25) -> str:
    """cProfile of `n` calls of `fn`: the `top` functions by own time, as pstats prints them."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        fn()
    sync()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def _torch_profile(fn, n: int, sync, top: int = 25) -> str:
    """torch.profiler over `n` calls of `fn`: the `top` ops and runtime calls by own CPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(n):
            fn()
        sync()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def _stack(K: int, N: int, layers: int, device: str) -> torch.nn.Sequential:
    """`layers` bias-free bf16 linears alternating K -> N and N -> K, the first taking K features."""
    dims = [(K, N) if i % 2 == 0 else (N, K) for i in range(layers)]
    return torch.nn.Sequential(
        *(torch.nn.Linear(i, o, bias=False, device=device, dtype=torch.bfloat16) for i, o in dims)
    )


def _triton_version() -> str:
    import triton

    return triton.__version__


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.kernels.launch_breakdown", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shape", nargs=3, type=int, metavar=("T", "N", "K"), default=(1024, 1024, 4096))
    parser.add_argument("--calls", type=int, default=2000, help="calls per row")
    parser.add_argument("--layers", type=int, default=28, help="layers in the stack rows")
    parser.add_argument("--tiny", action="store_true", help="a CPU dry run at T=N=K=64, 3 calls a row")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.tiny:
        print("this times the CUDA launch path: run it on the GPU machine (or pass --tiny for a dry run)")
        return 2
    T, N, K = (64, 64, 64) if args.tiny else args.shape
    calls = 3 if args.tiny else args.calls
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    dy = torch.randn(T, N, device=device, dtype=torch.bfloat16, generator=gen) / math.sqrt(T)
    x = torch.randn(T, K, device=device, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    m = torch.randn(N, K, device=device, dtype=torch.bfloat16, generator=gen) * 1e-3
    v = torch.rand(N, K, device=device, dtype=torch.bfloat16, generator=gen) * 1e-6
    rule = get_rule("adamw")
    hparams = resolve_hparams(rule, dict(lr=1e-4))
    coefficients, flags = rule.coefficients(hparams, 3, {}), rule.flags(hparams)
    options = functional.UpdateOptions("adamw", flags, state_dtype="bf16", stochastic_rounding=True)

    shipped = pick_config(T, N, K, "bf16", on_interpreter=device == "cpu")

    def update(tma: str | None = None):
        config = shipped if tma is None else dataclasses.replace(shipped, tma=tma)
        slots = functional.Slots((m, v, None), (None,) * 3, (True, False, False))
        return lambda: functional.fused_wgrad_update(w, dy, x, slots, coefficients, 7, options, config=config)

    norm = torch.randn(K, device=device, dtype=torch.bfloat16, generator=gen)
    norm_grad = torch.randn(K, device=device, dtype=torch.bfloat16, generator=gen)
    norm_m, norm_v = torch.zeros_like(norm), torch.full_like(norm, 1e-6)

    def norm_update():
        slots = functional.Slots((norm_m, norm_v, None), (None,) * 3, (True, False, False))
        functional.elementwise_update(norm, norm_grad, slots, coefficients, 7, options)

    plain = torch.nn.Linear(K, N, bias=False, device=device, dtype=torch.bfloat16)
    fused = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False, device=device, dtype=torch.bfloat16))
    opt = forge.attach(fused, lr=1e-4, state_dtype="bf16")
    xg = x.clone().requires_grad_(True)

    def plain_step():
        plain.weight.grad = None
        plain(xg).backward(dy)

    def forge_step():
        fused(xg).backward(dy)

    def on_this_thread(step):
        def run():
            with torch.autograd.set_multithreading_enabled(False):
                step()

        return run

    forge_step()  # the weight's states exist from here on

    layers = 2 if args.tiny else args.layers
    plain_stack, fused_stack = (_stack(K, N, layers, device) for _ in range(2))
    forge.attach(fused_stack, lr=1e-4, state_dtype="bf16")
    stack_calls = max(3, calls // layers)

    def stack_step(model):
        def run():
            model(xg).float().sum().backward()

        return run

    rows = {
        "mm": lambda: torch.mm(dy.t(), x),
        "wgrad_update": update(),
        "wgrad_update, host TMA": update("host"),
        "wgrad_update, pointers": update("none"),
        "update_linear": lambda: opt.update_linear(fused[0].weight, dy, x),
        "nn.Linear fwd+bwd": plain_step,
        "ForgeLinear fwd+bwd": forge_step,
        "nn.Linear fwd+bwd, backward on this thread": on_this_thread(plain_step),
        "ForgeLinear fwd+bwd, backward on this thread": on_this_thread(forge_step),
        "elementwise_update, norm": norm_update,
    }
    results = {}
    print(f"T={T} N={N} K={K} on {device}, {calls} calls a row")
    print(f"{'path':44s} {'host us':>9s} {'wall us':>9s}")
    for name, fn in rows.items():
        host_us, wall_us = _per_call_us(fn, calls, sync)
        results[name] = dict(host_us=host_us, wall_us=wall_us)
        print(f"{name:44s} {host_us:9.1f} {wall_us:9.1f}", flush=True)
    for kind, model in (("nn.Linear", plain_stack), ("ForgeLinear", fused_stack)):
        steps = (("", stack_step(model)), (", backward on this thread", on_this_thread(stack_step(model))))
        for where, step in steps:
            name = f"{kind} stack of {layers}, per layer{where}"
            host_us, wall_us = _per_call_us(step, stack_calls, sync)
            results[name] = dict(host_us=host_us / layers, wall_us=wall_us / layers)
            print(f"{name:44s} {host_us / layers:9.1f} {wall_us / layers:9.1f}", flush=True)
    profile = _profile(on_this_thread(forge_step), calls, sync)
    print(profile)
    torch_profile = _torch_profile(on_this_thread(forge_step), min(calls, 200), sync)
    print(torch_profile)
    record = dict(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        shipped_config=dataclasses.asdict(shipped),
        torch=torch.__version__,
        triton=_triton_version(),
        shape=dict(T=T, N=N, K=K),
        calls=calls,
        layers=layers,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        rows=results,
        profile=profile,
        torch_profile=torch_profile,
    )
    out = Path(os.environ.get("OUT", "."))
    (out / "launch_breakdown.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
