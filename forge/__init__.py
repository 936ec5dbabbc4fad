"""FORGE: Fused On-Register Gradient Elimination.

The optimizer step of every linear layer is fused into its weight-gradient GEMM, tile by tile, so
the weight gradient lives only in fp32 registers and is never written to GPU memory:

    import forge
    opt = forge.attach(model, "adamw", lr=1e-4, weight_decay=0.01, state_dtype="bf16")
    loss = model(**batch).loss
    loss.backward()          # every parameter is updated here
    forge.detach(model)      # back to plain nn.Linear, weights kept

Without a CUDA device the same Triton kernels run in Triton's CPU interpreter (slow; for tests).
"""

import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    # Must happen before any @triton.jit function is created, i.e. before the kernels are imported.
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from forge.attach import attach, detach  # noqa: E402
from forge.baseline import Lion, torch_optimizer  # noqa: E402
from forge.nn import ForgeLinear  # noqa: E402
from forge.optim import ForgeOptimizer  # noqa: E402
from forge.rules import RULES  # noqa: E402

__all__ = ["attach", "detach", "ForgeOptimizer", "ForgeLinear", "Lion", "torch_optimizer", "RULES"]
__version__ = "0.1.0"
