"""Kernel benchmark: the fused FORGE kernel against what a plain backward and optimizer pay.

    python -m harness kernels                       # every shape and T, records to results/kernels/
    python -m harness kernels --quick               # a few points, to try a change
    python -m harness kernels --tune                # time candidate launch configs (offline tuning)
    python -m harness kernels --regress --output F  # the regression check's kernel suite (regress_suite)

For each linear shape of Llama-3.1-8B and Qwen3-14B (q, k, v, o, gate, up, down, lm_head) and each
token count T, side by side in one process on one GPU, timed with
`triton.testing.do_bench(..., return_mode="median")` on fresh random inputs (never zeros):

  (a) cublas_gemm            torch.mm(dy.t(), x), bf16 out: the weight-gradient GEMM alone;
  (b) gemm_plus_fused_adamw  (a) into .grad, then torch.optim.AdamW(fused=True) on bf16 weights
                             with bf16 states: what the baseline really pays;
      gemm_plus_fused_adamw_graph
                             (b) captured in a CUDA graph (capturable=True) and replayed: its GPU
                             work alone, without the host's launches, which on small layers can
                             move (b) by 2x from one run to the next; a stricter baseline than (b),
                             as FORGE stays eager;
  (c) forge                  the fused kernel, per rule (`layers.TIMED_RULES`: adamw, lion,
                             sgd-momentum) and state dtype.

The floor of a point is max(FLOPs / measured bf16 matmul rate, minimum bytes / measured copy
bandwidth), both ceilings measured at the start of the same run. The minimum bytes of the fused
kernel: dy and x read once, W read and written once, each state read and written once (int8: codes
plus one bf16 scale per 64). Each record carries the run's metadata (`harness.run.env`).

Timing re-runs the in-place kernel on scratch tensors: states drift over the repetitions but stay
finite (the rules are bounded), which is fine for a timing and never done on a model's weights.

`--tune` times the candidate launch configs of `harness.kernels.build.candidate_groups` instead,
through `ForgeOptimizer.update_linear(..., config=...)`, one record per (point, config);
`python -m harness.kernels.tuning FILE` reads the winners out of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import math
import time
from pathlib import Path

import torch

import forge
from harness import results, sources
from harness.kernels import regress_suite
from harness.kernels.layers import (
    MODELS,
    baseline_weight,
    capture_graphed_baseline,
    forge_layer,
    linear_shapes,
    state_count,
    timed_rules,
)
from harness.run import env

TOKENS = (1024, 2048, 4096, 8192, 16384)


def measure_ceilings() -> dict[str, float]:
    """bf16 matmul TFLOP/s (8192^3, random data) and device copy bandwidth in TB/s (bytes read + written)."""
    from triton.testing import do_bench

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: torch.mm(a, b), return_mode="median")
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return {"matmul_tflops": 2 * 8192**3 / ms / 1e9, "copy_tbps": 2 * src.numel() * 2 / copy_ms / 1e9}


def update_bytes(N: int, K: int, rule: str, state_dtype: str) -> float:
    """What an update of a bf16 (N, K) weight moves at the least: W and each state read and written once."""
    return N * K * (2 * 2 + 2 * state_count(rule) * forge.state_bytes(state_dtype))


def forge_min_bytes(T: int, N: int, K: int, rule: str, state_dtype: str) -> float:
    """The fused kernel's least traffic: dy and x read once, and the update's bytes."""
    return 2 * T * (N + K) + update_bytes(N, K, rule, state_dtype)


def roofline_ms(gemm_ms: float, N: int, K: int, rule: str, state_dtype: str, copy_tbps: float) -> float:
    """A fused kernel that hid its whole update under the GEMM: the larger of cuBLAS's dW GEMM (measured
    beside it) and the update's bytes at the measured copy rate."""
    return max(gemm_ms, update_bytes(N, K, rule, state_dtype) / (copy_tbps * 1e9))


def baseline_min_bytes(T: int, N: int, K: int) -> float:
    """GEMM reading dy, x and writing dW (bf16), then AdamW reading dW, W, m, v and writing W, m, v."""
    return 2 * T * (N + K) + 2 * N * K + N * K * (2 + 3 * 2 + 3 * 2)


def time_forge(dy, x, N, K, rule, state_dtype, config=None) -> float:
    from triton.testing import do_bench

    layer, opt = forge_layer(N, K, rule, state_dtype)
    w = layer.weight
    ms = do_bench(lambda: opt.update_linear(w, dy, x, config=config), return_mode="median")
    assert torch.isfinite(w).all(), "weights became non-finite during timing"
    return ms


def _release() -> None:
    """Free the last layer's states now: the optimizer and its ForgeLinear reference each other."""
    gc.collect()
    torch.cuda.empty_cache()


