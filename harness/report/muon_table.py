"""The Muon table: FORGE Muon against torch Muon, step time and peak, per model and tokens per step.

Its rows are the points `+exp=muon_h200` defines, read from its config (every model at every token
count, each step mode its methods run: captured in a CUDA graph, and eager), and any other (model,
tokens, step mode) a record of that sweep holds (the same sweep run with other models or batch
sizes). A row sets side by side, in one step mode:

- the no-optimizer floor's step, torch Muon's (`muon`: the gradient stored, Muon's and AdamW's
  steps after the backward) and FORGE Muon's (`forge_muon`: no gradient, Newton-Schulz per layer
  in the backward), and FORGE's step over torch's;
- both peaks, and the saving: torch's peak less FORGE's, measured, and predicted by
  `harness.report.token_model` (weights and states over the recipe's split, the activations, the
  gradients torch keeps, and each method's Newton-Schulz workspace where it falls);
- the same for FORGE Muon with a faster orthogonalization (`forge_muon_fast`: a `forge_muon` whose
  `newton_schulz` option is not torch's iteration, `forge.newton_schulz`), its own role (`FAST`).

A point without a record reads `not measured` in its cells, a failed point its status; a figure
is never filled in. The predicted saving is computed for every row, from the model's architecture
(its conf/model file, or a record's config) and the methods' options (their conf/method files,
or a record's), and is left out ('—') where this checkout cannot model a method. Without the
sweep's records the table is built only for the committed report, which plans every section.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.points import graphed
from harness.records import Record
from harness.report import expectations as ex
from harness.report import token_model as tm
from harness.report.markup import NONE, Table, fmt_gib, fmt_int, fmt_ms, fmt_ratio
from harness.report.tables import INTERPRETED, Notes, Row, Selection, ok, status_cell, step_median
from harness.report.token_tables import FLOOR, NOT_MEASURED, sweep_records
from harness.run.methods import interpreted
from harness.run.methods.muon import ForgeMuon, TorchMuon

EXPERIMENT = "muon_h200"
CONF = Path(__file__).resolve().parents[2] / "conf"
FAST = "forge_muon_fast"  # forge_muon with another newton_schulz than torch's iteration
ROLES = (FLOOR, TorchMuon.name, ForgeMuon.name, FAST)  # what a row sets side by side, in column order


def role_of(method: str, options: dict[str, Any] | None) -> str:
    """A record's or planned method's column: its method, FORGE Muon's fast variant its own."""
    variant = (options or {}).get("newton_schulz") or "torch"
    return FAST if method == ForgeMuon.name and variant != "torch" else method


@dataclass(frozen=True)
class Planned:
    """One method of the experiment as its conf/method file says: what the prediction needs."""

    label: str
    method: str
    graphed: bool
    options: dict[str, Any]
    dtype: str | None  # the method's weights, where it sets them (else the experiment's)

    @property
    def role(self) -> str:
        return role_of(self.method, self.options)


@cache
def _experiment() -> tuple[dict[str, Any], tuple[Planned, ...]]:
    """The experiment's sweep (its config) and its methods (their conf/method files)."""
    sweep = OmegaConf.to_container(OmegaConf.load(CONF / "exp" / f"{EXPERIMENT}.yaml"))
    planned = []
    for label in sweep["sweep"]["methods"]:
        method = OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{label}.yaml"))
        options = dict(method.get("options") or {}, cuda_graph=bool(method.get("cuda_graph")))
        planned.append(
            Planned(label, method["name"], bool(method.get("cuda_graph")), options, method.get("dtype"))
        )
    return sweep, tuple(planned)


@cache
def _model_numbers(model: str) -> dict[str, Any] | None:
    path = CONF / "model" / f"{model}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else None


def planned_method(method: str) -> Planned | None:
    """The experiment's eager `method` in its role (its graphed twin where it has no eager one), or None."""
    planned = sorted((p for p in _experiment()[1] if p.role == method), key=lambda p: p.graphed)
    return planned[0] if planned else None


def weights_of(planned: Planned) -> str:
    """The weights' dtype a planned method trains in: its own, else the experiment's (bf16)."""
    return planned.dtype or _experiment()[0].get("dtype") or "bf16"


def card(records: Sequence[Record]) -> ex.Ceilings | None:
    """The ceilings of the card the sweep's records ran on, or, without records, of the card the
    experiment is for (its `gpu`: the root config's unless it overrides it)."""
    chosen = sweep_records(records, EXPERIMENT)
    if chosen:
        return ex.ceilings(chosen)
    gpu = None
    root = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    for defaults in (root.get("defaults"), _experiment()[0].get("defaults")):
        for entry in defaults or []:  # "gpu: h200", or the experiment's "override /gpu: ..."
            if isinstance(entry, dict):
                gpu = next((v for k, v in entry.items() if k.split("/")[-1] == "gpu"), gpu)
    return ex.ceilings([{"gpu": gpu}]) if gpu else None


