"""`forge.nn.ForgeLinear`: its backward applies the step, inside or outside torch.compile's graph,
and refuses to apply it twice."""

import copy

import pytest
import torch
from torch import nn

import forge
from tests.helpers import mlp, regression_batches, regression_step


def test_under_torch_compile_the_fused_step_leaves_the_graph(monkeypatch):
    """Eager backward calls the optimizer directly (no compiler wrapper on the host path); while
    torch.compile traces, the step goes through the `torch.compiler.disable`d function instead,
    and computes the same update."""
    import forge.nn as forge_nn

    base, batch = mlp(), regression_batches(1)[0]
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    forge.attach(eager, "adamw", state_dtype="fp32")
    forge.attach(traced, "adamw", state_dtype="fp32")
    regression_step(eager, batch)
    outside = []
    wrapped = forge_nn._fused_step_outside_graph
    monkeypatch.setattr(forge_nn, "_fused_step_outside_graph", lambda *a: outside.append(1) or wrapped(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    regression_step(traced, batch)
    assert len(outside) == 2  # both linears
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
