"""Sweeps through launcher=slurm, without a cluster.

submitit's LocalExecutor (`launcher.executor=local`) runs the jobs on this machine as Slurm would:
a pickled call to `slurm.run_job` in a process of its own, its return value read back. Slurm's own
verdicts (preemption, time limit) come from a fake executor whose jobs end the way sacct says
they did; no job reaches a cluster in any test.
"""

from __future__ import annotations

import contextlib
import socket

import pytest
from submitit.core.utils import UncompletedJobError

from harness import results
from harness.__main__ import main
from harness.run import record as point_record
from harness.run import slurm, sweep
from harness.run.config import ConfigError, compose_config

POINTS = ["+exp=smoke", "sweep.models=[tiny-llama]", "seq_len=16", "steps=2", "warmup_steps=0"]
# measured again, so not the same from one run to the next; and where the point ran
VARIES = {"time", "step_time_ms_median", "step_time_ms_min", "step_time_ms_p90", "step_times_ms"}
VARIES |= {"tokens_per_s", "mfu", "launcher", "slurm_job_id", "node"}


def _sweep(tmp_path, name, methods, *extra):
    return [*POINTS, f"results_dir={tmp_path / name}", f"sweep.methods=[{','.join(methods)}]", *extra]


def _slurm(tmp_path, *extra):
    return ["launcher=slurm", f"launcher.folder={tmp_path / 'submitit'}", *extra]


def test_a_slurm_sweep_records_what_a_local_one_does(tmp_path):
    methods = ["no_optimizer", "adalomo"]  # one that runs, one unavailable on a CPU
    local = results.read(sweep.run_sweep(_sweep(tmp_path, "local", methods)))
    jobs = _sweep(tmp_path, "slurm", methods, *_slurm(tmp_path, "launcher.executor=local"))
    path = sweep.run_sweep(jobs)
    remote = results.read(path)
    by_point = lambda records: {r["point"]: r for r in records}
    assert sorted(by_point(local)) == sorted(by_point(remote)) and len(remote) == 2
    for pid, mine in by_point(local).items():
        theirs = by_point(remote)[pid]
        assert list(mine) == list(theirs)  # the same fields, in the same order
        for record in (mine, theirs):
            record["config"].pop("results_dir")  # the test's two folders
        same = lambda record: {k: v for k, v in record.items() if k not in VARIES}
        assert same(mine) == same(theirs)
        assert mine["launcher"] == "local" and mine["slurm_job_id"] is None
        assert theirs["launcher"] == "submitit-local" and theirs["slurm_job_id"]
        assert mine["node"] == theirs["node"] == socket.gethostname()
    assert {r["status"] for r in remote} == {"ok", "unavailable"}
    sweep.run_sweep(jobs)  # resumed: every point recorded, nothing submitted again
    assert len(results.read(path)) == 2


class FakeJob:
    """A submitted job that ends as Slurm said: `ok` returns the point's record, any other state
    (PREEMPTED, TIMEOUT...) leaves no result, as a job killed from outside does."""

    def __init__(self, point, state, number):
        self.point, self.state, self.job_id = point, state, f"4242_{number}"

    def done(self):
        return True

    def result(self):
        if self.state != "ok":
            raise UncompletedJobError(f"Job {self.job_id} has not produced any output (state: {self.state})")
        made = point_record.for_point(self.point.cfg, self.point.id, "cpu").to_json()
        return {**made, "status": "ok", **point_record.job_fields("slurm", self.job_id)}

    def get_info(self, mode="force"):
        return {"NodeList": "gpu-node-07"}

    def cancel(self, check=True):
        raise AssertionError("a finished sweep cancels nothing")


class FakeExecutor:
    """Slurm as a script: each point's jobs end in the states given for its method, in order."""

    def __init__(self, script):
        self.script, self.submitted = script, []

    def batch(self):
        return contextlib.nullcontext()

    def submit(self, fn, point, git, launcher):
        assert fn is slurm.run_job and launcher == "slurm"
        tries = sum(p.id == point.id for p in self.submitted)
        self.submitted.append(point)
        return FakeJob(point, self.script[point.cfg.method.label][tries], len(self.submitted))


