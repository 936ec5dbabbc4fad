"""`python -m harness kernels --fp8`: the FP8 fused kernel against the FP8 GEMM it replaces.

For every linear shape of a model and token count this times, side by side on the same random
inputs cast to FP8 as `forge.fp8` casts them (dy e5m2, x e4m3, one scale per tensor, T-major copies),
with `triton.testing.do_bench(..., return_mode="median")`:

  fp8_gemm_ms                 torch._scaled_mm(dy8^T, x8), bf16 out (fp32 accumulation, as
                              torchao's weight-gradient GEMM): the FP8 dW GEMM alone;
  fp8_gemm_plus_fused_adamw_ms  that GEMM into .grad, then torch.optim.AdamW(fused=True) on bf16
                              weights with bf16 states: what fused AdamW over FP8 linears pays;
  forge_fp8_ms                the fused kernel on the FP8 operands (AdamW, bf16 states), as FORGE
                              launches it (on Hopper the warp-specialized kernel where the grid
                              fills the GPU, `fp8_warp_specialized`, else `fp8_config`'s);
  forge_fp8_<config>_ms       the same under other launch configs (`CANDIDATES`), for tuning;
  forge_fp8_int8_ms, forge_fp8_int8_<config>_ms  the same with int8 states (whose epilogue issues
                              about twice the instructions of bf16 states'), FORGE's choice and
                              the candidates;
  forge_fp8_sgd_ms            the fused kernel with plain SGD (W read and written, 4 bytes a
                              parameter against AdamW's 12, a few instructions an element): near
                              the MMA half alone, which tells a kernel bound by its GEMM and
                              promotion from one bound by its update;
  bf16_gemm_ms, forge_bf16_ms the bf16 GEMM and the bf16 fused kernel, for scale.
One record per (shape, T), with the environment, in a new JSONL file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from harness.kernels import shape_records

# Launch configs timed beside FORGE's choice: the Triton kernel's FP8 config (64 x 128 tiles, two
# or three programs an SM), the warp-specialized one with 16-row slices and with 64-row tiles, and
# fast accumulation.
# (128 x 128 Triton tiles, with or without a register cap, measured 1.05-2.7x the 64 x 128 ones:
# results/kernels/fp8-kernels-20261201-7e7e438.jsonl.)
CANDIDATES = {
    "triton": dict(block_n=64, block_k=128, block_t=128, group_n=8, epilogue_split=4, num_warps=8,
                   num_stages=3, maxnreg=128),
    "ws_16rows": dict(block_n=128, block_k=128, block_t=128, num_warps=4, num_stages=4, warp_specialized=True,
                      epilogue_rows=16, overlap_slices=True, fast_epilogue=True),
    # 64-row tiles: one MMA warpgroup (184 registers: its accumulator and the partial one) leaves
    # 8 epilogue warps, as the bf16 kernel has, for the update-bound T <= 2048 and int8 states
    "ws_64x128": dict(block_n=64, block_k=128, block_t=128, num_warps=8, num_stages=4, warp_specialized=True,
                      epilogue_rows=32, overlap_slices=True, fast_epilogue=True),
    # the same with the promotion overlapped: each stage's MMAs run into a partial tile while the
    # stage before's is added (200 registers: the accumulator and two partials)
    "ws_64x128_overlap": dict(block_n=64, block_k=128, block_t=128, num_warps=8, num_stages=4,
                              warp_specialized=True, epilogue_rows=32, overlap_slices=True,
                              fast_epilogue=True, overlap_promotion=True),
    # the FP8 MMA's own accumulator over all T (no second accumulator: 128 x 128 fits two programs an
    # SM without spills); what the fp32 promotion costs, not a config FORGE ships
    "128x128_fast": dict(block_n=128, block_k=128, block_t=128, group_n=8, epilogue_split=8, num_warps=8,
                         num_stages=3, maxnreg=128, fp8_fast_accum=True),
}  # fmt: skip


def _operands(T: int, N: int, K: int):
    """Fresh random bf16 dy and x, and their FP8 casts as `forge.fp8.backward` makes them: T-major
    views, the dequantization scale, and each operand's inverse scale."""
    from forge import fp8

    dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(T)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    _, dy8_t, dy_inv = fp8.cast_for_gemm(dy, fp8.GRAD_DTYPE, rows=False, transposed=True)
    _, x8_t, x_inv = fp8.cast_for_gemm(x, fp8.INPUT_DTYPE, rows=False, transposed=True)
    return dy, x, dy8_t.t(), x8_t.t(), (dy_inv * x_inv).reshape(1), dy_inv, x_inv


