"""Every file in conf/ composes and validates; bad overrides fail at once, naming the valid choices.

Composition only (no model is built, except on the meta device to check architecture sizes), in
the spirit of lightning-hydra-template's tests/test_configs.py.
"""

import pytest
import torch

from harness.__main__ import main
from harness.run import architecture, grid, hardware, methods, models
from harness.run.config import ConfigError, compose_config, group_choices


def _ranks(group: str, name: str) -> list[str]:
    """A data-parallel method file composes for two ranks (one is refused: nothing to share out)."""
    return ["gpus=2"] if group == "method" and hardware._data_parallel(name) else []


@pytest.mark.parametrize("group", ["method", "model", "gpu"], ids=lambda g: f"{g}-group")
def test_every_group_file_composes(group):
    for name in group_choices(group):
        cfg = compose_config([f"{group}={name}", *_ranks(group, name)])
        assert cfg[group].name


@pytest.mark.parametrize("method", group_choices("method"))
def test_method_file_label_matches_name_and_options_build(method):
    cfg = compose_config([f"method={method}", *_ranks("method", method)])
    assert cfg.method.label == method  # the label is the point id's first part
    methods.make_options(cfg.method.name, dict(cfg.method.options))


@pytest.mark.parametrize("exp", group_choices("exp"))
def test_every_experiment_composes_and_expands(exp):
    overrides = [f"+exp={exp}"]
    cfg = compose_config(overrides)
    # its own sweep, or another experiment's that it adds methods to (+exp=convergence_fp8)
    assert cfg.sweep.name == exp or cfg.sweep.name in group_choices("exp")
    if cfg.sweep.mode == "grid":
        points = grid.expand(cfg, overrides)
        assert len({p.id for p in points}) == len(points) > 0


def test_smoke_results_are_scratch():
    cfg = compose_config(["+exp=smoke"])
    assert cfg.sweep.scratch and cfg.results_dir == "results/smoke" and cfg.device == "cpu"


def test_capacity_experiment_caps_memory():
    cfg = compose_config(["+exp=capacity_a100_40gb"])
    assert cfg.sweep.mode == "capacity" and cfg.gpu.memory_cap_gib == 40


@pytest.mark.parametrize(
    "model, expected",
    [("llama3.1-8b", 8.03e9), ("qwen3-0.6b", 0.596e9), ("qwen3-8b", 8.19e9), ("qwen3-14b", 14.77e9)],
)
def test_architectures_have_the_published_size(model, expected):
    cfg = compose_config([f"model={model}"])
    with torch.device("meta"):
        m = models.build(cfg.model, "bf16", "meta")
    assert architecture.n_params(m) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize(
    "override, must_mention",
    [
        ("batch_sise=2", "batch_size"),  # a typo: the valid keys and a suggestion
        ("method=adamw9", "fused_adamw"),  # an unknown group choice: Hydra lists the options
        ("dtype=fp16", "bf16, fp32"),
        ("device=tpu", "auto, cuda, cpu"),
        ("batch_size=0", "positive"),
        ("batch_size=two", "batch_size"),
        ("warmup_steps=50", "warmup_steps"),
        ("sweep.mode=random", "grid, capacity"),
        ("method.options.state_dtype=fp8", "fp32, bf16, int8"),
        ("+method.options.colour=red", "valid options"),
        ("+method.fallback_options={lr: 1.0}", "Key 'fallback_options' not in 'MethodConfig'"),
        ("gpu.allocator=expandable", "expandable_segments:True"),
    ],
)
def test_bad_override_fails_clearly(override, must_mention):
    base = ["method=forge_bf16"] if "options" in override else []
    with pytest.raises(ConfigError, match=None) as e:
        compose_config([*base, override])
    assert must_mention in str(e.value)


def test_cli_reports_a_bad_config_with_exit_code_2(capsys):
    assert main(["sweep", "+exp=smoke", "batch_sise=2"]) == 2
    assert "did you mean 'batch_size'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "typo, close",
    [
        ("+exp=llama8b_h20", "did you mean llama8b_h200"),
        ("method=forge_bf17", "did you mean forge_bf16"),
        ("model=tiny-lama", "did you mean tiny-llama"),
        ("method=zzzzz", "none is close"),
    ],
)
def test_a_typo_in_a_config_name_gets_the_closest_names_and_nothing_else(capsys, typo, close):
    """One line: the override, the closest names, where to see them all; no Hydra search path, no
    list of every option."""
    assert main(["sweep", typo]) == 2
    err = capsys.readouterr().err
    assert close in err and "`python -m harness list` names them all" in err
    assert len(err.strip().splitlines()) == 1, err
    for internal in ("Could not find", "search path", "Available options", "Traceback"):
        assert internal not in err, internal


def test_cli_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "llama3.1-8b" in out and "smoke" in out and "forge_int8" in out
