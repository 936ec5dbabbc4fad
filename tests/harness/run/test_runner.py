"""harness.run.runner in-process on CPU: one point end to end, activation checkpointing, real weights
from a local path, and the verdicts that turn a measured run into ok / error / diverged."""

import pytest
import torch

from harness.run import architecture, models, runner
from harness.run.config import compose_config
from tests.harness import CONF

TINY = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=3", "warmup_steps=1"]
TINY += ["method.lr=1e-3"]


def test_run_point_with_activation_checkpointing():
    record = runner.run_point(compose_config([*TINY, "activation_checkpointing=true"]))
    assert record["status"] == "ok", record["error"]
    assert record["activation_checkpointing"] is True and record["config"]["activation_checkpointing"]
    assert record["tokens_per_s"] > 0 and record["mfu"] is None  # no known peak on a CPU


def test_run_point_loads_real_weights_from_a_local_path(tmp_path):
    cfg = compose_config(TINY)
    models.build(cfg.model, "fp32", "cpu", seed=123).save_pretrained(tmp_path)
    record = runner.run_point(compose_config([*TINY, f"model.path={tmp_path}", "method=no_optimizer"]))
    fresh = runner.run_point(compose_config([*TINY, "method=no_optimizer"]))
    assert record["status"] == fresh["status"] == "ok"
    assert record["loss_first"] != pytest.approx(fresh["loss_first"])  # other weights, other loss


@pytest.mark.parametrize(
    "losses, moved, trains, expected",
    [
        ([5.0, 4.0], 1.0, True, "ok"),
        ([5.0, 5.0], 1.0, True, "error"),  # the loss did not fall
        ([5.0, 4.0], 0.0, True, "error"),  # nothing moved: the hooks were lost
        ([5.0, 5.0], 0.0, False, "ok"),  # the no-optimizer floor is not expected to train
        ([5.0, float("nan")], 1.0, True, "diverged"),
        ([5.0, float("inf")], 1.0, False, "diverged"),
    ],
)
def test_verdict(losses, moved, trains, expected):
    status, error = runner.verdict(losses, moved, trains, check_training=True)
    assert status == expected
    assert (error is None) == (expected == "ok")


def test_an_out_of_memory_point_still_says_how_large_its_model_was(monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(runner, "train_and_measure", oom)
    record = runner.run_point(compose_config(TINY))
    built = models.build(compose_config(TINY).model, "fp32", "cpu")
    assert record["status"] == "oom" and record["n_params"] == architecture.n_params(built)


def test_a_package_that_cannot_load_makes_the_point_unavailable():
    cfg = compose_config([*TINY, f"hydra.searchpath=[file://{CONF}]", "method=fake_brokenimport"])
    record = runner.run_point(cfg)
    assert record["status"] == "unavailable" and "libcudart" in record["error"]


def test_timed_steps_count_triton_compiles_per_step():
    """A step during which Triton compiles (simulated by calling its post-compile hook, as its JIT
    does) is counted as such; the hook already installed is chained and then restored."""
    import torch
    from triton import knobs

    from harness.run import measure

    outer = []

    def outer_hook(**kw):
        outer.append(kw)

    knobs.runtime.jit_post_compile_hook = outer_hook
    try:
        calls = iter(range(4))

        def step():
            if next(calls) == 2:
                knobs.runtime.jit_post_compile_hook(key="k", repr="kernel")
            return torch.tensor(1.0)

        compiles: list[int] = []
        losses, times = measure.timed_steps(step, 4, "cpu", compiles)
        assert compiles == [0, 0, 1, 0] and len(times) == 4
        assert outer == [{"key": "k", "repr": "kernel"}]  # chained
        assert knobs.runtime.jit_post_compile_hook is outer_hook  # restored
    finally:
        knobs.runtime.jit_post_compile_hook = None


@pytest.mark.parametrize("method", ["fused_adamw_amp", "forge_amp"])
def test_a_mixed_precision_point_trains_and_says_so(method):
    """method.autocast=bf16: fp32 master weights, forward under torch.autocast; recorded in the
    options so that it is never compared as the same configuration as the plain fp32 method."""
    record = runner.run_point(compose_config([*TINY, f"method={method}"]))
    assert record["status"] == "ok", record["error"]
    assert record["method_options"]["autocast"] == "bf16" and record["master_weights"] == "fp32"
    assert record["loss_last"] < record["loss_first"]


def test_an_unknown_autocast_dtype_is_refused():
    from harness.run.config import ConfigError

    with pytest.raises(ConfigError, match="method.autocast='fp16' is not valid; choose one of: bf16"):
        compose_config([*TINY, "method=fused_adamw_amp", "method.autocast=fp16"])
