"""The causal-LM cross-entropy in chunks: of tokens (the logits never whole in fp32), or of the
vocabulary with lm_head inside it (the logits never whole at all).

transformers' causal-LM loss (`ForCausalLMLoss`) upcasts the whole logits tensor to fp32, and
cross-entropy's log-softmax keeps another fp32 copy for the backward, which makes two more: for
Llama-3.1-8B at 1024 tokens each copy is 1024 x 128,256 x 4 bytes = 0.49 GiB. `causal_lm_loss`
computes the same loss (same shift, same ignore_index, same mean) chunk by chunk: the forward keeps
only each token's log-sum-exp (fp32, 4 bytes a token), and the backward recomputes each chunk's
softmax in fp32 and writes that chunk of the gradient in the logits' own dtype. Beside the logits and
their gradient (bf16, as before), one chunk's fp32 rows are alive at a time: `chunk_rows` tokens,
CHUNK_ELEMENTS (2^24, 64 MiB) elements by default, 130 tokens of Llama-3.1-8B's vocabulary.

What is not chunked: the lm_head GEMM. The logits still come from the model's own lm_head module, in
one call, so every method updates the lm_head weight its own way: FORGE fuses the update into that
module's dW GEMM, which needs the whole gradient of the logits at once, and the fp32-gradient
baseline writes its main_grad there. A fused linear cross-entropy (Liger-Kernel's
`LigerFusedLinearCrossEntropyLoss`, which runs under Triton's CPU interpreter too) computes dW inside
its own forward, from the weight it is handed: FORGE's lm_head would never be updated. The
vocabulary in chunks below is FORGE's own fused linear cross-entropy, which updates it.

    install(model)            # model.loss_function = causal_lm_loss: every forward with labels uses it

The vocabulary in chunks (`model.chunked_head`): FORGE's lm_head can take its gradient a chunk of
the vocabulary at a time, so `forge.head.install` moves lm_head into the loss: neither the logits
nor their gradient are ever whole, in any dtype, and every method gets the same loss (FORGE updates
the head chunk by chunk, the others get its gradient). `head_note` says so in a point's notes.

Under a CUDA graph: the chunks are fixed slices and nothing reads a value back to the host (the count
of tokens stays on the device), so a captured step replays it.
"""

from __future__ import annotations

import functools

import torch

from forge.head import causal_lm_mean, causal_lm_targets
from forge.head import chunk_rows as head_rows

CHUNK_ELEMENTS = 2**24  # fp32 elements of one chunk: 64 MiB


def chunk_rows(vocab_size: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per chunk: as many rows of the vocabulary as fit in `chunk_elements`."""
    return max(1, chunk_elements // vocab_size)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of logits (N, V) against targets (N,), one chunk of rows at a time."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, rows: int):
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], rows):
            lse[start : start + rows] = torch.logsumexp(logits[start : start + rows].float(), dim=-1)
        valid = targets != ignore_index
        safe = torch.where(valid, targets, 0)
        picked = logits.gather(1, safe[:, None]).squeeze(1).float()
        ctx.save_for_backward(logits, safe, valid, lse)
        ctx.rows = rows
        return ((lse - picked) * valid).sum()

    @staticmethod
    def backward(ctx, grad_sum: torch.Tensor):
        logits, safe, valid, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = valid * grad_sum  # 0 for ignored tokens
        for start in range(0, logits.shape[0], ctx.rows):
            rows = slice(start, start + ctx.rows)
            probs = torch.exp(logits[rows].float() - lse[rows, None])  # softmax, fp32
            probs.scatter_add_(1, safe[rows, None], torch.full_like(probs[:, :1], -1.0))
            grad[rows] = probs.mul_(scale[rows, None])
        return grad, None, None, None


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
    **kwargs,
) -> torch.Tensor:
    """transformers' `ForCausalLMLoss` (same arguments, same value), computed in chunks."""
    logits = logits.reshape(-1, vocab_size)
    targets = causal_lm_targets(labels, shift_labels, ignore_index).to(logits.device)
    rows = chunk_rows(vocab_size, chunk_elements)
    total = ChunkedCrossEntropy.apply(logits, targets, ignore_index, rows)
    return causal_lm_mean(total, targets, num_items_in_batch, ignore_index)


def install(model: torch.nn.Module, chunk_elements: int = CHUNK_ELEMENTS) -> None:
    """Make a transformers causal LM compute its loss with `causal_lm_loss`."""
    model.loss_function = functools.partial(causal_lm_loss, chunk_elements=chunk_elements)


def memory_note(vocab_size: int, tokens: int) -> str:
    """What a point's notes say about the chunked loss's memory."""
    rows = chunk_rows(vocab_size)
    chunk_gib = min(rows, tokens) * vocab_size * 4 / 2**30
    whole_gib = tokens * vocab_size * 4 / 2**30
    return (
        f"model.chunked_loss: cross-entropy in chunks of {rows} tokens ({chunk_gib:.3f} GiB of fp32 "
        f"logits each) instead of transformers' whole fp32 copies ({whole_gib:.3f} GiB each)"
    )


def head_note(vocab_size: int, tokens: int) -> str:
    """What a point's notes say about the loss over vocabulary chunks."""
    rows = head_rows(tokens, vocab_size)
    chunks = -(-vocab_size // rows)
    return (
        f"model.chunked_head: lm_head and the loss in {chunks} chunks of {rows} vocabulary rows "
        f"({tokens * rows * 4 / 2**30:.3f} GiB of fp32 logits each), the logits never whole "
        f"({tokens * vocab_size * 2 / 2**30:.3f} GiB each in bf16 otherwise)"
    )
