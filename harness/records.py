"""Results files in, plain records out: the one place where report and regress read results.

`harness.results.load(*paths)` reads JSONL results into a pandas DataFrame (tolerating a truncated
last line). The report and the regression check want something simpler to reason about: a list of
dicts, one per record, with pandas' NaN turned back into None and the file order kept. This module
has `harness.results.expand` turn directories into their `*.jsonl` files (recursively, sorted, so
the order is the same on every machine), calls the loader, and splits the records in two kinds:

- step records: one training-step measurement per point (`harness.results.FIELDS`);
- kernel records: one kernel timing per (shape, T, variant), recognised by their `variant` field
  (results/kernels/, written by `python -m harness kernels`).

A step record measured on the CPU says so (`on_cpu`): the report keeps GPU ceilings off it (and
`harness.run.methods.interpreted` tells which of them ran Triton's interpreter).

Among step records, convergence runs (`+exp=convergence`) are told apart by `sweep_mode: convergence`, a
sweep name starting with 'convergence', or a `loss_curve` field: every step record carries its
per-step `losses`, but only convergence runs are meant to be compared curve against curve.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness import results
from harness.points import missing

Record = dict[str, Any]


def load_records(
    paths: Iterable[str | Path], exclude_dirs: Sequence[str] = (), skip_scratch: bool = False
) -> list[Record]:
    """Every record in `paths`, in file order, as dicts with None for missing values."""
    files = results.expand(paths, exclude_dirs, skip_scratch)
    if not files:
        return []
    frame = _load_frame(files)
    return [_clean(row) for row in frame.to_dict("records")]


def split_kinds(records: Iterable[Record]) -> tuple[list[Record], list[Record]]:
    """(step records, kernel records). Offline tuning records (`variant: forge_tune`, from
    `python -m harness kernels --tune`) are neither: `python -m harness.kernels.tuning` reads them.
    The kernel lab's other records (`method: kernel`: `--clip-norms`, `--fp8`) are kernel records."""
    steps, kernels = [], []
    for record in records:
        if record.get("variant") == "forge_tune":
            continue
        kernel = not missing(record.get("variant")) or record.get("method") == "kernel"
        (kernels if kernel else steps).append(record)
    return steps, kernels


LOSS_FIELDS = ("loss_curve", "losses")
HELDOUT_FIELDS = ("heldout_loss_curve", "heldout_losses", "eval_loss_curve", "eval_losses")


def is_convergence(record: Record) -> bool:
    """True for a convergence run (its loss curve is the result, not its step time)."""
    if record.get("loss_curve") is not None or is_branched(record):
        return True
    return record.get("sweep_mode") == "convergence" or str(record.get("sweep") or "").startswith(
        "convergence"
    )


def is_branched(record: Record) -> bool:
    """True for a branched fidelity run (`harness.run.branches`): its method's branches from the
    reference, not a trajectory of its own."""
    return record.get("branches") is not None


def on_cpu(record: Record) -> bool:
    """True for a point measured on the CPU: its `device`, or the GPU config it ran as (`gpu=cpu`),
    says so. Records without either ran on a GPU, which they name."""
    return record.get("device") == "cpu" or record.get("gpu") == "cpu"


def activations_gib(record: Record) -> float | None:
    """What the forward pass leaves alive for backward, in GiB. Measured where the record carries
    `forward_end_alloc_gib` (allocated when the forward returns, less the weights and optimizer
    states); else the modelled remainder of the peak (`activations_gib`: peak less weights, states
    and every gradient), which is wrong for a method whose peak comes before its gradients exist."""
    forward_end = record.get("forward_end_alloc_gib")
    if missing(forward_end):
        modelled = record.get("activations_gib")
        return None if missing(modelled) else float(modelled)
    static = sum(float(record.get(f) or 0.0) for f in ("weights_gib", "optimizer_state_gib"))
    return max(0.0, float(forward_end) - static)


def _clean(row: dict[str, Any]) -> Record:
    return {str(key): (None if missing(value) else value) for key, value in row.items()}


def _load_frame(files: Sequence[Path]):
    return results.load(*files)
