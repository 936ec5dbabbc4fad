"""Measuring a step: timers, memory peaks (torch and NVML), and the memory breakdown by pool.

Time. On CUDA, a pair of CUDA events brackets each whole step (forward, backward, update); the
loss is read after each step (a sync, outside the bracket) to catch divergence. On a CPU,
`time.perf_counter` brackets the step. Warm-up steps are timed too but dropped from the statistics.
`JitCompiles` counts the Triton kernels compiled during each step (a hook on Triton's JIT), so a
slow timed step can be told apart as compile time rather than a slow step.

Memory. `torch.cuda.max_memory_allocated/reserved` after `reset_peak_memory_stats` give the
allocator's peaks; an `NvmlSampler` thread polls the device's used memory every few milliseconds
for the device-level peak, which also holds the CUDA context and anything outside the allocator.
On a CPU these figures do not exist and are recorded as null. A `ClockSampler` polls the SM clock,
power draw and clock-event reasons the same way, for profiles and probes that ask why a kernel
ran slower. The breakdown sums the tensors themselves: weights (parameters), optimizer states
(what the optimizer holds, tensor subclasses and helper objects walked down to their storages),
gradients (modelled per method, see `methods.base`), and activations-and-the-rest = peak
allocated minus the other three. Where a point asks for it (`measure.peak_pools`),
`harness.run.peak_pools` measures the pools at the moment of the peak instead, from the CUDA
allocator's own record of one more step.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

GIB = 2**30


def gib(n_bytes: float | None) -> float | None:
    return None if n_bytes is None else n_bytes / GIB


class JitCompiles:
    """While entered, counts Triton JIT compiles (kernels missing from the in-memory cache, whether
    built or read from Triton's disk cache) in `.count`. Chains any hook already installed."""

    def __init__(self) -> None:
        self.count = 0
        self._knobs: Any = None
        self._previous: Any = None

    def __enter__(self) -> JitCompiles:
        try:
            from triton import knobs
        except ImportError:  # no Triton here: nothing can compile
            return self
        self._knobs, self._previous = knobs, knobs.runtime.jit_post_compile_hook

        def hook(**kwargs: Any) -> Any:
            self.count += 1
            return self._previous(**kwargs) if self._previous else None

        knobs.runtime.jit_post_compile_hook = hook
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._knobs is not None:
            self._knobs.runtime.jit_post_compile_hook = self._previous


def timed_steps(
    step: Callable[[], torch.Tensor], n: int, device: str, compiles: list[int] | None = None
) -> tuple[list[float], list[float]]:
    """Run `step` n times; return (losses, step times in ms). Stops early on a non-finite loss.
    Under tensor parallelism the ranks are lined up by a barrier first (rank 0's times count).
    `compiles`, when given, gets the number of Triton kernels compiled during each step."""
    from harness.run.tensor_parallel import barrier

    barrier()
    losses: list[float] = []
    times: list[float] = []
    with JitCompiles() as jit:
        for _ in range(n):
            before = jit.count
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                loss = step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                loss = step()
                times.append((time.perf_counter() - t0) * 1e3)
            losses.append(float(loss))
            if compiles is not None:
                compiles.append(jit.count - before)
            if not torch.isfinite(torch.tensor(losses[-1])):
                break
    return losses, times


def time_stats(times_ms: list[float]) -> dict[str, float | None]:
    """Median, min and 90th percentile of step times (None when there are none)."""
    if not times_ms:
        return {"step_time_ms_median": None, "step_time_ms_min": None, "step_time_ms_p90": None}
    ordered = sorted(times_ms)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "step_time_ms_median": statistics.median(ordered),
        "step_time_ms_min": ordered[0],
        "step_time_ms_p90": p90,
    }


class ForwardEndMemory:
    """While entered, the largest allocated bytes seen when the model's forward returns (CUDA only).

    At that moment the static pools (weights, optimizer states, any gradient kept between steps)
    and the activations saved for backward are all live, and no gradient of this step exists
    yet: `bytes - static pools` measures the saved activations, and `peak - bytes` what backward
    and the update add on top (gradients, their transients). Which of the two sets the peak
    differs by method and batch, so the memory plots split the peak this way rather than assume
    every gradient is alive at the peak. A forward hook on the top module: one host read of the
    allocator's counter per step, no synchronization.
    """

    def __init__(self, model: torch.nn.Module, device: str) -> None:
        self.model, self.device = model, device
        self.bytes: int | None = None
        self._handle: Any = None

    def _hook(self, module: Any, args: Any, output: Any) -> None:
        self.bytes = max(self.bytes or 0, torch.cuda.memory_allocated())

    def __enter__(self) -> ForwardEndMemory:
        if self.device == "cuda":
            self._handle = self.model.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.remove()


