"""`forge.rules`, end to end: with fp32 weights and fp32 states every rule equals torch.optim
(Lion: forge.baseline.Lion).

Through the public API on a small model whose Linear weights take the fused kernel and whose bias and
LayerNorm take the element-wise kernel. Shapes are odd on purpose (not multiples of any tile), three
steps, weight decay on. The weights are compared relative to the update torch.optim applied
(`tests.forge.exactness`): the only difference allowed is the summation order of dW over tokens
inside the GEMM, which the step carries over.
"""

import pytest
import torch
from torch import nn

from tests.forge.exactness import FUSED_FP32, assert_close_to_update
from tests.helpers import RULE_CASES, relative_error, train_pair

# (batch dims, in_features, out_features): single elements, odd sizes, a 3-D input.
# On the interpreter the last is 2 x 3 tiles of 32 x 64, both edges partial.
SHAPES = {"1x1": ((1,), 1, 1), "17x23": ((5,), 23, 17), "9x41x141": ((3, 3), 141, 41)}


def _model(in_features: int, out_features: int) -> nn.Module:
    # LayerNorm at the end (7 features): a norm over one feature has an all-zero gradient, whose
    # rounding noise an eps-normalized rule (RMSprop) would turn into arbitrary steps.
    return nn.Sequential(
        nn.Linear(in_features, out_features), nn.Tanh(), nn.Linear(out_features, 7), nn.LayerNorm(7)
    )


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("case", RULE_CASES, ids=RULE_CASES.keys())
def test_rule_matches_torch(case, shape):
    rule = case.split("-")[0]
    batch_dims, k, n = shape
    model = _model(k, n)
    make_batch = lambda: (torch.randn(*batch_dims, k), torch.randn(*batch_dims, 7))
    loss_fn = lambda m, batch: ((m(batch[0]) - batch[1]) ** 2).mean()

    a, b, opt_f, opt_t, near_zero_grad = train_pair(
        model, rule, 3, make_batch, loss_fn, dict(state_dtype="fp32"), **RULE_CASES[case]
    )

    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), model.parameters()):
        assert_close_to_update(pa, pb, p0, FUSED_FP32, name, near_zero_grad[pb])
        assert pa.grad is None, f"{name}: FORGE left a gradient behind"
        for key, ref in opt_t.state[pb].items():
            if isinstance(ref, torch.Tensor) and ref.shape == pb.shape:
                assert relative_error(opt_f.state[pa][key], ref) <= 1e-5, f"{name}: state {key} differs"
        assert opt_f.state[pa]["step"] == 3


def test_fused_path_is_taken():
    """The Linear weights are fused: they change, yet no gradient ever lands in .grad."""
    import forge

    model = _model(8, 8)
    opt = forge.attach(model, "sgd", lr=0.1)
    assert type(model[0]).__name__ == "ForgeLinear" and type(model[2]).__name__ == "ForgeLinear"
    assert type(model[3]).__name__ == "LayerNorm"
    # autograd runs post-accumulate hooks even for an input whose gradient is None: record what they see.
    grads_seen = []
    model[0].weight.register_post_accumulate_grad_hook(lambda p: grads_seen.append(p.grad))
    before = model[0].weight.detach().clone()
    (model(torch.randn(4, 8)) ** 2).mean().backward()
    assert all(g is None for g in grads_seen) and model[0].weight.grad is None
    assert not torch.equal(before, model[0].weight.detach())
    assert opt.state[model[0].weight]["step"] == 1


def test_each_rules_defaults_are_its_torch_optimizers():
    """Every hyperparameter a rule shares with its torch.optim class (Lion: `forge.baseline.Lion`)
    defaults to the class's own default; what torch.optim's signature lacks (Muon's
    `newton_schulz`) is FORGE's."""
    import inspect

    import forge

    for rule in forge.RULES.values():
        signature = inspect.signature(rule.torch_class().__init__).parameters
        shared = {k: v for k, v in rule.defaults.items() if k in signature}
        assert shared, rule.name
        for key, value in shared.items():
            default = signature[key].default
            if isinstance(default, torch.Tensor):
                default = default.item()
            assert value == (tuple(default) if isinstance(default, list) else default), (rule.name, key)


def test_muons_tile_half_reference_is_torchs_lerp():
    """`reference_update`'s Muon half (the momentum and what Newton-Schulz is given) is
    torch.optim.Muon's `lerp_`, with Nesterov's momentum and without, to a few fp32 ulps (torch's
    kernel may fuse the product and the sum that the reference rounds apart)."""
    from forge.rules import get_rule, reference_update, resolve_hparams

    rule = get_rule("muon")
    g, buf = torch.randn(9, 13), torch.randn(9, 13)
    for nesterov in (True, False):
        h = resolve_hparams(rule, dict(momentum=0.95, nesterov=nesterov))
        states = [buf.clone(), None, None]
        update = reference_update(
            rule, h, torch.zeros(9, 13), g, states, rule.coefficients(h, 1, {"rows": 9, "cols": 13})
        )
        expected = buf.clone().lerp_(g, 1 - 0.95)
        ulps = dict(rtol=0, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()))
        torch.testing.assert_close(states[0], expected, **ulps)
        torch.testing.assert_close(update, g.lerp(expected, 0.95) if nesterov else expected, **ulps)


def test_radam_steps_as_torch_with_its_rectification_at_full_weight():
    """RAdam with beta2 = 0.9 (rho_inf = 19): rectified from step 6 on, where the rectification
    term carries a third of the step and more, each step after; twelve element-wise steps against
    torch.optim.RAdam on the same gradients, the weights compared relative to torch's update at
    every step from the start."""
    import forge
    from tests.forge.exactness import ELEMENTWISE_FP32

    torch.manual_seed(8)
    hp = dict(lr=1e-2, betas=(0.9, 0.9), weight_decay=0.1)
    w = nn.Parameter(torch.randn(9, 70))
    oracle = nn.Parameter(w.detach().clone())
    opt = forge.ForgeOptimizer([w], "radam", state_dtype="fp32", **hp)
    torch_opt = torch.optim.RAdam([oracle], **hp)
    w0 = w.detach().clone()
    for step in range(1, 13):
        g = torch.randn(9, 70)
        opt.update_elementwise(w, g)
        oracle.grad = g
        torch_opt.step()
        assert_close_to_update(w.detach(), oracle.detach(), w0, ELEMENTWISE_FP32, f"step {step}")
