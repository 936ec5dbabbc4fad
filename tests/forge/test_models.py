"""Real architectures: tiny transformers Llama and Qwen3 (random init from a config, no downloads).

Five steps of FORGE (fp32 weights and states) against the same model trained by torch.optim: every
parameter matches, embeddings and norms included. Qwen3 ties its input and output embeddings: the
shared weight has two gradient producers, so FORGE leaves it unfused and updates it from its summed
gradient in a hook; Llama here is untied, so its lm_head is fused. Activation checkpointing
re-runs only forwards and must give the same weights as without.
"""

import copy

import pytest
import torch

import forge
from tests.forge.exactness import TRANSFORMER_FP32, assert_close_to_update
from tests.helpers import lm_batch, lm_loss, tiny_llama, tiny_qwen3, train_pair

MODELS = {"llama": tiny_llama, "qwen3-tied": tiny_qwen3}


@pytest.mark.parametrize(
    "rule, hparams",
    [("adamw", dict(lr=1e-3, weight_decay=0.1)), ("lion", dict(lr=1e-4))],
    ids=["adamw", "lion"],
)
@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_tiny_model_matches_torch_optim(build, rule, hparams):
    model = build()
    a, b, opt_f, _, near_zero_grad = train_pair(
        model, rule, 5, lm_batch, lm_loss, dict(state_dtype="fp32"), **hparams
    )
    fused = [n for n, m in a.named_modules() if type(m).__name__ == "ForgeLinear"]
    assert len(fused) == a.config.num_hidden_layers * 7 + (0 if a.config.tie_word_embeddings else 1)
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), model.parameters()):
        # A weight first seen with a gradient within rounding of zero (up to 12 of an embedding's
        # 6144 here) steps by ~lr either way: `near_zero_grad` leaves such elements out.
        assert_close_to_update(pa, pb, p0, TRANSFORMER_FP32, f"{name} after 5 steps", near_zero_grad[pb])
        assert opt_f.state[pa]["step"] == 5, f"{name} was not updated every step"


def test_activation_checkpointing_gives_the_same_weights():
    base = tiny_llama()
    batches = [lm_batch() for _ in range(3)]
    results = []
    for checkpointing in (False, True):
        model = copy.deepcopy(base)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.train()
        forge.attach(model, "adamw", lr=1e-3, state_dtype="fp32")
        for batch in batches:
            lm_loss(model, batch).backward()
        results.append(model)
    for (name, p), q in zip(results[0].named_parameters(), results[1].parameters()):
        assert torch.equal(p, q), f"{name} differs with activation checkpointing"


def test_checkpoint_recompute_stops_before_the_last_linear(monkeypatch):
    """Non-reentrant checkpointing stops recomputing once every saved tensor is back. FORGE saves a
    linear's input ahead of its GEMM under saved-tensor hooks, so the recompute of a block ending
    in a linear runs the first linear again (GELU needs its output) but not the last, as it would
    for nn.Linear; and the steps equal those without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    from forge.nn import ForgeLinearFunction

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    calls = []
    forward = ForgeLinearFunction.forward

    def counted(ctx, x, *args):
        calls.append(x.shape[-1])
        return forward(ctx, x, *args)

    monkeypatch.setattr(ForgeLinearFunction, "forward", staticmethod(counted))
    models = []
    for checkpointed in (False, True):
        model = copy.deepcopy(base)
        forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
        for _ in range(2):
            xg = x.clone().requires_grad_(True)
            y = checkpoint(model, xg, use_reentrant=False) if checkpointed else model(xg)
            y.pow(2).sum().backward()
        models.append(model)
    # without checkpointing the Function does not run (torch's GEMM node, hooked: `forge.nn`); with
    # it: forward, then a recompute that stops at the last
    assert calls == [16, 32, 16] * 2
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(p, q), f"{name} differs with activation checkpointing"


def test_bf16_model_trains():
    model = tiny_qwen3().bfloat16()
    forge.attach(model, "adamw", lr=3e-3, state_dtype="int8")
    batch = lm_batch()
    losses = []
    for _ in range(4):  # the loss falls by about 1 nat over these steps
        loss = lm_loss(model, batch)
        loss.backward()
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1, losses
