"""Models: transformers decoders built from their real architecture numbers, random init.

`conf/model/*.yaml` holds each architecture's numbers (Llama-3.1-8B, Qwen3 0.6B to 14B, and tiny
variants for CPU tests); `build` makes the transformers config from them (`harness.run.architecture`,
which the sweep's parent shares to size a model before any runs) and instantiates the
model directly on the target device in the target dtype, so an 8B model never passes through
host memory and nothing is downloaded. A `path` loads real weights from a local checkpoint
instead. Attention is SDPA, with no mask: the harness's batches are whole sequences (no padding,
nothing packed), for which SDPA's own causal flag runs flash attention on grouped-query heads
(`whole_sequence_sdpa_mask`). Activation checkpointing uses transformers' non-reentrant checkpoint
around each decoder layer. `chunked_loss: true` swaps transformers' loss for the chunked one of
`harness.run.chunked_loss`; `chunked_head: true` moves lm_head into a loss over vocabulary chunks.

Batches are random token ids, the same batch every step: a benchmark measures speed and memory,
and a fixed batch makes "the loss fell" a reliable check that the method trained at all.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM

from forge import head as forge_head
from harness.run import chunked_loss, record
from harness.run.architecture import hf_config, n_params
from harness.run.config import ModelConfig

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


ATTENTION_MASK = record.ATTENTION_MASK  # what records say of the mask this module gives SDPA


def whole_sequence_sdpa_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' SDPA mask, but None (SDPA's `is_causal`) for a batch of whole sequences: no
    padding mask, one full causal block, no offset, no sliding window.

    An eager forward of transformers returns None there too, but only once it has read the
    position ids on the device and found no packed sequences (`masking_utils.
    find_packed_sequence_indices`). Under a CUDA-graph capture or torch.compile it cannot read
    them, so it builds the (batch, 1, T, T) mask and SDPA runs its masked kernel on key and value
    heads repeated for each query head (measured on Llama-3.1-8B at 4,096 tokens: 2.0 GiB more at
    a captured step's peak, and 4-5% of an 8,192-token step, docs/how-forge-works.md). The harness
    passes no position ids and no mask, so its batches are whole sequences in every mode."""
    from transformers.masking_utils import sdpa_mask

    offsets = (kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0))  # a tensor (static cache): not 0
    whole_sequences = (
        kwargs.get("attention_mask") is None
        and kwargs.get("local_size") is None
        and kwargs.get("q_length") == kwargs.get("kv_length")
        and all(type(offset) is int and offset == 0 for offset in offsets)
    )
    return None if whole_sequences else sdpa_mask(**kwargs)


def keep_causal_masks_implicit() -> None:
    """Register `whole_sequence_sdpa_mask` as transformers' SDPA mask (for this process)."""
    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register("sdpa", whole_sequence_sdpa_mask)


def build(
    cfg: ModelConfig,
    dtype: str,
    device: str,
    activation_checkpointing: bool = False,
    seed: int = 0,
    tensor_parallel: bool = True,
) -> torch.nn.Module:
    """Instantiate the model on `device` in `dtype`, in training mode. Under torchrun it is sharded
    with the TP plan unless `tensor_parallel` is False (a data-parallel point: the method's wrapper
    shares it out, `harness.run.data_parallel`)."""
    torch.manual_seed(seed)
    keep_causal_masks_implicit()
    torch_dtype = TORCH_DTYPES[dtype]
    if cfg.path:
        # No device_map: that needs accelerate. Load on the host, then move.
        model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=torch_dtype, attn_implementation="sdpa")
        model = model.to(device)
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                hf_config(cfg), dtype=torch_dtype, attn_implementation="sdpa"
            )
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    if cfg.chunked_loss:
        chunked_loss.install(model)
    if cfg.chunked_head:
        forge_head.install(model)
    model.config.use_cache = False
    if tensor_parallel:
        _shard_if_distributed(model, device)
    return model.train()


def _shard_if_distributed(model: torch.nn.Module, device: str) -> None:
    """Under torchrun (gpus > 1), shard the whole model just built with the TP plan of
    `harness.run.tensor_parallel` and free the unsharded copies before anything is measured."""
    from harness.run import tensor_parallel

    mesh = tensor_parallel.current_mesh()
    if mesh is None:
        return
    tensor_parallel.parallelize(model, mesh)
    if device == "cuda":
        torch.cuda.empty_cache()


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant checkpoint around every decoder layer. transformers renamed the call (5.2x:
    activation_checkpointing_enable; gradient_checkpointing_enable before): use what is there."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def flops_per_token(model: torch.nn.Module, cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 per parameter that does a matmul (not the input embedding's
    lookup, unless tied to the lm_head) plus attention's 12*L*H*S (PaLM's appendix B;
    recomputation under activation checkpointing is not counted)."""
    embedding = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    output = model.get_output_embeddings()
    if output is not None and output.weight is model.get_input_embeddings().weight:
        embedding = 0  # tied: the parameter is counted once and does the lm_head's matmul
    attention = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * _head_dim(cfg) * seq_len
    return 6 * (n_params(model) - embedding) + attention


def _head_dim(cfg: ModelConfig) -> int:
    return cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads


def random_batch(vocab_size: int, batch_size: int, seq_len: int, device: str, seed: int = 0) -> torch.Tensor:
    """Token ids [batch_size, seq_len], reproducible from the seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(device)
