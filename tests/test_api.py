"""The public API of DESIGN.md: schedulers, state_dict resume, param groups, detach, and clear errors."""

import copy

import pytest
import torch
from helpers import relative_error
from torch import nn

import forge


def _mlp():
    return nn.Sequential(nn.Linear(24, 40), nn.LayerNorm(40), nn.GELU(), nn.Linear(40, 5))


def _batches(n):
    return [(torch.randn(6, 24), torch.randn(6, 5)) for _ in range(n)]


def _step(model, batch):
    x, y = batch
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss


def test_lr_scheduler_takes_effect():
    base, batches = _mlp(), _batches(4)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt_f = forge.attach(a, "adamw", lr=1e-2, state_dtype="fp32")
    opt_t = torch.optim.AdamW(b.parameters(), lr=1e-2)
    sched_f = torch.optim.lr_scheduler.CosineAnnealingLR(opt_f, T_max=3)
    sched_t = torch.optim.lr_scheduler.CosineAnnealingLR(opt_t, T_max=3)
    for batch in batches:
        _step(a, batch)
        opt_f.step()
        sched_f.step()
        opt_t.zero_grad()
        _step(b, batch)
        opt_t.step()
        sched_t.step()
    assert opt_f.param_groups[0]["lr"] == pytest.approx(opt_t.param_groups[0]["lr"])
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert relative_error(pa, pb) <= 1e-5


