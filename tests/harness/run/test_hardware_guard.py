"""A sweep refuses, before any point runs, hardware this machine lacks, and keeps each machine's
records in a file of its own.

The machine is faked (`env.machine` replaced by one of the dicts below), so these tests say the
same on a CPU host and on the GPU machine; workers are replaced by a stand-in (no subprocess), and
no model is built (the parameter count comes from the meta device).
"""

import re
import shlex

import pytest

from harness import results
from harness.run import env, grid, hardware, local, sweep
from harness.run import record as point_record
from harness.run.config import ConfigError, compose_config, group_choices

CPU_ONLY = {"gpu_name": None, "gpu_count": 0, "gpu_memory_gib": None, "host_memory_gib": 16.0}
H200 = {"gpu_name": "NVIDIA H200", "gpu_count": 1, "gpu_memory_gib": 139.8, "host_memory_gib": 2000.0}
H200_X2 = dict(H200, gpu_count=2)
A100_80 = {
    "gpu_name": "NVIDIA A100-SXM4-80GB",
    "gpu_count": 1,
    "gpu_memory_gib": 79.2,
    "host_memory_gib": 1000.0,
}
A100_40 = dict(A100_80, gpu_name="NVIDIA A100-SXM4-40GB", gpu_memory_gib=39.4)
L4 = {"gpu_name": "NVIDIA L4", "gpu_count": 1, "gpu_memory_gib": 22.0, "host_memory_gib": 100.0}

TINY = [
    "sweep.models=[tiny-llama]",
    "sweep.methods=[fused_adamw]",
    "sweep.batch_sizes=[1]",
    "sweep.seq_lens=[16]",
]


def _check(machine, overrides):
    """check_hardware on every point of the sweep the overrides compose (no run)."""
    cfg = compose_config(overrides)
    if cfg.sweep.mode == "grid":
        cfgs = [p.cfg for p in grid.expand(cfg, overrides)]
    else:
        cfgs = [p.cfg for _, p in grid.capacity_groups(cfg, overrides)]
    hardware.check_hardware(cfgs, overrides, machine)


def _no_worker(point, git):
    raise AssertionError(f"a point ran: {point.id}")


