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

Comparing two runs (`relative_change`, the regression check's estimate). Runs on one machine drift
as a whole (clocks, a neighbour, the host), so a point is judged by its time as a ratio to a
reference measured in the same run, and the change of that ratio between two runs is

    effect = (median(current) / median(current_ref)) / (median(baseline) / median(baseline_ref)) - 1

(0.05: the point got 5% slower than its reference). How sure we are of it comes from a percentile
bootstrap: each of the four sample sets is resampled with replacement, the effect recomputed,
`BOOTSTRAP_RESAMPLES` times, and the middle `CONFIDENCE` of those effects is the interval. The
resamples come from a generator seeded with `BOOTSTRAP_SEED`, so the same samples always give the
same interval. Medians, not means: a step that waited on a neighbour once moves a mean, rarely a
median. The interval covers the sampling noise of one run, not the drift between runs of identical
code: that is the regression check's noise band.
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


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Effect:
    """A relative change of a time and its confidence interval (0.05: 5% slower)."""

    estimate: float
    low: float
    high: float


def relative_change(
    baseline: Sequence[float],
    current: Sequence[float],
    baseline_ref: Sequence[float] | None = None,
    current_ref: Sequence[float] | None = None,
) -> Effect:
    """The change of median(current) / median(current_ref) over the same ratio in the baseline
    (no references: of the medians themselves), with its bootstrap interval (module docstring).
    The interval always contains the estimate (a percentile interval of a few discrete medians
    can miss it by a hair)."""
    sets = [baseline, baseline_ref, current, current_ref]
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    point, boot = [], []
    for values in sets:
        if values is None:
            point.append(1.0)
            boot.append(np.ones(BOOTSTRAP_RESAMPLES))
            continue
        array = np.asarray(values, dtype=np.float64)
        picks = rng.integers(0, len(array), size=(BOOTSTRAP_RESAMPLES, len(array)))
        point.append(float(np.median(array)))
        boot.append(np.median(array[picks], axis=1))
    estimate = (point[2] / point[3]) / (point[0] / point[1]) - 1
    effects = (boot[2] / boot[3]) / (boot[0] / boot[1]) - 1
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(effects, [tail, 100 - tail])
    return Effect(float(estimate), min(float(low), estimate), max(float(high), estimate))
