"""`forge.kernels.wgrad_update`, the fused dW GEMM + update: its launch configs change its schedule,
never its arithmetic.

The epilogue's row slices (`epilogue_split`, which bound its registers), a tile of half the rows
(what the Hopper table picks for int8 states at small T) and slices whose loads are issued before
the slice above is stored (`overlap_slices`) must give bit-for-bit the weights and states of one
program updating its tile whole: every tile accumulates over T in the same order and runs the same
arithmetic per element, in whatever slices. Triton interpreter, small odd shapes so that edge
tiles are partial. (The update itself is checked against torch.optim in `tests/forge/test_rules.py`.)
"""

import functools
import importlib

import pytest
import torch

from forge.kernels import KernelConfig, quant, wgrad_update
from forge.rules import get_rule, resolve_hparams

ONE_PER_TILE = KernelConfig(block_n=32, block_k=64, block_t=32, group_n=2, num_warps=4)
OTHERS = {
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


def _operands(g: torch.Generator, bf16: bool = False, K: int | None = None):
    """(x, dy): fp32 on 2 x 2 tiles of 32 x 64 with the last row and column partial (T = 37, N = 38,
    K = 66: the last tiles have 6 rows, a partial epilogue slice under every split and in tiles of
    16 rows, and 2 columns, a partial int8 group); bf16 with rows 16-byte aligned, as bulk tensor
    copies need (N = 40, K = 72). T = 37 is one whole step of block_t and a partial one."""
    T, N, K_default = (37, 40, 72) if bf16 else (37, 38, 66)
    K = K or K_default
    x = torch.randn(T, K, generator=g)
    dy = torch.randn(T, N, generator=g) / T**0.5
    return (x.bfloat16(), dy.bfloat16()) if bf16 else (x, dy)


def _step(
    config: KernelConfig,
    state_dtype: str,
    seed: int = 1234,
    int8_group: int = 64,
    bf16_operands=False,
    K: int | None = None,
):
    g = torch.Generator().manual_seed(7)
    x, dy = _operands(g, bf16_operands, K)
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


def _assert_same_step(got: tuple, want: tuple, config: KernelConfig, reference: KernelConfig) -> None:
    """Bit for bit where the GEMM tiles are the same shape. Across tile shapes the interpreter's dot
    (NumPy's matmul) sums each product in a shape-dependent order, so the gradient may move by an
    fp32 ulp: then the states stay within fp32 rounding and a rare weight or int8 code lands on the
    other side of a rounding boundary (one step of its dtype)."""
    same_tiles = (config.block_n, config.block_k) == (reference.block_n, reference.block_k)
    for a, b, name in zip(got, want, ("w", "m", "v", "m scales", "v scales")):
        if same_tiles:
            assert torch.equal(a, b), f"{name} differs under {config}"
            continue
        if a.dtype == torch.float32:  # a gradient ulp of sums of 37 products of O(1): ~1e-7 on m
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            continue
        differ = a != b
        assert float(differ.float().mean()) <= 0.02, f"{name}: {int(differ.sum())} of {a.numel()} differ"
        if a.dtype == torch.bfloat16:
            torch.testing.assert_close(a.float(), b.float(), rtol=2**-7, atol=1e-30)
        else:  # int8 / uint8 codes
            assert int((a.int() - b.int()).abs().max()) <= 1, f"{name} codes moved by more than one"


@functools.cache
def _reference(config: KernelConfig, state_dtype: str, int8_group: int = 64, K: int | None = None):
    """The step of one program per whole tile, computed once per module (the tests only read it)."""
    return _step(config, state_dtype, int8_group=int8_group, K=K)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("config", OTHERS.values(), ids=OTHERS.keys())
def test_another_schedule_gives_the_same_step(config, state_dtype):
    reference = _reference(ONE_PER_TILE, state_dtype)
    _assert_same_step(_step(config, state_dtype), reference, config, ONE_PER_TILE)


WIDE = {  # tiles 128 columns wide: whole groups of 128
    "one-per-tile": KernelConfig(block_n=32, block_k=128, block_t=32, group_n=2, num_warps=4),
    "split-8": KernelConfig(block_n=32, block_k=128, block_t=32, group_n=2, num_warps=4, epilogue_split=8),
    "half-rows": KernelConfig(block_n=16, block_k=128, block_t=32, group_n=2, num_warps=4),
    "overlap-split-4": KernelConfig(
        block_n=32, block_k=128, block_t=32, group_n=2, num_warps=4, epilogue_split=4, overlap_slices=True
    ),
}


@pytest.mark.parametrize("config", list(WIDE.values())[1:], ids=list(WIDE)[1:])
def test_int8_groups_of_128_give_the_same_step_under_another_schedule(config):
    reference = _reference(WIDE["one-per-tile"], "int8", int8_group=128, K=130)
    assert reference[3].shape == (38, 2)  # 130 columns: one whole group of 128 and a partial one
    got = _step(config, "int8", int8_group=128, K=130)
    _assert_same_step(got, reference, config, WIDE["one-per-tile"])


def test_int8_groups_must_fit_the_tile():
    with pytest.raises(ValueError, match="whole int8 groups of 128"):
        _step(ONE_PER_TILE, "int8", int8_group=128)  # 64-column tiles would split a group


def test_a_cached_plan_never_serves_another_layout():
    """`wgrad_update` caches each launch's plan under a key of everything it depends on. The same
    shapes with dy as a transposed view (strides (1, T)) get a plan of their own, and both steps
    equal the contiguous operands' bit for bit."""
    launcher = importlib.import_module("forge.kernels.wgrad_update")  # the module, not the function
    g = torch.Generator().manual_seed(7)
    x, dy = _operands(g, bf16=True)
    dy_t = dy.t().contiguous().t()  # same values, strides (1, T)
    rule = get_rule("adamw")
    h = resolve_hparams(rule, dict(lr=1e-2, weight_decay=0.1))

    def step(dy):
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
            config=ONE_PER_TILE,
        )
        return w, m, v

    launcher._plans.clear()
    contiguous = step(dy)
    transposed = step(dy_t)  # the contiguous call's plan is cached by now
    assert len(launcher._plans) == 2
    for a, b, name in zip(transposed, contiguous, "wmv"):
        assert torch.equal(a, b), f"{name} differs"
