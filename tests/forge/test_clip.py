"""`forge.attach(..., max_grad_norm=...)`: global-norm clipping equals torch.optim after
`torch.nn.utils.clip_grad_norm_`, for every rule, with clipping active and inactive, and no weight
gradient is stored."""

import copy
import math

import pytest
import torch
from torch import nn

import forge
from tests.forge.exactness import FUSED_FP32, TRANSFORMER_FP32, assert_close_to_update, near_zero
from tests.helpers import RULE_CASES, lm_batch, lm_loss, relative_error, tiny_llama

# One case per rule (the option variants change the rule's arithmetic, not the clipping).
CASES = {
    name: RULE_CASES[name]
    for name in (
        "adamw",
        "nadam",
        "radam",
        "lion",
        "rmsprop-centered-momentum",
        "adagrad",
        "sgd-nesterov",
        "sgd",
    )
}
ACTIVE, INACTIVE = 0.05, 1e6  # max_grad_norm far below and far above the gradients' norm


def _model() -> nn.Module:
    # two fused Linears with a bias each, a LayerNorm (element-wise kernel); odd sizes
    return nn.Sequential(nn.Linear(23, 17), nn.Tanh(), nn.Linear(17, 7), nn.LayerNorm(7))


def _loss(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def _train_clipped(model, rule, steps, make_batch, loss_fn, max_norm, norm_type=2.0, forge_kwargs=None, **hp):
    """FORGE with max_grad_norm against torch.optim after clip_grad_norm_, on the same batches.
    Returns both models, both optimizers, the norms each reported per step, and where a reference
    gradient was within rounding of zero."""
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    opt_f = forge.attach(a, rule, max_grad_norm=max_norm, norm_type=norm_type, **(forge_kwargs or {}), **hp)
    opt_t = forge.torch_optimizer(rule, b.parameters(), **hp)
    norms_f, norms_t = [], []
    ambiguous = {p: torch.zeros_like(p, dtype=torch.bool) for p in b.parameters()}
    for _ in range(steps):
        batch = make_batch()
        loss_fn(a, batch).backward()
        norms_f.append(float(opt_f.last_grad_norm))
        opt_t.zero_grad()
        loss_fn(b, batch).backward()
        norms_t.append(float(torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm, norm_type)))
        for p in b.parameters():
            ambiguous[p] |= near_zero(p.grad)
        opt_t.step()
    return a, b, opt_f, opt_t, norms_f, norms_t, ambiguous


@pytest.mark.parametrize("max_norm", [ACTIVE, INACTIVE], ids=["active", "inactive"])
@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_clipped_step_matches_torch_clip_grad_norm(case, max_norm):
    torch.manual_seed(0)
    model = _model()
    make_batch = lambda: (torch.randn(5, 23), torch.randn(5, 7))
    a, b, opt_f, opt_t, norms_f, norms_t, ambiguous = _train_clipped(
        model,
        case.split("-")[0],
        2,
        make_batch,
        _loss,
        max_norm,
        forge_kwargs=dict(state_dtype="fp32"),
        **CASES[case],
    )
    for nf, nt in zip(norms_f, norms_t):
        assert nf == pytest.approx(nt, rel=1e-6)
    clipped = min(norms_t) > max_norm
    assert clipped == (max_norm == ACTIVE)  # the case is what it says
    coefficient = float(opt_f.last_clip_coefficient)
    assert coefficient == pytest.approx(min(1.0, max_norm / (norms_t[-1] + 1e-6)), rel=1e-6)
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), model.parameters()):
        assert_close_to_update(pa, pb, p0, FUSED_FP32, name, ambiguous[pb])
        assert pa.grad is None, f"{name}: FORGE left a gradient behind"
        assert opt_f.state[pa]["step"] == 2
        for key, ref in opt_t.state[pb].items():
            if isinstance(ref, torch.Tensor) and ref.shape == pb.shape:
                assert relative_error(opt_f.state[pa][key], ref) <= 1e-5, f"{name}: state {key} differs"


