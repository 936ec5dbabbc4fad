"""`python -m harness kernels --regress --output FILE`: the kernel suite of the regression check.

What it times, in about a minute on an H200. Llama-3.1-8B's q, o, gate and down weight shapes at
T = 1024 and 4096 tokens (`points()`: 8 points), each with four variants on the same random
inputs (`VARIANTS`):

  cublas_gemm                  torch.mm(dy.t(), x): the weight-gradient GEMM alone, the reference;
  gemm_plus_fused_adamw_graph  the GEMM into .grad, then torch's fused AdamW (bf16 states),
                               replayed from a CUDA graph: its GPU work, without host jitter;
  forge [adamw, bf16]          the fused kernel with bf16 states;
  forge [adamw, int8]          the fused kernel with int8 states.

How. `REPEATS` rounds; in each, every variant of the point is timed once with
`triton.testing.do_bench(..., return_mode="median")` over a short window (`WINDOW_MS`). A record
keeps those per-repeat medians as its samples (`repeat_times_ms`) and their median (`time_ms`).
The variants take turns, so a clock that drifts during the run moves all of them alike, and
`python -m harness regress` judges each variant by its time as a ratio to the GEMM of the same
point and run (`reference_key`): a GPU that is uniformly slower today moves nothing.

`--debug-slowdown 6%` makes the fused kernel slower on purpose: each forge variant is timed once
first, then every timed call is followed by a spin of 6% of that time (`harness.slowdown`). The
records say so (`debug_slowdown`), and the check still matches them with their twins without it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.points import missing

SWEEP = "kernels_regress"
MODEL = "llama3.1-8b"
SHAPES = ("q", "o", "gate", "down")
TOKENS = (1024, 4096)
REPEATS = 15
WINDOW_MS = (5, 25)  # do_bench's warm-up and timed window per repeat, in milliseconds


@dataclass(frozen=True)
class Variant:
    """One thing timed at every point: a kernel, or kernels, and the update rule it applies."""

    variant: str
    rule: str | None = None
    state_dtype: str | None = None

    @property
    def label(self) -> str:
        return self.variant if self.rule is None else f"{self.variant} [{self.rule}, {self.state_dtype}]"


REFERENCE = Variant("cublas_gemm")
VARIANTS = (
    REFERENCE,
    Variant("gemm_plus_fused_adamw_graph", "adamw", "bf16"),
    Variant("forge", "adamw", "bf16"),
    Variant("forge", "adamw", "int8"),
)


@dataclass(frozen=True)
class Point:
    """One weight shape of the model at one token count: dW (N, K) = dy (T, N)^T x (T, K)."""

    shape_name: str
    T: int
    N: int
    K: int


def points() -> list[Point]:
    """The suite's points, in the order they are timed."""
    from harness.kernels.layers import MODELS, linear_shapes

    shapes = linear_shapes(MODELS[MODEL])
    return [Point(name, T, *shapes[name]) for name in SHAPES for T in TOKENS]


# ---------------------------------------------------------------------------------------------
# Records, and how the regression check matches them

KEY_FIELDS = ("variant", "rule", "state_dtype", "model", "shape_name", "T", "N", "K", "gpu_name")
REFERENCE_FIELDS = ("sweep", "model", "shape_name", "T", "N", "K", "gpu_name")


def key(record: Mapping[str, Any]) -> tuple:
    """What identifies a kernel point across runs (a deliberate slowdown does not)."""
    return tuple(None if missing(record.get(f)) else record.get(f) for f in KEY_FIELDS)


def reference_key(record: Mapping[str, Any]) -> tuple:
    """Where a kernel record's reference lives: the GEMM of the same point and run."""
    return tuple(None if missing(record.get(f)) else record.get(f) for f in REFERENCE_FIELDS)


def order(point_key: tuple) -> tuple:
    """Sort key of `key(record)`: by shape as in SHAPES, then T, then variant as in VARIANTS."""
    d = dict(zip(KEY_FIELDS, point_key))
    shape = SHAPES.index(d["shape_name"]) if d["shape_name"] in SHAPES else len(SHAPES)
    variant = Variant(d["variant"], d["rule"], d["state_dtype"])
    rank = VARIANTS.index(variant) if variant in VARIANTS else len(VARIANTS)
    return (
        str(d["model"]),
        shape,
        str(d["shape_name"]),
        d["T"] or 0,
        rank,
        str(variant.label),
        str(d["gpu_name"]),
    )


def is_reference(record: Mapping[str, Any]) -> bool:
    return record.get("variant") == REFERENCE.variant