class NvmlSampler:
    """Polls NVML's used-memory figure for one device in a background thread; keeps the peak.

    `baseline_bytes` is read at construction: create it before this process touches CUDA, so
    the baseline excludes this point's CUDA context. Unavailable NVML gives None everywhere.
    """

    def __init__(self, index: int | None = None, period_s: float = 0.005) -> None:
        if index is None:  # this process's GPU: under torchrun, its local rank
            index = int(os.environ.get("LOCAL_RANK", "0"))
        self.period_s = period_s
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.baseline_bytes: int | None = self._used()
        except Exception:
            self._nvml = None
            self.baseline_bytes = None

    def _used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def _sample(self) -> None:
        """One poll (a subclass may read other NVML figures here)."""
        self.peak_bytes = max(self.peak_bytes or 0, self._used())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.period_s)

    def start(self) -> NvmlSampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> int | None:
        """Stop polling; return the peak in bytes (None without NVML)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes or 0, self._used())
        return self.peak_bytes


class ClockSampler(NvmlSampler):
    """NVML's SM clock, power draw and clock-event reasons for one GPU, polled every `period_s`
    between start() and stop() by harness.run.measure's sampler thread (its per-poll hook reads these
    instead of the memory). Without NVML (a CPU dry run) it samples nothing and summarizes to None."""

    def __init__(self, index: int, period_s: float = 0.01) -> None:
        self.samples: list[tuple[int, float, int]] = []
        super().__init__(index, period_s)

    def _sample(self) -> None:
        nvml, handle = self._nvml, self._handle
        # nvidia-ml-py renamed "throttle reasons" to "clock event reasons"; either name will do
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        clock = int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        self.samples.append((clock, nvml.nvmlDeviceGetPowerUsage(handle) / 1000, int(reasons(handle))))

    def _reason_names(self, mask: int) -> list[str]:
        """The single-bit reason constants of NVML set in `mask`, by name (unions left out)."""
        names = set()
        for name in dir(self._nvml):
            value = getattr(self._nvml, name)
            single = isinstance(value, int) and value > 0 and value & (value - 1) == 0
            for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
                if name.startswith(prefix) and single and mask & value:
                    names.add(name[len(prefix) :])
        return sorted(names)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        clocks, power, masks = zip(*self.samples)
        seen = 0
        for mask in masks:
            seen |= mask

        def spread(values):
            return {"median": statistics.median(values), "min": min(values), "max": max(values)}

        return {
            "samples": len(self.samples),
            "sm_clock_mhz": spread(clocks),
            "power_w": spread(power),
            "clock_event_reasons": self._reason_names(seen),
        }


def _spans(obj: Any, seen: set[int]) -> Iterable[tuple[int, int]]:
    """Yield (data pointer, bytes) of every storage reachable from obj, each once (by data pointer;
    a storage without one, as an empty CPU tensor's, by identity, with pointer 0)."""
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__") and type(obj) is not torch.Tensor:
            names, _ = obj.__tensor_flatten__()  # tensor subclass (torchao): count its inner tensors
            for name in names:
                yield from _spans(getattr(obj, name), seen)
            return
        storage = obj.untyped_storage()
        key = storage.data_ptr() if storage.data_ptr() else id(storage)
        if key not in seen:
            seen.add(key)
            yield storage.data_ptr(), storage.nbytes()
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _spans(value, seen)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _spans(value, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for value in vars(obj).values():  # helper objects holding tensors (FlashOptim's states)
            if isinstance(value, torch.Tensor | dict | list | tuple):
                yield from _spans(value, seen)


def nbytes(objs: Iterable[Any]) -> int:
    """Total bytes of the distinct storages behind tensors, tensor subclasses and containers."""
    seen: set[int] = set()
    return sum(n for obj in objs for _, n in _spans(obj, seen))


def storage_spans(objs: Iterable[Any]) -> list[tuple[int, int]]:
    """(data pointer, bytes) of the distinct storages behind tensors, tensor subclasses and
    containers: where they lie in device memory (harness.run.peak_pools matches them to blocks)."""
    seen: set[int] = set()
    return [span for obj in objs for span in _spans(obj, seen)]


def cuda_peaks(device: str) -> dict[str, int | None]:
    """Allocator peaks since the last reset (None on a CPU)."""
    if device != "cuda":
        return {"peak_alloc": None, "peak_reserved": None}
    return {
        "peak_alloc": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
    }


def breakdown(
    weights: int, grads: int | None, states: int, peak_alloc: int | None
) -> dict[str, float | None]:
    """The memory pools in GiB; activations (and the rest) only where the peak is known."""
    rest = None
    if peak_alloc is not None and grads is not None:
        rest = peak_alloc - weights - grads - states  # negative would expose a wrong grads model
    return {
        "weights_gib": gib(weights),
        "grads_gib": gib(grads),
        "optimizer_state_gib": gib(states),
        "activations_gib": gib(rest),
    }
