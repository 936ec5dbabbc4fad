"""`forge.kernels.fp8_cast`: the two-launch FP8 cast equals `forge.fp8.cast` (PyTorch ops) bit for
bit, row-major and transposed, for both FP8 formats, bf16 and fp32 inputs, ragged shapes and a
tensor larger than one pass of the absolute-maximum programs."""

import pytest
import torch

from forge import fp8
from forge.kernels import fp8_cast


@pytest.mark.parametrize("dtype", [fp8.INPUT_DTYPE, fp8.GRAD_DTYPE], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("source", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(37, 70), (3, 5)], ids=str)
def test_the_fused_cast_equals_the_pytorch_cast(dtype, source, shape):
    torch.manual_seed(0)
    t = (torch.randn(shape) * 3.0).to(source)
    t[0, 0] = 40.0  # a clear maximum, away from the rest
    expected, inverse = fp8.cast(t, dtype)
    rows, transposed, inv = fp8_cast.cast(t, dtype, rows=True, transposed=True)
    assert rows.dtype == transposed.dtype == dtype
    assert torch.equal(rows.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(transposed.view(torch.uint8), expected.t().contiguous().view(torch.uint8))
    assert inv.shape == () and torch.equal(inv, inverse)


def test_the_absolute_maximum_spans_every_pass():
    """More elements than the absolute-maximum programs cover in one sweep (the interpreter runs
    `INTERPRETER_PARTIALS` programs of 1024): the maximum sits in the last, partial block."""
    n = fp8_cast.INTERPRETER_PARTIALS * 1024 * 3 + 333
    t = torch.rand(1, n)
    t[0, -1] = -7.0
    _, _, inv = fp8_cast.cast(t, fp8.INPUT_DTYPE, rows=False, transposed=False)
    assert torch.equal(inv, fp8.cast(t, fp8.INPUT_DTYPE)[1])


@pytest.mark.parametrize("dtype", [fp8.INPUT_DTYPE, fp8.GRAD_DTYPE], ids=["e4m3", "e5m2"])
def test_subnormals_ties_and_binade_edges_round_as_torch(dtype):
    """The format's maximum sets the scale to 1: values below the smallest normal, exact halfway
    points between neighbours, and values that round up into the next binade."""
    top = torch.finfo(dtype).max
    tiny = 2.0 ** (-9 if dtype == fp8.INPUT_DTYPE else -16)  # the smallest subnormal
    values = [top, 0.0, tiny / 2, tiny, 1.5 * tiny, 2.5 * tiny, 3 * tiny / 4, 125.2, -31.9, 1.0625, 1.1875]
    values += [v * s for v in (0.3, 7.7, 15.99) for s in (1.0, -1.0)]
    t = torch.tensor([values], dtype=torch.float32)
    expected, _ = fp8.cast(t, dtype)
    rows, _, _ = fp8_cast.cast(t, dtype)
    assert torch.equal(rows.view(torch.uint8), expected.view(torch.uint8)), (rows, expected)
