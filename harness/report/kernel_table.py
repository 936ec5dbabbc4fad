"""T4: the fused kernel against cuBLAS, from `results/kernels/*.jsonl`.

One kernel record times one variant at one linear shape and token count T (`python -m harness
kernels`): `cublas_gemm` is the weight-gradient GEMM alone (`torch.mm(dy.t(), x)`),
`gemm_plus_fused_adamw` is what the baseline really pays (the GEMM, then torch's fused AdamW on the
gradient it wrote), `gemm_plus_fused_adamw_graph` the same captured in a CUDA graph (its GPU work
alone: the host's launches leave it), and `forge` is the fused kernel for one rule and state dtype.

The expectation: the GEMM does 2*T*N*K FLOPs; the update moves the weights and states once each
way. When the update hides under the GEMM, FORGE costs what the GEMM costs (ratio to cuBLAS near
1) and beats GEMM + AdamW by the whole optimizer pass. `floor_ms` is the larger of the FLOP time
at the measured matmul rate and the minimum bytes at the measured copy bandwidth; fraction of
floor = floor / time (1.0 is perfect). `roofline_ms` is the larger of cuBLAS's GEMM, timed beside
the kernel, and the update's bytes at the copy rate: what the kernel would take if its update hid
entirely under a GEMM as fast as cuBLAS's.

Three tables: every point; a summary per (rule, state dtype) against the kernel's targets; and, per
model and T, the kernel times summed over one training step's linear layers (each block's seven,
times the model's layers, plus lm_head): what the weight-gradient work costs a whole step, to
set beside the end-to-end step times of T1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from harness.points import missing
from harness.records import Record
from harness.report.markup import NONE, Table, fmt_float, fmt_ratio
from harness.report.tables import Notes, Row, Selection, status_cell

SHAPE_ORDER = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")
STEP_STATES = ("fp32", "bf16", "int8")  # FORGE AdamW columns of the per-step table
GEMM, GEMM_ADAMW, FORGE = "cublas_gemm", "gemm_plus_fused_adamw", "forge"
GEMM_ADAMW_GRAPH = "gemm_plus_fused_adamw_graph"
POINT_FIELDS = ("model", "shape_name", "T", "N", "K")


def _value(record: Record, name: str):
    value = record.get(name)
    return None if missing(value) else value


def _point(record: Record) -> tuple:
    return tuple(_value(record, f) for f in POINT_FIELDS)


def _variant_key(record: Record) -> tuple:
    return _point(record) + (record.get("variant"), _value(record, "rule"), _value(record, "state_dtype"))


def _point_order(point: tuple) -> tuple:
    model, shape, t, n, k = point
    rank = SHAPE_ORDER.index(shape) if shape in SHAPE_ORDER else len(SHAPE_ORDER)
    return (str(model), rank, str(shape), t or 0, n or 0, k or 0)


def latest(records: Iterable[Record]) -> list[Record]:
    """One record per (point, variant, rule, state dtype): the latest by `time`."""
    chosen: dict[tuple, tuple[str, int, Record]] = {}
    for index, record in enumerate(records):
        key, stamp = _variant_key(record), str(record.get("time") or "")
        if key not in chosen or (stamp, index) >= chosen[key][:2]:
            chosen[key] = (stamp, index, record)
    return [value[2] for value in chosen.values()]


def _ok(record: Record | None) -> bool:
    return record is not None and record.get("status", "ok") in ("ok", None) and _time(record) is not None


def _time(record: Record | None) -> float | None:
    return None if record is None or _value(record, "time_ms") is None else float(record["time_ms"])


def _ratio(record: Record, field: str, base: Record | None) -> float | None:
    if _value(record, field) is not None:
        return float(record[field])
    mine, theirs = _time(record), _time(base)
    return mine / theirs if mine and theirs else None


def _fraction(record: Record) -> float | None:
    if _value(record, "fraction_of_floor") is not None:
        return float(record["fraction_of_floor"])
    floor, time = _value(record, "floor_ms"), _time(record)
    return floor / time if floor and time else None


def _ms(record: Record | None, notes: Notes) -> str:
    if record is None:
        return NONE
    if not _ok(record):
        return status_cell(Row({"method": record.get("variant"), **record}, None, notes))
    return f"{_time(record):.3f}"


def t4_kernels(records: Sequence[Record]) -> list[Selection]:
    """T4 (every point) and T4 summary; empty when there are no kernel records."""
    # a model's layers only: the tuner's records name a shape and no model (`harness kernels --tune`)
    chosen = latest(r for r in records if not missing(r.get("variant")) and not missing(r.get("model")))
    if not chosen:
        return []
    points: dict[tuple, dict[str, list[Record]]] = {}
    for record in chosen:
        points.setdefault(_point(record), {}).setdefault(str(record.get("variant")), []).append(record)
    notes = Notes()
    rows = []
    for point in sorted(points, key=_point_order):
        rows += _point_rows(point, points[point], notes)
    header = ["Model", "Shape", "T", "N x K", "Rule", "States", "FORGE ms", "GEMM ms", "GEMM+AdamW ms"]
    header += ["vs GEMM", "vs GEMM+AdamW", "Floor ms", "Of floor", "vs roofline"]
    table = Table(
        name="t4_kernels",
        title="T4: fused dW-GEMM + update against cuBLAS (median kernel time)",
        header=header,
        rows=rows,
        align="llrrll" + "r" * 8,
        notes=notes.lines(),
    )
    return [
        Selection(table, chosen),
        Selection(_summary(points), chosen),
        Selection(_per_step(points), chosen),
    ]


def _point_rows(point: tuple, variants: dict[str, list[Record]], notes: Notes) -> list[list[str]]:
    model, shape, t, n, k = point
    gemm = (variants.get(GEMM) or [None])[0]
    gemm_adamw = (variants.get(GEMM_ADAMW) or [None])[0]
    forge = sorted(variants.get(FORGE, []), key=lambda r: (str(r.get("rule")), str(r.get("state_dtype"))))
    lead = [str(model), str(shape), _int(t), f"{_int(n)} x {_int(k)}"]
    rows = []
    for record in forge or [None]:
        ok = _ok(record)
        to_gemm = _ratio(record, "ratio_to_gemm", gemm) if ok else None
        to_adamw = _ratio(record, "ratio_to_gemm_adamw", gemm_adamw) if ok else None
        floor = _value(record, "floor_ms") if record else None
        rows.append(
            lead
            + [str(_value(record, "rule") or NONE) if record else NONE]
            + [str(_value(record, "state_dtype") or NONE) if record else NONE]
            + [_ms(record, notes), _ms(gemm, notes), _ms(gemm_adamw, notes)]
            + [fmt_ratio(to_gemm), fmt_ratio(to_adamw), fmt_float(floor, 3)]
            + [_pct(_fraction(record) if ok else None)]
            + [fmt_ratio(_value(record, "ratio_to_roofline") if ok else None)]
        )
    return rows


def _int(value) -> str:
    return NONE if value is None else f"{int(value)}"


def _pct(value: float | None) -> str:
    return NONE if value is None else f"{100 * value:.0f}%"


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _summary(points: dict[tuple, dict[str, list[Record]]]) -> Table:
    """Per (rule, state dtype): geometric means against the kernel's targets."""
    groups: dict[tuple[str, str], list[tuple[tuple, Record]]] = {}
    for point, variants in points.items():
        for record in variants.get(FORGE, []):
            if _ok(record):
                groups.setdefault((str(record.get("rule")), str(record.get("state_dtype"))), []).append(
                    (point, record)
                )
    rows = []
    for (rule, dtype), members in sorted(groups.items()):
        vs_adamw = [_ratio(r, "ratio_to_gemm_adamw", _first(points[p], GEMM_ADAMW)) for p, r in members]
        vs_gemm_big = [
            _ratio(r, "ratio_to_gemm", _first(points[p], GEMM)) for p, r in members if (p[2] or 0) >= 4096
        ]
        vs_graph = [
            _ratio(r, "ratio_to_gemm_adamw_graph", _first(points[p], GEMM_ADAMW_GRAPH)) for p, r in members
        ]
        fractions = [_fraction(r) for _, r in members]
        to_roofline = [float(r["ratio_to_roofline"]) for _, r in members if _value(r, "ratio_to_roofline")]
        vs_adamw = [v for v in vs_adamw if v]
        vs_graph = [v for v in vs_graph if v]
        rows.append(
            [rule, dtype, str(len(members))]
            + [fmt_ratio(geomean(vs_adamw)), fmt_ratio(max(vs_adamw) if vs_adamw else None)]
            + [fmt_ratio(geomean(vs_graph)), fmt_ratio(max(vs_graph) if vs_graph else None)]
            + [fmt_ratio(geomean([v for v in vs_gemm_big if v]))]
            + [_pct(geomean([f for f in fractions if f]))]
            + [fmt_ratio(max(to_roofline) if to_roofline else None)]
        )
    header = ["Rule", "States", "Points", "Geomean vs GEMM+AdamW", "Worst vs GEMM+AdamW"]
    header += ["Geomean vs graphed", "Worst vs graphed"]
    header += ["Geomean vs GEMM (T >= 4096)", "Geomean of floor", "Worst vs roofline"]
    return Table(
        name="t4_kernels_summary",
        title="T4 summary: FORGE kernel against its targets",
        header=header,
        rows=rows,
        align="llrrrrrrrr",
        notes=[
            "Targets (bf16 states): geomean vs GEMM+AdamW <= 0.85x and worst <= 1.00x (never slower "
            "than what the baseline pays); geomean vs the GEMM alone <= 1.10x at T >= 4096.",
            "Roofline: the larger of cuBLAS's dW GEMM, timed beside the kernel, and the update's bytes "
            "(W and the states read and written once) at the run's measured copy rate: a kernel that hid "
            f"its whole update under the GEMM; {NONE} for records made before it was recorded.",
            "Graphed: against GEMM+AdamW captured in a CUDA graph, the baseline's GPU work without its "
            f"host launches (FORGE stays eager); {NONE} where a run did not time it.",
            "Each point's ratios are within one run (its latest); the FORGE records come from "
            + runs(r for variants in points.values() for r in variants.get(FORGE, []))
            + ".",
        ],
    )


