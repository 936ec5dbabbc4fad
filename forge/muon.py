"""Muon's whole-matrix half: Newton-Schulz orthogonalization of one layer's momentum, and its step.

Muon (Jordan et al. 2024; `torch.optim.Muon`) updates a 2-D weight W from its momentum:

    B <- B + (1 - mu) (G - B)                     the momentum, an exponential average of G
    U <- G + mu (B - G)  (nesterov)  or  B        what is orthogonalized
    O <- NS_k(U)                                  ~ U V^T of U's SVD, by k quintic iterations
    W <- W (1 - lr wd) - lr_adj O                 lr_adj = lr sqrt(max(1, rows / cols)) by default

The first two lines are element-wise and linear in G, so FORGE runs them inside the layer's fused
dW kernel: each gradient tile folds into B in registers and U's tile goes to a bf16 scratch the
size of one weight (`forge.rules`' "muon" device half). The orthogonalization needs the whole
matrix, so it cannot finish inside a tile: it runs here, on the scratch, as soon as the layer's
kernel has reduced every token, still inside the backward. The gradient never exists in memory;
besides the weights and B, the peak holds one layer's scratch and its Newton-Schulz workspace.

The orthogonalization is `forge.newton_schulz`'s: by default (`newton_schulz="torch"`)
`orthogonalize`, `torch.optim.Muon`'s iteration op for op (bf16, the wide side transposed to rows,
the Frobenius norm clamped at eps, then k steps of `addmm`), so that FORGE's Muon with fp32 states
equals torch's to the bf16 rounding of the orthogonalized update; faster variants (symmetric
products in a Triton kernel, the Gram iteration) and Polar Express's coefficients are options.
`adjusted_lr` is torch's `adjust_lr_fn`. `apply` is the weight's update, from host scalars or,
for a step a CUDA graph replays, from device tensors.
"""

from __future__ import annotations

import math

import torch

from forge.newton_schulz import NS_COEFFICIENTS, newton_schulz, orthogonalize

__all__ = [
    "ADJUST_LR_FNS",
    "NS_COEFFICIENTS",
    "adjusted_lr",
    "apply",
    "finish",
    "hidden_matrices",
    "orthogonalize",
]

ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The learning rate Muon applies to a (rows, cols) weight, as `torch.optim.Muon` adjusts it."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


def apply(weight: torch.Tensor, update: torch.Tensor, decay, step) -> None:
    """W <- W * decay - step * O, in place, rounding as torch.optim.Muon's `mul_` then `add_` do.
    `decay` and `step` are Python floats, or 0-d fp32 tensors on W's device (a captured step reads
    them from device memory)."""
    weight.mul_(decay)
    if isinstance(step, torch.Tensor):  # w - O * step in fp32, rounded once, as add_ with alpha
        weight.addcmul_(update, step, value=-1)
    else:
        weight.add_(update, alpha=-step)


def hidden_matrices(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(the hidden 2-D weights Muon trains, every other trainable parameter), the usual recipe's
    split: Muon takes the weight of every `nn.Linear` but the output head; embeddings, the output
    head (`lm_head`, or `get_output_embeddings()` where the model has one), norms and biases go to
    the fallback rule. A weight shared by two modules (tied embeddings) follows its embedding."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    heads = {id(head.weight)} if isinstance(head, torch.nn.Module) and hasattr(head, "weight") else set()
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    hidden_ids = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.split(".")[-1] == "lm_head":
            continue
        weight = module.weight
        if weight.requires_grad and weight.dim() == 2 and id(weight) not in heads | embedded:
            hidden_ids.add(id(weight))
    hidden, other = [], []
    for p in model.parameters():  # each parameter once, in the model's order
        if p.requires_grad:
            (hidden if id(p) in hidden_ids else other).append(p)
    return hidden, other


def finish(weight: torch.Tensor, tiles: torch.Tensor, group: dict, decay, step) -> None:
    """Muon's whole-matrix half of one step: orthogonalize what the tile half wrote to `tiles` under
    `group`'s Newton-Schulz options (its `newton_schulz` variant, `forge.newton_schulz`), then update
    `weight` in place (`apply`, with `decay` and `step` as host floats or device scalars)."""
    variant = group.get("newton_schulz", "torch")  # a group loaded from before the option: torch's
    update = newton_schulz(tiles, variant, group["ns_coefficients"], group["ns_steps"], group["eps"])
    apply(weight, update, decay, step)
