"""Sweeps: expand the grid, validate every point, run each in a fresh subprocess, record, resume.

    python -m harness sweep +exp=llama8b_h200            # conf/exp/llama8b_h200.yaml

1. `expand` (grid.py) turns the composed config's `sweep` lists into points (methods x models x
   batch sizes x sequence lengths x activation checkpointing) and composes each point's own config
   through Hydra, so every bad name or value fails before the first point runs.
2. The machine is checked before any point runs (`check_hardware`, hardware.py): a sweep for a
   GPU this machine lacks (gpu=h200 without an H200, any GPU on a machine without CUDA, fewer GPUs
   than `gpus`), or whose model's weights alone exceed the device's memory (or, on a CPU, the
   host's), is refused with a ConfigError that says where and how it can run.
3. Points already in `results/<sweep>.jsonl` are skipped: an interrupted sweep resumes. Records
   are kept per hardware: a file that holds points measured on other hardware (another GPU, or
   a GPU where this run uses the CPU) is never appended to; this machine's points go to
   `results/<sweep>-<hardware>.jsonl` (say `llama8b_h200-nvidia-a100-sxm4-80gb.jsonl`), and only
   points measured on this hardware count as done. The sweep ends by saying how many it skipped
   and the command that runs them again: the same one with `sweep.rerun=true`, which counts no
   point as done and appends the new records beside the old (a table shows the latest).
4. Each remaining point runs in `python -m harness.run.worker` (`run_isolated`, local.py), under
   a timeout, in its own process group. A method that cannot run here is recorded `unavailable`
   without a subprocess. A worker that dies without a record becomes an `error` (or `oom`, if its
   stderr says so) with the tail of its stderr. Nothing a point does stops the sweep.
5. Each record is appended atomically (`results.append`) and summarized on one line.

Where the points run is the launcher's business (`launcher=`, conf/launcher/): `LocalLauncher`
(local.py) runs them here as above; `launcher=slurm` submits each as a Slurm job that runs the
same `run_here` on a node (harness.run.slurm), its hardware checked there rather than here. Either
yields records as points finish, and this process appends them, so resuming works the same way.

`sweep.mode=capacity` searches instead for the largest batch that fits, per method, model and
sequence length, under the GPU's memory cap: batches 1 and 2, then the batch their reserved peaks
predict (linear in the batch) and its neighbour, bisecting only if the prediction was off; without
a cap (or peaks), doubling from 1 until OOM, then bisecting. Every try is a recorded point.

`sweep.concurrent_points=N` runs N points at once on the same GPU: for convergence sweeps only,
whose claim is the loss curve; step times measured that way are not comparable and say so
(`concurrent_points` in the record).
"""

from __future__ import annotations

import re
import shlex
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness import results
from harness.run import env, local
from harness.run.config import ConfigError, compose_config
from harness.run.env import REPO
from harness.run.grid import Point, capacity_groups, expand, make_point
from harness.run.hardware import (
    check_hardware,
    device_here,
    foreign_hardware,
    hardware_label,
    record_hardware,
)
from harness.run.local import Launcher, LocalLauncher
from harness.run.summary import relative


def make_launcher(cfg: DictConfig) -> Launcher:
    """The launcher `launcher=` names; Slurm's options are checked here, before any job is submitted."""
    if cfg.launcher.name == "local":
        return LocalLauncher(cfg.sweep.concurrent_points)
    try:
        from harness.run import slurm
    except ImportError as e:
        raise ConfigError(f"launcher=slurm needs submitit ({e}): pip install -e '.[harness]'") from None
    return slurm.SlurmLauncher(cfg)


def _keep(path: Path, done: dict[str, dict], point: Point, record: dict[str, Any]) -> dict[str, Any]:
    results.append(path, record)
    done[point.id] = record
    return record


def run_or_skip(
    point: Point, git: dict[str, Any], path: Path, done: dict[str, dict], launcher: Launcher | None = None
) -> tuple[dict, bool]:
    """The point's record: the recorded one when resuming, else a new run (appended). -> (record, ran)."""
    if point.id in done:
        return done[point.id], False
    ((_, record),) = (launcher or LocalLauncher()).run([point], git)
    return _keep(path, done, point, record), True


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


def results_path(cfg: DictConfig, hardware: str | None = None) -> Path:
    """The sweep's results file, results/<sweep>.jsonl; a scratch directory gets a .gitignore so
    its files stay untracked.

    Given the hardware this run measures on (`hardware_label`), a results/<sweep>.jsonl that holds
    records measured on other hardware is left alone: the path is results/<sweep>-<hardware>.jsonl."""
    directory = Path(cfg.results_dir)
    if not directory.is_absolute():
        directory = REPO / directory
    directory.mkdir(parents=True, exist_ok=True)
    if cfg.sweep.scratch and not (directory / ".gitignore").exists():
        (directory / ".gitignore").write_text("# written by the harness: scratch results, not committed\n*\n")
    path = directory / f"{cfg.sweep.name}.jsonl"
    if hardware is not None and path.exists() and foreign_hardware(path, hardware):
        return directory / f"{cfg.sweep.name}-{_slug(hardware)}.jsonl"
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


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
        self.skipped = 0  # points recorded by an earlier run, shown and not run again

    def point(self, record: dict[str, Any], ran: bool) -> None:
        line = summary(record, ran)
        with self.lock:
            self.records.append(record)
            self.skipped += not ran
            if self.bar is None:
                print(line, flush=True)
            else:
                self.bar.write(line)
                self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_grid(
    points: list[Point], git: dict, path: Path, done: dict, progress: Progress, launcher: Launcher
) -> None:
    for point in points:
        if point.id in done:
            progress.point(done[point.id], False)
    for point, record in launcher.run([p for p in points if p.id not in done], git):
        progress.point(_keep(path, done, point, record), True)


