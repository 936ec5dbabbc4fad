"""`forge.kernels.vector_update`: many vectors' steps in one launch, each to the bit of the
element-wise kernel's step of that vector alone (the same coefficients and seed, read from its step
row), whatever its length and whichever vectors share the launch."""

import pytest
import torch

from forge.kernels import elementwise_update
from forge.kernels.vector_update import update_vectors
from forge.rules import get_rule, resolve_hparams
from forge.steps import step_row_words, step_rows
from tests.helpers import RULE_CASES

LENGTHS = (1, 7, 64, 1023, 1025, 2500)  # shorter than a block, one block, across blocks


def _state(n: int, slot, dtype: torch.dtype) -> torch.Tensor | None:
    """A slot's values as a few steps leave them: a signed moment small, a sum of squares above
    the square of any moment (a centered RMSprop's variance stays positive)."""
    if slot is None:
        return None
    values = torch.randn(n) * 0.01 if slot.signed else torch.rand(n) * 0.1 + 0.05
    return values.to(dtype)


def _vectors(dtype: torch.dtype, state_dtype: torch.dtype, slots: tuple, residual: bool):
    """(weight, gradient, states, residual) per length."""
    out = []
    for n in LENGTHS:
        states = tuple(_state(n, slot, state_dtype) for slot in slots)
        r = (torch.randn(n) * 1e-3).to(torch.bfloat16) if residual else None
        out.append((torch.randn(n).to(dtype), torch.randn(n).to(dtype), states, r))
    return out


def _copies(vectors):
    clone = lambda t: None if t is None else t.clone()  # noqa: E731
    return [(w.clone(), g.clone(), tuple(map(clone, states)), clone(r)) for w, g, states, r in vectors]


@pytest.mark.parametrize(
    "dtype, state_dtype, rounding, residual",
    [
        (torch.float32, "fp32", False, False),
        (torch.bfloat16, "bf16", True, False),  # stochastic rounding: keyed by the column in its own vector
        (torch.bfloat16, "bf16", False, True),  # compensated weights: a bf16 residual beside each
    ],
    ids=["fp32", "bf16-stochastic", "bf16-kahan"],
)
@pytest.mark.parametrize("case", ["adamw", "sgd-nesterov", "rmsprop-centered-momentum"])
def test_one_launch_steps_each_vector_as_its_own_launch(case, dtype, state_dtype, rounding, residual):
    torch.manual_seed(0)
    rule = get_rule(case.split("-")[0])
    h = resolve_hparams(rule, RULE_CASES[case])
    slots = rule.slots(h)
    signed = tuple(bool(s and s.signed) for s in slots)
    vectors = _vectors(dtype, {"fp32": torch.float32, "bf16": torch.bfloat16}[state_dtype], slots, residual)
    alone = _copies(vectors)
    steps = [2 + i % 3 for i in range(len(LENGTHS))]  # vectors at different steps, as after an added group
    coefficients = [rule.coefficients(h, step, dict(rule.host_state)) for step in steps]
    seeds = [1000 + 17 * i for i in range(len(LENGTHS))]
    options = dict(rule=rule.device_name, flags=rule.flags(h), state_dtype=state_dtype)
    options["stochastic_rounding"] = rounding
    for (w, g, states, r), c, seed in zip(alone, coefficients, seeds):
        elementwise_update(w, g, states, (None,) * 3, signed, c, seed, residual=r, **options)
    weights, grads, states, residuals = (list(column) for column in zip(*vectors))
    rows = step_rows(coefficients, seeds, step_row_words())
    update_vectors(weights, grads, states, residuals, rows, signed, **options)
    for n, (w, _, states, r), (w1, _, states1, r1) in zip(LENGTHS, vectors, alone):
        assert torch.equal(w, w1), f"weight of length {n}"
        assert all(s is None or torch.equal(s, s1) for s, s1 in zip(states, states1)), f"states of length {n}"
        assert r is None or torch.equal(r, r1), f"residual of length {n}"


def test_an_empty_list_launches_nothing():
    flags = {"momentum": False, "centered": False}
    rows = step_rows([], [], step_row_words())
    assert rows.shape == (0, step_row_words())
    update_vectors([], [], [], [], rows, (True, False, False), rule="adamw", flags=flags, state_dtype="fp32",
                   stochastic_rounding=False)  # fmt: skip
