"""Running a point on this machine: a fresh worker subprocess per point, always a record back.

`run_isolated` starts `python -m harness.run.worker` (torchrun for `gpus=N`, see launch.py) in its
own process group, under the point's timeout, so nothing of one point reaches the next and a hung
or crashed worker is killed whole. A worker that dies without a record becomes an `error` (or
`oom`, if its stderr says so) with the tail of its stderr (`crash_record`). `run_here` adds the
check that needs no subprocess: a method that cannot run here is recorded `unavailable`. It is
what a local sweep runs for each point and what a Slurm job runs on its node (slurm.py).

This is the sweep's parent side: it makes the records of points that left none through
`harness.run.record` and never imports the worker's modules (runner, measure, models...).

A sweep starts its points through a `Launcher`; `LocalLauncher` (`launcher=local`) runs them here,
one after the other or several at once, and on Ctrl-C kills every worker still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol

from harness import results
from harness.run import config as config_mod
from harness.run import env, launch, methods
from harness.run import record as point_record
from harness.run.env import REPO
from harness.run.grid import Point


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


def reset_stop() -> None:
    """Forget the Ctrl-C of an earlier sweep in this process, so that it does not stop the next one."""
    _stopping.clear()


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


def crash_record(
    point: Point, git: dict[str, Any], status: str, error: str, device: str | None = None
) -> dict[str, Any]:
    """The record of a point that left none of its own (`device`: None, the one it resolves to here)."""
    device = device or env.resolve_device(point.cfg.device)
    return point_record.failed(point.cfg, point.id, device, git, status, error).to_json()


def run_isolated(point: Point, git: dict[str, Any]) -> dict[str, Any]:
    """Run one point in a fresh worker subprocess; always returns a record."""
    device = env.resolve_device(point.cfg.device)
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
            return crash_record(point, git, "error", f"timeout: killed after {point.cfg.timeout_s:g} s")
        except BaseException:  # Ctrl-C: the worker is in its own process group and would outlive us
            _kill_group(proc)
            raise
        finally:
            with _live_lock:
                _live_workers.discard(proc)
        if _stopping.is_set():  # killed by the Ctrl-C of a concurrent sweep, not by its own fault
            raise SweepInterrupted(point.id)
        if gpus > 1 and (ranks := launch.rank_records(record_path, gpus)):
            return point_record.merge_ranks(ranks)
        if record_path.exists():
            return results.read_one(record_path)
    status = "oom" if "out of memory" in stderr.lower() else "error"
    tail = stderr.strip()[-2000:] or "(no stderr)"
    return crash_record(point, git, status, f"worker exited with code {proc.returncode}: {tail}")


def run_here(point: Point, git: dict[str, Any]) -> dict[str, Any]:
    """Run one point on this machine: `unavailable` without a subprocess when its method cannot
    run here, else in a fresh worker (`run_isolated`). What a local point and a Slurm job run."""
    device = env.resolve_device(point.cfg.device)
    method = point.cfg.method
    reason = methods.unavailable_reason(
        method.name, config_mod.to_dict(method.options), device, method.cuda_graph
    )
    if not reason:
        return run_isolated(point, git)
    return crash_record(point, git, "unavailable", reason, device)


class Launcher(Protocol):
    """How a sweep's points are started. `run` yields each point with its record as it finishes;
    the sweep appends the records (one process writes the file, so its lines never interleave)."""

    remote: bool  # True: the points run on other machines, whose hardware this one cannot check

    def run(self, points: list[Point], git: dict[str, Any]) -> Iterator[tuple[Point, dict[str, Any]]]: ...

    def plan(self, points: list[Point]) -> str: ...  # what `run` would start, for --dry-run


class LocalLauncher:
    """`launcher=local`: each point in a fresh worker subprocess here, one after the other, or
    `concurrent` at once (convergence sweeps: threads that each wait on their worker)."""

    remote = False

    def __init__(self, concurrent: int = 1) -> None:
        self.concurrent = concurrent

    def run(self, points: list[Point], git: dict[str, Any]) -> Iterator[tuple[Point, dict[str, Any]]]:
        if self.concurrent == 1:
            for point in points:
                yield point, {**run_here(point, git), **point_record.job_fields("local")}
            return
        pool = ThreadPoolExecutor(max_workers=self.concurrent, thread_name_prefix="point")
        try:
            futures = {pool.submit(run_here, point, git): point for point in points}
            for future in as_completed(futures):
                yield futures[future], {**future.result(), **point_record.job_fields("local")}
        except BaseException:  # Ctrl-C: kill every running worker, as in the serial case
            pool.shutdown(wait=False, cancel_futures=True)  # no point starts from here on
            _kill_live_workers()
            pool.shutdown(wait=True)  # the threads return once their worker is dead
            raise
        pool.shutdown()

    def plan(self, points: list[Point]) -> str:
        lines = [f"would run {len(points)} point(s) on this machine, each in a fresh subprocess:"]
        return "\n".join([*lines, *(f"  {p.id}" for p in points)])
