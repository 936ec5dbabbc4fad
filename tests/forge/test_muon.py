"""FORGE's Muon against torch.optim.Muon, on the CPU (Triton's interpreter runs the kernels).

The momentum folds into each gradient tile inside the fused dW kernel and Newton-Schulz runs on the
layer's scratch once its kernel has reduced every token (`forge.muon`); torch keeps the gradient and
runs both in `step()`. With fp32 weights and states the two compute the same function: the
momentum to fp32 rounding, then the same bf16 Newton-Schulz on it. The orthogonalization rounds to
bf16 at every step, so a last-bit difference in its input (the GEMM's summation order) can move an
element of the update by a bf16 step: weights are compared by their norm-relative distance, bounded
at 2e-3 after several steps, far below what a wrong momentum, a missed Nesterov term or a wrong
learning-rate adjustment moves (each tested to exceed it).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import forge

SHAPES = {"tall": (23, 41), "square": (41, 41), "wide": (41, 9)}  # (in, out) of nn.Linear: W is (out, in)
STEPS = 5
HPARAMS = dict(lr=0.02, momentum=0.95, weight_decay=0.1)


def _matrices(seed: int = 0) -> nn.Module:
    """Three bias-free linear layers whose weights are tall (41 x 23), square and wide (9 x 41)."""
    torch.manual_seed(seed)
    dims = [SHAPES["tall"][0], SHAPES["tall"][1], SHAPES["square"][1], SHAPES["wide"][1]]
    layers = []
    for i in range(3):
        layers += [nn.Linear(dims[i], dims[i + 1], bias=False), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _batches(n: int = STEPS, rows: int = 19) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(rows, 23, generator=g), torch.randn(rows, 9, generator=g)) for _ in range(n)]


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (model(x) - y).pow(2).mean()


def _train_torch(model: nn.Module, batches, optimizers) -> None:
    for x, y in batches:
        _loss(model, x, y).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)


def _train_forge(model: nn.Module, batches) -> None:
    for x, y in batches:
        _loss(model, x, y).backward()
        for p in model.parameters():
            assert p.grad is None, "FORGE kept a gradient"


def _distance(a: nn.Module, b: nn.Module) -> dict[str, float]:
    return {
        name: float((p.detach() - q.detach()).norm() / q.detach().norm())
        for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True)
    }


@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"], ids=["original", "match_rms_adamw"])
def test_forge_muon_equals_torch_muon(nesterov, adjust_lr_fn):
    hp = dict(HPARAMS, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    reference, model = _matrices(), _matrices()
    _train_torch(reference, _batches(), [torch.optim.Muon(reference.parameters(), **hp)])
    forge.attach(model, "muon", state_dtype="fp32", **hp)
    _train_forge(model, _batches())
    far = {name: d for name, d in _distance(model, reference).items() if d > 2e-3}
    assert not far, f"FORGE Muon's weights away from torch.optim.Muon's: {far}"
    start = _matrices()
    moved = min(_distance(reference, start).values())
    assert moved > 0.02, "the weights barely moved: the comparison would show nothing"


@pytest.mark.parametrize(
    "changed",
    [dict(nesterov=False), dict(momentum=0.8), dict(adjust_lr_fn="match_rms_adamw"), dict(weight_decay=0.0)],
    ids=["nesterov", "momentum", "adjust_lr_fn", "weight_decay"],
)
def test_the_comparison_sees_each_hyperparameter(changed):
    """The bound above is tight enough: torch.optim.Muon with one hyperparameter changed lands
    farther from FORGE's default run than 2e-3."""
    hp = dict(HPARAMS, nesterov=True)
    other, model = _matrices(), _matrices()
    _train_torch(other, _batches(), [torch.optim.Muon(other.parameters(), **{**hp, **changed})])
    forge.attach(model, "muon", state_dtype="fp32", **hp)
    _train_forge(model, _batches())
    assert max(_distance(model, other).values()) > 2e-3


def _llama_with_biases(seed: int = 0) -> nn.Module:
    from tests.helpers import tiny_llama

    torch.manual_seed(seed)
    return tiny_llama().float()


@pytest.mark.parametrize("steps, bound", [(1, 1e-6), (2, 2e-3)], ids=["one-step", "two-steps"])
def test_muon_with_an_adamw_fallback_equals_torch_muon_beside_torch_adamw(steps, bound):
    """Hidden matrices by Muon, the embeddings, norms and head by AdamW, in one attach: as torch's
    Muon over `forge.muon.hidden_matrices` beside its AdamW over the rest. One step lands to fp32
    rounding; after that a tiny transformer amplifies the bf16 flips of the orthogonalization (its
    attention and a learning rate that moves every weight by percents a step), so two steps are
    compared, as the matrices above are after five."""
    fallback = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    reference, model = _llama_with_biases(), _llama_with_biases()
    hidden, rest = forge.muon.hidden_matrices(reference)
    optimizers = [torch.optim.Muon(hidden, **HPARAMS), torch.optim.AdamW(rest, **fallback)]
    ids = [torch.randint(0, reference.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(i))
           for i in range(steps)]  # fmt: skip
    for batch in ids:
        reference(input_ids=batch, labels=batch).loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    opt = forge.attach(
        model, "muon", state_dtype="fp32", fallback="adamw", fallback_options=fallback, **HPARAMS
    )
    assert [g.get("rule", "muon") for g in opt.param_groups] == ["muon", "adamw"]
    for batch in ids:
        model(input_ids=batch, labels=batch).loss.backward()
    far = {name: d for name, d in _distance(model, reference).items() if d > bound}
    assert not far, f"away from torch's Muon + AdamW: {far}"


