"""One JSONL record per (linear shape, token count) for the kernel lab's side studies.

`python -m harness kernels --clip-norms` and `--fp8` time a few ways of doing one layer's work at
every linear shape of a model and token count. `write` runs a study's `bench_shape` over the grid,
prints a line per point and appends each record (with the run's metadata) to a new JSONL file as
it goes; a point that raises is recorded with its error and the next one runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def write(
    output: Path,
    meta: dict[str, Any],
    sweep: str,
    shapes: dict[str, tuple[int, int]],
    tokens: list[int],
    bench_shape: Callable[[str, int, int, int], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
) -> None:
    """Every (T, shape) point of `bench_shape` into `output` (a new file); `summary` ends its line."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("x") as f:
        for T in tokens:
            for name, (N, K) in shapes.items():
                base = dict(meta, sweep=sweep, model=name.split("/")[0])
                try:
                    row = dict(base, status="ok", **bench_shape(name, T, N, K))
                except Exception as e:  # recorded, and the next shape runs
                    error = f"{type(e).__name__}: {e}"[:2000]
                    row = dict(base, status="error", shape_name=name, T=T, N=N, K=K, error=error)
                    print(f"{name:18s} T={T:5d}  error: {error[:200]}")
                else:
                    timed = [k for k in row if k.endswith("_ms")]
                    times = "  ".join(f"{k[:-3]} {row[k]:.3f}" for k in timed)
                    print(f"{name:18s} T={T:5d}  {times} ms  {summary(row)}")
                f.write(json.dumps(row) + "\n")
                f.flush()
                torch.cuda.empty_cache()