def test_a_gpu_experiment_on_a_machine_without_its_gpu_fails_before_any_point(tmp_path, monkeypatch, capsys):
    """The 8B Table-1 sweep on a CPU host: exit 2 with where to run it, no point run, nothing written."""
    from harness.__main__ import main

    monkeypatch.setattr(env, "machine", lambda: CPU_ONLY)
    monkeypatch.setattr(local, "run_isolated", _no_worker)
    assert main(["sweep", "+exp=llama8b_h200", f"results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "+exp=llama8b_h200 cannot run on this machine" in err
    assert "for an NVIDIA H200 (gpu=h200), and this machine has no CUDA device" in err
    assert "python -m harness sweep +exp=llama8b_h200 gpu=cpu device=cpu 'sweep.models=[tiny-llama]'" in err
    assert "python -m harness sweep +exp=smoke" in err
    assert not list(tmp_path.glob("*.jsonl"))


@pytest.mark.parametrize(
    "machine, overrides, refusal",
    [
        (H200, ["+exp=llama8b_h200", *TINY], None),
        (A100_80, ["+exp=llama8b_h200", *TINY], "this machine's GPU is an NVIDIA A100-SXM4-80GB, 79 GiB"),
        (H200, ["+exp=tp2_h200", *TINY], "gpus=2: its points need 2 GPUs, and this machine has 1"),
        (H200_X2, ["+exp=tp2_h200", *TINY], None),
        (H200, ["+exp=capacity_a100_40gb", *TINY], None),  # emulated under a cap on a larger card
        (A100_80, ["+exp=capacity_a100_40gb", *TINY], None),
        (A100_40, ["+exp=capacity_a100_40gb", *TINY], None),  # a real 40 GB card: 39.4 GiB
        (
            L4,
            ["+exp=capacity_a100_40gb", *TINY],
            "at least 40 GiB, capped to 40 GiB), and this machine's GPU",
        ),
        (CPU_ONLY, ["+exp=smoke", *TINY], None),
        (H200, ["+exp=smoke", *TINY], None),  # device=cpu: the CPU of a GPU machine
        (CPU_ONLY, ["+exp=convergence_smoke"], None),
        (H200, ["gpu=cpu", "model=tiny-llama"], "gpu=cpu, but device=auto runs the points on the GPU here"),
        (H200, ["gpu=h200", "device=cpu", "model=tiny-llama"], "gpu=h200 is a GPU, but device=cpu"),
        (CPU_ONLY, ["gpu=h200", "device=cuda", "model=tiny-llama"], "this machine has no CUDA device"),
        # the weights alone: 14.8e9 parameters in fp32 are 55 GiB
        (
            CPU_ONLY,
            ["+exp=smoke", *TINY, "sweep.models=[qwen3-14b]", "dtype=fp32"],
            "more than the 16.0 GiB of this machine's host",
        ),
        (
            H200,
            ["gpu=a100_40gb", "model=qwen3-14b", "dtype=fp32"],
            "55.0 GiB, more than the 40.0 GiB of gpu=a100_40gb's",
        ),
        (H200, ["gpu=h200", "model=qwen3-14b", "dtype=fp32"], None),
    ],
    ids=lambda v: v["gpu_name"] or "cpu" if isinstance(v, dict) else None,
)
def test_what_this_machine_cannot_run_is_refused(machine, overrides, refusal):
    if refusal is None:
        _check(machine, overrides)
    else:
        with pytest.raises(ConfigError, match="cannot run on this machine") as e:
            _check(machine, overrides)
        assert refusal in str(e.value)


@pytest.mark.parametrize("exp", group_choices("exp"))
def test_the_refusal_says_a_command_that_runs_here(exp):
    """On a CPU host, every experiment either runs or names a command that passes the same check."""
    overrides = [f"+exp={exp}"]
    try:
        hardware.check_hardware([compose_config(overrides)], overrides, CPU_ONLY, models=False)
        return  # a CPU experiment
    except ConfigError as e:
        message = str(e)
    cfg = compose_config(overrides)
    if cfg.convergence.enabled:  # the miniature of the same protocol, branched or not
        (smoke,) = re.findall(r"python -m harness sweep (\+exp=\w+)$", message, re.MULTILINE)
        miniature = compose_config([smoke])
        assert bool(miniature.convergence.branch_every) == bool(cfg.convergence.branch_every)
        hardware.check_hardware([miniature], [smoke], CPU_ONLY)
        return
    (line,) = [
        x for x in message.splitlines() if x.strip().startswith(f"python -m harness sweep +exp={exp} ")
    ]
    suggested = shlex.split(line)[4:]
    cfg = compose_config(suggested)
    assert cfg.gpu.name == "cpu" and cfg.device == "cpu" and list(cfg.sweep.models) == ["tiny-llama"]
    assert cfg.results_dir == "results/smoke" and cfg.sweep.scratch  # never the committed results
    hardware.check_hardware([cfg], suggested, CPU_ONLY)


# --- results per hardware -------------------------------------------------------------------------


def test_one_point_on_a_machine_without_its_gpu_is_refused_with_a_run_that_works_here(
    tmp_path, monkeypatch, capsys
):
    """`python -m harness run` checks the hardware as a sweep does, and words its advice as a run."""
    from harness.__main__ import main

    monkeypatch.setattr(env, "machine", lambda: CPU_ONLY)
    monkeypatch.setattr(local, "run_isolated", _no_worker)
    assert main(["run", "method=forge_int8", "model=qwen3-4b", f"results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "this point cannot run on this machine" in err
    advice = err.strip().splitlines()[-1].split()
    assert advice[:4] == ["python", "-m", "harness", "run"] and "model=tiny-llama" in advice
    assert "model=qwen3-4b" not in advice and not list(tmp_path.iterdir())


def _fake_worker(machine):
    """A stand-in for run_isolated: an ok record, stamped as the machine would stamp it."""
    calls = []

    def run(point, git):
        calls.append(point.id)
        device = "cuda" if machine["gpu_count"] and point.cfg.device != "cpu" else "cpu"
        record = point_record.for_point(point.cfg, point.id, device)
        return record.set(status="ok", gpu_name=machine["gpu_name"] if device == "cuda" else None).to_json()

    return run, calls


def _sweep(tmp_path, *extra):
    return [
        f"results_dir={tmp_path}",
        "sweep.name=t",
        "model=tiny-llama",
        "method=no_optimizer",
        "seq_len=16",
        *extra,
    ]


def _measured_on(tmp_path, overrides, gpu_name, device="cuda"):
    """results/t.jsonl holding the sweep's own point, as measured on another machine."""
    point = grid.make_point(overrides)
    record = point_record.for_point(point.cfg, point.id, device).set(status="ok", gpu_name=gpu_name)
    results.append(tmp_path / "t.jsonl", record.to_json())
    return (tmp_path / "t.jsonl").read_bytes()


def test_a_point_measured_on_another_gpu_is_neither_done_nor_appended_to(tmp_path, monkeypatch, capsys):
    """The 40 GB emulation measured on an H200, run again on an A100-80GB: the same point id, other
    hardware. It runs here, into a file of its own; the H200's file is left as it was."""
    overrides = _sweep(tmp_path, "gpu=a100_40gb")
    before = _measured_on(tmp_path, overrides, "NVIDIA H200")
    run, calls = _fake_worker(A100_80)
    monkeypatch.setattr(env, "machine", lambda: A100_80)
    monkeypatch.setattr(local, "run_isolated", run)
    path = sweep.run_sweep(overrides)
    assert path == tmp_path / "t-nvidia-a100-sxm4-80gb.jsonl"
    assert "t.jsonl holds points measured on NVIDIA H200" in capsys.readouterr().err
    assert (tmp_path / "t.jsonl").read_bytes() == before
    assert len(calls) == 1 and [r["gpu_name"] for r in results.read(path)] == ["NVIDIA A100-SXM4-80GB"]
    assert sweep.run_sweep(overrides) == path and len(calls) == 1  # resumes its own file


def test_a_cpu_run_of_a_gpu_sweep_writes_its_own_file(tmp_path, monkeypatch):
    """The GPU sweep's name on a CPU (its tiny form): the GPU rows are not appended to."""
    before = _measured_on(tmp_path, _sweep(tmp_path), "NVIDIA H200")
    run, calls = _fake_worker(CPU_ONLY)
    monkeypatch.setattr(env, "machine", lambda: CPU_ONLY)
    monkeypatch.setattr(local, "run_isolated", run)
    path = sweep.run_sweep(_sweep(tmp_path, "gpu=cpu", "device=cpu"))
    assert path == tmp_path / "t-cpu.jsonl" and len(calls) == 1
    assert (tmp_path / "t.jsonl").read_bytes() == before


def test_the_same_hardware_resumes_and_appends_to_the_sweeps_file(tmp_path, monkeypatch):
    overrides = _sweep(tmp_path, "gpu=h200")
    _measured_on(tmp_path, overrides, "NVIDIA H200")
    run, calls = _fake_worker(H200)
    monkeypatch.setattr(env, "machine", lambda: H200)
    monkeypatch.setattr(local, "run_isolated", run)
    assert sweep.run_sweep(overrides) == tmp_path / "t.jsonl" and calls == []  # recorded: skipped
    assert sweep.run_sweep([*overrides, "batch_size=2"]) == tmp_path / "t.jsonl" and len(calls) == 1
    assert len(results.read(tmp_path / "t.jsonl")) == 2


def test_machine_reports_the_host_memory():
    here = env.machine()
    assert set(here) == {"gpu_name", "gpu_count", "gpu_memory_gib", "host_memory_gib"}
    assert here["host_memory_gib"] > 0.5 and here["gpu_count"] >= 0
