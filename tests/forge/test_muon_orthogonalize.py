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


@pytest.mark.parametrize("adjust_lr_fn", [*muon.ADJUST_LR_FNS, "constant"])
@pytest.mark.parametrize(
    "shape", [(4096, 1024), (1024, 4096), (7, 7), (8, 4, 3)], ids=["tall", "wide", "square", "3d"]
)
def test_the_learning_rate_is_adjusted_as_torch_does(shape, adjust_lr_fn):
    """Every adjustment torch names, and one it does not (the rate as given); a shape of more than
    two dimensions by its first two, as torch reads it."""
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


class _TiedHead(torch.nn.Module):
    """An embedding, a hidden linear and an output linear that shares the embedding's weight,
    the output named neither `lm_head` nor returned by a `get_output_embeddings`."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.hidden = torch.nn.Linear(6, 6)
        self.out = torch.nn.Linear(6, 10, bias=False)
        self.out.weight = self.embed.weight


class _WeightlessHead(torch.nn.Module):
    """Two linears, and an output module that has no weight (`get_output_embeddings`)."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(6, 6)
        self.out = torch.nn.Linear(6, 10, bias=False)
        self.head = torch.nn.Identity()

    def get_output_embeddings(self):
        return self.head


def test_a_linear_tied_to_an_embedding_follows_it_and_a_head_without_a_weight_takes_none():
    """The split by its definition: a weight shared with an embedding goes to the fallback with
    it, whatever holds it; an output module without a weight leaves every linear to Muon."""
    tied = _TiedHead()
    hidden, other = muon.hidden_matrices(tied)
    assert [id(p) for p in hidden] == [id(tied.hidden.weight)]
    assert {id(p) for p in other} == {id(tied.embed.weight), id(tied.hidden.bias)}
    weightless = _WeightlessHead()
    hidden, other = muon.hidden_matrices(weightless)
    assert [id(p) for p in hidden] == [id(weightless.hidden.weight), id(weightless.out.weight)]
    assert [id(p) for p in other] == [id(weightless.hidden.bias)]
