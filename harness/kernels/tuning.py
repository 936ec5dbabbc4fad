"""Read an offline tuning run of the fused kernel: which launch config wins where.

`python -m harness kernels --tune` times every candidate of `harness.kernels.build.candidates`
(the first, the reference, is the config shipped for bf16 states at large T) on a few linear
shapes, token counts T and state dtypes, one record per (point, config). This prints, as Markdown,
each point's time under the reference config, the best candidate and its ratio, then per state
dtype and T range the geometric mean of every candidate's time over the reference's: what the
launch-config tables behind `forge.kernels.pick_config` are read from. CPU: it only reads records.

    python -m harness.kernels.tuning results/tuning/tuning-spill_free-20261129-e32ca29.jsonl
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict

from harness import results
from harness.kernels.build import describe


def summarize(records: list[dict], small_t: int = 2048) -> str:
    """Markdown: the per-point winners, then geometric-mean ratios to the first candidate's."""
    times: dict[tuple, dict[str, float]] = defaultdict(dict)
    order: list[str] = []
    for r in records:
        if r.get("variant") != "forge_tune" or r.get("status") != "ok":
            continue
        key = describe(r["config"])
        if key not in order:
            order.append(key)
        times[(r["state_dtype"], r["T"], r["shape_name"])][key] = r["time_ms"]
    if not times:
        raise SystemExit("no ok `forge_tune` records: pass the JSONL of `python -m harness kernels --tune`")
    reference = order[0]
    lines = [
        "| state | T | shape | reference ms | best ms | best config | best / reference |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for (dtype, T, shape), by_config in sorted(times.items()):
        best = min(by_config, key=by_config.get)
        base, fastest = by_config[reference], by_config[best]
        cells = (dtype, T, shape, f"{base:.4f}", f"{fastest:.4f}", best, f"{fastest / base:.3f}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    groups = sorted({(dtype, small_t >= T) for dtype, T, _ in times})
    header = [f"{d} T{'<=' if small else '>'}{small_t}" for d, small in groups]
    lines += ["", f"Geometric mean of time / reference ({reference}); worst point in brackets:", ""]
    lines += ["| config | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    for key in order:
        cells = []
        for dtype, small in groups:
            ratios = [
                by_config[key] / by_config[reference]
                for (d, T, _), by_config in times.items()
                if d == dtype and (small_t >= T) == small and key in by_config
            ]
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
            cells.append(f"{geo:.3f} ({max(ratios):.2f})" if ratios else "-")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.kernels.tuning", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("files", nargs="+", help="tuning JSONL files (results/tuning/tuning-*.jsonl)")
    parser.add_argument("--small-t", type=int, default=2048, help="largest T that counts as small")
    args = parser.parse_args(argv)
    print(summarize(results.read(*args.files), args.small_t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
