"""What one eager step costs the host, counted: kernel launches and FORGE's Python calls.

An eager step whose GPU work is short runs at the pace of the host, and each launch and each
Python frame between autograd and a kernel is host time at every layer of every step. These tests
count, on a CPU, what one eager step of small models launches (every FORGE kernel goes through
`forge.kernels.launch.DirectLauncher`, replaced here by a counter) against what the model's
structure says it must launch:

    one fused launch per nn.Linear trained inside its backward (a ForgeLinear),
    one launch for all the vectors (norm weights, biases) of one dtype (`forge.vectors`),
    one element-wise launch per other parameter (an embedding, a tied or shared weight);

and how many of FORGE's own functions one fused layer calls in a step (its forward and backward,
the step's bookkeeping and the launch), against a fixed budget. A step that grows either fails
here before any GPU sees it.
"""

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

import forge
from forge.kernels.launch import DirectLauncher
from forge.nn import ForgeLinear
from tests.helpers import lm_batch, lm_loss, tiny_llama, tiny_qwen3

FORGE = str(Path(forge.__file__).parent)

# FORGE functions one fused layer runs in a step (`ForgeLinear.forward`, `_hooked_linear`, the GEMM
# node's post-hook `_FusedUse.__call__`, the guard's record and release, the version the forward
# records and the hook and the guard compare, the update's route (`Updates.update_linear`,
# `Launcher.fused`), its step count, coefficients and seed (`Steps.begin`, `ParamTable.state_of`),
# the kept launch (`WgradUpdate.__call__`, `_launch_plan`): 14), with the vectors' hooks and launch
# and the backward's checks spread over the layers of a two-layer Llama: 24.0.
CALLS_PER_FUSED_LAYER = 24


@pytest.fixture
def launches(monkeypatch):
    """Every FORGE kernel launch, counted by kernel name and not run."""
    counted = Counter()

    def launch(launcher, *args):
        counted[launcher.kernel.__name__] += 1

    monkeypatch.setattr(DirectLauncher, "__call__", launch)
    return counted


def _expected(model: nn.Module) -> Counter:
    """The launches one step of `model` must make, from its structure: one per fused linear, one for
    its vectors, one per other trained parameter."""
    fused = [m for m in model.modules() if isinstance(m, ForgeLinear)]
    fused_weights = {id(m.weight) for m in fused}
    others = [p for p in model.parameters() if id(p) not in fused_weights]
    vectors = [p for p in others if p.dim() == 1]
    expected = Counter(wgrad_update_kernel=len(fused), vector_update_kernel=1 if vectors else 0)
    expected["elementwise_update_kernel"] = len(others) - len(vectors)
    return +expected


def _steps(model, step, launches, n: int = 2) -> list[Counter]:
    """The launches of each of `n` steps after a first one (which plans and allocates)."""
    step()
    counts = []
    for _ in range(n):
        launches.clear()
        step()
        counts.append(Counter(launches))
    return counts


@pytest.mark.parametrize("layers", [1, 2])
def test_an_eager_llama_step_launches_what_its_structure_says(launches, layers):
    """Llama (untied lm_head): 7 fused linears a layer and the head, one launch for its 2L + 1
    RMSNorm weights, one for the embedding; the same at every step."""
    torch.manual_seed(0)
    model = tiny_llama(num_hidden_layers=layers)
    forge.attach(model, "adamw", lr=1e-3)
    batch = lm_batch()
    counts = _steps(model, lambda: lm_loss(model, batch).backward(), launches)
    expected = Counter(wgrad_update_kernel=7 * layers + 1, vector_update_kernel=1)
    expected["elementwise_update_kernel"] = 1
    assert _expected(model) == expected
    assert counts == [expected, expected]


def test_an_eager_qwen3_step_with_tied_embeddings_launches_what_its_structure_says(launches):
    """Qwen3 with lm_head tied to the embedding: 7 fused linears a layer, the shared weight
    hooked (one element-wise launch), and its 4L + 1 norm weights (q/k norms too) in one launch."""
    torch.manual_seed(0)
    model = tiny_qwen3()
    forge.attach(model, "adamw", lr=1e-3)
    batch = lm_batch()
    counts = _steps(model, lambda: lm_loss(model, batch).backward(), launches)
    expected = Counter(wgrad_update_kernel=7, vector_update_kernel=1, elementwise_update_kernel=1)
    assert _expected(model) == expected
    assert counts == [expected, expected]


class _TwoDtypes(nn.Module):
    """Two linears with biases, a LayerNorm between them, and a bf16 scale after them."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))
        self.scale = nn.Parameter(torch.ones(8, dtype=torch.bfloat16))

    def forward(self, x):
        return self.layers(x) * self.scale.float()


def test_biases_and_norms_launch_once_per_dtype(launches):
    """Biases, LayerNorm weights and a scale join one launch per kind: the five fp32 vectors one,
    the bf16 scale another."""
    torch.manual_seed(0)
    model = _TwoDtypes()
    forge.attach(model, "adamw", lr=1e-3, state_dtype="fp32")
    x = torch.randn(4, 16)
    counts = _steps(model, lambda: model(x).pow(2).mean().backward(), launches)
    assert counts == [Counter(wgrad_update_kernel=2, vector_update_kernel=2)] * 2


def test_a_fused_layer_calls_few_forge_functions_a_step(launches):
    """FORGE's own Python calls in one eager step of a two-layer Llama, per fused layer (the
    vectors' and the embedding's hooks and the backward's checks are spread over the 15 layers)."""
    torch.manual_seed(0)
    model = tiny_llama(num_hidden_layers=2)
    forge.attach(model, "adamw", lr=1e-3)
    batch = lm_batch()
    lm_loss(model, batch).backward()
    calls = Counter()

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(FORGE):
            calls[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1

    sys.setprofile(count)
    try:
        lm_loss(model, batch).backward()
    finally:
        sys.setprofile(None)
    fused = sum(isinstance(m, ForgeLinear) for m in model.modules())
    per_layer = sum(calls.values()) / fused
    assert per_layer <= CALLS_PER_FUSED_LAYER, (
        f"{per_layer:.1f} FORGE calls a fused layer (budget {CALLS_PER_FUSED_LAYER}): {calls.most_common(12)}"
    )
