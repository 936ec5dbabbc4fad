"""`import forge` is light and changes nothing; `forge.backend` decides at first use, whatever was
imported before.

Each check runs in a fresh interpreter (what a process imported first is the point), with
TRITON_INTERPRET removed from its environment unless a test sets it: forge must decide by itself.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="trains on the CPU, in Triton's interpreter")


def _python(*code: str, **env: str) -> subprocess.CompletedProcess:
    """Run the code snippets, one after the other, in a fresh interpreter."""
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(part) for part in code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# A CPU training step through both kernels: fused Linear weights, element-wise bias and LayerNorm.
_TRAIN_ONE_STEP = """
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.LayerNorm(24), torch.nn.Linear(24, 4))
    before = [p.detach().clone() for p in model.parameters()]
    forge.attach(model, "adamw", lr=1e-2)
    model(torch.randn(8, 16)).square().mean().backward()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "a parameter did not move"
"""


def test_import_forge_imports_no_triton_and_sets_nothing():
    """The kernels, Triton, torch._dynamo and torch.distributed.tensor load at first use, not at
    `import forge` (together they cost seconds), and the environment is left as it was. (The rules'
    registry, `forge.rules`, imports no Triton: `forge.RULES` is there at import.)"""
    done = _python(
        """
        import os, sys
        import forge
        heavy = ["triton", "torch._dynamo", "torch.distributed.tensor", "forge.kernels"]
        print([m for m in heavy if m in sys.modules], os.environ.get("TRITON_INTERPRET"))
        """
    )
    assert done.stdout.split() == ["[]", "None"]


@ON_CPU
def test_forge_trains_on_the_cpu_after_triton_was_imported_first():
    """Triton wraps its own library functions (tl.cdiv, tl.sum, ...) when it is first imported, as
    interpreted or compiled ones; imported first by another library (transformers does), without
    TRITON_INTERPRET, they are compiled ones, which FORGE's interpreted kernels cannot call.
    FORGE's first use must make them interpreted. The same process shows that the core install is
    enough: none of the harness's dependencies is imported."""
    _python(
        """
        import sys
        import triton  # first, with TRITON_INTERPRET unset
        import torch
        import forge
        """,
        _TRAIN_ONE_STEP,
        """
        harness_deps = ["hydra", "omegaconf", "pandas", "matplotlib", "transformers", "harness"]
        imported = [m for m in harness_deps if m in sys.modules]
        assert not imported, imported
        """,
    )


@ON_CPU
def test_a_transformers_model_trains_on_the_cpu_when_transformers_was_imported_first():
    """The usual import order of a training script: transformers (which imports Triton) before
    forge, then a tiny Llama trained through forge.attach; its loss must fall."""
    _python(
        """
        from transformers import LlamaConfig, LlamaForCausalLM  # first, with TRITON_INTERPRET unset
        import torch
        import forge

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
        model = LlamaForCausalLM(cfg)
        opt = forge.attach(model, "adamw", lr=1e-2, state_dtype="fp32")
        ids = torch.randint(0, 64, (2, 16))
        losses = []
        for _ in range(3):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            losses.append(float(loss))
        assert losses[-1] < losses[0], losses
        """,
    )


@ON_CPU
def test_an_explicit_setting_wins():
    """TRITON_INTERPRET=0 asks for compiled kernels (an offline build on a CPU machine): forge keeps
    it, and refuses CPU parameters with what to do instead of failing inside Triton."""
    _python(
        """
        import os
        import torch
        import forge
        from forge.backend import interpreting

        try:
            forge.attach(torch.nn.Linear(4, 4), "adamw")
        except RuntimeError as e:
            assert "set TRITON_INTERPRET=1" in str(e), e
        else:
            raise AssertionError("a CPU parameter was accepted with the interpreter off")
        assert not interpreting() and os.environ["TRITON_INTERPRET"] == "0"
        """,
        TRITON_INTERPRET="0",
    )
