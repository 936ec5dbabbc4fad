"""The regression check's kernel suite (`python -m harness kernels --regress`) without a GPU: its
points, its records and how the check keys them, its refusals; and the deliberate slowdown's
switches (`harness.slowdown`, FORGE's `debug_delay_us`)."""

import pytest
import torch

from harness.kernels import bench, layers, regress_suite
from harness.points import config_key
from harness.records import split_kinds
from harness.run.methods.forge import Forge, ForgeOptions
from harness.slowdown import Delay


def test_the_suite_times_four_llama_shapes_at_two_token_counts():
    points = regress_suite.points()
    assert [(p.shape_name, p.T) for p in points] == [
        (shape, T) for shape in ("q", "o", "gate", "down") for T in (1024, 4096)
    ]
    shapes = layers.linear_shapes(layers.MODELS["llama3.1-8b"])
    assert all(shapes[p.shape_name] == (p.N, p.K) for p in points)
    labels = [v.label for v in regress_suite.VARIANTS]
    assert labels == ["cublas_gemm", "gemm_plus_fused_adamw_graph [adamw, bf16]"] + [
        f"forge [adamw, {dtype}]" for dtype in ("bf16", "int8")
    ]


def test_a_record_keeps_its_per_repeat_samples_and_is_keyed_without_its_slowdown():
    point = regress_suite.points()[4]  # gate, T = 1024
    forge = regress_suite.VARIANTS[2]
    meta = dict(gpu_name="NVIDIA H200", time="2026-12-01T00:00:00")
    record = regress_suite.make_record(meta, point, forge, [0.30, 0.28, 0.29], 0.18, debug_slowdown=0.06)
    assert record["status"] == "ok" and record["repeats"] == 3 and record["time_ms"] == 0.29
    assert record["ratio_to_gemm"] == pytest.approx(0.29 / 0.18)
    assert regress_suite.samples(record) == [0.30, 0.28, 0.29]
    assert (record["sweep"], record["model"], record["shape_name"], record["T"]) == (
        "kernels_regress",
        "llama3.1-8b",
        "gate",
        1024,
    )
    assert split_kinds([record]) == ([], [record])  # a kernel record to the report and the check
    twin = regress_suite.make_record(meta, point, forge, [0.28], 0.18)
    assert regress_suite.key(record) == regress_suite.key(twin) and twin["debug_slowdown"] is None
    gemm = regress_suite.make_record(meta, point, regress_suite.REFERENCE, [0.18], 0.18)
    assert regress_suite.is_reference(gemm) and not regress_suite.is_reference(record)
    assert regress_suite.reference_key(gemm) == regress_suite.reference_key(record)
    failed = regress_suite.make_record(meta, point, forge, None, error="OutOfMemoryError: CUDA out of memory")
    assert failed["status"] == "oom" and failed["time_ms"] is None and regress_suite.samples(failed) is None


def test_the_suite_needs_a_new_output_file(tmp_path, capsys):
    assert bench.main(["--regress"]) == 2
    assert "needs --output FILE" in capsys.readouterr().out
    taken = tmp_path / "kernels.jsonl"
    taken.write_text("")
    assert bench.main(["--regress", "--output", str(taken)]) == 2
    assert "would not overwrite" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_a_gpu_the_suite_says_so(tmp_path, capsys):
    out = tmp_path / "kernels.jsonl"
    assert bench.main(["--regress", "--output", str(out), "--debug-slowdown", "6%"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert not out.exists()


def test_forge_debug_delay_is_checked_and_keyed_as_before_when_off():
    with pytest.raises(ValueError, match="debug_delay_us"):
        ForgeOptions(debug_delay_us=-1)
    assert "CUDA" in Forge.unavailable_reason("cpu", ForgeOptions(debug_delay_us=60))
    assert Forge.unavailable_reason("cpu", ForgeOptions()) in (None, Forge.unavailable_reason("cpu"))
    old = {"method": "forge", "method_options": {"lr": 1e-4, "state_dtype": "bf16"}}
    new = {"method": "forge", "method_options": {**old["method_options"], "debug_delay_us": 0.0}}
    assert config_key(old) == config_key(new)  # records written before the option are the same point


def test_a_zero_delay_does_nothing_anywhere():
    delay = Delay(0)
    assert delay.cycles == 0
    delay()  # no GPU needed: nothing is launched
    with pytest.raises(ValueError):
        Delay(-1)


def test_forge_debug_delay_spins_once_in_each_fused_layers_backward(monkeypatch):
    """The option hooks every ForgeLinear's backward (torch's backward pre-hook): one spin of the
    asked length per fused update of a step (recorded here, not run)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(cycles))
    monkeypatch.setattr("harness.slowdown.cycles_per_us", lambda: 1000.0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    method = Forge(model, 1e-3, ForgeOptions(), "cpu")
    method.setup()
    before = model[0].weight.detach().clone()
    method._slow_down(60)
    model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert calls == [60_000, 60_000]  # two fused layers, 60 us at 1000 cycles per us
    assert not torch.equal(model[0].weight, before)  # and each layer's update still ran
    assert "debug_delay_us" in method.notes[-1]
