"""The tokens-per-step tables: FORGE against the floor, and the peak, as a step's tokens grow.

Three tables, each beside the prediction of `harness.report.token_model`:

- `overhead_vs_tokens` (from `+exp=scaling_tokens_h200`): each method's step over the
  no-optimizer floor of the same sweep, model, tokens and step mode (graphed with graphed, eager
  with eager), measured and predicted: where the update hides under the dW GEMM, and where none
  of it does;
- `peak_vs_tokens` (from `+exp=peak_vs_tokens_h200`): the peak with and without activation
  checkpointing, predicted, split into pools at the moment of the peak where the record carries
  `peak_pools_gib` (`measure.peak_pools`), and FORGE's saving over fused AdamW, measured and
  predicted;
- `largest_fit` (the same sweep): per method and checkpointing setting, the largest step that ran
  below the smallest one that ran out of memory, beside the predicted largest.

Rows span every (tokens, method) the sweep has a record of: a combination without a record reads
`not measured` in every measured cell (the sweep left it out, or it did not run), a failed point
its status; no figure is ever filled in. The series the plots draw come from the same rows
(`overhead_series`, the same against model size `overhead_by_size`, `peak_series`). Without
records of a sweep its table is not built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.points import LOSS_NAMES, graphed, latest_by_key, options_dict, step_mode
from harness.records import Record, is_convergence
from harness.report import expectations as ex
from harness.report import token_model as tm
from harness.report.markup import NONE, Table, fmt_gib, fmt_int, fmt_ms, fmt_ratio
from harness.report.names import display_name, method_rank
from harness.report.tables import (
    COL_METHOD,
    STATUS_LABELS,
    Col,
    Notes,
    Row,
    Selection,
    ok,
    render_rows,
    step_median,
)
from harness.run.methods.footprint import AFTER_BACKWARD

SCALING_SWEEP = "scaling_tokens_h200"
PEAK_SWEEP = "peak_vs_tokens_h200"
FLOOR, BASELINE = "no_optimizer", "fused_adamw"
NOT_MEASURED = "not measured"
UNBOUNDED = "No larger point of the sweep ran out of memory: a lower bound."
POOL_NAMES = ("weights", "states", "gradients", "activations", "other")


# ---------------------------------------------------------------------------------------------
# The grid of a sweep


def tokens(record: Record) -> int:
    return int(record.get("batch_size") or 0) * int(record.get("seq_len") or 0)


def sweep_records(records: Iterable[Record], sweep: str) -> list[Record]:
    """The latest record of each configuration of `sweep` (step records only)."""
    chosen = [r for r in records if r.get("sweep") == sweep and not is_convergence(r)]
    return list(latest_by_key(chosen).values())


def group_of(record: Record) -> tuple:
    """What a table's rows, and a plot's panels, are split by: model and GPU."""
    return (str(record.get("model")), str(record.get("gpu_name") or record.get("gpu")))


def _shape(record: Record) -> tuple[int, int, int, bool]:
    """(tokens, batch, seq, checkpointing) of a record."""
    batch, seq = int(record.get("batch_size") or 0), int(record.get("seq_len") or 0)
    return (batch * seq, batch, seq, bool(record.get("activation_checkpointing")))


def _label_order(record: Record) -> tuple:
    return (not graphed(record), method_rank(str(record.get("method"))), display_name(record))


def _placeholder(like: Record, shape: tuple[int, int, int, bool]) -> Record:
    """A point of the grid without a record: `like`'s method, model and GPU at `shape`."""
    keep = ("sweep", "method", "method_label", "method_options", "model", "n_params", "gpu_name", "gpu")
    record = {key: like.get(key) for key in keep}
    record.update(status=NOT_MEASURED, batch_size=shape[1], seq_len=shape[2])
    record.update(activation_checkpointing=shape[3], config=like.get("config"))
    return record


