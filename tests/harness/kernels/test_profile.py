"""`harness.kernels.profile` runs end to end on a CPU (a dry run of the GPU profile): one FORGE
point with activation checkpointing, named as a sweep names it, its JSON written to $OUT; and
`harness.kernels.compare_profiles` sets two such profiles side by side."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.kernels import compare_profiles, profile

REPO = Path(__file__).resolve().parents[3]


def _module(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"harness.kernels.{name}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_profile_dry_run_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # forge decides on a CPU
    env.update(OUT=str(tmp_path), PROFILE_WARMUP="1", PROFILE_STEPS="1")
    overrides = [
        "method=forge_bf16",
        "model=micro-llama",
        "device=cpu",
        "activation_checkpointing=true",
        "batch_size=1",
        "seq_len=32",
    ]
    done = _module("profile", *overrides, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("*.profile.json")
    report = json.loads(path.read_text())
    assert report["point"].startswith("forge_bf16/micro-llama/") and "/ac/" in report["point"]
    assert len(report["step_ms"]) == 1 and report["step_ms"][0] > 0
    assert report["gpu_busy_ms"] is None  # no GPU: no device kernels to count
    assert report["matmuls_by_shape"] and all(m["calls"] > 0 for m in report["matmuls_by_shape"])
    assert "[[" in report["matmuls_by_shape"][0]["shapes"]  # input shapes recorded
    assert report["mm_kernels"] and all(m["calls"] > 0 for m in report["mm_kernels"])
    assert report["clocks"] is None  # no GPU: no NVML clocks
    assert report["kernels_by_launch"] == []  # no device kernels on a CPU
    assert report["fused_busy_ms"] is None and report["fused_overlap_ms"] is None


def test_overlap_counts_the_time_two_sets_of_kernels_run_at_once():
    fused = [(0.0, 1000.0), (3000.0, 4000.0)]  # us
    others = [(500.0, 1500.0), (1400.0, 2000.0), (3500.0, 3600.0), (3550.0, 3700.0)]
    assert profile.overlap_ms(fused, others) == pytest.approx((500 + 200) / 1000)
    assert profile.overlap_ms(fused, []) == 0 and profile.overlap_ms(fused, fused) == pytest.approx(2.0)


def test_the_fused_kernels_are_told_apart_by_name():
    assert profile.is_fused("_wgrad_update_kernel") and profile.is_fused("wgrad_update_ws_kernel")
    assert not profile.is_fused("_elementwise_update_kernel") and not profile.is_fused("sm90_xmma_gemm")


def test_kernels_are_grouped_by_name_and_grid_from_the_trace():
    """The same kernel on two grids (a fused kernel on layers of two shapes) stays two rows; host
    events and kernels without a duration are left out; times are per step."""

    def kernel(name, grid, dur):
        return {"cat": "kernel", "name": name, "dur": dur, "args": {"grid": grid, "block": [256, 1, 1]}}

    trace = {
        "traceEvents": [
            kernel("wgrad_update_kernel", [64, 1, 1], 30.0),
            kernel("wgrad_update_kernel", [64, 1, 1], 34.0),
            kernel("wgrad_update_kernel", [192, 1, 1], 50.0),
            {"cat": "cpu_op", "name": "aten::mm", "dur": 99.0, "args": {}},
            {"cat": "kernel", "name": "no_duration", "args": {}},
        ]
    }
    rows = profile.kernels_by_launch(trace, steps=2)
    assert [(r["grid"], r["calls"]) for r in rows] == [([64, 1, 1], 1.0), ([192, 1, 1], 0.5)]
    assert rows[0]["device_ms"] == pytest.approx(0.032) and rows[0]["mean_us"] == pytest.approx(32.0)
    assert rows[1]["block"] == [256, 1, 1]


def _profile(kernels: dict, busy: float, steps: list, mhz: float) -> dict:
    return {
        "step_ms": steps,
        "gpu_busy_ms": busy,
        "idle_frac": 1 - busy / sorted(steps)[len(steps) // 2],
        "clocks": {"sm_clock_mhz": {"median": mhz}, "power_w": {"median": 400.0}},
        "top_kernels": [{"name": n, "calls": 1.0, "device_ms": ms} for n, ms in kernels.items()],
    }


def test_compare_profiles_sets_kernels_side_by_side(tmp_path):
    """Per kernel name the device ms of each profile and their difference (a kernel missing from
    one top list counts as 0 there), largest first; the step-level lines."""
    base = _profile({"gemm_dw": 20.0, "gemm_dx": 15.0, "attention": 5.0}, 45.0, [50.0, 52.0, 51.0], 1755)
    other = _profile(
        {"fused_update": 34.0, "gemm_dx": 16.0, "attention": 5.0, "elementwise": 3.0},
        60.0,
        [66.0, 64.0, 65.0],
        1680,
    )
    rows = compare_profiles.kernel_differences(base, other)
    assert [r["name"] for r in rows[:2]] == ["fused_update", "gemm_dw"]
    assert rows[0]["base_ms"] is None and rows[0]["difference_ms"] == pytest.approx(34.0)
    assert rows[1]["other_ms"] is None and rows[1]["difference_ms"] == pytest.approx(-20.0)
    assert {r["name"]: r["difference_ms"] for r in rows}["attention"] == 0.0
    summary = compare_profiles.summary
    assert summary(other)["step_ms"] == 65.0 and summary(base)["sm_clock_mhz"] == 1755
    paths = [tmp_path / "base.profile.json", tmp_path / "other.profile.json"]
    for path, data in zip(paths, (base, other)):
        path.write_text(json.dumps(data))
    done = _module("compare_profiles", *map(str, paths))
    assert done.returncode == 0, done.stderr
    assert "fused_update" in done.stdout and "+18.00" in done.stdout and "GPU busy: 15.00" in done.stdout
    missing = _module("compare_profiles", str(tmp_path / "none.json"), str(paths[0]))
    assert missing.returncode == 2 and "harness.kernels.profile" in missing.stderr
