"""`forge.nn.ForgeLinear`: its backward applies the step, through the eager Function or, while
torch.compile traces, the custom ops of `forge.ops` (tests/forge/test_compile.py compiles models),
and refuses to apply it twice."""

import copy

import pytest
import torch
from torch import nn

import forge
from tests.helpers import mlp, regression_batches, regression_step


def _two_copies(**options):
    base = mlp()
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    return forge.attach(eager, "adamw", **options), eager, forge.attach(traced, "adamw", **options), traced


def test_eager_backward_calls_the_optimizer_directly(monkeypatch):
    """No compiler wrapper and no custom op on the eager host path."""
    import forge.nn as forge_nn

    outside = []
    monkeypatch.setattr(forge_nn, "_fused_step_outside_graph", lambda *a: outside.append(1))
    opt, model, _, _ = _two_copies()
    direct = []
    update = opt.update_linear  # `forge.updates.Updates.update_linear`, bound: what the layers call
    monkeypatch.setattr(opt, "update_linear", lambda *a, **k: direct.append(1) or update(*a, **k))
    regression_step(model, regression_batches(1)[0])
    assert (len(direct), len(outside)) == (2, 0)


@pytest.mark.skipif(not forge.nn.COMPILE_OPS, reason="torch < 2.11 compiles FORGE without its custom ops")
def test_while_compiling_a_forge_linear_goes_through_the_custom_ops(monkeypatch):
    """While torch.compile traces, the forward calls forge::linear and the step runs in
    forge::linear_backward (here run eagerly): the same update as the eager Function's."""
    import forge.ops

    _, eager, _, traced = _two_copies(state_dtype="fp32")
    batch = regression_batches(1)[0]
    regression_step(eager, batch)
    in_op = []
    update = forge.ops._linear_update
    monkeypatch.setattr(forge.ops, "_linear_update", lambda *a: in_op.append(1) or update(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    regression_step(traced, batch)
    assert len(in_op) == 2  # both linears
    for p, q in zip(eager.parameters(), traced.parameters()):
        assert torch.equal(p, q)


def test_the_function_steps_outside_the_graph_while_compiling(monkeypatch):
    """ForgeLinearFunction, which the tensor-parallel forward keeps under torch.compile, steps
    through the `torch.compiler.disable`d function while compiling, with the same update."""
    import forge.nn as forge_nn

    eager, traced = nn.Linear(24, 5), nn.Linear(24, 5)
    traced.load_state_dict(eager.state_dict())
    forge.attach(eager, "adamw", state_dtype="fp32")
    opt = forge.attach(traced, "adamw", state_dtype="fp32")
    x, y = regression_batches(1)[0]
    ((eager(x) - y) ** 2).mean().backward()
    outside = []
    wrapped = forge_nn._fused_step_outside_graph
    monkeypatch.setattr(forge_nn, "_fused_step_outside_graph", lambda *a: outside.append(1) or wrapped(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    ((forge_nn.forge_linear(x, traced.weight, traced.bias, opt, "weight") - y) ** 2).mean().backward()
    assert len(outside) == 1
    for p, q in zip(eager.parameters(), traced.parameters()):
        assert torch.equal(p, q)


def test_second_backward_through_a_retained_graph_is_refused():
    model = mlp()
    forge.attach(model, "adamw")
    x, y = regression_batches(1)[0]
    loss = ((model(x) - y) ** 2).mean()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already updated since this forward"):
        loss.backward()


def test_a_linear_called_twice_is_refused():
    layer = nn.Linear(8, 8)
    forge.attach(layer, "sgd")
    x = torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="called twice"):
        layer(layer(x)).sum().backward()