def runs(records: Iterable[Record]) -> str:
    """The runs some kernel records come from, per model: the run's start time, its commit and
    how many of the records it holds, e.g. 'llama3.1-8b: 2026-11-30T09:56:09 (5c68ba4, 120)'. A
    model listed with several runs mixes them across its points."""
    counts: dict[str, dict[tuple[str, str], int]] = {}
    for record in records:
        env = record.get("env") if isinstance(record.get("env"), dict) else {}
        commit = str(env.get("git_commit") or record.get("git_commit") or "unknown")[:7]
        run = (str(record.get("time") or "unknown"), commit)
        per_model = counts.setdefault(str(record.get("model")), {})
        per_model[run] = per_model.get(run, 0) + 1
    return "; ".join(
        f"{model}: " + ", ".join(f"{time} ({commit}, {n})" for (time, commit), n in sorted(found.items()))
        for model, found in sorted(counts.items())
    )


def _first(variants: dict[str, list[Record]], name: str) -> Record | None:
    found = variants.get(name) or []
    return found[0] if found else None


def _per_step(points: dict[tuple, dict[str, list[Record]]]) -> Table:
    """Per (model, T): each variant's time summed over one step's linears (AdamW for FORGE)."""
    from harness.kernels.layers import MODELS  # layer counts of the benchmarked models

    by_model_t: dict[tuple, dict[str, dict[str, Record | None]]] = {}
    for (model, shape, t, _n, _k), variants in points.items():
        columns = by_model_t.setdefault((model, t), {})
        columns.setdefault(GEMM, {})[shape] = _first(variants, GEMM)
        columns.setdefault(GEMM_ADAMW, {})[shape] = _first(variants, GEMM_ADAMW)
        for record in variants.get(FORGE, []):
            if record.get("rule") == "adamw":
                columns.setdefault(f"forge_{record.get('state_dtype')}", {})[shape] = record
    rows = []
    for (model, t), columns in sorted(by_model_t.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        layers = MODELS.get(str(model), {}).get("layers")
        sums = {name: _step_sum(shapes, layers) for name, shapes in columns.items()}
        forge = [sums.get(f"forge_{dtype}") for dtype in STEP_STATES]
        rows.append(
            [str(model), _int(t), _int(layers)]
            + [fmt_float(sums.get(GEMM), 1), fmt_float(sums.get(GEMM_ADAMW), 1)]
            + [fmt_float(v, 1) for v in forge]
            + [fmt_float(forge[1] - sums[GEMM] if forge[1] and sums.get(GEMM) else None, 1)]
        )
    header = ["Model", "T", "Layers", "GEMM ms", "GEMM+AdamW ms"]
    header += [f"FORGE AdamW {dtype} ms" for dtype in STEP_STATES] + ["FORGE bf16 minus GEMM ms"]
    return Table(
        name="t4_kernels_per_step",
        title="T4 per step: kernel times summed over one step's linear layers",
        header=header,
        rows=rows,
        align="lrr" + "r" * 6,
        notes=[
            "Each block's q, k, v, o, gate, up and down times the model's layers, plus lm_head, at one T "
            "(tokens per step); a sum needs every shape measured at that T, else it shows as "
            f"{NONE}. Compare with the end-to-end step times of T1 at the same tokens per step."
        ],
    )


def _step_sum(shapes: dict[str, Record | None], layers: int | None) -> float | None:
    if not layers or any(not _ok(shapes.get(name)) for name in SHAPE_ORDER):
        return None
    return sum(_time(shapes[name]) * (1 if name == "lm_head" else layers) for name in SHAPE_ORDER)


FP8_SWEEP = "fp8_kernels"  # `python -m harness kernels --fp8` (harness.kernels.fp8)
FP8_TARGET = 1.15  # the FP8 fused kernel against the FP8 GEMM alone, at T >= 4096


def t4_fp8(records: Sequence[Record]) -> Selection | None:
    """The FP8 fused kernel against the FP8 GEMM alone and the FP8 GEMM + fused AdamW, per shape and
    T (the latest record of each); None without `--fp8` records."""
    latest_of: dict[tuple, Record] = {}
    for record in records:
        if record.get("sweep") == FP8_SWEEP and record.get("status", "ok") == "ok":
            key = (str(record.get("shape_name")), _value(record, "T"))
            if key not in latest_of or str(record.get("time")) >= str(latest_of[key].get("time")):
                latest_of[key] = record
    if not latest_of:
        return None

    def order(key: tuple) -> tuple:
        shape = key[0].rsplit("/", 1)[-1]
        return (key[1] or 0, SHAPE_ORDER.index(shape) if shape in SHAPE_ORDER else len(SHAPE_ORDER), key[0])

    rows = []
    for key in sorted(latest_of, key=order):
        r = latest_of[key]
        fused, gemm, both = r.get("forge_fp8_ms"), r.get("fp8_gemm_ms"), r.get("fp8_gemm_plus_fused_adamw_ms")
        rows.append([
            key[0], _int(r.get("T")), f"{_int(r.get('N'))} x {_int(r.get('K'))}", fmt_float(fused, 3),
            fmt_float(gemm, 3), fmt_float(both, 3), fmt_ratio(fused / gemm if fused and gemm else None),
            fmt_ratio(fused / both if fused and both else None), fmt_float(r.get("forge_bf16_ms"), 3),
            fmt_float(r.get("bf16_gemm_ms"), 3),
        ])  # fmt: skip
    chosen = list(latest_of.values())
    table = Table(
        name="t4_kernels_fp8",
        title="T4 FP8: the fused kernel on FP8 operands against the FP8 GEMM (median kernel time)",
        header=[
            "Shape",
            "T",
            "N x K",
            "FORGE FP8 ms",
            "FP8 GEMM ms",
            "FP8 GEMM+AdamW ms",
            "vs FP8 GEMM",
            "vs FP8 GEMM+AdamW",
            "FORGE bf16 ms",
            "bf16 GEMM ms",
        ],
        rows=rows,
        align="lrl" + "r" * 7,
        notes=[
            "FP8 GEMM: torch._scaled_mm(dy8^T, x8), bf16 out, fp32 accumulation; +AdamW: then torch's fused "
            "AdamW on bf16 weights and states. FORGE FP8: the fused kernel on the same T-major e5m2 dy and "
            f"e4m3 x (AdamW, bf16 states). Target: at most {FP8_TARGET:.2f}x the FP8 GEMM at T >= 4096. "
            + runs(dict(r, model=r.get("model") or str(r.get("shape_name")).split("/")[0]) for r in chosen)
        ],
    )
    return Selection(table, chosen)
