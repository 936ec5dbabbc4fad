"""harness.run.fidelity in-process on CPU: a point trained beside its fp32 torch.optim reference.

torch's own rule in fp32 is its own reference to the bit; FORGE with fp32 weights and states (the
exact mode) equals it up to the GEMM's summation order; bf16 weights put a distance between them
that the rounding walk bounds; the states' error grows from fp32 to bf16 to int8; a method that
names no reference (or a configuration its plain rule does not run) gets no measurement."""

import math

import pytest
import torch

from harness.run import fidelity, methods, runner
from harness.run.config import ConfigError, compose_config

MICRO = ["+exp=smoke", "model=micro-llama", "seq_len=16", "steps=3", "warmup_steps=1"]


def _fidelity(*overrides: str) -> dict:
    record = runner.run_point(compose_config([*MICRO, *overrides]))
    assert record["status"] == "ok", record["error"]
    return record["fidelity"]


def test_torch_in_fp32_is_its_own_reference_to_the_bit():
    f = _fidelity("method=torch_adamw_fp32")
    assert f["reference"]["method"] == "torch_rule" and f["reference"]["options"]["rule"] == "adamw"
    assert f["weight_distance"] == 0.0 and f["loss_gap"] == 0.0 and f["state_error"] == 0.0
    assert f["gradient_error"] == 0.0  # the same fp32 forward and backward
    assert f["path"] >= 1.0 and f["rounding_walk"] < 1e-5  # fp32's ulp: the walk is negligible


def test_forge_in_fp32_equals_torch_up_to_the_gemms_summation_order():
    f = _fidelity("method=forge_fp32_exact")
    assert f["weight_distance"] < 1e-4 and abs(f["loss_gap"]) < 1e-5, f


def test_bf16_weights_land_within_their_rounding_walk():
    """FORGE bf16 with stochastic rounding against fp32 torch AdamW: a real distance, within the
    walk plus the update's error along the path, the loss gap within its bound."""
    f = _fidelity("method=forge_bf16")
    assert (
        0 < f["weight_distance"] <= f["rounding_walk"] + (f["state_error"] + f["gradient_error"]) * f["path"]
    )
    e = f["state_error"] + f["gradient_error"]
    assert abs(f["loss_gap"]) <= 3 * f["loss_rounding_walk"] + e * f["path"] * f["loss_per_distance"]
    assert len(f["reference_losses"]) == 3 and f["reference_losses"][-1] < f["reference_losses"][0]


def test_the_states_error_grows_from_fp32_to_bf16_to_int8():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64))
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(8, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    class Holder:
        def optimizers(self):
            return [opt]

    errors = [fidelity.state_error(Holder(), dtype) for dtype in ("fp32", "bf16", "int8")]
    assert errors[0] == 0.0 < errors[1] < errors[2] < 0.2, errors


@pytest.mark.parametrize(
    "label, overrides, expected",
    [
        ("forge_bf16", [], ("torch_rule", "adamw")),
        ("forge_lion", [], ("torch_rule", "lion")),
        ("forge_muon", [], ("muon", None)),
        ("muon", [], ("muon", None)),
        ("fused_adamw", [], ("torch_rule", "adamw")),
        ("forge_bf16_clip", [], None),  # the plain rule does not clip
        ("forge_muon", ["method.options.fallback=lion", "method.options.fallback_options={lr: 3e-4}"], None),
        ("lomo", [], None),
        ("no_optimizer", [], None),
    ],
)
def test_each_method_names_the_torch_rule_it_stands_for(label, overrides, expected):
    found = fidelity.reference_of(compose_config([*MICRO, f"method={label}", *overrides]))
    if expected is None:
        assert found is None
        return
    name, options = found
    assert name == expected[0] and (expected[1] is None or options["rule"] == expected[1])
    methods.make_options(name, options)  # options the reference method accepts


def test_the_ulp_of_bf16_and_fp32():
    w = torch.tensor([1.0, 1.5, 0.02, -3.0, 0.0])
    assert fidelity._ulp(w, torch.bfloat16)[:4].tolist() == [2**-7, 2**-7, 2**-13, 2**-6]
    assert fidelity._ulp(w, torch.float32)[0].item() == 2**-23
    assert math.isfinite(fidelity._ulp(w, torch.bfloat16)[4].item())


def test_fidelity_is_refused_where_its_reference_cannot_run_beside_the_point():
    for bad in (["gpus=2"], ["method.cuda_graph=true"]):
        with pytest.raises(ConfigError, match="measure.fidelity"):
            compose_config([*MICRO, "method=fused_adamw", *bad])
    with pytest.raises(ConfigError, match="measure.fidelity"):
        compose_config(["+exp=convergence_smoke", "measure.fidelity=true"])
