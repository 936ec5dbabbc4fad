"""The report's tables, built from results records: T1-T6, convergence, and every other point.

Each builder takes plain records (see `harness.records`) and returns a `Selection`: the `Table` and
the records behind it (the report names their hardware, versions, commit and config). A builder
returns None when no record fits it, so a table without data is skipped cleanly.

Rules every table follows:
- one record per configuration: the latest (`harness.points.latest_by_key`); in the step-time
  tables the latest measured beside its fused AdamW, where one is;
- rows sorted by configuration, methods in their declared order (`harness.report.names.method_rank`);
- a point that did not run is shown by its status in every measured cell (`OOM`, `error [n]`,
  `unavailable [n]`, `diverged`), with the error or reason as footnote n: never as zero;
- ratios compare a method with fused AdamW measured in the same sweep at the same configuration,
  its step run the same way: a graphed row (`method.cuda_graph`) with the graphed fused AdamW, an
  autocast row with the autocast one (`harness.points.step_mode`): ratios measured in one run,
  never bare times from different runs, which move 5-15% between runs and machines;
- the paper's figure sits in its own column where the paper gives one (`harness.report.paper`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.points import (
    CONFIG_FIELDS,
    REFERENCE_METHOD,
    baseline_index,
    baseline_of,
    config_key,
    graphed,
    latest_by_key,
    loss_mode,
    missing,
    options_key,
    reference_index,
    reference_key,
    step_mode,
)
from harness.records import Record, activations_gib, is_convergence, on_cpu
from harness.report import paper
from harness.report.markup import (
    NONE,
    Table,
    fmt_float,
    fmt_gib,
    fmt_int,
    fmt_ms,
    fmt_pct,
    fmt_ratio,
)
from harness.report.names import display_name, method_rank, sort_key
from harness.run.methods import interpreted
from harness.stats import step_stats

STATUS_LABELS = {"oom": "OOM", "error": "error", "diverged": "diverged", "unavailable": "unavailable"}


@dataclass
class Selection:
    """A table and the records it was built from."""

    table: Table
    records: list[Record]


class Notes:
    """Numbered footnotes: the same text gets the same number."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{i}] {text}" for i, text in enumerate(self.texts, start=1)]


# ---------------------------------------------------------------------------------------------
# Cells


@dataclass
class Row:
    """What a cell function sees: the record, its fused-AdamW reference, the footnotes."""

    record: Record
    ref: Record | None
    notes: Notes
    paper: str | None = None


@dataclass(frozen=True)
class Col:
    header: str
    cell: Callable[[Row], str]
    align: str = "r"
    measured: bool = True  # a failed point shows its status here


def status_cell(row: Row) -> str:
    """'OOM', or 'error [n]' with the message as footnote n."""
    record = row.record
    status = str(record.get("status") or "error")
    label = STATUS_LABELS.get(status, status)
    reason = record.get("error")
    if status in ("error", "unavailable", "diverged") and reason:
        first_line = str(reason).strip().splitlines()[0][:160]
        what = display_name(record)
        return f"{label} {row.notes.mark(f'{what}: {first_line}')}"
    return label


def ok(record: Record | None) -> bool:
    """Whether there is a record and it measured its point (status ok)."""
    return record is not None and record.get("status") == "ok"


def _num(record: Record, name: str) -> float | None:
    value = record.get(name)
    return None if value is None else float(value)


def _ratio(row: Row, name: str) -> str:
    value, ref = _num(row.record, name), row.ref
    if ref is None:
        return NONE
    if not ok(ref):
        return f"ref {STATUS_LABELS.get(str(ref.get('status')), ref.get('status'))}"
    base = _num(ref, name)
    return NONE if value is None or not base else fmt_ratio(value / base)


def _change(row: Row, name: str) -> str:
    """Relative change against the reference, e.g. '-41.2%'."""
    value, ref = _num(row.record, name), row.ref
    if ref is None or not ok(ref):
        return _ratio(row, name)
    base = _num(ref, name)
    return NONE if value is None or not base else _against(row, fmt_pct(value / base - 1))


