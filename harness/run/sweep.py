"""Sweeps: expand the grid, validate every point, run each in a fresh subprocess, record, resume.

    python -m harness sweep +exp=llama8b_h200            # conf/exp/llama8b_h200.yaml

1. `expand` turns the composed config's `sweep` lists into points (methods x models x batch
   sizes x sequence lengths x activation checkpointing) and composes each point's own config
   through Hydra, so every bad name or value fails before the first point runs.
2. Points already in `results/<sweep>.jsonl` are skipped: an interrupted sweep resumes.
3. Each remaining point runs in `python -m harness.run.worker` (`run_isolated`), under a timeout, in
   its own process group. A method that cannot run here is recorded `unavailable` without a
   subprocess. A worker that dies without a record becomes an `error` (or `oom`, if its stderr
   says so) with the tail of its stderr. Nothing a point does stops the sweep.
4. Each record is appended atomically (`results.append`) and summarized on one line.

`sweep.mode=capacity` searches instead for the largest batch that fits, per method, model and
sequence length, under the GPU's memory cap: batches 1 and 2, then the batch their reserved peaks
predict (linear in the batch) and its neighbour, bisecting only if the prediction was off; without
a cap (or peaks), doubling from 1 until OOM, then bisecting. Every try is a recorded point.

`sweep.concurrent_points=N` runs N points at once on the same GPU: for convergence sweeps only,
whose claim is the loss curve; step times measured that way are not comparable and say so
(`concurrent_points` in the record).
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness import results
from harness.run import config as config_mod
from harness.run import env, launch, methods
from harness.run.config import compose_config

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Point:
    """One point: its id, the Hydra overrides that make it, and its composed config."""

    id: str
    overrides: list[str]
    cfg: DictConfig


def point_id(cfg: DictConfig) -> str:
    """A stable id from what defines the point (the resume key)."""
    ac = "/ac" if cfg.activation_checkpointing else ""
    tp = f"/tp{cfg.gpus}" if cfg.gpus > 1 else ""
    seed = f"/seed{cfg.seed}" if cfg.seed else ""  # the default seed 0 keeps the ids of old results
    shape = f"b{cfg.batch_size}/s{cfg.seq_len}"
    allocator = f"/alloc={cfg.gpu.allocator}" if cfg.gpu.allocator else ""  # another search, not a resume
    return f"{cfg.method.label}/{cfg.model.name}/{shape}{ac}{tp}{seed}/{cfg.gpu.name}{allocator}"


def _axes(cfg: DictConfig) -> dict[str, list[Any]]:
    """The grid's axes as Hydra override keys; an empty sweep list means the composed value."""
    s = cfg.sweep
    return {
        "method": list(s.methods) or [cfg.method.label],
        "model": list(s.models) or [cfg.model.name],
        "seq_len": list(s.seq_lens) or [cfg.seq_len],
        "activation_checkpointing": list(s.activation_checkpointing) or [cfg.activation_checkpointing],
        "batch_size": list(s.batch_sizes) or [cfg.batch_size],
    }


def make_point(base_overrides: list[str], **values: Any) -> Point:
    """Compose (and validate) one point's config from the sweep's overrides plus its own values."""
    overrides = [*base_overrides, *(f"{k}={_hydra_value(v)}" for k, v in values.items())]
    cfg = compose_config(overrides)
    return Point(point_id(cfg), overrides, cfg)


def _hydra_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def expand(cfg: DictConfig, base_overrides: list[str]) -> list[Point]:
    """Every point of a grid sweep, composed and validated (raises ConfigError on the first bad one)."""
    axes = _axes(cfg)
    points = [
        make_point(base_overrides, **dict(zip(axes, combo))) for combo in itertools.product(*axes.values())
    ]
    points = [p for p in points if not excluded(p.id, cfg)]
    ids = [p.id for p in points]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise config_mod.ConfigError(
            f"sweep has duplicate points (give methods distinct labels): {duplicates}"
        )
    return points


