"""The FORGE paper's own figures, in one place, so every table quotes them the same way.

Source: the paper summary in shared/seeds (Kukreja et al., 2026). The paper does not always say
which state dtype or batch a figure used; where it does not, the figure is shown beside every
matching row and the table's note says so. A key with `None` matches any value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# T1: Llama-3.1-8B on one H200 (batch 1, seq 1024 in our reproduction). The paper's fused AdamW
# keeps fp32 weight gradients (10 bytes a parameter: 74.8 GiB): our `fused_adamw_fp32grad`; the
# figure also stands beside `fused_adamw` (bf16 gradients), the baseline of every ratio.
T1 = {
    ("llama3.1-8b", 1, 1024, "fused_adamw"): "~75 GiB, 150.9 ms",
    ("llama3.1-8b", 1, 1024, "fused_adamw_fp32grad"): "~75 GiB, 150.9 ms",
    ("llama3.1-8b", 1, 1024, "forge"): "35.4 GiB, 99.1 ms",
}
T1_NOTE = (
    "Paper: Llama-3.1-8B on an H200, fused AdamW about 75 GiB and 150.9 ms, FORGE 35.4 GiB and "
    "99.1 ms (1.52x, 53% less memory); it does not name FORGE's state dtype. Its fused AdamW keeps "
    "fp32 weight gradients (10 bytes a parameter), as fused_adamw_fp32grad does; fused_adamw keeps "
    "bf16 gradients (8)."
)

# T2: the Qwen3 family on one H200.
T2 = {
    ("qwen3-14b", "fused_adamw"): "OOM",
    ("qwen3-14b", "fused_adamw_fp32grad"): "OOM",
    ("qwen3-14b", "forge"): "63.2 GiB",
}
T2_NOTE = (
    "Paper: FORGE needs 38-53% less peak memory than fused AdamW from Qwen3-0.6B to 14B; "
    "Qwen3-14B fits with FORGE at 63.2 GiB and not with fused AdamW."
)

# T3: capacity on 4 real A100-40GB (ours: one H200 capped at 40 GiB).
T3 = {
    "fused_adamw": "micro-batch 1",
    "forge": "micro-batch 4, 24.6 GiB, 2.42x",
}
T3_NOTE = (
    "Paper (4 x A100-40GB): FORGE fits micro-batch 4 at 24.6 GiB where fused AdamW fits "
    "micro-batch 1, for 2.42x throughput. Ours is one H200 capped at 40 GiB, so the comparison "
    "is per GPU."
)

# T6: tensor parallelism (the paper proves exactness under TP and SP; its capacity figure is T3's).
T6_NOTE = (
    "Paper: FORGE is exact under tensor and sequence parallelism, because each shard's weight "
    "gradient is complete on its rank at backward time; it gives no step time or memory figure for "
    "TP. Peak memory is per GPU (the larger rank's); ratios compare with fused AdamW under the same "
    "plan and GPU count."
)
T6_CAPACITY_NOTE = (
    "Paper (4 x A100-40GB): FORGE fits micro-batch 4 at 24.6 GiB where fused AdamW fits "
    "micro-batch 1, for 2.42x throughput. Ours: H200s under tensor parallelism, each capped at "
    "40 GiB; the GPU count is in its column. The paper's four-GPU layout needs the 4-GPU machine "
    "kind, which was not lent when these ran; TP=2 is what two GPUs allow."
)

T5_NOTE = (
    "Paper: FORGE composes with activation checkpointing (no figure given); the savings add up, "
    "since checkpointing removes activations and FORGE removes the gradient."
)

CONVERGENCE_NOTE = (
    "Paper: FORGE tracks fused AdamW within 0.001 nats (mean deviation) in bf16 with stochastic "
    "rounding and with int8 states; equal in fp32 up to summation order."
)


# The paper's claims, each beside our measurement (reports/tables/paper_comparison.md): its
# figures, and the targets a reproduction must meet. The paper's baseline is fused AdamW on fp32
# weight gradients (bf16 weights and states: 10 bytes a parameter); ours keeps bf16 gradients.
LLAMA_PEAK_GIB = (75.0, 35.4)  # fused AdamW (about), FORGE
LLAMA_STEP_MS = (150.9, 99.1)  # 1.52x
QWEN14B_FORGE_GIB = 63.2  # fused AdamW: OOM
QWEN_PEAK_CUT = (0.38, 0.53)  # FORGE's peak memory cut over Qwen3-0.6B to 14B
# The targets are the paper's own figures, its ratios to the two digits it quotes them with: a
# reproduction meets the paper, not a looser stand-in for it.
TARGET_PEAK_RATIO = round(LLAMA_PEAK_GIB[1] / LLAMA_PEAK_GIB[0], 2)  # 0.47: FORGE int8 / baseline peak
TARGET_STEP_RATIO = round(LLAMA_STEP_MS[1] / LLAMA_STEP_MS[0], 2)  # 0.66: graphed steps, at most
TARGET_QWEN14B_GIB = QWEN14B_FORGE_GIB  # Qwen3-14B FORGE int8 peak, at most (the baseline must be OOM)
COMPARISON_NOTE = (
    "The paper's setting: its fused AdamW keeps bf16 weights, fp32 weight gradients and bf16 states "
    "(10 bytes a parameter: Llama-3.1-8B 74.8 GiB, Qwen3-14B 137.5 GiB before activations), "
    "measured here as fused_adamw_fp32grad (the wgrad GEMM writes fp32 main_grad buffers, as "
    "Megatron does). Ours: torch's fused AdamW on bf16 gradients (8 bytes a parameter). The paper "
    "does not name FORGE's state dtype; the targets are for int8 states. Ratios are FORGE over the "
    "baseline, measured in one sweep."
)


def lookup(figures: Mapping[tuple, str], key: tuple[Any, ...]) -> str | None:
    """The paper's figure for `key`, or None where the paper gives none."""
    return figures.get(key)


# The paper's code's own table: the README of https://github.com/dk4248/FORGE (commit 7cba611,
# "Key results (Llama-3.1-8B, single H200)"): one H200, batch 1, sequence 512, bf16, the median of
# 20 steps and its spread, peak in GB as printed. Keyed by the harness method config that runs the
# same method (torch's default AdamW, torch's fused AdamW, bitsandbytes' AdamW8bit, and the paper's
# FORGE, its package fused_grad_optimizer, with bf16 and int8 states): the README's name for it,
# its peak GB, its step ms and that step's spread.
REFERENCE_README_SOURCE = (
    "https://github.com/dk4248/FORGE README (7cba611), Key results: one H200, Llama-3.1-8B, batch 1, "
    "sequence 512, bf16, median of 20 steps"
)
REFERENCE_README = {
    "torch_adamw": ("vanilla AdamW", 62.04, 167.1, 18.0),
    "fused_adamw": ("fused AdamW", 60.08, 134.3, 14.1),
    "adamw8bit_bnb": ("bitsandbytes 8-bit", 45.36, 316.3, 20.6),
    "forge_reference_bf16": ("FORGE", 48.36, 110.2, 8.7),
    "forge_reference_int8": ("FORGE (int8)", 35.32, 155.0, 4.4),
}
REFERENCE_README_POINT = ("llama3.1-8b", 1, 512)  # model, batch, sequence of that table
