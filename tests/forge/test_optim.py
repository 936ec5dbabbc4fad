"""`forge.optim.ForgeOptimizer`, the torch.optim face of FORGE: schedulers, state_dict resume,
param groups, seeds, `update_linear`, and clear errors for what it refuses."""

import copy

import pytest
import torch
from torch import nn

import forge
from tests.forge.exactness import FUSED_FP32, assert_close_to_update
from tests.helpers import mlp, regression_batches, regression_step


def test_lr_scheduler_takes_effect():
    base, batches = mlp(), regression_batches(4)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt_f = forge.attach(a, "adamw", lr=1e-2, state_dtype="fp32")
    opt_t = torch.optim.AdamW(b.parameters(), lr=1e-2)
    sched_f = torch.optim.lr_scheduler.CosineAnnealingLR(opt_f, T_max=3)
    sched_t = torch.optim.lr_scheduler.CosineAnnealingLR(opt_t, T_max=3)
    for batch in batches:
        regression_step(a, batch)
        opt_f.step()
        sched_f.step()
        opt_t.zero_grad()
        regression_step(b, batch)
        opt_t.step()
        sched_t.step()
    assert opt_f.param_groups[0]["lr"] == pytest.approx(opt_t.param_groups[0]["lr"])
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), base.parameters()):
        assert_close_to_update(pa, pb, p0, FUSED_FP32, name)


