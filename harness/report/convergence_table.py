"""The convergence table: how far each method's loss curve strays from the reference's.

Convergence records (`+exp=convergence`; see `harness.records.is_convergence`) carry
every step's training loss in `loss_curve` (or `losses`) and, optionally, held-out losses in
`heldout_loss_curve`. Within a sweep and model, every method trains from the same seed on the
same data order, so curves can be compared step by step against the reference:

- a record marked `"convergence_reference": true`, if any;
- else fused AdamW with fp32 master weights and an fp32 forward; else with fp32 master weights
  (under autocast); else fused AdamW.

The expectation: with fp32 weights and states FORGE equals torch.optim up to the GEMM's summation
order (mean |delta| near 1e-4 nats or below); the paper puts bf16 with stochastic rounding and int8
states within 0.001 nats; plain bf16 write-back without stochastic rounding stalls (its curve
flattens and the distance grows over the run, so the last 10% tells more than the mean).

"Steps within 1e-4" counts the leading steps of each phase whose loss stays within 1e-4 nats of
the reference's: where the two runs part ways. "Signed d (last 10%)" keeps the sign: a run that
sits above the reference (+) or below it (-) at the end, rather than around it.

Two fp32 runs that differ only in rounding part ways after the warm-up and then wander around each
other, so one run's offset is one draw. Repeats under other seeds (`seed=1`, `seed=2`: other
weights and data order, the same for every method of that seed) are rows of their own, and
`convergence_seeds` summarizes each method over the seeds: whether its offset keeps one sign.

A run in phases (pretraining, then continued pretraining on a second text) lists them in
`phases` (`name`, `first_step`, `steps`): each phase gets its own row, with the held-out losses
whose `heldout_steps` fall in it.

No convergence records, no table: the report skips this section.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.points import REFERENCE_METHOD, autocast, latest_by_key, options_key, seed_of
from harness.records import HELDOUT_FIELDS, LOSS_FIELDS, Record, is_branched, is_convergence
from harness.report import paper
from harness.report.markup import NONE, Table, fmt_float
from harness.report.names import display_name, method_rank
from harness.report.tables import Selection


def curve(record: Record, fields: Sequence[str] = LOSS_FIELDS) -> list[float] | None:
    """A loss curve as floats; [step, loss] pairs are read as their loss."""
    for name in fields:
        values = record.get(name)
        if values is not None and len(values) > 0:
            return [float(v[-1] if isinstance(v, list | tuple) else v) for v in values]
    return None


def mean_abs_delta(values: Sequence[float], reference: Sequence[float], tail: float = 1.0) -> float | None:
    """Mean |values - reference| over the common steps, or over their last `tail` fraction."""
    pairs = _tail_pairs(values, reference, tail)
    return sum(abs(a - b) for a, b in pairs) / len(pairs) if pairs else None


def mean_signed_delta(values: Sequence[float], reference: Sequence[float], tail: float = 1.0) -> float | None:
    """Mean (values - reference) over the common steps, or over their last `tail` fraction."""
    pairs = _tail_pairs(values, reference, tail)
    return sum(a - b for a, b in pairs) / len(pairs) if pairs else None


def _tail_pairs(values: Sequence[float], reference: Sequence[float], tail: float) -> list[tuple]:
    n = min(len(values), len(reference))
    if n == 0:
        return []
    start = n - max(1, round(n * tail))
    return list(zip(values[start:n], reference[start:n]))


AGREE_NATS = 1e-4  # "steps within": how long a curve stays this close to the reference


def steps_within(values: Sequence[float], reference: Sequence[float], nats: float = AGREE_NATS) -> int | None:
    """How many leading steps stay within `nats` of the reference: where two runs part ways. A run
    whose arithmetic differs from the reference's only in rounding stays at 0-1e-6 until training
    amplifies the difference; a run with other arithmetic (bf16) parts at once."""
    n = min(len(values), len(reference))
    if n == 0:
        return None
    return next((i for i in range(n) if abs(values[i] - reference[i]) > nats), n)


def reference_of(group: Sequence[Record]) -> Record | None:
    """The curve everything in `group` is compared with (see the module docstring)."""
    marked = [r for r in group if r.get("convergence_reference")]
    if marked:
        return marked[0]
    fused = [r for r in group if r.get("method") == REFERENCE_METHOD]
    fp32 = [r for r in fused if str(r.get("master_weights")) == "fp32"]
    all_fp32 = [r for r in fp32 if not autocast(r)]
    pool = all_fp32 or fp32 or fused
    return sorted(pool, key=lambda r: options_key(r.get("method_options")))[0] if pool else None


def groups_of(records: Sequence[Record]) -> dict[tuple[str, str, int], list[Record]]:
    """Convergence records by (sweep, model, seed), the latest of each configuration: the runs
    that share weights and data order, so that curves compare step by step."""
    by_sweep: dict[str, list[Record]] = {}
    for record in records:
        if is_convergence(record) and not is_branched(record):  # the latest of a configuration: two
            by_sweep.setdefault(str(record.get("sweep")), []).append(record)  # sweeps' schedules differ
    groups: dict[tuple[str, str, int], list[Record]] = {}
    for sweep, runs in by_sweep.items():
        for record in latest_by_key(runs).values():
            groups.setdefault((sweep, str(record.get("model")), seed_of(record)), []).append(record)
    return groups


def convergence(records: Sequence[Record]) -> Selection | None:
    """One row per method, group (sweep, model, seed) and phase: loss distances to the reference."""
    runs = [r for r in records if is_convergence(r) and not is_branched(r)]
    if not runs:
        return None
    groups = groups_of(runs)
    rows = []
    for key in sorted(groups):
        rows += [row for row, _ in _group_rows(groups[key])]
    header = ["Sweep", "Model", "Seed", "Method", "Master weights", "Phase", "Steps", "First loss"]
    header += ["Last loss", "Mean |d| (all)", "Mean |d| (last 10%)", "Signed d (last 10%)"]
    header += ["Held-out mean |d|", "Steps within 1e-4"]
    table = Table(
        name="convergence",
        title="Convergence: mean absolute loss difference to the reference, in nats",
        header=header,
        rows=rows,
        align="llrlll" + "r" * 8,
        notes=[paper.CONVERGENCE_NOTE, "The reference row is marked (ref); |d| is in nats."],
    )
    return Selection(table, runs)


def convergence_seeds(records: Sequence[Record]) -> Selection | None:
    """Per method and phase, over the seeds it ran under (two or more): the spread of its distance
    and offset to each seed's reference. None when no method ran under two seeds."""
    per_method: dict[tuple, list[dict[str, Any]]] = {}
    labels: dict[tuple, str] = {}
    for (sweep, model, _seed), group in sorted(groups_of(records).items()):
        for row, stats in _group_rows(group):
            if stats is None:
                continue
            key = (sweep, model, stats["order"], stats["phase"])
            per_method.setdefault(key, []).append(stats)
            labels[key] = row[3]
    rows = []
    for key in sorted(per_method, key=lambda k: (k[0], k[1], k[2], k[3])):
        draws = per_method[key]
        if len(draws) < 2:
            continue
        signed = [d["signed_tail"] for d in draws if d["signed_tail"] is not None]
        within = [d["within"] for d in draws if d["within"] is not None]
        rows.append(
            [key[0], key[1], labels[key], key[3], str(len(draws))]
            + [_mean_cell([d["abs_all"] for d in draws]), _mean_cell(signed)]
            + [_range_cell(signed), _positive_cell(signed)]
            + [f"{min(within)}-{max(within)}" if within else NONE]
        )
    if not rows:
        return None
    header = ["Sweep", "Model", "Method", "Phase", "Seeds", "Mean |d| (all), mean over seeds"]
    header += ["Signed d (last 10%), mean", "Signed d (last 10%), range", "Seeds above the reference"]
    header += ["Steps within 1e-4"]
    table = Table(
        name="convergence_seeds",
        title="Convergence over seeds: each method against its seed's reference",
        header=header,
        rows=rows,
        align="llll" + "r" * 6,
        notes=[
            "A method that only rounds differently from the reference sits above it under some seeds and "
            "below it under others; one that keeps one sign under every seed trains differently."
        ],
    )
    return Selection(table, [r for r in records if is_convergence(r) and not is_branched(r)])