@pytest.mark.parametrize("norm_type", [0.5, 1.0, 3.0, math.inf], ids=["l0.5", "l1", "l3", "inf"])
def test_other_norm_types_match_torch(norm_type):
    """Norms other than 2 go through the norm-only kernel (`forge.kernels.wgrad_norm`)."""
    torch.manual_seed(1)
    model = _model()
    make_batch = lambda: (torch.randn(5, 23), torch.randn(5, 7))
    a, b, _, _, norms_f, norms_t, ambiguous = _train_clipped(
        model,
        "adamw",
        2,
        make_batch,
        _loss,
        0.02,
        norm_type,
        forge_kwargs=dict(state_dtype="fp32"),
        lr=1e-2,
        weight_decay=0.1,
    )
    assert norms_f == pytest.approx(norms_t, rel=1e-5)
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), model.parameters()):
        assert_close_to_update(pa, pb, p0, FUSED_FP32, name, ambiguous[pb])


def test_gram_and_direct_norms_agree():
    """Both ways of taking ||dy^T x|| (the Gram matrices, the norm-only kernel) give dW's norm."""
    from forge.clip import GlobalNormClip

    torch.manual_seed(2)
    dy, x = torch.randn(40, 33), torch.randn(40, 70)
    exact = torch.linalg.vector_norm(dy.double().T @ x.double())
    for method in ("gram", "direct"):
        clip = GlobalNormClip(None, 1.0, 2.0)
        clip.method = method
        assert float(clip.linear_power_sum(dy, x).sqrt()) == pytest.approx(float(exact), rel=1e-6), method


@pytest.mark.parametrize("norm_type", [1.0, 3.0, math.inf], ids=["l1", "l3", "inf"])
@pytest.mark.parametrize("method", ["gram", "direct"])
def test_a_norm_other_than_2_is_taken_directly_whichever_way_is_asked(method, norm_type):
    """The Gram matrices give only the 2-norm: asked for the Gram way, another norm still sums
    |dW|^p (the largest |dW| for inf) of dW = dy^T x, as fp64 computes it."""
    from forge.clip import GlobalNormClip

    torch.manual_seed(5)
    dy, x = torch.randn(40, 33), torch.randn(40, 70)
    dw = (dy.double().T @ x.double()).abs()
    exact = dw.max() if norm_type == math.inf else (dw**norm_type).sum()
    clip = GlobalNormClip(None, 1.0, norm_type)
    clip.method = method
    assert float(clip.linear_power_sum(dy, x)) == pytest.approx(float(exact), rel=1e-5), method


def test_a_shared_input_has_its_gram_computed_once(monkeypatch):
    """q, k and v read one x: its x x^T is computed once per run of layers that share it."""
    import forge.clip as clip_module

    calls = []
    real = clip_module.gram
    monkeypatch.setattr(clip_module, "gram", lambda a: calls.append(a.shape) or real(a))
    clip = clip_module.GlobalNormClip(None, 1.0, 2.0)
    clip.method = "gram"
    x = torch.randn(8, 64)
    for n in (64, 16, 16):
        clip.linear_power_sum(torch.randn(8, n), x)
    assert calls.count((8, 64)) == 2  # x once, and the dy of width 64 once
    calls.clear()
    clip.method = "direct"  # the norm-only kernel, asked for: no Gram matrix at all
    clip.forget_input()
    clip.linear_power_sum(torch.randn(8, 16), x)
    assert calls == []


def test_tiny_llama_with_tied_embeddings_matches_torch():
    """A decoder layer (fused attention and MLP linears), RMSNorms, tied input and output
    embeddings (a gradient from two producers, hooked): clipped as torch clips them."""
    torch.manual_seed(3)
    model = tiny_llama(tie=True)
    a, b, _, _, norms_f, norms_t, ambiguous = _train_clipped(
        model,
        "adamw",
        2,
        lm_batch,
        lm_loss,
        0.5,
        forge_kwargs=dict(state_dtype="fp32"),
        lr=1e-3,
        weight_decay=0.01,
    )
    assert norms_f == pytest.approx(norms_t, rel=1e-5) and min(norms_t) > 0.5
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), model.parameters()):
        assert_close_to_update(pa, pb, p0, TRANSFORMER_FP32, name, ambiguous[pb])


