"""A fused nn.Linear used twice in one graph, or a graph run backward twice, is refused before any
parameter is updated: weights, biases, states and step counts all stay as they were.

Before: the refusal came from the backward of the first use, after the second use's fused update
(and the hooked updates of every parameter nearer the loss) had been applied: a half-stepped model.
"""

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import forge


class Twice(nn.Module):
    """A Linear applied twice, a bias-carrying Linear before it, a LayerNorm after it: in backward the
    LayerNorm's hooked update and the outer call's fused update come before the inner call's."""

    def __init__(self):
        super().__init__()
        self.inp, self.shared, self.norm = nn.Linear(5, 6), nn.Linear(6, 6), nn.LayerNorm(6)
        self.twice = True

    def forward(self, x):
        h = torch.tanh(self.shared(self.inp(x)))
        return self.norm(self.shared(h) if self.twice else h)


def _snapshot(model, opt):
    weights = [p.detach().clone() for p in model.parameters()]
    states = [
        {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
        for p in model.parameters()
    ]
    return weights, states


def _assert_unchanged(model, opt, snapshot):
    weights, states = snapshot
    for (name, p), w, saved in zip(model.named_parameters(), weights, states):
        assert torch.equal(p, w), f"{name} was updated by a refused backward"
        for key, value in saved.items():
            now = opt.state[p][key]
            assert torch.equal(now, value) if torch.is_tensor(value) else now == value, f"{name}: {key} moved"


def test_a_linear_called_twice_is_refused_before_any_update():
    model = Twice()
    opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
    x = torch.randn(3, 5)
    model.twice = False
    model(x).square().mean().backward()  # one ordinary step first: states are not all zero
    model.twice = True
    snapshot = _snapshot(model, opt)
    assert all(opt.state[p]["step"] == 1 for p in model.parameters())
    with pytest.raises(
        RuntimeError, match=r"shared\.weight is used twice.*called twice.*nothing has been updated"
    ):
        model(x).square().mean().backward()
    _assert_unchanged(model, opt, snapshot)


def test_two_forwards_then_one_backward_through_both_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    opt = forge.attach(model, "sgd", lr=0.1, momentum=0.9, state_dtype="fp32")
    snapshot = _snapshot(model, opt)
    x1, x2 = torch.randn(2, 4), torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="used twice"):
        (model(x1) + model(x2)).sum().backward()
    _assert_unchanged(model, opt, snapshot)


def test_a_second_backward_through_a_retained_graph_is_refused_before_any_update():
    """Before, the LayerNorm (hooked, nearest the loss) took a second step before the refusal."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3), nn.LayerNorm(3))
    opt = forge.attach(model, "adamw", state_dtype="fp32")
    loss = model(torch.randn(2, 4)).square().mean()
    loss.backward(retain_graph=True)
    snapshot = _snapshot(model, opt)
    with pytest.raises(RuntimeError, match="already updated since this forward.*nothing has been updated"):
        loss.backward()
    _assert_unchanged(model, opt, snapshot)


def test_after_a_refusal_training_goes_on():
    model = Twice()
    opt = forge.attach(model, "sgd", lr=0.1)
    x = torch.randn(3, 5)
    with pytest.raises(RuntimeError, match="used twice"):
        model(x).sum().backward()
    assert all(opt.state[p]["step"] == 0 for p in model.parameters())
    model.twice = False
    model(x).sum().backward()
    assert all(opt.state[p]["step"] == 1 for p in model.parameters())


def test_a_graph_kept_alive_without_backward_does_not_refuse_the_next_step():
    """Only the uses this backward will reach count: an evaluation graph still alive (kept in a list,
    never backwarded) is no second use."""
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    opt = forge.attach(model, "sgd", lr=0.1)
    kept = [model(torch.randn(2, 4)).sum() for _ in range(2)]
    model(torch.randn(2, 4)).sum().backward()
    assert opt.state[model[0].weight]["step"] == 1 and len(kept) == 2


def test_activation_checkpointing_is_no_second_use():
    """The recompute runs the forward again inside the backward: its nodes never run backward."""
    base = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3), nn.LayerNorm(3))
    plain, ckpt = copy.deepcopy(base), copy.deepcopy(base)
    forge.attach(plain, "adamw", lr=1e-2, state_dtype="fp32")
    forge.attach(ckpt, "adamw", lr=1e-2, state_dtype="fp32")
    for _ in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        plain(x).square().mean().backward()
        checkpoint(ckpt, x, use_reentrant=False).square().mean().backward()
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        assert torch.equal(p, q)
