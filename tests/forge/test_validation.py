"""Every hyperparameter of every rule is checked when FORGE is attached (or a group added), with
torch.optim's own messages, and a refusal leaves the model, the weights and the states as they were.

Before these checks FORGE accepted eps=-1, weight_decay=-1, momentum=-1, betas=(1.5, 0.9) and
lr=nan; betas=(1.0, x) raised ZeroDivisionError in the middle of a backward.
"""

import copy
import math

import pytest
import torch
from torch import nn

import forge
from tests.forge.exactness import FUSED_FP32, assert_close_to_update, near_zero

NAN, INF = math.nan, math.inf
WITH_EPS = ("adamw", "nadam", "radam", "rmsprop", "adagrad")

# (rule, bad option, message torch.optim gives for it). Every rule, every range check.
BAD = [
    *[(rule, dict(lr=-1e-3), "Invalid learning rate: -0.001") for rule in forge.RULES],
    *[(rule, dict(lr=NAN), "Invalid learning rate: nan") for rule in forge.RULES],
    *[(rule, dict(lr=INF), "Invalid learning rate: inf") for rule in forge.RULES],
    *[(rule, dict(weight_decay=-1.0), "Invalid weight_decay value: -1.0") for rule in forge.RULES],
    *[(rule, dict(weight_decay=NAN), "Invalid weight_decay value: nan") for rule in forge.RULES],
    *[(r, dict(eps=-1.0), "Invalid epsilon value: -1.0") for r in WITH_EPS],
    *[(r, dict(eps=NAN), "Invalid epsilon value: nan") for r in WITH_EPS],
    *[
        (r, dict(betas=betas), f"Invalid beta parameter at index {i}: {bad}")
        for r in ("adamw", "nadam", "radam")
        for betas, i, bad in (
            ((1.5, 0.9), 0, 1.5),
            ((1.0, 0.9), 0, 1.0),  # ZeroDivisionError mid-backward before: 1 - beta1**step = 0
            ((-0.1, 0.9), 0, -0.1),
            ((0.9, 1.0), 1, 1.0),
            ((0.9, NAN), 1, "nan"),
        )
    ],
    ("lion", dict(betas=(1.5, 0.99)), "Invalid beta parameter at index 0: 1.5"),
    ("lion", dict(betas=(0.9, -0.5)), "Invalid beta parameter at index 1: -0.5"),
    ("adamw", dict(betas=(0.9,)), "Invalid betas"),
    ("nadam", dict(momentum_decay=-1.0), "Invalid momentum_decay value: -1.0"),
    ("rmsprop", dict(momentum=-1.0), "Invalid momentum value: -1.0"),
    ("rmsprop", dict(alpha=-0.5), "Invalid alpha value: -0.5"),
    ("rmsprop", dict(alpha=1.5), "Invalid alpha value: 1.5"),  # square_avg would go negative: NaN steps
    ("adagrad", dict(lr_decay=-1.0), "Invalid lr_decay value: -1.0"),
    ("adagrad", dict(initial_accumulator_value=-1.0), "Invalid initial_accumulator_value value: -1.0"),
    ("sgd", dict(momentum=-1.0), "Invalid momentum value: -1.0"),
    ("sgd", dict(momentum=NAN), "Invalid momentum value: nan"),
    ("sgd", dict(momentum=0.9, dampening=NAN), "Invalid dampening value: nan"),
    ("sgd", dict(nesterov=True), "Nesterov momentum requires a momentum and zero dampening"),
    ("sgd", dict(nesterov=True, momentum=0.9, dampening=0.1), "Nesterov momentum requires a momentum"),
]


def _ids(case):
    rule, bad, _ = case
    return f"{rule}-" + "-".join(f"{k}={v}" for k, v in bad.items())


def _model(rule: str = "adamw"):
    """Two linear layers and a LayerNorm; for a rule that trains matrices only (Muon), the linear
    layers alone, without biases."""
    if forge.RULES[rule].whole_matrix:
        return nn.Sequential(nn.Linear(5, 4, bias=False), nn.Tanh(), nn.Linear(4, 3, bias=False))
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3), nn.LayerNorm(3))


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _untouched(model, before):
    assert all(type(m) is not forge.ForgeLinear for m in model.modules()), "a Linear was swapped"
    assert not hasattr(model, "_forge_optimizer"), "the model was marked as attached"
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)
        assert not p._post_accumulate_grad_hooks, "a hook was left on a parameter"


@pytest.mark.parametrize("case", BAD, ids=[_ids(c) for c in BAD])
def test_attach_refuses_with_torch_optims_message(case):
    rule, bad, message = case
    model = _model(rule)
    before = _snapshot(model)
    with pytest.raises(ValueError, match="^" + _escape(message)):
        forge.attach(model, rule, **bad)
    _untouched(model, before)
    forge.attach(model, rule)  # nothing of the refused attach is left behind


@pytest.mark.parametrize("case", BAD, ids=[_ids(c) for c in BAD])
def test_direct_construction_refuses_too(case):
    rule, bad, message = case
    with pytest.raises(ValueError, match="^" + _escape(message)):
        forge.ForgeOptimizer(_model(rule).parameters(), rule, **bad)


@pytest.mark.parametrize("case", BAD[::5], ids=[_ids(c) for c in BAD[::5]])
def test_a_param_group_dict_is_checked(case):
    rule, bad, message = case
    model = _model(rule)
    before = _snapshot(model)
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[2].parameters()), **bad}]
    with pytest.raises(ValueError, match="^" + _escape(message)):
        forge.attach(model, rule, params=groups)
    _untouched(model, before)


