"""The paper's FORGE as a harness method (harness.run.methods.forge_reference), on a CPU.

Its package (fused_grad_optimizer) is not on the package index and its kernels need a GPU, so here:
a machine without it records `unavailable` points that say how to install it, never failures; with
it but without CUDA, the point says it needs CUDA; and the method drives the package's documented
API as its README does, checked against a stand-in with that API (`FakeReference`): every
nn.Linear swapped but a tied one, `pre_step` before every forward, torch's AdamW over the rest.
"""

import sys
import types

import pytest
import torch
from torch import nn

from harness.run import methods, runner
from harness.run.config import compose_config
from harness.run.methods import forge_reference

TINY = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=3", "warmup_steps=1"]


@pytest.mark.parametrize("label", ["forge_reference_bf16", "forge_reference_int8_graph"])
def test_without_the_package_a_point_is_unavailable_with_the_install_command(monkeypatch, label):
    monkeypatch.setattr(forge_reference, "installed", lambda: False)
    record = runner.run_point(compose_config([*TINY, f"method={label}"]))
    assert record["status"] == "unavailable", record
    assert "pip install git+https://github.com/dk4248/FORGE" in record["error"]
    assert "scripts/device_wheels.sh" in record["error"]  # and the offline route


def test_with_the_package_but_no_cuda_a_point_says_it_needs_cuda(monkeypatch):
    monkeypatch.setattr(forge_reference, "installed", lambda: True)
    options = {"state_mode": "int8"}
    assert "needs CUDA" in methods.unavailable_reason("forge_reference", options, "cpu")
    assert methods.unavailable_reason("forge_reference", options, "cuda") is None


def test_options_are_validated_and_modelled():
    with pytest.raises(Exception, match="state_mode='fp8' is not valid; choose one of: bf16, int8"):
        methods.make_options("forge_reference", {"state_mode": "fp8"})
    with pytest.raises(Exception, match="hopper_tma_ws changes only the paper's bf16 kernel"):
        methods.make_options("forge_reference", {"state_mode": "int8", "hopper_tma_ws": True})
    bf16 = forge_reference.ForgeReference.footprint({"state_mode": "bf16"}, 2.0)
    int8 = forge_reference.ForgeReference.footprint({"state_mode": "int8"}, 2.0)
    assert (bf16.grads, bf16.states) == (0.0, 4.0)
    assert int8.states == pytest.approx(2 * (1 + 4 / 64))  # int8 codes and an fp32 scale per 64


class FakeReference:
    """A stand-in for fused_grad_optimizer with its documented API: FusedLinear.from_linear, and a
    manager whose pre_step is recorded; the 'fused' update is plain SGD in the backward."""

    def __init__(self):
        self.pre_steps: list[dict] = []
        fake = self

        class FusedLinear(nn.Linear):
            @classmethod
            def from_linear(cls, linear, optimizer_type="adamw", state_mode=None):
                assert optimizer_type == "adamw"
                fused = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
                fused.weight = linear.weight
                fused.state_mode = state_mode
                fused._state = types.SimpleNamespace(m=torch.zeros_like(linear.weight), v=None)
                fused.weight.register_post_accumulate_grad_hook(fake.sgd)
                return fused

        class FusedOptimizerManager:
            def __init__(self, model):
                self.model = model
                self.fused = {id(m.weight) for m in model.modules() if isinstance(m, FusedLinear)}

            def get_non_fused_params(self):
                return [p for p in self.model.parameters() if id(p) not in self.fused]

            def pre_step(self, lr=None, **kwargs):
                fake.pre_steps.append(dict(lr=lr, **kwargs))

        self.module = types.ModuleType("fused_grad_optimizer")
        self.module.FusedLinear = FusedLinear
        self.module.FusedOptimizerManager = FusedOptimizerManager
        self.module.kernel = types.SimpleNamespace(_use_tma=False, _use_tma_ws=False)

    @staticmethod
    def sgd(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-1e-3)
        p.grad = None


class Tied(nn.Module):
    """Two linears and a head that shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.up, self.down = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False)
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids, labels=None):
        logits = self.head(self.down(torch.relu(self.up(self.embed(input_ids)))))
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return types.SimpleNamespace(loss=loss)


def test_the_method_drives_the_documented_api(monkeypatch):
    fake = FakeReference()
    monkeypatch.setitem(sys.modules, "fused_grad_optimizer", fake.module)
    model = Tied()
    options = methods.make_options("forge_reference", {"state_mode": "int8"})
    method = forge_reference.ForgeReference(model, 1e-3, options, "cpu")
    method.setup()
    fused = [m for m in model.modules() if isinstance(m, fake.module.FusedLinear)]
    assert {id(m) for m in fused} == {id(model.up), id(model.down)}  # the tied head is left alone
    assert type(model.head) is nn.Linear and all(m.state_mode == "int8" for m in fused)
    assert {id(p) for g in method.opt.param_groups for p in g["params"]} == {id(model.embed.weight)}
    batch = torch.randint(0, 32, (2, 6))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    method.prime(batch)
    losses = [float(method.step(batch)) for _ in range(3)]
    assert len(fake.pre_steps) == 4 and fake.pre_steps[0]["lr"] == 1e-3  # one per forward, prime's too
    assert fake.pre_steps[0]["beta1"] == 0.9 and fake.pre_steps[0]["weight_decay"] == 0.01
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters()) and losses[-1] < losses[0]
    assert method.gradient_bytes() == model.embed.weight.numel() * 4  # only the non-fused gradients
    states = list(method.optimizer_state_tensors())
    assert any(t is fused[0]._state.m for t in states) and "FusedLinear" in method.notes[0]


def test_its_hopper_path_is_the_two_switches_of_its_kernel_module(monkeypatch):
    fake = FakeReference()
    monkeypatch.setitem(sys.modules, "fused_grad_optimizer", fake.module)
    options = methods.make_options("forge_reference", {"hopper_tma_ws": True})
    method = forge_reference.ForgeReference(Tied(), 1e-3, options, "cpu")
    method.setup()
    assert fake.module.kernel._use_tma and fake.module.kernel._use_tma_ws
    assert "Hopper TMA" in method.notes[0]