def _layer(N: int, K: int, rule: str, **options) -> tuple[torch.nn.Parameter, Any]:
    """A bf16 (N, K) weight drawn from N(0, 0.02^2) under FORGE (`forge.attach(..., rule, **options)`),
    and its optimizer."""
    import forge

    layer = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(layer.weight, std=0.02)
    return layer.weight, forge.attach(layer, rule, **options)


def bench_shape(name: str, T: int, N: int, K: int) -> dict[str, Any]:
    from triton.testing import do_bench

    from forge.kernels import KernelConfig

    torch.manual_seed(0)
    dy, x, dy8, x8, scale, dy_inv, x_inv = _operands(T, N, K)
    a, b = dy8.t(), x8  # (N, T) row-major and (T, K) column-major, as _scaled_mm takes them
    row: dict[str, Any] = dict(shape_name=name, T=T, N=N, K=K)

    def fp8_gemm():
        return torch._scaled_mm(a, b, scale_a=dy_inv, scale_b=x_inv, out_dtype=torch.bfloat16)

    row["fp8_gemm_ms"] = do_bench(fp8_gemm, return_mode="median")
    p = torch.nn.Parameter(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)

    def gemm_and_step():
        p.grad = fp8_gemm()
        opt.step()

    gemm_and_step()  # the states
    row["fp8_gemm_plus_fused_adamw_ms"] = do_bench(gemm_and_step, return_mode="median")
    w, fopt = _layer(N, K, "adamw", lr=1e-4, weight_decay=0.01, state_dtype="bf16")

    def fused(config=None, opt=fopt, weight=w):
        return lambda: opt.update_linear(weight, dy8, x8, grad_scale=scale, config=config)

    row["forge_fp8_ms"] = do_bench(fused(), return_mode="median")
    for label, fields in CANDIDATES.items():
        row[f"forge_fp8_{label}_ms"] = do_bench(fused(KernelConfig(**fields)), return_mode="median")
    w8, iopt = _layer(N, K, "adamw", lr=1e-4, weight_decay=0.01, state_dtype="int8")
    row["forge_fp8_int8_ms"] = do_bench(fused(opt=iopt, weight=w8), return_mode="median")
    for label, fields in CANDIDATES.items():
        if not fields.get("fp8_fast_accum"):
            timed = fused(KernelConfig(**fields), opt=iopt, weight=w8)
            row[f"forge_fp8_int8_{label}_ms"] = do_bench(timed, return_mode="median")
    w_sgd, sopt = _layer(N, K, "sgd", lr=1e-4)
    row["forge_fp8_sgd_ms"] = do_bench(fused(opt=sopt, weight=w_sgd), return_mode="median")
    row["bf16_gemm_ms"] = do_bench(lambda: torch.mm(dy.t(), x), return_mode="median")
    row["forge_bf16_ms"] = do_bench(lambda: fopt.update_linear(w, dy, x), return_mode="median")
    weights = (w, w8, w_sgd)
    assert all(torch.isfinite(t).all() for t in weights), "weights became non-finite during timing"
    row["forge_fp8_vs_fp8_gemm"] = row["forge_fp8_ms"] / row["fp8_gemm_ms"]
    row["forge_fp8_vs_fp8_gemm_plus_fused_adamw"] = row["forge_fp8_ms"] / row["fp8_gemm_plus_fused_adamw_ms"]
    return row


def run(output: Path, meta: dict[str, Any], shapes: dict[str, tuple[int, int]], tokens: list[int]) -> None:
    summary = lambda row: f"fused/gemm {row['forge_fp8_vs_fp8_gemm']:.2f}"  # noqa: E731
    shape_records.write(output, meta, "fp8_kernels", shapes, tokens, bench_shape, summary)