def test_param_groups_share_one_global_norm():
    torch.manual_seed(4)
    model = _model()
    a, b = copy.deepcopy(model), copy.deepcopy(model)

    def groups(m):  # weights decayed; biases and the norm not, at another lr
        named = list(m.named_parameters())
        return [
            dict(params=[p for n, p in named if n.endswith("weight")], weight_decay=0.1),
            dict(params=[p for n, p in named if not n.endswith("weight")], weight_decay=0.0, lr=3e-3),
        ]

    opt_f = forge.attach(a, "adamw", groups(a), lr=1e-2, state_dtype="fp32", max_grad_norm=0.05)
    opt_t = torch.optim.AdamW(groups(b), lr=1e-2)
    for _ in range(3):
        batch = (torch.randn(5, 23), torch.randn(5, 7))
        _loss(a, batch).backward()
        opt_t.zero_grad()
        _loss(b, batch).backward()
        norm = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.05)
        opt_t.step()
        assert float(opt_f.last_grad_norm) == pytest.approx(float(norm), rel=1e-6)
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), model.parameters()):
        assert_close_to_update(pa, pb, p0, FUSED_FP32, name)


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_low_precision_states_are_clipped_too(state_dtype):
    """bf16 weights with bf16 or int8 states (SGD's momentum): the norm is the one torch finds on
    the same bf16 model, and the first step is torch's clipped step from that model's gradients
    (clip_grad_norm_ in fp32, then SGD in fp32): the weights within 1% of the step (torch rounds
    each dW element to bf16, 2^-9 of it, and FORGE's weights round to bf16, a step being hundreds
    of their bf16 steps), the momentum, which is the clipped gradient, within its storage's
    rounding of torch's (bf16: a step of it; int8: its code's error, scale / 127 of its group) plus
    that 2^-9. The unclipped step, 1 / c times as long, lands about its own length away."""
    from tests.forge import reference as ref
    from tests.forge.exactness import update_error

    torch.manual_seed(5)
    low = copy.deepcopy(_model()).to(torch.bfloat16)
    w0 = [p.detach().float() for p in low.parameters()]
    twin = copy.deepcopy(low)  # torch's gradients of the same bf16 model
    hp = dict(lr=50.0, momentum=0.9)  # steps of a hundred bf16 steps of the weights and more
    opt_f = forge.attach(
        low, "sgd", state_dtype=state_dtype, stochastic_rounding=False, max_grad_norm=0.05, **hp
    )
    batch = (torch.randn(5, 23, dtype=torch.bfloat16), torch.randn(5, 7, dtype=torch.bfloat16))
    _loss(twin, batch).backward()
    steps = {}
    for clip in (0.05, None):
        reference = [nn.Parameter(w.clone()) for w in w0]
        for r, t in zip(reference, twin.parameters()):
            r.grad = t.grad.float()
        if clip is not None:
            torch_norm = torch.nn.utils.clip_grad_norm_(reference, clip)
        torch_opt = torch.optim.SGD(reference, **hp)
        torch_opt.step()
        steps[clip] = (reference, torch_opt)
    _loss(low, batch).backward()
    assert float(opt_f.last_grad_norm) == pytest.approx(float(torch_norm), rel=1e-3)
    assert float(opt_f.last_clip_coefficient) < 0.1
    (clipped, torch_opt), (unclipped, _) = steps[0.05], steps[None]
    for (name, p), q, r, p0 in zip(low.named_parameters(), clipped, unclipped, w0):
        assert p.grad is None, f"{name}: FORGE left a gradient behind"
        assert update_error(p, q, p0) <= 1e-2, f"{name}: {update_error(p, q, p0):.3g} of the clipped step off"
        assert update_error(p, r, p0) > 0.5, (
            f"{name}: the unclipped step lands near: the check would see nothing"
        )
        state, expected = opt_f.state[p], torch_opt.state[q]["momentum_buffer"].double()
        if opt_f.state_dtype_of(p) == "int8":
            stored = ref.dequantize(state["momentum_buffer"], state["momentum_buffer_absmax"], True, 64)
            allowed = (
                state["momentum_buffer_absmax"].double().repeat_interleave(64, -1)[:, : p.shape[1]] / 127
            )
        else:
            stored = state["momentum_buffer"].double()
            allowed = 2**-8 * expected.abs()
        error = (stored - expected).abs()
        assert not bool((error > allowed + 2**-9 * expected.abs() + 1e-12).any() or error.isnan().any()), (
            f"{name}: its momentum is not the clipped gradient"
        )


