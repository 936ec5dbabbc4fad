"""Sweeps: expand the grid, validate every point, run each in a fresh subprocess, record, resume.

    python -m harness sweep +exp=llama8b_h200            # conf/exp/llama8b_h200.yaml

1. `expand` turns the composed config's `sweep` lists into points (methods x models x batch
   sizes x sequence lengths x activation checkpointing) and composes each point's own config
   through Hydra, so every bad name or value fails before the first point runs.
2. The machine is checked before any point runs (`check_hardware`): a sweep for a GPU this
   machine lacks (gpu=h200 without an H200, any GPU on a machine without CUDA, fewer GPUs than
   `gpus`), or whose model's weights alone exceed the device's memory (or, on a CPU, the host's),
   is refused with a ConfigError that says where and how it can run.
3. Points already in `results/<sweep>.jsonl` are skipped: an interrupted sweep resumes. Records
   are kept per hardware: a file that holds points measured on other hardware (another GPU, or
   a GPU where this run uses the CPU) is never appended to; this machine's points go to
   `results/<sweep>-<hardware>.jsonl` (say `llama8b_h200-nvidia-a100-sxm4-80gb.jsonl`), and only
   points measured on this hardware count as done.
4. Each remaining point runs in `python -m harness.run.worker` (`run_isolated`), under a timeout, in
   its own process group. A method that cannot run here is recorded `unavailable` without a
   subprocess. A worker that dies without a record becomes an `error` (or `oom`, if its stderr
   says so) with the tail of its stderr. Nothing a point does stops the sweep.
5. Each record is appended atomically (`results.append`) and summarized on one line.

Where the points run is the launcher's business (`launcher=`, conf/launcher/): `LocalLauncher`
runs them here as above; `launcher=slurm` submits each as a Slurm job that runs the same
`run_here` on a node (harness.run.slurm), its hardware checked there rather than here. Either
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

import contextlib
import fnmatch
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig

from harness import results
from harness.run import config as config_mod
from harness.run import env, launch, methods
from harness.run.config import CONF_DIR, ConfigError, compose_config, group_choices

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
    ac += "/chunked" if cfg.model.chunked_loss else ""  # another loss: another point, not a resume
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


def _crash_record(
    point: Point, git: dict[str, Any], status: str, error: str, device: str | None = None
) -> dict[str, Any]:
    """The record of a point that left none of its own (`device`: None, the one it resolves to here)."""
    from harness.run import runner

    device = device or runner.resolve_device(point.cfg.device)
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


def run_here(point: Point, git: dict[str, Any]) -> dict[str, Any]:
    """Run one point on this machine: `unavailable` without a subprocess when its method cannot
    run here, else in a fresh worker (`run_isolated`). What a local point and a Slurm job run."""
    from harness.run import runner

    device = runner.resolve_device(point.cfg.device)
    method = point.cfg.method
    reason = methods.unavailable_reason(
        method.name, config_mod.to_dict(method.options), device, method.cuda_graph
    )
    if not reason:
        return run_isolated(point, git)
    record = runner.stamp_env(runner.base_record(point.cfg, point.id, device), device, git)
    record.update(status="unavailable", error=reason)
    return record


def job_fields(launcher: str, job_id: str | None = None) -> dict[str, Any]:
    """Where a point ran: the record's `launcher`, `slurm_job_id` and `node` (this host)."""
    return {"launcher": launcher, "slurm_job_id": job_id, "node": socket.gethostname()}


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
                yield point, {**run_here(point, git), **job_fields("local")}
            return
        pool = ThreadPoolExecutor(max_workers=self.concurrent, thread_name_prefix="point")
        try:
            futures = {pool.submit(run_here, point, git): point for point in points}
            for future in as_completed(futures):
                yield futures[future], {**future.result(), **job_fields("local")}
        except BaseException:  # Ctrl-C: kill every running worker, as in the serial case
            pool.shutdown(wait=False, cancel_futures=True)  # no point starts from here on
            _kill_live_workers()
            pool.shutdown(wait=True)  # the threads return once their worker is dead
            raise
        pool.shutdown()

    def plan(self, points: list[Point]) -> str:
        lines = [f"would run {len(points)} point(s) on this machine, each in a fresh subprocess:"]
        return "\n".join([*lines, *(f"  {p.id}" for p in points)])


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
    """results/<sweep>.jsonl; a scratch directory gets a .gitignore so its files stay untracked.

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


# --- hardware: refuse what this machine cannot run, keep each machine's records apart ----------

CAP_SLACK = 0.95  # a card sold as N GB reports a little less than N GiB (an H100-80GB: 79.6 GiB)
WEIGHT_BYTES = {"bf16": 2, "fp32": 4}


def hardware_label(device: str, gpu_name: str | None) -> str:
    """What a record was measured on: "cpu", or the GPU's name as NVML gives it ("NVIDIA H200")."""
    return "cpu" if device == "cpu" else (gpu_name or "unnamed CUDA GPU")


