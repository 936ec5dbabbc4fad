"""An architecture entry of conf/model/ as transformers sees it, and its size, without building it.

    hf_config(cfg)    the transformers config (LlamaConfig, Qwen3Config) from the entry's numbers
    n_params_of(cfg)  its parameter count, from a model built on the meta device (no memory)

Shared by the worker, which builds the model from `hf_config` (`harness.run.models`), and the
sweep's parent, which refuses a model whose weights cannot fit before any point runs
(`harness.run.hardware`) and sizes the model of a point that failed.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen3Config

from harness.run.config import ModelConfig


def hf_config(cfg: ModelConfig) -> PretrainedConfig:
    """The transformers config for an architecture entry of conf/model/."""
    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[cfg.family]
    kwargs = dict(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        use_cache=False,
    )
    if cfg.head_dim is not None:
        kwargs["head_dim"] = cfg.head_dim
    return cls(**kwargs)


def n_params(model: torch.nn.Module) -> int:
    """Parameter count, tied weights once."""
    return sum(p.numel() for p in model.parameters())


def n_params_of(cfg: ModelConfig) -> int | None:
    """The parameter count of an architecture entry without allocating it (built on the meta
    device, under a second): a point that ran out of memory still says how large its model was.
    None for a pretrained checkpoint (`path`), which would have to be read."""
    if cfg.path:
        return None
    with torch.device("meta"):
        return n_params(AutoModelForCausalLM.from_config(hf_config(cfg), dtype=torch.bfloat16))
