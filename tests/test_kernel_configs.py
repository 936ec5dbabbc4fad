"""Launch configurations of the fused kernel change its schedule, never its arithmetic.

The persistent grid (a few programs looping over tiles, `KernelConfig.programs_per_sm`), the
epilogue's row slices (`epilogue_split`, which bound its registers) and a tile of half the rows
(what the Hopper table picks for int8 states at small T) must give bit-for-bit the weights and
states of one program per tile updating it whole: every tile accumulates over T in
the same order and runs the same arithmetic per element, whichever program runs it and in
whatever slices. Triton interpreter, small odd
shapes so that edge tiles are partial.
"""

import pytest
import torch

from forge.kernels import quant
from forge.kernels.wgrad_update import KernelConfig, wgrad_update
from forge.rules import get_rule, resolve_hparams

ONE_PER_TILE = KernelConfig(block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4)
OTHERS = {
    "1-per-sm": KernelConfig(block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4, programs_per_sm=1),
    "2-per-sm-flatten": KernelConfig(
        block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4, programs_per_sm=2, flatten=True
    ),
    "split-4": KernelConfig(block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4, epilogue_split=4),
    "split-8": KernelConfig(block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4, epilogue_split=8),
    "half-rows": KernelConfig(block_n=16, block_k=64, block_t=32, group_n=2, num_warps=4),
}


def _step(config: KernelConfig, state_dtype: str, seed: int = 1234):
    g = torch.Generator().manual_seed(7)
    T, N, K = 37, 70, 130  # 3 x 3 tiles, the last row and column partial
    x = torch.randn(T, K, generator=g)
    dy = torch.randn(T, N, generator=g) / T**0.5
    w = (torch.randn(N, K, generator=g) * 0.02).to(torch.bfloat16)
    m = torch.randn(N, K, generator=g) * 1e-3
    v = torch.rand(N, K, generator=g) * 1e-6
    scales = (None, None, None)
    if state_dtype == "int8":  # codes plus bf16 scales per 64 columns
        (m, m_scale), (v, v_scale) = quant.quantize(m, signed=True), quant.quantize(v, signed=False)
        scales = (m_scale, v_scale, None)
    else:
        m, v = (t.to({"fp32": torch.float32, "bf16": torch.bfloat16}[state_dtype]) for t in (m, v))
    rule = get_rule("adamw")
    h = resolve_hparams(rule, dict(lr=1e-2, weight_decay=0.1))
    wgrad_update(
        w,
        (m, v, None),
        scales,
        (True, False, False),
        dy,
        x,
        rule.coefficients(h, 3, {}),
        seed,
        rule="adamw",
        flags=rule.flags(h),
        state_dtype=state_dtype,
        stochastic_rounding=True,
        config=config,
    )
    return (w, m, v, *scales[:2]) if state_dtype == "int8" else (w, m, v)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("config", OTHERS.values(), ids=OTHERS.keys())
def test_another_schedule_gives_the_same_bits(config, state_dtype):
    reference = _step(ONE_PER_TILE, state_dtype)
    names = ("w", "m", "v", "m scales", "v scales")
    for got, want, name in zip(_step(config, state_dtype), reference, names):
        assert torch.equal(got, want), f"{name} differs under {config}"
