"""The harness's data-parallel points on CPU: `gpus=2` with a method whose options say
`data_parallel: ddp | fsdp2` runs under torchrun (2 gloo processes), each rank on its own batch,
the model wrapped by DDP or FSDP2 instead of the TP plan; a step's throughput counts both ranks'
tokens. A data-parallel method on one GPU is refused before anything runs."""

import pytest

TINY_DP = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=3", "warmup_steps=1", "gpus=2"]


@pytest.fixture(scope="module")
def points(tmp_path_factory) -> dict:
    """One point of each data-parallel kind under torchrun: FORGE and fused AdamW under DDP (FORGE
    with small buckets, so that its gradient window is below the whole gradient), FORGE under FSDP2."""
    from harness.run import grid, local

    tmp = tmp_path_factory.mktemp("dp")
    records = {}
    for method in ("forge_bf16_ddp", "fused_adamw_ddp", "forge_int8_fsdp2"):
        overrides = [*TINY_DP, f"method={method}", "method.lr=1e-3", f"results_dir={tmp}"]
        overrides += ["+method.options.bucket_cap_mb=0.01"] if method == "forge_bf16_ddp" else []
        point = grid.make_point(overrides)
        records[method] = (point.id, local.run_isolated(point, git={}))
    return records


@pytest.mark.parametrize(
    "method, wrapper", [("forge_bf16_ddp", "ddp"), ("fused_adamw_ddp", "ddp"), ("forge_int8_fsdp2", "fsdp2")]
)
def test_harness_runs_a_data_parallel_point_under_torchrun(points, method, wrapper):
    point_id, record = points[method]
    assert point_id.endswith(f"/{wrapper}x2/cpu")
    assert record["status"] == "ok", record["error"]
    assert record["world_size"] == 2 and record["ranks_reported"] == 2
    assert record["method_options"]["data_parallel"] == wrapper
    assert record["loss_last"] < record["loss_first"] and record["params_moved_frac"] > 0.5
    both_ranks = 2 * record["batch_size"] * record["seq_len"] * 1e3 / record["step_time_ms_median"]
    assert record["tokens_per_s"] == pytest.approx(both_ranks)


def test_forge_models_a_smaller_gradient_than_fused_adamw_under_ddp(points):
    """grads_gib is each method's gradient bytes by design: FORGE's reducer window over every
    parameter (nothing is fused under DDP: the linear layers' dW go through the reducer too)
    against DDP's buckets (the whole gradient)."""
    from harness.run import models
    from harness.run.config import compose_config
    from harness.run.methods.forge import reducer_window_bytes

    model = models.build(compose_config(TINY_DP[:3]).model, "bf16", "cpu")
    window = reducer_window_bytes(list(model.parameters()), 0.01)
    forge, fused = points["forge_bf16_ddp"][1]["grads_gib"], points["fused_adamw_ddp"][1]["grads_gib"]
    assert forge == pytest.approx(window / 2**30) and forge < fused


def test_a_data_parallel_method_on_one_gpu_is_refused():
    from harness.run import grid
    from harness.run.config import ConfigError

    with pytest.raises(ConfigError, match="needs several GPUs, one process each: set gpus=2"):
        grid.make_point(["model=tiny-llama", "gpu=cpu", "device=cpu", "method=forge_int8_fsdp2"])


def test_forges_ddp_window_is_its_reducers_bound():
    """`reducer_window_bytes` is `forge.data_parallel.GradientReducer.bound_bytes` over every
    parameter ((MAX_IN_FLIGHT + 1) buckets and one bucket's concatenated copy), and never more
    than every gradient with that copy."""
    import torch

    from forge.data_parallel import GradientReducer
    from harness.run.methods.forge import reducer_window_bytes

    sizes = [40_000] * 10 + [3000, 500]  # bf16: 80,000 bytes the largest, 807,000 in all
    params = [torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16)) for n in sizes]
    reducer = GradientReducer.__new__(GradientReducer)  # its bound, without a process group
    reducer.params, reducer.cap_bytes = params, int(0.01 * 2**20)
    assert reducer_window_bytes(params, 0.01) == reducer.bound_bytes == 3 * 80_000 + 10_485
    assert reducer_window_bytes(params, 25.0) == 2 * 807_000  # all in one bucket, and its copy
