"""FORGE's Muon against torch.optim.Muon, on the CPU (Triton's interpreter runs the kernels).

The momentum folds into each gradient tile inside the fused dW kernel and Newton-Schulz runs on the
layer's scratch once its kernel has reduced every token (`forge.muon`); torch keeps the gradient and
runs both in `step()`. With fp32 weights and states the two compute the same function: the
momentum to fp32 rounding, then the same bf16 Newton-Schulz on it. The orthogonalization rounds to
bf16 at every step, so a last-bit difference in its input (the GEMM's summation order, or how the
host's vector unit rounds torch's lerp) can move an element of the update by a bf16 step, and how
far such flips carry depends on the host's bf16 GEMM kernels (AVX-512 BF16 hosts round otherwise
than the default ones). So the trajectories are not compared with each other but each with one
that rounds nothing: torch.optim.Muon with its Newton-Schulz in fp64 (`_fp64_reference`). Both bf16
runs land about as far from it as bf16's rounding of the update carries them on this host; FORGE's
must be within twice torch's distance, layer by layer (`dist(forge, ref64) <= 2 dist(torch, ref64)`),
which a wrong momentum, a missed Nesterov term, a wrong learning-rate adjustment or a lost weight
decay exceeds (each tested to). A parameter holding a NaN or an infinity is never within a bound.
Neither side orthogonalizes with the code under test: torch's run uses torch's own Newton-Schulz, or
the references of `tests.forge.reference` (fp64, or a variant's products rounded as its arithmetic
rounds them).
"""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
from torch import nn

import forge
from tests.forge import reference as ref

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


def _train_forge(model: nn.Module, batches) -> None:
    for x, y in batches:
        _loss(model, x, y).backward()
        for p in model.parameters():
            assert p.grad is None, "FORGE kept a gradient"


def _distance(a: nn.Module, b: nn.Module) -> dict[str, float]:
    """Per parameter, ||a - b|| / ||b||: NaN where either holds a NaN or an infinity."""
    return {
        name: ref.distance(p.detach(), q.detach())
        for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True)
    }


