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


def test_launch_breakdown_dry_run(tmp_path):
    done = _run("launch_breakdown", "--tiny", out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "launch_breakdown.json").read_text())
    assert set(record["rows"]) >= {
        "mm",
        "wgrad_update",
        "wgrad_update, pointers",
        "update_linear",
        "ForgeLinear fwd+bwd",
        "ForgeLinear fwd+bwd, backward on this thread",
        "elementwise_update, norm",
        "ForgeLinear stack of 2, per layer",
        "ForgeLinear stack of 2, per layer, backward on this thread",
        "nn.Linear stack of 2, per layer",
    }
    assert "ForgeLinearFunctionBackward" in record["torch_profile"]
    assert all(row["host_us"] > 0 and row["wall_us"] >= row["host_us"] for row in record["rows"].values())


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
