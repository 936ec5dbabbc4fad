"""The fidelity table: is a method's held-out loss biased against fp32 master weights, or within noise?

One run per method says little: two fp32 implementations that differ only in rounding part ways
after the warm-up and wander around each other, so a single run's offset mixes trajectory noise
with bias. The protocol here separates them:

- every method trains under several seeds (`seed=0,1,2`: other weights and data order, the same
  for every method of a seed), each beside its seed's reference (fused AdamW on fp32 master
  weights, `convergence_table.reference_of`);
- per seed and phase, a method's deviation is the mean of (its held-out loss - the reference's)
  over the phase's evaluation steps, the same fixed steps for every method (the held-out loss at
  step 0, before any update, is left out: it is the same for all);
- over the seeds, the mean deviation and its 95% confidence interval (Student's t, n - 1 degrees
  of freedom);
- the noise band of a phase: the largest |mean| + half-width of the fp32 controls, the other
  fp32-master-weight methods (torch AdamW, FORGE fp32) against the same reference.

Verdict per method and phase, for a mean X with half-width Y: "biased by X +- Y nats" when the
whole interval lies beyond the band; "within noise" when X lies inside it; else "unresolved" (the
interval straddles the band's edge: more seeds would tell). Fewer than `MIN_SEEDS` seeds, or no
control with that many, are not judged, and the row says what is missing. The target column
checks the fidelity target: within noise and |X| at most `TARGET_NATS`.

A method with FP8 GEMMs (`fp8` among its options) also gets a row against its bf16 twin (the same
method and options but `fp8`) of each seed, judged against the same band: does FP8 train as its
bf16 self does, within what rounding alone moves?
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from harness import points
from harness.records import HELDOUT_FIELDS, Record, is_branched, is_convergence
from harness.report.convergence_table import curve, groups_of, phases_of, reference_of, row_order
from harness.report.markup import NONE, Table
from harness.report.names import display_name
from harness.report.tables import Selection

MIN_SEEDS = 3
TARGET_NATS = 0.005
# Student's t, two-sided 95%, by degrees of freedom (from 21 on, the value at 20: a little wide)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086}  # fmt: skip


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom."""
    return _T95.get(df, 2.086 if df <= 30 else 1.96)


def interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% confidence interval) of at least two values."""
    n = len(values)
    return statistics.fmean(values), t95(n - 1) * statistics.stdev(values) / math.sqrt(n)


def heldout_deviation(record: Record, reference: Record, start: int, end: int) -> float | None:
    """Mean (held-out loss - the reference's) over the evaluation steps in [start, end) both have,
    the first evaluation before any update left out."""
    mine = _by_step(record, start, end)
    ref = _by_step(reference, start, end)
    common = sorted(set(mine) & set(ref) - {0})
    return statistics.fmean(mine[s] - ref[s] for s in common) if common else None


def _by_step(record: Record, start: int, end: int) -> dict[int, float]:
    values = curve(record, HELDOUT_FIELDS)
    steps = record.get("heldout_steps")
    if values is None or steps is None:
        return {}
    return {int(s): v for v, s in zip(values, steps) if start <= int(s) < end}


def is_control(record: Record, autocast: str | None = None) -> bool:
    """fp32 master weights and states, the forward under `autocast` (None: all fp32): against a
    reference of that arithmetic, the same update with other rounding."""
    return str(record.get("master_weights")) == "fp32" and points.autocast(record) == autocast


def fidelity(records: Sequence[Record]) -> Selection | None:
    """One row per (sweep, model, method, phase) of the convergence runs: deviations over seeds and
    the verdict. None without held-out losses."""
    runs = [r for r in records if is_convergence(r) and not is_branched(r)]
    by_seed: dict[tuple, dict[int, float]] = {}  # one draw per seed: the latest run of a seed counts
    labels: dict[tuple, str] = {}
    controls: set[tuple] = set()
    pairs: set[tuple] = set()  # an FP8 method against its bf16 twin
    for (sweep, model, seed), group in groups_of(runs).items():
        reference = reference_of(group)
        if reference is None or str(reference.get("master_weights")) != "fp32":
            continue  # the table judges against fp32 master weights only (a group that lacks them waits)
        arithmetic = points.autocast(reference)  # the controls compute as the reference does
        for record in sorted(group, key=lambda r: str(r.get("time") or "")):
            if record is reference:
                continue
            twin = _bf16_twin(record, group)
            for phase, start, end in phases_of(record, len(curve(record) or [])):
                deviation = heldout_deviation(record, reference, start, end)
                if deviation is None:
                    continue
                key = (sweep, model, phase, row_order(record))
                by_seed.setdefault(key, {})[seed] = deviation
                labels[key] = display_name(record)
                if is_control(record, arithmetic):
                    controls.add(key)
                paired = None if twin is None else heldout_deviation(record, twin, start, end)
                if paired is not None:
                    key = (sweep, model, phase, row_order(record) + (" vs bf16",))
                    by_seed.setdefault(key, {})[seed] = paired
                    labels[key] = f"{display_name(record)} - {display_name(twin)}"
                    pairs.add(key)
    if not by_seed:
        return None
    draws = {key: [seeds[s] for s in sorted(seeds)] for key, seeds in by_seed.items()}
    bands = noise_bands(draws, controls)
    rows = [
        _row(key, labels[key], draws[key], key in controls, bands.get(key[:3]), key in pairs)
        for key in sorted(draws)
    ]
    header = ["Sweep", "Model", "Phase", "Method", "Seeds", "Mean held-out d (nats)", "95% interval"]
    header += ["Noise band (fp32 controls)", "Verdict", f"Target: within noise, |mean d| <= {TARGET_NATS}"]
    table = Table(
        name="fidelity",
        title="Fidelity: held-out loss against fp32 master weights, over seeds",
        header=header,
        rows=rows,
        align="lllllrrrll",
        notes=[
            "d: a method's held-out loss minus its seed's reference (fused AdamW, fp32 master weights) at "
            "the same evaluation steps, averaged over the phase; mean and Student's t 95% interval over the "
            f"seeds. Noise band: the largest |mean| + half-width of the fp32 controls. {MIN_SEEDS} seeds at "
            "least for a verdict. A sweep and seed without its fp32-master reference is left out. "
            "'A - B' rows: an FP8 method against its bf16 twin of the same seed, judged against the "
            "same band (the fidelity target is not theirs)."
        ],
    )
    return Selection(table, runs)


def _bf16_twin(record: Record, group: Sequence[Record]) -> Record | None:
    """The run of the group that is `record` with bf16 GEMMs instead of FP8 ones, if any."""
    options = record.get("method_options") or {}
    if not options.get("fp8"):
        return None
    bare = {k: v for k, v in options.items() if k != "fp8"}
    for other in group:
        if other.get("method") == record.get("method") and (other.get("method_options") or {}) == bare:
            return other
    return None


def _row(
    key: tuple, label: str, values: list[float], control: bool, band: float | None, pair: bool = False
) -> list[str]:
    sweep, model, phase, _ = key
    row = [sweep, model, phase, label, str(len(values)), *statistics_cells(values, band)]
    verdict, target = band_verdict(values, control, band)
    return row + [verdict, NONE if pair else target]


def noise_bands(draws: dict[tuple, list[float]], controls: set[tuple]) -> dict[tuple, float]:
    """Per (sweep, model, phase), the largest |mean| + half-width among the fp32 controls' draws
    (those with at least MIN_SEEDS of them)."""
    bands: dict[tuple, float] = {}
    for key in controls:
        if len(draws[key]) >= MIN_SEEDS:
            mean, half = interval(draws[key])
            bands[key[:3]] = max(bands.get(key[:3], 0.0), abs(mean) + half)
    return bands


def statistics_cells(values: list[float], band: float | None, fmt: str = ".4f") -> list[str]:
    """[mean, 95% interval, noise band] cells of a row, in format `fmt`."""
    if len(values) < 2:
        cells = [f"{values[0]:+{fmt}}", NONE]
    else:
        mean, half = interval(values)
        cells = [f"{mean:+{fmt}}", f"{mean - half:+{fmt}} to {mean + half:+{fmt}}"]
    return cells + [NONE if band is None else f"+-{band:{fmt}}"]


def band_verdict(
    values: list[float],
    control: bool,
    band: float | None,
    unit: str = "seed",
    fmt: str = ".4f",
    kind: str = "fp32",
) -> list[str]:
    """[verdict, target] of a method's draws (one per `unit`: a seed, or a branch) against the band
    that the `kind` controls set, the figures in format `fmt`."""
    units = unit + ("es" if unit.endswith("ch") else "s")
    if len(values) < MIN_SEEDS:
        return [f"not judged: {len(values)} {unit if len(values) == 1 else units} of {MIN_SEEDS}", NONE]
    if control:
        return [f"{kind} control (sets the band)", NONE]
    if band is None:
        return [f"not judged: no {kind} control with {MIN_SEEDS} {units}", NONE]
    mean, half = interval(values)
    if mean - half > band or mean + half < -band:
        return [f"biased by {mean:+{fmt}} +- {half:{fmt}} nats", "not met"]
    if abs(mean) > band:
        return [f"unresolved: {mean:+{fmt}} +- {half:{fmt}} nats straddles the band", "not met"]
    return ["within noise", "met" if abs(mean) <= TARGET_NATS else "not met"]
