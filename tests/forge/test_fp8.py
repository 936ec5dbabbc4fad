"""FP8 linear layers (`forge.attach(..., fp8="tensorwise")`, `forge.fp8`): the fused update equals
torch.optim's step on the fp32 result of the same FP8 weight-gradient GEMM, the forward and dX equal
torchao's Float8Linear, and what stays in bf16 or is refused says why.

On the CPU the FP8 GEMMs are emulated (FP8 values upcast to fp32, exactly) and the fused kernel runs
in Triton's interpreter on the same T-major FP8 operands it reads on a GPU."""

import copy

import pytest
import torch
from torch import nn

import forge
from forge import fp8
from tests.helpers import RULE_CASES

T, N, K = 48, 64, 32
STEPS = 2


def _fp8_gradient(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dW from the FP8 casts of dy and x, as `torch._scaled_mm` gives it in fp32: the exact product
    of the FP8 values (fp64 here) times the two inverse scales, rounded once."""
    dy8, dy_inv = fp8.cast(dy, fp8.GRAD_DTYPE)
    x8, x_inv = fp8.cast(x, fp8.INPUT_DTYPE)
    return (dy8.double().t() @ x8.double() * (dy_inv.double() * x_inv.double())).float()


@pytest.mark.parametrize("rule", ["adamw", "sgd-momentum"])  # the epilogue is every rule's (test_rules.py)
def test_the_fused_fp8_update_equals_torch_optim_on_the_fp8_gemm(rule):
    """fp32 weights and states, STEPS steps: the weight after FORGE's FP8 backward equals torch.optim's
    on the gradient of the same FP8 GEMM, to fp32 rounding (the kernel sums over T in another order)."""
    name = {"sgd-momentum": "sgd"}.get(rule, rule)
    hp = dict(RULE_CASES["sgd"], momentum=0.9) if rule == "sgd-momentum" else RULE_CASES[rule]
    torch.manual_seed(0)
    layer = nn.Linear(K, N, bias=False)
    twin = copy.deepcopy(layer)
    forge.attach(layer, name, state_dtype="fp32", stochastic_rounding=False, fp8="tensorwise", **hp)
    reference = forge.torch_optimizer(name, twin.parameters(), **hp)
    assert layer._forge_fp8
    for _ in range(STEPS):
        x, dy = torch.randn(T, K), torch.randn(T, N)
        twin.weight.grad = _fp8_gradient(dy, x)  # from the weight before this step, as the backward
        layer(x.requires_grad_()).backward(dy)
        reference.step()
        assert layer.weight.grad is None
    torch.testing.assert_close(layer.weight, twin.weight, rtol=2e-6, atol=1e-7)


def test_forward_and_dx_equal_torchao_float8linear():
    """The same recipe as torchao's Float8Linear (tensorwise, e4m3 x and W, e5m2 dy): the same
    output and input gradient, on the same weights and inputs."""
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(1)
    ours = nn.Sequential(nn.Linear(K, N, bias=True), nn.Linear(N, K, bias=False))
    theirs = copy.deepcopy(ours)
    forge.attach(ours, "adamw", state_dtype="fp32", lr=0.0, fp8="tensorwise")
    float8.convert_to_float8_training(theirs, config=float8.Float8LinearConfig.from_recipe_name("tensorwise"))
    x = torch.randn(T, K)
    dy = torch.randn(T, K)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    torch.testing.assert_close(y_ours, y_theirs, rtol=1e-6, atol=1e-6)
    y_ours.backward(dy)
    y_theirs.backward(dy)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-6, atol=1e-6)


def test_the_backward_reads_the_forwards_fp8_copy_of_the_input():
    """The layer keeps its input's T-major FP8 cast from the forward (1 byte an element, half of a
    bf16 x), the bits a fresh cast gives. Under activation checkpointing it keeps x and casts it
    again in the backward: both train to the same weights."""
    torch.manual_seed(3)
    layer = nn.Linear(K, N, bias=False)
    twin = copy.deepcopy(layer)
    for module in (layer, twin):
        forge.attach(module, "adamw", state_dtype="fp32", stochastic_rounding=False, fp8="tensorwise")
    x, dy = torch.randn(T, K).bfloat16(), torch.randn(T, N).bfloat16()
    y = layer(x.requires_grad_())
    x8_t, x_inv = y.grad_fn.saved_tensors
    expected, expected_inv = fp8.cast(x.detach(), fp8.INPUT_DTYPE)
    assert x8_t.dtype == fp8.INPUT_DTYPE and x8_t.shape == (K, T)
    assert torch.equal(x8_t.view(torch.uint8), expected.t().contiguous().view(torch.uint8))
    assert torch.equal(x_inv, expected_inv)
    y.backward(dy)
    torch.utils.checkpoint.checkpoint(twin, x.detach().requires_grad_(), use_reentrant=False).backward(dy)
    assert torch.equal(layer.weight, twin.weight)


def test_layers_that_read_one_input_share_its_cast():
    """Three layers on one x (as q, k and v are) keep one FP8 copy of it between them, and train to
    the same weights as three layers on three copies of x, each cast on its own. An in-place change
    of x makes a new cast; the cache lets go of x's cast when x goes."""
    torch.manual_seed(4)
    shared = nn.ModuleList(nn.Linear(K, N, bias=False) for _ in range(3))
    apart = copy.deepcopy(shared)
    for module in (shared, apart):
        forge.attach(module, "adamw", state_dtype="fp32", stochastic_rounding=False, fp8="tensorwise")
    before = len(fp8.INPUT_CASTS)
    x, dy = torch.randn(T, K).requires_grad_(), torch.randn(T, N)
    outs = [layer(x) for layer in shared]
    copies = {out.grad_fn.saved_tensors[0].data_ptr() for out in outs}
    assert len(copies) == 1 and len(fp8.INPUT_CASTS) == before + 1
    inverse = outs[0].grad_fn.saved_tensors[1].clone()
    sum((out * dy).sum() for out in outs).backward()
    x_apart = [x.detach().clone().requires_grad_() for _ in apart]
    sum((layer(xi) * dy).sum() for layer, xi in zip(apart, x_apart)).backward()
    for a, b in zip(shared, apart):
        assert torch.equal(a.weight, b.weight)
    with torch.no_grad():
        x.mul_(2.0)
    again = shared[0](x)
    assert torch.equal(again.grad_fn.saved_tensors[1], 2 * inverse)  # a new cast: twice the maximum
    del x, x_apart, outs, again
    assert len(fp8.INPUT_CASTS) == before


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_bf16_weights_train_with_fp8_gemms(state_dtype):
    """A bf16 MLP with FP8 GEMMs and bf16 or int8 states fits a fixed batch: the loss falls."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).to(torch.bfloat16)
    forge.attach(model, "adamw", state_dtype=state_dtype, lr=3e-3, fp8="tensorwise")
    x, target = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    losses = []
    for _ in range(5):
        loss = (model(x) - target).float().pow(2).mean()
        loss.backward()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_lm_head_and_odd_shapes_keep_bf16_gemms():
    """FP8 GEMMs need dimensions that are multiples of 16; the output projection (`fp8_skip`) stays
    in bf16 as FP8 recipes keep it. Both are still fused."""

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(32, 64)
            self.odd = nn.Linear(64, 24)
            self.lm_head = nn.Linear(24, 48)

    model = Tiny()
    forge.attach(model, "adamw", fp8="tensorwise")
    assert model.proj._forge_fp8 and not model.odd._forge_fp8 and not model.lm_head._forge_fp8
    assert all(type(m).__name__ == "ForgeLinear" for m in (model.proj, model.odd, model.lm_head))
    forge.detach(model)
    assert type(model.proj) is nn.Linear and "_forge_fp8" not in model.proj.__dict__


def test_unknown_recipes_and_fp8_with_clipping_are_refused_before_anything_changes():
    model = nn.Sequential(nn.Linear(32, 32))
    with pytest.raises(ValueError, match="choose one of \\['tensorwise'\\]"):
        forge.attach(model, "adamw", fp8="rowwise")
    with pytest.raises(ValueError, match="fp8 with max_grad_norm is not supported"):
        forge.attach(model, "adamw", fp8="tensorwise", max_grad_norm=1.0)
    assert type(model[0]) is nn.Linear


def test_fp8_operands_come_t_major_in_pairs():
    """The kernel reads FP8 dy and x contiguous along T (what `forge.fp8.backward` makes): a row-major
    FP8 pair, or FP8 with bf16, is refused with what to do."""
    layer = nn.Linear(K, N, bias=False)
    opt = forge.attach(layer, "adamw", state_dtype="fp32")
    dy8, x8 = torch.randn(T, N).to(fp8.GRAD_DTYPE), torch.randn(T, K).to(fp8.INPUT_DTYPE)
    scale = torch.ones(1)
    with pytest.raises(ValueError, match="contiguous along T"):
        opt.update_linear(layer.weight, dy8, x8, grad_scale=scale)
    with pytest.raises(ValueError, match="come in pairs"):
        opt.update_linear(layer.weight, dy8.t().contiguous().t(), torch.randn(T, K), grad_scale=scale)


def test_overlapped_promotion_is_refused_outside_the_warp_specialized_fp8_kernel():
    """`KernelConfig.overlap_promotion` belongs to the warp-specialized kernel's FP8 main loop: asked
    of the Triton kernel, it says so before the weight changes."""
    from forge.kernels import KernelConfig

    layer = nn.Linear(K, N, bias=False)
    opt = forge.attach(layer, "adamw", state_dtype="fp32")
    before = layer.weight.detach().clone()
    config = KernelConfig(block_n=64, block_k=64, block_t=32, overlap_promotion=True)
    dy8 = torch.randn(N, T).to(fp8.GRAD_DTYPE).t()
    x8 = torch.randn(K, T).to(fp8.INPUT_DTYPE).t()
    with pytest.raises(ValueError, match="overlap_promotion is an option of the warp-specialized kernel"):
        opt.update_linear(layer.weight, dy8, x8, grad_scale=torch.ones(1), config=config)
    assert torch.equal(layer.weight, before)


def test_fp8_layers_compile_and_train_as_eager():
    """Under torch.compile an FP8 layer runs its eager Function between compiled regions (a graph
    break per layer): the same weights as eager, to the bit, under aot_eager."""
    torch.manual_seed(3)
    eager = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    compiled = copy.deepcopy(eager)
    for model in (eager, compiled):
        forge.attach(model, "adamw", state_dtype="fp32", lr=1e-2, fp8="tensorwise")
    run = torch.compile(compiled, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(16, 32)
        eager(x).pow(2).mean().backward()
        run(x).pow(2).mean().backward()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        assert torch.equal(a, b)
