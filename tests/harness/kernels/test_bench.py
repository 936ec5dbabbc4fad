"""The kernel benchmark's arithmetic (`harness.kernels.bench`): the linear shapes it times, the
floors it divides by, and its refusal to time anything without a GPU."""

import pytest
import torch

from harness.kernels import bench, layers


def test_the_linear_shapes_of_llama_3_1_8b():
    shapes = layers.linear_shapes(layers.MODELS["llama3.1-8b"])
    assert shapes["q"] == (4096, 4096) and shapes["k"] == shapes["v"] == (1024, 4096)
    assert shapes["gate"] == shapes["up"] == (14336, 4096) and shapes["down"] == (4096, 14336)
    assert shapes["lm_head"] == (128256, 4096)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_the_fused_kernel_moves_fewer_bytes_than_gemm_plus_adamw_with_bf16_states(state_dtype):
    """The fused floor never writes dW: with bf16 (or smaller) states it moves fewer bytes than the
    GEMM + AdamW baseline; with fp32 states the states' bytes outweigh the saved gradient."""
    T, N, K = 2048, 14336, 4096
    fused, baseline = bench.forge_min_bytes(T, N, K, "adamw", state_dtype), bench.baseline_min_bytes(T, N, K)
    assert (fused < baseline) == (state_dtype != "fp32")
    # int8 codes plus one bf16 scale per 64: two states at 1.03 bytes, W read and written
    assert bench.forge_min_bytes(0, N, K, "adamw", "int8") == pytest.approx(N * K * (4 + 4 * (1 + 2 / 64)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_a_gpu_it_says_so(capsys):
    assert bench.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
