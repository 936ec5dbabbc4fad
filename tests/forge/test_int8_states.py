"""int8 optimizer states against their definition and against fp32 states, for every stateful rule.

Three checks, none of which takes FORGE's own quantizer or coefficients as the expectation:

* the PyTorch quantizer (`forge.kernels.quant.quantize`, which initialises and converts states) is
  the definition (`tests.forge.reference`), code for code, scale for scale and value for value;
* at every step, through the fused kernel and the element-wise one, FORGE's stored codes and scales
  are the definition's codes of the state torch.optim computes from FORGE's previous state (decoded
  by the definition), and the weight is torch.optim's step from it: so a wrong quantization, a
  wrong dequantization or a wrong coefficient shows at the step it happens;
* over several steps, each state of an int8 run stays within the quantization's own error of the
  fp32-state run: a stored state is off by at most half a code step, scale / 127 for a signed state
  (its companding curve's steepest step is 2 / 127 of the scale) and scale^2 (1/255 + 1/510^2) for
  a positive one (a half step of scale / 255 in sqrt(x), a whole step where the non-zero floor
  lifts a tiny value), and a state that decays by d per step carries earlier errors times d.

Gradients span six orders of magnitude within a group, so tiny positive states sit beside large
ones (where the non-zero floor decides their code) and every code of the range is used.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import forge
from tests.forge import reference as ref
from tests.forge.exactness import ELEMENTWISE_FP32, FUSED_FP32, assert_close_to_update, near_zero

# Every rule with a state, and the options that change which states it keeps (torch.optim's names).
CASES = {
    "adamw": dict(lr=1e-2, weight_decay=0.1),
    "nadam": dict(lr=1e-2, weight_decay=0.1),
    "radam": dict(lr=1e-2, weight_decay=0.1),  # steps before the rectified branch (step 6 on)
    "lion": dict(lr=1e-3, weight_decay=0.1),
    "rmsprop": dict(lr=1e-3, weight_decay=0.1),
    "rmsprop-centered-momentum": dict(lr=1e-3, centered=True, momentum=0.9),
    "adagrad": dict(lr=1e-2, weight_decay=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
    "sgd-momentum": dict(lr=1e-2, weight_decay=0.1, momentum=0.9, dampening=0.1),
}
N, K, T = 33, 130, 8  # 130 columns: groups of 64 with a partial last one, of 128 with a 2-wide one
STEPS = 3


def _gradient(*shape, generator=None) -> torch.Tensor:
    """Normal values times e^(3 normal): six orders of magnitude in one group of 64."""
    return torch.randn(*shape, generator=generator) * torch.exp(3 * torch.randn(*shape, generator=generator))


def _decoded(state: dict, name: str, group: int) -> torch.Tensor:
    """FORGE's stored int8 state `name`, decoded by the definition, fp64."""
    codes = state[name]
    signed = name not in ref.POSITIVE_STATES
    assert codes.dtype == (torch.int8 if signed else torch.uint8), f"{name} stored as {codes.dtype}"
    return ref.dequantize(codes, state[name + "_absmax"], signed, group)


