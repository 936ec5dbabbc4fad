"""The harness's multi-GPU points on CPU: `gpus=2` runs a point under torchrun (2 gloo processes),
the ranks' records merge into one (largest per-GPU peak, worst status), NCCL multicast is off in
the launcher's environment, and methods that cannot run tensor-parallel are refused up front."""

import pytest

TINY_TP = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=3", "warmup_steps=1", "gpus=2"]


@pytest.mark.parametrize("method", ["fused_adamw", "forge_fp32"])
def test_harness_runs_a_point_under_torchrun(method, tmp_path):
    from harness.run import grid, local

    point = grid.make_point([*TINY_TP, f"method={method}", "method.lr=1e-3", f"results_dir={tmp_path}"])
    assert point.id.endswith("/tp2/cpu")
    record = local.run_isolated(point, git={})
    assert record["status"] == "ok", record["error"]
    assert record["world_size"] == 2 and record["ranks_reported"] == 2 and record["rank"] == 0
    assert record["gpu_count"] == 0  # gloo on CPUs
    # bf16 weights, lr 1e-3: norm weights near 1 do not move in three steps, on one process too
    assert record["loss_last"] < record["loss_first"] and record["params_moved_frac"] > 0.5
    assert len(record["peak_alloc_gib_per_rank"]) == 2


def test_launcher_sets_nccl_multicast_off_and_uses_torchrun():
    from harness.run import launch

    env = launch.child_env({"PATH": "/bin"}, gpus=2)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "NCCL_NVLS_ENABLE" not in launch.child_env({}, gpus=1)
    assert launch.command(2, ["a", "b"])[1:5] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
    ]


def test_merge_takes_the_largest_rank_peak_and_the_worst_status():
    from harness.run import record

    ranks = [
        dict(
            rank=0,
            world_size=2,
            gpu_count=1,
            status="ok",
            error=None,
            peak_alloc_gib=30.0,
            step_time_ms_median=9,
        ),
        dict(
            rank=1, world_size=2, gpu_count=1, status="oom", error="CUDA out of memory", peak_alloc_gib=39.5
        ),
    ]
    merged = record.merge_ranks(ranks)
    assert merged["peak_alloc_gib"] == 39.5 and merged["peak_alloc_gib_per_rank"] == [30.0, 39.5]
    assert merged["status"] == "oom" and merged["step_time_ms_median"] == 9 and merged["gpu_count"] == 2


def test_a_method_without_tensor_parallel_support_is_refused_by_the_config():
    from harness.run.config import ConfigError, compose_config

    with pytest.raises(ConfigError, match="does not run tensor-parallel"):
        compose_config(["method=adamw8bit_bnb", "gpus=2"])
