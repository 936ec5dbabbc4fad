"""The paper's code and ours: the paper's FORGE (`fused_grad_optimizer`) measured beside this project's.

Its records are those of the sweeps named `reference_*`: `+exp=reference_h200` and
`+exp=reference_qwen3_h200` write `reference_h200`; a run on another card may name its own
(`sweep.name=reference_h100`), and its rows say which GPU. Three tables, each from one run's
records, every ratio between records of that run:

- `reference_readme`: the table of the paper's code's README (its figures quoted, `paper.py`)
  beside what the harness measured of the same methods at the same point (Llama-3.1-8B, batch 1,
  512 tokens, eager), and this project's FORGE under them; each step and peak also over the fused
  AdamW of its side (the README's over its own fused AdamW, ours over the one measured here);
- `reference_steps`: for every GPU, model, token count and step mode (eager, or the whole step
  replayed from a CUDA graph), each method's median step, and each of our FORGE configs over the
  paper's of the same state dtype (`pairs`);
- `reference_peaks`: the same for the peak allocated memory, with ours less the paper's.

The columns are the method configs of `+exp=reference_h200` (`columns`), named by their labels,
those the README quotes first; the pairs and the README rows follow from their conf/method files.

A failed point shows its status (`OOM`, `unavailable` with its reason as a footnote); a method a
row has no record of (vanilla AdamW and bitsandbytes cannot capture a step) shows '—'. Without
records there is no table, and the report has no section for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import forge
from harness.points import graphed
from harness.records import Record
from harness.report import paper
from harness.report import token_model as tm
from harness.report.markup import NONE, Table, fmt_gib, fmt_int, fmt_ms, fmt_ratio
from harness.report.tables import Notes, Row, Selection, ok, status_cell, step_median
from harness.report.token_tables import sweep_records
from harness.run.measure import GIB
from harness.run.methods.footprint import element_bytes
from harness.run.methods.forge import Forge
from harness.run.methods.forge_reference import INT8_BLOCK, ForgeReference
from harness.run.methods.fused_adamw import FusedAdamW

SWEEP_PREFIX = "reference_"
EXPERIMENT = "reference_h200"  # its methods are the tables' columns
CONF = Path(__file__).resolve().parents[2] / "conf"
BASE = FusedAdamW.name  # every ratio over fused AdamW is over this method's record of the same run


@cache
def _method_file(label: str) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{label}.yaml"))


@cache
def columns() -> tuple[str, ...]:
    """The method configs a row sets side by side: the experiment's, by their eager labels (a
    graphed row shows each one's `_graph` twin); those the README quotes first, in its order."""
    listed = OmegaConf.load(CONF / "exp" / f"{EXPERIMENT}.yaml").sweep.methods
    eager = list(dict.fromkeys(str(label).removesuffix("_graph") for label in listed))
    quoted = [label for label in paper.REFERENCE_README if label in eager]
    return tuple(quoted + [label for label in eager if label not in quoted])


def _state(label: str) -> str | None:
    """The state dtype of a FORGE config, ours (`state_dtype`) or the paper's (`state_mode`)."""
    options = _method_file(label).get("options") or {}
    return options.get("state_dtype") or options.get("state_mode")


@cache
def pairs() -> tuple[tuple[str, str], ...]:
    """(the paper's FORGE, ours) for every config of the paper's FORGE among the columns, with our
    FORGE config of the same state dtype."""
    names = {label: _method_file(label)["name"] for label in columns()}
    ours = {_state(label): label for label, name in names.items() if name == Forge.name}
    theirs = [label for label, name in names.items() if name == ForgeReference.name]
    return tuple((label, ours[_state(label)]) for label in theirs if _state(label) in ours)


def published(label: str) -> tuple | None:
    """The README's row for a config: its own, or for another config of the paper's FORGE (its
    Hopper path) the row of the same states, which the README's figure stands for too."""
    if label in paper.REFERENCE_README:
        return paper.REFERENCE_README[label]
    if _method_file(label)["name"] != ForgeReference.name:
        return None
    same = [k for k in paper.REFERENCE_README if k in columns() and _state(k) == _state(label)]
    return (
        paper.REFERENCE_README[same[0]]
        if same and _method_file(same[0])["name"] == ForgeReference.name
        else None
    )


Key = tuple[str, str, int, int, bool]  # GPU, model, batch, sequence, graphed


