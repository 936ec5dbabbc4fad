"""The Newton-Schulz probe's CPU half: the shapes it reads from conf/model/, its fp64 references,
the per-shape pick and the AUTO table it writes into forge (the timing itself needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from forge import newton_schulz as ns
from harness import results
from harness.kernels import newton_schulz as probe

ROOT = Path(__file__).resolve().parents[3]


def test_the_hidden_shapes_come_from_the_model_configs():
    assert probe.hidden_shapes("llama3.1-8b") == {
        "q": (4096, 4096),
        "k": (1024, 4096),
        "gate": (14336, 4096),
        "down": (4096, 14336),
    }
    assert probe.hidden_shapes("qwen3-14b")["q"] == (5120, 5120)  # head_dim 128 x 40 heads
    with pytest.raises(ValueError, match="known models: .*llama3.1-8b"):
        probe.hidden_shapes("llama-9000")


@pytest.mark.parametrize("shape", [(23, 57), (57, 23), (31, 31)], ids=["wide", "tall", "square"])
def test_the_polar_factor_is_the_svds(shape):
    u = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    left, _, right = torch.linalg.svd(u.double(), full_matrices=False)
    assert probe.distance(probe.polar_factor(u), left @ right) < 1e-9


def test_the_fp64_iteration_is_what_the_bf16_one_approximates():
    u = torch.randn(17, 40, generator=torch.Generator().manual_seed(1))
    for variant in ("torch", "polar_express"):
        bf16 = ns.newton_schulz(u, variant, ns.NS_COEFFICIENTS, probe.STEPS, probe.EPS)
        assert probe.distance(bf16, probe.iteration_fp64(u, variant)) < 0.05


def _record(n, k, variant, ms, safe=True, status="ok"):
    return dict(N=n, K=k, variant=variant, time_ms=ms, safe=safe, status=status)


def test_the_pick_is_the_fastest_safe_variant_per_shape_and_torch_otherwise():
    records = [
        _record(4096, 14336, "torch", 10.0),
        _record(4096, 14336, "gram_symmetric", 4.0),
        _record(4096, 14336, "polar_express", 1.0, safe=False),
        _record(14336, 4096, "torch", 10.0),
        _record(14336, 4096, "gram", 5.0),
        _record(4096, 4096, "torch", 3.0),
        _record(4096, 4096, "gram", 2.0, safe=False),
        _record(4096, 4096, "symmetric", 1.0, status="error"),
    ]
    assert probe.picks(records) == {(4096, 4096): "torch", (4096, 14336): "gram_symmetric"}


def test_the_auto_table_is_written_between_its_markers(tmp_path):
    target = tmp_path / "newton_schulz.py"
    target.write_text(probe.AUTO_FILE.read_text())
    probe.write_auto({(1024, 4096): "gram", (4096, 4096): "symmetric"}, "run.jsonl", target)
    namespace: dict = {}
    exec(compile(target.read_text(), str(target), "exec"), namespace)
    assert namespace["AUTO"] == {(1024, 4096): "gram", (4096, 4096): "symmetric"}


def test_forges_auto_table_is_the_newest_committed_runs_pick():
    """AUTO is generated, never typed: it equals the pick of the newest run under results/, or is
    empty where none has run (every shape then gets torch's iteration)."""
    from harness.report.doc_probes import newest_newton_schulz_run

    found = newest_newton_schulz_run(ROOT)
    assert (probe.picks(found[1]) if found else {}) == ns.AUTO
    assert all(results.is_declared(name) for name in ("safe", "polar_relative_error", "time_ms"))


def test_a_tiny_dry_run_writes_a_record_per_variant_and_shape_that_auto_refuses(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert probe.main(["--tiny"]) == 0
    (path,) = tmp_path.glob("newton-schulz-tiny-*.jsonl")
    records = results.read(path)
    assert len(records) == len(ns.VARIANTS) * len(probe.TINY["tiny"])
    assert all(r["status"] == "ok" and r["time_ms"] > 0 for r in records)
    polar = {(r["shape_name"], r["variant"]): r["polar_relative_error"] for r in records}
    assert all(polar[(name, "polar_express")] < polar[(name, "torch")] for name in probe.TINY["tiny"])
    assert probe.main(["--auto", str(path)]) == 2 and "dry run" in capsys.readouterr().out
