"""Compensated bf16 weights (`master_weights="bf16+kahan"`): a bf16 weight and its bf16 residual
carry the fp32 master weight of torch.optim to within their precision, where plain bf16 loses the
small updates, for every rule, on the fused and the element-wise kernel."""

import copy

import pytest
import torch
from torch import nn

import forge
from forge.optim import ForgeOptimizer
from tests.helpers import RULE_CASES, regression_batches, regression_step

CASES = {name: RULE_CASES[name] for name in ("adamw", "nadam", "radam", "lion", "rmsprop", "adagrad", "sgd")}
STEPS = 3
# The pair's precision: the residual is itself rounded to bf16 at each write, 2^-9 of a residual
# of at most half a bf16 step (2^-9 of the weight), so up to 2^-18 of the weight a step (relative
# to max(|w|, 1e-2) below); the fp32 arithmetic of the rule and the GEMM's summation order add far
# less. Measured worst over the rules: 2.4e-5 after 4 steps (within STEPS x 2^-16 at 3 steps, too).
PAIR_PRECISION = STEPS * 2.0**-16


def _problem(rule: str):
    torch.manual_seed(0)
    w0 = (torch.randn(24, 40) * 0.5 + 1.0).to(torch.bfloat16)  # weights near 1: a bf16 step is 2^-7
    b0 = (torch.randn(40) * 0.5).to(torch.bfloat16)
    batches = [(torch.randn(16, 24), torch.randn(16, 40) * 0.1) for _ in range(STEPS)]  # dy, x
    return w0, b0, batches


def _forge_run(rule: str, hp: dict, master_weights: str):
    """STEPS direct updates of a bf16 weight (fused kernel) and a bf16 vector (element-wise kernel)."""
    w0, b0, batches = _problem(rule)
    w, b = nn.Parameter(w0.clone()), nn.Parameter(b0.clone())
    opt = ForgeOptimizer([w, b], rule, state_dtype="fp32", master_weights=master_weights, **hp)
    for dy, x in batches:
        opt.update_linear(w, dy, x)
        opt.update_elementwise(b, _grads(dy, x)[1])
    return w, b, opt


def _grads(dy, x):
    """The weight's gradient dy^T x (in fp64, rounded once) and the vector's."""
    g_w = (dy.double().T @ x.double()).float()
    return g_w, x.sum(0)  # the vector's gradient: any fresh values of its size


def _torch_run(rule: str, hp: dict):
    """torch.optim on fp32 master copies of the same bf16 start, with the same gradients."""
    w0, b0, batches = _problem(rule)
    w, b = nn.Parameter(w0.float()), nn.Parameter(b0.float())
    opt = forge.torch_optimizer(rule, [w, b], **hp)
    for dy, x in batches:
        w.grad, b.grad = _grads(dy, x)
        opt.step()
    return w, b


def _effective(p: torch.Tensor, opt: ForgeOptimizer) -> torch.Tensor:
    return p.detach().float() + opt.state[p]["weight_residual"].float()


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_the_pair_carries_the_fp32_master_weight(case):
    rule, hp = case, CASES[case]
    w, b, opt = _forge_run(rule, hp, "bf16+kahan")
    w_ref, b_ref = _torch_run(rule, hp)
    for p, ref, what in ((w, w_ref, "fused"), (b, b_ref, "element-wise")):
        effective = _effective(p, opt)
        error = ((effective - ref.detach()).abs() / ref.detach().abs().clamp_min(1e-2)).max()
        assert error <= PAIR_PRECISION, f"{what}: {float(error):.3g} of the weight from fp32 master"
        assert p.dtype == torch.bfloat16 and opt.state[p]["weight_residual"].dtype == torch.bfloat16
        # the bf16 part is a nearest bf16 of the pair: the residual is at most half a bf16 step
        exponent = torch.frexp(p.detach().float()).exponent
        half_step = torch.ldexp(torch.ones_like(effective), exponent - 9)
        assert (opt.state[p]["weight_residual"].float().abs() <= half_step).all()


def test_plain_bf16_loses_the_updates_the_pair_keeps():
    """AdamW at lr 1e-3 on weights near 1: each update is under half a bf16 step, so rounding to
    nearest keeps the weights where they were; the pair moves them as fp32 does."""
    hp = dict(lr=1e-3, weight_decay=0.0)
    w_rn, _, _ = _forge_run("adamw", hp, "bf16")
    w_kahan, _, opt = _forge_run("adamw", hp, "bf16+kahan")
    w_ref, _ = _torch_run("adamw", hp)
    w0 = _problem("adamw")[0].float()
    moved_ref = (w_ref.detach() - w0).norm()
    lost_rn = float((w_rn.detach().float() - w_ref.detach()).norm() / moved_ref)
    lost_kahan = float((_effective(w_kahan, opt) - w_ref.detach()).norm() / moved_ref)
    assert lost_rn > 0.5 and lost_kahan < 0.02, (lost_rn, lost_kahan)


def test_a_model_trains_with_compensated_weights_and_resumes_exactly():
    torch.manual_seed(1)
    from tests.helpers import mlp

    model = mlp().to(torch.bfloat16)
    twin = copy.deepcopy(model)
    opt = forge.attach(model, "adamw", lr=1e-3, master_weights="bf16+kahan")
    batches = [(x.bfloat16(), y.bfloat16()) for x, y in regression_batches(4)]
    losses = [float(regression_step(model, batch).detach()) for batch in batches[:2]]
    saved = copy.deepcopy(opt.state_dict())
    weights = copy.deepcopy(model.state_dict())
    losses += [float(regression_step(model, batch).detach()) for batch in batches[2:]]
    assert any(opt.state[p]["weight_residual"].abs().max() > 0 for p in model.parameters())
    # resume: the saved weights and states (residuals among them) give the same last two steps
    twin.load_state_dict(weights)
    opt_twin = forge.attach(twin, "adamw", lr=1e-3, master_weights="bf16+kahan")
    opt_twin.load_state_dict(saved)
    again = [float(regression_step(twin, batch).detach()) for batch in batches[2:]]
    assert again == losses[2:]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_bad_master_weights_are_refused_before_anything_changes():
    model = nn.Linear(8, 4)  # fp32
    with pytest.raises(TypeError, match="compensates bf16 weights"):
        forge.attach(model, "adamw", master_weights="bf16+kahan")
    with pytest.raises(ValueError, match="master_weights='fp8' is not supported"):
        forge.attach(model.to(torch.bfloat16), "adamw", master_weights="fp8")
    assert type(model) is nn.Linear
