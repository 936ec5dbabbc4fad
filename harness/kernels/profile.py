"""Where a training step's time goes, per method: GPU busy vs idle, host time, the top kernels.

    python -m harness.kernels.profile method=forge_bf16 model=llama3.1-8b batch_size=1 seq_len=1024
    python -m harness.kernels.profile method=no_optimizer model=tiny-llama device=cpu   # a dry run
    torchrun --standalone --nproc-per-node=2 -m harness.kernels.profile method=fused_adamw \
        model=llama3.1-8b batch_size=1 seq_len=2048 gpus=2         # tensor parallel: rank 0 reports

Takes the harness's Hydra overrides (one point), builds the model and method exactly as a sweep
point does (`harness.run.runner.build_method`), runs PROFILE_WARMUP steps (default 3), then
profiles PROFILE_STEPS steps (default 3) with torch.profiler and prints, and writes as JSON to $OUT
(or the current directory), a file named after the point (`*.profile.json`):

- step_ms: wall time per profiled step (host clock around a synchronized step);
- gpu_busy_ms: the union of device-kernel intervals per step (overlapping kernels count once),
  and idle_frac = 1 - busy / step: how much of the step the GPU waits for the host;
- fused_busy_ms, fused_overlap_ms: how long FORGE's fused kernels run a step, and how much of it
  other kernels run at the same time (`update_stream=True` puts them on a second stream so that
  they can run under the dX GEMMs; on one stream this stays near zero);
- kernels_per_step and the 20 GPU kernels with the most device time (kernels only: an op's
  device time can include a blocked launch, as fused AdamW's step shows under the profiler);
- matmul device time per input shape (`aten::mm`/`addmm`/`bmm`, forward and dx alike), to compare
  the same GEMM across methods;
- the autograd nodes with the most host time (ForgeLinearFunctionBackward shows what each FORGE
  launch costs the host);
- kernels_by_launch: the device kernels grouped by (name, grid, block) from the profiler's trace,
  the 40 with the most device time: calls a step, device ms a step and the mean launch in us.
  Under a CUDA graph no host op stands over a kernel, so this is how the same kernel on layers of
  different shapes (a fused kernel's grid is its tiles) is told apart in a graphed step;
- mm_kernels: per matmul call site kind, its input shapes and strides, the kernels it launched
  (by name) and their device time: which cuBLAS kernel each GEMM got, comparable across methods
  (the per-shape table above can misattribute kernels between ops; this one follows each op's
  own launches);
- clocks: the SM clock (MHz) and board power (W) that NVML reported every 10 ms during the
  profiled steps (median, min, max), and the clock-event reasons seen (power cap, thermal, ...):
  two methods whose same GEMMs take different times either ran at different clocks or not.

How to read two of them (`python -m harness.kernels.compare_profiles A B` sets them side by side):
if idle_frac grows from no_optimizer to forge, the host's launch path is what FORGE adds; if busy
time grows by the added step time, the kernels are. GPU for figures that mean anything; on a CPU
it is a dry run of the same code (no device kernels, no clocks).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness.run import env, models, runner, tensor_parallel
from harness.run.config import compose_config
from harness.run.grid import point_id
from harness.run.measure import ClockSampler

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
# FORGE's fused dW GEMM + update, by (part of) the kernel's name as the profiler shows it: the
# Triton kernel and the warp-specialized Gluon one
FUSED_KERNELS = ("wgrad_update_kernel", "wgrad_update_ws_kernel")


def is_fused(name: str) -> bool:
    return any(k in name for k in FUSED_KERNELS)


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals, in the intervals' unit / 1000 (us -> ms)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1000


def overlap_ms(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """How long (ms, from us intervals) some interval of `a` and some interval of `b` run at once:
    |union(a) & union(b)| = |union(a)| + |union(b)| - |union(a + b)|."""
    return busy_ms(a) + busy_ms(b) - busy_ms(a + b)


def _mm_kernels(events, steps: int, top: int = 30) -> list[dict]:
    """Matmul ops grouped by (op, input shapes, input strides, kernels launched): calls and device
    ms a step, the `top` by device time."""
    groups: dict[tuple, list[float]] = {}
    for e in events:
        if e.name not in MATMULS or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        strides = getattr(e, "structured_input_strides", None) or getattr(e, "input_strides", None)
        kernels = tuple(sorted({k.name[:120] for k in e.kernels}))
        key = (e.name, str(e.input_shapes), str(strides), kernels)
        groups.setdefault(key, []).append(sum(k.duration for k in e.kernels))
    rows = [
        {
            "op": op,
            "shapes": shapes,
            "strides": strides,
            "kernels": list(kernels),
            "calls": len(us) / steps,
            "device_ms": sum(us) / 1000 / steps,
        }
        for (op, shapes, strides, kernels), us in groups.items()
    ]
    return sorted(rows, key=lambda r: r["device_ms"], reverse=True)[:top]


def kernels_by_launch(trace: dict, steps: int, top: int = 40) -> list[dict]:
    """Device kernels of a chrome trace (`torch.profiler`'s export) grouped by (name, grid, block):
    calls and device ms a step and the mean duration in us, the `top` by device time."""
    groups: dict[tuple, list[float]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        args = e.get("args", {})
        key = (e.get("name", "")[:120], tuple(args.get("grid", ())), tuple(args.get("block", ())))
        groups.setdefault(key, []).append(float(e["dur"]))
    rows = [
        {
            "name": name,
            "grid": list(grid),
            "block": list(block),
            "calls": len(us) / steps,
            "device_ms": sum(us) / 1000 / steps,
            "mean_us": sum(us) / len(us),
        }
        for (name, grid, block), us in groups.items()
    ]
    return sorted(rows, key=lambda r: r["device_ms"], reverse=True)[:top]


def _trace(prof) -> dict:
    """The profile as a chrome trace (the only place its kernels' grids are kept)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def main(argv: list[str]) -> int:
    warmup = int(os.environ.get("PROFILE_WARMUP", 3))
    steps = int(os.environ.get("PROFILE_STEPS", 3))
    cfg = compose_config(argv)
    device = env.resolve_device(cfg.device)
    world = tensor_parallel.world_size()
    if world > 1:
        tensor_parallel.init(device)  # models.build then shards onto its mesh, as in a sweep point
    batch = models.random_batch(cfg.model.vocab_size, cfg.batch_size, cfg.seq_len, device, cfg.seed)
    model, method = runner.build_method(cfg, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        method.step(batch)
    sync()

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    step_ms = []
    clocks = ClockSampler(torch.cuda.current_device() if device == "cuda" else 0).start()
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            method.step(batch)
            sync()
            step_ms.append((time.perf_counter() - t0) * 1000)
    clocks.stop()
    events = prof.events()
    device_events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    intervals = [(e.time_range.start, e.time_range.end) for e in device_events]
    fused = [(e.time_range.start, e.time_range.end) for e in device_events if is_fused(e.name)]
    others = [(e.time_range.start, e.time_range.end) for e in device_events if not is_fused(e.name)]
    per_kernel: dict[str, list[float]] = {}
    for e in device_events:
        per_kernel.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    by_device = sorted(per_kernel.items(), key=lambda kv: sum(kv[1]), reverse=True)[:20]
    ops = prof.key_averages()
    autograd = [k for k in ops if "Backward" in k.key]
    by_host = sorted(autograd, key=lambda k: k.cpu_time_total, reverse=True)[:10]
    matmuls = [k for k in prof.key_averages(group_by_input_shape=True) if k.key in MATMULS]
    matmuls = sorted(matmuls, key=lambda k: k.device_time_total, reverse=True)[:20]

    mm_kernels = _mm_kernels(events, steps)
    by_launch = kernels_by_launch(_trace(prof), steps) if device == "cuda" else []

    step = sum(step_ms) / len(step_ms)
    busy = busy_ms(intervals) / steps if intervals else None
    report = {
        "point": point_id(cfg),  # as a sweep names it: checkpointing, GPUs and seed included
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "step_ms": step_ms,
        "gpu_busy_ms": busy,
        "idle_frac": None if busy is None else 1 - busy / step,
        "kernels_per_step": len(device_events) / steps,
        "fused_busy_ms": busy_ms(fused) / steps if fused else None,
        "fused_overlap_ms": overlap_ms(fused, others) / steps if fused else None,
        "top_kernels": [
            {"name": name[:120], "calls": len(us) / steps, "device_ms": sum(us) / 1000 / steps}
            for name, us in by_device
        ],
        "matmuls_by_shape": [
            {
                "op": k.key,
                "shapes": str(k.input_shapes),
                "calls": k.count / steps,
                "device_ms": k.device_time_total / 1000 / steps,
            }
            for k in matmuls
        ],
        "top_backward_nodes_host": [
            {"name": k.key, "calls": k.count / steps, "host_ms": k.cpu_time_total / 1000 / steps}
            for k in by_host
        ],
        "kernels_by_launch": by_launch,
        "mm_kernels": mm_kernels,
        "clocks": clocks.summary() if device == "cuda" else None,
    }
    if tensor_parallel.rank() == 0:
        print(json.dumps(report, indent=1))
        out = Path(os.environ.get("OUT", "."))
        name = report["point"].replace("/", "_") + ".profile.json"
        (out / name).write_text(json.dumps(report, indent=1) + "\n")
    tensor_parallel.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