def test_outside_a_backward_one_update_is_clipped_by_its_own_norm():
    layer = nn.Linear(16, 8)
    opt = forge.attach(layer, "sgd", lr=1.0, state_dtype="fp32", max_grad_norm=1e-3)
    dy, x = torch.randn(4, 8), torch.randn(4, 16)
    before = layer.weight.detach().clone()
    opt.update_linear(layer.weight, dy, x)
    grad = dy.T @ x
    expected = before - grad * min(1.0, 1e-3 / (float(grad.norm()) + 1e-6))
    torch.testing.assert_close(layer.weight.detach(), expected, rtol=1e-6, atol=1e-7)
    assert float(opt.last_grad_norm) == pytest.approx(float(grad.norm()), rel=1e-6)


def test_a_failed_backward_updates_nothing_and_leaves_nothing_behind():
    """A backward that raises after some norms were gathered: no parameter moved, and the next
    backward's step is the same as on a model that never saw the failed one."""
    torch.manual_seed(6)
    model = _model()
    twin = copy.deepcopy(model)
    opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32", max_grad_norm=0.05)
    opt_twin = forge.attach(twin, "adamw", lr=1e-2, state_dtype="fp32", max_grad_norm=0.05)
    x, y = torch.randn(5, 23), torch.randn(5, 7)
    hidden = model[0](x)

    def fail(grad):
        raise RuntimeError("a failure in the middle of backward")

    hidden.register_hook(fail)  # runs after the second Linear's update was deferred
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="middle of backward"):
        ((model[3](model[2](model[1](hidden))) - y) ** 2).mean().backward()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert all(opt.state[p]["step"] == 0 for p in model.parameters())
    batch = (torch.randn(5, 23), torch.randn(5, 7))
    _loss(model, batch).backward()
    _loss(twin, batch).backward()
    assert float(opt.last_grad_norm) == float(opt_twin.last_grad_norm)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_grad_norm=0.0), "positive finite"),
        (dict(max_grad_norm=-1.0), "positive finite"),
        (dict(max_grad_norm=float("nan")), "positive finite"),
        (dict(max_grad_norm="big"), "positive finite"),
        (dict(max_grad_norm=1.0, norm_type=0.0), "norm_type"),
        (dict(max_grad_norm=1.0, norm_type=float("nan")), "norm_type"),
        (dict(max_grad_norm=1.0, update_stream=True), "update_stream"),
    ],
)
def test_bad_clipping_options_are_refused_before_anything_changes(kwargs, match):
    model = _model()
    with pytest.raises(ValueError, match=match):
        forge.attach(model, "adamw", **kwargs)
    assert all(type(m) is not forge.ForgeLinear for m in model.modules())
    forge.attach(model, "adamw")  # nothing was left attached


def test_the_norm_and_coefficient_stay_in_the_same_tensors_step_after_step():
    """A CUDA graph reads them from where its capture found them: each step refreshes them in place."""
    model = _model()
    opt = forge.attach(model, "adamw", state_dtype="fp32", max_grad_norm=0.05)
    _loss(model, (torch.randn(5, 23), torch.randn(5, 7))).backward()
    norm, coefficient, first = opt.last_grad_norm, opt.last_clip_coefficient, float(opt.last_grad_norm)
    _loss(model, (torch.randn(5, 23), torch.randn(5, 7))).backward()
    assert opt.last_grad_norm is norm and opt.last_clip_coefficient is coefficient
    assert float(norm) != first


