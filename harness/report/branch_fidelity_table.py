"""The branched fidelity table: a method's held-out loss k steps after it started from the fp32
reference's own state, against the reference's.

A branched run (`harness.run.branches`, `+exp=convergence_branched`) starts the method from the
reference's weights and AdamW moments every `branch_every` steps and trains it k steps on the
reference's batches; its deviation d is its held-out loss then minus the reference's. The branches
share their start, so trajectory noise, which makes the seeds' table (`fidelity_table`) wide,
barely enters: what d measures is what the method's arithmetic does to k steps of training.

Per (sweep, model, phase, method), over every branch of every seed (the latest run of each seed):
the number of branches, the mean d and its 95% Student's t interval, judged against two bands,
each the largest |mean| + half-width among its controls, with the seeds' table's verdicts ("within
noise", "biased by X +- Y nats", "unresolved"):

- fp32 rounding's: the fp32 controls (torch AdamW, FORGE fp32: the same update as the reference
  with other rounding). It is orders of magnitude under what bf16 arithmetic moves in k steps.
- bf16 arithmetic's: fp32 master weights and states with the forward under bf16 autocast (fused
  AdamW in the mixed-precision recipe). Its d is what bf16 GEMMs cost with nothing lost in the
  weights or states: a bf16 method within this band loses nothing there that fp32 masters keep.

The target asks whether the whole interval lies within +-`TARGET_NATS` (met), beyond it (not met)
or across its edge (unresolved).

The interval counts every branch as one draw. The branches of a seed share the reference's
trajectory; if that tied their deviations together, the seeds' means would scatter more than the
branches within a seed predict, and the interval would be too narrow. The seed-effect column is
that test's F ratio (`seed_effect`): the variance between the seeds' means over the variance
within a seed, each per degree of freedom. Near 1 the seed adds nothing to a branch's own scatter;
the 5% point of F is about 3.5 for 3 seeds of 8 branches, 2.6 for 6 seeds of 5.

A second table (`branch_fidelity_by_start`) splits the same deviations by the step each branch
started at: their mean, standard deviation and largest |d| over the seeds. It shows where the
pooled interval's width comes from, e.g. a branch started from the random initialisation, whose
50 steps fall through the warm-up and a loss drop of several nats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from harness.points import latest_by_key, seed_of
from harness.records import Record, is_branched
from harness.report.convergence_table import row_order
from harness.report.fidelity_table import (
    MIN_SEEDS,
    TARGET_NATS,
    band_verdict,
    interval,
    is_control,
    noise_bands,
    statistics_cells,
)
from harness.report.markup import NONE, Table
from harness.report.names import display_name
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


def seed_effect(by_seed: Sequence[Sequence[float]]) -> float | None:
    """One-way analysis of variance of the deviations grouped by seed: the mean square between the
    seeds' means over the mean square within the seeds. None without two seeds, a seed with two
    branches, or any spread within a seed."""
    groups = [list(g) for g in by_seed if g]
    n, k = sum(map(len, groups)), len(groups)
    if k < 2 or n <= k:
        return None
    grand = statistics.fmean(x for g in groups for x in g)
    means = [statistics.fmean(g) for g in groups]
    between = sum(len(g) * (m - grand) ** 2 for g, m in zip(groups, means)) / (k - 1)
    within = sum((x - m) ** 2 for g, m in zip(groups, means) for x in g) / (n - k)
    return between / within if within > 0 else None


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
    seeds: dict[tuple, dict[int, list[float]]] = {}  # each row's deviations, by seed
    labels: dict[tuple, str] = {}
    controls: set[tuple] = set()  # fp32 arithmetic: the reference's
    bf16_controls: set[tuple] = set()  # fp32 masters under bf16 autocast
    for record in latest_by_key(runs).values():
        for phase, values in branch_deviations(record).items():
            key = (str(record.get("sweep")), str(record.get("model")), phase, row_order(record))
            seeds.setdefault(key, {}).setdefault(seed_of(record), []).extend(values)
            labels[key] = display_name(record)
            if is_control(record):
                controls.add(key)
            elif is_control(record, "bf16"):
                bf16_controls.add(key)
    draws = {key: [d for values in by_seed.values() for d in values] for key, by_seed in seeds.items()}
    bands, bf16_bands = noise_bands(draws, controls), noise_bands(draws, bf16_controls)
    rows = []
    for key in sorted(draws):
        values, band, bf16_band = draws[key], bands.get(key[:3]), bf16_bands.get(key[:3])
        effect = seed_effect(list(seeds[key].values()))
        row = [
            *key[:3],
            labels[key],
            str(len(seeds[key])),
            str(len(values)),
            NONE if effect is None else f"{effect:.2f}",
            *statistics_cells(values, band, ".2e"),
            band_verdict(values, key in controls, band, unit="branch", fmt=".2e")[0],
        ]
        if key in controls:  # fp32 arithmetic: neither the bf16 band nor the target is theirs
            rows.append(row + [NONE, NONE, NONE])
            continue
        bf16_cells = band_verdict(
            values, key in bf16_controls, bf16_band, "branch", ".2e", kind="bf16-arithmetic"
        )
        band_cell = NONE if bf16_band is None else f"+-{bf16_band:.2e}"
        rows.append(row + [band_cell, bf16_cells[0], target(values)])
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
            "Seed effect (F)",
            "Mean d (nats)",
            "95% interval",
            "Noise band (fp32 controls)",
            "Verdict",
            "Band of bf16 arithmetic (fp32 masters, autocast)",
            "Verdict against it",
            f"Target: 95% interval within +-{TARGET_NATS}",
        ],
        rows=rows,
        align="lllllrrrrrlrll",
        notes=[
            f"{_k_note(runs)} d: the method's held-out loss k steps after loading "
            "the reference's weights and AdamW moments (fused AdamW on fp32 master weights, trained "
            "once a seed and shared by every method), minus the reference's at the same step; mean and "
            "Student's t 95% interval over every branch of every seed. Noise band: the largest |mean| + "
            "half-width of the fp32 controls (fp32 arithmetic, other rounding). Band of bf16 "
            "arithmetic: the same of fp32 master weights and states with the forward under bf16 "
            f"autocast. {MIN_SEEDS} branches at least for a verdict. Target: the 95% interval "
            f"of the mean d within +-{TARGET_NATS} nats. Seed effect: the variance of the seeds' mean "
            "d over the variance of d within a seed (one-way ANOVA's F); near 1, the branches of a "
            "seed scatter independently of it and count as draws."
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
            key = (str(record.get("sweep")), str(record.get("model")), phase, start, row_order(record))
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