def grid(records: Sequence[Record]) -> list[Record]:
    """Every (model, GPU, shape, method label) the records span: each record, or a placeholder
    where a label has no record at a shape its group has, sorted by model size, GPU, checkpointing,
    tokens, then graphed steps first and methods in their order. A label gets placeholders only
    on the checkpointing side it was measured on (a loss run in chunks with checkpointing alone
    adds no rows to the runs without)."""
    groups: dict[tuple, list[Record]] = {}
    for record in records:
        groups.setdefault(group_of(record), []).append(record)
    out = []
    for members in groups.values():
        shapes = sorted({_shape(r) for r in members})
        labels: dict[tuple[bool, str], Record] = {}
        for record in sorted(members, key=_label_order):
            labels.setdefault((_shape(record)[3], display_name(record)), record)
        have = {(_shape(r), display_name(r)): r for r in members}
        for shape in shapes:
            for (checkpointing, label), like in labels.items():
                if checkpointing == shape[3]:
                    out.append(have.get((shape, label)) or _placeholder(like, shape))
    size = lambda r: max(float(m.get("n_params") or 0) for m in records if m.get("model") == r.get("model"))
    key = lambda r: (size(r), group_of(r), _shape(r)[3], _shape(r)[0], _label_order(r))
    return sorted(out, key=key)


def _n_params(record: Record, records: Sequence[Record]) -> float | None:
    """The model's parameter count, from this record or any other of the same model."""
    for candidate in (record, *records):
        if candidate.get("model") == record.get("model") and candidate.get("n_params"):
            return float(candidate["n_params"])
    return None


def _twin(record: Record, records: Sequence[Record], method: str) -> Record | None:
    """The record of `method` at `record`'s configuration whose step ran the same way (graphed or
    eager, autocast, compiled, chunked loss; the floor is the floor of a clipped step too), the
    one with the fewest options where several are."""
    mode = _mode(record, method == FLOOR)
    candidates = [
        other
        for other in records
        if other.get("method") == method
        and group_of(other) == group_of(record)
        and _shape(other) == _shape(record)
        and _mode(other, method == FLOOR) == mode
    ]
    return min(candidates, key=lambda r: len(options_dict(r.get("method_options"))), default=None)


def _mode(record: Record, for_floor: bool) -> tuple:
    """How the step ran (`harness.points.step_mode`); against the floor, without the update's own
    options (clipping, an FP8 recipe), which the floor has no update to take."""
    mode = step_mode(record)
    return mode[:4] if for_floor else mode


# ---------------------------------------------------------------------------------------------
# Cells


def _status(record: Record | None) -> str:
    if record is None:
        return NOT_MEASURED
    status = str(record.get("status"))
    return STATUS_LABELS.get(status, status)


COL_MODEL = Col("Model", lambda r: str(r.record.get("model")), "l", measured=False)
COL_TOKENS = Col("Tokens", lambda r: fmt_int(tokens(r.record)), measured=False)
COL_SHAPE = Col(
    "Batch x seq",
    lambda r: f"{_int(r.record.get('batch_size'))} x {_int(r.record.get('seq_len'))}",
    "l",
    measured=False,
)
COL_STEP_MODE = Col("Step", lambda r: "graphed" if graphed(r.record) else "eager", "l", measured=False)
COL_AC = Col(
    "Act. ckpt", lambda r: "on" if r.record.get("activation_checkpointing") else "off", "l", measured=False
)
COL_STEP_MS = Col("Step ms (median)", lambda r: fmt_ms(step_median(r.record)))
COL_PEAK = Col("Peak alloc GiB", lambda r: fmt_gib(_float(r.record.get("peak_alloc_gib"))))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# ---------------------------------------------------------------------------------------------
# The step over the floor


def _floor_cell(row: Row, value: Any) -> str:
    """A measured figure against the floor: `value(record, floor)`, or why there is none."""
    floor = row.ref
    if floor is None:
        return NONE + " " + row.notes.mark(FLOOR_MISSING)
    if not ok(floor):
        return f"floor {_status(floor)}"
    mine, base = step_median(row.record), step_median(floor)
    return NONE if mine is None or not base else value(mine, base)


FLOOR_MISSING = "The no-optimizer floor of this configuration and step mode has no record in the sweep."


