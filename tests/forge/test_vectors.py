"""`forge.vectors`: a backward's vector parameters (norm weights, biases) gathered and updated in one
launch when it ends, to the bit of the element-wise kernel each would have launched on its own."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import forge
from forge.vectors import VectorBatch


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Embedding(40, 32), nn.LayerNorm(32), nn.Linear(32, 48), nn.GELU(), nn.LayerNorm(48)]
    return nn.Sequential(*layers, nn.Linear(48, 40))


def _step(model: nn.Module, ids: torch.Tensor) -> None:
    logits = model(ids)
    nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten()).backward()


def _batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 40, (3, 5), generator=gen) for _ in range(n)]


def _one_at_a_time(monkeypatch) -> None:
    """Every vector launched from its hook on its own, as the element-wise kernel did them."""
    monkeypatch.setattr(VectorBatch, "add", lambda batch, p, grad: False)


@pytest.mark.parametrize(
    "dtype, rule, options",
    [
        (torch.float32, "adamw", dict(state_dtype="fp32")),
        (torch.bfloat16, "adamw", dict(state_dtype="int8")),  # stochastic rounding; vectors keep bf16 states
        (torch.bfloat16, "adamw", dict(state_dtype="bf16", master_weights="bf16+kahan")),
        (torch.float32, "sgd", dict(momentum=0.9, state_dtype="fp32")),
        (torch.float32, "nadam", dict(state_dtype="bf16")),  # per-parameter host state
    ],
    ids=["fp32-adamw", "bf16-adamw-int8", "bf16-kahan", "fp32-sgd", "fp32-nadam"],
)
def test_gathered_vectors_step_as_one_at_a_time(monkeypatch, dtype, rule, options):
    """Weights, states and step counts after three steps equal those of the same model whose
    vectors launch one at a time, bit for bit, every parameter (two groups: decay and none)."""
    base = _model().to(dtype)
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    opts = []
    for model in models:
        decay = [p for p in model.parameters() if p.dim() > 1]
        rest = [p for p in model.parameters() if p.dim() == 1]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
        opts.append(forge.attach(model, rule, groups, lr=1e-2, seed=3, **options))
    batches = _batches(3)
    for ids in batches:
        _step(models[0], ids)
    _one_at_a_time(monkeypatch)
    for ids in batches:
        _step(models[1], ids)
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), name
        for key, value in opts[0].state[a].items():
            other = opts[1].state[b][key]
            same = torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
            assert same, (name, key)


def test_the_vectors_are_stepped_when_backward_returns():
    """The gathered vectors' steps run before `backward()` returns: every norm weight and bias has
    moved, its gradient is gone and its step is counted; nothing is left gathered."""
    model = _model()
    opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.dim() == 1}
    _step(model, _batches(1)[0])
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert not torch.equal(p, before[name]), name
            assert p.grad is None and opt.state[p]["step"] == 1, name
    assert opt.updates.vectors.pending == []


def test_a_failed_backward_leaves_its_vectors_to_the_next():
    """A backward that fails after its vectors were gathered launches nothing at its end and counts
    none of their steps; the next backward's first gathered vector launches them before it is
    gathered itself, so each vector has taken both steps when that backward returns."""
    model = _model()
    opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
    ids = _batches(1)[0]

    class Fails(torch.autograd.Function):  # between the vectors' hooks and the end of the backward
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, dx):
            raise RuntimeError("a failing backward")

    out = model[1:](Fails.apply(model[0](ids)))  # the embedding's gradient never arrives
    with pytest.raises(RuntimeError, match="a failing backward"):
        nn.functional.cross_entropy(out.flatten(0, 1), ids.flatten()).backward()
    vectors = [p for p in model.parameters() if p.dim() == 1]
    assert len(opt.updates.vectors.pending) == len(vectors) == 6  # LayerNorms' weights and biases, biases
    assert all(opt.state[p]["step"] == 0 for p in vectors)
    before = [p.detach().clone() for p in vectors]
    _step(model, ids)
    assert all(opt.state[p]["step"] == 2 for p in vectors) and opt.updates.vectors.pending == []
    assert opt.state[model[0].weight]["step"] == 1  # the embedding: this backward's step alone
    assert not any(torch.equal(p, q) for p, q in zip(vectors, before))


def test_a_reentrant_checkpoint_steps_the_vectors_as_without_it():
    """Reentrant checkpointing runs an inner backward inside the outer one: the vectors gathered
    before it are launched when it starts gathering, its own at its end, the outer ones at the
    outer end; the weights equal those of the same steps without checkpointing."""
    models = [_model(), _model()]
    for model in models:
        forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
    for ids in _batches(2):
        _step(models[0], ids)
        inner = models[1][1:4]  # a LayerNorm, a fused linear, GELU
        hidden = checkpoint(inner, models[1][0](ids), use_reentrant=True)
        logits = models[1][4:](hidden)
        nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten()).backward()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), name


def test_a_direct_update_outside_backward_launches_at_once():
    """`update_elementwise` called outside any backward (a tool, a test) steps the vector at once."""
    model = _model()
    opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
    norm = model[1].weight
    before = norm.detach().clone()
    opt.update_elementwise(norm, torch.ones_like(norm))
    assert not torch.equal(norm, before) and opt.state[norm]["step"] == 1
    assert opt.updates.vectors.pending == []