def test_killed_jobs_are_recorded_and_a_preempted_one_is_submitted_again(tmp_path, monkeypatch):
    script = {
        "no_optimizer": ["PREEMPTED", "ok"],  # preempted, then ran: its record is the job's
        "fused_adamw": ["TIMEOUT"],  # Slurm's time limit: recorded, not retried
        "adamw_in_backward": ["PREEMPTED", "PREEMPTED"],  # retried once only
    }
    executor = FakeExecutor(script)
    monkeypatch.setattr(slurm, "make_executor", lambda cfg: executor)
    overrides = _sweep(tmp_path, "fake", list(script), *_slurm(tmp_path, "launcher.partition=gpu"))
    path = sweep.run_sweep(overrides)
    rows = {r["method_label"]: r for r in results.read(path)}
    assert [p.cfg.method.label for p in executor.submitted].count("no_optimizer") == 2
    assert rows["no_optimizer"]["status"] == "ok" and rows["no_optimizer"]["slurm_job_id"] == "4242_4"
    assert rows["fused_adamw"]["status"] == "error" and "ended TIMEOUT" in rows["fused_adamw"]["error"]
    preempted = rows["adamw_in_backward"]
    assert preempted["status"] == "error" and "ended PREEMPTED" in preempted["error"]
    assert preempted["launcher"] == "slurm" and preempted["node"] == "gpu-node-07"
    assert preempted["slurm_job_id"] == "4242_5" and len(executor.submitted) == 5
    sweep.run_sweep(overrides)  # resumed: every point is recorded, nothing is submitted
    assert len(executor.submitted) == 5 and len(results.read(path)) == 3


@pytest.mark.parametrize(
    "overrides, message",
    [
        ("launcher=slurm launcher.time=-5", "launcher.time=-5 must be a positive number of minutes"),
        ("launcher=slurm launcher.gpus_per_node=0", "set launcher.gpus_per_node=1, or leave it null"),
        ("launcher=slurm launcher.partiton=gpu", "did you mean 'partition'"),
        ("launcher=slurm launcher.executor=pbs", "launcher.executor='pbs' is not valid; choose one of"),
        ("launcher.partition=gpu", "launcher.partition is a Slurm option, and the points run locally"),
    ],
    ids=["negative-time", "no-gpu-for-a-gpu-point", "unknown-key", "unknown-executor", "slurm-option-local"],
)
def test_a_bad_slurm_option_fails_before_anything_is_submitted(overrides, message, monkeypatch, capsys):
    monkeypatch.setattr(slurm, "make_executor", lambda cfg: pytest.fail("submitted"))
    overrides = ["+exp=llama8b_h200", *overrides.split()]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        compose_config(overrides)
    assert main(["sweep", *overrides]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("exp, gpus", [("llama8b_h200", 1), ("tp2_h200", 2)], ids=["one-gpu", "two-gpus"])
def test_dry_run_prints_the_jobs_and_their_sbatch_parameters(exp, gpus, tmp_path, monkeypatch, capsys):
    """Here, without a GPU or Slurm: the jobs are for the cluster's nodes, not for this machine."""
    monkeypatch.setattr(slurm, "make_executor", lambda cfg: pytest.fail("submitted"))
    overrides = [f"+exp={exp}", "sweep.methods=[fused_adamw,forge_bf16]", "sweep.models=[llama3.1-8b]"]
    overrides += ["sweep.batch_sizes=[1]", "sweep.seq_lens=[2048]", f"results_dir={tmp_path}"]
    overrides += ["launcher=slurm", "launcher.partition=h200", "launcher.account=lab"]
    assert main(["sweep", *overrides, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would submit 2 Slurm job(s)" in out and "nothing was submitted" in out
    flags = ["partition=h200", "account=lab", f"gpus-per-node={gpus}", "ntasks-per-node=1", "nodes=1"]
    flags += ["time=25", "array=0-1%2"]  # the points' timeout_s (900 s) plus 10 minutes; one array
    for flag in flags:
        assert f"#SBATCH --{flag}\n" in out, flag
    tp = f"/tp{gpus}" if gpus > 1 else ""
    for method in ("fused_adamw", "forge_bf16"):
        assert f"{method}/llama3.1-8b/b1/s2048{tp}/h200\n" in out
    assert not list(tmp_path.glob("*.jsonl"))  # nothing ran


def test_dry_run_of_a_local_sweep_lists_its_points(tmp_path, capsys):
    overrides = [*POINTS, "sweep.methods=[no_optimizer]", f"results_dir={tmp_path}"]
    assert main(["sweep", *overrides, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run 1 point(s) on this machine" in out and "no_optimizer/tiny-llama/b1/s16/cpu" in out
    assert not list(tmp_path.glob("*.jsonl"))
