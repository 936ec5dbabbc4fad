"""Two step profiles side by side: where one step spends GPU time that another does not.

`python -m harness.kernels.profile` writes one JSON per point: the step's wall time, GPU busy time,
the SM clock and power NVML saw, and the 20 kernels with the most device time. Put two of them side
by side (say the no-optimizer step and FORGE's) and this prints, for each: the median step, GPU
busy ms, idle fraction, median SM clock and power; then the kernels by name, device ms a step in
each and the difference, largest differences first. A kernel outside a profile's top 20 shows as
"-" there and counts as 0 in the difference (so a long tail of small kernels can hide in the
busy-time line).

    python -m harness.kernels.compare_profiles no_optimizer.profile.json forge_bf16.profile.json

It only reads JSON: it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def summary(profile: dict) -> dict:
    """The step-level figures of one profile (None where it has none, e.g. a CPU dry run)."""
    clocks = profile.get("clocks") or {}
    return {
        "step_ms": statistics.median(profile["step_ms"]),
        "gpu_busy_ms": profile.get("gpu_busy_ms"),
        "idle_frac": profile.get("idle_frac"),
        "sm_clock_mhz": (clocks.get("sm_clock_mhz") or {}).get("median"),
        "power_w": (clocks.get("power_w") or {}).get("median"),
    }


def kernel_differences(base: dict, other: dict) -> list[dict]:
    """Per kernel name in either profile's top list: device ms a step in each (None if absent) and
    other minus base (absent counted as 0), largest magnitude first."""
    times = [{k["name"]: k["device_ms"] for k in p["top_kernels"]} for p in (base, other)]
    rows = [
        {"name": name, "base_ms": times[0].get(name), "other_ms": times[1].get(name)}
        for name in dict.fromkeys([*times[0], *times[1]])
    ]
    for row in rows:
        row["difference_ms"] = (row["other_ms"] or 0.0) - (row["base_ms"] or 0.0)
    return sorted(rows, key=lambda r: abs(r["difference_ms"]), reverse=True)


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(base: dict, other: dict, names: tuple[str, str], top: int) -> str:
    lines = [f"{'':28s} {'base':>10s} {'other':>10s}   (base: {names[0]}; other: {names[1]})"]
    sums = summary(base), summary(other)
    for key in ("step_ms", "gpu_busy_ms", "idle_frac", "sm_clock_mhz", "power_w"):
        digits = 3 if key == "idle_frac" else 1
        lines.append(f"{key:28s} {_cell(sums[0][key], digits):>10s} {_cell(sums[1][key], digits):>10s}")
    rows = kernel_differences(base, other)
    lines.append("")
    lines.append(f"{'kernel (device ms a step)':60s} {'base':>8s} {'other':>8s} {'other-base':>10s}")
    for row in rows[:top]:
        lines.append(
            f"{row['name'][:60]:60s} {_cell(row['base_ms']):>8s} {_cell(row['other_ms']):>8s} "
            f"{row['difference_ms']:>+10.2f}"
        )
    listed = sum(r["difference_ms"] for r in rows)
    busy = [s["gpu_busy_ms"] for s in sums]
    busy_difference = None if None in busy else busy[1] - busy[0]
    lines.append(
        f"{'sum over both top lists':60s} {'':8s} {'':8s} {listed:>+10.2f}"
        f"   (GPU busy: {_cell(busy_difference)})"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.kernels.compare_profiles", description=__doc__.splitlines()[0]
    )
    parser.add_argument("base", type=Path, help="a *.profile.json of python -m harness.kernels.profile")
    parser.add_argument("other", type=Path, help="the profile to set against it")
    parser.add_argument("--top", type=int, default=15, help="kernels to list (default 15)")
    args = parser.parse_args(argv)
    profiles = []
    for path in (args.base, args.other):
        if not path.is_file():
            parser.error(f"{path}: no such file; profiles are written by python -m harness.kernels.profile")
        profiles.append(json.loads(path.read_text()))
    print(render(*profiles, names=(args.base.name, args.other.name), top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