def time_baselines(dy, x, N, K) -> tuple[float, float]:
    from triton.testing import do_bench

    gemm = do_bench(lambda: torch.mm(dy.t(), x), return_mode="median")
    p, opt = baseline_weight(N, K)

    def step():
        p.grad = torch.mm(dy.t(), x)
        opt.step()

    step()  # allocate states
    both = do_bench(step, return_mode="median")
    return gemm, both


def time_graphed_baseline(dy, x, N, K) -> float:
    """(b) captured once in a CUDA graph and replayed (`capture_graphed_baseline`)."""
    from triton.testing import do_bench

    graph, p = capture_graphed_baseline(dy, x, N, K)
    ms = do_bench(graph.replay, return_mode="median")
    assert torch.isfinite(p).all(), "weights became non-finite during timing"
    return ms


def _record(base: dict, **fields) -> dict:
    return results.kernel_record(results.empty_record(), base, fields)


def bench_point(model, shape_name, T, N, K, ceilings, meta, variants, out: Path) -> None:
    dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(T)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    base = dict(
        meta,
        model=model,
        shape_name=shape_name,
        T=T,
        N=N,
        K=K,
        status="ok",
        **{f"ceiling_{k}": v for k, v in ceilings.items()},
    )
    gemm_ms, gemm_adamw_ms = time_baselines(dy, x, N, K)
    flop_ms = 2 * T * N * K / (ceilings["matmul_tflops"] * 1e9)
    bw = ceilings["copy_tbps"] * 1e9
    baseline_floor = max(flop_ms, baseline_min_bytes(T, N, K) / bw)
    rows = [
        ("cublas_gemm", None, None, gemm_ms, max(flop_ms, 2 * (T * (N + K) + N * K) / bw)),
        ("gemm_plus_fused_adamw", "adamw", "bf16", gemm_adamw_ms, baseline_floor),
    ]
    try:
        graphed_ms = time_graphed_baseline(dy, x, N, K)
        rows.append(("gemm_plus_fused_adamw_graph", "adamw", "bf16", graphed_ms, baseline_floor))
    except (RuntimeError, torch.OutOfMemoryError) as e:  # recorded; the point goes on without it
        graphed_ms = None
        results.append(
            out,
            _record(
                base,
                variant="gemm_plus_fused_adamw_graph",
                rule="adamw",
                state_dtype="bf16",
                status="error",
                error=f"{type(e).__name__}: {str(e)[:300]}",
            ),
        )
    _release()
    for rule, state_dtype in variants:
        try:
            ms = time_forge(dy, x, N, K, rule, state_dtype)
            _release()
        except torch.OutOfMemoryError as e:
            _release()
            results.append(
                out,
                _record(
                    base,
                    variant="forge",
                    rule=rule,
                    state_dtype=state_dtype,
                    status="oom",
                    error=str(e)[:300],
                ),
            )
            continue
        rows.append(
            ("forge", rule, state_dtype, ms, max(flop_ms, forge_min_bytes(T, N, K, rule, state_dtype) / bw))
        )
    for variant, rule, state_dtype, ms, floor in rows:
        roofline = (
            roofline_ms(gemm_ms, N, K, rule, state_dtype, ceilings["copy_tbps"])
            if variant == "forge"
            else None
        )
        rec = _record(
            base,
            variant=variant,
            rule=rule,
            state_dtype=state_dtype,
            time_ms=ms,
            tflops=2 * T * N * K / ms / 1e9,
            ratio_to_gemm=ms / gemm_ms,
            ratio_to_gemm_adamw=ms / gemm_adamw_ms,
            ratio_to_gemm_adamw_graph=ms / graphed_ms if graphed_ms else None,
            floor_ms=floor,
            fraction_of_floor=floor / ms,
            roofline_ms=roofline,
            ratio_to_roofline=ms / roofline if roofline else None,
        )
        results.append(out, rec)
        tag = f"{variant}" + (f"[{rule},{state_dtype}]" if variant == "forge" else "")
        print(
            f"{model:12s} {shape_name:8s} T={T:6d} {tag:28s} {ms:8.3f} ms  x{ms / gemm_ms:5.2f} gemm  "
            f"x{ms / gemm_adamw_ms:5.2f} gemm+adamw  {floor / ms:5.2f} of floor"
            + (f"  x{ms / roofline:5.2f} roofline" if roofline else ""),
            flush=True,
        )
    del dy, x
    torch.cuda.empty_cache()