def _mean_cell(values: Sequence[float | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{sum(present) / len(present):.2e}" if present else NONE


def _range_cell(values: Sequence[float]) -> str:
    return f"{min(values):+.2e} to {max(values):+.2e}" if values else NONE


def _positive_cell(values: Sequence[float]) -> str:
    return f"{sum(v > 0 for v in values)} of {len(values)}" if values else NONE


def row_order(record: Record) -> tuple:
    """Where a convergence record's row goes: its method in display order, then its master weights
    and options (the fidelity tables list their rows the same way)."""
    return (
        method_rank(record.get("method")),
        str(record.get("master_weights")),
        options_key(record.get("method_options")),
    )


def phases_of(record: Record, n_steps: int) -> list[tuple[str, int, int]]:
    """(name, first step, end step) of each phase of a run; the whole run when it has none."""
    phases = record.get("phases") or []
    spans = [
        (
            str(p.get("name")),
            int(p.get("first_step", 0)),
            int(p.get("first_step", 0)) + int(p.get("steps", 0)),
        )
        for p in phases
    ]
    return spans or [("all", 0, n_steps)]


def _heldout_in(record: Record, values: list[float] | None, start: int, end: int) -> list[float] | None:
    """The held-out losses measured at steps in [start, end); all of them when steps are not recorded."""
    steps = record.get("heldout_steps")
    if values is None or steps is None:
        return values
    return [v for v, step in zip(values, steps) if start <= int(step) < end]


def _group_rows(group: list[Record]) -> list[tuple[list[str], dict[str, Any] | None]]:
    """The table rows of one group, each with its figures (None for the reference's rows)."""
    reference = reference_of(group)
    ref_curve = curve(reference) if reference else None
    ref_heldout = curve(reference, HELDOUT_FIELDS) if reference else None
    rows = []
    for record in sorted(group, key=row_order):
        losses = curve(record) or []
        heldout = curve(record, HELDOUT_FIELDS)
        label = display_name(record) + (" (ref)" if record is reference else "")
        for phase, start, end in phases_of(record, len(losses)):
            part = losses[start:end]
            ref_part = ref_curve[start:end] if ref_curve else None
            stats = None
            if record is not reference and part and ref_part:
                stats = {
                    "order": row_order(record),
                    "phase": phase,
                    "abs_all": mean_abs_delta(part, ref_part),
                    "abs_tail": mean_abs_delta(part, ref_part, 0.1),
                    "signed_tail": mean_signed_delta(part, ref_part, 0.1),
                    "within": steps_within(part, ref_part),
                }
            ref_held = _heldout_in(reference, ref_heldout, start, end) if reference else None
            row = [str(record.get("sweep")), str(record.get("model")), str(seed_of(record)), label]
            row += [str(record.get("master_weights") or NONE), phase]
            row += [str(len(part)), _loss(part[0] if part else None), _loss(part[-1] if part else None)]
            row += _deltas(record is reference, stats, _heldout_in(record, heldout, start, end), ref_held)
            rows.append((row, stats))
    return rows


def _loss(value: float | None) -> str:
    return fmt_float(value, 4)


def _deltas(is_ref: bool, stats: dict[str, Any] | None, heldout: Any, ref_heldout: Any) -> list[str]:
    if is_ref:
        return ["ref"] * 5
    if stats is None:
        return [NONE, NONE, NONE, _delta(heldout, ref_heldout, 1.0), NONE]
    signed = stats["signed_tail"]
    return [
        _fmt(stats["abs_all"]),
        _fmt(stats["abs_tail"]),
        NONE if signed is None else f"{signed:+.2e}",
        _delta(heldout, ref_heldout, 1.0),
        NONE if stats["within"] is None else str(stats["within"]),
    ]


def _fmt(value: float | None) -> str:
    return NONE if value is None else f"{value:.2e}"


def _delta(values: Any, reference: Any, tail: float) -> str:
    if not values or not reference:
        return NONE
    value = mean_abs_delta(values, reference, tail)
    return NONE if value is None else f"{value:.2e}"