def step_median(record: Record) -> float | None:
    """The record's own median (as the harness computed it), else the samples'."""
    if record.get("step_time_ms_median") is not None:
        return float(record["step_time_ms_median"])
    stats = step_stats(record)
    return None if stats is None else stats.median


def _spread(record: Record) -> str:
    """'min-p90' of the timed steps, from the record's summary fields where present."""
    stats = step_stats(record)
    low = _num(record, "step_time_ms_min") or (stats.minimum if stats else None)
    high = _num(record, "step_time_ms_p90") or (stats.p90 if stats else None)
    return NONE if low is None or high is None else f"{low:.1f}-{high:.1f}"


def _time_ratio(row: Row) -> str:
    if row.ref is None:
        return NONE
    if not ok(row.ref):
        return _ratio(row, "step_time_ms_median")
    mine, base = step_median(row.record), step_median(row.ref)
    return NONE if mine is None or not base else _against(row, fmt_ratio(mine / base))


BASELINE = "fused_adamw"  # the baseline the ratio columns name in their headers


def _against(row: Row, cell: str) -> str:
    """A ratio cell, with a footnote naming its baseline where that is not the one the header names:
    a point is compared with the fused AdamW whose step ran the same way (graphed, FP8, clipped), or
    with the torch method it replaces (`harness.points.BASELINES`: FORGE Muon with torch Muon). That
    baseline's own row (1.00x) keeps it too: its ratio is not against the header's baseline."""
    name = display_name(row.ref) if row.ref is not None else BASELINE
    if name == BASELINE:
        return cell
    if row.ref is not None and row.ref.get("method") != REFERENCE_METHOD:
        return f"{cell} {row.notes.mark(f'Against {name}, the torch method it replaces.')}"
    return f"{cell} {row.notes.mark(f'Against {name}, the fused AdamW whose step ran the same way.')}"


def _int_cell(name: str) -> Callable[[Row], str]:
    return lambda row: fmt_int(_num(row.record, name))


COL_MODEL = Col("Model", lambda r: str(r.record.get("model")), "l", measured=False)
COL_GPU = Col("GPU", lambda r: str(r.record.get("gpu_name") or r.record.get("gpu") or NONE), "l", False)
COL_PARAMS = Col("Params (B)", lambda r: fmt_float(billions(r.record), 2), measured=False)
COL_GPUS = Col("GPUs", lambda r: fmt_int(gpus(r.record)), measured=False)
COL_BATCH = Col("Batch", _int_cell("batch_size"), measured=False)
COL_SEQ = Col("Seq", _int_cell("seq_len"), measured=False)
COL_AC = Col(
    "Act. ckpt", lambda r: "on" if r.record.get("activation_checkpointing") else "off", "l", measured=False
)
COL_CAP = Col("Cap GiB", lambda r: fmt_gib(_num(r.record, "memory_cap_gib")), measured=False)
MASKED_ATTENTION = (
    "Captured or compiled with transformers' full causal attention mask, built there because it cannot "
    "read the position ids (the record has no `attention_mask`; the harness has given whole-sequence "
    "batches no mask since): its time and peak include the masked attention, 4-5% of an 8,192-token "
    "Llama-3.1-8B step (docs/how-forge-works.md, Attention under capture)."
)


def masked_attention(record: Record) -> bool:
    """Whether a measured step ran captured or compiled before the harness gave SDPA no mask."""
    _, captured, compiled = step_mode(record)[:3]
    return record.get("status") == "ok" and (captured or compiled) and missing(record.get("attention_mask"))


INTERPRETED = (
    "Triton's CPU interpreter ran this method's kernels (TRITON_INTERPRET=1): its step time, and its "
    "ratio to fused AdamW, say nothing about speed, only that the method trains (the loss fell, the "
    "weights moved). Measure speed and memory on a GPU."
)


