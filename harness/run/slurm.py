"""Sweeps on a Slurm cluster: each point one Slurm job, submitted and watched through submitit.

    python -m harness sweep +exp=llama8b_h200 launcher=slurm launcher.partition=gpu
    python -m harness sweep +exp=llama8b_h200 launcher=slurm launcher.partition=gpu --dry-run

submitit (the engine behind Hydra's submitit launcher) writes the sbatch script, pickles a
function call for each job, submits the jobs as one job array, and unpickles the function's
return value, or the reason it has none, when the job ends. Here the function is `run_job`: on
the node it runs the point exactly as a local sweep does (`local.run_here`: a fresh worker
subprocess under the point's timeout, torchrun for `gpus=N`), so the job returns the same record
a local point gives, plus where it ran (`launcher`, `slurm_job_id`, `node`).

What goes where:

- **Resources.** A job is one node, one task and the point's `gpus` GPUs (torchrun starts the
  ranks inside it), for the point's `timeout_s` plus 10 minutes unless `launcher.time` says
  otherwise; `partition`, `account`, `qos`, `cpus_per_task`, `mem_gb`, `constraint` and `setup`
  go to sbatch as they are. They are checked when the sweep is composed (config.py) and written
  into an sbatch script (`sbatch_script`) before anything is submitted; `--dry-run` prints it.
- **Records.** Only the submitting process writes the results file: it appends each record as
  its job finishes, so lines of concurrent jobs never interleave, and a resumed sweep skips the
  points already recorded, as a local one does. A point that fails inside its job (OOM, crash,
  timeout of the worker) is recorded by the job as it would be locally.
- **Jobs that Slurm ends.** A job killed from outside (time limit, preemption, node failure,
  cancellation) returns nothing; submitit raises `UncompletedJobError` and the job's state says
  why. The point is recorded `error` with that state (`oom` for Slurm's OUT_OF_MEMORY), except a
  preempted job, which is submitted once more first: preemption says nothing about the point.
- **Ctrl-C** cancels the sweep's jobs still queued or running; the same command submits again
  only what was not recorded.

`launcher.executor=local` or `debug` runs the same jobs on this machine, through submitit's
LocalExecutor (a process per job) or DebugExecutor (in this process): how the tests run a Slurm
sweep without a cluster, and how to debug a launch.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import submitit
from omegaconf import DictConfig
from submitit.core.utils import UncompletedJobError
from submitit.slurm.slurm import _convert_mem, _make_sbatch_string  # the script SlurmExecutor submits

from harness.run import env
from harness.run import record as point_record
from harness.run.env import REPO
from harness.run.errors import ConfigError
from harness.run.grid import Point
from harness.run.hardware import hardware_problem
from harness.run.local import crash_record, run_here
from harness.run.record import job_fields

PREEMPTION_RETRIES = 1  # a preempted job is submitted again this many times
POLL_S = {"slurm": 10.0, "local": 1.0, "debug": 0.0}  # how often the finished jobs are looked for
TIME_MARGIN_MIN = 10  # a job's default time: the point's timeout plus this (start-up, model build)


def executor_parameters(cfg: DictConfig) -> dict[str, Any]:
    """submitit's parameters for one point's job (generic names, and slurm_* for sbatch's own)."""
    launcher = cfg.launcher
    gpus = 0 if "cpu" in (cfg.device, cfg.gpu.name) else cfg.gpus
    params = {
        "name": f"harness-{cfg.sweep.name}",
        "timeout_min": launcher.time or math.ceil(cfg.timeout_s / 60) + TIME_MARGIN_MIN,
        "nodes": 1,
        "tasks_per_node": 1,  # torchrun, inside the job, starts one process per GPU
        "gpus_per_node": gpus if launcher.gpus_per_node is None else launcher.gpus_per_node,
        "cpus_per_task": launcher.cpus_per_task,
        "mem_gb": launcher.mem_gb,
        "slurm_partition": launcher.partition,
        "slurm_account": launcher.account,
        "slurm_qos": launcher.qos,
        "slurm_constraint": launcher.constraint,
        "slurm_array_parallelism": launcher.array_parallelism,
        "slurm_setup": list(launcher.setup) or None,
    }
    return {k: v for k, v in params.items() if v is not None}


# submitit's generic parameter names -> sbatch's (as SlurmExecutor renames them)
SBATCH_NAMES = {
    "name": "job_name",
    "timeout_min": "time",
    "tasks_per_node": "ntasks_per_node",
    "mem_gb": "mem",
}


def sbatch_script(cfg: DictConfig, jobs: int) -> str:
    """The sbatch script submitit would submit for `jobs` points (a job array when more than one)."""
    params = {SBATCH_NAMES.get(k, k.removeprefix("slurm_")): v for k, v in executor_parameters(cfg).items()}
    if "mem" in params:
        params["mem"] = _convert_mem(params["mem"])
    folder = job_folder(cfg) / "%j"
    try:
        return _make_sbatch_string(
            command=f"{sys.executable} -u -m submitit.core._submit {folder}",
            folder=folder,
            map_count=jobs if jobs > 1 else None,
            **params,
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"launcher: submitit refuses these Slurm options: {e}") from None


def job_folder(cfg: DictConfig) -> Path:
    """Where submitit keeps the sweep's job files and logs (a disk the nodes share)."""
    folder = Path(cfg.launcher.folder)
    return (folder if folder.is_absolute() else REPO / folder) / cfg.sweep.name


def make_executor(cfg: DictConfig) -> submitit.Executor:
    """submitit's executor for the sweep: Slurm's, or the local or debug one that mimics it here."""
    executor = submitit.AutoExecutor(folder=job_folder(cfg) / "%j", cluster=cfg.launcher.executor)
    executor.update_parameters(**executor_parameters(cfg))
    return executor


def run_job(point: Point, git: dict[str, Any], launcher: str) -> dict[str, Any]:
    """The job's function, on the node: the point as a local sweep runs it, and where it ran."""
    problem = hardware_problem(point.cfg.gpu, point.cfg.device, point.cfg.gpus, env.machine())
    if problem:  # a node of the wrong kind: say so rather than measure another card
        record = crash_record(point, git, "error", f"this node cannot run the point: {problem}")
    else:
        record = run_here(point, git)
    return {**record, **job_fields(launcher, submitit.JobEnvironment().job_id)}


class SlurmLauncher:
    """`launcher=slurm`: the sweep's points as one submitit job array, records as jobs finish."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.executor_name = cfg.launcher.executor
        self.remote = self.executor_name == "slurm"  # local and debug jobs run on this machine
        self.label = "slurm" if self.remote else f"submitit-{self.executor_name}"
        sbatch_script(cfg, 2)  # every option checked before anything is submitted

    def plan(self, points: list[Point]) -> str:
        setup = list(self.cfg.launcher.setup)
        lines = [
            f"would submit {len(points)} Slurm job(s) through submitit ({self.label}), one per point, "
            f"job files and logs in {job_folder(self.cfg)}; nothing was submitted.",
            "sbatch parameters:",
            *(f"  {line}" for line in sbatch_script(self.cfg, len(points)).splitlines() if "#SBATCH" in line),
            *(["setup, run before each job:", *(f"  {line}" for line in setup)] if setup else []),
            "jobs:",
            *(f"  {i:>4}  {p.id}" for i, p in enumerate(points)),
        ]
        return "\n".join(lines)

    def run(self, points: list[Point], git: dict[str, Any]) -> Iterator[tuple[Point, dict[str, Any]]]:
        if not points:
            return
        try:
            executor = make_executor(self.cfg)
        except RuntimeError as e:  # SlurmExecutor found no srun
            raise ConfigError(
                f"launcher=slurm: {e} Submit from a machine of the cluster, or run the jobs here "
                "with launcher.executor=local"
            ) from None
        with executor.batch():  # one job array
            jobs = [executor.submit(run_job, point, git, self.label) for point in points]
        print(f"submitted {len(jobs)} job(s): {jobs[0].job_id.split('_')[0]}", file=sys.stderr, flush=True)
        waiting = {job: (point, 0) for job, point in zip(jobs, points)}
        try:
            while waiting:
                finished = [job for job in waiting if job.done()]
                if not finished:
                    time.sleep(POLL_S[self.executor_name])
                for job in finished:
                    point, retries = waiting.pop(job)
                    record, preempted = self.outcome(job, point, git)
                    if preempted and retries < PREEMPTION_RETRIES:
                        again = executor.submit(run_job, point, git, self.label)
                        print(
                            f"{point.id}: job {job.job_id} was preempted, submitted again as {again.job_id}",
                            file=sys.stderr,
                        )
                        waiting[again] = (point, retries + 1)
                        continue
                    yield point, record
        except BaseException:  # Ctrl-C, or the sweep broke: no job left running unwatched
            for job in waiting:
                job.cancel(check=False)
            raise

    def outcome(self, job: submitit.Job, point: Point, git: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The job's record, and whether Slurm preempted it (then it has none of its own)."""
        try:
            return job.result(), False
        except UncompletedJobError as e:  # killed from outside, or run_job itself failed on the node
            state = str(job.state)
            reason = state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 1234" -> CANCELLED
            status = "oom" if reason == "OUT_OF_MEMORY" else "error"
            error = f"Slurm job {job.job_id} ended {state}: {str(e).strip()[-1500:]}"
            device = self._device(point) or env.resolve_device(point.cfg.device)
            record = point_record.failed(point.cfg, point.id, device, git, status, error)
            record.set(**job_fields(self.label, job.job_id))
            if self.remote:  # the node's, not this machine's: only its name is known
                record.set(gpu_name=None, node=job.get_info(mode="cache").get("NodeList"))
            return record.to_json(), reason == "PREEMPTED"

    def _device(self, point: Point) -> str | None:
        """The device a killed job's point was for: on a cluster, as its config says (device=auto
        is a GPU there, whatever this machine has); here, as it resolves here (None)."""
        if not self.remote:
            return None
        return "cpu" if "cpu" in (point.cfg.device, point.cfg.gpu.name) else "cuda"
