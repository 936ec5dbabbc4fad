"""Distances between a FORGE run and its torch.optim reference, measured against the UPDATE.

A tolerance relative to the weight hides a wrong step: after a few steps of lr 1e-2 the weights
have moved by ~1% of their size, so `|w_forge - w_torch| <= 1e-5 |w_torch|` allows ~0.1% of the
update to be wrong, and more where a weight is large and its step small. These checks divide by
what the optimizer changed, `w_torch - w_initial`, so a rule that applies a wrong term (RAdam's
rectification replaced by 1, say) fails even when its weights stay close to the initial ones.
"""

import torch


def update_error(w_forge: torch.Tensor, w_torch: torch.Tensor, w_initial: torch.Tensor) -> float:
    """||w_forge - w_torch|| / ||w_torch - w_initial|| in fp64 (Frobenius norms).

    Norm-wise rather than element-wise: the fused kernel sums dW over the tokens in another order
    than torch's GEMM (~1e-7 relative in fp32), and a normalizing rule (Adam, RMSprop) turns an
    element whose gradient nearly cancels over the tokens into a step of any size; the norm weighs
    each element by its share of the whole update."""
    a, b, w0 = (t.detach().double() for t in (w_forge, w_torch, w_initial))
    moved = (b - w0).norm()
    return float((a - b).norm() / moved) if moved > 0 else float((a - b).norm())


def assert_close_to_update(w_forge, w_torch, w_initial, tol: float, what: str = "weight") -> None:
    err = update_error(w_forge, w_torch, w_initial)
    assert err <= tol, (
        f"{what}: FORGE is {err:.3g} of the update's size away from torch.optim (allowed {tol})"
    )