def _run_capacity(
    cfg: DictConfig,
    overrides: list[str],
    git: dict,
    path: Path,
    done: dict,
    progress: Progress,
    groups: list[tuple[dict[str, Any], Point]],
    launcher: Launcher,
) -> None:
    for values, _ in groups:  # validated before running any
        tried: dict[int, dict] = {}

        def try_batch(b: int, values: dict = values, tried: dict = tried) -> str:
            point = make_point(overrides, batch_size=b, **values)
            record, ran = run_or_skip(point, git, path, done, launcher)
            progress.point(record, ran)
            tried[b] = record
            return record["status"]

        def guess(tried: dict = tried) -> int | None:
            return predict_largest(tried[1], tried[2], cfg.gpu.memory_cap_gib)

        largest_fitting(try_batch, cfg.sweep.max_batch_size, guess)


@dataclass
class SweepRun:
    """What a sweep did: its results file and the record of each of its points, in the order they
    finished (those recorded by an earlier run of the sweep included, `skipped` of them)."""

    path: Path
    records: list[dict[str, Any]]
    skipped: int = 0


@dataclass
class _Prepared:
    """A sweep composed, validated and checked, before any point runs."""

    cfg: DictConfig
    launcher: Launcher
    points: list[Point] | None  # grid mode
    groups: list[tuple[dict[str, Any], Point]] | None  # capacity mode
    path: Path
    done: dict[str, dict]


def _prepare(overrides: list[str]) -> _Prepared:
    cfg = compose_config(overrides)
    launcher = make_launcher(cfg)  # a bad Slurm option fails here
    here = env.machine()
    if not launcher.remote:  # Slurm's nodes are not this machine: the job checks its node
        check_hardware([cfg], overrides, here, models=False)  # the GPU, before composing every point
    grid = cfg.sweep.mode == "grid"
    points = expand(cfg, overrides) if grid else None  # validates every point
    groups = None if grid else capacity_groups(cfg, overrides)
    if not launcher.remote:
        check_hardware([p.cfg for p in points] if grid else [p.cfg for _, p in groups], overrides, here)
    hardware = None if launcher.remote else hardware_label(device_here(cfg.device, here), here["gpu_name"])
    path = results_path(cfg, hardware)
    if path.name != f"{cfg.sweep.name}.jsonl":
        others = ", ".join(foreign_hardware(path.with_name(f"{cfg.sweep.name}.jsonl"), hardware))
        print(
            f"{cfg.sweep.name}.jsonl holds points measured on {others}; this machine's ({hardware}) "
            f"go to {path}",
            file=sys.stderr,
        )
    # resume only what was measured on this hardware (a point done on another GPU is not done
    # here); on a cluster, whose nodes only the jobs see, every recorded point counts as done;
    # with sweep.rerun none does
    done = {
        k: r
        for k, r in results.recorded_points(path).items()
        if (hardware is None or record_hardware(r) == hardware) and not cfg.sweep.rerun
    }
    return _Prepared(cfg, launcher, points, groups, path, done)


def plan(overrides: list[str]) -> str:
    """What the sweep would start (`--dry-run`): its launcher's jobs, nothing run or submitted."""
    p = _prepare(overrides)
    points = p.points if p.points is not None else [first for _, first in p.groups]
    todo = [point for point in points if point.id not in p.done]
    text = p.launcher.plan(todo)
    if p.points is None:
        text += "\n(a capacity search: these are its first tries; each next batch waits for the last)"
    skipped = len(points) - len(todo)
    return text + (f"\n{skipped_note(skipped, len(points), p.path, overrides)}" if skipped else "")


def rerun_command(overrides: list[str]) -> str:
    """The command line that runs the same sweep again, its recorded points included."""
    kept = [o for o in overrides if not o.startswith("sweep.rerun=")]
    return shlex.join(["python", "-m", "harness", "sweep", *kept, "sweep.rerun=true"])


def skipped_note(skipped: int, total: int, path: Path, overrides: list[str]) -> str:
    """What a sweep that skipped recorded points says: how many, and how to run them again."""
    points = "point was" if total == 1 else "points were"
    text = (
        f"{skipped} of {total} {points} recorded earlier in {relative(path)}: skipped, not measured "
        "again. To measure them again (the new records are appended; a table shows the latest):"
    )
    lines = textwrap.wrap(text, width=100, break_long_words=False, break_on_hyphens=False)
    return "\n".join([*lines, f"  {rerun_command(overrides)}"])


def execute(overrides: list[str]) -> SweepRun:
    """Run (or resume) the sweep the overrides compose."""
    p = _prepare(overrides)
    local.reset_stop()  # a sweep stopped earlier in this process does not stop this one
    git = env.git_info()
    progress = Progress(len(p.points) if p.points is not None else None, p.cfg.sweep.name)
    try:
        if p.points is not None:
            _run_grid(p.points, git, p.path, p.done, progress, p.launcher)
        else:
            _run_capacity(p.cfg, overrides, git, p.path, p.done, progress, p.groups, p.launcher)
    finally:
        progress.close()
    return SweepRun(p.path, progress.records, progress.skipped)


def run_sweep(overrides: list[str]) -> Path:
    """Run (or resume) the sweep the overrides compose; returns the results file."""
    return execute(overrides).path
