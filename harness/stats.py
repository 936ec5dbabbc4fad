"""Step-time statistics from a record's per-step samples.

The harness times every step after warm-up with CUDA events and keeps every sample in
`step_times_ms`. From them we take the median (the figure we quote), the minimum (the best the
machine did: a neighbour on a shared GPU slows some steps but rarely the fastest one), and the
quartiles and 90th percentile (the spread, which is the noise a comparison has to beat).

Records written without samples still carry `step_time_ms_median`, `step_time_ms_min` and
`step_time_ms_p90`; then the quartiles are unknown (None) and a comparison falls back to the
threshold alone.

Percentiles use linear interpolation between order statistics (numpy's default), so the same
samples always give the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.points import missing


@dataclass(frozen=True)
class StepStats:
    """Summary of the timed steps of one point, in milliseconds."""

    median: float
    minimum: float | None
    p25: float | None
    p75: float | None
    p90: float | None
    n: int

    def scaled(self, factor: float) -> StepStats:
        """The same statistics divided by `factor` (e.g. a reference point's median)."""
        scale = lambda v: None if v is None else v / factor
        return StepStats(
            self.median / factor,
            scale(self.minimum),
            scale(self.p25),
            scale(self.p75),
            scale(self.p90),
            self.n,
        )


def from_samples(samples: Sequence[float]) -> StepStats:
    """Statistics of a non-empty list of step times."""
    values = np.asarray(samples, dtype=np.float64)
    p25, p50, p75, p90 = np.percentile(values, [25, 50, 75, 90])
    return StepStats(float(p50), float(values.min()), float(p25), float(p75), float(p90), len(values))


def step_stats(record: Mapping[str, Any]) -> StepStats | None:
    """Statistics of a record's step times: from its samples, else from its summary fields."""
    samples = record.get("step_times_ms")
    if not missing(samples) and samples is not None and len(samples) > 0:
        return from_samples([float(s) for s in samples])
    median = record.get("step_time_ms_median")
    if missing(median):
        return None
    optional = lambda name: None if missing(record.get(name)) else float(record[name])
    return StepStats(float(median), optional("step_time_ms_min"), None, None, optional("step_time_ms_p90"), 0)
