"""The eager ForgeLinear path without a Python autograd node (`forge.nn._hooked_linear`): torch's own
linear of the weight detached, its GEMM node computing dx, a post-hook on that node running the
fused update. It must step exactly as `ForgeLinearFunction` does, free what it holds as the Function
would, and refuse what the Function refuses."""

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

import forge
import forge.nn as forge_nn


def _steps(layer: nn.Module, xs: list[torch.Tensor], hooked: bool, monkeypatch) -> tuple[list, list]:
    """Two steps of a fused copy of `layer` on inputs `xs`: its parameters after them, and each dx."""
    layer = copy.deepcopy(layer)
    forge.attach(layer, "adamw", lr=1e-2, state_dtype="fp32")
    taken = []
    hook = forge_nn._hooked_linear

    def counted(*args):
        taken.append(1)
        return hook(*args)

    monkeypatch.setattr(forge_nn, "_hooked_linear", counted if hooked else lambda *args: None)
    grads = []
    for x in xs:
        x = x.clone().requires_grad_(True)
        layer(x).pow(2).sum().backward()
        grads.append(x.grad)
    assert len(taken) == (len(xs) if hooked else 0)
    return [p.detach().clone() for p in layer.parameters()], grads


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(6, 24), (2, 3, 24)])
def test_the_hooked_path_steps_as_the_function_does(monkeypatch, bias, shape):
    """The weight, the bias and dx after two steps equal the Function's bit for bit, for 2-D and 3-D
    inputs (the GEMM node below the view that unfolds the rows), with and without a bias."""
    torch.manual_seed(0)
    layer = nn.Linear(24, 40, bias=bias)
    xs = [torch.randn(shape) for _ in range(2)]
    hooked = _steps(layer, xs, True, monkeypatch)
    function = _steps(layer, xs, False, monkeypatch)
    for a, b in zip(hooked[0] + hooked[1], function[0] + function[1]):
        assert torch.equal(a, b)


def test_a_hooked_layer_frees_its_input_after_backward_and_when_its_graph_is_dropped():
    """After its backward a hooked use lets go of x at once (no reference cycle is left); a forward
    whose graph is dropped without a backward frees x once the garbage collector has run."""
    layer = nn.Linear(8, 4)
    forge.attach(layer, "adamw", lr=1e-2, state_dtype="fp32")
    x = torch.randn(3, 8, requires_grad=True)
    held = weakref.ref(x)
    layer(x).sum().backward()
    del x
    assert held() is None
    x = torch.randn(3, 8, requires_grad=True)
    held = weakref.ref(x)
    y = layer(x)
    del x, y
    gc.collect()
    assert held() is None


def test_an_input_changed_in_place_after_the_forward_is_refused():
    """The fused update needs x as the forward saw it; torch refuses a saved tensor changed in place,
    and so does the hooked path."""
    layer = nn.Linear(8, 4, bias=False)
    forge.attach(layer, "adamw", lr=1e-2, state_dtype="fp32")
    x = torch.randn(3, 8, requires_grad=True)
    h = x * 1
    y = layer(h)
    with torch.no_grad():
        h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_compiled_autograd_over_a_hooked_forward_steps_as_eager():
    """Compiled autograd traces the GEMM node's post-hook; the step runs outside its graph, as the
    Function's does while compiling, and trains as eager to the bit."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(24, 40, bias=False), nn.GELU(), nn.Linear(40, 5, bias=False))
    xs = [torch.randn(6, 24) for _ in range(2)]
    trained = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        forge.attach(model, "adamw", lr=1e-3, state_dtype="fp32")
        for x in xs:
            loss = model(x.clone().requires_grad_(True)).pow(2).mean()
            if compiled:
                with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
                    loss.backward()
            else:
                loss.backward()
        trained.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*trained):
        assert torch.equal(a, b)


def test_a_module_in_eval_mode_keeps_the_function(monkeypatch):
    """In eval mode (forwards without a backward are the rule there) the layer takes the Function,
    whose graph is freed as soon as it is dropped; in training mode the hooked path."""
    layer = nn.Linear(8, 4)
    forge.attach(layer, "adamw", lr=1e-2, state_dtype="fp32")
    x = torch.randn(3, 8, requires_grad=True)
    assert type(layer(x).grad_fn).__name__ == "AddmmBackward0"
    layer.eval()
    assert type(layer(x).grad_fn).__name__ == "ForgeLinearFunctionBackward"
