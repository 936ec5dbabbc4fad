"""The fp32-gradient baseline: main_grad buffers from the wgrad GEMM, and AdamW on bf16 from them.

The gradient must be the fp32 GEMM of the bf16 inputs (never a bf16 gradient upcast afterwards);
the update must be torch.optim.AdamW applied to that fp32 gradient on fp32 copies of the bf16
weight and moments, rounded to nearest bf16; and a point that runs out of memory is `oom`.
"""

import pytest
import torch
from torch import nn

from harness.run import runner
from harness.run.config import compose_config
from harness.run.main_grad import MainGradLinear, MainGrads
from harness.run.methods.base import AdamWOptions
from harness.run.methods.fp32grad import AdamWInBackwardFp32Grad, FusedAdamWFp32Grad

BF16 = torch.bfloat16
LR = 1e-2


class Tiny(nn.Module):
    """An embedding, a norm and two linear layers (17 -> 23 with a bias, 23 -> 9): odd shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 17)
        self.norm = nn.LayerNorm(17)
        self.up = nn.Linear(17, 23)
        self.down = nn.Linear(23, 9, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(self.embed(ids)))))


def _model(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny().to(BF16)


def _backward(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 11, (3, 5), generator=g)
    weights = torch.randn(3, 5, 9, generator=g).to(BF16)
    (model(ids).float() * weights.float()).sum().backward()


def test_linear_gradient_is_the_fp32_gemm_of_the_bf16_inputs():
    model = _model()
    seen = {}
    model.down.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    grads = MainGrads(model, list(model.parameters()))
    assert isinstance(model.up, MainGradLinear) and isinstance(model.down, MainGradLinear)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 11, (3, 5), generator=g)
    dy = torch.randn(3, 5, 9, generator=g).to(BF16)
    (model(ids) * dy).sum().backward()
    x2, dy2 = seen["x"].reshape(-1, 23), dy.reshape(-1, 9)
    expected = dy2.t().float() @ x2.float()  # exact bf16 products, fp32 sums
    main = grads.main_grad[model.down.weight]
    assert main.dtype == torch.float32
    torch.testing.assert_close(main, expected, rtol=1e-6, atol=1e-6)
    assert not torch.equal(main, main.to(BF16).float())  # more bits than any bf16 gradient holds
    assert all(p.grad is None for p in model.parameters())  # nothing left in .grad
    assert {id(p) for p in grads.written()} == {id(p) for p in model.parameters()}
    assert grads.gradient_bytes() == 4 * sum(p.numel() for p in model.parameters())


def test_a_second_backward_in_one_step_accumulates_and_end_step_overwrites():
    model = _model()
    grads = MainGrads(model, list(model.parameters()))
    _backward(model, 1)
    first = {p: grads.main_grad[p].clone() for p in model.parameters()}
    _backward(model, 1)
    for p in model.parameters():
        torch.testing.assert_close(grads.main_grad[p], 2 * first[p], rtol=1e-6, atol=1e-6)
    grads.end_step()
    _backward(model, 1)
    for p in model.parameters():
        torch.testing.assert_close(grads.main_grad[p], first[p], rtol=0, atol=0)


def _reference_step(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, step: int, o):
    """torch.optim.AdamW's step `step` on fp32 copies from the fp32 gradient, rounded to bf16."""
    p32 = p.detach().float().clone().requires_grad_(True)
    opt = torch.optim.AdamW([p32], lr=LR, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    opt.state[p32] = {"step": torch.tensor(float(step - 1)), "exp_avg": m.float(), "exp_avg_sq": v.float()}
    p32.grad = grad.clone()
    opt.step()
    state = opt.state[p32]
    return p32.detach().to(BF16), state["exp_avg"].to(BF16), state["exp_avg_sq"].to(BF16)


def test_update_is_torch_adamw_on_the_fp32_gradient_rounded_to_bf16():
    model = _model()
    o = AdamWOptions()
    method = FusedAdamWFp32Grad(model, LR, o, "cpu")
    method.setup()
    assert any("upcast" in note for note in method.notes)  # the CPU says which GEMM it ran
    for step in (1, 2, 3):
        _backward(model, step)
        before = {}
        for p in model.parameters():
            st = method.opt.state[p]
            assert st["step"] == step - 1  # nothing stepped inside backward
            before[p] = (p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone())
        grads = {p: method.grads.main_grad[p].clone() for p in model.parameters()}
        method.update()
        for p in model.parameters():
            ref = _reference_step(*before[p], grads[p], step, o)
            st = method.opt.state[p]
            # bit for bit: the kernel's fp32 arithmetic is torch's formula (a fused multiply-add
            # could flip a rounding at a tie; none does here)
            for actual, expected in zip((p.detach(), st["exp_avg"], st["exp_avg_sq"]), ref):
                assert actual.dtype == BF16 and torch.equal(actual, expected)


def test_in_backward_variant_steps_the_same_as_the_one_after_backward():
    after, inside = _model(), _model()
    methods = []
    for model, cls in ((after, FusedAdamWFp32Grad), (inside, AdamWInBackwardFp32Grad)):
        method = cls(model, LR, AdamWOptions(), "cpu")
        method.setup()
        methods.append(method)
    for step in (1, 2):
        for model, method in zip((after, inside), methods):
            _backward(model, step)
            method.update()
    assert methods[1].gradient_bytes() == 4 * max(p.numel() for p in inside.parameters())
    for a, b in zip(after.parameters(), inside.parameters()):
        assert torch.equal(a, b)


TINY = ["model=micro-llama", "gpu=cpu", "device=cpu", "seq_len=8", "steps=3", "warmup_steps=1"]


def test_point_records_ten_bytes_a_parameter_and_trains():
    record = runner.run_point(compose_config([*TINY, "method=fused_adamw_fp32grad", "method.lr=1e-2"]))
    assert record["status"] == "ok", record["error"]
    assert record["grads_gib"] * 2**30 == 4 * record["n_params"]
    assert record["master_weights"] == "bf16"


def test_a_point_out_of_memory_is_recorded_oom(monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 55.00 GiB (simulated)")

    monkeypatch.setattr("harness.run.main_grad.torch.zeros_like", no_memory)
    record = runner.run_point(compose_config([*TINY, "method=fused_adamw_fp32grad"]))
    assert record["status"] == "oom" and "out of memory" in record["error"]
    assert record["n_params"] > 0


@pytest.mark.parametrize("label", ["fused_adamw_fp32grad_graph"])
def test_graphed_variant_needs_cuda_on_a_cpu(label):
    record = runner.run_point(compose_config([*TINY, f"method={label}"]))
    assert record["status"] == "unavailable" and "CUDA" in record["error"]
