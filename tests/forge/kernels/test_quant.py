"""`forge.kernels.quant`: int8 optimizer states, one bf16 scale per group of 64 or 128 elements.

A per-block error bound of the PyTorch quantizer, then the kernel's stored codes and scales against
the PyTorch twin applied after each step, bit for bit. (Training with int8 states is checked in
`tests/forge/test_low_precision.py`.)
"""

import pytest
import torch

import forge
from forge.kernels import elementwise_update, quant
from forge.rules import get_rule, resolve_hparams


@pytest.mark.parametrize("group", forge.INT8_GROUPS)
@pytest.mark.parametrize("signed", [True, False], ids=["signed", "positive"])
@pytest.mark.parametrize("cols", [64, 100, 1, 200])
def test_int8_roundtrip_error_bound_per_block(signed, cols, group):
    x = torch.randn(37, cols) * torch.exp(torch.randn(37, 1) * 3)
    if not signed:
        x = x**2
    codes, scale = quant.quantize(x, signed, group)
    assert scale.shape == (37, -(-cols // group))
    back = quant.dequantize(codes, scale, signed, group)
    err = (back - x).abs()
    # Bound per block: signed codes step at most 2/127 of absmax in u near |u| = 1 (half of it by
    # rounding); positive codes step rootmax/255 in sqrt(x), so x moves by at most about absmax/255.
    absmax = quant._grouped(x.abs(), group).amax(-1)
    # The scales are rounded up to bf16 (at most 2^-8 relative), hence the 1% slack.
    bound = (absmax / 127 * 1.01 if signed else absmax / 255 * 1.01)[..., None].expand(-1, -1, group)
    bound = bound.reshape(x.shape[0], -1)[:, :cols].reshape(x.shape) + 1e-30
    assert bool((err <= bound).all()), f"worst error / bound = {float((err / bound).max()):.3f}"
    if not signed:
        assert bool(((back > 0) | (x == 0)).all()), "a non-zero second moment must never decode to 0"


@pytest.mark.parametrize("group", forge.INT8_GROUPS)
def test_int8_kernel_states_match_the_pytorch_twin(group):
    """The kernel's stored codes and scales are bit for bit those of the PyTorch twin applied after
    each step (update in fp32, re-quantize), and decode near the fp32 momentum."""
    rule = get_rule("sgd")
    h = resolve_hparams(rule, dict(lr=0.1, momentum=0.9))
    p = torch.randn(33, 130)
    codes, scale = quant.quantize(torch.zeros_like(p), True, group)
    grads = [torch.randn_like(p) * torch.exp(torch.randn(33, 1)) for _ in range(3)]
    buf, twin, bound = torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)
    for step, g in enumerate(grads, start=1):
        elementwise_update(
            p,
            g,
            (codes, None, None),
            (scale, None, None),
            (True, False, False),
            rule.coefficients(h, step, {}),
            0,
            rule="sgd",
            flags=rule.flags(h),
            state_dtype="int8",
            stochastic_rounding=False,
            int8_group=group,
        )
        buf = g.clone() if step == 1 else 0.9 * buf + g
        twin_codes, twin_scale = quant.quantize(g if step == 1 else 0.9 * twin + g, True, group)
        twin = quant.dequantize(twin_codes, twin_scale, True, group)
        absmax = twin_scale.float().repeat_interleave(group, -1)[:, :130]
        bound = 0.9 * bound + absmax / 127 * 1.01  # one rounding per step, decayed like the momentum
    assert torch.equal(codes, twin_codes) and torch.equal(scale, twin_scale)
    assert bool(((twin - buf).abs() <= bound + 1e-6).all())
