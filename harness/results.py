"""Results records: the JSONL row format, atomic appends and one-call loading.

One sweep point gives one record, one JSON object on one line of `results/<sweep>.jsonl`. `Record`
declares its fields, typed, and `SCHEMA_VERSION`; their names (`FIELDS`) are fixed (docs/harness.md
lists them; the report and the regression checker read them); a record may carry more fields
(`OPTIONAL_FIELDS`), never fewer. Units are in the names: `_ms` is milliseconds, `_gib` is GiB
(2**30 bytes). A figure that could not be measured is `None` (null), never a made-up zero.

Writing is crash-safe: `append` takes an exclusive lock, writes one whole line, flushes and
fsyncs, so a killed sweep leaves at worst one truncated last line. Reading tolerates that line:
`iter_records` skips any line that is not valid JSON (with a warning) instead of failing, and
`append` first ends such a fragment with a newline so the next record starts on a line of its own.
`expand` lists the record files of a tree: sorted, the GPU runs' raw logs (device-logs/) left out,
and with `skip_scratch` the scratch folders too (`is_scratch`: results/smoke/, results/adhoc/).

    >>> import harness.results as results
    >>> df = results.load("results")               # every *.jsonl below, one row per record
    >>> df[df.status == "ok"][["method", "batch_size", "step_time_ms_median"]]
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

# A point's status, from the best to the worst: a point of several processes takes its worst rank's.
STATUSES = ("ok", "unavailable", "diverged", "error", "oom")


@dataclass
class Record:
    """One record: every field of the schema, typed, in the order a results line writes them.

    A field is None until set, and stays None where it could not be measured. The first fields,
    `schema` to `loss_last`, are the design's (other tools read them by these names); the rest are
    this harness's. `extra` holds the fields beyond the schema: those a kind of record adds
    (`OPTIONAL_FIELDS`: a convergence run's curves, a multi-GPU point's per-rank peaks) and, in a
    record read from a file, whatever another version of the harness wrote there. `set` refuses a
    name that is neither, so a record carries no field that is not declared here.
    Making a sweep point's record is `harness.run.record`'s job."""

    schema: int = SCHEMA_VERSION
    sweep: str | None = None
    point: str | None = None  # the point's id (harness.run.grid.point_id): the key a sweep resumes on
    time: str | None = None  # when the point started, UTC, ISO 8601 to the second
    status: str | None = None  # one of STATUSES
    error: str | None = None  # the message, or why the method could not run (None when ok)
    method: str | None = None  # the implementation (`forge`)
    method_options: dict[str, Any] | None = None  # lr and every option, defaults filled in
    model: str | None = None
    n_params: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    activation_checkpointing: bool | None = None
    gpu_name: str | None = None  # as NVML names the card ("NVIDIA H200"); None on a CPU
    gpu_count: int | None = None  # GPUs the point used (0 on a CPU)
    memory_cap_gib: float | None = None
    env: dict[str, Any] | None = None  # versions, driver, GPU, git commit (harness.run.env.collect)
    steps: int | None = None
    warmup_steps: int | None = None
    step_time_ms_median: float | None = None
    step_time_ms_min: float | None = None
    step_time_ms_p90: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None  # model FLOP utilization, a fraction of `peak_tflops`
    peak_alloc_gib: float | None = None
    peak_reserved_gib: float | None = None
    peak_nvml_gib: float | None = None
    weights_gib: float | None = None
    grads_gib: float | None = None  # modelled (Method.gradient_bytes)
    optimizer_state_gib: float | None = None
    activations_gib: float | None = None  # the peak less the other three
    loss_first: float | None = None
    loss_last: float | None = None
    # this harness's fields; same rules (units in names, None when not measured)
    # the conf/method file the point used, unique within a sweep ("forge_int8")
    method_label: str | None = None
    # precision of the weights the update is applied to ("bf16", "fp32", "bf16+8")
    master_weights: str | None = None
    emulated: bool | None = None  # True when gpu= emulates a smaller card with a memory cap
    # PYTORCH_CUDA_ALLOC_CONF of the point's process (None: torch's default)
    cuda_alloc_conf: str | None = None
    gpu: str | None = None  # the conf/gpu choice ("h200", "a100_40gb", "cpu")
    device: str | None = None  # "cuda" or "cpu"
    dtype: str | None = None  # dtype of the model weights
    sweep_mode: str | None = None  # "grid" or "capacity"
    # points of the sweep sharing the GPU at once (>1: losses only, no timing)
    concurrent_points: int | None = None
    step_times_ms: list[float] | None = None  # every timed step (warm-up dropped), in order
    losses: list[float] | None = None  # loss of every step, warm-up included
    params_moved_frac: float | None = None  # fraction of trainable parameter tensors that changed
    nvml_baseline_gib: float | None = None  # device memory in use before this point's process touched CUDA
    forward_end_alloc_gib: float | None = None  # allocated when the forward returns (largest over steps)
    # measure.peak_pools: the memory at the peak of one more, recorded, step (harness.run.peak_pools):
    peak_pools_gib: dict[str, float] | None = None  # {weights, states, gradients, activations, other}
    peak_pools_phase: str | None = None  # where that peak fell: "forward", "backward", "after backward"
    peak_pools_alloc_gib: float | None = None  # the allocator's own peak over that step (rounded up)
    peak_tflops: float | None = None  # the dense bf16 peak mfu is of: one GPU's (gpu.peak_tflops) x gpus
    # the mask the model's SDPA attention got: "is_causal" (none: SDPA's causal flag, for the harness's
    # whole-sequence batches, harness.run.models); absent from records made before the harness set it,
    # whose captured and compiled steps ran with transformers' full causal mask
    attention_mask: str | None = None
    notes: list[str] | None = None  # remarks the method or runner made (fallbacks, caveats)
    config: dict[str, Any] | None = None  # the full resolved config of the point (its `launcher` aside)
    # how the point was started: "local", "slurm", or submitit's "local"/"debug" executors
    # ("submitit-local", "submitit-debug")
    launcher: str | None = None
    # the Slurm job (array jobs: ARRAY_TASK) that ran it; None when run locally
    slurm_job_id: str | None = None
    node: str | None = None  # the hostname of the machine the point ran on
    extra: dict[str, Any] = field(default_factory=dict)

    def set(self, **values: Any) -> Record:
        """Set fields by name (a schema field, or one of `OPTIONAL_FIELDS`); returns the record."""
        for name, value in values.items():
            if name in _FIELD_SET:
                setattr(self, name, value)
            elif name in OPTIONAL_FIELDS:
                self.extra[name] = value
            else:
                raise KeyError(
                    f"{name!r} is not a record field: declare it in harness.results (a field of Record, "
                    "or OPTIONAL_FIELDS with what it means)"
                )
        return self

    def to_json(self) -> dict[str, Any]:
        """The record as its results line holds it: the schema's fields in order, then the extra ones."""
        return {**{name: getattr(self, name) for name in FIELDS}, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """A record from a results line (or a worker's file): a field it lacks is None, and a field
        the schema does not know goes to `extra` as it is (a line of another version still loads)."""
        known = {k: v for k, v in data.items() if k in _FIELD_SET}
        return cls(**known, extra={k: v for k, v in data.items() if k not in _FIELD_SET})


FIELDS = tuple(f.name for f in fields(Record) if f.name != "extra")
_FIELD_SET = frozenset(FIELDS)

# Per-GPU peaks of a multi-GPU point: the record keeps the largest rank's, and each rank's in
# `<field>_per_rank` (harness.run.record.merge_ranks).
PEAK_FIELDS = (
    "peak_alloc_gib",
    "peak_reserved_gib",
    "peak_nvml_gib",
    "activations_gib",
    "forward_end_alloc_gib",
)

# Fields beyond the schema that a kind of record adds, and what each means.
OPTIONAL_FIELDS = {
    "chunked_loss": "the loss in chunks of tokens (model.chunked_loss): every step record says",
    "chunked_head": "lm_head and the loss in chunks of the vocabulary (model.chunked_head): when on",
    "convergence_reference": "a convergence point: whether its method is the run's reference",
    # a convergence run (harness.run.convergence)
    "heldout_steps": "the steps the held-out loss was taken at",
    "heldout_losses": "the held-out loss at each of them",
    "heldout_by_corpus": "{corpus: {steps, losses}}: the held-out loss per corpus",
    "phases": "the run's phases (corpus, steps, learning rate)",
    "tokens_trained": "tokens the run trained on",
    "data": "the text it trained on: python, vocab_size and each file's SHA-256",
    # a branched fidelity run (harness.run.branches)
    "branches": "each branch from the reference: its start, losses and distances",
    "branch_steps": "steps a branch runs",
    "reference_losses": "the reference trajectory's losses",
    "reference": "the folder of the reference trajectory",
    # a step-time point with measure.fidelity (harness.run.fidelity)
    "fidelity": "its torch.optim reference trained beside it in fp32: losses, distances, bounds' terms",
    # a point of several processes (torchrun: harness.run.launch)
    "rank": "the process's rank (a rank's own record)",
    "world_size": "processes the point ran in",
    "ranks_reported": "ranks whose record the merged one was made from",
    **{f"{name}_per_rank": f"{name} of each rank (the record keeps the largest)" for name in PEAK_FIELDS},
}


# The kernel lab's records (`python -m harness kernels` and its probes: results/kernels/,
# results/tuning/, results/device-logs/): one kernel timing per (shape, T, variant), or one probe
# point. They carry these fields beside the run's metadata (`env`, `gpu_name`, `time`, `sweep`),
# and the timings and checks each variant adds under a name of `KERNEL_FIELD_FAMILIES`.
KERNEL_FIELDS = {
    "variant": "what was timed: cublas_gemm, gemm_plus_fused_adamw(_graph), forge, forge_tune",
    "rule": "the update rule of a FORGE variant (adamw, lion, sgd-momentum)",
    "state_dtype": "its optimizer states' dtype (bf16, int8, fp32)",
    "shape_name": "the linear layer (q, k, v, o, gate, up, down, lm_head; a probe's own names)",
    "T": "tokens of the weight-gradient GEMM",
    "N": "the weight's rows (output features)",
    "K": "the weight's columns (input features)",
    "rows": "an elementwise probe's weight rows",
    "cols": "an elementwise probe's weight columns",
    "storage": "how an elementwise probe stores its states (bf16, int8)",
    "update_bytes": "the least bytes the update moves: W and each state read and written once",
    "time_ms": "the variant's median time, ms",
    "tflops": "2 T N K over that time, TFLOP/s",
    "repeats": "repeats of the regression suite's timing",
    "repeat_times_ms": "the median of each repeat, ms",
    "debug_slowdown": "a deliberate slowdown of the FORGE variant (the suite's self-test), a fraction",
    "ratio_to_gemm": "time over cuBLAS's weight-gradient GEMM of the same point",
    "ratio_to_gemm_adamw": "time over the GEMM and fused AdamW",
    "ratio_to_gemm_adamw_graph": "time over the GEMM and fused AdamW captured in a CUDA graph",
    "ratio_to_roofline": "time over `roofline_ms`",
    "floor_ms": "max(FLOPs / measured matmul rate, least bytes / measured copy rate), ms",
    "fraction_of_floor": "floor_ms over the time",
    "roofline_ms": "max(the GEMM's time, the update's bytes at the measured copy rate), ms",
    "ceilings": "the run's measured matmul TFLOP/s and copy TB/s",
    "chosen": "the variant an FP8 study picks at the point",
    "fraction": "a probe's split of the work (a fraction)",
    "pair": "the two kernels a probe compares",
    "max_abs": "the largest absolute difference of two kernels' outputs",
    "differing_median_magnitude": "the median magnitude of the elements that differ",
    "l2_read_tb_s": "the rate operands were read at from L2, TB/s",
    "safe": "a Newton-Schulz variant computes torch's polynomial within twice torch's rounding of it",
}

# Names a kernel record makes per variant, by their form (`*` is the variant: `shipped_ms`).
KERNEL_FIELD_FAMILIES = {
    "*_ms": "a variant's median time, ms",
    "*_clocks": "a variant's time in GPU clocks",
    "*_differs": "whether a variant's output differs from the shipped kernel's",
    "*_error": "why a variant did not build or run",
    "*_relative_error": "a variant's relative error against its reference",
    "*_vs_*": "the first variant's time over the second's",
    "ceiling_*": "a ceiling measured at the start of the run (matmul_tflops, copy_tbps)",
}


def empty_record() -> dict[str, Any]:
    """A record with every field present and unset (None), `schema` filled in."""
    return Record().to_json()


def worst_status(statuses: Iterable[str | None]) -> str:
    """The worst of some statuses (`STATUSES` order; a missing one counts as an error)."""
    return max((s if s in STATUSES else "error" for s in statuses), key=STATUSES.index)


def kernel_record(*parts: Mapping[str, Any], **values: Any) -> dict[str, Any]:
    """A kernel-lab record: `parts` then `values` merged in order, every name declared (a field of
    `Record`, `OPTIONAL_FIELDS`, `KERNEL_FIELDS`, or of a `KERNEL_FIELD_FAMILIES` form)."""
    record = {k: v for part in (*parts, values) for k, v in part.items()}
    undeclared = [name for name in record if not is_declared(name)]
    if undeclared:
        raise KeyError(
            f"{', '.join(map(repr, undeclared))}: not a record field; declare it in harness.results "
            "(KERNEL_FIELDS, or a name of a KERNEL_FIELD_FAMILIES form such as '<variant>_ms')"
        )
    return record


def is_declared(name: str) -> bool:
    """True for a field of `Record`, of `OPTIONAL_FIELDS`, `KERNEL_FIELDS`, or a family's form."""
    if name in _FIELD_SET or name in OPTIONAL_FIELDS or name in KERNEL_FIELDS:
        return True
    return any(fnmatch.fnmatchcase(name, form) for form in KERNEL_FIELD_FAMILIES)


def _json_safe(value: Any) -> Any:
    """NaN and inf are not JSON: write them as null (a diverged loss keeps its status instead)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _ends_mid_line(f) -> bool:
    """True when a non-empty file's last byte is not a newline (a truncated last record)."""
    f.seek(0, os.SEEK_END)
    if f.tell() == 0:
        return False
    f.seek(-1, os.SEEK_END)
    return f.read(1) != b"\n"


def _encode(record: Mapping[str, Any]) -> str:
    """A record as JSON: NaN and inf as null, a value JSON lacks (a path) as its text."""
    return json.dumps(_json_safe(dict(record)), sort_keys=False, allow_nan=False, default=str)


def append(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Append one record as one line: locked, flushed and fsynced, so readers never see half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = _encode(record) + "\n"
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            prefix = b"\n" if _ends_mid_line(f) else b""
            f.seek(0, os.SEEK_END)
            f.write(prefix + line.encode())
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_one(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Write one record as a file of its own (a worker's record for the sweep's parent): written
    whole beside it, then renamed over `path`, so a reader finds it complete or not at all."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(_encode(record))
    tmp.replace(path)


def read_one(path: str | os.PathLike) -> dict[str, Any]:
    """The record of a file `write_one` wrote."""
    return json.loads(Path(path).read_text())


def iter_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield the records of one JSONL file, skipping (with a warning) lines that are not JSON."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: skipping a line that is not valid JSON (truncated write?)", path, lineno)
                continue
            if isinstance(record, dict):
                yield record


# Folders below results/ whose files are no sweep records: the raw logs and probe outputs of the
# GPU runs that the docs cite (results/device-logs/<what>-<date>-<commit>.<ext>).
NOT_RECORDS = ("device-logs",)


def expand(
    paths: Iterable[str | Path], exclude_dirs: Sequence[str] = (), skip_scratch: bool = False
) -> list[Path]:
    """Files behind `paths`: a file as given, a directory as its sorted `*.jsonl` files.

    Below a directory, files under a folder named in `exclude_dirs` or `NOT_RECORDS` are left out, and with
    `skip_scratch` so are files under a scratch folder (one whose `.gitignore` ignores everything:
    the harness marks `results/smoke/` and `results/adhoc/` so, and they are never committed).
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(
                f for f in sorted(path.rglob("*.jsonl")) if _wanted(path, f, exclude_dirs, skip_scratch)
            )
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"no results file or directory at {path}")
    return files


def _wanted(root: Path, file: Path, exclude_dirs: Sequence[str], skip_scratch: bool) -> bool:
    folders = file.relative_to(root).parts[:-1]
    if set(folders) & {*exclude_dirs, *NOT_RECORDS}:
        return False
    if skip_scratch:
        for depth in range(len(folders) + 1):
            if is_scratch(root.joinpath(*folders[:depth])):
                return False
    return True


def in_scratch(path: Path) -> bool:
    """True when `path` is a scratch folder or lies inside one."""
    path = Path(path).resolve()
    return any(is_scratch(folder) for folder in (path, *path.parents))


def is_scratch(folder: Path) -> bool:
    """True for a folder the harness marked as scratch (its .gitignore ignores everything)."""
    marker = folder / ".gitignore"
    return marker.is_file() and "*" in marker.read_text().split()


def read(*paths: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of the given files or directories, as dicts, in file then line order."""
    return [r for f in expand(paths) for r in iter_records(f)]


def load(*paths: str | os.PathLike) -> pd.DataFrame:
    """Load JSONL results (files or directories) into one DataFrame, one row per record.

    Columns are the record fields: every name of `FIELDS` is present even when no record has it,
    followed by any further fields records carry. Nested fields (`env`, `method_options`,
    `config`, `step_times_ms`) stay Python objects in their cells. With no path, loads `results/`.
    """
    records = read(*(paths or ("results",)))
    df = pd.DataFrame.from_records(records)
    for name in FIELDS:
        if name not in df.columns:
            df[name] = None
    extra = [c for c in df.columns if c not in FIELDS]
    return df[list(FIELDS) + extra]


def recorded_points(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The points already in one results file, point id -> its last record (for resuming)."""
    path = Path(path)
    if not path.exists():
        return {}
    return {r["point"]: r for r in iter_records(path) if r.get("point")}


def merge_missing_records(src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> dict[str, int]:
    """Append to each JSONL file under `dst_dir` the records of its namesake under `src_dir` that it
    lacks (same relative path; a file only in `src_dir` is created). Returns {relative path:
    records added}. Used on the GPU machine, whose results/ each call replaces with the sender's
    tree: records that an earlier call wrote there come back before a sweep resumes."""
    canonical = lambda record: json.dumps(record, sort_keys=True)
    added: dict[str, int] = {}
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    for src in sorted(src_dir.rglob("*.jsonl")):
        rel = src.relative_to(src_dir)
        dst = dst_dir / rel
        have = {canonical(r) for r in iter_records(dst)} if dst.exists() else set()
        new = [r for r in iter_records(src) if canonical(r) not in have]
        for record in new:
            append(dst, record)
        if new:
            added[str(rel)] = len(new)
    return added