def _prediction(
    record: Record, records: Sequence[Record], ceilings: ex.Ceilings | None
) -> tm.Overhead | None:
    arch, n = tm.architecture(record), _n_params(record, records)
    if arch is None or n is None or ceilings is None:
        return None
    options = record.get("method_options")
    return tm.overhead(str(record.get("method")), options, arch, n, tokens(record), ceilings)


def _predicted_cell(record: Record, records: Sequence[Record], ceilings: ex.Ceilings | None) -> str:
    predicted = _prediction(record, records, ceilings)
    if predicted is None:
        return NONE
    if abs(predicted.exposed_ms - predicted.hidden_ms) < 0.05:
        return fmt_ms(predicted.exposed_ms)
    return f"{fmt_ms(predicted.hidden_ms)}-{fmt_ms(predicted.exposed_ms)}"


def overhead_vs_tokens(records: Sequence[Record]) -> Selection | None:
    """The step over the floor against tokens per step (`+exp=scaling_tokens_h200`)."""
    chosen = sweep_records(records, SCALING_SWEEP)
    if not chosen:
        return None
    notes = Notes()
    c = ex.ceilings(chosen)
    rows = [Row(r, _twin(r, chosen, FLOOR), notes) for r in grid(chosen)]
    cols = [COL_MODEL, COL_TOKENS, COL_SHAPE, COL_METHOD, COL_STEP_MODE, COL_STEP_MS]
    cols += [
        Col("vs floor", lambda r: _floor_cell(r, lambda m, b: fmt_ratio(m / b))),
        Col("Over floor ms", lambda r: _floor_cell(r, lambda m, b: f"{m - b:+.1f}")),
        Col("Predicted over floor ms", lambda r: _predicted_cell(r.record, chosen, c), measured=False),
        COL_PEAK,
    ]
    rates = (
        f"the update's traffic at {c.copy_tbps:g} TB/s beside the dW GEMMs at {c.matmul_tflops:g} TFLOP/s"
        if c is not None
        else "none: no record ran on a card whose ceilings its conf/gpu file states"
    )
    extra = [
        "Floor: the no-optimizer step (forward and backward, gradients dropped) of the same sweep, model, "
        f"tokens and step mode. Predicted (harness.report.token_model): {rates}; for FORGE 'hidden-exposed': "
        "the update hidden under the dW GEMM as far as it fits, and not hidden at all; clipped FORGE adds "
        "the gradient norms' matrix work. Traffic at the copy rate is a lower bound for an update bound "
        "by instructions.",
        f"{NOT_MEASURED}: no record of that point (the sweep left it out, or it did not run).",
    ]
    title = "FORGE against the floor as tokens per step grow: step time over the no-optimizer step"
    table = render_rows("overhead_vs_tokens", title, cols, rows, notes, extra)
    return Selection(table, chosen)


@dataclass
class Series:
    """One method's line in a plot: per point its tokens, the measured value or the failure, and
    the predicted bounds."""

    label: str
    graphed: bool
    points: list[tuple[int, float | None, str | None]] = field(default_factory=list)  # (T, value, status)
    predicted: list[tuple[int, float, float]] = field(default_factory=list)  # (T, low, high)
    linestyle: str = "-"  # of the measured line; eager steps beside graphed ones are drawn "-."


def overhead_series(records: Sequence[Record]) -> dict[tuple, list[Series]]:
    """(model, GPU), smallest model first -> each method's step over the floor of its own mode
    against tokens: graphed methods over the graphed floor, measured and predicted (the predicted
    overhead over the measured floor's time); eager ones (but the floor) over the eager floor,
    measured only, since the prediction counts GPU time and an eager step can be set by its host."""
    chosen = sweep_records(records, SCALING_SWEEP)
    c = ex.ceilings(chosen)
    out: dict[tuple, dict[str, Series]] = {}
    for record in grid(chosen):
        is_graphed = graphed(record)
        if not is_graphed and record.get("method") == FLOOR:
            continue  # the eager floor over itself: the graphed floor's line at 1.00x stands for both
        label = display_name(record)
        series = out.setdefault(group_of(record), {}).setdefault(
            label, Series(label, is_graphed, linestyle="-" if is_graphed else "-.")
        )
        floor = _twin(record, chosen, FLOOR)
        base = step_median(floor) if floor is not None and ok(floor) else None
        mine = step_median(record) if ok(record) else None
        value = mine / base if mine is not None and base else None
        series.points.append((tokens(record), value, None if value is not None else _status(record)))
        predicted = _prediction(record, chosen, c) if is_graphed else None
        if predicted is not None and base:
            low, high = 1 + predicted.hidden_ms / base, 1 + predicted.exposed_ms / base
            series.predicted.append((tokens(record), low, high))
    return {key: list(series.values()) for key, series in out.items()}