def planned_rows() -> list[tuple[str, int, int, bool]]:
    """(model, batch, seq, graphed) of every row the experiment's config defines."""
    sweep, planned = _experiment()
    modes = sorted({p.graphed for p in planned}, reverse=True)
    s = sweep["sweep"]
    return [
        (model, batch, seq, mode)
        for model in s["models"]
        for seq in s["seq_lens"]
        for batch in s["batch_sizes"]
        for mode in modes
    ]


def _key(record: Record) -> tuple[str, int, int, bool]:
    return (
        str(record.get("model")),
        int(record.get("batch_size") or 0),
        int(record.get("seq_len") or 0),
        graphed(record),
    )


def _architecture(model: str, records: Sequence[Record]) -> tm.Architecture | None:
    for record in records:
        if record.get("model") == model and tm.architecture(record) is not None:
            return tm.architecture(record)
    numbers = _model_numbers(model)
    return tm.Architecture.from_config(numbers) if numbers is not None else None


def _n_params(model: str, arch: tm.Architecture | None, records: Sequence[Record]) -> float | None:
    counted = [float(r["n_params"]) for r in records if r.get("model") == model and r.get("n_params")]
    return counted[0] if counted else (float(arch.params()) if arch is not None else None)


def _role(record: Record) -> str:
    return role_of(str(record.get("method")), record.get("method_options"))


def _pick(records: Sequence[Record], key: tuple, role: str) -> Record | None:
    """The record of `role` at the row: the experiment's own label first, then the latest."""
    labels = {p.label for p in _experiment()[1] if p.role == role and p.graphed == key[3]}
    found = [r for r in records if _role(r) == role and _key(r) == key]
    found.sort(key=lambda r: (r.get("method_label") in labels, str(r.get("time") or "")))
    return found[-1] if found else None


def _predicted_peak(role: str, key: tuple, record: Record | None, records: Sequence[Record]) -> float | None:
    """The role's predicted peak at the row, from its record or else its conf/method file."""
    model, batch, seq, mode = key
    arch = _architecture(model, records)
    n = _n_params(model, arch, records)
    if arch is None or n is None:
        return None
    if record is not None:
        options, weights = record.get("method_options"), record.get("master_weights")
    else:
        planned = [p for p in _experiment()[1] if p.role == role and p.graphed == mode]
        if not planned:
            return None
        options, weights = planned[0].options, weights_of(planned[0])
    method = ForgeMuon.name if role == FAST else role
    return tm.peak_gib(method, options, arch, n, batch * seq, False, weights)


def _cell(record: Record | None, value: str, notes: Notes) -> str:
    """A measured figure of one method's record, or why there is none; a time Triton's CPU
    interpreter ran is marked."""
    if record is None:
        return NOT_MEASURED
    if not ok(record):
        return status_cell(Row(record, None, notes))
    return (
        f"{value} {notes.mark(INTERPRETED)}"
        if interpreted(record) and record.get("step_time_ms_median")
        else value
    )


def _row(key: tuple, found: dict[str, Record | None], records: Sequence[Record], notes: Notes) -> list[str]:
    model, batch, seq, mode = key
    torch_, forge_ = found[TorchMuon.name], found[ForgeMuon.name]
    step = {role: step_median(r) if ok(r) else None for role, r in found.items()}
    peak = {role: _float(r.get("peak_alloc_gib")) if ok(r) else None for role, r in found.items()}
    cells = [model, fmt_int(batch * seq), f"{batch} x {seq}", "graphed" if mode else "eager"]
    cells += [
        _cell(found[role], fmt_ms(step[role]), notes) for role in (FLOOR, TorchMuon.name, ForgeMuon.name)
    ]
    mine, theirs = step[ForgeMuon.name], step[TorchMuon.name]
    if any(r is not None and interpreted(r) for r in (torch_, forge_)):
        mine = None  # the interpreter's time against a compiled one says nothing
    cells.append(_both(torch_, forge_, fmt_ratio(mine / theirs) if mine and theirs else None))
    cells += [_cell(found[role], fmt_gib(peak[role]), notes) for role in (TorchMuon.name, ForgeMuon.name)]
    mine, theirs = peak[ForgeMuon.name], peak[TorchMuon.name]
    cells.append(
        _both(torch_, forge_, fmt_gib(theirs - mine) if mine is not None and theirs is not None else None)
    )
    predicted = [
        _predicted_peak(role, key, found[role], records) for role in (TorchMuon.name, ForgeMuon.name)
    ]
    cells.append(NONE if None in predicted else fmt_gib(predicted[0] - predicted[1]))
    return cells + _fast_cells(key, found, step, peak, records, notes)