def method_cell(row: Row) -> str:
    """The method's name, marked where its step ran attention with the full mask, or its kernels in
    Triton's CPU interpreter."""
    name = display_name(row.record)
    if masked_attention(row.record):
        return f"{name} {row.notes.mark(MASKED_ATTENTION)}"
    if interpreted(row.record) and ok(row.record):
        return f"{name} {row.notes.mark(INTERPRETED)}"
    return name


COL_METHOD = Col("Method", method_cell, "l", measured=False)
COL_STATUS = Col("Status", lambda r: "ok" if ok(r.record) else status_cell(r), "l", measured=False)
COL_ALLOC = Col("Peak alloc GiB", lambda r: fmt_gib(_num(r.record, "peak_alloc_gib")))
COL_RESERVED = Col("Peak reserved GiB", lambda r: fmt_gib(_num(r.record, "peak_reserved_gib")))
COL_NVML = Col("NVML peak GiB", lambda r: fmt_gib(_num(r.record, "peak_nvml_gib")))
COL_ACTS = Col("Activations GiB", lambda r: fmt_gib(activations_gib(r.record)))
COL_STEP = Col("Step ms (median)", lambda r: fmt_ms(step_median(r.record)))
COL_SPREAD = Col("Step ms (min-p90)", lambda r: _spread(r.record))
COL_TOKENS = Col("Tokens/s", lambda r: fmt_int(_num(r.record, "tokens_per_s")))
COL_SWEEP = Col("Sweep", lambda r: str(r.record.get("sweep")), "l", measured=False)
COL_MEM_RATIO = Col("Memory vs fused AdamW", lambda r: _change(r, "peak_alloc_gib"))
COL_TIME_RATIO = Col("Step time vs fused AdamW", _time_ratio)
COL_PAPER = Col("Paper", lambda r: r.paper or NONE, "l", measured=False)


def billions(record: Record) -> float | None:
    """The record's parameters in billions (None where it does not say)."""
    n = _num(record, "n_params")
    return None if n is None else n / 1e9


def render_rows(
    name: str,
    title: str,
    cols: Sequence[Col],
    rows: Iterable[Row],
    notes: Notes,
    extra_notes: Sequence[str] = (),
) -> Table:
    """Apply the column functions to every row; failed points show their status."""
    body = []
    for row in rows:
        failed = not ok(row.record)
        body.append([status_cell(row) if failed and col.measured else col.cell(row) for col in cols])
    return Table(
        name=name,
        title=title,
        header=[col.header for col in cols],
        rows=body,
        align="".join(col.align for col in cols),
        notes=list(extra_notes) + notes.lines(),
    )


# ---------------------------------------------------------------------------------------------
# Selection helpers


def dedupe_sorted(records: Iterable[Record], with_references: bool = False) -> list[Record]:
    """Latest record per configuration, sorted by model, GPU, batch, seq, ..., method. With
    `with_references`, the latest of those measured beside a fused AdamW where there is one (a
    later run without its reference does not displace a side-by-side ratio), and also the fused
    AdamW each of them is compared with where that is an older record of the same configuration
    (another sweep's), next to the latest one."""
    records = list(records)
    if with_references:
        refs = reference_index(records)

        def beside_reference(record: Record) -> bool:
            return record.get("method") == REFERENCE_METHOD or reference_key(record) in refs

        chosen = latest_by_key(records, prefer=beside_reference)
        for record in list(chosen.values()):
            ref = refs.get(reference_key(record))
            if ref is not None and ref is not chosen.get(config_key(ref)):
                chosen[config_key(ref) + (ref.get("sweep"),)] = ref
    else:
        chosen = latest_by_key(records)
    order = ("model", "gpu_name", "batch_size", "seq_len", "activation_checkpointing", "memory_cap_gib")
    sizes: dict[Any, float] = {}
    for record in chosen.values():  # failed points may lack n_params: size a model by any of its points
        sizes[record.get("model")] = max(sizes.get(record.get("model"), 0.0), billions(record) or 0.0)

    def key(item: tuple[tuple, Record]) -> tuple:
        sk = dict(zip(CONFIG_FIELDS, sort_key(item[0])))
        size = sizes.get(item[1].get("model"), 0.0)
        return (size,) + tuple(sk[f] for f in order) + (sk["method"], graphed(item[1]), sk["method_options"])

    return [record for _, record in sorted(chosen.items(), key=key)]