def excluded(pid: str, cfg: DictConfig) -> bool:
    """True when the point id matches one of sweep.exclude's fnmatch patterns."""
    return any(fnmatch.fnmatchcase(pid, pattern) for pattern in cfg.sweep.exclude)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


_live_workers: set[subprocess.Popen] = set()  # running workers, killed together on Ctrl-C
_live_lock = threading.Lock()
_stopping = threading.Event()  # set on Ctrl-C: a worker killed for it is no result, record nothing


class SweepInterrupted(Exception):
    """A concurrent point whose worker was killed because the sweep was stopped."""


def _kill_live_workers() -> None:
    with _live_lock:
        _stopping.set()
        for proc in list(_live_workers):
            _kill_group(proc)


def _child_env(device: str, allocator: str | None = None) -> dict[str, str]:
    child = dict(os.environ, PYTHONUNBUFFERED="1")
    if allocator:  # read by torch's CUDA allocator when it starts, in the worker
        child["PYTORCH_CUDA_ALLOC_CONF"] = allocator
    child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if device == "cpu":
        child.setdefault("TRITON_INTERPRET", "1")  # forge's kernels run in Triton's interpreter
        # Tiny CPU models gain nothing from threads, and OpenMP threads that spin while another
        # process holds a core made steps 50x slower on a 2-core machine.
        child.setdefault("OMP_NUM_THREADS", "1")
    return child


def _crash_record(point: Point, git: dict[str, Any], status: str, error: str) -> dict[str, Any]:
    from harness.run import runner

    device = runner.resolve_device(point.cfg.device)
    record = runner.stamp_env(runner.base_record(point.cfg, point.id, device), device, git)
    record.update(status=status, error=error)
    return record


