"""harness.kernels.reference_exactness on a CPU: it refuses clearly, and its procedure holds.

The check itself runs the paper's kernels, which need a GPU (`bash scripts/device_sweep.sh
reference-exactness`); here, that a machine without one, or without the paper's package, is told
why and how and writes nothing, and that the procedure measures what it says on our side alone.
"""

from harness.kernels import reference_exactness
from harness.run.methods import forge_reference


def test_without_cuda_it_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert reference_exactness.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_an_unknown_case_is_named_with_the_choices(capsys):
    assert reference_exactness.main(["fp16"]) == 2
    assert "unknown case(s) fp16; choose from: bf16_operands, fp32, bf16" in capsys.readouterr().err


def test_without_the_package_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(reference_exactness.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(forge_reference, "installed", lambda: False)
    assert "pip install git+https://github.com/dk4248/FORGE" in reference_exactness.refusal()


def test_the_procedure_on_our_side_alone(monkeypatch):
    """Our FORGE and torch.optim against the fp64 step at a small size, in Triton's interpreter: each
    side a small fraction of the update away from the truth, and the update measured from the
    untouched initial weights (a side that stepped them in place would hide every distance)."""
    import torch

    rx = reference_exactness
    monkeypatch.setattr(rx, "DEVICE", "cpu")
    monkeypatch.setattr(rx, "T", 32)
    monkeypatch.setattr(rx, "N", 48)
    monkeypatch.setattr(rx, "K", 64)
    torch.manual_seed(0)
    w0 = torch.randn(rx.N, rx.K) * 0.02
    kept = w0.clone()
    fp32 = rx._torch_side(w0, torch.float32, lambda x, dy: dy.float().t() @ x.float())
    d = rx._run({"ours": rx._ours_kernel(w0), "torch": fp32}, torch.bfloat16, w0)
    assert torch.equal(w0, kept) and d["update"] > 1.0
    assert d["ours"] < 1e-5 * d["update"] and d["torch"] < 1e-5 * d["update"]
    bf16 = w0.bfloat16()
    torch_bf16 = rx._torch_side(bf16, torch.bfloat16, lambda x, dy: dy.t() @ x)
    sides = {"ours": rx._ours_module(bf16, stochastic_rounding=True), "torch": torch_bf16}
    d = rx._run(sides, torch.bfloat16, bf16)
    assert d["ours"] < 0.05 * d["update"] and d["torch"] < 0.05 * d["update"]
