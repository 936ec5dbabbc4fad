"""RAdam's rectified branch (rho_t > 5, from step 6 on with beta2 = 0.999) equals torch.optim.RAdam.

Every earlier RAdam test ran 3 steps, where rho_t < 5 and RAdam is momentum SGD: replacing the
rectification term by 1.0 passed them all. Here 10 steps run, fp32 weights and states, and the
steps 6-10 are compared against their own size, the weights' change from step 5 to step 10, so a
rectification off by a percent fails. The last test checks that this comparison sees a wrong term.
"""

import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

import forge
import forge.rules
from tests.forge.exactness import update_error

# fp32 weights and states: FORGE differs from torch.optim only by the GEMM's summation order of dW
# over the tokens (the LayerNorm and biases, hooked, get torch's own gradient) and by fma rounding,
# a few fp32 ulps of each step. Measured over 12 seeds: at most 2.3e-5 of the rectified steps' size
# (the parameter whose steps are smallest); 1e-4 leaves 4x margin, while the rectification (0.026
# at step 6, 0.049 at step 10) set to 1 moves the steps by 20-40x their size.
TOL = 1e-4
STEPS, PLAIN_STEPS = 10, 5


def _model():
    return nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 4), nn.LayerNorm(4))


def _rectified_distances(hparams):
    """Per parameter: FORGE's distance from torch.optim.RAdam after 10 steps, relative to the size
    of the rectified steps 6-10 (torch's weights at step 10 minus at step 5)."""
    base = _model()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt = forge.attach(a, "radam", state_dtype="fp32", **hparams)
    ref = torch.optim.RAdam(b.parameters(), **hparams)
    batches = [(torch.randn(6, 7), torch.randn(6, 4)) for _ in range(STEPS)]
    loss = lambda m, batch: ((m(batch[0]) - batch[1]) ** 2).mean()  # noqa: E731
    for i, batch in enumerate(batches, 1):
        loss(a, batch).backward()
        ref.zero_grad()
        loss(b, batch).backward()
        ref.step()
        if i == PLAIN_STEPS:
            forge_5 = [p.detach().clone() for p in a.parameters()]
            torch_5 = [p.detach().clone() for p in b.parameters()]
    assert all(opt.state[p]["step"] == STEPS for p in a.parameters())
    names = [name for name, _ in a.named_parameters()]
    steps = zip(names, a.parameters(), forge_5, b.parameters(), torch_5)
    return {name: update_error(fa - f5, tb - t5, torch.zeros_like(t5)) for name, fa, f5, tb, t5 in steps}


def _rho(step, beta2=0.999):
    rho_inf = 2 / (1 - beta2) - 1
    return rho_inf - 2 * step * beta2**step / (1 - beta2**step)


CASES = {
    "coupled": dict(lr=1e-2, weight_decay=0.1),
    "decoupled": dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "eps": dict(lr=3e-3, eps=1e-4, betas=(0.8, 0.999)),
}


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_rectified_steps_match_torch(case):
    assert _rho(PLAIN_STEPS) < 5 < _rho(PLAIN_STEPS + 1), "steps 6-10 must be the rectified ones"
    for name, err in _rectified_distances(CASES[case]).items():
        assert err <= TOL, f"{name}: {err:.3g} of the rectified steps' size from torch.optim.RAdam"


def test_a_rectification_of_one_would_fail(monkeypatch):
    """The same comparison with FORGE's rectification replaced by 1.0 is far outside TOL."""
    rule = forge.rules.RULES["radam"]

    def unrectified(h, step, st):
        c = list(rule.coefficients_fn(h, step, st))
        beta1, beta2 = h["betas"]
        if c[6]:  # the adaptive step size: lr * rect * sqrt(bias2) / bias1
            c[6] = h["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
        return tuple(c)

    monkeypatch.setitem(forge.rules.RULES, "radam", dataclasses.replace(rule, coefficients_fn=unrectified))
    distances = _rectified_distances(CASES["coupled"])
    assert min(distances.values()) > 100 * TOL, distances
