"""Results records: the JSONL row format, atomic appends and one-call loading.

One sweep point gives one record, one JSON object on one line of `results/<sweep>.jsonl`. The
field names in `FIELDS` are fixed (docs/harness.md lists them; the report and the regression
checker read them); a record may carry more fields, never fewer. Units are in the names: `_ms`
is milliseconds, `_gib` is GiB (2**30 bytes). A figure that could not be measured is `None`
(null), never a made-up zero.

Writing is crash-safe: `append` takes an exclusive lock, writes one whole line, flushes and
fsyncs, so a killed sweep leaves at worst one truncated last line. Reading tolerates that line:
`iter_records` skips any line that is not valid JSON (with a warning) instead of failing, and
`append` first ends such a fragment with a newline so the next record starts on a line of its own.

    >>> import harness.results as results
    >>> df = results.load("results/")              # every *.jsonl below, one row per record
    >>> df[df.status == "ok"][["method", "batch_size", "step_time_ms_median"]]
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

STATUSES = ("ok", "oom", "error", "diverged", "unavailable")

# The fixed fields every record carries, in this order (other tools read them by these names).
DESIGN_FIELDS = (
    "schema",
    "sweep",
    "point",
    "time",
    "status",
    "error",
    "method",
    "method_options",
    "model",
    "n_params",
    "batch_size",
    "seq_len",
    "activation_checkpointing",
    "gpu_name",
    "gpu_count",
    "memory_cap_gib",
    "env",
    "steps",
    "warmup_steps",
    "step_time_ms_median",
    "step_time_ms_min",
    "step_time_ms_p90",
    "tokens_per_s",
    "mfu",
    "peak_alloc_gib",
    "peak_reserved_gib",
    "peak_nvml_gib",
    "weights_gib",
    "grads_gib",
    "optimizer_state_gib",
    "activations_gib",
    "loss_first",
    "loss_last",
)

# Fields this harness adds; same rules (units in names, null when not measured).
EXTRA_FIELDS = (
    "method_label",  # the conf/method file the point used, unique within a sweep ("forge_int8")
    "master_weights",  # precision of the weights the update is applied to ("bf16", "fp32", "bf16+8")
    "emulated",  # True when gpu= emulates a smaller card with a memory cap
    "cuda_alloc_conf",  # PYTORCH_CUDA_ALLOC_CONF of the point's process (None: torch's default)
    "gpu",  # the conf/gpu choice ("h200", "a100_40gb", "cpu")
    "device",  # "cuda" or "cpu"
    "dtype",  # dtype of the model weights
    "sweep_mode",  # "grid" or "capacity"
    "concurrent_points",  # points of the sweep sharing the GPU at once (>1: losses only, no timing)
    "step_times_ms",  # every timed step (warm-up dropped), in order
    "losses",  # loss of every step, warm-up included
    "params_moved_frac",  # fraction of trainable parameter tensors that changed
    "nvml_baseline_gib",  # device memory in use before this point's process touched CUDA
    "forward_end_alloc_gib",  # allocated when the forward returns (largest over steps; static + saved)
    # measure.peak_pools: the memory at the peak of one more, recorded, step (harness.run.peak_pools):
    "peak_pools_gib",  # {weights, states, gradients, activations, other}, from the allocator's record
    "peak_pools_phase",  # where that peak fell: "forward", "backward", "after backward"
    "peak_pools_alloc_gib",  # the allocator's own peak over that step (the pools' total, rounded up)
    "peak_tflops",  # the per-GPU peak used for mfu
    # the mask the model's SDPA attention got: "is_causal" (none: SDPA's causal flag, for the harness's
    # whole-sequence batches, harness.run.models); absent from records made before the harness set it,
    # whose captured and compiled steps ran with transformers' full causal mask
    "attention_mask",
    "notes",  # list of remarks the method or runner made (fallbacks, caveats)
    "config",  # the full resolved config of the point (its `launcher` aside)
    "launcher",  # how the point was started: "local", "slurm", or submitit's "local"/"debug" executors
    # ("submitit-local", "submitit-debug")
    "slurm_job_id",  # the Slurm job (array jobs: ARRAY_TASK) that ran it; None when run locally
    "node",  # the hostname of the machine the point ran on
)

FIELDS = DESIGN_FIELDS + EXTRA_FIELDS


def empty_record() -> dict[str, Any]:
    """A record with every field present and unset (None), `schema` filled in."""
    record: dict[str, Any] = dict.fromkeys(FIELDS)
    record["schema"] = SCHEMA_VERSION
    return record


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


def append(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as one line: locked, flushed and fsynced, so readers never see half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(_json_safe(record), sort_keys=False, allow_nan=False) + "\n"
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


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given; directories become their *.jsonl files, recursively, in sorted order (but
    the GPU runs' raw logs under a `device-logs` folder, which are no records)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(f for f in sorted(p.rglob("*.jsonl")) if "device-logs" not in f.relative_to(p).parts)
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"no results file or directory at {p}")
    return files


def read(*paths: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of the given files or directories, as dicts, in file then line order."""
    return [r for f in _expand(paths) for r in iter_records(f)]


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