@pytest.mark.parametrize("state_dtype,int8_group", [("fp32", 64), ("bf16", 64), ("int8", 64), ("int8", 128)])
def test_state_dict_resumes_bit_exactly(state_dtype, int8_group, tmp_path):
    base, batches = _mlp().bfloat16(), _batches(6)
    batches = [(x.bfloat16(), y.bfloat16()) for x, y in batches]
    kwargs = dict(lr=1e-2, state_dtype=state_dtype, stochastic_rounding=True, seed=11, int8_group=int8_group)

    straight = copy.deepcopy(base)
    forge.attach(straight, "adamw", **kwargs)
    for batch in batches:
        _step(straight, batch)

    first = copy.deepcopy(base)
    opt = forge.attach(first, "adamw", **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100)
    for batch in batches[:3]:
        _step(first, batch)
    torch.save(
        {"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()},
        tmp_path / "ckpt.pt",
    )

    resumed = copy.deepcopy(base)
    opt2 = forge.attach(resumed, "adamw", **kwargs)
    ckpt = torch.load(tmp_path / "ckpt.pt")
    resumed.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    for batch in batches[3:]:
        _step(resumed, batch)
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), f"{name} differs after resuming"
    for p, q in zip(straight.parameters(), resumed.parameters()):
        for key, value in straight._forge_optimizer.state[p].items():
            other = opt2.state[q][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


def test_state_dict_with_a_different_state_dtype_is_refused():
    a, b = _mlp(), _mlp()
    opt_a = forge.attach(a, "adamw", state_dtype="fp32")
    opt_b = forge.attach(b, "adamw", state_dtype="int8")
    with pytest.raises(ValueError, match="same rule, options, state_dtype and int8_group"):
        opt_b.load_state_dict(opt_a.state_dict())


def test_int8_group_sets_the_scales_and_a_mismatch_is_refused():
    a, b = nn.Linear(200, 8), nn.Linear(200, 8)  # 200 columns: 4 groups of 64, 2 of 128
    opt_a = forge.attach(a, "adamw", state_dtype="int8")
    opt_b = forge.attach(b, "adamw", state_dtype="int8", int8_group=128)
    assert opt_a.state[a.weight]["exp_avg_absmax"].shape == (8, 4)
    assert opt_b.state[b.weight]["exp_avg_absmax"].shape == (8, 2)
    with pytest.raises(ValueError, match="int8_group"):
        opt_b.load_state_dict(opt_a.state_dict())
    with pytest.raises(ValueError, match=r"int8_group=96 is not supported; choose one of \[64, 128\]"):
        forge.attach(_mlp(), "adamw", state_dtype="int8", int8_group=96)


def test_param_groups_per_group_options():
    base, batches = _mlp(), _batches(3)
    a, b = copy.deepcopy(base), copy.deepcopy(base)

    def groups(m):
        no_decay = [p for n, p in m.named_parameters() if p.dim() == 1]
        decay = [p for n, p in m.named_parameters() if p.dim() > 1]
        return [{"params": decay, "weight_decay": 0.5}, {"params": no_decay, "weight_decay": 0.0, "lr": 5e-3}]

    forge.attach(a, "adamw", params=groups(a), lr=1e-2, state_dtype="fp32")
    opt_t = torch.optim.AdamW(groups(b), lr=1e-2)
    for batch in batches:
        _step(a, batch)
        opt_t.zero_grad()
        _step(b, batch)
        opt_t.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert relative_error(pa, pb) <= 1e-5


def test_parameters_left_out_keep_ordinary_gradients():
    model = _mlp()
    frozen_before = model[3].weight.detach().clone()
    opt = forge.attach(model, "sgd", params=list(model[0].parameters()), lr=0.1)
    _step(model, _batches(1)[0])
    assert type(model[3]).__name__ == "Linear" and model[3].weight.grad is not None
    assert torch.equal(model[3].weight, frozen_before)
    assert model[0].weight.grad is None and opt.state[model[0].weight]["step"] == 1
    assert model[1].weight.grad is not None  # the LayerNorm was left out too


def test_step_and_zero_grad_are_harmless():
    base, batch = _mlp(), _batches(1)[0]
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt_a = forge.attach(a, "adamw", state_dtype="fp32")
    forge.attach(b, "adamw", state_dtype="fp32")
    _step(a, batch)
    opt_a.step()
    opt_a.zero_grad()
    opt_a.step()
    _step(b, batch)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_under_torch_compile_the_fused_step_leaves_the_graph(monkeypatch):
    """Eager backward calls the optimizer directly (no compiler wrapper on the host path); while
    torch.compile traces, the step goes through the `torch.compiler.disable`d function instead,
    and computes the same update."""
    import forge.nn as forge_nn

    base, batch = _mlp(), _batches(1)[0]
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    forge.attach(eager, "adamw", state_dtype="fp32")
    forge.attach(traced, "adamw", state_dtype="fp32")
    _step(eager, batch)
    outside = []
    wrapped = forge_nn._fused_step_outside_graph
    monkeypatch.setattr(forge_nn, "_fused_step_outside_graph", lambda *a: outside.append(1) or wrapped(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _step(traced, batch)
    assert len(outside) == 2  # both linears
    for p, q in zip(eager.parameters(), traced.parameters()):
        assert torch.equal(p, q)


def test_detach_restores_plain_linear_and_keeps_weights():
    model = _mlp()
    forge.attach(model, "adamw")
    _step(model, _batches(1)[0])
    trained = [p.detach().clone() for p in model.parameters()]
    forge.detach(model)
    assert type(model[0]) is nn.Linear and not hasattr(model, "_forge_optimizer")
    for p, q in zip(model.parameters(), trained):
        assert torch.equal(p, q)
    _step(model, _batches(1)[0])
    assert all(p.grad is not None for p in model.parameters()), "after detach gradients are ordinary again"
    forge.attach(model, "sgd")  # and FORGE can go back on


def test_same_seed_reproduces_bits():
    base, batches = _mlp().bfloat16(), [(x.bfloat16(), y.bfloat16()) for x, y in _batches(3)]
    runs = []
    for _ in range(2):
        model = copy.deepcopy(base)
        forge.attach(model, "adamw", lr=1e-2, state_dtype="int8", seed=5)
        for batch in batches:
            _step(model, batch)
        runs.append(model)
    for p, q in zip(runs[0].parameters(), runs[1].parameters()):
        assert torch.equal(p, q)


# ---------------------------------------------------------------------------------------- errors


def test_unknown_rule_lists_the_valid_ones():
    with pytest.raises(ValueError, match="adamw, nadam, radam, lion, rmsprop, adagrad, sgd"):
        forge.attach(_mlp(), "adam8")


def test_unsupported_dtype_says_what_to_do():
    with pytest.raises(TypeError, match=r"fp32 and bf16 weights only.*model.to\(torch.bfloat16\)"):
        forge.attach(_mlp().half(), "adamw")


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(state_dtype="fp8"), "state_dtype='fp8' is not supported"),
        (dict(amsgrad=True), "amsgrad=True is not supported"),
        (dict(momentum=0.9), "unexpected hyperparameter"),
    ],
)
def test_bad_options_are_refused(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        forge.attach(_mlp(), "adamw", **bad)


def test_attaching_twice_is_refused():
    model = _mlp()
    forge.attach(model, "adamw")
    with pytest.raises(RuntimeError, match="already attached"):
        forge.attach(model, "adamw")


def test_second_backward_through_a_retained_graph_is_refused():
    model = _mlp()
    forge.attach(model, "adamw")
    x, y = _batches(1)[0]
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


def test_data_parallel_is_refused(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(_mlp())
        with pytest.raises(RuntimeError, match="all-reduce of gradients"):
            forge.attach(ddp, "adamw")
    finally:
        dist.destroy_process_group()
