"""The Muon methods on CPU: torch's (`muon`) and FORGE's (`forge_muon`) build and train the tiny
models as sweep points, on the recipe's split; torch's step is torch.optim.Muon and AdamW exactly;
their options refuse bad values; their memory models hold the bytes the module docstring counts;
a convergence run schedules each param group from its own peak."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import forge.muon
from harness.report import expectations as ex
from harness.run import convergence, methods, models, runner
from harness.run.config import ConfigError, compose_config
from harness.run.methods import muon

TINY = ["gpu=cpu", "device=cpu", "seq_len=16", "steps=3", "warmup_steps=1"]
# fp32 weights and states, three steps of the tiny Llama: FORGE's Muon and torch's part by at most
# 5.1e-5 nats (a 2-core x86 host, triton 3.9's interpreter: 0, 4.8e-7, 5.1e-5 at steps 1-3), where
# the GEMM's summation order flips the bf16 rounding of a few elements of what Newton-Schulz takes.
# A momentum of 0.9 instead of 0.95 moves torch's own loss by 5.8e-4 in those steps, Nesterov off
# by 9.0e-3, the weight decay off by 1.5e-3: 3e-4 leaves 6x the measured gap and catches those.
FP32_TOLERANCE_NATS = 3e-4


def _point(method: str, model: str = "tiny-llama", *extra: str) -> dict:
    record = runner.run_point(compose_config([*TINY, f"model={model}", f"method={method}", *extra]))
    assert record["status"] == "ok", record["error"]
    return record


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_torch_muon_trains_the_tiny_models_as_a_point(model):
    record = _point("muon", model)
    # the norms (ones) do not move in three bf16 steps at AdamW's 3e-4: 1 + 3e-4 rounds to 1
    assert record["loss_last"] < record["loss_first"] and record["params_moved_frac"] > 0.6
    assert record["master_weights"] == "bf16" and record["method_options"]["fallback_options"]["lr"] == 3e-4
    assert any("hidden matrices by torch.optim.Muon" in note for note in record["notes"])
    # bf16: Muon's momentum on the hidden matrices, AdamW's two moments on the rest, every gradient
    built = models.build(compose_config([f"model={model}"]).model, "bf16", "cpu")
    hidden, rest = forge.muon.hidden_matrices(built)
    states = 2 * sum(p.numel() for p in hidden) + 4 * sum(p.numel() for p in rest)
    assert record["optimizer_state_gib"] * 2**30 == pytest.approx(states, abs=64)  # + the step counts
    assert record["grads_gib"] * 2**30 == 2 * sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_forge_muon_trains_the_tiny_models_as_a_point(model):
    """forge.attach(model, "muon", fallback="adamw"): the hidden matrices by Muon, the rest by AdamW;
    no gradient but the hooked parameters', one at a time (the embedding's is the largest)."""
    record = _point("forge_muon", model)
    assert record["loss_last"] < record["loss_first"] and record["params_moved_frac"] > 0.6
    built = models.build(compose_config([f"model={model}"]).model, "bf16", "cpu")
    hidden, rest = forge.muon.hidden_matrices(built)
    note = next(note for note in record["notes"] if note.startswith("forge_muon: "))
    assert note == f"forge_muon: {len(hidden)} parameters by muon, {len(rest)} parameters by adamw"
    assert record["grads_gib"] * 2**30 == 2 * built.get_input_embeddings().weight.numel()
    states = 2 * sum(p.numel() for p in hidden) + 4 * sum(p.numel() for p in rest)  # bf16 states
    assert record["optimizer_state_gib"] * 2**30 == states  # nothing but the rules' state tensors


def test_forge_muon_in_fp32_follows_torch_muon_in_fp32():
    """fp32 weights and states: FORGE's Muon orthogonalizes what torch's does, op for op in bf16
    (forge.muon.orthogonalize), so the two part only by where the momentum and the update round."""
    torch_, forge_ = _point("muon_fp32"), _point("forge_muon_fp32")
    assert (
        max(abs(a - b) for a, b in zip(torch_["losses"], forge_["losses"], strict=True)) < FP32_TOLERANCE_NATS
    )


def test_the_experiment_runs_in_miniature_on_a_cpu_and_reports(tmp_path, monkeypatch):
    """+exp=muon_h200 on the tiny Llama at 16 tokens, each point trained in this process:
    the eager points train, the graphed ones are `unavailable` (a CUDA graph needs CUDA), and a
    report of the results has the Muon section with their rows, FORGE's interpreted times marked."""
    from harness import results
    from harness.report import report
    from harness.run import local, sweep

    monkeypatch.setattr(local, "run_isolated", lambda point, git: runner.run_point(point.cfg, point.id, git))
    overrides = ["+exp=muon_h200", "gpu=cpu", "device=cpu", "sweep.models=[tiny-llama]"]
    overrides += ["sweep.batch_sizes=[1]", "sweep.seq_lens=[16]", "steps=3", "warmup_steps=1"]
    path = sweep.run_sweep([*overrides, f"results_dir={tmp_path}"])
    status = {(r["method_label"], r["batch_size"]): r["status"] for r in results.read(path)}
    assert len(status) == 8  # the floor, torch's, FORGE's and FORGE's fast Newton-Schulz, each mode
    assert all(s == ("unavailable" if label.endswith("_graph") else "ok") for (label, _), s in status.items())
    assert report.main([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    rows = [line for line in (tmp_path / "report" / "tables" / "muon.md").read_text().splitlines()]
    eager = next(line for line in rows if line.startswith("| tiny-llama | 16 | 1 x 16 | eager |"))
    cells = [cell.strip() for cell in eager.strip("|").split("|")]
    assert re.fullmatch(r"[\d.]+ \[\d\]", cells[6]) and cells[7] == "—"  # FORGE's, interpreted: no ratio
    graphed = next(line for line in rows if line.startswith("| tiny-llama | 16 | 1 x 16 | graphed |"))
    assert graphed.count("unavailable") == 7  # the floor's and the three methods' steps, their peaks


def _tiny(seed: int = 0) -> torch.nn.Module:
    cfg = compose_config(["model=tiny-llama"])
    return models.build(cfg.model, "fp32", "cpu", seed=seed)


def test_torch_muons_step_is_torch_muon_and_adamw_on_the_recipes_split():
    """Two steps of the method against torch.optim.Muon and AdamW built by hand on a copy."""
    model = _tiny()
    twin = copy.deepcopy(model)
    options = methods.make_options("muon", {})
    method = muon.TorchMuon(model, 0.02, options, "cpu")
    method.setup()
    hidden, rest = forge.muon.hidden_matrices(twin)
    by_hand = [
        torch.optim.Muon(hidden, lr=0.02, **options.muon_hparams()),
        torch.optim.AdamW(rest, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01, foreach=True),
    ]
    assert [len(g["params"]) for opt in method.optimizers() for g in opt.param_groups] == [
        len(hidden),
        len(rest),
    ]
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        method.step(ids)
        twin(input_ids=ids, labels=ids).loss.backward()
        for opt in by_hand:
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "options, message",
    [
        ({"momentum": 1.0}, "momentum=1.0 is not valid"),
        ({"ns_steps": 0}, "ns_steps=0 is not valid"),
        ({"ns_coefficients": [3.4, -4.7]}, "three coefficients"),
        ({"eps": 0.0}, "eps=0.0 is not valid"),
        (
            {"adjust_lr_fn": "rms"},
            "adjust_lr_fn='rms' is not valid; choose one of: None, original, match_rms_adamw",
        ),
        ({"fallback_options": {"betas": [0.9, 0.95]}}, "fallback_options needs lr"),
        ({"fallback_options": {"lr": 1e-3, "momentum": 0.9}}, "unknown key.*momentum.*valid keys: lr, betas"),
    ],
)
def test_bad_muon_options_are_refused_before_anything_is_built(options, message):
    for name in ("muon", "forge_muon"):
        with pytest.raises(ConfigError, match=message):
            methods.validate(name, options)


def test_forge_muon_checks_its_storage_and_fallback_against_forge():
    with pytest.raises(ConfigError, match="state_dtype='fp16' is not valid; choose one of: fp32, bf16"):
        methods.validate("forge_muon", {"state_dtype": "fp16"})
    with pytest.raises(ConfigError, match="fallback='adam' is not valid"):
        methods.validate("forge_muon", {"fallback": "adam"})
    with pytest.raises(
        ConfigError, match="newton_schulz='fast' is not valid; choose one of: torch, symmetric"
    ):
        methods.validate("forge_muon", {"newton_schulz": "fast"})
    # the fallback's options are the fallback rule's hyperparameters, as forge.RULES names them
    methods.validate(
        "forge_muon", {"fallback": "lion", "fallback_options": {"lr": 1e-4, "betas": [0.9, 0.99]}}
    )
    with pytest.raises(ConfigError, match="unknown key.*eps"):
        methods.validate("forge_muon", {"fallback": "lion", "fallback_options": {"lr": 1e-4, "eps": 1e-8}})


def test_a_muon_point_composes_from_the_command_line():
    cfg = compose_config(
        ["method=muon", "method.options.fallback_options.lr=1e-3", "method.options.ns_steps=3"]
    )
    options = methods.make_options(cfg.method.name, dict(cfg.method.options))
    assert options.fallback_options["lr"] == 1e-3 and options.ns_steps == 3
    with pytest.raises(ConfigError, match="ns_steps=100 is not valid"):
        compose_config(["method=muon", "method.options.ns_steps=100"])


# ---------------------------------------------------------------------------------------------
# Memory models


LLAMA_8B = [
    (4096, 4096),
    (1024, 4096),
    (1024, 4096),
    (4096, 4096),
    (14336, 4096),
    (14336, 4096),
    (4096, 14336),
]


def test_torch_muons_footprint():
    bf16, fp32 = ex.footprint("muon", {}), ex.footprint("muon", {}, "fp32")
    assert (bf16.weights, bf16.grads, bf16.states) == (2.0, 2.0, 2.0)  # momentum in the weights' dtype
    assert (bf16.rest.grads, bf16.rest.states) == (2.0, 4.0)  # AdamW's two moments
    assert bf16.update_traffic == 2 * 2 + 2 * 2 + 2 * 2 + 2 * 2  # gradient, weight, momentum, NS input
    assert bf16.workspace == (6.0, 4.0) and fp32.workspace == (8.0, 4.0)
    assert ex.footprint("muon", {"nesterov": False}).workspace == (4.0, 4.0)  # the buffer itself
    assert (fp32.states, fp32.rest.states) == (4.0, 8.0)
    # the largest of Llama-3.1-8B's hidden layers is the MLP's, 14336 x 4096: 6 N K + 4 K^2 bytes
    assert bf16.workspace_bytes(LLAMA_8B) == 6 * 14336 * 4096 + 4 * 4096**2 == 419_430_400


def test_the_gram_iterations_hold_their_larger_workspace():
    from harness.run.methods.muon import FORGE_WORKSPACE, GRAM_WORKSPACE, ForgeMuon

    for variant, workspace in [("torch", FORGE_WORKSPACE), ("symmetric", FORGE_WORKSPACE),
                               ("gram_symmetric", GRAM_WORKSPACE), ("auto", GRAM_WORKSPACE)]:  # fmt: skip
        assert ForgeMuon.footprint({"newton_schulz": variant}, 2.0).workspace == workspace


def test_a_split_footprint_averages_over_the_model():
    bf16 = ex.footprint("muon", {})
    mixed = bf16.mixed(0.75)
    assert mixed.rest is None and mixed.workspace == bf16.workspace
    assert (mixed.weights, mixed.grads, mixed.states) == (2.0, 2.0, 0.75 * 2 + 0.25 * 4)
    assert ex.footprint("fused_adamw", {}).mixed(0.5) == ex.footprint("fused_adamw", {})  # nothing to mix


# ---------------------------------------------------------------------------------------------
# Convergence: each param group from its own peak


def test_a_convergence_run_schedules_each_group_from_its_own_peak():
    method = muon.TorchMuon(_tiny(), 0.02, methods.make_options("muon", {}), "cpu")
    method.setup()
    groups = convergence.scheduled_groups(method)
    assert [scale for _, scale in groups] == [1.0, pytest.approx(3e-4 / 0.02)]
    convergence.set_scaled_lr(groups, 0.01)
    assert [g["lr"] for opt in method.optimizers() for g in opt.param_groups] == [0.01, pytest.approx(1.5e-4)]


def test_a_method_with_one_learning_rate_is_scheduled_exactly():
    model = _tiny()
    fused = methods.get("fused_adamw")(model, 3e-3, methods.make_options("fused_adamw", {}), "cpu")
    fused.setup()
    groups = convergence.scheduled_groups(fused)
    for lr in (1e-7, 2.9e-3, 3e-3 / 7):
        convergence.set_scaled_lr(groups, lr)
        assert fused.opt.param_groups[0]["lr"] == lr  # bit for bit: the scale is exactly 1.0


@pytest.mark.parametrize("options, method", [("forge", "forge_muon"), ("torch_rule", "muon")])
def test_the_element_wise_methods_send_muon_to_its_own(options, method):
    """`forge` and `torch_rule` train every parameter by one rule; Muon trains a split of the model,
    so naming it there is refused at once, with the method that runs it."""
    import importlib

    module = importlib.import_module(f"harness.run.methods.{options}")
    cls = module.ForgeOptions if options == "forge" else module.TorchRuleOptions
    with pytest.raises(ValueError, match=f"use method={method}"):
        cls(rule="muon")