def overhead_by_size(records: Sequence[Record]) -> dict[tuple, list[Series]]:
    """(tokens, GPU) -> each graphed method's step over the graphed floor (measured and predicted)
    against the model's parameters: the model-size axis of the same sweep, at each token count
    that two or more models were measured at (one size is no curve)."""
    chosen = sweep_records(records, SCALING_SWEEP)
    out: dict[tuple, dict[str, Series]] = {}
    for (model, gpu), lines in overhead_series(records).items():
        n = _n_params({"model": model}, chosen)
        if n is None:
            continue
        for line in (line for line in lines if line.graphed):
            for t, value, status in line.points:
                series = out.setdefault((t, gpu), {}).setdefault(line.label, Series(line.label, True))
                series.points.append((n, value, status))
            for t, low, high in line.predicted:
                out[(t, gpu)][line.label].predicted.append((n, low, high))
    sized = {}
    for key, by_label in out.items():
        if len({n for s in by_label.values() for n, _, _ in s.points}) < 2:
            continue
        for s in by_label.values():
            s.points.sort(key=lambda p: p[0])
            s.predicted.sort()
        sized[key] = list(by_label.values())
    return dict(sorted(sized.items()))


@dataclass
class Times:
    """The predicted parts of a step at some ceilings: [(T, dW GEMM ms)] and {line label: update ms}."""

    gemm: list[tuple[int, float]]
    updates: dict[str, float]
    rates: str  # the ceilings, as text ("800 TFLOP/s, 4.27 TB/s")


def analytic_times(records: Sequence[Record]) -> dict[tuple, Times]:
    """(model, GPU) -> `Times`: the step's dW GEMMs against each graphed method's update at the copy
    rate, at the ceilings of the card the sweep ran on: FORGE's whole traffic, which can hide where
    it lies below the GEMMs, and a separate optimizer's traffic beyond the floor's, which runs after
    the backward whatever the GEMMs take."""
    chosen = sweep_records(records, SCALING_SWEEP)
    c = ex.ceilings(chosen)
    if c is None:
        return {}
    out: dict[tuple, Times] = {}
    for record in grid(chosen):
        arch, n = tm.architecture(record), _n_params(record, chosen)
        if arch is None or n is None:
            continue
        times = out.setdefault(group_of(record), Times([], {}, c.rates))
        gemm, updates = times.gemm, times.updates
        point = (tokens(record), tm.gemm_ms(arch, tokens(record), c))
        if point not in gemm:
            gemm.append(point)
        method = str(record.get("method"))
        fp = ex.footprint(method, record.get("method_options"))
        if fp is None or method == FLOOR or not graphed(record):
            continue
        if fp.update == AFTER_BACKWARD:
            floor = ex.footprint(FLOOR)
            label = f"{display_name(record)} update (after the backward)"
            updates.setdefault(label, tm.update_ms(fp.update_traffic - floor.update_traffic, n, c))
        else:
            updates.setdefault(f"{display_name(record)} update", tm.update_ms(fp.update_traffic, n, c))
    return {key: Times(sorted(t.gemm), t.updates, t.rates) for key, t in out.items()}


# ---------------------------------------------------------------------------------------------
# The peak


def _predicted_peak(record: Record, records: Sequence[Record]) -> float | None:
    arch, n = tm.architecture(record), _n_params(record, records)
    if arch is None or n is None:
        return None
    return tm.peak_gib(
        str(record.get("method")),
        record.get("method_options"),
        arch,
        n,
        tokens(record),
        bool(record.get("activation_checkpointing")),
        record.get("master_weights"),
    )


