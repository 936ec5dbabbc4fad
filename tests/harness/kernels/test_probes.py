"""The lab's GPU probes on a CPU: `launch_breakdown` and `elementwise` run as dry runs on Triton's
interpreter (their figures mean something only on a GPU; here every row must run and its record
be written), and without `--tiny` they say that they need a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _run(module: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # forge decides on a CPU
    env["OUT"] = str(out)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", f"harness.kernels.{module}", *args]
    return subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=600)


def _launch_breakdown(tmp_path, *args: str) -> dict:
    done = _run("launch_breakdown", *args, out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("launch-breakdown-*.json")  # named what-date-commit, as device-logs/ keeps it
    record = json.loads(path.read_text())
    assert record["env"]["cpu_model"] is not None and record["env"]["cpu_count"] >= 1  # the host it timed
    assert all(row["host_us"] > 0 and row["wall_us"] >= row["host_us"] for row in record["rows"].values())
    return record


def test_launch_breakdown_dry_run(tmp_path):
    record = _launch_breakdown(tmp_path, "--tiny")
    assert set(record["rows"]) >= {
        "mm",
        "wgrad_update",
        "wgrad_update, pointers",
        "update_linear",
        "ForgeLinear fwd+bwd",
        "ForgeLinear fwd+bwd, backward on this thread",
        "elementwise_update, norm",
        "elementwise_update, 4 norms",
        "vector_update, 4 norms",
        "ForgeLinear stack of 2, per layer",
        "ForgeLinear stack of 2, per layer, backward on this thread",
        "nn.Linear stack of 2, per layer",
    }
    assert set(record["ratios"]) == {
        "one layer", "one layer, this thread", "a layer of 2", "a layer of 2, this thread"
    }  # fmt: skip
    assert "MmBackward0" in record["torch_profile"]  # the fused layer's backward: torch's GEMM node, hooked


def test_launch_breakdown_times_the_host_alone_on_a_cpu(tmp_path):
    """`--host-only`: FORGE's launches return at once (counted), so on a CPU the rows time the
    host's Python, with this thread's CPU time; the file says so in its name."""
    record = _launch_breakdown(tmp_path, "--host-only", "--calls", "20", "--layers", "3", "--norms", "5")
    assert record["host_only"] and record["clock"] == "thread" and record["shape"] == dict(T=16, N=16, K=16)
    assert record["launches_stubbed"] > 0
    assert next(tmp_path.glob("launch-breakdown-16x16x16-host-only-*.json"))


@pytest.mark.parametrize("module", ["launch_breakdown", "elementwise"])
def test_a_gpu_probe_without_a_gpu_says_so(tmp_path, module):
    done = _run(module, out=tmp_path)
    assert done.returncode == 2 and "GPU" in done.stdout, done.stdout + done.stderr[-2000:]


def test_the_elementwise_probe_dry_run_times_every_block_shape(tmp_path):
    """`elementwise --tiny` runs its points on Triton's interpreter at tiny shapes: one JSONL row
    per state dtype and parameter, each with the shipped launch, the block shapes and the
    same-bytes pass timed, and the weights still finite after every run."""
    done = _run("elementwise", "--tiny", out=tmp_path)
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