def test_a_state_dict_round_trip_continues_bit_for_bit():
    batches = _batches(6)
    straight, resumed = _matrices(), _matrices()
    opt = forge.attach(straight, "muon", state_dtype="fp32", **HPARAMS)
    _train_forge(straight, batches)
    opt2 = forge.attach(resumed, "muon", state_dtype="fp32", **HPARAMS)
    _train_forge(resumed, batches[:3])
    saved, weights = copy.deepcopy(opt2.state_dict()), copy.deepcopy(resumed.state_dict())
    forge.detach(resumed)
    again = _matrices(1)
    again.load_state_dict(weights)
    opt3 = forge.attach(again, "muon", state_dtype="fp32", **HPARAMS)
    opt3.load_state_dict(saved)
    _train_forge(again, batches[3:])
    for a, b in zip(again.parameters(), straight.parameters(), strict=True):
        assert torch.equal(a, b)
    assert opt.state_dict()["forge"] == opt3.state_dict()["forge"]


def test_a_state_dict_of_other_group_rules_is_refused():
    model, other = _llama_with_biases(), _llama_with_biases()
    with_adamw = forge.attach(model, "muon", state_dtype="fp32", fallback="adamw", **HPARAMS)
    with_sgd = forge.attach(other, "muon", state_dtype="fp32", fallback="sgd", **HPARAMS)
    with pytest.raises(ValueError, match="group_rules=\\['muon', 'adamw'\\]"):
        with_sgd.load_state_dict(with_adamw.state_dict())


def test_steps_read_from_device_rows_equal_steps_from_the_host():
    """capturable=True (the rows a CUDA graph replays; the interpreter runs them on the CPU): the
    whole-matrix half reads its decay and step from the row, and lands where the host's do."""
    host, device = _matrices(), _matrices()
    forge.attach(host, "muon", state_dtype="fp32", **HPARAMS)
    forge.attach(device, "muon", state_dtype="fp32", capturable=True, **HPARAMS)
    _train_forge(host, _batches())
    _train_forge(device, _batches())
    assert max(_distance(device, host).values()) < 1e-6


def test_clipping_scales_the_gradient_before_the_momentum():
    reference, model = _matrices(), _matrices()
    opt_t = torch.optim.Muon(reference.parameters(), **HPARAMS)
    for x, y in _batches():
        _loss(reference, x, y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        opt_t.step()
        opt_t.zero_grad(set_to_none=True)
    forge.attach(model, "muon", state_dtype="fp32", max_grad_norm=0.05, **HPARAMS)
    _train_forge(model, _batches())
    assert max(_distance(model, reference).values()) < 2e-3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), r"2-D weights only.*model\.norm\.weight.*fallback=\"adamw\""),
        (dict(fallback="adamw", state_dtype="int8"), "momentum in fp32 or bf16"),
        (dict(fallback="adamw", master_weights="bf16+kahan"), "compensated"),
        (dict(fallback="muon"), "trains only matrices too"),
        (dict(fallback_options=dict(lr=1e-3)), "name the rule, fallback="),
        (dict(fallback="adamw", ns_steps=100), "ns_steps"),
        (dict(fallback="adamw", adjust_lr_fn="rms"), "Adjust learning rate function rms"),
    ],
    ids=["not-2d", "int8", "kahan", "fallback-muon", "options-alone", "ns_steps", "adjust_lr_fn"],
)
def test_what_muon_cannot_train_is_refused_before_anything_changes(kwargs, message):
    model = _llama_with_biases()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=message):
        forge.attach(model, "muon", **kwargs)
    assert all(type(m) is not forge.ForgeLinear for m in model.modules()), "the model was changed"
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_fallback_is_for_matrix_rules_only():
    with pytest.raises(ValueError, match="trains every parameter itself"):
        forge.attach(_matrices(), "adamw", fallback="sgd")


def test_a_checkpoint_of_muon_and_its_fallback_resumes_bit_for_bit_and_refuses_other_rules(tmp_path):
    import forge.checkpoint as ckpt

    def build(seed: int, fallback: str = "adamw"):
        model = _llama_with_biases(seed)
        return model, forge.attach(model, "muon", state_dtype="fp32", fallback=fallback, **HPARAMS)

    ids = [torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    straight, _ = build(0)
    for batch in ids:
        straight(input_ids=batch, labels=batch).loss.backward()
    saved, opt = build(0)
    for batch in ids[:2]:
        saved(input_ids=batch, labels=batch).loss.backward()
    path = ckpt.save(tmp_path, saved, opt, step=2)
    resumed, opt2 = build(1)
    ckpt.load(path, resumed, opt2)
    for batch in ids[2:]:
        resumed(input_ids=batch, labels=batch).loss.backward()
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), straight.parameters()))
    other, opt3 = build(1, fallback="sgd")
    with pytest.raises(ckpt.CheckpointError, match=r"group_rules=\['muon', 'adamw'\]"):
        ckpt.load(path, other, opt3)