def _rows(records: Sequence[Record], all_records: Sequence[Record], notes: Notes, figures=None) -> list[Row]:
    refs = baseline_index(all_records)
    rows = []
    for record in records:
        figure = figures(record) if figures else None
        rows.append(Row(record, baseline_of(record, refs), notes, figure))
    return rows


def _plain_point(record: Record) -> bool:
    """One GPU, neither capped nor checkpointed nor a convergence run, transformers' own loss (a
    chunked-loss point is compared in the paper comparison, beside its twin; a chunked-head one in
    the token tables)."""
    return (
        record.get("memory_cap_gib") is None
        and not record.get("activation_checkpointing")
        and loss_mode(record) is None
        and not is_convergence(record)
        and gpus(record) <= 1
    )


def gpus(record: Record) -> int:
    """GPUs one point ran on: its tensor-parallel world size (1 for a CPU or one-GPU point)."""
    return max(1, _int(record.get("gpu_count")) or 1)


# ---------------------------------------------------------------------------------------------
# T1-T5


def t1_llama(records: Sequence[Record]) -> Selection | None:
    """T1: Llama-3.1-8B, every method at every (batch, seq) measured, uncapped."""
    llama = (r for r in records if r.get("model") == "llama3.1-8b" and _plain_point(r))
    chosen = dedupe_sorted(llama, with_references=True)
    if not chosen:
        return None
    notes = Notes()
    cols = [COL_BATCH, COL_SEQ, COL_METHOD, COL_ALLOC, COL_RESERVED, COL_NVML, COL_STEP, COL_SPREAD]
    cols += [COL_TOKENS, COL_MEM_RATIO, COL_TIME_RATIO, COL_PAPER]
    if len({r.get("gpu_name") for r in chosen}) > 1:
        cols.insert(0, COL_GPU)
    footer = [paper.T1_NOTE] + _add_sweep_column(chosen, cols)
    title = "T1: Llama-3.1-8B on one GPU: peak memory and step time per method"
    rows = _rows(chosen, records, notes, _t1_figure)
    return Selection(render_rows("t1_llama8b", title, cols, rows, notes, footer), chosen)


def _t1_figure(record: Record) -> str | None:
    """The paper's T1 figure for the row's method and shape; none for a graphed step (the paper's
    ran eager)."""
    if graphed(record):
        return None
    key = (record.get("model"), _int(record.get("batch_size")), _int(record.get("seq_len")))
    return paper.lookup(paper.T1, key + (record.get("method"),))


def _add_sweep_column(chosen: Sequence[Record], cols: list[Col]) -> list[str]:
    """Rows from several sweeps: insert a column naming each row's sweep before the ratios (which
    compare with the fused AdamW of the same sweep) and return its footnote; else nothing."""
    if len({r.get("sweep") for r in chosen}) < 2:
        return []
    cols.insert(cols.index(COL_MEM_RATIO), COL_SWEEP)
    return [SWEEP_NOTE]


def t2_scaling(records: Sequence[Record]) -> Selection | None:
    """T2: the Qwen3 family, uncapped: peak memory and step time per model size."""
    qwen = (r for r in records if str(r.get("model", "")).startswith("qwen3") and _plain_point(r))
    chosen = dedupe_sorted(qwen, with_references=True)
    if not chosen:
        return None
    notes = Notes()
    figure = lambda r: paper.lookup(paper.T2, (r.get("model"), r.get("method")))
    cols = [COL_MODEL, COL_PARAMS, COL_BATCH, COL_SEQ, COL_METHOD, COL_ALLOC, COL_STEP, COL_TOKENS]
    cols += [COL_MEM_RATIO, COL_TIME_RATIO, COL_PAPER]
    footer = [paper.T2_NOTE] + _add_sweep_column(chosen, cols)
    title = "T2: scaling over Qwen3 model sizes: peak memory and step time"
    rows = _rows(chosen, records, notes, figure)
    return Selection(render_rows("t2_qwen3_scaling", title, cols, rows, notes, footer), chosen)


