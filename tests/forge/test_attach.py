"""`forge.attach` / `forge.detach`: which parameters FORGE takes, giving them back, and what it
refuses (attaching twice, data parallelism)."""

import copy

import pytest
import torch
from torch import nn

import forge
from forge.nn import ForgeLinear
from tests.helpers import mlp, regression_batches, regression_step


def test_parameters_left_out_keep_ordinary_gradients():
    model = mlp()
    frozen_before = model[3].weight.detach().clone()
    opt = forge.attach(model, "sgd", params=list(model[0].parameters()), lr=0.1)
    regression_step(model, regression_batches(1)[0])
    assert type(model[3]).__name__ == "Linear" and model[3].weight.grad is not None
    assert torch.equal(model[3].weight, frozen_before)
    assert model[0].weight.grad is None and opt.state[model[0].weight]["step"] == 1
    assert model[1].weight.grad is not None  # the LayerNorm was left out too


def test_detach_restores_plain_linear_and_keeps_weights():
    model = mlp()
    forge.attach(model, "adamw")
    regression_step(model, regression_batches(1)[0])
    trained = [p.detach().clone() for p in model.parameters()]
    forge.detach(model)
    assert type(model[0]) is nn.Linear and not hasattr(model, "_forge_optimizer")
    for p, q in zip(model.parameters(), trained):
        assert torch.equal(p, q)
    regression_step(model, regression_batches(1)[0])
    assert all(p.grad is not None for p in model.parameters()), "after detach gradients are ordinary again"
    forge.attach(model, "sgd")  # and FORGE can go back on


def test_attaching_twice_is_refused():
    model = mlp()
    forge.attach(model, "adamw")
    with pytest.raises(RuntimeError, match="already attached"):
        forge.attach(model, "adamw")


def test_a_ddp_wrapper_of_one_rank_trains_as_the_plain_model(tmp_path):
    """A DDP wrapper over one rank is taken over and its module trained as a single process would
    be: fused linears, the same steps (data-parallel runs of several ranks: test_data_parallel.py)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        base, batches = mlp(), regression_batches(2)
        plain, wrapped = copy.deepcopy(base), nn.parallel.DistributedDataParallel(copy.deepcopy(base))
        forge.attach(plain, "adamw", lr=1e-2, state_dtype="fp32")
        opt = forge.attach(wrapped, "adamw", lr=1e-2, state_dtype="fp32")
        assert opt.data_parallel is None and type(wrapped.module[0]) is ForgeLinear
        assert not wrapped.require_backward_grad_sync  # DDP's own reducer is off
        for batch in batches:
            regression_step(plain, batch)
            regression_step(wrapped, batch)
        for p, q in zip(plain.parameters(), wrapped.module.parameters()):
            assert torch.equal(p, q)
    finally:
        dist.destroy_process_group()


def test_nn_data_parallel_is_refused_naming_ddp():
    with pytest.raises(RuntimeError, match="DistributedDataParallel"):
        forge.attach(nn.DataParallel(mlp()), "adamw")


def test_a_single_linear_attaches_and_detaches():
    layer = nn.Linear(8, 4)
    forge.attach(layer, "sgd", lr=0.1)
    layer(torch.randn(3, 8)).sum().backward()
    forge.detach(layer)
    assert type(layer) is nn.Linear and not hasattr(layer, "_forge_optimizer")
