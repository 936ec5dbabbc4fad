"""What one FORGE layer costs the host on the GPU machine, step by step down the launch path.

    python -m harness.kernels.launch_breakdown                  # Llama k_proj: T=1024, N=1024, K=4096
    python -m harness.kernels.launch_breakdown --shape 1024 2048 1024   # Qwen3-0.6B's q_proj
    python -m harness.kernels.launch_breakdown --host-only      # the host's Python alone, on any machine
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
- `elementwise_update, norm`: the element-wise kernel on a K-wide vector (what a norm weight's
  hook launched on its own);
- `elementwise_update, N norms` and `vector_update, N norms` (`--norms`, default 65, Llama-3.1-8B's
  count): N K-wide vectors one launch each, against all of them in one launch of the vector kernel
  (`forge.vectors`: what a step's norm weights and biases cost the host now);
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
of host and GPU time per call), each the least of `--repeats` loops. `ratios` holds ForgeLinear's
host time over nn.Linear's: one layer and a layer of the stack, on the device thread and on this
one.

`--host-only` replaces every launch of FORGE's kernels by a call that returns at once
(`forge.kernels.launch.DirectLauncher`), so the rows time the host's Python and torch's own work
alone; on a machine without a GPU the layers are 16 x 16 (torch's CPU GEMMs then cost little) and
the clock is this thread's CPU time (`--clock thread`), which other processes on a shared host do
not inflate. A `--shape` given on such a machine is taken as given: torch's fp32 CPU GEMMs at that
shape then fill the layer rows (nn.Linear pays three a layer, FORGE two), so the ratios no longer
measure the host's Python, and a full run takes CPU hours; the default shape is the CPU's measure. The record names the host's CPU (`env`: `cpu_model`, `cpu_count`) and goes to
$OUT/launch-breakdown-<T>x<N>x<K>[-host-only]-<date>-<commit>.json, as results/device-logs/ keeps
it.
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
from forge.kernels.launch import DirectLauncher
from forge.rules import get_rule, resolve_hparams
from forge.steps import step_row_words, step_rows

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _per_call_us(fn, n: int, sync, repeats: int = 1, clock=time.perf_counter) -> tuple[float, float]:
    """(host us, wall us) per call of `fn` over `n` back-to-back calls, the least of `repeats` loops."""
    for _ in range(max(3, n // 10)):
        fn()
    sync()
    host = wall = math.inf
    for _ in range(repeats):
        start = clock()
        for _ in range(n):
            fn()
        host = min(host, clock() - start)
        sync()
        wall = min(wall, clock() - start)
    return host / n * 1e6, wall / n * 1e6


class _NoLaunch:
    """`--host-only`: every FORGE kernel launch returns at once, counted (`launches`)."""

    def __init__(self) -> None:
        self.launches = 0

    def __enter__(self):
        self._call = DirectLauncher.__call__
        DirectLauncher.__call__ = lambda launcher, *args: self._count()
        return self

    def _count(self) -> None:
        self.launches += 1

    def __exit__(self, *exc) -> None:
        DirectLauncher.__call__ = self._call


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


def _stack(K: int, N: int, layers: int, device: str, dtype: torch.dtype) -> torch.nn.Sequential:
    """`layers` bias-free linears alternating K -> N and N -> K, the first taking K features."""
    dims = [(K, N) if i % 2 == 0 else (N, K) for i in range(layers)]
    return torch.nn.Sequential(
        *(torch.nn.Linear(i, o, bias=False, device=device, dtype=dtype) for i, o in dims)
    )


def _triton_version() -> str:
    import triton

    return triton.__version__


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.kernels.launch_breakdown", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shape", nargs=3, type=int, metavar=("T", "N", "K"), default=None,
                        help="the layer: T tokens, an N x K weight (default 1024 1024 4096; 16 16 16 with "
                        "--host-only on a CPU)")  # fmt: skip
    parser.add_argument("--calls", type=int, default=2000, help="calls per row")
    parser.add_argument("--repeats", type=int, default=3, help="loops of --calls per row; the least counts")
    parser.add_argument("--layers", type=int, default=28, help="layers in the stack rows")
    parser.add_argument("--norms", type=int, default=65, help="vectors in the norm rows (Llama-3.1-8B: 65)")
    parser.add_argument("--host-only", action="store_true", help="FORGE's kernel launches return at once")
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default=None,
        help="wall (default on a GPU) or this thread's CPU time (the default with --host-only on a CPU)",
    )  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="a CPU dry run at T=N=K=64, 3 calls a row")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not (args.tiny or args.host_only):
        print(
            "this times the CUDA launch path: run it on the GPU machine (or pass --host-only to time the "
            "host's Python alone, --tiny for a dry run)"
        )
        return 2
    cpu_host_only = device == "cpu" and args.host_only and not args.tiny
    if args.tiny:
        T, N, K = 64, 64, 64
    else:
        T, N, K = args.shape or ((16, 16, 16) if cpu_host_only else (1024, 1024, 4096))
    calls = 3 if args.tiny else args.calls
    repeats = 1 if args.tiny else args.repeats
    norms = min(args.norms, 4) if args.tiny else args.norms
    layers = 2 if args.tiny else args.layers
    clock = args.clock or ("thread" if cpu_host_only else "wall")
    # On a CPU the host's Python is what is timed: fp32 layers on one intra-op thread, so that torch's
    # own CPU work stays small and on this thread (bf16 GEMMs on a CPU take a slow path of their own).
    dtype = torch.float32 if cpu_host_only else torch.bfloat16
    if cpu_host_only:
        torch.set_num_threads(1)
    timing = (device, T, N, K, calls, repeats, CLOCKS[clock], layers, norms, dtype)
    if args.host_only:
        with _NoLaunch() as stub:
            record = _breakdown(*timing)
        record["launches_stubbed"] = stub.launches
    else:
        record = _breakdown(*timing)
    record.update(
        host_only=args.host_only, clock=clock, repeats=repeats, dtype=str(dtype).removeprefix("torch.")
    )
    out = Path(os.environ.get("OUT", "."))
    commit = (record["env"].get("git_commit") or "nogit")[:7]
    what = f"launch-breakdown-{T}x{N}x{K}" + ("-host-only" if args.host_only else "")
    name = f"{what}-{time.strftime('%Y%m%d')}-{commit}"
    (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {out / (name + '.json')}")
    return 0


def _breakdown(
    device: str,
    T: int,
    N: int,
    K: int,
    calls: int,
    repeats: int,
    clock,
    layers: int,
    norms: int,
    dtype: torch.dtype,
) -> dict:
    """Every row's timing, the profiles, and what says where they were taken (see the module); the
    layers and their operands in `dtype`, the states in bf16."""
    from harness.run import env

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    dy = torch.randn(T, N, device=device, dtype=dtype, generator=gen) / math.sqrt(T)
    x = torch.randn(T, K, device=device, dtype=dtype, generator=gen)
    w = torch.randn(N, K, device=device, dtype=dtype, generator=gen) * 0.02
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

    vectors = [torch.randn(K, device=device, dtype=dtype, generator=gen) for _ in range(norms)]
    vector_grads = [torch.randn_like(t) for t in vectors]
    vector_slots = [
        functional.Slots(
            (torch.zeros_like(t), torch.full_like(t, 1e-6), None), (None,) * 3, (True, False, False)
        )
        for t in vectors
    ]
    rows_of_steps = step_rows([coefficients] * norms, [7] * norms, step_row_words())

    def norm_update(count: int):
        def run():
            for t, g, slots in zip(vectors[:count], vector_grads, vector_slots):
                functional.elementwise_update(t, g, slots, coefficients, 7, options)

        return run

    def vector_update():
        functional.vector_update(vectors, vector_grads, vector_slots, rows_of_steps, options)

    plain = torch.nn.Linear(K, N, bias=False, device=device, dtype=dtype)
    fused = torch.nn.Linear(K, N, bias=False, device=device, dtype=dtype)  # a bare layer, as `plain` is
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

    plain_stack, fused_stack = (_stack(K, N, layers, device, dtype) for _ in range(2))
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
        "update_linear": lambda: opt.update_linear(fused.weight, dy, x),
        "nn.Linear fwd+bwd": plain_step,
        "ForgeLinear fwd+bwd": forge_step,
        "nn.Linear fwd+bwd, backward on this thread": on_this_thread(plain_step),
        "ForgeLinear fwd+bwd, backward on this thread": on_this_thread(forge_step),
        "elementwise_update, norm": norm_update(1),
        f"elementwise_update, {norms} norms": norm_update(norms),
        f"vector_update, {norms} norms": vector_update,
    }
    results = {}
    print(f"T={T} N={N} K={K} on {device}, {calls} calls a row, the least of {repeats} loops")
    print(f"{'path':44s} {'host us':>9s} {'wall us':>9s}")
    for name, fn in rows.items():
        host_us, wall_us = _per_call_us(fn, calls, sync, repeats, clock)
        results[name] = dict(host_us=host_us, wall_us=wall_us)
        print(f"{name:44s} {host_us:9.1f} {wall_us:9.1f}", flush=True)
    for kind, model in (("nn.Linear", plain_stack), ("ForgeLinear", fused_stack)):
        steps = (("", stack_step(model)), (", backward on this thread", on_this_thread(stack_step(model))))
        for where, step in steps:
            name = f"{kind} stack of {layers}, per layer{where}"
            host_us, wall_us = _per_call_us(step, stack_calls, sync, repeats, clock)
            results[name] = dict(host_us=host_us / layers, wall_us=wall_us / layers)
            print(f"{name:44s} {host_us / layers:9.1f} {wall_us / layers:9.1f}", flush=True)
    pairs = _host_pairs(results, layers)
    ratios = {name: forge_us / plain_us for name, (forge_us, plain_us) in pairs.items()}
    for name, ratio in ratios.items():
        print(f"ForgeLinear / nn.Linear, {name:31s} {ratio:9.2f}x")
    profile = _profile(on_this_thread(forge_step), calls, sync)
    print(profile)
    torch_profile = _torch_profile(on_this_thread(forge_step), min(calls, 200), sync)
    print(torch_profile)
    return dict(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        env=env.collect(env.git_info()),
        shipped_config=dataclasses.asdict(shipped),
        torch=torch.__version__,
        triton=_triton_version(),
        shape=dict(T=T, N=N, K=K),
        calls=calls,
        layers=layers,
        norms=norms,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        rows=results,
        host_pairs=pairs,
        ratios=ratios,
        profile=profile,
        torch_profile=torch_profile,
    )


def _host_pairs(rows: dict, layers: int) -> dict[str, list[float]]:
    """[ForgeLinear's host us, nn.Linear's]: one layer and a layer of the stack, each with the
    backward on the device thread and on this one (eager FORGE's host cost against torch's, four
    ways; the docs' host-launches block reads them)."""
    out = {}
    for what, row in (
        ("one layer", "{} fwd+bwd"),
        (f"a layer of {layers}", f"{{}} stack of {layers}, per layer"),
    ):
        for where, suffix in (("", ""), (", this thread", ", backward on this thread")):
            out[what + where] = [
                rows[row.format(kind) + suffix]["host_us"] for kind in ("ForgeLinear", "nn.Linear")
            ]
    return out


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
