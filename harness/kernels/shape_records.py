"""One JSONL record per (linear shape, token count) for the kernel lab's side studies.

`python -m harness kernels --clip-norms` and `--fp8` time a few ways of doing one layer's work at
every linear shape of a model and token count. `write` runs a study's `bench_shape` over the grid,
prints a line per point and appends each record (the run's metadata and the point's declared fields,
`results.kernel_record`) to a new JSONL file as it goes (`results.append`); a point that raises is
recorded with its error and the next one runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness import results


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
    if output.exists():
        raise FileExistsError(f"{output} exists: name a new file with --output (each run writes its own)")
    for T in tokens:
        for name, (N, K) in shapes.items():
            base = dict(meta, sweep=sweep, model=name.split("/")[0])
            try:
                measured = dict(status="ok", **bench_shape(name, T, N, K))
            except Exception as e:  # recorded, and the next shape runs
                error = f"{type(e).__name__}: {e}"[:2000]
                measured = dict(status="error", shape_name=name, T=T, N=N, K=K, error=error)
            row = results.kernel_record(base, measured)
            if row["status"] == "error":
                print(f"{name:18s} T={T:5d}  error: {row['error'][:200]}")
            else:
                timed = [k for k in row if k.endswith("_ms")]
                times = "  ".join(f"{k[:-3]} {row[k]:.3f}" for k in timed)
                print(f"{name:18s} T={T:5d}  {times} ms  {summary(row)}")
            results.append(output, row)
            torch.cuda.empty_cache()