def reference_records(records: Sequence[Record]) -> list[Record]:
    """The latest record of each configuration of every `reference_*` sweep."""
    sweeps = sorted(
        {str(r.get("sweep")) for r in records if str(r.get("sweep") or "").startswith(SWEEP_PREFIX)}
    )
    return [r for sweep in sweeps for r in sweep_records(records, sweep)]


def role(record: Record) -> str | None:
    """The method's column: its label, less `_graph`, where it is one of the table's."""
    label = str(record.get("method_label") or "").removesuffix("_graph")
    return label if label in columns() else None


def _key(record: Record) -> Key:
    gpu = str(record.get("gpu_name") or record.get("gpu"))
    batch, seq = int(record.get("batch_size") or 0), int(record.get("seq_len") or 0)
    return (gpu, str(record.get("model")), batch, seq, graphed(record))


def _grid(records: Sequence[Record]) -> dict[Key, dict[str, Record]]:
    """Every row's records by method, the latest where a point was measured more than once."""
    rows: dict[Key, dict[str, Record]] = {}
    for record in sorted(records, key=lambda r: str(r.get("time") or "")):
        name = role(record)
        if name is not None:
            rows.setdefault(_key(record), {})[name] = record
    return rows


def _order(key: Key, records: dict[str, Record]) -> tuple:
    sizes = [float(r.get("n_params") or 0) for r in records.values()]
    return (key[0], max(sizes, default=0.0), key[1], key[2] * key[3], key[4])


def _step(record: Record | None) -> float | None:
    return step_median(record) if ok(record) else None


def _peak(record: Record | None) -> float | None:
    return (
        float(record["peak_alloc_gib"]) if ok(record) and record.get("peak_alloc_gib") is not None else None
    )


def _cell(record: Record | None, value: str, notes: Notes) -> str:
    if record is None:
        return NONE
    return value if ok(record) else status_cell(Row(record, None, notes))


def _over(a: float | None, b: float | None) -> str:
    return fmt_ratio(a / b) if a is not None and b else NONE


def _less(a: float | None, b: float | None) -> str:
    return f"{a - b:+.2f}" if a is not None and b is not None else NONE


def _point_cells(key: Key) -> list[str]:
    gpu, model, batch, seq, mode = key
    return [gpu, model, fmt_int(batch * seq), "graphed" if mode else "eager"]


def readme_table(records: Sequence[Record]) -> Table | None:
    """The README's figures beside the measured ones at its point, one block per GPU."""
    model, batch, seq = paper.REFERENCE_README_POINT
    notes, rows = Notes(), []
    for key, found in sorted(_grid(records).items(), key=lambda kv: _order(*kv)):
        if key[1:] != (model, batch, seq, False):
            continue
        base_step, base_peak = _step(found.get(BASE)), _peak(found.get(BASE))
        _, pub_peak, pub_step, _ = paper.REFERENCE_README[BASE]
        for label in columns():
            quoted = published(label)
            record = found.get(label)
            step, peak = _step(record), _peak(record)
            rows.append(
                [
                    key[0],
                    label,
                    quoted[0] if quoted else NONE,
                    f"{quoted[1]:.2f}" if quoted else NONE,
                    f"{quoted[2]:.1f} ± {quoted[3]:.1f}" if quoted else NONE,
                    _over(quoted[2], pub_step) if quoted else NONE,
                    _over(quoted[1], pub_peak) if quoted else NONE,
                    _cell(record, fmt_gib(peak), notes),
                    _cell(record, fmt_ms(step), notes),
                    _over(step, base_step),
                    _over(peak, base_peak),
                ]
            )
    if not rows:
        return None
    header = ["GPU", "Method", "README's row", "README peak GB", "README step ms"]
    header += ["README step / fused AdamW", "README peak / fused AdamW"]
    header += ["Peak alloc GiB", "Step ms (median)", "Step / fused AdamW", "Peak / fused AdamW"]
    steps = sorted({(r.get("steps"), r.get("warmup_steps")) for r in records if r.get("steps")}, key=str)
    timed = ", ".join(f"{n} steps ({w} warm-up)" for n, w in steps)
    extra = [
        f"README: {paper.REFERENCE_README_SOURCE}; its peak in GB as printed (the README does not say "
        "whether 10^9 or 2^30 bytes), its step as median ± spread. The rest: this harness, "
        f"{model} at batch {batch} x {seq} tokens, eager, {timed}, each ratio over the fused "
        "AdamW of the same run. torch_adamw: torch.optim.AdamW's default (for-each) on bf16, the "
        "README's vanilla AdamW; forge_reference_*: the paper's FORGE, its package as its README trains, "
        "bf16 states on its default kernel path and on its Hopper TMA path (`_tma`, the path its README "
        "names for its H200 results; the README's FORGE row stands beside both).",
    ]
    return Table(
        name="reference_readme",
        title="The paper's code: its README's table beside the same methods measured here",
        header=header,
        rows=rows,
        align="lll" + "r" * (len(header) - 3),
        notes=extra + notes.lines(),
    )