def record_hardware(record: dict[str, Any]) -> str | None:
    """`hardware_label` of a record (its `device` and `gpu_name`); None when it says neither."""
    device = record.get("device")
    return None if device is None else hardware_label(device, record.get("gpu_name"))


def foreign_hardware(path: Path, hardware: str) -> list[str]:
    """The hardware, other than `hardware`, that the records of a results file were measured on."""
    found = {record_hardware(r) for r in results.iter_records(path)} - {hardware}
    return sorted(h or "unknown hardware" for h in found)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _device_here(device: str, here: dict[str, Any]) -> str:
    """The device a point runs on here: device=auto is CUDA when a GPU is visible."""
    if device == "auto":
        return "cuda" if here["gpu_count"] else "cpu"
    return device


def _card(gpu: Any) -> str:
    """What a conf/gpu entry stands for, in words."""
    if gpu.name == "cpu":
        return "the CPU"
    if gpu.memory_cap_gib is not None:
        return (
            f"an emulated {gpu.name.upper().replace('_', '-')} (gpu={gpu.name}: a CUDA GPU of at "
            f"least {gpu.memory_cap_gib:g} GiB, capped to {gpu.memory_cap_gib:g} GiB)"
        )
    return f"an NVIDIA {gpu.name.split('_')[0].upper()} (gpu={gpu.name})"


def _gpus_here(here: dict[str, Any]) -> str:
    if not here["gpu_count"]:
        return "this machine has no CUDA device"
    if here["gpu_name"] is None:
        return f"this machine has {here['gpu_count']} CUDA device(s) of unknown name"
    memory = f", {here['gpu_memory_gib']:.0f} GiB" if here["gpu_memory_gib"] else ""
    return f"this machine's GPU is an {here['gpu_name']}{memory}"


def _hardware_problem(gpu: Any, device: str, gpus: int, here: dict[str, Any]) -> str | None:
    """Why a point for conf/gpu `gpu` on `device` (and `gpus` GPUs) cannot run here; None if it can.

    A real card (no memory cap) must be the GPU here: conf/gpu/NAME's first word (h200) in its
    name. An emulated card needs a GPU with at least its cap. The CPU needs device=cpu."""
    runs_on = _device_here(device, here)
    if gpu.name == "cpu":
        if runs_on == "cuda":
            return (
                f"gpu=cpu, but device={device} runs the points on the GPU here "
                "(add device=cpu to measure the CPU, or name the GPU with gpu=NAME)"
            )
        return None
    if runs_on == "cpu" and here["gpu_count"]:
        return (
            f"gpu={gpu.name} is a GPU, but device=cpu runs the points on the CPU "
            "(drop device=cpu, or set gpu=cpu)"
        )
    if not here["gpu_count"]:
        return f"it is for {_card(gpu)}, and {_gpus_here(here)}"
    if gpus > here["gpu_count"]:
        return f"gpus={gpus}: its points need {gpus} GPUs, and this machine has {here['gpu_count']}"
    name, memory = here["gpu_name"], here["gpu_memory_gib"]
    if gpu.memory_cap_gib is None:
        wanted = gpu.name.split("_")[0].lower()
        if name is not None and wanted not in re.sub(r"[^a-z0-9]", "", name.lower()):
            return f"it is for {_card(gpu)}, and {_gpus_here(here)}"
    elif memory is not None and memory < CAP_SLACK * gpu.memory_cap_gib:
        return f"it is for {_card(gpu)}, and {_gpus_here(here)}"
    return None


_n_params: dict[tuple[str, str | None], int | None] = {}


