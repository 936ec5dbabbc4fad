"""Small builders shared by the tests: models, training loops, distances."""

import copy

import torch
from torch import nn

import forge


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp64 (Frobenius norms).

    Norm-wise rather than element-wise: normalizing rules (RMSprop, Adam) divide by the gradient's
    own magnitude, so an element whose gradient nearly cancels over the tokens amplifies the 1e-7
    summation-order difference of the GEMM; the norm measures the step as a whole.
    """
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def train_pair(model: nn.Module, rule: str, steps: int, make_batch, loss_fn, forge_kwargs=None, **hparams):
    """Train a copy of `model` with FORGE and a copy with the torch.optim reference, same batches."""
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    opt_forge = forge.attach(a, rule, **(forge_kwargs or {}), **hparams)
    opt_torch = forge.torch_optimizer(rule, b.parameters(), **hparams)
    for _ in range(steps):
        batch = make_batch()
        loss_fn(a, batch).backward()
        opt_forge.step()
        opt_torch.zero_grad()
        loss_fn(b, batch).backward()
        opt_torch.step()
    return a, b, opt_forge, opt_torch


# Small but real: GQA (4 heads, 2 kv heads), two layers, SDPA attention, random init.
_TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    attn_implementation="sdpa",
)


def tiny_llama(vocab: int = 96, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, tie_word_embeddings=tie, **_TINY)).float()


def tiny_qwen3(vocab: int = 96, tie: bool = True):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(
        Qwen3Config(vocab_size=vocab, tie_word_embeddings=tie, head_dim=16, **_TINY)
    ).float()


def lm_batch(vocab: int = 96, batch: int = 2, seq: int = 16):
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "labels": ids}


def lm_loss(model, batch):
    return model(**batch).loss
