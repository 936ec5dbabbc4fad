"""lm_head and its cross-entropy a chunk of the vocabulary at a time: the logits are never whole.

A causal LM's loss needs logits = h W^T, (T, V), and their gradient. Even computed a chunk of tokens
at a time, both are whole at the start of the backward in bf16: 4 V bytes a token, 0.49 GiB per 1,024
tokens for Llama-3.1-8B's 128,256-word vocabulary. That is what FORGE's peak holds beyond the weights,
states and checkpoints, and the memory saving over a stored gradient shrinks by it. FORGE's lm_head
cannot take its gradient a chunk of tokens at a time, since each weight row's update needs its sum
over every token; it can take it a chunk of the vocabulary (of W's rows) at a time:

    loss = linear_cross_entropy(h, model.lm_head, targets)   # summed over the targets not ignored
    install(model)     # a transformers causal LM: model(input_ids, labels=...).loss goes through it

- forward: for each chunk of W's rows, that chunk's logits h W_c^T, folded into each token's running
  log-sum-exp (fp32), and the target's logit picked where the chunk holds it. Kept for the backward:
  h, the targets and the log-sum-exp (4 bytes a token).
- backward: for each chunk again, its logits, their softmax less the one-hot target (dlogits_c, in
  h's dtype), dh += dlogits_c W_c from the chunk's rows before their update, then those rows' step:
  FORGE's fused kernel updates W_c from dlogits_c^T h in its dW GEMM, one step counted for the whole
  weight (the optimizer's `row_block_updater`: `forge.interface.RowBlockUpdater`). A head that
  FORGE does not train gets its gradient rows written instead, so every optimizer can use the same
  loss.

What it costs: the logits GEMM once more, in the backward (four lm_head GEMMs a step where a plain
head runs three), and one chunk's fp32 logits (`chunk_elements`, 64 MiB by default) at a time.
What stays: h and its fp32 gradient, (4 + 4 h) bytes a token beside h itself. Chunks hold
`chunk_elements // T` rows (a multiple of 128 where that many), so a long step walks more, smaller
chunks.

`install(model)` puts it inside a transformers causal LM (Llama, Qwen3, any `*ForCausalLM` whose
forward applies `lm_head` and then `self.loss_function`): lm_head's forward passes the hidden states
through, so the loss gets them as its "logits" (and `output.logits` holds them), and the model's
loss function applies the head with transformers' shift, ignore_index and mean.

Refused, with what to do instead: global-norm clipping (the norm needs every gradient before any
update), data parallelism (FORGE reduces each gradient whole before its update), a sharded (DTensor)
lm_head, a bias, and torch.compile's tracing of FORGE's ops.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from forge.distributed import local
from forge.interface import RowBlockUpdater
from forge.nn import autocast_input, updater_of

CHUNK_ELEMENTS = 2**24  # fp32 logits of one chunk: 64 MiB


def chunk_rows(tokens: int, vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Rows of W a chunk holds: chunk_elements // tokens, a multiple of 128 where that many
    (aligned row blocks for the kernels), at least 1, at most the vocabulary."""
    rows = max(1, chunk_elements // max(tokens, 1))
    if rows >= 128:
        rows -= rows % 128
    return min(rows, vocab)


def linear_cross_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """sum over tokens of cross_entropy(hidden @ head.weight^T, targets), a chunk of the vocabulary at
    a time (see the module). hidden: (..., K); targets: hidden's leading shape, `ignore_index` where a
    token counts for nothing. Returns a 0-dim fp32 tensor; divide it by the count of targets for the
    mean. When FORGE trains `head` (`forge.attach` made it a ForgeLinear), the backward updates its
    weight chunk by chunk; otherwise the weight gets its gradient."""
    weight = head.weight
    if getattr(head, "bias", None) is not None:
        raise ValueError(
            "forge.head.linear_cross_entropy takes a head without a bias (a causal LM's lm_head)"
        )
    optimizer = updater_of(head) if torch.is_grad_enabled() else None
    if optimizer is not None:
        if torch.compiler.is_compiling():
            raise RuntimeError(
                "forge.head.linear_cross_entropy runs eagerly: call it outside the compiled region "
                "(torch.compiler.disable) or compute the loss from the logits under torch.compile"
            )
        optimizer.check_row_blocks(weight)  # refused now, before the forward's work
    flat = autocast_input(hidden).reshape(-1, hidden.shape[-1])  # in bf16 under autocast, as a linear
    targets = targets.reshape(-1).to(flat.device)
    if targets.shape[0] != flat.shape[0]:
        raise ValueError(f"{targets.shape[0]} targets for {flat.shape[0]} tokens: give one target a token")
    rows = chunk_rows(flat.shape[0], weight.shape[0], chunk_elements)
    return _HeadCrossEntropy.apply(flat, weight, targets, ignore_index, rows, optimizer)


def causal_lm_targets(labels: torch.Tensor, shift_labels=None, ignore_index: int = -100) -> torch.Tensor:
    """Each position's target, flat, as transformers' causal-LM loss shifts them: the next token
    (positions < n predict n; the last predicts nothing), or `shift_labels` where given."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def causal_lm_mean(total: torch.Tensor, targets: torch.Tensor, num_items_in_batch, ignore_index: int = -100):
    """A summed loss over the targets counted, or over `num_items_in_batch`, as transformers divides."""
    if num_items_in_batch is None:
        return total / (targets != ignore_index).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch=None,
    ignore_index: int = -100,
    shift_labels=None,
    *,
    head: torch.nn.Module,
    chunk_elements: int = CHUNK_ELEMENTS,
    **kwargs,
) -> torch.Tensor:
    """transformers' `ForCausalLMLoss` (same arguments, same value) with `head` applied inside it:
    `logits` are the hidden states the head passed through (`install`)."""
    targets = causal_lm_targets(labels, shift_labels, ignore_index).to(logits.device)
    total = linear_cross_entropy(
        logits, head, targets, ignore_index=ignore_index, chunk_elements=chunk_elements
    )
    return causal_lm_mean(total, targets, num_items_in_batch, ignore_index)


def _passed_through(hidden: torch.Tensor) -> torch.Tensor:
    """lm_head's forward under `install`: the hidden states, for the loss to apply the head."""
    return hidden


def install(model: torch.nn.Module, chunk_elements: int = CHUNK_ELEMENTS) -> None:
    """Apply a transformers causal LM's lm_head inside its loss, a chunk of the vocabulary at a time
    (see the module); before or after `forge.attach`, whose class swap keeps this module's forward."""
    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError("forge.head.install needs a causal LM with an output embedding (lm_head)")
    head.forward = _passed_through  # this module only: its class keeps its own forward
    model.loss_function = functools.partial(causal_lm_loss, head=head, chunk_elements=chunk_elements)


def _rows(w: torch.Tensor, chunk: slice, dtype: torch.dtype) -> torch.Tensor:
    """A chunk of the weight's rows in the activations' dtype (an fp32 weight under autocast), cast
    a chunk at a time: a whole cast copy of lm_head would be as large as the logits it avoids."""
    rows = w[chunk]
    return rows if rows.dtype == dtype else rows.to(dtype)


def _target_in(safe: torch.Tensor, chunk: slice, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(whether each token's target is in `chunk`, its column there, clamped into the chunk's
    `width` where it is not)."""
    inside = (safe >= chunk.start) & (safe < chunk.stop)
    return inside, (safe - chunk.start).clamp(0, width - 1)


def _chunks(vocab: int, rows: int):
    """(index, slice) of each chunk of rows."""
    for index, start in enumerate(range(0, vocab, rows)):
        yield index, slice(start, min(start + rows, vocab))


class _HeadCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of hidden @ weight^T against targets, the vocabulary in chunks of `rows`."""

    @staticmethod
    def forward(
        ctx, hidden, weight, targets, ignore_index: int, rows: int, optimizer: RowBlockUpdater | None
    ):
        w = local(weight)
        valid = targets != ignore_index
        safe = torch.where(valid, targets, 0)
        lse = torch.full((hidden.shape[0],), float("-inf"), dtype=torch.float32, device=hidden.device)
        picked = torch.zeros_like(lse)
        for _, chunk in _chunks(w.shape[0], rows):
            logits = (hidden @ _rows(w, chunk, hidden.dtype).t()).float()
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=1))
            inside, column = _target_in(safe, chunk, logits.shape[1])
            picked += torch.where(inside, logits.gather(1, column[:, None]).squeeze(1), 0.0)
        ctx.save_for_backward(hidden, safe, valid, lse)
        ctx.weight, ctx.rows, ctx.optimizer = weight, rows, optimizer
        ctx.version = optimizer.version(weight) if optimizer is not None else None
        return ((lse - picked) * valid).sum()

    @staticmethod
    def backward(ctx, grad_sum):
        hidden, safe, valid, lse = ctx.saved_tensors
        weight, optimizer = ctx.weight, ctx.optimizer
        if optimizer is not None and optimizer.version(weight) != ctx.version:
            raise RuntimeError(
                "FORGE: lm_head was already updated since this forward pass (a second backward through "
                "the same graph would apply the step twice): one backward per forward"
            )
        w = local(weight)
        scale = valid * grad_sum.float()  # 0 for ignored tokens
        dh = (
            torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
            if ctx.needs_input_grad[0]
            else None
        )
        update = grad = None
        if optimizer is not None:
            update = optimizer.row_block_updater(weight)  # counts the step: after the version check
        elif ctx.needs_input_grad[1]:
            grad = torch.empty(w.shape, dtype=weight.dtype, device=w.device)
        for index, chunk in _chunks(w.shape[0], ctx.rows):
            w_chunk = _rows(w, chunk, hidden.dtype)
            probs = torch.exp((hidden @ w_chunk.t()).float() - lse[:, None])  # the chunk's softmax
            inside, column = _target_in(safe, chunk, probs.shape[1])
            probs.scatter_add_(1, column[:, None], -inside.float()[:, None])  # less the one-hot target
            dlogits = probs.mul_(scale[:, None]).to(hidden.dtype)
            if dh is not None:
                dh += (dlogits @ w_chunk).float()  # the rows before their update
            if update is not None:
                update(index, chunk.start, dlogits, hidden)
            elif grad is not None:
                grad[chunk] = (dlogits.t() @ hidden).to(grad.dtype)
        dx = None if dh is None else dh.to(hidden.dtype)
        return dx, grad, None, None, None, None