def samples(record: Mapping[str, Any]) -> list[float] | None:
    """A kernel record's timing samples: its per-repeat medians, else its one median."""
    values = record.get("repeat_times_ms")
    if not missing(values) and values is not None and len(values) > 0:
        return [float(v) for v in values]
    return None if missing(record.get("time_ms")) else [float(record["time_ms"])]


def make_record(
    meta: Mapping[str, Any],
    point: Point,
    variant: Variant,
    times_ms: list[float] | None,
    reference_ms: float | None = None,
    debug_slowdown: float | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """One variant at one point: its per-repeat medians, or the error that stopped it."""
    from harness import results

    median = statistics.median(times_ms) if times_ms else None
    return results.kernel_record(
        results.empty_record(),
        meta,
        sweep=SWEEP,
        model=MODEL,
        shape_name=point.shape_name,
        T=point.T,
        N=point.N,
        K=point.K,
        variant=variant.variant,
        rule=variant.rule,
        state_dtype=variant.state_dtype,
        status="ok" if times_ms else ("oom" if error and "out of memory" in error else "error"),
        error=error,
        repeats=len(times_ms or []),
        repeat_times_ms=times_ms,
        time_ms=median,
        tflops=2 * point.T * point.N * point.K / median / 1e9 if median else None,
        ratio_to_gemm=median / reference_ms if median and reference_ms else None,
        debug_slowdown=debug_slowdown if variant.variant == "forge" else None,
    )


# ---------------------------------------------------------------------------------------------
# Timing (CUDA)


def _callables(point: Point) -> dict[Variant, Callable[[], Any]]:
    """What each variant runs once, on one set of random inputs (each call holds what it needs:
    the graph its optimizer and weight, a FORGE call its weight and optimizer)."""
    import torch

    from harness.kernels.layers import capture_graphed_baseline, forge_layer

    dy = torch.randn(point.T, point.N, device="cuda", dtype=torch.bfloat16) / math.sqrt(point.T)
    x = torch.randn(point.T, point.K, device="cuda", dtype=torch.bfloat16)
    graph, _ = capture_graphed_baseline(dy, x, point.N, point.K)
    calls: dict[Variant, Callable[[], Any]] = {
        REFERENCE: lambda: torch.mm(dy.t(), x),
        VARIANTS[1]: graph.replay,
    }
    for variant in VARIANTS[2:]:
        layer, opt = forge_layer(point.N, point.K, variant.rule, variant.state_dtype)
        calls[variant] = lambda w=layer.weight, opt=opt: opt.update_linear(w, dy, x)
    return calls


def _slowed(call: Callable[[], Any], slowdown: float) -> Callable[[], Any]:
    """`call` followed by a spin of `slowdown` times its own time."""
    from triton.testing import do_bench

    from harness.slowdown import Delay

    delay = Delay(slowdown * do_bench(call, return_mode="median") * 1000)

    def slower() -> None:
        call()
        delay()

    return slower


def time_point(point: Point, repeats: int, debug_slowdown: float | None) -> dict[Variant, list[float]]:
    """Per-repeat medians of every variant, the variants taking turns in each repeat."""
    from triton.testing import do_bench

    calls = _callables(point)
    if debug_slowdown:
        calls = {v: _slowed(c, debug_slowdown) if v.variant == "forge" else c for v, c in calls.items()}
    warmup, window = WINDOW_MS
    times: dict[Variant, list[float]] = {v: [] for v in calls}
    for _ in range(repeats):
        for variant, call in calls.items():
            times[variant].append(do_bench(call, warmup=warmup, rep=window, return_mode="median"))
    return times


def run(
    out: Path, meta: Mapping[str, Any], repeats: int = REPEATS, debug_slowdown: float | None = None
) -> int:
    """Time every point and append its records to `out`; returns how many points failed."""
    import gc

    import torch

    from harness import results

    failed = 0
    for point in points():
        try:
            times = time_point(point, repeats, debug_slowdown)
        except (RuntimeError, torch.OutOfMemoryError) as e:  # a result: recorded, the suite goes on
            failed += 1
            error = f"{type(e).__name__}: {str(e)[:300]}"
            for variant in VARIANTS:
                results.append(out, make_record(meta, point, variant, None, error=error))
            continue
        finally:
            gc.collect()
            torch.cuda.empty_cache()
        gemm = statistics.median(times[REFERENCE])
        for variant in VARIANTS:
            record = make_record(meta, point, variant, times[variant], gemm, debug_slowdown)
            results.append(out, record)
            print(
                f"{point.shape_name:5s} T={point.T:5d} {variant.label:30s} {record['time_ms']:8.4f} ms "
                f"x{record['ratio_to_gemm']:5.3f} gemm  ({repeats} repeats)",
                flush=True,
            )
    return failed
