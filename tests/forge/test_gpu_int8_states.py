"""int8 states on a GPU's fast kernels against their definition, for every stateful rule.

`tests/forge/test_int8_states.py` on the kernels a Hopper GPU runs: the warp-specialized kernel with
its fast epilogue (approximate division and square root: `forge.kernels.quant._divide`) and the
ping-pong kernel, bf16 weights and operands at a Llama-like shape. Each step starts from FORGE's own
state; torch.optim steps from it decoded by the definition (`tests.forge.reference`), on the fp64
product of the same bf16 operands rounded once, and FORGE must hold the definition's codes and
scales of torch's new state: equal but for the elements whose fp32 sum over T tokens came out a
few ulps from torch's and crossed a rounding boundary (at most 1 in 100, each one code or one bf16
step of its scale away), and never a zero code for a non-zero positive state. Its bf16 weight must
be torch's fp32 step rounded to bf16, one bf16 step either way where the sums differ.

Run on the device, in one process: `pytest -o addopts="" tests/forge/test_gpu_int8_states.py -q`.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import forge
from tests.forge import reference as ref
from tests.forge.exactness import near_zero
from tests.forge.test_int8_states import CASES, _decoded, _tensor_states

pytestmark = pytest.mark.gpu

N, K, T = 1024, 2048, 1024
STEPS = 3
ROUNDING = 1e-2  # the most codes, scales or weights a rounding step off (the module docstring)


def _assert_nearly_the_definition(state: dict, expected: dict, group: int, what: str) -> None:
    for name, value in expected.items():
        signed = name not in ref.POSITIVE_STATES
        stored = state[name + "_absmax"].double()
        low, high = ref.scales(value, signed, group, 2.0**-20)
        off = (stored < low / (1 + 2**-7)) | (stored > high * (1 + 2**-7))
        assert not bool(off.any()), f"{what}: {name}'s scales more than a bf16 step from the groups' maxima"
        moved = float(((stored != low) & (stored != high)).double().mean())
        assert moved <= ROUNDING, f"{what}: {moved:.2%} of {name}'s scales a bf16 step off"
        codes, _, _ = ref.quantize(value, signed, group, scale=stored)
        diff = (state[name].long() - codes).abs()
        assert int(diff.max()) <= 1, f"{what}: a code of {name} {int(diff.max())} codes off the definition's"
        assert float((diff > 0).double().mean()) <= ROUNDING, f"{what}: too many codes of {name} differ"
        if not signed:
            lost = (state[name] == 0) & (value > 0)
            assert not bool(lost.any()), f"{what}: {int(lost.sum())} non-zero {name} stored as code 0"


def _configs() -> dict:
    from forge.kernels import PINGPONG_CONFIGS, WARP_SPECIALIZED_DEFAULTS

    return {"warp_specialized_fast": WARP_SPECIALIZED_DEFAULTS["int8"], "pingpong": PINGPONG_CONFIGS["int8"]}


@pytest.mark.parametrize("kernel", ["warp_specialized_fast", "pingpong"])
@pytest.mark.parametrize("case", CASES)
def test_the_fast_kernels_store_the_definitions_codes_of_torch_optims_state(case, kernel):
    rule, hp = case.split("-")[0], CASES[case]
    config = _configs()[kernel]
    g = torch.Generator(device="cuda").manual_seed(3)
    layer = nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    opt = forge.attach(layer, rule, state_dtype="int8", stochastic_rounding=False, **hp)
    w, state = layer.weight, opt.state[layer.weight]
    reference = nn.Parameter(w.detach().float())
    torch_opt = forge.torch_optimizer(rule, [reference], **hp)
    for t in range(1, STEPS + 1):
        with torch.no_grad():
            reference.copy_(w.float())
            for name, value in _tensor_states(torch_opt, reference).items():
                value.copy_(_decoded(state, name, 64))
        x = torch.randn(T, K, device="cuda", generator=g).bfloat16()
        scale = torch.exp(2 * torch.randn(1, N, device="cuda", generator=g))  # rows of different sizes
        dy = (torch.randn(T, N, device="cuda", generator=g) * scale / math.sqrt(T)).bfloat16()
        opt.update_linear(w, dy, x, config=config)
        reference.grad = (dy.double().T @ x.double()).float()
        torch_opt.step()
        assert torch.isfinite(w).all(), f"step {t}: FORGE's weight holds a NaN or an infinity"
        _assert_nearly_the_definition(state, _tensor_states(torch_opt, reference), 64, f"{kernel}, step {t}")
        rounded = reference.detach().bfloat16().float()
        bf16_step = torch.finfo(torch.bfloat16).eps * torch.maximum(w.float().abs(), rounded.abs())
        off = ((w.float() - rounded).abs() > bf16_step) & ~near_zero(reference.grad)
        assert float(off.double().mean()) <= ROUNDING, f"{kernel}, step {t}: the weights are not torch's step"