@pytest.mark.parametrize("state_dtype,int8_group", [("fp32", 64), ("bf16", 64), ("int8", 64), ("int8", 128)])
def test_state_dict_resumes_bit_exactly(state_dtype, int8_group, tmp_path):
    # Two steps, a checkpoint, two more: the resumed steps take every state and the step count (its
    # bias corrections and rounding seeds) from the checkpoint.
    base, batches = mlp().bfloat16(), regression_batches(4)
    batches = [(x.bfloat16(), y.bfloat16()) for x, y in batches]
    kwargs = dict(lr=1e-2, state_dtype=state_dtype, stochastic_rounding=True, seed=11, int8_group=int8_group)

    straight = copy.deepcopy(base)
    forge.attach(straight, "adamw", **kwargs)
    for batch in batches:
        regression_step(straight, batch)

    first = copy.deepcopy(base)
    opt = forge.attach(first, "adamw", **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100)
    for batch in batches[:2]:
        regression_step(first, batch)
    torch.save(
        {"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()},
        tmp_path / "ckpt.pt",
    )

    resumed = copy.deepcopy(base)
    opt2 = forge.attach(resumed, "adamw", **kwargs)
    ckpt = torch.load(tmp_path / "ckpt.pt")
    resumed.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    for batch in batches[2:]:
        regression_step(resumed, batch)
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), f"{name} differs after resuming"
    for p, q in zip(straight.parameters(), resumed.parameters()):
        for key, value in straight._forge_optimizer.state[p].items():
            other = opt2.state[q][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


def test_state_dict_with_a_different_state_dtype_is_refused():
    a, b = mlp(), mlp()
    opt_a = forge.attach(a, "adamw", state_dtype="fp32")
    opt_b = forge.attach(b, "adamw", state_dtype="int8")
    with pytest.raises(ValueError, match="same rule, options, state_dtype and int8_group"):
        opt_b.load_state_dict(opt_a.state_dict())


def _torch_run_saved_after_two_steps(base, batches, optimizer, hp):
    """(the model torch's `optimizer` trained on every batch, a copy of it after the first two,
    its state dict then): the run FORGE continues from that copy and state."""
    reference = copy.deepcopy(base)
    torch_opt = optimizer(reference.parameters(), **hp)
    for i, batch in enumerate(batches):
        torch_opt.zero_grad()
        regression_step(reference, batch)
        torch_opt.step()
        if i == 1:
            moved = copy.deepcopy(reference)
            saved = copy.deepcopy(torch_opt.state_dict())
    return reference, moved, saved


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_a_torch_adamw_run_continues_under_forge(state_dtype):
    """torch AdamW trains two steps; FORGE, attached to a copy of that model, loads its state dict
    with convert=True and trains two more, as torch AdamW goes on: with fp32 states the same steps
    (the update's rounding); with bf16 and int8 states the loaded moments are torch's converted
    (rounded to nearest, quantized) and the step count, lr and betas are torch's."""
    from forge.kernels import quant

    base, batches = mlp(), regression_batches(4)
    hp = dict(lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    reference, moved, saved = _torch_run_saved_after_two_steps(base, batches, torch.optim.AdamW, hp)
    opt = forge.attach(moved, "adamw", lr=0.5, state_dtype=state_dtype)  # lr and betas: the state dict's
    opt.load_state_dict(saved, convert=True)
    assert opt.param_groups[0]["lr"] == hp["lr"] and opt.param_groups[0]["betas"] == hp["betas"]
    for p, pid in zip(moved.parameters(), saved["param_groups"][0]["params"]):
        torch_state, state = saved["state"][pid], opt.state[p]
        assert state["step"] == 2
        for key in ("exp_avg", "exp_avg_sq"):
            if opt.state_dtype_of(p) == "int8":  # weights; vectors keep bf16 states
                signed = key == "exp_avg"
                codes, scale = quant.quantize(torch_state[key], signed)
                assert torch.equal(state[key], codes) and torch.equal(state[key + "_absmax"], scale)
            else:
                assert torch.equal(state[key], torch_state[key].to(state[key].dtype)), key
    for batch in batches[2:]:
        regression_step(moved, batch)
    if state_dtype == "fp32":
        for (name, p), q, p0 in zip(reference.named_parameters(), moved.parameters(), base.parameters()):
            assert_close_to_update(q, p, p0, FUSED_FP32, name)


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_torch_sgd_run_with_momentum_continues_under_forge(nesterov):
    """torch.optim.SGD saves its momentum buffer and no step count: a state that holds a buffer has
    taken a step, so FORGE's next step goes on from that buffer (buf = momentum buf + (1 -
    dampening) g) instead of starting one (buf = g), and the two runs train alike."""
    base, batches = mlp(), regression_batches(4)
    hp = dict(lr=1e-2, momentum=0.9, dampening=0.0 if nesterov else 0.1, weight_decay=0.01, nesterov=nesterov)
    reference, moved, saved = _torch_run_saved_after_two_steps(base, batches, torch.optim.SGD, hp)
    assert all("step" not in s for s in saved["state"].values())
    opt = forge.attach(moved, "sgd", lr=0.5, momentum=0.9, dampening=hp["dampening"], nesterov=nesterov,
                       state_dtype="fp32")  # fmt: skip
    opt.load_state_dict(saved, convert=True)
    for batch in batches[2:]:
        regression_step(moved, batch)
    for (name, p), q, p0 in zip(reference.named_parameters(), moved.parameters(), base.parameters()):
        assert_close_to_update(q, p, p0, FUSED_FP32, name)


@pytest.mark.parametrize("master_weights", ["fp32", "bf16", "bf16+kahan"])
def test_master_weights_load_into_each_weight_format(master_weights):
    """fp32 master weights (fresh, not bf16-representable) set into FORGE's weights: fp32 copied,
    bf16 rounded to nearest, compensated bf16 with the rounding's loss as the residual (weight +
    residual within bf16's precision of that loss, ~2^-16 of the weight, of the master)."""
    model = mlp() if master_weights == "fp32" else mlp().bfloat16()
    options = {"master_weights": master_weights} if master_weights == "bf16+kahan" else {}
    opt = forge.attach(model, "adamw", state_dtype="fp32" if master_weights == "fp32" else "bf16", **options)
    g = torch.Generator().manual_seed(5)
    masters = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    opt.load_master_weights(masters)
    for p, master in zip(model.parameters(), masters):
        if master_weights == "fp32":
            assert torch.equal(p, master)
            continue
        assert torch.equal(p, master.bfloat16())
        if master_weights == "bf16+kahan":
            residual = opt.state[p]["weight_residual"]
            assert torch.equal(residual, (master - p.float()).bfloat16())
            effective = p.float() + residual.float()
            assert (effective - master).abs().max() <= 2**-16 * master.abs().max()
            assert (effective - master).abs().max() < (p.float() - master).abs().max() / 64
    with pytest.raises(ValueError, match="one per parameter, in the order of param_groups"):
        opt.load_master_weights(masters[:-1])
    with pytest.raises(ValueError, match="has shape"):
        opt.load_master_weights([m.t() if m.dim() == 2 else m for m in masters])


def test_converting_another_rules_state_is_refused():
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    regression_step(model, regression_batches(1)[0])
    sgd.step()
    opt = forge.attach(copy.deepcopy(model), "adamw", state_dtype="bf16")
    with pytest.raises(ValueError, match="convert=True loads the state of the same rule"):
        opt.load_state_dict(sgd.state_dict(), convert=True)


def test_converting_a_state_with_a_slot_more_or_less_is_refused():
    """A torch.optim state of the same rule under other options: AMSGrad's extra maximum, or a
    slot missing, is refused whole, as a state of another rule is."""
    model = mlp()
    torch_adamw = torch.optim.AdamW(model.parameters(), lr=0.1, amsgrad=True)
    regression_step(model, regression_batches(1)[0])
    torch_adamw.step()
    with_max = torch_adamw.state_dict()
    without_v = copy.deepcopy(with_max)
    for state in without_v["state"].values():
        del state["max_exp_avg_sq"], state["exp_avg_sq"]
    for saved in (with_max, without_v):
        opt = forge.attach(copy.deepcopy(model), "adamw", state_dtype="bf16")
        with pytest.raises(ValueError, match="convert=True loads the state of the same rule"):
            opt.load_state_dict(saved, convert=True)


def test_int8_group_sets_the_scales_and_a_mismatch_is_refused():
    a, b = nn.Linear(200, 8), nn.Linear(200, 8)  # 200 columns: 4 groups of 64, 2 of 128
    opt_a = forge.attach(a, "adamw", state_dtype="int8")
    opt_b = forge.attach(b, "adamw", state_dtype="int8", int8_group=128)
    assert opt_a.state[a.weight]["exp_avg_absmax"].shape == (8, 4)
    assert opt_b.state[b.weight]["exp_avg_absmax"].shape == (8, 2)
    with pytest.raises(ValueError, match="int8_group"):
        opt_b.load_state_dict(opt_a.state_dict())
    with pytest.raises(ValueError, match=r"int8_group=96 is not supported; choose one of \[64, 128\]"):
        forge.attach(mlp(), "adamw", state_dtype="int8", int8_group=96)


def test_param_groups_per_group_options():
    base, batches = mlp(), regression_batches(3)
    a, b = copy.deepcopy(base), copy.deepcopy(base)

    def groups(m):
        no_decay = [p for n, p in m.named_parameters() if p.dim() == 1]
        decay = [p for n, p in m.named_parameters() if p.dim() > 1]
        return [{"params": decay, "weight_decay": 0.5}, {"params": no_decay, "weight_decay": 0.0, "lr": 5e-3}]

    forge.attach(a, "adamw", params=groups(a), lr=1e-2, state_dtype="fp32")
    opt_t = torch.optim.AdamW(groups(b), lr=1e-2)
    for batch in batches:
        regression_step(a, batch)
        opt_t.zero_grad()
        regression_step(b, batch)
        opt_t.step()
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), base.parameters()):
        assert_close_to_update(pa, pb, p0, FUSED_FP32, name)