def _fast_cells(
    key: tuple, found: dict, step: dict, peak: dict, records: Sequence[Record], notes: Notes
) -> list:
    """The fast variant's step, its step over torch's, its peak, the saving and its prediction."""
    torch_, fast = found[TorchMuon.name], found[FAST]
    mine, theirs = step[FAST], step[TorchMuon.name]
    if any(r is not None and interpreted(r) for r in (torch_, fast)):
        mine = None
    cells = [_cell(fast, fmt_ms(step[FAST]), notes)]
    cells.append(_both(torch_, fast, fmt_ratio(mine / theirs) if mine and theirs else None))
    cells.append(_cell(fast, fmt_gib(peak[FAST]), notes))
    saved = peak[TorchMuon.name] - peak[FAST] if None not in (peak[FAST], peak[TorchMuon.name]) else None
    cells.append(_both(torch_, fast, fmt_gib(saved) if saved is not None else None))
    predicted = [_predicted_peak(role, key, found[role], records) for role in (TorchMuon.name, FAST)]
    cells.append(NONE if None in predicted else fmt_gib(predicted[0] - predicted[1]))
    return cells


def _both(torch_: Record | None, forge_: Record | None, value: str | None) -> str:
    """A figure of the two methods together: `value`, else `not measured` where a point has no
    record, else '—' (a point failed: its own cells say how)."""
    if value is not None:
        return value
    return NOT_MEASURED if torch_ is None or forge_ is None else NONE


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def muon_table(records: Sequence[Record], planned: bool = True) -> Selection | None:
    """The Muon table. `planned` (the committed report): every row the experiment defines, measured
    or not, and every row the sweep's records add; else (a report of named results) only the rows
    its records fill, and None without them."""
    chosen = [r for r in sweep_records(records, EXPERIMENT) if _role(r) in ROLES]
    if not chosen and not planned:
        return None
    keys = list(dict.fromkeys([*(planned_rows() if planned else []), *sorted(_key(r) for r in chosen)]))

    def order(key: tuple) -> tuple:
        arch = _architecture(key[0], chosen)
        size = _n_params(key[0], arch, chosen) or 0.0
        return (size, key[0], key[1] * key[2], key[1], not key[3])

    notes = Notes()
    rows = []
    for key in sorted(keys, key=order):
        found = {role: _pick(chosen, key, role) for role in ROLES}
        rows.append(_row(key, found, chosen, notes))
    floor, torch_, forge_ = "no optimizer", TorchMuon.display_title(), ForgeMuon.display_title()
    header = ["Model", "Tokens", "Batch x seq", "Step", f"Step ms, {floor}", f"Step ms, {torch_}"]
    header += [f"Step ms, {forge_}", f"{forge_} / {torch_} step", f"Peak alloc GiB, {torch_}"]
    header += [f"Peak alloc GiB, {forge_}", "Saving GiB", "Predicted saving GiB"]
    fast = f"{forge_}, fast Newton-Schulz"
    header += [f"Step ms, {fast}", f"{fast} / {torch_} step", f"Peak alloc GiB, {fast}"]
    header += [f"Saving GiB, {fast}", f"Predicted saving GiB, {fast}"]
    extra = [
        f"Step: each method's whole step captured in a CUDA graph and replayed, or eager, beside the "
        f"no-optimizer floor of the same mode. Saving: {torch_}'s peak less {forge_}'s at the same point. "
        "Predicted (harness.report.token_model): weights and states over the recipe's split (Muon's momentum "
        "on the hidden matrices, AdamW's two moments on the rest), the larger of the activations and the "
        f"gradients {torch_} keeps until its step, and each method's Newton-Schulz workspace of the largest "
        "hidden layer where it falls (torch's beside every gradient, FORGE's beside the decoder layers' "
        "activations in the backward).",
        f"{fast}: {forge_} with a faster orthogonalization (its newton_schulz option, forge.newton_schulz; "
        "conf/method/forge_muon_fast*.yaml), its saving and prediction against the same torch step.",
        f"{NOT_MEASURED}: no record of that point yet (python -m harness sweep +exp={EXPERIMENT}).",
    ]
    table = Table(
        name="muon",
        title=f"Muon without a gradient: {forge_} against {torch_}, step and peak as tokens per step grow",
        header=header,
        rows=rows,
        align="lrll" + "r" * (len(header) - 4),
        notes=extra + notes.lines(),
    )
    return Selection(table, chosen)


def table_models(records: Sequence[Record], planned: bool = True) -> list[tuple[str, tm.Architecture, float]]:
    """(model, architecture, parameters) of every model the table has rows for (`planned`: as
    `muon_table`), smallest first: what its expectation is computed for."""
    chosen = sweep_records(records, EXPERIMENT)
    planned_models = [key[0] for key in planned_rows()] if planned else []
    names = dict.fromkeys(planned_models + [str(r.get("model")) for r in chosen])
    found = []
    for model in names:
        arch = _architecture(model, chosen)
        n = _n_params(model, arch, chosen)
        if arch is not None and n is not None:
            found.append((model, arch, n))
    return sorted(found, key=lambda item: (item[2], item[0]))
