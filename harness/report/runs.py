"""One run of a sweep: the records a figure in the README or docs/ may be computed from.

Step times of the same code move 5-15% between runs (other machines, other hours), while ratios
measured side by side within one run move by a few hundredths. So every table and figure the
README and docs/ quote is taken from one run: the records of one results file, one sweep and one
commit (`env.git_commit`), measured on a clean tree (`env.git_dirty` false). `one_run` picks, of a
file, the latest run that measured every point a table needs, and says which points are missing
where no run has them all, instead of filling a cell from another run.

A point is named by its `method_label` (`forge_int8_graph`) at a model, batch, sequence length,
checkpointing setting and loss (`harness.points.loss_mode`); where a run measured a point twice
(a resumed sweep), the later record counts.

    >>> run = one_run(Path("."), sources.PAPER, needs(["fused_adamw_fp32grad", "forge_int8"]))
    >>> run.peak("forge_int8") / run.peak("fused_adamw_fp32grad")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.points import loss_mode, missing
from harness.records import Record, load_records
from harness.report.tables import step_median

LLAMA = "llama3.1-8b"


@dataclass(frozen=True)
class Where:
    """The configuration a point is looked up at (every field must match)."""

    model: str = LLAMA
    batch_size: int = 1
    seq_len: int = 1024
    checkpointing: bool = False
    loss: str | None = None  # harness.points.loss_mode: None, "chunked_loss", "chunked_head"

    def matches(self, record: Record) -> bool:
        return (
            record.get("model") == self.model
            and record.get("batch_size") == self.batch_size
            and record.get("seq_len") == self.seq_len
            and bool(record.get("activation_checkpointing")) == self.checkpointing
            and loss_mode(record) == self.loss
        )


@dataclass
class Run:
    """The records of one sweep at one commit, read from one results file."""

    path: str  # relative to the repository root, as the docs cite it
    sweep: str
    commit: str
    records: list[Record] = field(default_factory=list)

    def find(self, label: str, where: Where = Where()) -> Record | None:
        """The latest record of `label` at `where`, or None."""
        found = [r for r in self.records if r.get("method_label") == label and where.matches(r)]
        return max(found, key=lambda r: str(r.get("time") or ""), default=None)

    def point(self, label: str, where: Where = Where()) -> Record:
        """The record of `label` at `where`; a KeyError naming the file and run when there is none."""
        record = self.find(label, where)
        if record is None:
            raise KeyError(f"{self.path}: no {label} at {where} in the {self.sweep} run at {self.commit[:7]}")
        return record

    def step(self, label: str, where: Where = Where()) -> float:
        """A point's median step time in ms (a ValueError when it did not run)."""
        return _measured(self.point(label, where), step_median, self.path)

    def peak(self, label: str, where: Where = Where()) -> float:
        """A point's peak allocated GiB (a ValueError when it did not run)."""
        return _measured(self.point(label, where), lambda r: r.get("peak_alloc_gib"), self.path)

    @property
    def date(self) -> str:
        """The day the run measured its last point (YYYY-MM-DD)."""
        return max(str(r.get("time") or "") for r in self.records)[:10]

    @property
    def short(self) -> str:
        return self.commit[:7]

    def env(self, name: str) -> str:
        """An `env` field every record of the run shares (versions, driver), or '?' where they differ."""
        values = {str((r.get("env") or {}).get(name)) for r in self.records}
        return values.pop() if len(values) == 1 else "?"

    def hardware(self) -> str:
        """'NVIDIA H200, driver 580.159.04, CUDA 13.0, torch 2.11.0, triton 3.6.0, transformers 5.17.0'."""
        gpus = {str(r.get("gpu_name")) for r in self.records}
        gpu = gpus.pop() if len(gpus) == 1 else "?"
        versions = [f"{name} {self.env(name)}" for name in ("torch", "triton", "transformers")]
        return ", ".join([gpu, f"driver {self.env('driver')}", f"CUDA {self.env('cuda')}", *versions])

    def source(self) -> str:
        """'`results/x.jsonl` (the x sweep at abc1234, 2026-12-03)': how a doc names the run."""
        return f"`{self.path}` (the {self.sweep} sweep at {self.short}, {self.date})"


def _measured(record: Record, value, path: str) -> float:
    if record.get("status") != "ok":
        raise ValueError(f"{path}: {record.get('point')} did not run ({record.get('status')})")
    number = value(record)
    if number is None or missing(number):
        raise ValueError(f"{path}: {record.get('point')} has no such figure")
    return float(number)


def runs(root: Path, path: str) -> list[Run]:
    """Every run in one results file, oldest first: its records grouped by (sweep, commit)."""
    grouped: dict[tuple[str, str], Run] = {}
    for record in load_records([root / path]):
        env = record.get("env") or {}
        key = (str(record.get("sweep")), str(env.get("git_commit") or ""))
        grouped.setdefault(key, Run(path, *key)).records.append(record)
    return sorted(grouped.values(), key=lambda run: run.date)


def dirty_or_unrecorded(run: Run) -> list[str]:
    """The points of a run measured on a dirty tree or without a commit: what a doc cannot cite."""
    return [
        str(r.get("point")) for r in run.records if not run.commit or (r.get("env") or {}).get("git_dirty")
    ]


Need = tuple[str, Where]  # a point: its method label at a configuration


def needs(labels: Sequence[str], *wheres: Where) -> list[Need]:
    """Every label at every configuration (at the default one when none is given)."""
    return [(label, where) for where in (wheres or (Where(),)) for label in labels]


def one_run(root: Path, path: str, points: Sequence[Need], sweep: str | None = None) -> Run:
    """The latest clean run of `path` (of `sweep`, if given) that measured every one of `points` (a
    point that ran out of memory counts as measured); a LookupError that names what each run lacks
    when none did."""
    candidates = [run for run in runs(root, path) if sweep is None or run.sweep == sweep]
    lacking = []
    for run in reversed(candidates):
        absent = [f"{label} at {where}" for label, where in points if run.find(label, where) is None]
        if not absent and not dirty_or_unrecorded(run):
            return run
        lacking.append(f"{run.sweep} at {run.short or 'no commit'}: " + (", ".join(absent[:3]) or "dirty"))
    raise LookupError(
        f"{path}: no clean run measured all {len(points)} points a table needs"
        f" ({'; '.join(lacking) or 'no runs'})."
        " Measure them in one sweep, then run `python -m harness report` again."
    )
