"""No silent no-op: every parameter a ForgeOptimizer holds is trained by the next backward.

Before: parameters added with `opt.add_param_group` after `forge.attach` got states but no fused
kernel and no hook, and `forge.ForgeOptimizer(model.parameters(), rule)` built directly, as a
torch.optim optimizer is, trained nothing; both silently.
"""

import copy

import pytest
import torch
from torch import nn

import forge
from tests.forge.exactness import assert_close_to_update

# fp32 weights and states. Hooked parameters get the same gradient as torch.optim's, bit for bit,
# and the element-wise kernel's fma-contracted arithmetic differs from torch's by a few ulps of
# each term; fused weights add the GEMM's summation order (~1e-7 relative per dW element), which
# Adam's normalization can amplify in an element whose gradient cancels. 1e-4 of the update's
# norm is ~100x what either gives at these shapes over these steps, and ~1000x below a wrong term.
TOL = 1e-4


def _model():
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3), nn.LayerNorm(3))


def _batches(n, k=6):
    return [(torch.randn(4, k), torch.randn(4, 3)) for _ in range(n)]


def _loss(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def _train(model, opt, batches, torch_style: bool):
    for batch in batches:
        if torch_style:
            opt.zero_grad()
        _loss(model, batch).backward()
        opt.step()


def test_add_param_group_after_attach_fuses_and_hooks_the_new_parameters():
    base, batches = _model(), _batches(3)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt = forge.attach(a, "adamw", params=list(a[0].parameters()), lr=1e-2, state_dtype="fp32")
    opt.add_param_group({"params": list(a[2].parameters()), "lr": 3e-2})
    opt.add_param_group({"params": list(a[3].parameters()), "weight_decay": 0.0})
    assert type(a[2]) is forge.ForgeLinear, "the new group's nn.Linear takes the fused kernel"
    ref = torch.optim.AdamW(list(b[0].parameters()), lr=1e-2)
    ref.add_param_group({"params": list(b[2].parameters()), "lr": 3e-2})
    ref.add_param_group({"params": list(b[3].parameters()), "weight_decay": 0.0})

    _train(a, opt, batches, torch_style=False)
    _train(b, ref, batches, torch_style=True)
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), base.parameters()):
        assert not torch.equal(pa, p0), f"{name} was not trained"
        assert pa.grad is None, f"{name}: FORGE left a gradient behind"
        assert_close_to_update(pa, pb, p0, TOL, name)
        assert opt.state[pa]["step"] == 3


def test_a_parameter_outside_the_model_is_hooked():
    model = _model()
    scale = nn.Parameter(torch.ones(3))
    opt = forge.attach(model, "sgd", lr=0.1)
    opt.add_param_group({"params": [scale]})
    before = scale.detach().clone()
    x = torch.randn(4, 6)
    (model(x) * scale).square().mean().backward()
    assert not torch.equal(scale, before) and scale.grad is None and opt.state[scale]["step"] == 1


def test_add_param_group_after_detach_is_refused_and_names_the_right_call():
    model = _model()
    opt = forge.attach(model, "adamw", params=list(model[0].parameters()))
    forge.detach(model)
    with pytest.raises(RuntimeError, match=r"no longer attached.*forge\.attach\(model, rule, params="):
        opt.add_param_group({"params": list(model[2].parameters())})
    assert len(opt.param_groups) == 1 and model[2].weight not in opt.state
    assert type(model[2]) is nn.Linear and not model[2].bias._post_accumulate_grad_hooks


@pytest.mark.parametrize("rule,hparams", [("adamw", dict(lr=1e-2)), ("sgd", dict(lr=0.1, momentum=0.9))])
def test_a_directly_built_optimizer_trains_every_parameter(rule, hparams):
    """Built as a torch.optim optimizer is, it hooks every parameter (nn.Linear weights included:
    no module is known to fuse) and equals torch.optim, in a loop written for torch.optim."""
    base, batches = _model(), _batches(3)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt = forge.ForgeOptimizer(a.parameters(), rule, state_dtype="fp32", **hparams)
    ref = forge.torch_optimizer(rule, b.parameters(), **hparams)
    assert all(type(m) is not forge.ForgeLinear for m in a.modules())
    _train(a, opt, batches, torch_style=True)
    _train(b, ref, batches, torch_style=True)
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), base.parameters()):
        assert not torch.equal(pa, p0), f"{name} was not trained"
        assert pa.grad is None
        assert_close_to_update(pa, pb, p0, TOL, name)


def test_a_directly_built_optimizer_trains_an_added_group():
    model = _model()
    opt = forge.ForgeOptimizer(model[0].parameters(), "sgd", lr=0.1)
    opt.add_param_group({"params": list(model[2].parameters())})
    before = model[2].weight.detach().clone()
    _loss(model, _batches(1)[0]).backward()
    assert not torch.equal(model[2].weight, before) and opt.state[model[2].weight]["step"] == 1
    assert model[3].weight.grad is not None  # never given to the optimizer: an ordinary gradient
