"""Distances between a FORGE run and its torch.optim reference, measured against the UPDATE.

A tolerance relative to the weight hides a wrong step: after a few steps of lr 1e-2 the weights
have moved by ~1% of their size, so `|w_forge - w_torch| <= 1e-5 |w_torch|` allows ~0.1% of the
update to be wrong, and more where a weight is large and its step small. These checks divide by
what the optimizer changed, `w_torch - w_initial`, so a rule that applies a wrong term (RAdam's
rectification replaced by 1, say) fails even when its weights stay close to the initial ones.
"""

import torch

# Tolerances on `update_error`, fp32 weights and fp32 states, set at 3-5x the worst measured on the
# tests' shapes; scaling the lr of the FORGE side by 1.0001 (1e-4 of the update) fails each of them.
# Small models (tests/forge/test_rules.py, test_optim.py): dW summed over the T tokens in another order
# than torch's GEMM (tiles of the interpreter's numpy matmul), ~sqrt(T) 2^-24 of the gradient,
# carried into the step; worst measured 2.5e-6 (a LayerNorm weight of 1 moved by 3e-2: an fp32 ulp
# of the weight is 4e-6 of its step).
FUSED_FP32 = 1e-5
# Tiny transformers (test_models.py, test_distributed.py): the same GEMM order through a decoder
# layer, and RMSNorm weights of 1 that move by only ~lr * steps = 3e-3, so one fp32 ulp of the weight
# is 2-4e-5 of that element's step; worst measured 1.25e-5 (an RMSNorm weight, with two layers), 5e-7
# with the one of `tests.helpers`.
TRANSFORMER_FP32 = 4e-5
# The element-wise kernel against its PyTorch twin on the same gradient: no GEMM, only another
# association or fma contraction of the same terms, a few ulps of weights ~1 that move by ~1e-2;
# worst measured 1e-6.
ELEMENTWISE_FP32 = 5e-6
# Where an Adam-like rule first sees a gradient within rounding of zero it steps by ~lr * sign(g)
# either way, so the two sides may differ by up to 2 lr there: that measures the data, not FORGE.
# Such elements are left out (at most 1 in 200: up to 12 of 6144 at these shapes).
NEAR_ZERO = 1e-4  # of the gradient's RMS, as in tests/forge/test_gpu_exactness.py


def near_zero(grad: torch.Tensor) -> torch.Tensor:
    """Where `grad` is within rounding of zero but not zero (an exact zero is exact on both sides)."""
    return (grad != 0) & (grad.abs() < NEAR_ZERO * grad.pow(2).mean().sqrt())


def update_error(
    w_forge: torch.Tensor, w_torch: torch.Tensor, w_initial: torch.Tensor, keep: torch.Tensor | None = None
) -> float:
    """||w_forge - w_torch|| / ||w_torch - w_initial|| in fp64 (Frobenius norms), over the elements
    `keep` marks (all by default).

    Norm-wise rather than element-wise: the fused kernel sums dW over the tokens in another order
    than torch's GEMM (~1e-7 relative in fp32), and a normalizing rule (Adam, RMSprop) turns an
    element whose gradient nearly cancels over the tokens into a step of any size; the norm weighs
    each element by its share of the whole update."""
    a, b, w0 = (t.detach().double() for t in (w_forge, w_torch, w_initial))
    if keep is not None:
        a, b, w0 = a[keep], b[keep], w0[keep]
    moved = (b - w0).norm()
    return float((a - b).norm() / moved) if moved > 0 else float((a - b).norm())


def assert_close_to_update(
    w_forge, w_torch, w_initial, tol: float, what: str = "weight", near_zero_grad=None
) -> None:
    """`update_error` <= tol, leaving out the elements `near_zero_grad` marks (see `near_zero`)."""
    keep = None
    if near_zero_grad is not None:
        left_out = int(near_zero_grad.sum())
        assert left_out <= max(1, near_zero_grad.numel() // 200), (
            f"{what}: {left_out} gradients within rounding of zero, too many to leave out"
        )
        keep = ~near_zero_grad
    err = update_error(w_forge, w_torch, w_initial, keep)
    assert err <= tol, (
        f"{what}: FORGE is {err:.3g} of the update's size away from torch.optim (allowed {tol})"
    )
