"""The launch-cost scripts run on a CPU: `measure_launch_host.py` (the Python part of a launch) as
it is, `measure_launch_breakdown.py` as a dry run on Triton's interpreter (its figures are only
meaningful on the GPU machine; here it checks that every row runs and the JSON is written)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the scripts decide
    env["OUT"] = str(out)
    cmd = [sys.executable, str(REPO / "scripts" / script), *args]
    return subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=600)


def test_launch_host_measures_the_python_part(tmp_path):
    done = _run("measure_launch_host.py", out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FORGE wrapper:" in done.stdout and "Triton's Python dispatch" in done.stdout


def test_launch_breakdown_dry_run(tmp_path):
    done = _run("measure_launch_breakdown.py", "--tiny", out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "launch_breakdown.json").read_text())
    assert set(record["rows"]) >= {
        "mm",
        "raw launch",
        "wgrad_update",
        "ForgeLinear fwd+bwd",
        "ForgeLinear fwd+bwd, backward on this thread, no kernel",
    }
    assert "ForgeLinearFunctionBackward" in record["torch_profile"]
    assert all(row["host_us"] > 0 and row["wall_us"] >= row["host_us"] for row in record["rows"].values())


def test_launch_breakdown_refuses_a_cpu_without_dry_run(tmp_path):
    done = _run("measure_launch_breakdown.py", out=tmp_path)
    assert done.returncode == 2 and "GPU machine" in done.stdout


def test_the_kernel_probes_say_they_need_a_gpu_and_the_warp_specialized_one_builds_here(tmp_path):
    """`probe_epilogue_bytes.py`, `probe_ws_kernel.py`, `probe_ws_exactness.py`, `probe_ws_bounds.py`
    and `probe_elementwise.py` run GPU kernels:
    without one they say so and exit 2; `probe_ws_kernel.py --build` compiles its Gluon kernel for
    sm_90 on this machine."""
    for script in (
        "probe_epilogue_bytes.py",
        "probe_ws_kernel.py",
        "probe_ws_exactness.py",
        "probe_ws_bounds.py",
        "probe_elementwise.py",
    ):
        done = _run(script, out=tmp_path)
        assert done.returncode == 2 and "GPU" in done.stdout, done.stdout + done.stderr[-2000:]
    done = _run("probe_ws_kernel.py", "--build", out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout[done.stdout.index("{") :])
    assert built["spills"] == 0 and built["hgmma"] > 0 and built["shared_bytes"] <= 227 * 1024


def test_the_elementwise_probe_dry_run_times_every_block_shape(tmp_path):
    """`probe_elementwise.py --tiny` runs its points on Triton's interpreter at tiny shapes: one
    JSONL row per state dtype and parameter, each with the shipped launch, the block shapes and the
    same-bytes pass timed, and the weights still finite after every run."""
    done = _run("probe_elementwise.py", "--tiny", out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("elementwise-*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["state_dtype"], r["shape_name"]) for r in rows] == [
        ("bf16", "embedding"),
        ("bf16", "norm"),
        ("int8", "embedding"),
        ("int8", "norm"),
    ]
    for r in rows:
        timed = [k for k in r if k.startswith("block_") and k.endswith("_ms")]
        assert r["shipped_ms"] > 0 and r["foreach_same_bytes_ms"] > 0 and len(timed) >= 2, r