# The shapes (N, K) the tuner times candidates on: Llama-3.1-8B's gate, q and k, and Qwen3-14B's k
# (320 tiles of 128 x 128: 2.4 per multiprocessor, its worst points in the kernel table).
TUNE_POINTS = {
    "gate": (14336, 4096),
    "q": (4096, 4096),
    "k": (1024, 4096),
    "qwen_k": (1024, 5120),
    # Qwen3-0.6B (hidden 1,024): 64, 128 and 192 tiles of 128 x 128, fewer than or about one per
    # multiprocessor
    "small_k": (1024, 1024),
    "small_q": (2048, 1024),
    "small_gate": (3072, 1024),
    "small_down": (1024, 3072),
}
TUNE_TOKENS = (1024, 2048, 8192, 16384)
TUNE_DEFAULT_POINTS = ("gate", "q", "k")


def tune(
    out: Path,
    meta: dict,
    groups: list[str] | None = None,
    state_dtypes=("bf16", "int8"),
    points=TUNE_DEFAULT_POINTS,
    tokens=TUNE_TOKENS,
) -> None:
    """Time candidate launch configs of the fused kernel (AdamW; bf16 and int8 states unless asked)
    offline: the named groups of `harness.kernels.build.candidate_groups` (default all; the shipped
    configs always, as the reference) on the named `TUNE_POINTS` at `tokens`, each point beside
    cuBLAS's weight-gradient GEMM alone (variant "cublas_gemm")."""
    from forge.kernels import KernelConfig
    from harness.kernels.build import candidates as candidate_fields

    candidates = [KernelConfig(**fields) for fields in candidate_fields(groups)]
    shapes = [(name, *TUNE_POINTS[name]) for name in points]
    for (name, N, K), T in itertools.product(shapes, tokens):
        dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(T)
        x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        gemm_ms = _time_gemm(dy, x)
        gemm = dict(variant="cublas_gemm", shape_name=name, T=T, N=N, K=K, time_ms=gemm_ms, status="ok")
        results.append(out, _record(meta, **gemm, tflops=2 * T * N * K / gemm_ms / 1e9))
        print(f"tune {name:5s} T={T:5d} cublas_gemm -> {gemm_ms}", flush=True)
        _tune_point(out, meta, name, T, N, K, dy, x, candidates, state_dtypes)


def _time_gemm(dy: torch.Tensor, x: torch.Tensor) -> float:
    """cuBLAS's dW = dy^T x alone, median ms."""
    from triton.testing import do_bench

    return do_bench(lambda: torch.mm(dy.t(), x), return_mode="median")


def _tune_point(out: Path, meta: dict, name: str, T: int, N: int, K: int, dy, x, candidates, state_dtypes):
    """One point's records: every candidate config with each state dtype (a config that does not
    compile or fit is recorded as an error)."""
    for state_dtype in state_dtypes:
        for cfg in candidates:
            try:
                ms = time_forge(dy, x, N, K, "adamw", state_dtype, config=cfg)
                status, err = "ok", None
                _release()
            except Exception as e:  # a config that does not compile or fit is a result here
                ms, status, err = None, "error", f"{type(e).__name__}: {str(e)[:200]}"
            results.append(
                out,
                _record(
                    meta,
                    variant="forge_tune",
                    shape_name=name,
                    T=T,
                    N=N,
                    K=K,
                    rule="adamw",
                    state_dtype=state_dtype,
                    config=dataclasses.asdict(cfg),
                    time_ms=ms,
                    status=status,
                    error=err,
                    tflops=(2 * T * N * K / ms / 1e9) if ms else None,
                ),
            )
            print(f"tune {name:5s} T={T:5d} {state_dtype:4s} {cfg} -> {ms}", flush=True)


EXAMPLES = """examples (on a CUDA GPU):
  python -m harness kernels                                    # every shape and T, both models
  python -m harness kernels --quick                            # Llama q, gate, down at T = 2048, 8192
  python -m harness kernels --models qwen3-14b --tokens 1024 4096
  python -m harness kernels --rules adamw                      # every shape and T, AdamW only
  python -m harness kernels --tune --groups pointers --state-dtypes bf16
  python -m harness kernels --tune --groups small_grid --points small_k small_q --tokens 1024 4096
  python -m harness kernels --regress --output ci-results/kernels_h200.jsonl
  python -m harness kernels --regress --output slow.jsonl --debug-slowdown 6%
  python -m harness kernels --clip-norms --models llama3.1-8b --tokens 1024 4096 --output clip_norms.jsonl
  python -m harness kernels --fp8 --models llama3.1-8b --tokens 1024 4096 --output fp8_kernels.jsonl
"""