def test_step_and_zero_grad_are_harmless():
    base, batch = mlp(), regression_batches(1)[0]
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt_a = forge.attach(a, "adamw", state_dtype="fp32")
    forge.attach(b, "adamw", state_dtype="fp32")
    regression_step(a, batch)
    opt_a.step()
    opt_a.zero_grad()
    opt_a.step()
    regression_step(b, batch)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_same_seed_reproduces_bits():
    base, batches = mlp().bfloat16(), [(x.bfloat16(), y.bfloat16()) for x, y in regression_batches(3)]
    runs = []
    for _ in range(2):
        model = copy.deepcopy(base)
        forge.attach(model, "adamw", lr=1e-2, state_dtype="int8", seed=5)
        for batch in batches:
            regression_step(model, batch)
        runs.append(model)
    for p, q in zip(runs[0].parameters(), runs[1].parameters()):
        assert torch.equal(p, q)


def test_unknown_rule_lists_the_valid_ones():
    with pytest.raises(ValueError, match="adamw, nadam, radam, lion, rmsprop, adagrad, sgd"):
        forge.attach(mlp(), "adam8")


def test_unsupported_dtype_says_what_to_do():
    with pytest.raises(TypeError, match=r"fp32 and bf16 weights only.*model.to\(torch.bfloat16\)"):
        forge.attach(mlp().half(), "adamw")


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
        forge.attach(mlp(), "adamw", **bad)


def test_update_linear_applies_the_step_a_backward_applies():
    """`update_linear(weight, dy, x)` is the fused step a ForgeLinear's backward runs, and under an
    explicit `KernelConfig` (what benchmarks and the tuner pass) the same step again."""
    from forge.kernels import KernelConfig

    base = nn.Linear(24, 40, bias=False)
    x = torch.randn(6, 24)
    dy = torch.randn(6, 40)
    results = []
    for how in ("backward", "update_linear", "config"):
        layer = copy.deepcopy(base)
        opt = forge.attach(layer, "adamw", lr=1e-2, state_dtype="fp32")
        if how == "backward":
            layer(x).backward(dy)
        else:
            small = KernelConfig(block_n=16, block_k=64, block_t=16, num_warps=4)
            config = small if how == "config" else None
            opt.update_linear(layer.weight, dy, x, config=config)
        assert opt.state[layer.weight]["step"] == 1
        results.append(layer.weight.detach())
    torch.testing.assert_close(results[1], results[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(results[2], results[0], rtol=1e-6, atol=1e-7)
