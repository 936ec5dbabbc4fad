"""harness.kernels.reference_exactness on a CPU: it refuses clearly, with what it needs.

The check itself runs the paper's kernels, which need a GPU (`bash scripts/device_sweep.sh
reference-exactness`); here only that a machine without one, or without the paper's package, is
told why and how, and writes nothing.
"""

from harness.kernels import reference_exactness
from harness.run.methods import forge_reference


def test_without_cuda_it_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert reference_exactness.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_without_the_package_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(reference_exactness.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(forge_reference, "installed", lambda: False)
    assert "pip install git+https://github.com/dk4248/FORGE" in reference_exactness.refusal()
