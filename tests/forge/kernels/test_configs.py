"""The warp-specialized configs FP8 operands take on Hopper (`forge.kernels.fp8_warp_specialized`):
64-row tiles (one MMA warpgroup, 8 epilogue warps) where the update bounds the kernel, 128-row
tiles (two MMA warpgroups, 4 epilogue warps) where the GEMM does. Which is faster where was
measured on an H200 (`forge.kernels.configs` names the records); this pins what ships."""

import pytest

from forge.kernels import fp8_warp_specialized


@pytest.mark.parametrize("T", [256, 1024, 2048, 4096, 16384])
def test_fp8_operands_take_64_row_tiles_where_the_update_bounds_the_kernel(T):
    bf16, int8, fp32 = (fp8_warp_specialized(T, s) for s in ("bf16", "int8", "fp32"))
    assert (bf16.block_n, bf16.num_warps) == ((64, 8) if T <= 1024 else (128, 4))
    assert bf16.epilogue_rows == (32 if T <= 1024 else 16)
    assert (int8.block_n, int8.num_warps) == (64, 8)  # int8's epilogue issues twice bf16's instructions
    assert int8.overlap_promotion and not bf16.overlap_promotion and not fp32.overlap_promotion
    assert (fp32.block_n, fp32.num_warps) == (128, 4) and not fp32.fast_epilogue  # the exact epilogue
    for config in (bf16, int8, fp32):
        assert config.warp_specialized and config.block_t == 128  # a multiple of the FP8 MMA's 32-deep step
    assert bf16.fast_epilogue and int8.fast_epilogue


def test_states_the_kernel_does_not_know_take_no_warp_specialized_config():
    assert fp8_warp_specialized(1024, "fp16") is None


@pytest.mark.parametrize(
    "T, N, K, state_dtype, expected",
    [
        (8192, 14336, 4096, "bf16", (128, 128)),  # Llama-3.1-8B's gate: 3,584 tiles
        (8192, 2048, 1024, "bf16", (128, 128)),  # 128 tiles on 132 multiprocessors
        (16384, 1024, 1024, "bf16", (128, 64)),  # 64 tiles of 128 x 128: twice as many
        (8192, 1024, 1024, "bf16", None),  # under the host-bound FLOPs: the Triton kernel
        (8192, 2048, 1024, "int8", None),  # small grids with int8 states were not timed
        (8192, 4096, 1024, "fp32", None),  # 256 tiles, under fp32's 4 a multiprocessor
    ],
)
def test_the_warp_specialized_kernel_takes_small_grids_with_bf16_states(
    monkeypatch, T, N, K, state_dtype, expected
):
    """On a Hopper of 132 multiprocessors: which problems the warp-specialized kernel takes, in
    which tiles (the choice does not depend on a CUDA-graph capture, so replays equal eager steps)."""
    import torch

    from forge.kernels import configs

    monkeypatch.setattr(configs, "_can_run_warp_specialized", lambda *a: True)
    monkeypatch.setattr(configs, "_multiprocessors", lambda device: 132)
    dy = torch.empty(T, N, dtype=torch.bfloat16)
    x = torch.empty(T, K, dtype=torch.bfloat16)
    config = configs._warp_specialized_config(T, N, K, state_dtype, dy, x, on_interpreter=False)
    assert (config and (config.block_n, config.block_k)) == expected
