"""`forge.head.linear_cross_entropy`: lm_head and its loss a chunk of the vocabulary at a time.

Checked in Triton's interpreter at small shapes, with a vocabulary that does not divide into its
chunks: the loss and both gradients equal cross-entropy of the whole logits (fp64 reference); FORGE
updating the head chunk by chunk equals FORGE updating it whole, one step counted; each chunk's
stochastic-rounding seed differs; and what it refuses, before anything is changed.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import forge
from forge.head import chunk_rows, linear_cross_entropy
from forge.steps import for_row_block
from tests.helpers import relative_error

T, K, V = 12, 16, 37  # tokens, hidden, vocabulary
CHUNK = T * 8  # 8 rows a chunk: 5 chunks, the last of 5 rows


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, V, (T,), generator=g)
    targets[::5] = -100  # ignored tokens
    return torch.randn(T, K, generator=g), targets


class _Model(nn.Module):
    """A body and a head without bias: the shape of a causal LM's last layers."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(K, K, bias=False)
        self.head = nn.Linear(K, V, bias=False)

    def loss(self, x: torch.Tensor, targets: torch.Tensor, chunked: bool) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        if chunked:
            return linear_cross_entropy(h, self.head, targets, chunk_elements=CHUNK)
        return F.cross_entropy(self.head(h).float(), targets, ignore_index=-100, reduction="sum")


def test_chunks_hold_a_multiple_of_128_rows_where_that_many():
    assert chunk_rows(T, V, CHUNK) == 8
    assert chunk_rows(1024, 128256) == 16384 and chunk_rows(16384, 128256) == 1024
    assert chunk_rows(3000, 128256) == 5504  # 5592 rounded down to a multiple of 128
    assert chunk_rows(10, 50, 10**6) == 50  # never more than the vocabulary


def test_the_loss_and_its_gradients_equal_cross_entropy_of_the_whole_logits():
    torch.manual_seed(0)
    head = nn.Linear(K, V, bias=False)
    x, targets = _batch(1)
    h = x.clone().requires_grad_()
    loss = linear_cross_entropy(h, head, targets, chunk_elements=CHUNK)
    loss.backward()
    h64, w64 = x.double().requires_grad_(), head.weight.detach().double().requires_grad_()
    ref = F.cross_entropy(h64 @ w64.t(), targets, ignore_index=-100, reduction="sum")
    ref.backward()
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert relative_error(h.grad, h64.grad) < 1e-6
    assert relative_error(head.weight.grad, w64.grad) < 1e-6


def test_an_fp32_head_under_bf16_activations_is_cast_a_chunk_at_a_time():
    """Autocast's mixed precision: bf16 hidden states, an fp32 weight; the GEMMs run in bf16 and the
    weight's gradient comes back in fp32, as autocast's own linear gives them."""
    torch.manual_seed(5)
    head = nn.Linear(K, V, bias=False)
    x, targets = _batch(6)
    h = x.to(torch.bfloat16).requires_grad_()
    linear_cross_entropy(h, head, targets, chunk_elements=CHUNK).backward()
    h64, w64 = h.detach().double().requires_grad_(), head.weight.detach().bfloat16().double().requires_grad_()
    F.cross_entropy(h64 @ w64.t(), targets, ignore_index=-100, reduction="sum").backward()
    assert h.grad.dtype == torch.bfloat16 and head.weight.grad.dtype == torch.float32
    assert relative_error(h.grad, h64.grad) < 2e-2  # bf16 logits, bf16 gradients
    assert relative_error(head.weight.grad, w64.grad) < 2e-2
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 hidden states are cast as a linear casts them
        loss = linear_cross_entropy(x.clone().requires_grad_(), head, targets, chunk_elements=CHUNK)
    assert loss.item() == pytest.approx(
        float(F.cross_entropy(h64 @ w64.t(), targets, reduction="sum")), rel=1e-2
    )


