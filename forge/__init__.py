"""FORGE: Fused On-Register Gradient Elimination.

The optimizer step of every linear layer is fused into its weight-gradient GEMM, tile by tile, so
the weight gradient lives only in fp32 registers and is never written to GPU memory:

    import forge
    opt = forge.attach(model, "adamw", lr=1e-4, weight_decay=0.01, state_dtype="bf16")
    loss = model(**batch).loss
    loss.backward()          # every parameter is updated here
    forge.detach(model)      # back to plain nn.Linear, weights kept
    forge.checkpoint.save("ckpt", model, opt, step=k); forge.checkpoint.load("ckpt", model, opt)
    loss = forge.head.linear_cross_entropy(h, model.lm_head, targets)   # no logits ever whole

Without a CUDA device the same Triton kernels run in Triton's CPU interpreter (slow; for tests).

`import forge` is light: it imports neither Triton nor the kernels, and changes nothing in the
environment. The kernels load at the first `forge.attach` (or `ForgeOptimizer`), where
`forge.backend` decides whether they run compiled or interpreted.

What a caller may choose is exported here from the one module that declares each: the rules
(`RULES`: `forge.rules`), the state dtypes and int8 group sizes (`STATE_DTYPES`, `INT8_GROUPS`,
`state_bytes`: `forge.states`), the master-weight modes (`MASTER_WEIGHTS`: `forge.weights`) and
the FP8 recipes (`FP8_RECIPES`: `forge.fp8`). Muon's orthogonalization, `newton_schulz=` in
`forge.attach(model, "muon", ...)`, is one of `forge.newton_schulz.CHOICES`, read from that
module, a public one, as are `forge.head`, `forge.fp8`, `forge.muon` and `forge.data_parallel`.
"""

from forge import checkpoint, head
from forge.attach import attach, detach
from forge.baseline import Lion, torch_optimizer
from forge.fp8 import RECIPES as FP8_RECIPES
from forge.nn import ForgeLinear
from forge.optim import ForgeOptimizer
from forge.rules import RULES
from forge.states import INT8_GROUPS, STATE_DTYPES, state_bytes
from forge.weights import MASTER_WEIGHTS

__all__ = [
    "attach",
    "detach",
    "ForgeOptimizer",
    "ForgeLinear",
    "Lion",
    "torch_optimizer",
    "RULES",
    "STATE_DTYPES",
    "INT8_GROUPS",
    "MASTER_WEIGHTS",
    "FP8_RECIPES",
    "state_bytes",
    "checkpoint",
    "head",
]
__version__ = "0.1.0"
