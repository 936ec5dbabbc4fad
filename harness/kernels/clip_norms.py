"""`python -m harness kernels --clip-norms`: what global-norm clipping costs FORGE, layer by layer.

With `max_grad_norm` FORGE needs the norm of each layer's dW = dy^T x without storing dW
(`forge.clip`). For every linear shape of a model and token count this times, on the same random
bf16 inputs, with `triton.testing.do_bench(..., return_mode="median")`:

  cublas_gemm_ms     torch.mm(dy.t(), x): the dW GEMM itself, the yardstick;
  gram_ms            ||dW||^2 as sum((dy dy^T) * (x x^T)): two (T, T) GEMMs and a dot;
  gram_x_cached_ms   the same when x x^T is already known (k and v after q, up after gate);
  direct_ms          the norm-only kernel (`forge.kernels.wgrad_norm`): the dW GEMM with a reducing
                     epilogue, nothing written;
  chosen             what `forge.clip.norm_method` picks for the shape (x x^T counted as not known),
                     and chosen_ms its time.
One record per (shape, T), with the environment, in a new JSONL file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.kernels import shape_records


def bench_shape(name: str, T: int, N: int, K: int) -> dict[str, Any]:
    from triton.testing import do_bench

    from forge.clip import GlobalNormClip, gram, norm_method
    from forge.functional import wgrad_norm_power_sum

    torch.manual_seed(0)
    dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    gram_x = gram(x)
    row: dict[str, Any] = dict(shape_name=name, T=T, N=N, K=K)
    row["cublas_gemm_ms"] = do_bench(lambda: torch.mm(dy.t(), x), return_mode="median")
    row["gram_ms"] = do_bench(lambda: torch.dot(gram(dy).view(-1), gram(x).view(-1)), return_mode="median")
    row["gram_x_cached_ms"] = do_bench(
        lambda: torch.dot(gram(dy).view(-1), gram_x.view(-1)), return_mode="median"
    )
    row["direct_ms"] = do_bench(lambda: wgrad_norm_power_sum(dy, x), return_mode="median")
    exact = float(torch.linalg.vector_norm(torch.mm(dy.t().float(), x.float())))
    clip = GlobalNormClip(None, 1.0, 2.0)
    for method in ("gram", "direct"):
        clip.method = method
        row[f"{method}_relative_error"] = abs(float(clip.linear_power_sum(dy, x).sqrt()) - exact) / exact
        clip.forget_input()
    row["chosen"] = norm_method(T, N, K, x_gram_known=False)
    row["chosen_ms"] = row[f"{row['chosen']}_ms"]
    return row


def run(output: Path, meta: dict[str, Any], shapes: dict[str, tuple[int, int]], tokens: list[int]) -> None:
    summary = lambda row: f"-> {row['chosen']}"  # noqa: E731
    shape_records.write(output, meta, "clip_norms", shapes, tokens, bench_shape, summary)