def _tensor_states(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """torch.optim's full-size states of p (not its step counts or NAdam's mu product)."""
    return {k: v for k, v in optimizer.state[p].items() if torch.is_tensor(v) and v.shape == p.shape}


# How far apart FORGE's fp32 arithmetic and torch.optim's may leave a state: a few ulps (a group's
# maximum decoded from code 255 sits exactly on a bf16 value, where such ulps decide its scale).
STATE_SLACK = 2.0**-20


def _assert_stores_the_definition(state: dict, expected: dict, group: int, what: str) -> None:
    """FORGE's scales of each state are the definition's for `expected`'s values (either candidate
    where a group's maximum lies within `STATE_SLACK` of a bf16 value), and its codes the
    definition's codes against those scales."""
    for name, value in expected.items():
        signed = name not in ref.POSITIVE_STATES
        stored = state[name + "_absmax"].double().cpu()
        low, high = ref.scales(value.cpu(), signed, group, STATE_SLACK)
        off = (stored != low) & (stored != high)
        assert not bool(off.any()), (
            f"{what}: {name}'s scales are not the groups' maxima rounded up to bf16 "
            f"({int(off.sum())} of {stored.numel()} differ, e.g. {stored[off][:3].tolist()} "
            f"for {low[off][:3].tolist()})"
        )
        codes, _, tie = ref.quantize(value.cpu(), signed, group, scale=stored)
        ref.assert_codes_match(state[name].cpu(), codes, tie, f"{what}: {name}")


@pytest.mark.parametrize("group", forge.INT8_GROUPS)
@pytest.mark.parametrize("signed", [True, False], ids=["signed", "positive"])
@pytest.mark.parametrize(
    "shape", [(1, 1), (17, 23), (9, 200), (150,), (3, 5, 70)], ids=["1x1", "17x23", "9x200", "150", "3x5x70"]
)
def test_the_pytorch_quantizer_is_the_definition(shape, signed, group):
    from forge.kernels import quant

    x = _gradient(*shape)
    x.view(-1, shape[-1])[0, : shape[-1] // 2] = 0.0  # a zero group where there is room: codes 0, scale 0
    if not signed:
        x = x**2
        x.view(-1)[-1] = -1e-6  # a positive state rounded below zero counts as zero
    codes, scale = quant.quantize(x, signed, group)
    expected, expected_scale, tie = ref.quantize(x, signed, group)
    ref.assert_codes_match(codes, expected, tie, "quant.quantize")
    assert torch.equal(scale.double(), expected_scale)
    if not signed:
        assert bool(((codes > 0) == (x > 0)).all()), "a non-zero state must keep a non-zero code"
    values = quant.dequantize(codes, scale, signed, group)
    exact = ref.dequantize(codes, scale, signed, group)
    assert torch.isfinite(values).all()
    # fp32 arithmetic on the definition's values: a few ulps (measured at most 2.4e-7 relative)
    assert bool(((values.double() - exact).abs() <= 4 * 2.0**-23 * exact.abs()).all())


def _stepper(path: str, generator: torch.Generator):
    """(FORGE's step of w, the gradient torch is given) for the fused kernel (dW = dy^T x in the
    GEMM: torch gets the fp64 product rounded once) or the element-wise one (the same gradient)."""

    def step(opt, w):
        if path == "fused":
            dy, x = _gradient(T, N, generator=generator), torch.randn(T, K, generator=generator)
            opt.update_linear(w, dy, x)
            return (dy.double().T @ x.double()).float()
        g = _gradient(N, K, generator=generator)
        opt.update_elementwise(w, g)
        return g

    return step


@pytest.mark.parametrize("path", ["fused", "elementwise"])
@pytest.mark.parametrize("case", [*CASES, "adamw-group128"], ids=[*CASES, "adamw-group128"])
def test_each_step_stores_the_definitions_codes_of_torch_optims_state(case, path):
    """Every step from FORGE's own state: torch.optim steps from that state decoded by the
    definition, and FORGE must hold the definition's codes and scales of torch's new state, and
    torch's new weight (within the fp32 tolerances of `tests.forge.exactness`)."""
    rule, group = case.split("-")[0], 128 if case.endswith("group128") else 64
    hp = CASES.get(case, CASES["adamw"])
    generator = torch.Generator().manual_seed(0)
    w = nn.Parameter(torch.randn(N, K, generator=generator))
    opt = forge.ForgeOptimizer(
        [w], rule, state_dtype="int8", int8_group=group, stochastic_rounding=False, **hp
    )
    state = opt.state[w]
    reference = nn.Parameter(w.detach().clone())
    torch_opt = forge.torch_optimizer(rule, [reference], **hp)
    initial = _tensor_states(torch_opt, reference)  # Adagrad's sum; the others start at zero, lazily
    _assert_stores_the_definition(state, initial, group, "the initial state")
    step = _stepper(path, generator)
    for t in range(1, STEPS + 1):
        with torch.no_grad():
            reference.copy_(w)
            for name, value in _tensor_states(torch_opt, reference).items():
                value.copy_(_decoded(state, name, group))
        before = w.detach().clone()
        reference.grad = step(opt, w)
        torch_opt.step()
        assert torch.isfinite(w).all(), f"step {t}: FORGE's weight holds a NaN or an infinity"
        _assert_stores_the_definition(state, _tensor_states(torch_opt, reference), group, f"step {t}")
        tol, ambiguous = (
            (FUSED_FP32, near_zero(reference.grad)) if path == "fused" else (ELEMENTWISE_FP32, None)
        )
        assert_close_to_update(w, reference, before, tol, f"step {t}: the weight", ambiguous)


# How much of a state's earlier error is left after one step (torch.optim's recurrences), for the
# states whose update is linear in their previous value (RMSprop's momentum buffer, which divides
# by another state, is left out: the check above holds it).
def _decay(rule: str, name: str, hp: dict) -> float | None:
    beta1, beta2 = hp.get("betas", forge.RULES[rule].defaults.get("betas", (None, None)))
    if name == "exp_avg":
        return beta2 if rule == "lion" else beta1
    return {
        "exp_avg_sq": beta2,
        "square_avg": hp.get("alpha", 0.99),
        "grad_avg": hp.get("alpha", 0.99),
        "sum": 1.0,
        "momentum_buffer": None if rule == "rmsprop" else hp.get("momentum"),
    }[name]


def _storage_error(state: dict, name: str, group: int) -> torch.Tensor:
    """The most a stored state can be off from the value it stores (the module docstring), per element."""
    scale = state[name + "_absmax"].double().repeat_interleave(group, -1)[:, :K]
    if name in ref.POSITIVE_STATES:
        return scale**2 * (1 / 255 + 1 / 510**2)
    return scale / 127


@pytest.mark.parametrize("case", CASES)
def test_int8_states_stay_within_the_quantization_step_of_fp32_states(case):
    """FORGE with int8 states and FORGE with fp32 states on the same gradients (no weight decay,
    so that no state depends on the weight): each state of the int8 run within its accumulated
    storage error of the fp32 run's, element by element, at every step (plus 1e-6 of the state's
    scale for fp32's own rounding)."""
    rule = case.split("-")[0]
    hp = dict(CASES[case], weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    w0 = torch.randn(N, K, generator=generator)
    runs = {}
    for state_dtype in ("fp32", "int8"):
        w = nn.Parameter(w0.clone())
        runs[state_dtype] = (
            w,
            forge.ForgeOptimizer([w], rule, state_dtype=state_dtype, stochastic_rounding=False, **hp),
        )
    (w32, opt32), (w8, opt8) = runs["fp32"], runs["int8"]
    state32, state8 = opt32.state[w32], opt8.state[w8]
    names = [n for n in _tensor_states(opt32, w32) if _decay(rule, n, hp) is not None]
    assert names, f"{case}: no state to compare"
    bound = {n: _storage_error(state8, n, 64) for n in names}  # the initial states' storage
    for t in range(1, 6):
        g = _gradient(N, K, generator=generator)
        opt32.update_elementwise(w32, g)
        opt8.update_elementwise(w8, g)
        for name in names:
            bound[name] = _decay(rule, name, hp) * bound[name] + _storage_error(state8, name, 64)
            exact = state32[name].double()
            error = (_decoded(state8, name, 64) - exact).abs()
            allowed = bound[name] + 1e-6 * float(exact.abs().max())
            assert not bool((error > allowed).any() or error.isnan().any()), (
                f"{case}, step {t}: {name} of the int8 run is off the fp32 run's by up to "
                f"{float((error / allowed).nan_to_num(float('inf')).max()):.3g}x its quantization's allowance"
            )
    assert torch.isfinite(w8).all() and torch.isfinite(w32).all()
    moved = float((w8.detach() - w0).norm())
    assert moved > 0, f"{case}: the int8 run never moved its weight"


def test_the_pytorch_round_up_to_bf16_is_the_definitions():
    """`quant.round_up_to_bf16` (the scales of states quantized outside a kernel): the smallest bf16
    value at or above x, as the definition computes it, on bf16 values, one fp32 ulp above them,
    between them over several decades, and at zero."""
    from forge.kernels import quant

    on = torch.tensor([1.0, 0.75, 2.0**-3, 3.0e5, 2.0**-120]).bfloat16().float()
    above = torch.nextafter(on, torch.full_like(on, float("inf")))
    between = _gradient(1000, generator=torch.Generator().manual_seed(7)).abs()
    x = torch.cat([on, above, between, torch.zeros(1)])
    assert torch.equal(quant.round_up_to_bf16(x).double(), ref.round_up_to_bf16(x))


@pytest.mark.parametrize(
    "rule, hp, name", [("sgd", dict(momentum=0.9), "momentum_buffer"), ("adagrad", {}, "sum")]
)
def test_the_kernels_scales_round_up_from_one_ulp_above_a_bf16_value_and_a_zero_group_stays_zero(
    rule, hp, name
):
    """Group maxima one fp32 ulp above a bf16 value (where adding 0xFFFF, not 0xFFFE, carries into
    the next bf16 value) and exactly on one (where nothing carries), a group of zeros (scale 0,
    codes 0, no division by zero) and a zero among non-zero values (code 0: the non-zero floor is
    for non-zero values): one element-wise step, whose new state is the gradient itself (SGD's
    first momentum) or its square (Adagrad's sum from zero; sqrt(x) then is |g|, or the fp32 value
    one ulp above 1 where g^2 rounds), stored as the definition stores it."""
    g = torch.zeros(2, 192)
    g[:, 64:] = torch.linspace(-0.5, 0.5, 128)
    g[:, 128:] *= 0.2  # below 1/8: the last group's maximum is the value set below
    g[:, 70] = 0.0  # a zero beside non-zero values: code 0 (the non-zero floor is for non-zero values)
    g[0, 100], g[0, 150] = 1 + 2**-23, -(2**-3) * (1 + 2**-23)  # one ulp above 1 and above -1/8 in magnitude
    g[1, 100], g[1, 150] = 1.0, 0.75  # on a bf16 value: nothing to round
    w = nn.Parameter(torch.zeros(2, 192))
    opt = forge.ForgeOptimizer([w], rule, state_dtype="int8", stochastic_rounding=False, lr=0.0, **hp)
    opt.update_elementwise(w, g)
    state = opt.state[w]
    expected = g if name == "momentum_buffer" else (g * g)
    _assert_stores_the_definition(state, {name: expected}, 64, f"{rule}")
    from forge.kernels import quant

    twin = dict(zip((name, name + "_absmax"), quant.quantize(expected, name == "momentum_buffer", 64)))
    _assert_stores_the_definition(twin, {name: expected}, 64, "quant.quantize")
    assert float(twin[name + "_absmax"][0, 1]) == 1 + 2**-7, "quant.quantize did not round the scale up"
    scale = state[name + "_absmax"].float()
    assert torch.equal(scale[:, 0], torch.zeros(2)) and not bool(state[name][:, :64].any())
    assert not bool(state[name][:, 70].any())
    assert float(scale[0, 1]) == 1 + 2**-7 and float(scale[1, 1]) == 1.0
    if (
        name == "momentum_buffer"
    ):  # sqrt of Adagrad's 2^-6 (1 + 2^-22) is 2^-3 exactly: nothing to round there
        assert float(scale[0, 2]) == 2**-3 * (1 + 2**-7) and float(scale[1, 2]) == 0.75


def test_int8_storage_holds_matrices_and_leaves_vectors_bf16():
    """Under state_dtype="int8" a matrix (or any parameter of two dimensions or more) keeps int8
    codes and bf16 scales; a vector (a bias, a norm's weight) keeps bf16 states, so that no scale
    group straddles two FSDP2 shards of it (`forge.states`)."""
    params = [
        nn.Parameter(torch.randn(4, 70)),
        nn.Parameter(torch.randn(70)),
        nn.Parameter(torch.randn(2, 3, 64)),
    ]
    opt = forge.ForgeOptimizer(params, "adamw", state_dtype="int8")
    for p, dtype in zip(params, ("int8", "bf16", "int8")):
        state = opt.state[p]
        assert opt.state_dtype_of(p) == dtype, (tuple(p.shape), opt.state_dtype_of(p))
        if dtype == "bf16":
            assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
            assert "exp_avg_absmax" not in state
        else:
            assert state["exp_avg"].dtype == torch.int8 and state["exp_avg_sq"].dtype == torch.uint8
            assert state["exp_avg_absmax"].dtype == torch.bfloat16


def test_slots_hand_their_tensors_over_in_one_order_and_take_them_back():
    """`Slots.tensors()` and `with_tensors` (torch.compile's ops hand the functional copies back
    through them): states, scales and the residual, each where it was, the missing ones skipped."""
    from forge.states import Slots

    a, b, scale, residual = (torch.full((2, 2), float(i)) for i in range(4))
    slots = Slots((a, None, b), (scale, None, None), (True, False, False), residual)
    assert slots.tensors() == [a, b, scale, residual]
    copies = [t + 10 for t in slots.tensors()]
    again = slots.with_tensors(copies)
    assert again.states[0] is copies[0] and again.states[1] is None and again.states[2] is copies[1]
    assert again.scales == (copies[2], None, None) and again.residual is copies[3]
    assert again.signed == slots.signed
    plain = Slots((a, None, None), (None, None, None), (True, False, False)).with_tensors([b])
    assert plain.states[0] is b and plain.residual is None


def test_state_bytes_are_what_each_storage_keeps_per_element():
    """fp32: 4 bytes; bf16: 2; int8: a code and a bf16 scale per group (the memory models' figure)."""
    assert forge.state_bytes("fp32") == 4.0 and forge.state_bytes("bf16") == 2.0
    assert forge.state_bytes("int8") == 1 + 2 / 64 and forge.state_bytes("int8", 128) == 1 + 2 / 128
    with pytest.raises(ValueError, match="state_dtype='fp8' is not supported"):
        forge.state_bytes("fp8")


def test_a_saved_state_of_another_shape_or_dtype_is_refused():
    """Loading checks each saved tensor against the state it replaces: its shape and its dtype
    each on their own (`StateStorage.check_saved`); converting a torch.optim state refuses one of
    another shape, even one that would broadcast."""
    from forge.states import StateStorage

    state = {"exp_avg": torch.zeros(2, 3), "step": 1}
    for wrong in (torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(3, 2), torch.zeros(1, 3)):
        with pytest.raises(ValueError, match="attach with the same rule"):
            StateStorage.check_saved(state, {"exp_avg": wrong}, "w")
        with pytest.raises(
            ValueError, match="attach with the same rule"
        ):  # the step first, as torch saves it
            StateStorage.check_saved(state, {"step": 2, "exp_avg": wrong}, "w")
    StateStorage.check_saved(state, {"exp_avg": torch.ones(2, 3), "step": 2}, "w")
    w = nn.Parameter(torch.randn(4, 70))
    reference = torch.optim.AdamW([w], lr=1e-2)
    w.grad = torch.randn(4, 70)
    reference.step()
    saved = reference.state_dict()
    saved["state"][0]["exp_avg"] = saved["state"][0]["exp_avg"][:1]  # (1, 70): it would broadcast
    opt = forge.ForgeOptimizer([nn.Parameter(w.detach().clone())], "adamw", state_dtype="int8")
    with pytest.raises(ValueError, match=r"not a tensor of shape \(4, 70\)"):
        opt.load_state_dict(saved, convert=True)


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "positive"])
def test_a_state_read_back_is_what_its_storage_holds(signed):
    """`forge.states.stored`, what a state of each storage holds of fp32 values: fp32 the values,
    bf16 torch's rounding to nearest, an int8 matrix the definition's codes decoded (groups of 64
    unless told), an int8 vector bf16 (vectors keep bf16 states). A decoded code is fp32
    arithmetic on the definition's value, a few ulps off; at a tie either code may stand."""
    from forge.states import stored

    x = _gradient(9, 150, generator=torch.Generator().manual_seed(6))
    if not signed:
        x = x**2
    assert torch.equal(stored(x, "fp32", signed), x)
    assert torch.equal(stored(x, "bf16", signed), x.bfloat16().float())
    assert torch.equal(stored(x[0], "int8", signed), x[0].bfloat16().float())
    for group, given in [(64, {}), (128, dict(group=128))]:
        codes, scale, tie = ref.quantize(x, signed, group)
        exact = ref.dequantize(codes, scale, signed, group)
        got = stored(x, "int8", signed, **given).double()
        off = ((got - exact).abs() > 4 * 2.0**-23 * exact.abs()) & ~tie
        assert not bool(off.any()), f"group {group}: {int(off.sum())} values are not the definition's"