def _fraction(text: str) -> float:
    """'6%' or '0.06' -> 0.06."""
    value = float(text.strip().rstrip("%"))
    return value / 100 if text.strip().endswith("%") else value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness kernels",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--out",
        help="folder for the JSONL records (default results/kernels, with --tune results/tuning)",
    )
    parser.add_argument("--quick", action="store_true", help="Llama q/gate/down at T=2048 and 8192 only")
    parser.add_argument("--tune", action="store_true", help="time candidate launch configs instead")
    parser.add_argument(
        "--groups",
        nargs="*",
        help="with --tune: candidate groups to time (harness.kernels.build), default all",
    )
    parser.add_argument(
        "--state-dtypes",
        nargs="*",
        default=["bf16", "int8"],
        choices=list(forge.STATE_DTYPES),
        help="with --tune: optimizer state dtypes to time the candidates with",
    )
    parser.add_argument(
        "--points",
        nargs="*",
        default=list(TUNE_DEFAULT_POINTS),
        choices=list(TUNE_POINTS),
        help="with --tune: the shapes to time the candidates on",
    )
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--rules",
        nargs="*",
        default=list(timed_rules()),
        choices=list(timed_rules()),
        help="the rules the fused kernel is timed with (harness.kernels.layers.TIMED_RULES; default all)",
    )
    parser.add_argument(
        "--tokens",
        nargs="*",
        type=int,
        help=f"tokens per step T (default {' '.join(map(str, TOKENS))}; "
        f"with --tune {' '.join(map(str, TUNE_TOKENS))})",
    )
    parser.add_argument(
        "--regress",
        action="store_true",
        help="the regression check's kernel suite (harness.kernels.regress_suite), about a minute",
    )
    parser.add_argument(
        "--clip-norms",
        action="store_true",
        help="time the ways of taking a layer's gradient norm for clipping (harness.kernels.clip_norms)",
    )
    parser.add_argument(
        "--fp8",
        action="store_true",
        help="the FP8 fused kernel against the FP8 GEMM and FP8 GEMM + fused AdamW (harness.kernels.fp8)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="with --regress, --clip-norms or --fp8: the JSONL file to write (a new one)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=regress_suite.REPEATS,
        help=f"with --regress: timed rounds per point (default {regress_suite.REPEATS})",
    )
    parser.add_argument(
        "--debug-slowdown",
        type=_fraction,
        help="with --regress: make every fused kernel this much slower on purpose, e.g. 6%%",
    )
    args = parser.parse_args(argv)
    if (args.regress or args.clip_norms or args.fp8) and (args.output is None or args.output.exists()):
        why = "needs --output FILE" if args.output is None else f"would not overwrite {args.output}"
        flag = "--regress" if args.regress else "--clip-norms" if args.clip_norms else "--fp8"
        print(f"python -m harness kernels {flag} {why}: name a new file for its records")
        return 2
    if not torch.cuda.is_available():
        print(
            "python -m harness kernels needs a CUDA GPU: it times kernels (the CPU interpreter is for tests)"
        )
        return 2
    git = env.git_info()
    meta = dict(
        sweep="kernels",
        env=env.collect(git),
        gpu_name=torch.cuda.get_device_name(),
        gpu_count=1,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        method="kernel",
    )
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{(git.get('git_commit') or 'nogit')[:7]}"
    if args.regress:
        failed = regress_suite.run(args.output, meta, args.repeats, args.debug_slowdown)
        print(f"results: {args.output} ({failed} points failed)")
        return 0
    if args.clip_norms or args.fp8:
        from harness.kernels import clip_norms, fp8

        shapes = {f"{m}/{k}": v for m in args.models for k, v in linear_shapes(MODELS[m]).items()}
        (fp8 if args.fp8 else clip_norms).run(args.output, meta, shapes, args.tokens or list(TOKENS))
        print(f"results: {args.output}")
        return 0
    if args.tune:
        name = "-".join(args.groups or ["all"])
        out = Path(args.out or sources.TUNING) / f"tuning-{name}-{stamp}.jsonl"
        tune(out, meta, args.groups, args.state_dtypes, args.points, tuple(args.tokens or TUNE_TOKENS))
        print(f"results: {out} (python -m harness.kernels.tuning {out})")
        return 0
    ceilings = measure_ceilings()
    print(
        f"ceilings: {ceilings['matmul_tflops']:.0f} TFLOP/s bf16 matmul, "
        f"{ceilings['copy_tbps']:.2f} TB/s copy"
    )
    out = Path(args.out or sources.KERNELS) / f"kernels-{stamp}.jsonl"
    variants = list(itertools.product(args.rules, forge.STATE_DTYPES))
    for model in args.models:
        shapes = linear_shapes(MODELS[model])
        tokens = args.tokens or list(TOKENS)
        if args.quick:
            shapes = {k: v for k, v in shapes.items() if k in ("q", "gate", "down")}
            tokens = [2048, 8192]
        for (name, (N, K)), T in itertools.product(shapes.items(), tokens):
            bench_point(model, name, T, N, K, ceilings, meta, variants, out)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
