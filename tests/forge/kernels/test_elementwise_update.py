"""`forge.kernels.elementwise_update`, the update of every parameter that is not a fused weight.

Each rule's two halves agree through it: the Triton function and its PyTorch twin
`forge.rules.reference_update`, fed the same host coefficients, step after step; and both, fed the
host half's coefficients (`Rule.coefficients`), step as torch.optim's own formulas do on the same
gradients, so no expectation here comes from FORGE's coefficients alone. (Against torch.optim on
models, through the public API: `tests/forge/test_rules.py`.)
"""

import pytest
import torch

import forge
from forge.kernels import elementwise_update
from forge.rules import get_rule, reference_update, resolve_hparams
from tests.forge.exactness import ELEMENTWISE_FP32, assert_close_to_update
from tests.helpers import RULE_CASES


@pytest.mark.parametrize("case", RULE_CASES, ids=RULE_CASES.keys())
def test_triton_rule_matches_its_pytorch_twin(case):
    rule = get_rule(case.split("-")[0])
    h = resolve_hparams(rule, RULE_CASES[case])
    slots = rule.slots(h)
    w = torch.randn(37, 100)
    w0 = w.clone()
    init = h.get("initial_accumulator_value", 0.0)
    states = [torch.full_like(w, init) if s else None for s in slots]
    w_ref, states_ref = w.clone(), [s.clone() if s is not None else None for s in states]
    host, host_ref = dict(rule.host_state), dict(rule.host_state)
    for step in range(1, 4):
        g = torch.randn_like(w)
        elementwise_update(
            w,
            g,
            tuple(states),
            (None,) * 3,
            tuple(bool(s and s.signed) for s in slots),
            rule.coefficients(h, step, host),
            0,
            rule=rule.device_name,
            flags=rule.flags(h),
            state_dtype="fp32",
            stochastic_rounding=False,
        )
        w_ref = reference_update(rule, h, w_ref, g, states_ref, rule.coefficients(h, step, host_ref))
    # Same arithmetic, possibly another association (numpy in the interpreter vs torch): the weights
    # relative to their update (`ELEMENTWISE_FP32`), the states to a few fp32 ulps of the tensor's
    # scale (momentum buffers reach ~30 here).
    assert_close_to_update(w, w_ref, w0, ELEMENTWISE_FP32)
    for s, r in zip(states, states_ref):
        if s is not None:
            torch.testing.assert_close(s, r, rtol=1e-6, atol=1e-6 * float(r.abs().max()))


@pytest.mark.parametrize("case", RULE_CASES, ids=RULE_CASES.keys())
def test_both_halves_step_as_torch_optim(case):
    """Seven steps (past every rule's first-step special case, into RAdam's rectified branch, which
    starts at step 6 with beta2 = 0.999) of the kernel and of `reference_update`, each against
    torch.optim (Lion: `forge.baseline.Lion`) on the same gradients, relative to torch's update
    (`ELEMENTWISE_FP32`)."""
    rule = get_rule(case.split("-")[0])
    h = resolve_hparams(rule, RULE_CASES[case])
    slots = rule.slots(h)
    init = h.get("initial_accumulator_value", 0.0)
    w0 = torch.randn(37, 100)
    kernel, twin, oracle = w0.clone(), w0.clone(), torch.nn.Parameter(w0.clone())
    kernel_states = [torch.full_like(w0, init) if s else None for s in slots]
    twin_states = [s.clone() if s is not None else None for s in kernel_states]
    torch_opt = forge.torch_optimizer(rule.name, [oracle], **RULE_CASES[case])
    kernel_host, twin_host = dict(rule.host_state), dict(rule.host_state)
    for step in range(1, 8):
        g = torch.randn_like(w0)
        g[0, :5] = 0.0  # parameters with no gradient (an unused embedding row): states and update of zero
        elementwise_update(
            kernel, g, tuple(kernel_states), (None,) * 3, tuple(bool(s and s.signed) for s in slots),
            rule.coefficients(h, step, kernel_host), 0, rule=rule.device_name, flags=rule.flags(h),
            state_dtype="fp32", stochastic_rounding=False,
        )  # fmt: skip
        twin = reference_update(rule, h, twin, g, twin_states, rule.coefficients(h, step, twin_host))
        oracle.grad = g
        torch_opt.step()
    assert_close_to_update(kernel, oracle, w0, ELEMENTWISE_FP32, "the kernel")
    assert_close_to_update(twin, oracle, w0, ELEMENTWISE_FP32, "reference_update")
    for slot, state in zip(slots, twin_states):
        if slot is not None:
            expected = torch_opt.state[oracle][slot.name]
            torch.testing.assert_close(state, expected, rtol=1e-6, atol=1e-6 * float(expected.abs().max()))