def _pool_cell(name: str) -> Col:
    def cell(row: Row) -> str:
        pools = row.record.get("peak_pools_gib")
        return fmt_gib(_float(pools.get(name))) if isinstance(pools, dict) else NONE

    return Col(name.capitalize(), cell)


def _saving_cell(row: Row) -> str:
    """fused AdamW's peak less this row's, both measured, at the same point."""
    if row.record.get("method") == BASELINE:
        return NONE
    ref = row.ref
    if ref is None:
        return NONE
    if not ok(ref):
        return f"ref {_status(ref)}"
    mine, base = _float(row.record.get("peak_alloc_gib")), _float(ref.get("peak_alloc_gib"))
    return NONE if mine is None or base is None else fmt_gib(base - mine)


def _predicted_saving(record: Record, records: Sequence[Record]) -> str:
    if record.get("method") == BASELINE:
        return NONE
    loss = {k: v for k, v in options_dict(record.get("method_options")).items() if k in LOSS_NAMES}
    baseline = dict(record, method=BASELINE, method_options=loss)  # the same loss, fused AdamW's update
    mine, base = _predicted_peak(record, records), _predicted_peak(baseline, records)
    return NONE if mine is None or base is None else fmt_gib(base - mine)


def peak_vs_tokens(records: Sequence[Record]) -> Selection | None:
    """The peak against tokens per step, with and without checkpointing (`+exp=peak_vs_tokens_h200`)."""
    chosen = sweep_records(records, PEAK_SWEEP)
    if not chosen:
        return None
    notes = Notes()
    rows = [Row(r, _twin(r, chosen, BASELINE), notes) for r in grid(chosen)]
    cols = [COL_MODEL, COL_AC, COL_TOKENS, COL_SHAPE, COL_METHOD, COL_PEAK]
    cols.append(Col("Predicted GiB", lambda r: fmt_gib(_predicted_peak(r.record, chosen)), measured=False))
    cols += [_pool_cell(name) for name in POOL_NAMES]
    cols.append(Col("Peak in", lambda r: str(r.record.get("peak_pools_phase") or NONE), "l"))
    cols.append(Col("Saving vs fused AdamW GiB", _saving_cell))
    cols.append(Col("Predicted saving GiB", lambda r: _predicted_saving(r.record, chosen), measured=False))
    extra = [
        "Peak alloc GiB: torch.cuda.max_memory_allocated over the timed steps. Weights to Other: GiB held at "
        "the moment of the peak of one more, recorded, eager step, named from the CUDA allocator's history "
        "(harness.run.peak_pools; requested sizes, so they add up to that step's allocator peak less its "
        "rounding); Peak in: the phase of that step it fell in. Predicted (harness.report.token_model): "
        "weights and states, plus the larger of the activations (a + l bytes a token) and the gradients "
        "kept until the update. Saving: fused AdamW's peak less the row's, at the same point.",
        f"{NOT_MEASURED}: no record of that point (the sweep left it out, or it did not run).",
    ]
    title = "Peak memory against tokens per step, with and without activation checkpointing"
    return Selection(render_rows("peak_vs_tokens", title, cols, rows, notes, extra), chosen)


def dense_tokens(low: int, high: int, n: int = 48) -> list[int]:
    """`n` token counts spread evenly on a log scale from `low` to `high`: where a predicted line
    is drawn, so its kinks (where the activations overtake the gradient) show between the points."""
    if low <= 0 or high <= low:
        return [low] if low > 0 else []
    return sorted({round(low * (high / low) ** (i / (n - 1))) for i in range(n)})


