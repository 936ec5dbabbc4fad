"""How much of the fused kernel's update traffic is hidden behind its GEMM: time against bytes.

The fused kernel's epilogue reads and writes W and the optimizer states once per element: 4 bytes
an element for plain SGD on bf16 weights, 8 with one bf16 state (SGD momentum, Lion), 12 for AdamW
with bf16 states, 12 for SGD momentum with an fp32 state, 20 for AdamW with fp32 states. Same main
loop (the dW GEMM), different epilogue bytes: fitting time = a + b * bytes per element over those
rules, per shape and T, splits the kernel into what the bytes cost (b, as an effective bandwidth
elements / b) and what they do not (a, compared with cuBLAS's GEMM alone). If a is near cuBLAS's
time and elements / b near the copy rate, the update runs after the GEMM, not under it: no
overlap; a perfectly hidden update would show b = 0 until the bytes outlast the GEMM.

    python scripts/probe_epilogue_bytes.py            # on a GPU; JSONL and the fits to $OUT or results/out

Fresh random operands for every point (dy scaled by 1/sqrt(T)); medians of triton's do_bench.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (label, rule, options, state dtype, bytes read + written per weight element, bf16 weights)
VARIANTS = [
    ("sgd", "sgd", dict(lr=1e-3), "bf16", 4),
    ("sgd_momentum_bf16", "sgd", dict(lr=1e-3, momentum=0.9), "bf16", 8),
    ("lion_bf16", "lion", dict(lr=1e-5), "bf16", 8),
    ("adamw_bf16", "adamw", dict(lr=1e-4, weight_decay=0.01), "bf16", 12),
    ("sgd_momentum_fp32", "sgd", dict(lr=1e-3, momentum=0.9), "fp32", 12),
    ("adamw_fp32", "adamw", dict(lr=1e-4, weight_decay=0.01), "fp32", 20),
]
SHAPES = {"gate": (14336, 4096), "q": (4096, 4096), "down": (4096, 14336)}  # Llama-3.1-8B (N, K)
TOKENS = (1024, 2048, 8192)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def time_update(dy: torch.Tensor, x: torch.Tensor, rule: str, options: dict, state_dtype: str) -> float:
    """Median ms of one fused dW + update launch on a fresh bf16 layer of dy's and x's widths."""
    from triton.testing import do_bench

    import forge

    layer = torch.nn.Linear(x.shape[1], dy.shape[1], bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(layer.weight, std=0.02)
    opt = forge.attach(layer, rule, state_dtype=state_dtype, **options)
    ms = do_bench(lambda: opt.update_linear(layer.weight, dy, x), return_mode="median")
    assert torch.isfinite(layer.weight).all(), f"{rule}: weights became non-finite"
    return ms


def main() -> int:
    if not torch.cuda.is_available():
        print("probe_epilogue_bytes times GPU kernels: run it on a CUDA GPU")
        return 2
    from triton.testing import do_bench

    from harness import env

    out_dir = Path(os.environ.get("OUT", "results/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"epilogue_bytes-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    meta = dict(env=env.collect(env.git_info()), gpu_name=torch.cuda.get_device_name())
    meta["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    torch.manual_seed(0)
    for (name, (N, K)), T in itertools.product(SHAPES.items(), TOKENS):
        dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(T)
        x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        gemm = do_bench(lambda: torch.mm(dy.t(), x), return_mode="median")  # noqa: B023 (timed here)
        times = {}
        for label, rule, options, state_dtype, _ in VARIANTS:
            times[label] = time_update(dy, x, rule, options, state_dtype)
            gc.collect()  # the layer and its optimizer reference each other: free their states now
            torch.cuda.empty_cache()
        xs = [float(v[4]) for v in VARIANTS]
        ys = [times[v[0]] for v in VARIANTS]
        intercept, slope = fit(xs, ys)
        record = dict(
            meta,
            shape_name=name,
            T=T,
            N=N,
            K=K,
            cublas_gemm_ms=gemm,
            times_ms=times,
            bytes_per_element={v[0]: v[4] for v in VARIANTS},
            intercept_ms=intercept,
            slope_ms_per_byte=slope,
            exposed_bandwidth_tbps=N * K / (slope * 1e-3) / 1e12 if slope > 0 else None,
        )
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        cells = " ".join(f"{k}={v:.4f}" for k, v in times.items())
        bw = record["exposed_bandwidth_tbps"]
        exposed = f"bytes exposed at {bw:.2f} TB/s" if bw else "bytes hidden (slope <= 0)"
        print(
            f"{name:5s} T={T:5d} cublas={gemm:.4f} {cells} | intercept {intercept:.4f} ms "
            f"({intercept / gemm:.2f}x cublas), {exposed}",
            flush=True,
        )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