def _points_table(records: Sequence[Record], what: str) -> Table | None:
    """Every row, each method's step (`what="step"`) or peak (`"peak"`), and ours against the paper's."""
    measure, unit = (_step, "ms") if what == "step" else (_peak, "GiB")
    fmt = fmt_ms if what == "step" else fmt_gib
    notes, rows = Notes(), []
    for key, found in sorted(_grid(records).items(), key=lambda kv: _order(*kv)):
        cells = _point_cells(key)
        cells += [_cell(found.get(label), fmt(measure(found.get(label))), notes) for label in columns()]
        for theirs, ours in pairs():
            a, b = measure(found.get(ours)), measure(found.get(theirs))
            cells.append(_over(a, b) if what == "step" else _less(a, b))
        rows.append(cells)
    if not rows:
        return None
    header = ["GPU", "Model", "Tokens", "Step"] + [f"{label} {unit}" for label in columns()]
    sign = "/" if what == "step" else "-"
    header += [f"{ours} {sign} {theirs}" + ("" if what == "step" else " GiB") for theirs, ours in pairs()]
    extra = [
        "Step: eager, or the whole step captured in a CUDA graph and replayed (each method's `_graph` "
        "config; vanilla AdamW and bitsandbytes cannot capture theirs: '—'). Batch 1; every figure "
        "from one run of +exp=reference_h200 or +exp=reference_qwen3_h200 on that GPU.",
        "The paper's FORGE under a CUDA graph replays the captured step's learning rate and bias "
        "corrections (its kernels take them as Python numbers); it times the same kernels.",
    ]
    if what == "peak":
        extra.append("Peak: torch.cuda.max_memory_allocated over the timed steps (warm-up included).")
    title = "median step time" if what == "step" else "peak allocated memory"
    return Table(
        name=f"reference_{what}s",
        title=f"The paper's FORGE and ours, {title} at every measured point",
        header=header,
        rows=rows,
        align="llrl" + "r" * (len(header) - 4),
        notes=extra + notes.lines(),
    )


def reference_tables(records: Sequence[Record]) -> list[Selection]:
    """The section's tables, each with the records behind it; none without `reference_*` records."""
    chosen = [r for r in reference_records(records) if role(r) is not None]
    tables = [readme_table(chosen), _points_table(chosen, "step"), _points_table(chosen, "peak")]
    tables = [t for t in tables if t is not None]
    return [Selection(t, chosen if i == 0 else []) for i, t in enumerate(tables)]  # each record once


def preamble(records: Sequence[Record]) -> str:
    """What the two FORGEs should differ by, before the tables: the bytes each keeps apart."""
    embeddings = {}
    for record in records:
        arch = tm.architecture(record)
        if arch is not None:
            embeddings[str(record.get("model"))] = arch.vocab * arch.hidden * 2 / GIB
    sizes = "; ".join(
        f"{model}'s embedding: {gib:.2f} GiB in bf16" for model, gib in sorted(embeddings.items())
    )
    theirs = 2 * element_bytes("int8", INT8_BLOCK)
    ours = 2 * forge.state_bytes("int8", INT8_BLOCK)
    return (
        "Both FORGEs fuse AdamW into each linear layer's weight-gradient GEMM, so neither stores a "
        "linear layer's gradient; they differ in the rest. The paper's code steps every other parameter "
        "(embeddings, norms, a tied lm_head) with torch's fused AdamW after the backward, all their "
        f"gradients alive together{f' ({sizes})' if sizes else ''}; ours updates each in the backward as "
        f"its gradient arrives. Its int8 moments keep an fp32 scale per {INT8_BLOCK} elements "
        f"({theirs:.4g} bytes a parameter for the two), ours a bf16 one ({ours:.4g}). Its bf16 weights "
        "are rounded to nearest, ours stochastically. Its int8 kernel, and its bf16 kernel on layers "
        "under 256 tiles, autotune on first use: one untimed step runs before the measured ones "
        "(`Method.prime`), so neither the tuning nor its copies of weights and states count."
    )