def run_isolated(point: Point, git: dict[str, Any]) -> dict[str, Any]:
    """Run one point in a fresh worker subprocess; always returns a record."""
    from harness.run import runner

    device = runner.resolve_device(point.cfg.device)
    with tempfile.TemporaryDirectory(prefix="harness-point-") as tmp:
        spec_path, record_path = Path(tmp, "point.json"), Path(tmp, "record.json")
        spec = {"point": point.id, "config": config_mod.to_dict(point.cfg), "git": git}
        spec["config"]["device"] = device
        spec_path.write_text(json.dumps(spec))
        gpus = point.cfg.gpus
        cmd = launch.command(gpus, [str(spec_path), str(record_path)])
        with _live_lock:  # registered atomically, so a Ctrl-C either kills it or stops its start
            if _stopping.is_set():
                raise SweepInterrupted(point.id)
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=launch.child_env(_child_env(device, point.cfg.gpu.allocator), gpus),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            _live_workers.add(proc)
        try:
            _, stderr = proc.communicate(timeout=point.cfg.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return _crash_record(point, git, "error", f"timeout: killed after {point.cfg.timeout_s:g} s")
        except BaseException:  # Ctrl-C: the worker is in its own process group and would outlive us
            _kill_group(proc)
            raise
        finally:
            with _live_lock:
                _live_workers.discard(proc)
        if _stopping.is_set():  # killed by the Ctrl-C of a concurrent sweep, not by its own fault
            raise SweepInterrupted(point.id)
        if gpus > 1 and (ranks := launch.rank_records(record_path, gpus)):
            return launch.merge(ranks)
        if record_path.exists():
            return json.loads(record_path.read_text())
    status = "oom" if "out of memory" in stderr.lower() else "error"
    tail = stderr.strip()[-2000:] or "(no stderr)"
    return _crash_record(point, git, status, f"worker exited with code {proc.returncode}: {tail}")


def run_or_skip(point: Point, git: dict[str, Any], path: Path, done: dict[str, dict]) -> tuple[dict, bool]:
    """The point's record: the recorded one when resuming, else a new run (appended). -> (record, ran)."""
    if point.id in done:
        return done[point.id], False
    from harness.run import runner

    device = runner.resolve_device(point.cfg.device)
    method = point.cfg.method
    reason = methods.unavailable_reason(
        method.name, config_mod.to_dict(method.options), device, method.cuda_graph
    )
    if reason:
        record = runner.stamp_env(runner.base_record(point.cfg, point.id, device), device, git)
        record.update(status="unavailable", error=reason)
    else:
        record = run_isolated(point, git)
    results.append(path, record)
    done[point.id] = record
    return record, True


def summary(record: dict[str, Any], ran: bool = True) -> str:
    """One line per point: status, id, then time, memory and loss where measured."""
    parts = [f"[{record['status']}]", record["point"]]
    if record.get("step_time_ms_median") is not None:
        parts.append(f"{record['step_time_ms_median']:.1f} ms/step")
    if record.get("peak_alloc_gib") is not None:
        parts.append(f"peak {record['peak_alloc_gib']:.2f} GiB")
    if record.get("loss_first") is not None and record.get("loss_last") is not None:
        parts.append(f"loss {record['loss_first']:.3f}->{record['loss_last']:.3f}")
    if record.get("error"):
        parts.append("| " + str(record["error"]).splitlines()[0][:160])
    if not ran:
        parts.append("(recorded earlier, skipped)")
    return "  ".join(parts)


def largest_fitting(
    try_batch: Callable[[int], str], max_batch: int, guess: Callable[[], int | None] | None = None
) -> int | None:
    """Largest batch whose status is ok. None if even 1 does not fit; a status other than ok/oom
    (error, unavailable) ends the search there.

    Without `guess`: double from 1 until an OOM, then bisect. With it: after batches 1 and 2 fit,
    `guess()` predicts the largest from their measured peaks (`predict_largest`); the search tries
    that batch and its neighbour, and only falls back to bisecting if the prediction was off.
    Either way the answer is proven by measurement: b fits and b + 1 (or max_batch) was tried."""
    fits, fails = 0, None

    def probe(b: int) -> str:
        nonlocal fits, fails
        status = try_batch(b)
        if status == "ok":
            fits = max(fits, b)
        elif status == "oom":
            fails = b if fails is None else min(fails, b)
        return status

    b = 1
    while b <= max_batch and fails is None:
        if probe(b) not in ("ok", "oom"):
            return fits or None
        predicted = guess() if guess is not None and fits == 2 and fails is None else None
        if predicted is not None:
            predicted = min(max(predicted, 2), max_batch)
            status = probe(predicted) if predicted > 2 else "ok"  # 2 is known to fit
            if status not in ("ok", "oom"):
                return fits or None
            neighbour = predicted + 1 if status == "ok" else predicted - 1
            if 2 < neighbour <= max_batch and probe(neighbour) not in ("ok", "oom"):
                return fits or None
            if fails is not None or fits == max_batch:
                break
            b = fits * 2  # the prediction was low: go on doubling from what fits
            continue
        b = fits * 2 if fits else b * 2
    while fails is not None and fails - fits > 1:
        if probe((fits + fails) // 2) not in ("ok", "oom"):
            break
    return fits or None


def predict_largest(small: dict, large: dict, cap_gib: float | None) -> int | None:
    """The largest batch whose reserved peak stays under `cap_gib`, extrapolated linearly from two
    recorded points (batch sizes b1 < b2). None when it cannot be told (no cap, no peaks, or the
    peak did not grow with the batch: then another part of the step, not activations, sets it)."""
    if cap_gib is None:
        return None
    b1, b2 = small.get("batch_size"), large.get("batch_size")
    p1, p2 = small.get("peak_reserved_gib"), large.get("peak_reserved_gib")
    if None in (b1, b2, p1, p2) or b2 <= b1 or p2 <= p1:
        return None
    per_sample = (p2 - p1) / (b2 - b1)
    return b2 + int((cap_gib - p2) // per_sample)


def results_path(cfg: DictConfig) -> Path:
    """results/<sweep>.jsonl; a scratch directory gets a .gitignore so its files stay untracked."""
    directory = Path(cfg.results_dir)
    if not directory.is_absolute():
        directory = REPO / directory
    directory.mkdir(parents=True, exist_ok=True)
    if cfg.sweep.scratch and not (directory / ".gitignore").exists():
        (directory / ".gitignore").write_text("# written by the harness: scratch results, not committed\n*\n")
    return directory / f"{cfg.sweep.name}.jsonl"


class Progress:
    """A tqdm bar when tqdm is installed (it comes with transformers), plain lines otherwise; keeps
    every point's record, in the order they finished, for the sweep's summary table."""

    def __init__(self, total: int | None, desc: str) -> None:
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="point", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None
        self.lock = threading.Lock()  # points that run concurrently report from their threads
        self.records: list[dict[str, Any]] = []

    def point(self, record: dict[str, Any], ran: bool) -> None:
        line = summary(record, ran)
        with self.lock:
            self.records.append(record)
            if self.bar is None:
                print(line, flush=True)
            else:
                self.bar.write(line)
                self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_grid(
    points: list[Point], git: dict, path: Path, done: dict, progress: Progress, concurrent: int = 1
) -> None:
    if concurrent == 1:
        for point in points:
            progress.point(*run_or_skip(point, git, path, done))
        return
    # Convergence sweeps only (config.validate): each worker is still its own process; the
    # threads just wait on them. A Ctrl-C kills every running worker, as in the serial case.
    pool = ThreadPoolExecutor(max_workers=concurrent, thread_name_prefix="point")
    try:
        futures = [pool.submit(run_or_skip, point, git, path, done) for point in points]
        for future in as_completed(futures):
            progress.point(*future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # no point starts from here on
        _kill_live_workers()
        pool.shutdown(wait=True)  # the threads return once their worker is dead
        raise
    pool.shutdown()


def _run_capacity(
    cfg: DictConfig, overrides: list[str], git: dict, path: Path, done: dict, progress: Progress
) -> None:
    axes = _axes(cfg)
    axes.pop("batch_size")
    groups = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    groups = [v for v in groups if not excluded(make_point(overrides, batch_size=1, **v).id, cfg)]
    for values in groups:  # validated above, before running any
        tried: dict[int, dict] = {}

        def try_batch(b: int, values: dict = values, tried: dict = tried) -> str:
            record, ran = run_or_skip(make_point(overrides, batch_size=b, **values), git, path, done)
            progress.point(record, ran)
            tried[b] = record
            return record["status"]

        def guess(tried: dict = tried) -> int | None:
            return predict_largest(tried[1], tried[2], cfg.gpu.memory_cap_gib)

        largest_fitting(try_batch, cfg.sweep.max_batch_size, guess)


@dataclass
class SweepRun:
    """What a sweep did: its results file and the record of each of its points, in the order they
    finished (those recorded by an earlier run of the sweep included)."""

    path: Path
    records: list[dict[str, Any]]


def execute(overrides: list[str]) -> SweepRun:
    """Run (or resume) the sweep the overrides compose."""
    cfg = compose_config(overrides)
    points = expand(cfg, overrides) if cfg.sweep.mode == "grid" else None  # validates every point
    _stopping.clear()  # a sweep stopped earlier in this process does not stop this one
    path = results_path(cfg)
    git = env.git_info()
    done = results.recorded_points(path)
    progress = Progress(len(points) if points is not None else None, cfg.sweep.name)
    try:
        if points is not None:
            _run_grid(points, git, path, done, progress, cfg.sweep.concurrent_points)
        else:
            _run_capacity(cfg, overrides, git, path, done, progress)
    finally:
        progress.close()
    return SweepRun(path, progress.records)


def run_sweep(overrides: list[str]) -> Path:
    """Run (or resume) the sweep the overrides compose; returns the results file."""
    return execute(overrides).path