def t5_checkpointing(records: Sequence[Record]) -> Selection | None:
    """T5: configurations measured with activation checkpointing, beside the same without it."""
    checkpointed = [
        r for r in records if r.get("activation_checkpointing") and not is_convergence(r) and gpus(r) <= 1
    ]
    if not checkpointed:
        return None
    configs = {_ac_group(r) for r in checkpointed}
    comparable = [
        r
        for r in records
        if _ac_group(r) in configs
        and r.get("memory_cap_gib") is None
        and not is_convergence(r)
        and gpus(r) <= 1
    ]
    chosen = dedupe_sorted(comparable, with_references=True)
    notes = Notes()
    cols = [COL_MODEL, COL_BATCH, COL_SEQ, COL_AC, COL_METHOD, COL_ALLOC, COL_ACTS, COL_STEP, COL_TOKENS]
    cols += [COL_MEM_RATIO, COL_TIME_RATIO]
    title = "T5: activation checkpointing composed with FORGE"
    extra = [
        paper.T5_NOTE,
        "Ratios compare with fused AdamW at the same checkpointing setting. Activations: allocated when "
        "the forward returns, less weights and optimizer states (where a record lacks that measurement, "
        "the remainder of the peak).",
    ] + _add_sweep_column(chosen, cols)
    return Selection(
        render_rows("t5_activation_checkpointing", title, cols, _rows(chosen, records, notes), notes, extra),
        chosen,
    )