def test_leading_dimensions_are_tokens():
    head = nn.Linear(K, V, bias=False)
    x, targets = _batch(2)
    flat = linear_cross_entropy(x, head, targets, chunk_elements=CHUNK)
    batched = linear_cross_entropy(x.view(3, 4, K), head, targets.view(3, 4), chunk_elements=CHUNK)
    assert torch.equal(flat, batched)


@pytest.mark.parametrize("rule", ["adamw", "lion"])
def test_forge_updates_the_head_chunk_by_chunk_as_it_updates_it_whole(rule):
    """fp32 weights and states: the same steps to the summation order of the GEMMs, the head's
    gradient never stored, one step counted a backward."""
    torch.manual_seed(3)
    whole = _Model()
    chunked = copy.deepcopy(whole)
    options = dict(lr=1e-2, weight_decay=0.1, state_dtype="fp32")
    opt_whole = forge.attach(whole, rule, **options)
    opt_chunked = forge.attach(chunked, rule, **options)
    for step in range(3):
        x, targets = _batch(10 + step)
        whole.loss(x, targets, chunked=False).backward()
        chunked.loss(x, targets, chunked=True).backward()
    for (name, a), b in zip(chunked.named_parameters(), whole.parameters()):
        assert relative_error(a, b) < 1e-5, name
    assert chunked.head.weight.grad is None
    assert opt_chunked.state[chunked.head.weight]["step"] == opt_whole.state[whole.head.weight]["step"] == 3


def test_bf16_weights_round_each_chunk_with_its_own_bits():
    """Each chunk is its own launch, whose random bits are keyed by the row within it: chunks after
    the first mix their index into the seed, alike on the host and in a captured step row."""
    from forge.rules import NUM_COEFFICIENTS

    assert for_row_block(12345, None, 0) == (12345, None)
    seeds = {for_row_block(12345, None, block)[0] for block in range(64)}
    assert len(seeds) == 64 and all(0 <= s < 2**31 for s in seeds)
    row = torch.zeros(16, dtype=torch.int32)
    row[NUM_COEFFICIENTS] = 12345
    for block in (1, 2, 7):
        seed, mixed = for_row_block(12345, row, block)
        assert int(mixed[NUM_COEFFICIENTS]) == seed and int(row[NUM_COEFFICIENTS]) == 12345
        assert torch.equal(mixed[:NUM_COEFFICIENTS], row[:NUM_COEFFICIENTS])

    torch.manual_seed(4)
    model = _Model().to(torch.bfloat16)
    opt = forge.attach(model, "adamw", lr=1e-3, state_dtype="bf16", stochastic_rounding=True)
    x, targets = _batch(20)
    before = model.head.weight.detach().clone()
    model.loss(x.to(torch.bfloat16), targets, chunked=True).backward()
    assert opt.state[model.head.weight]["step"] == 1
    assert not torch.equal(model.head.weight, before) and torch.isfinite(model.head.weight.float()).all()


def test_what_it_refuses_says_what_to_do_and_changes_nothing():
    x, targets = _batch(30)
    clipped = _Model()
    forge.attach(clipped, "adamw", lr=1e-2, max_grad_norm=1.0)
    before = [p.detach().clone() for p in clipped.parameters()]
    with pytest.raises(ValueError, match="max_grad_norm"):
        clipped.loss(x, targets, chunked=True)
    assert all(torch.equal(p, q) for p, q in zip(clipped.parameters(), before))

    with pytest.raises(ValueError, match="without a bias"):
        linear_cross_entropy(x, nn.Linear(K, V), targets)
    with pytest.raises(ValueError, match="one target a token"):
        linear_cross_entropy(x, nn.Linear(K, V, bias=False), targets[:-1])

    model = _Model()
    forge.attach(model, "adamw", lr=1e-2)
    loss = model.loss(x, targets, chunked=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already updated"):
        loss.backward()
