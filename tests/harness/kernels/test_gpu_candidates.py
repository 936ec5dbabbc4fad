"""GPU-only (skipped without CUDA): every candidate launch config of the offline tuner computes the
shipped config's update.

    pytest tests/harness/kernels/test_gpu_candidates.py -q      # on a CUDA GPU
"""

import math

import pytest
import torch

import forge
from forge.kernels import KernelConfig, wgrad_update
from harness.kernels.build import candidate_groups, candidates

pytestmark = pytest.mark.gpu


def _adamw_states(w: torch.Tensor, state_dtype: str, dy: torch.Tensor, x: torch.Tensor):
    """(optimizer, its param group, states, scales, signed) of FORGE's AdamW on a copy of `w` after
    one fused step: states drawn by the update itself (non-zero; int8 codes with their scales),
    read from `opt.state` by the rule's slot names."""
    layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
    opt = forge.attach(
        torch.nn.Sequential(layer), "adamw", state_dtype=state_dtype, lr=1e-3, weight_decay=0.01
    )
    opt.update_linear(layer.weight, dy, x)
    group, state = opt.param_groups[0], opt.state[layer.weight]
    slots = opt.rule.slots(group)
    states = tuple(state[s.name] if s else None for s in slots)
    scales = tuple(state.get(s.name + "_absmax") if s else None for s in slots)
    signed = tuple(bool(s and s.signed) for s in slots)
    return opt, group, states, scales, signed


# int8 states' scales are read by the kernels that load W and the states into registers only
CASES = [
    (state_dtype, group)
    for group in sorted(set(candidate_groups()) - {"shipped"})
    for state_dtype in ("bf16", "int8")
    if (state_dtype, group) != ("int8", "prefetch")
]


@pytest.mark.parametrize("state_dtype, group", CASES)
def test_every_tuning_candidate_computes_the_same_update(state_dtype, group):
    """The offline tuner's candidates (`harness.kernels.build.candidates`, one group at a time:
    other tiles, other epilogues; `forge.kernels.pick_config` ships some of them) change the
    schedule, not the step: the same AdamW step with stochastic rounding as the first shipped
    config, to the last bit but for the rare element whose fp32 sum over T rounds the other way in
    another MMA shape (int8: codes and scales too)."""
    T, N, K = 2048, 4096, 1536
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = (torch.randn(T, N, device="cuda", generator=g) / math.sqrt(T)).bfloat16()
    w0 = (torch.randn(N, K, device="cuda", generator=g) * 0.02).bfloat16()
    opt, hparams, states0, scales0, signed = _adamw_states(w0, state_dtype, dy, x)
    rule = opt.rule

    def step(fields):
        w = w0.clone()
        states = tuple(None if t is None else t.clone() for t in states0)
        scales = tuple(None if t is None else t.clone() for t in scales0)
        wgrad_update(
            w,
            states,
            scales,
            signed,
            dy,
            x,
            rule.coefficients(hparams, 5, {}),
            99,
            rule="adamw",
            flags=rule.flags(hparams),
            state_dtype=state_dtype,
            stochastic_rounding=True,
            config=KernelConfig(**fields),
        )
        return (w, *(t for t in states + scales if t is not None))

    first, *others = candidates([group])
    reference = step(first)
    names = ("w", "m", "v", "m scales", "v scales")
    for fields in others:
        for got, want, name in zip(step(fields), reference, names):
            differ = got != want
            assert float(differ.float().mean()) <= 1e-3, f"{name} under {fields}: {int(differ.sum())} differ"