def test_without_max_grad_norm_there_is_no_norm_to_read():
    model = _model()
    opt = forge.attach(model, "adamw")
    _loss(model, (torch.randn(5, 23), torch.randn(5, 7))).backward()
    assert opt.last_grad_norm is None and opt.last_clip_coefficient is None


def _scaled_pair(device, dtype, state_dtype, T=48, N=40, K=72):
    """Two identical (weight, states) copies of one AdamW problem, and its dy and x."""
    from forge.optim import ForgeOptimizer

    torch.manual_seed(7)
    w = nn.Parameter(torch.randn(N, K, device=device, dtype=dtype) * 0.05)
    dy = torch.randn(T, N, device=device, dtype=dtype)
    x = torch.randn(T, K, device=device, dtype=dtype)
    opts = []
    for _ in range(2):
        p = nn.Parameter(w.detach().clone())
        opts.append(
            (p, ForgeOptimizer([p], "adamw", lr=1e-2, state_dtype=state_dtype, stochastic_rounding=False))
        )
    return opts, dy, x


def assert_grad_scale_is_exact(device, dtype, state_dtype, T=48, N=40, K=72):
    """The kernels' GRAD_SCALE by 0.5 is the step of dy * 0.5: scaling by a power of two is exact
    in bf16 and fp32, before and after the GEMM, so the two must agree to the bit."""
    from forge import functional

    ((pa, a), (pb, b)), dy, x = _scaled_pair(device, dtype, state_dtype, T, N, K)
    half = torch.full((1,), 0.5, device=device)
    for opt, p, scale, dy_in in ((a, pa, half, dy), (b, pb, None, dy * 0.5)):
        slots, options = opt.slots_of(p), opt.options_of(p)
        coefficients, seed, _ = opt.launcher.begin(p)
        functional.fused_wgrad_update(
            p.detach(), dy_in, x, slots, coefficients, seed, options, grad_scale=scale
        )
        g = (dy_in.float().T @ x.float()).to(dtype)
        coefficients, seed, _ = opt.launcher.begin(p)
        functional.elementwise_update(p.detach(), g, slots, coefficients, seed, options, grad_scale=scale)
    assert torch.equal(pa, pb)
    for key in a.state[pa]:
        if isinstance(a.state[pa][key], torch.Tensor):
            assert torch.equal(a.state[pa][key], b.state[pb][key]), key


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_the_kernels_grad_scale_is_exact(state_dtype):
    assert_grad_scale_is_exact("cpu", torch.float32, state_dtype)


def test_each_layers_norm_is_taken_the_cheaper_way():
    """`norm_method`'s cost model: the Gram way costs T^2 (N + K) multiply-adds (T^2 N where x x^T
    is known), the direct way 1.5 T N K; the cheaper wins, and a norm other than 2 is always direct.
    For N = K = 64 the Gram way's share is T / 32 of T N K: cheaper below T = 48."""
    from forge.clip import norm_method

    assert norm_method(32, 64, 64, x_gram_known=False) == "gram"  # 1 T N K against 1.5
    assert norm_method(64, 64, 64, x_gram_known=False) == "direct"  # 2 T N K against 1.5
    assert norm_method(512, 64, 4096, x_gram_known=False) == "direct"  # 8.1 T N K
    assert norm_method(512, 64, 4096, x_gram_known=True) == "gram"  # x x^T known: 0.125 T N K
    assert norm_method(128, 2, 64, x_gram_known=True) == "direct"  # x x^T known: T / K = 2 T N K
    assert norm_method(32, 64, 64, x_gram_known=True, norm_type=1.0) == "direct"
    assert norm_method(32, 64, 64, x_gram_known=True, norm_type=3.0) == "direct"
