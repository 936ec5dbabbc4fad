"""`scripts/gpu_profile_step.py` runs end to end on a CPU (a dry run of the GPU profile): one FORGE
point with activation checkpointing, named as a sweep names it, its JSON written to $OUT."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_profile_dry_run_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script must set it
    env.update(OUT=str(tmp_path), PROFILE_WARMUP="1", PROFILE_STEPS="1")
    overrides = ["method=forge_bf16", "model=tiny-llama", "device=cpu", "activation_checkpointing=true"]
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_profile_step.py"), *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("*.profile.json")
    report = json.loads(path.read_text())
    assert report["point"].startswith("forge_bf16/tiny-llama/") and "/ac/" in report["point"]
    assert len(report["step_ms"]) == 1 and report["step_ms"][0] > 0
    assert report["gpu_busy_ms"] is None  # no GPU: no device kernels to count
    assert report["matmuls_by_shape"] and all(m["calls"] > 0 for m in report["matmuls_by_shape"])
    assert "[[" in report["matmuls_by_shape"][0]["shapes"]  # input shapes recorded
    assert report["mm_kernels"] and all(m["calls"] > 0 for m in report["mm_kernels"])
    assert report["clocks"] is None  # no GPU: no NVML clocks
    assert report["fused_busy_ms"] is None and report["fused_overlap_ms"] is None


def test_overlap_counts_the_time_two_sets_of_kernels_run_at_once():
    path = REPO / "scripts" / "gpu_profile_step.py"
    spec = importlib.util.spec_from_file_location("gpu_profile_step", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fused = [(0.0, 1000.0), (3000.0, 4000.0)]  # us
    others = [(500.0, 1500.0), (1400.0, 2000.0), (3500.0, 3600.0), (3550.0, 3700.0)]
    assert script.overlap_ms(fused, others) == pytest.approx((500 + 200) / 1000)
    assert script.overlap_ms(fused, []) == 0 and script.overlap_ms(fused, fused) == pytest.approx(2.0)