def _ns_fp64(
    update: torch.Tensor, coefficients, steps: int, eps: float, variant: str = "torch"
) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz with nothing rounded: `variant`'s polynomial in fp64 (torch's
    for all but Polar Express), as `_zeropower_via_newtonschulz` is called."""
    d = ref.newton_schulz_definition(variant, steps)
    return ref.newton_schulz_fp64(update, d["sequence"], d.get("margin", 1.0), eps)


def _ns_rounded(update: torch.Tensor, coefficients, steps: int, eps: float, variant: str) -> torch.Tensor:
    """`variant`'s iteration with each product rounded as its arithmetic rounds it (bf16, or fp16 for
    the Gram form), from its definition."""
    return ref.rounded_newton_schulz(update, **ref.newton_schulz_definition(variant, steps), eps=eps)


@contextlib.contextmanager
def _torch_newton_schulz(monkeypatch, function):
    """Within it, torch.optim.Muon orthogonalizes with `function` (its `_zeropower_via_newtonschulz`'s
    arguments)."""
    import torch.optim._muon

    with monkeypatch.context() as patch:
        patch.setattr(torch.optim._muon, "_zeropower_via_newtonschulz", function)
        yield


def _fp64_newton_schulz(monkeypatch, variant: str = "torch"):
    """Within it, torch.optim.Muon orthogonalizes in fp64 (`_ns_fp64`): its run is the reference."""
    return _torch_newton_schulz(monkeypatch, functools.partial(_ns_fp64, variant=variant))


def _torch_muon(clip: float | None = None, **hparams) -> nn.Module:
    """The matrices after STEPS steps of torch.optim.Muon (clipping the gradients' norm to `clip`)."""
    model = _matrices()
    opt = torch.optim.Muon(model.parameters(), **hparams)
    for x, y in _batches():
        _loss(model, x, y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def _bound(
    monkeypatch, build, slack: float = 0.0, variant: str = "torch"
) -> tuple[nn.Module, dict[str, float]]:
    """(torch's run with `build()` in fp64 Newton-Schulz, per parameter twice the distance of its
    half-precision run from it, plus `slack`): how far the rounding of the orthogonalized update
    carries a correct run on this host, with a factor 2. The half-precision run is torch's own for
    "torch", the variant's definition rounded as its arithmetic rounds (`_ns_rounded`) for the
    others. `slack` covers parameters the orthogonalization never reaches (a fallback rule's at its
    first step), where fp32 rounding is all that differs."""
    with _fp64_newton_schulz(monkeypatch, variant):
        reference = build()
    if variant == "torch":
        rounded = build()
    else:
        with _torch_newton_schulz(monkeypatch, functools.partial(_ns_rounded, variant=variant)):
            rounded = build()
    distances = _distance(rounded, reference)
    assert all(d == d for d in distances.values()), f"the reference runs diverged: {distances}"
    return reference, {n: 2 * d + slack for n, d in distances.items()}


def _beyond(model: nn.Module, reference: nn.Module, bound: dict[str, float]) -> dict[str, tuple]:
    """{parameter: (its distance from the reference, its bound)} for every parameter not within its
    bound: past it, or NaN (a parameter or its reference holding a NaN or an infinity)."""
    return {n: (d, bound[n]) for n, d in _distance(model, reference).items() if not d <= bound[n]}


@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"], ids=["original", "match_rms_adamw"])
def test_forge_muon_equals_torch_muon(monkeypatch, nesterov, adjust_lr_fn):
    hp = dict(HPARAMS, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    reference, bound = _bound(monkeypatch, lambda: _torch_muon(**hp))
    model = _matrices()
    forge.attach(model, "muon", state_dtype="fp32", **hp)
    _train_forge(model, _batches())
    far = _beyond(model, reference, bound)
    assert not far, f"FORGE Muon farther from the fp64 reference than twice torch's bf16 run: {far}"
    moved = min(_distance(reference, _matrices()).values())
    assert moved > 0.02, "the weights barely moved: the comparison would show nothing"


@pytest.mark.parametrize(
    "changed",
    [dict(nesterov=False), dict(momentum=0.8), dict(adjust_lr_fn="match_rms_adamw"), dict(weight_decay=0.0)],
    ids=["nesterov", "momentum", "adjust_lr_fn", "weight_decay"],
)
def test_the_comparison_sees_each_hyperparameter(monkeypatch, changed):
    """The bound above is tight enough: torch.optim.Muon with one hyperparameter changed lands
    farther from the default's fp64 reference than the bound on at least one layer."""
    hp = dict(HPARAMS, nesterov=True)
    reference, bound = _bound(monkeypatch, lambda: _torch_muon(**hp))
    other = _torch_muon(**{**hp, **changed})
    assert any(d > bound[name] for name, d in _distance(other, reference).items())


@pytest.mark.parametrize("variant", ["symmetric", "gram", "gram_symmetric", "polar_express"])
def test_each_newton_schulz_variant_reaches_the_layers(monkeypatch, variant):
    """newton_schulz= reaches every layer's whole-matrix half: FORGE's Muon with a variant lands
    within twice the distance from torch.optim.Muon with the variant's polynomial in fp64 that
    torch.optim.Muon with the variant's definition in half precision lands (`_bound`), and far from
    torch's default where the variant computes another polynomial (Polar Express)."""
    hp = dict(HPARAMS, nesterov=True)
    reference, bound = _bound(monkeypatch, lambda: _torch_muon(**hp), variant=variant)
    model = _matrices()
    forge.attach(model, "muon", state_dtype="fp32", newton_schulz=variant, **hp)
    _train_forge(model, _batches())
    far = _beyond(model, reference, bound)
    assert not far, f"FORGE Muon with newton_schulz={variant!r} away from torch's with it: {far}"
    if variant == "polar_express":
        assert any(d > bound[n] for n, d in _distance(_torch_muon(**hp), reference).items())


def test_the_variant_is_a_group_setting_and_a_state_dict_from_before_it_keeps_the_attached_one():
    model = _matrices()
    opt = forge.attach(model, "muon", state_dtype="fp32", newton_schulz="gram", **HPARAMS)
    assert opt.param_groups[0]["newton_schulz"] == "gram"
    saved = copy.deepcopy(opt.state_dict())
    del saved["param_groups"][0]["newton_schulz"]
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["newton_schulz"] == "gram"


def _llama_with_biases(seed: int = 0) -> nn.Module:
    from tests.helpers import tiny_llama

    torch.manual_seed(seed)
    return tiny_llama().float()


def _torch_muon_beside_adamw(ids, fallback: dict) -> nn.Module:
    model = _llama_with_biases()
    hidden, rest = forge.muon.hidden_matrices(model)
    optimizers = [torch.optim.Muon(hidden, **HPARAMS), torch.optim.AdamW(rest, **fallback)]
    for batch in ids:
        model(input_ids=batch, labels=batch).loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return model


@pytest.mark.parametrize("steps", [1, 2], ids=["one-step", "two-steps"])
def test_muon_with_an_adamw_fallback_equals_torch_muon_beside_torch_adamw(monkeypatch, steps):
    """Hidden matrices by Muon, the embeddings, norms and head by AdamW, in one attach: as torch's
    Muon over `forge.muon.hidden_matrices` beside its AdamW over the rest, within twice the bf16
    run's distance from the fp64 reference (plus fp32 rounding, 1e-6, where AdamW's first step is
    all that moved). A tiny transformer amplifies the bf16 flips of the orthogonalization (its
    attention and a learning rate that moves every weight by percents a step), and how much depends
    on the host's bf16 GEMMs: one step already shows them on some."""
    fallback = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    ids = [torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(i)) for i in range(steps)]
    reference, bound = _bound(monkeypatch, lambda: _torch_muon_beside_adamw(ids, fallback), slack=1e-6)
    model = _llama_with_biases()
    opt = forge.attach(
        model, "muon", state_dtype="fp32", fallback="adamw", fallback_options=fallback, **HPARAMS
    )
    assert [g.get("rule", "muon") for g in opt.param_groups] == ["muon", "adamw"]
    for batch in ids:
        model(input_ids=batch, labels=batch).loss.backward()
    far = _beyond(model, reference, bound)
    assert not far, f"farther from the fp64 reference than twice torch's Muon + AdamW: {far}"


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


def test_clipping_scales_the_gradient_before_the_momentum(monkeypatch):
    reference, bound = _bound(monkeypatch, lambda: _torch_muon(clip=0.05, **HPARAMS))
    model = _matrices()
    forge.attach(model, "muon", state_dtype="fp32", max_grad_norm=0.05, **HPARAMS)
    _train_forge(model, _batches())
    assert not _beyond(model, reference, bound)
    assert any(d > bound[n] for n, d in _distance(_torch_muon(**HPARAMS), reference).items()), (
        "unclipped torch lands within the bound: the comparison would not see clipping"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), r"2-D weights only.*model\.norm\.weight.*fallback=\"adamw\""),
        (dict(fallback="adamw", state_dtype="int8"), "momentum in fp32 or bf16"),
        (dict(fallback="adamw", master_weights="bf16+kahan"), "compensated"),
        (dict(fallback="muon"), "trains only matrices too"),
        (dict(fallback_options=dict(lr=1e-3)), "name the rule, fallback="),
        (dict(fallback="adamw", ns_steps=100), "ns_steps"),
        (dict(fallback="adamw", ns_steps=0), "ns_steps"),
        (dict(fallback="adamw", ns_steps=1000), "ns_steps"),
        (dict(fallback="adamw", ns_coefficients=(3.4445, -4.775)), "exactly 3 values"),
        (dict(fallback="adamw", adjust_lr_fn="rms"), "Adjust learning rate function rms"),
        (dict(fallback="adamw", newton_schulz="fast"), "newton_schulz='fast'.*'gram_symmetric'"),
        (
            dict(fallback="adamw", newton_schulz="polar_express", ns_coefficients=(3, -3, 1)),
            "own coefficients",
        ),
        (
            dict(fallback="adamw", newton_schulz="polar_express", ns_coefficients=(4, -3, 1)),
            "own coefficients",
        ),
    ],
    ids=[
        "not-2d",
        "int8",
        "kahan",
        "fallback-muon",
        "options-alone",
        "ns_steps",
        "ns_steps-0",
        "ns_steps-1000",
        "two-coefficients",
        "adjust_lr_fn",
        "variant",
        "polar-coefficients",
        "polar-coefficients-above",
    ],
)
def test_what_muon_cannot_train_is_refused_before_anything_changes(kwargs, message):
    model = _llama_with_biases()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=message):
        forge.attach(model, "muon", **kwargs)
    assert all(type(m) is not forge.ForgeLinear for m in model.modules()), "the model was changed"
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize(
    "count, named", [(4, "0.bias, 1.bias, 2.bias, 3.bias. "), (5, "2.bias, 3.bias .... ")]
)
def test_a_refusal_names_four_parameters_and_marks_any_more(count, named):
    """What Muon cannot train is named, the first four, and " ..." says there are more."""
    model = nn.Sequential(*[nn.Linear(6, 6) for _ in range(count)])
    with pytest.raises(ValueError, match=f"given {count} other parameter") as refused:
        forge.attach(model, "muon")
    assert named in str(refused.value)


def test_muon_takes_coefficients_of_its_own_for_torchs_iteration():
    """Coefficients other than torch's default are Muon's to choose with torch's iteration (only
    Polar Express brings its own and refuses them): the group keeps them as given."""
    opt = forge.attach(_llama_with_biases(), "muon", fallback="adamw", ns_coefficients=(3.0, -3.2, 1.2))
    assert opt.param_groups[0]["ns_coefficients"] == (3.0, -3.2, 1.2)


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
