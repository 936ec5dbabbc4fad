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
