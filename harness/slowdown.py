"""A deliberate GPU slowdown of a chosen length: to show that the regression check catches one.

`torch.cuda._sleep(cycles)` launches a one-thread kernel that spins for that many GPU clock cycles
on the current stream. The stream's next kernel waits for it, so each spin adds its length to the
work it follows, and a CUDA graph captures it like any other kernel (a graphed step replays it).
`Delay(us)` turns microseconds into cycles once per process, by timing a long spin with CUDA
events: the clock the spin saw. A spin inside a training step need not last what it was asked to
(graphed Llama-3.1-8B steps at batch 2 grew by about 38 us per update for `debug_delay_us=60`,
results/baselines/demo/), so the check is shown the slowdown it measures, not the nominal one.

Two switches use it, both off unless asked and both recorded with the points they slowed:
- the FORGE method's `debug_delay_us` option (harness.run.methods.forge): a spin in every fused
  layer's backward, beside its update (225 per Llama-3.1-8B step);
- `python -m harness kernels --regress --debug-slowdown 6%` (harness.kernels.regress_suite): a spin
  after every timed fused kernel, 6% of that kernel's own time.
"""

from __future__ import annotations

import functools
import statistics

import torch

CALIBRATION_CYCLES = 20_000_000  # about 10 ms at a 2 GHz SM clock: event resolution is negligible


@functools.cache
def cycles_per_us() -> float:
    """GPU clock cycles per microsecond a spin runs at, from the median of three timed spins."""
    torch.cuda._sleep(1000)  # the spin kernel loaded before anything is timed
    rates = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        rates.append(CALIBRATION_CYCLES / (start.elapsed_time(end) * 1000))
    return statistics.median(rates)


class Delay:
    """Call it to make the current CUDA stream wait `us` microseconds (0: do nothing)."""

    def __init__(self, us: float) -> None:
        if us < 0:
            raise ValueError(f"a delay cannot be negative, got {us} us")
        self.us = us
        self.cycles = round(us * cycles_per_us()) if us > 0 else 0

    def __call__(self) -> None:
        if self.cycles:
            torch.cuda._sleep(self.cycles)
