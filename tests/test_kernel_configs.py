"""Launch configurations of the fused kernel change its schedule, never its arithmetic.

The persistent grid (a few programs looping over tiles, `KernelConfig.programs_per_sm`), the
epilogue's row slices (`epilogue_split`, which bound its registers) and a tile of half the rows
(what the Hopper table picks for int8 states at small T) and slices whose loads are issued before
the slice above is stored (`overlap_slices`) must give bit-for-bit the weights and
states of one program per tile updating it whole: every tile accumulates over T in
the same order and runs the same arithmetic per element, whichever program runs it and in
whatever slices. Triton interpreter, small odd
shapes so that edge tiles are partial.
"""

from dataclasses import replace

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
    # each slice's W and states loaded before the slice above it is stored
    "overlap-split-4": KernelConfig(
        block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4, epilogue_split=4, overlap_slices=True
    ),
    "overlap-split-2": KernelConfig(
        block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4, epilogue_split=2, overlap_slices=True
    ),
}


def _operands(g: torch.Generator, bf16: bool = False):
    """(x, dy): fp32 on 3 x 3 tiles with the last row and column partial (T = 37, N = 70, K = 130);
    bf16 with rows 16-byte aligned, as bulk tensor copies need (N = 72, K = 136)."""
    T, N, K = (37, 72, 136) if bf16 else (37, 70, 130)
    x = torch.randn(T, K, generator=g)
    dy = torch.randn(T, N, generator=g) / T**0.5
    return (x.bfloat16(), dy.bfloat16()) if bf16 else (x, dy)


def _step(
    config: KernelConfig, state_dtype: str, seed: int = 1234, int8_group: int = 64, bf16_operands=False
):
    g = torch.Generator().manual_seed(7)
    x, dy = _operands(g, bf16_operands)
    N, K = dy.shape[1], x.shape[1]
    w = (torch.randn(N, K, generator=g) * 0.02).to(torch.bfloat16)
    m = torch.randn(N, K, generator=g) * 1e-3
    v = torch.rand(N, K, generator=g) * 1e-6
    scales = (None, None, None)
    if state_dtype == "int8":  # codes plus bf16 scales per int8_group columns
        m, m_scale = quant.quantize(m, True, int8_group)
        v, v_scale = quant.quantize(v, False, int8_group)
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
        int8_group=int8_group,
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


WIDE = {  # tiles 128 columns wide: whole groups of 128
    "one-per-tile": KernelConfig(block_n=32, block_k=128, block_t=32, group_n=2, num_warps=4),
    "split-8": KernelConfig(block_n=32, block_k=128, block_t=32, group_n=2, num_warps=4, epilogue_split=8),
    "1-per-sm": KernelConfig(block_n=16, block_k=128, block_t=32, group_n=2, num_warps=4, programs_per_sm=1),
    "overlap-split-4": KernelConfig(
        block_n=32, block_k=128, block_t=32, group_n=2, num_warps=4, epilogue_split=4, overlap_slices=True
    ),
}


@pytest.mark.parametrize("config", list(WIDE.values())[1:], ids=list(WIDE)[1:])
def test_int8_groups_of_128_give_the_same_bits_under_another_schedule(config):
    reference = _step(WIDE["one-per-tile"], "int8", int8_group=128)
    got = _step(config, "int8", int8_group=128)
    assert reference[3].shape == (70, 2)  # 130 columns: one whole group of 128 and a partial one
    for a, b, name in zip(got, reference, ("w", "m", "v", "m scales", "v scales")):
        assert torch.equal(a, b), f"{name} differs under {config}"


def test_int8_groups_must_fit_the_tile():
    with pytest.raises(ValueError, match="whole int8 groups of 128"):
        _step(ONE_PER_TILE, "int8", int8_group=128)  # 64-column tiles would split a group


def test_descriptors_built_in_the_kernel_read_what_pointers_read():
    """`KernelConfig(tma="device")`: each program builds tensor descriptors for dy and x (bf16,
    rows 16-byte aligned) and reads them by bulk copies; out-of-bounds rows and columns read as
    zeros, so the step equals the masked-pointer loop's bit for bit (T = 37: a partial last block)."""
    from forge.kernels.wgrad_update import _tma_mode

    x, dy = _operands(torch.Generator().manual_seed(7), bf16=True)
    assert _tma_mode("device", dy, x, exact=False, on_interpreter=True) == "device"
    got = _step(replace(ONE_PER_TILE, tma="device"), "bf16", bf16_operands=True)
    want = _step(replace(ONE_PER_TILE, tma="none"), "bf16", bf16_operands=True)
    for a, b, name in zip(got, want, "wmv"):
        assert torch.equal(a, b), f"{name} differs"


def test_a_cached_plan_never_serves_another_layout():
    """`wgrad_update` caches each launch's plan under a key of everything it depends on. The same
    shapes with dy as a transposed view (no unit last stride: bulk copies impossible) must get a
    plan of its own: reusing the contiguous dy's device-descriptor plan would read the wrong
    elements. Both results equal the masked-pointer loop's on the same operands."""
    import forge.kernels.wgrad_update as wu

    g = torch.Generator().manual_seed(7)
    x, dy = _operands(g, bf16=True)
    dy_t = dy.t().contiguous().t()  # same values, strides (1, T)
    config = replace(ONE_PER_TILE, tma="device")
    rule = get_rule("adamw")
    h = resolve_hparams(rule, dict(lr=1e-2, weight_decay=0.1))

    def step(dy, config):
        w = (
            torch.randn(dy.shape[1], x.shape[1], generator=torch.Generator().manual_seed(3)) * 0.02
        ).bfloat16()
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        options = dict(rule="adamw", flags=rule.flags(h), state_dtype="bf16", stochastic_rounding=True)
        wgrad_update(
            w,
            (m, v, None),
            (None,) * 3,
            (True, False, False),
            dy,
            x,
            rule.coefficients(h, 1, {}),
            5,
            **options,
            config=config,
        )
        return w, m, v

    wu._plans.clear()
    contiguous = step(dy, config)
    transposed = step(dy_t, config)  # the contiguous call's plan is cached by now
    assert {plan.tma for plan in wu._plans.values()} == {"device", "none"}
    for got, want in ((contiguous, step(dy, replace(config, tma="none"))), (transposed, contiguous)):
        for a, b, name in zip(got, want, "wmv"):
            assert torch.equal(a, b), f"{name} differs"
