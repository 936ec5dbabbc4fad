"""forge.muon's whole-matrix half against torch.optim.Muon's own: the Newton-Schulz iteration op
for op, the learning-rate adjustment, and the weight's step from host scalars or device tensors."""

import pytest
import torch

from forge import muon

SHAPES = [(17, 23), (64, 31), (9, 9), (1, 5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_orthogonalize_is_torchs_newton_schulz_and_leaves_its_input(shape, dtype):
    from torch.optim._muon import _zeropower_via_newtonschulz

    torch.manual_seed(0)
    u = torch.randn(*shape, dtype=dtype)
    kept = u.clone()
    ours = muon.orthogonalize(u, muon.NS_COEFFICIENTS, 5, 1e-7)
    assert torch.equal(u, kept), (
        "the update orthogonalized must not change"
    )  # torch's divides a bf16 input in place
    assert torch.equal(ours, _zeropower_via_newtonschulz(kept.clone(), muon.NS_COEFFICIENTS, 5, 1e-7))
    assert ours.dtype == torch.bfloat16 and ours.shape == u.shape


@pytest.mark.parametrize("adjust_lr_fn", muon.ADJUST_LR_FNS)
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 4096), (7, 7)], ids=["tall", "wide", "square"])
def test_the_learning_rate_is_adjusted_as_torch_does(shape, adjust_lr_fn):
    from torch.optim._muon import _adjust_lr

    assert muon.adjusted_lr(0.02, adjust_lr_fn, torch.Size(shape)) == _adjust_lr(
        0.02, adjust_lr_fn, torch.Size(shape)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_step_from_device_scalars_equals_the_step_from_host_ones(dtype):
    """Both compute W * decay - step * O in fp32 and round it to W's dtype, as torch.optim.Muon's
    `add_` does on a GPU and on a CPU's vectorized kernels: the two steps agree to the bit. A CPU
    without those kernels (ATEN_CPU_CAPABILITY=default) adds bf16 by its scalar kernel, which rounds
    the product to bf16 before the sum: there the host step is still torch's own and the device
    step within one bf16 step of the exact value."""
    torch.manual_seed(1)
    w = torch.randn(12, 8, dtype=dtype)
    host, device = w.clone(), w.clone()
    o = torch.randn(12, 8).bfloat16()
    muon.apply(host, o, 1 - 0.02 * 0.1, 0.013)
    muon.apply(device, o, torch.tensor(1 - 0.02 * 0.1), torch.tensor(0.013))
    decayed = w.clone().mul_(1 - 0.02 * 0.1)
    assert torch.equal(host, decayed.clone().add_(o, alpha=-0.013))  # torch.optim.Muon's step
    exact = decayed.double() - torch.tensor(0.013).double() * o.double()
    step = exact.abs().to(dtype).double().clamp_min(torch.finfo(dtype).tiny) * torch.finfo(dtype).eps
    assert bool(((device.double() - exact).abs() <= step).all()), "the device step is not W's rounding"
    in_fp32 = (decayed.float() - torch.tensor(0.013) * o.float()).to(dtype)
    if dtype == torch.float32 or torch.equal(host, in_fp32):  # torch's add_ rounds once here
        assert torch.equal(host, device)


def test_the_split_takes_hidden_linear_weights_and_leaves_embeddings_the_head_norms_and_biases():
    from tests.helpers import tiny_llama

    model = tiny_llama()
    hidden, other = muon.hidden_matrices(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert hidden and all(names[id(p)].endswith("_proj.weight") for p in hidden)
    projections = {n for n, _ in model.named_parameters() if n.endswith("_proj.weight")}
    assert {names[id(p)] for p in hidden} == projections  # q, k, v, o, gate, up and down: every one
    assert {names[id(p)] for p in other} >= {
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
    }
    assert len(hidden) + len(other) == len([p for p in model.parameters() if p.requires_grad])