def _memory_problem(cfg: DictConfig, here: dict[str, Any]) -> str | None:
    """Why the point's model cannot fit here: its weights alone exceed the memory it would use
    (the GPU's, or its cap; the host's on a CPU). Every method holds at least the weights."""
    from harness.run import models

    key = (cfg.model.name, cfg.model.path)
    if key not in _n_params:
        _n_params[key] = models.n_params_of(cfg.model)
    n = _n_params[key]
    if n is None:  # a checkpoint: its size would have to be read
        return None
    dtype = config_mod.weight_dtype(cfg)
    weights = n * WEIGHT_BYTES[dtype] / cfg.gpus / 2**30
    if _device_here(cfg.device, here) == "cpu":
        limit, where = here["host_memory_gib"], "this machine's host memory"
    else:
        limits = [(here["gpu_memory_gib"], f"the {here['gpu_name'] or 'GPU'}'s memory")]
        if cfg.gpu.memory_cap_gib is not None:
            limits.append((cfg.gpu.memory_cap_gib, f"gpu={cfg.gpu.name}'s memory cap"))
        limits = [(v, w) for v, w in limits if v is not None]
        limit, where = min(limits, default=(None, ""))
    if limit is None or weights <= limit:
        return None
    per_gpu = " per GPU" if cfg.gpus > 1 else ""
    return (
        f"model={cfg.model.name} has {n / 1e9:.1f}B parameters: its {dtype} weights alone take "
        f"{weights:.1f} GiB{per_gpu}, more than the {limit:.1f} GiB of {where}"
    )


def _experiment(overrides: list[str]) -> str | None:
    return next((o.split("=", 1)[1] for o in overrides if re.match(r"^\+?exp=", o)), None)


TINY_CPU = [
    "gpu=cpu",
    "device=cpu",
    "sweep.models=[tiny-llama]",
    "sweep.seq_lens=[32]",
    "sweep.batch_sizes=[1]",
    "steps=3",
    "warmup_steps=1",
    "method.lr=1e-3",  # three steps on a tiny model: a step large enough that "the loss fell" is plain
    "results_dir=results/smoke",
    "sweep.scratch=true",
]


def tiny_cpu_overrides(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """The same sweep on the CPU, on the tiny Llama, in a few steps, into the scratch results."""
    mine = {o.split("=", 1)[0] for o in TINY_CPU} | {"gpus", "model", "seq_len", "batch_size"}
    if cfg.sweep.mode == "capacity":
        mine.add("sweep.max_batch_size")
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in mine]
    extra = ["gpus=1"] if cfg.gpus > 1 else []
    extra += ["sweep.max_batch_size=2"] if cfg.sweep.mode == "capacity" else []
    return [*kept, *TINY_CPU, *extra]


# One point (`python -m harness run`) the same way: the tiny Llama on the CPU, in a few steps.
TINY_CPU_POINT = [
    "gpu=cpu",
    "device=cpu",
    "model=tiny-llama",
    "seq_len=32",
    "batch_size=1",
    "steps=3",
    "warmup_steps=1",
    "method.lr=1e-3",
]


def tiny_cpu_point(overrides: list[str]) -> list[str]:
    mine = {o.split("=", 1)[0] for o in TINY_CPU_POINT} | {"gpus", "results_dir", "sweep.scratch"}
    return [*(o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in mine), *TINY_CPU_POINT]


def _command(overrides: list[str], verb: str = "sweep") -> str:
    return " ".join([f"python -m harness {verb}", *map(shlex.quote, overrides)])


def _runnable_gpus(cfg: DictConfig, here: dict[str, Any]) -> list[str]:
    """The conf/gpu choices whose hardware this machine has (for the device it would use)."""
    from omegaconf import OmegaConf

    names = []
    for name in group_choices("gpu"):
        gpu = OmegaConf.merge(config_mod.GpuConfig, OmegaConf.load(CONF_DIR / "gpu" / f"{name}.yaml"))
        device = "cpu" if name == "cpu" else "auto"
        if _hardware_problem(gpu, device, 1, here) is None:
            names.append(name)
    return names


