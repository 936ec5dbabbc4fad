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