def _ac_group(record: Record) -> tuple:
    return (
        record.get("sweep"),
        record.get("model"),
        record.get("gpu_name"),
        _int(record.get("batch_size")),
        _int(record.get("seq_len")),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def other_points(
    records: Sequence[Record], used: Iterable[Record], title: str = "Other measured points"
) -> Selection | None:
    """Every step record no other table shows (smoke runs, other models), so none is dropped. Points
    all measured on the CPU get no memory columns: a CPU has no allocator peak to show."""
    taken = {id(r) for r in used}
    used_keys = {config_key(r) for r in used}
    rest = [
        r for r in records if id(r) not in taken and config_key(r) not in used_keys and not is_convergence(r)
    ]
    chosen = dedupe_sorted(rest)
    if not chosen:
        return None
    notes = Notes()
    cols = [COL_MODEL, COL_GPU, COL_BATCH, COL_SEQ, COL_AC, COL_CAP, COL_METHOD, COL_ALLOC, COL_RESERVED]
    cols += [COL_STEP, COL_SPREAD, COL_TOKENS, COL_MEM_RATIO, COL_TIME_RATIO]
    if all(on_cpu(r) for r in chosen):
        cols = [c for c in cols if c not in (COL_CAP, COL_ALLOC, COL_RESERVED, COL_MEM_RATIO)]
    return Selection(render_rows("points", title, cols, _rows(chosen, records, notes), notes), chosen)


# ---------------------------------------------------------------------------------------------
# T3: capacity under a memory cap


def t3_capacity(records: Sequence[Record]) -> Selection | None:
    """T3: under a memory cap on one GPU, the largest micro-batch each method fits, and its
    throughput."""
    capped = [r for r in records if gpus(r) <= 1]
    title = "T3: capacity under a memory cap: largest micro-batch per method and its throughput"
    return _capacity_table(capped, "t3_capacity", title, [paper.T3_NOTE])


def t6_tensor_parallel(records: Sequence[Record]) -> Selection | None:
    """T6: tensor-parallel points (several GPUs, one process each), uncapped: per-GPU peak memory
    (the largest rank's) and step time, FORGE against fused AdamW under the same plan."""
    chosen = dedupe_sorted(
        r
        for r in records
        if gpus(r) > 1
        and r.get("memory_cap_gib") is None
        and not r.get("activation_checkpointing")
        and not is_convergence(r)
    )
    if not chosen:
        return None
    notes = Notes()
    cols = [COL_MODEL, COL_GPUS, COL_BATCH, COL_SEQ, COL_METHOD, COL_ALLOC, COL_RESERVED, COL_STEP]
    cols += [COL_SPREAD, COL_TOKENS, COL_MEM_RATIO, COL_TIME_RATIO]
    title = "T6: tensor parallelism: peak memory per GPU and step time per method"
    rows = _rows(chosen, records, notes)
    return Selection(render_rows("t6_tensor_parallel", title, cols, rows, notes, [paper.T6_NOTE]), chosen)


def t6_capacity(records: Sequence[Record]) -> Selection | None:
    """T6 (capacity): T3's search with tensor parallelism, every GPU under the cap."""
    title = "T6: capacity with tensor parallelism, every GPU under the cap"
    return _capacity_table(
        [r for r in records if gpus(r) > 1], "t6_capacity", title, [paper.T6_CAPACITY_NOTE], with_gpus=True
    )


def _capacity_table(
    records: Sequence[Record], name: str, title: str, extra: list[str], with_gpus: bool = False
) -> Selection | None:
    capped = dedupe_sorted(r for r in records if is_capacity_search(r) and not is_convergence(r))
    if not capped:
        return None
    notes = Notes()
    groups = capacity_groups(capped)
    best = {key: _capacity(points) for key, points in groups.items()}
    with_ac = any(key[4] for key in groups)  # a column only when some search ran with checkpointing
    with_allocator = any(key[5] for key in groups)  # and when some ran under another allocator setting
    rows = []
    for key in sorted(best, key=_capacity_order):
        row = _capacity_row(key, best, notes)
        if with_allocator:
            row = row[:3] + [key[5] or "default"] + row[3:]
        if with_ac:
            row = row[:3] + ["on" if key[4] else "off"] + row[3:]
        rows.append(row[:1] + [fmt_int(gpus(groups[key][0]))] + row[1:] if with_gpus else row)
    header = ["Model", "Seq", "Cap GiB", "Method", "Largest batch", "Peak alloc GiB", "Step ms (median)"]
    header += ["Tokens/s", "Throughput vs fused AdamW", "First failure", "Paper"]
    align = "lrrl" + "r" * 6 + "l"
    if with_allocator:
        header = header[:3] + ["Allocator"] + header[3:]
        align = align[:3] + "l" + align[3:]
    if with_ac:
        header = header[:3] + ["Act. ckpt"] + header[3:]
        align = align[:3] + "l" + align[3:]
    if with_gpus:
        header = header[:1] + ["GPUs"] + header[1:]
        align = "lr" + align[1:]
    if with_ac:
        extra = extra + ["With checkpointing on, throughput compares with fused AdamW checkpointed too."]
    table = Table(name=name, title=title, header=header, rows=rows, align=align, notes=extra + notes.lines())
    return Selection(table, capped)


def is_capacity_search(record: Record) -> bool:
    """A point of a capacity sweep (`sweep.mode: capacity`, the largest batch under a memory cap),
    not a grid point that merely ran under a capped GPU config (`gpu=h100_80gb` on a real H100)."""
    sweep = (record.get("config") or {}).get("sweep") or {}
    return record.get("memory_cap_gib") is not None and sweep.get("mode", "capacity") == "capacity"


def capacity_groups(records: Iterable[Record]) -> dict[tuple, list[Record]]:
    """Capped records by (model, GPU name and count, seq, cap, checkpointing, CUDA allocator
    setting, method, options): a search under another allocator setting is another search."""
    groups: dict[tuple, list[Record]] = {}
    for record in records:
        where = f"{record.get('gpu_name')}" + (f" x {gpus(record)}" if gpus(record) > 1 else "")
        group = (record.get("model"), where, _int(record.get("seq_len")))
        group += (record.get("memory_cap_gib"), bool(record.get("activation_checkpointing")))
        group += (record.get("cuda_alloc_conf") or None,)
        group += (record.get("method"), options_key(record.get("method_options")))
        groups.setdefault(group, []).append(record)
    return groups


def largest_batches(records: Sequence[Record]) -> dict[tuple, list[tuple[str, int | None]]]:
    """Per capped search (model, GPU, seq, cap, ckpt, allocator): (method label, largest ok batch)."""
    out: dict[tuple, list[tuple[str, int | None]]] = {}
    groups = capacity_groups(records)
    for key in sorted(groups, key=_capacity_order):
        largest, _failure = _capacity(groups[key])
        batch = _int(largest.get("batch_size")) if largest else None
        out.setdefault(key[:6], []).append((display_name(groups[key][0]), batch))
    return out


def _capacity(points: list[Record]) -> tuple[Record | None, Record | None]:
    """(largest ok point, smallest failed point above it) of one method's batch sizes."""
    by_batch = sorted(points, key=lambda r: _int(r.get("batch_size")) or 0)
    fits = [r for r in by_batch if ok(r)]
    largest = fits[-1] if fits else None
    floor = _int(largest.get("batch_size")) if largest else 0
    failures = [r for r in by_batch if not ok(r) and (_int(r.get("batch_size")) or 0) > floor]
    return largest, failures[0] if failures else None


def _capacity_order(key: tuple) -> tuple:
    model, gpu, seq, cap, ac, allocator, method, options = key
    return (str(model), str(gpu), seq or 0, cap or 0, ac, str(allocator or ""), method_rank(method), options)


SWEEP_NOTE = (
    "Ratios compare each row with fused AdamW of the same sweep, measured side by side with it: "
    "step times of the same code move more between runs (other machines, other hours) than within one."
)

UNBOUNDED_CAPACITY = (
    "No larger batch was tried and failed: the search stopped (its device call's time ran out, or it "
    "reached the sweep's max_batch_size), so this is a lower bound."
)


def _capacity_row(key: tuple, best: dict, notes: Notes) -> list[str]:
    model, _gpu, seq, cap, _ac, _allocator, method, options = key
    largest, failure = best[key]
    ref_largest = _reference_capacity(key, best)
    label = display_name(largest or failure or {"method": method, "method_options": options})
    figure = paper.T3.get(method) or NONE
    failed = NONE
    if failure is not None:
        failed = f"{status_cell(Row(failure, None, notes))} at {_int(failure.get('batch_size'))}"
    if largest is None:
        cells = ["none fits", NONE, NONE, NONE, NONE]
    else:
        tokens = _num(largest, "tokens_per_s")
        base = _num(ref_largest, "tokens_per_s") if ref_largest else None
        batch = fmt_int(_num(largest, "batch_size"))
        if failure is None:  # nothing above it failed: a lower bound, not the method's capacity
            batch += " " + notes.mark(UNBOUNDED_CAPACITY)
        cells = [
            batch,
            fmt_gib(_num(largest, "peak_alloc_gib")),
            fmt_ms(step_median(largest)),
            fmt_int(tokens),
            fmt_ratio(tokens / base) if tokens is not None and base else NONE,
        ]
    return [str(model), fmt_int(seq), fmt_gib(cap), label] + cells + [failed, figure]


def _reference_capacity(key: tuple, best: dict) -> Record | None:
    """The fused AdamW search of the same group whose step ran the same way (autocast, graph)."""
    mode = step_mode({"method_options": key[7]})
    candidates = sorted(
        k
        for k in best
        if k[:6] == key[:6] and k[6] == REFERENCE_METHOD and step_mode({"method_options": k[7]}) == mode
    )
    return best[candidates[0]][0] if candidates else None
