"""Training in low precision: bf16 weights (stochastic rounding), autocast, and int8 states.

bf16: compare distances to an fp32-master reference, never a loose atol: FORGE on bf16 weights must
stay at least as close to fp32 training as torch's own AdamW on bf16 weights (and under autocast as
torch's AMP). int8: a short training run whose loss tracks fp32 states. The rounding and the
quantization themselves are tested in `tests/forge/kernels/test_rounding.py` and `test_quant.py`.
"""

import copy
import math

import pytest
import torch
from torch import nn

import forge


def _regression_model(k=64, n=48):
    return nn.Sequential(nn.Linear(k, n), nn.Tanh(), nn.Linear(n, 8))


def _train(model, step_fn, batches, autocast=False):
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = ((model(x).float() - y) ** 2).mean()
        loss.backward()
        step_fn()
    return model


def _distance(model, ref):
    return math.sqrt(
        sum(
            float((p.detach().double() - r.detach().double()).norm() ** 2)
            for p, r in zip(model.parameters(), ref.parameters())
        )
    )


@pytest.mark.parametrize(
    "lr, weight_scale, steps, factor",
    [(4e-4, 8.0, 50, 1.0), (1e-3, 1.0, 12, 2.0)],
    ids=["sub-ulp-updates", "ulp-sized-updates"],
)
def test_bf16_weights_track_fp32_master(lr, weight_scale, steps, factor):
    """Distance to fp32-master AdamW: FORGE bf16 (+SR, fp32 gradient in registers) vs torch's bf16 AdamW.

    Sub-ulp updates (small lr on large weights) are the dead zone: torch's bf16 AdamW rounds them
    away, FORGE must be closer to fp32 once the lost updates add up to more than the random walk of
    stochastic rounding (after about ulp / update steps; 50 here, at lr 4e-4 on weights of up to 1:
    every update is below half an ulp on the weights above 1/8, seven in eight, and lr x steps, the
    drift, is that of 1e-4 over 200 steps, as is the rounding's random walk, whose variance is about
    ulp x drift; over three seeds FORGE ends 0.27 from fp32 master against torch bf16's 0.46). With
    updates of about an ulp, stochastic rounding trades bias for variance (per-step error variance
    up to ulp^2/4 against ulp^2/12 for nearest), so there the check is the usual factor 2
    (dist(forge) <= 2 dist(torch bf16)).
    """
    base = _regression_model()
    with torch.no_grad():
        for p in base.parameters():
            p.mul_(weight_scale)
    teacher = _regression_model()
    xs = [torch.randn(32, 64) for _ in range(12)]
    batches = [(x, teacher(x).detach()) for x in xs] * (steps // 12 + 1)
    batches = batches[:steps]
    hp = dict(lr=lr, weight_decay=0.0)

    ref = copy.deepcopy(base)  # fp32 master weights and states: the target
    opt = torch.optim.AdamW(ref.parameters(), **hp)
    _train(ref, lambda: (opt.step(), opt.zero_grad()), batches)

    batches16 = [(x.bfloat16(), y.bfloat16()) for x, y in batches]
    bf = copy.deepcopy(base).bfloat16()
    opt_bf = torch.optim.AdamW(bf.parameters(), **hp)
    _train(bf, lambda: (opt_bf.step(), opt_bf.zero_grad()), batches16)

    fg = copy.deepcopy(base).bfloat16()
    forge.attach(fg, "adamw", state_dtype="bf16", stochastic_rounding=True, **hp)
    _train(fg, lambda: None, batches16)

    assert _distance(fg, ref) <= factor * _distance(bf, ref), (
        f"FORGE bf16+SR {_distance(fg, ref):.4g} vs torch bf16 {_distance(bf, ref):.4g} from fp32 master"
    )


def test_mixed_precision_tracks_fp32_as_closely_as_torch_amp(monkeypatch):
    """torch.autocast (bf16 compute, fp32 master weights and states), the usual mixed-precision
    recipe: FORGE must train under it and stay at least as close to full-fp32 AdamW as torch's AdamW
    under the same autocast. (FORGE accumulates dW from the bf16 operands in fp32 and never rounds
    it to bf16, which torch's autocast backward does.) The fused kernel must get bf16 operands, as
    autocast's linear would: fp32 ones would take the slow exact path and save twice the bytes."""
    from forge import functional

    operands = set()
    fused, kept = functional.fused_wgrad_update, functional.fused_wgrad_launch

    def spy(weight, dy, x, *args, **kwargs):  # the doors to the fused kernel: a launch,
        operands.add((weight.dtype, dy.dtype, x.dtype))
        return fused(weight, dy, x, *args, **kwargs)

    def spy_kept(weight, *bound):  # and a launch an optimizer keeps for its weight
        launch = kept(weight, *bound)

        def run(dy, x, *args):
            operands.add((weight.dtype, dy.dtype, x.dtype))
            return launch(dy, x, *args)

        return run

    monkeypatch.setattr(functional, "fused_wgrad_update", spy)
    monkeypatch.setattr(functional, "fused_wgrad_launch", spy_kept)
    base, teacher = _regression_model(), _regression_model()
    batches = [(x, teacher(x).detach()) for x in (torch.randn(32, 64) for _ in range(12))]
    hp = dict(lr=1e-3, weight_decay=0.01)

    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), **hp)
    _train(ref, lambda: (opt.step(), opt.zero_grad()), batches)

    amp = copy.deepcopy(base)
    opt_amp = torch.optim.AdamW(amp.parameters(), **hp)
    _train(amp, lambda: (opt_amp.step(), opt_amp.zero_grad()), batches, autocast=True)

    fg = copy.deepcopy(base)
    forge.attach(fg, "adamw", state_dtype="fp32", **hp)
    _train(fg, lambda: None, batches, autocast=True)

    assert all(p.dtype == torch.float32 for p in fg.parameters())
    assert operands == {(torch.float32, torch.bfloat16, torch.bfloat16)}
    assert _distance(fg, base) > 10 * _distance(fg, ref)  # it trained, and close to fp32
    assert _distance(fg, ref) <= 2 * _distance(amp, ref), (
        f"FORGE under autocast {_distance(fg, ref):.4g} vs torch AMP {_distance(amp, ref):.4g} from fp32"
    )


def test_int8_states_track_fp32_states_in_training():
    base, teacher = _regression_model(), _regression_model()
    xs = [torch.randn(32, 64) for _ in range(10)]  # the loss falls to about a third in 10 steps
    batches = [(x, teacher(x).detach()) for x in xs]
    losses = {}
    for state_dtype, group in (("fp32", 64), ("int8", 64), ("int8_g128", 128)):
        model = copy.deepcopy(base)
        forge.attach(model, "adamw", lr=3e-3, state_dtype=state_dtype[:4], int8_group=group)
        curve = []
        for x, y in batches:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            curve.append(float(loss))
        losses[state_dtype] = curve
    fp32 = losses["fp32"]
    for name in ("int8", "int8_g128"):
        int8 = losses[name]
        assert int8[-1] < int8[0] * 0.9, f"{name} run did not train"
        assert max(abs(a - b) / a for a, b in zip(fp32, int8)) < 0.05, f"{name}: {fp32} vs {int8}"