@pytest.mark.parametrize("case", BAD[::5], ids=[_ids(c) for c in BAD[::5]])
def test_add_param_group_is_checked_before_anything_is_added(case):
    rule, bad, message = case
    model = _model(rule)
    opt = forge.attach(model, rule, params=list(model[0].parameters()))
    groups, states = len(opt.param_groups), len(opt.state)
    with pytest.raises(ValueError, match="^" + _escape(message)):
        opt.add_param_group({"params": list(model[2].parameters()), **bad})
    assert len(opt.param_groups) == groups and len(opt.state) == states
    assert type(model[2]) is nn.Linear and not model[2].weight._post_accumulate_grad_hooks


def test_a_group_option_is_checked_with_the_optimizers_defaults():
    """nesterov=True in a group is valid when the defaults give momentum > 0 (as torch.optim fills
    a group from its defaults); before, the group was checked against the rule's momentum=0."""
    model = _model()
    groups = [
        {"params": list(model[0].parameters()), "nesterov": True},
        {"params": list(model[2].parameters())},
    ]
    opt = forge.attach(model, "sgd", params=groups, lr=0.1, momentum=0.9)
    assert opt.param_groups[0]["nesterov"] and opt.param_groups[0]["momentum"] == 0.9
    torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(1))], "nesterov": True}], lr=0.1, momentum=0.9)


def test_a_parameter_forge_cannot_update_refuses_the_whole_group():
    """A bad parameter in the middle of a group: before, the group's earlier parameters had states."""
    model = _model()
    opt = forge.attach(model, "adamw", params=list(model[0].parameters()))
    half = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    with pytest.raises(TypeError, match="fp32 and bf16 weights only"):
        opt.add_param_group({"params": [model[2].weight, half]})
    assert len(opt.param_groups) == 1 and model[2].weight not in opt.state
    assert type(model[2]) is nn.Linear


@pytest.mark.parametrize(
    "rule, options",
    [
        ("adamw", dict(lr=0.0, eps=0.0, weight_decay=0.0, betas=(0.0, 0.0))),
        ("lion", dict(betas=(1.0, 1.0))),
        ("rmsprop", dict(alpha=1.0, momentum=0.0)),
        ("sgd", dict(momentum=0.9, nesterov=True)),
        ("adagrad", dict(lr_decay=0.0, initial_accumulator_value=0.0)),
    ],
    ids=["adamw-zeros", "lion-betas-one", "rmsprop-alpha-one", "sgd-nesterov", "adagrad-zeros"],
)
def test_valid_edges_are_accepted_and_step_as_torch_optim(rule, options):
    """Values torch.optim accepts (zero lr, eps and weight decay, beta = 0, Lion's beta = 1, alpha =
    1) are accepted, and a step with them lands where torch.optim's does: finite, and within the
    rule tests' tolerance of its update (exactly unmoved where it does not move), leaving out as
    they do the elements whose gradient came within rounding of zero (RMSprop with alpha = 1 keeps
    a zero average and divides by eps alone: a second step would start from weights moved by
    lr / eps times the gradient, where the GEMM's rounding of it decides the next gradient)."""
    base = _model()
    model, twin = copy.deepcopy(base), copy.deepcopy(base)
    forge.attach(model, rule, state_dtype="fp32", **options)
    torch_opt = forge.torch_optimizer(rule, twin.parameters(), **options)
    x = torch.randn(6, 5)
    model(x).square().mean().backward()
    twin(x).square().mean().backward()
    ambiguous = {q: near_zero(q.grad) for q in twin.parameters()}
    torch_opt.step()
    for (name, p), q, p0 in zip(model.named_parameters(), twin.parameters(), base.parameters()):
        assert torch.isfinite(p).all(), f"{name}: a NaN or an infinity"
        assert_close_to_update(p, q, p0, FUSED_FP32, name, ambiguous[q])


@pytest.mark.parametrize("flag", ["differentiable"])
def test_flags_forge_cannot_honour_are_refused(flag):
    """differentiable=True was silently ignored; maximize and amsgrad were already refused."""
    model = _model()
    with pytest.raises(ValueError, match=f"{flag}=True is not supported by FORGE"):
        forge.attach(model, "adamw", **{flag: True})
    _untouched(model, _snapshot(model))
    forge.attach(model, "adamw", differentiable=False, foreach=True, fused=True)  # no-ops here: accepted


def test_maximize_and_amsgrad_are_refused():
    for flag in ("maximize", "amsgrad"):
        with pytest.raises(ValueError, match=f"{flag}=True is not supported by FORGE"):
            forge.attach(_model(), "adamw", **{flag: True})


def test_a_group_changed_after_attach_is_refused_before_any_update():
    """A hyperparameter set out of range after attach (by hand, or a scheduler gone wrong) is
    refused at the first update of the next backward: the LayerNorm's hooked update, which runs
    before any fused one, has not happened either. Before: ZeroDivisionError in mid-backward, with
    the LayerNorm already stepped."""
    model = _model()
    opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
    x = torch.randn(6, 5)
    model(x).square().mean().backward()
    before = _snapshot(model)
    states = [{k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in opt.state]
    opt.param_groups[0]["betas"] = (1.0, 0.999)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0: 1.0"):
        model(x).square().mean().backward()
    for p, q, saved in zip(model.parameters(), before, states):
        assert torch.equal(p, q)
        assert opt.state[p]["step"] == 1
        assert all(torch.equal(opt.state[p][k], v) for k, v in saved.items())
    opt.param_groups[0]["betas"] = (0.9, 0.999)
    model(x).square().mean().backward()  # and training goes on
    assert all(opt.state[p]["step"] == 2 for p in model.parameters())


def _escape(message: str) -> str:
    import re

    return re.escape(message)
