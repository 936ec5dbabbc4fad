"""The branched fidelity table: a method's held-out loss k steps after it started from the fp32
reference's own state, against the reference's.

A branched run (`harness.run.branches`, `+exp=convergence_branched`) starts the method from the
reference's weights and AdamW moments every `branch_every` steps and trains it k steps on the
reference's batches; its deviation d is its held-out loss then minus the reference's. The branches
share their start, so trajectory noise, which makes the seeds' table (`fidelity_table`) wide,
barely enters: what d measures is what the method's arithmetic does to k steps of training.

Per (sweep, model, phase, method), over every branch of every seed (the latest run of each seed):
the number of branches, the mean d and its 95% Student's t interval. The noise band is the largest
|mean| + half-width among the fp32 controls (torch AdamW, FORGE fp32: the same update as the
reference with other rounding), and the verdict is the seeds' table's: "within noise" or "biased
by X +- Y nats". That band is the fp32 rounding's, orders of magnitude under what bf16 arithmetic
moves in k steps, so a bf16 method is "biased" by some amount: the target asks whether the whole
interval lies within +-`TARGET_NATS` (met), beyond it (not met) or across its edge (unresolved).

A second table (`branch_fidelity_by_start`) splits the same deviations by the step each branch
started at: their mean, standard deviation and largest |d| over the seeds. It shows where the
pooled interval's width comes from, e.g. a branch started from the random initialisation, whose
50 steps fall through the warm-up and a loss drop of several nats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from harness.points import display_name, latest_by_key, seed_of
from harness.records import Record, is_branched
from harness.report.convergence_table import _order
from harness.report.fidelity_table import (
    MIN_SEEDS,
    TARGET_NATS,
    _is_control,
    _verdict,
    interval,
    noise_bands,
    statistics_cells,
)
from harness.report.markup import NONE, Table
from harness.report.tables import Selection


def branch_deviations(record: Record) -> dict[str, list[float]]:
    """The record's branch deviations by phase, in order (a branch that diverged has none)."""
    by_phase: dict[str, list[float]] = {}
    for (phase, _), values in deviations_by_start(record).items():
        by_phase.setdefault(phase, []).extend(values)
    return by_phase


def deviations_by_start(record: Record) -> dict[tuple[str, int], list[float]]:
    """The record's branch deviations by (phase, start step), in order."""
    out: dict[tuple[str, int], list[float]] = {}
    for branch in record.get("branches") or []:
        if branch.get("deviation") is not None:
            key = (str(branch["phase"]), int(branch.get("step") or 0))
            out.setdefault(key, []).append(float(branch["deviation"]))
    return out


def _branched_runs(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if is_branched(r) and r.get("status") == "ok"]


def _k_note(runs: Sequence[Record]) -> str:
    steps = sorted({int(r.get("branch_steps") or 0) for r in runs})
    return f"k = {', '.join(map(str, steps))} steps."


def target(values: list[float]) -> str:
    """Whether the interval of the mean deviation lies within +-TARGET_NATS ("met"), beyond it
    ("not met"), or across its edge ("unresolved")."""
    if len(values) < MIN_SEEDS:
        return NONE
    mean, half = interval(values)
    if abs(mean) + half <= TARGET_NATS:
        return "met"
    return "not met" if abs(mean) - half > TARGET_NATS else "unresolved"


def branch_fidelity(records: Sequence[Record]) -> Selection | None:
    """One row per (sweep, model, phase, method) of the branched runs; None without any."""
    runs = _branched_runs(records)
    if not runs:
        return None
    draws: dict[tuple, list[float]] = {}
    seeds: dict[tuple, set[int]] = {}
    labels: dict[tuple, str] = {}
    controls: set[tuple] = set()
    for record in latest_by_key(runs).values():
        for phase, values in branch_deviations(record).items():
            key = (str(record.get("sweep")), str(record.get("model")), phase, _order(record))
            draws.setdefault(key, []).extend(values)
            seeds.setdefault(key, set()).add(seed_of(record))
            labels[key] = display_name(record)
            if _is_control(record):
                controls.add(key)
    bands = noise_bands(draws, controls)
    rows = []
    for key in sorted(draws):
        values, band = draws[key], bands.get(key[:3])
        row = [
            *key[:3],
            labels[key],
            str(len(seeds[key])),
            str(len(values)),
            *statistics_cells(values, band, ".2e"),
        ]
        verdict = _verdict(values, key in controls, band, unit="branch", fmt=".2e")[0]
        rows.append(row + [verdict, NONE if key in controls else target(values)])
    table = Table(
        name="branch_fidelity",
        title="Branched fidelity: held-out loss k steps after starting from the fp32 reference's state",
        header=[
            "Sweep",
            "Model",
            "Phase",
            "Method",
            "Seeds",
            "Branches",
            "Mean d (nats)",
            "95% interval",
            "Noise band (fp32 controls)",
            "Verdict",
            f"Target: within noise, |mean d| <= {TARGET_NATS}",
        ],
        rows=rows,
        align="lllllrrrrll",
        notes=[
            f"{_k_note(runs)} d: the method's held-out loss k steps after loading "
            "the reference's weights and AdamW moments (fused AdamW on fp32 master weights, trained "
            "once a seed and shared by every method), minus the reference's at the same step; mean and "
            "Student's t 95% interval over every branch of every seed. Noise band: the largest |mean| + "
            "half-width of "
            f"the fp32 controls. {MIN_SEEDS} branches at least for a verdict. Target: the 95% interval "
            f"of the mean d within +-{TARGET_NATS} nats."
        ],
    )
    return Selection(table, runs)


def branch_fidelity_by_start(records: Sequence[Record]) -> Selection | None:
    """One row per (sweep, model, phase, start step, method) of the branched runs: the spread of d
    over the seeds' branches that started there; None without any branched run."""
    runs = _branched_runs(records)
    if not runs:
        return None
    draws: dict[tuple, list[float]] = {}
    labels: dict[tuple, str] = {}
    for record in latest_by_key(runs).values():
        for (phase, start), values in deviations_by_start(record).items():
            key = (str(record.get("sweep")), str(record.get("model")), phase, start, _order(record))
            draws.setdefault(key, []).extend(values)
            labels[key] = display_name(record)
    rows = []
    for key in sorted(draws):
        values = draws[key]
        spread = f"{statistics.stdev(values):.2e}" if len(values) > 1 else NONE
        rows.append(
            [
                *key[:3],
                str(key[3]),
                labels[key],
                str(len(values)),
                f"{statistics.fmean(values):+.2e}",
                spread,
                f"{max(map(abs, values)):.2e}",
            ]
        )
    table = Table(
        name="branch_fidelity_by_start",
        title="Branched fidelity by branch start: where the deviations scatter",
        header=[
            "Sweep",
            "Model",
            "Phase",
            "Start step",
            "Method",
            "Branches",
            "Mean d",
            "SD of d",
            "Largest |d|",
        ],
        rows=rows,
        align="lllrlrrrr",
        notes=[
            f"{_k_note(runs)} The deviations of the table above, split by the step of its phase each "
            "branch started at (one branch a seed). A start at step 0 loads no trained state: its k "
            "steps are the first of training, through the warm-up."
        ],
    )
    return Selection(table, runs)