def peak_series(records: Sequence[Record]) -> dict[tuple, dict[bool, list[Series]]]:
    """(model, GPU), smallest model first -> checkpointing -> each method's measured peak against
    tokens, and its predicted peak over the span of the measured tokens."""
    chosen = sweep_records(records, PEAK_SWEEP)
    out: dict[tuple, dict[bool, dict[str, Series]]] = {}
    likes: dict[int, Record] = {}
    for record in grid(chosen):
        ac = bool(record.get("activation_checkpointing"))
        by_label = out.setdefault(group_of(record), {}).setdefault(ac, {})
        series = by_label.setdefault(display_name(record), Series(display_name(record), graphed(record)))
        likes.setdefault(id(series), record)
        value = _float(record.get("peak_alloc_gib")) if ok(record) else None
        series.points.append((tokens(record), value, None if value is not None else _status(record)))
    for by_ac in out.values():
        for by_label in by_ac.values():
            for series in by_label.values():
                span = [t for t, _, _ in series.points]
                for t in dense_tokens(min(span), max(span)):
                    predicted = _predicted_peak(dict(likes[id(series)], batch_size=t, seq_len=1), chosen)
                    if predicted is not None:
                        series.predicted.append((t, predicted, predicted))
    return {key: {ac: list(s.values()) for ac, s in by_ac.items()} for key, by_ac in out.items()}


# ---------------------------------------------------------------------------------------------
# The largest step that fits


def largest_ok(points: Sequence[Record]) -> tuple[Record | None, Record | None]:
    """(the largest point that ran below the smallest that ran out of memory, that point): by
    tokens; without an OOM, the largest that ran and None."""
    ordered = sorted(points, key=tokens)
    ooms = [r for r in ordered if r.get("status") == "oom"]
    first_oom = ooms[0] if ooms else None
    limit = tokens(first_oom) if first_oom else None
    fits = [r for r in ordered if ok(r) and (limit is None or tokens(r) < limit)]
    return (fits[-1] if fits else None), first_oom


def _point(record: Record | None) -> str:
    if record is None:
        return NONE
    return f"{tokens(record)} ({_int(record.get('batch_size'))} x {_int(record.get('seq_len'))})"


def largest_fit(records: Sequence[Record]) -> Selection | None:
    """Per model, GPU, checkpointing setting and method: the largest step that fits, from the peak
    sweep's records, beside the predicted largest."""
    from harness.report.plots import capacity_gib

    chosen = sweep_records(records, PEAK_SWEEP)
    if not chosen:
        return None
    notes = Notes()
    groups: dict[tuple, list[Record]] = {}
    for record in chosen:
        key = group_of(record) + (
            int(record.get("seq_len") or 0),
            bool(record.get("activation_checkpointing")),
        )
        groups.setdefault(key + (display_name(record),), []).append(record)
    order = lambda key: (key[0], key[1], key[2], key[3], _label_order(groups[key][0]))
    rows = []
    for key in sorted(groups, key=order):
        points = groups[key]
        fits, first_oom = largest_ok(points)
        largest = _point(fits) if fits else "none fits"
        if fits is not None and first_oom is None:
            largest += " " + notes.mark(UNBOUNDED)
        like = points[0]
        arch, n, cap = tm.architecture(like), _n_params(like, chosen), capacity_gib(like)
        predicted = None
        if arch is not None and n is not None and cap is not None:
            predicted = tm.largest_tokens(
                str(like.get("method")),
                like.get("method_options"),
                arch,
                n,
                key[3],
                cap,
                like.get("master_weights"),
            )
        rows.append(
            [key[0], "on" if key[3] else "off", key[4], largest, _point(first_oom), fmt_int(predicted)]
        )
    header = ["Model", "Act. ckpt", "Method", "Largest that fits: tokens (batch x seq)", "First OOM"]
    header += ["Predicted largest tokens"]
    extra = [
        "Largest that fits: the largest point that ran below the smallest that ran out of memory, from "
        "the records alone. Predicted: where the predicted peak meets the card's memory "
        "(harness.report.token_model; the CUDA context and the allocator's slack are not counted)."
    ]
    title = "The largest step that fits on one GPU, per method, with and without activation checkpointing"
    table = Table("largest_fit", title, header, rows, align="lllllr", notes=extra + notes.lines())
    return Selection(table, chosen)


def _int(value) -> int | None:
    """A record's count as an int (records loaded through pandas carry floats)."""
    return None if value is None else int(value)