def check_hardware(
    cfgs: list[DictConfig],
    overrides: list[str],
    here: dict[str, Any],
    models: bool = True,
    verb: str = "sweep",
) -> None:
    """Refuse, before any point runs, a sweep whose GPU or model this machine cannot hold.
    `here` is `env.machine()`; `models=False` checks the GPU only (the sweep's own config is
    enough for that: gpu, device and gpus are not axes of its grid). Raises ConfigError saying
    why and where it can run; `verb="run"` words it for one point (`python -m harness run`)."""
    if not cfgs:
        return
    cfg = cfgs[0]
    hardware = _hardware_problem(cfg.gpu, cfg.device, cfg.gpus, here)
    problems = [hardware] if hardware else []
    if not problems and models:
        problems += list(dict.fromkeys(filter(None, (_memory_problem(c, here) for c in cfgs))))
    if not problems:
        return
    exp = _experiment(overrides)
    what = f"+exp={exp}" if exp else ("this point" if verb == "run" else f"sweep {cfg.sweep.name!r}")
    lines = [f"{what} cannot run on this machine (nothing was run):", *(f"  - {p}" for p in problems)]
    if hardware:
        where = (
            f"a CUDA GPU of at least {cfg.gpu.memory_cap_gib:g} GiB"
            if cfg.gpu.memory_cap_gib
            else _card(cfg.gpu)
        )
        lines.append(
            f"Run it on a machine with {where}" + (f" ({cfg.gpus} of them)." if cfg.gpus > 1 else ".")
        )
        runnable = _runnable_gpus(cfg, here)
        if runnable:
            lines.append("This machine has the hardware of: " + ", ".join(f"gpu={g}" for g in runnable) + ".")
    else:
        lines.append(
            "Run it on a machine with more memory, or choose smaller models "
            "(sweep.models=[...]; `python -m harness list model` lists them)."
        )
    if verb == "run":
        lines.append("To try it here on the CPU, on a tiny model:")
        lines.append("  " + _command(tiny_cpu_point(overrides), "run"))
    elif cfg.convergence.enabled:
        lines.append("On a CPU, its run in miniature is: python -m harness sweep +exp=convergence_smoke")
    else:
        lines.append("To try it here on the CPU, on a tiny model:")
        lines.append("  " + _command(tiny_cpu_overrides(cfg, overrides)))
        lines.append("or run every CPU method on tiny models: python -m harness sweep +exp=smoke")
    raise ConfigError("\n".join(lines))


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
    points: list[Point], git: dict, path: Path, done: dict, progress: Progress, launcher: Launcher
) -> None:
    for point in points:
        if point.id in done:
            progress.point(done[point.id], False)
    for point, record in launcher.run([p for p in points if p.id not in done], git):
        progress.point(_keep(path, done, point, record), True)


def capacity_groups(cfg: DictConfig, overrides: list[str]) -> list[tuple[dict[str, Any], Point]]:
    """A capacity search's groups (every axis but the batch size), each with its batch-1 point
    (composed, so validated), excluded ones left out."""
    axes = _axes(cfg)
    axes.pop("batch_size")
    groups = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    firsts = [(v, make_point(overrides, batch_size=1, **v)) for v in groups]
    return [(v, p) for v, p in firsts if not excluded(p.id, cfg)]


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
    finished (those recorded by an earlier run of the sweep included)."""

    path: Path
    records: list[dict[str, Any]]


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
    hardware = None if launcher.remote else hardware_label(_device_here(cfg.device, here), here["gpu_name"])
    path = results_path(cfg, hardware)
    if path.name != f"{cfg.sweep.name}.jsonl":
        others = ", ".join(foreign_hardware(path.with_name(f"{cfg.sweep.name}.jsonl"), hardware))
        print(
            f"{cfg.sweep.name}.jsonl holds points measured on {others}; this machine's ({hardware}) "
            f"go to {path}",
            file=sys.stderr,
        )
    # resume only what was measured on this hardware (a point done on another GPU is not done
    # here); on a cluster, whose nodes only the jobs see, every recorded point counts as done
    done = {
        k: r
        for k, r in results.recorded_points(path).items()
        if hardware is None or record_hardware(r) == hardware
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
    return text + (f"\n{skipped} point(s) already in {p.path} are skipped." if skipped else "")


def execute(overrides: list[str]) -> SweepRun:
    """Run (or resume) the sweep the overrides compose."""
    p = _prepare(overrides)
    _stopping.clear()  # a sweep stopped earlier in this process does not stop this one
    git = env.git_info()
    progress = Progress(len(p.points) if p.points is not None else None, p.cfg.sweep.name)
    try:
        if p.points is not None:
            _run_grid(p.points, git, p.path, p.done, progress, p.launcher)
        else:
            _run_capacity(p.cfg, overrides, git, p.path, p.done, progress, p.groups, p.launcher)
    finally:
        progress.close()
    return SweepRun(p.path, progress.records)


def run_sweep(overrides: list[str]) -> Path:
    """Run (or resume) the sweep the overrides compose; returns the results file."""
    return execute(overrides).path
