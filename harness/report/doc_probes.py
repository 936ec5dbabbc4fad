"""The tables of docs/performance.md that come from the kernel lab's probes and step profiles.

These records are no sweep points: they sit under results/device-logs/ (which the report does not
read as records), one file per probe run, named `<what>-<date>-<commit>`. Each function here takes
the repository root and returns the Markdown of one generated block (`doc_blocks`).

- `kernel_probe`: `scripts/probe_ws_bounds.py` (in git history at 7de8e11) timed the shipped
  warp-specialized kernel beside the same kernel with one half removed (only the MMA warps' work,
  only the epilogue's), with the epilogue's instructions on staged tiles but no loads or stores
  (`mma_math`), and with loaders that read fewer operands (dy on every other fill; nothing after
  the first lap over T), beside cuBLAS's dW GEMM. bf16 states, AdamW, median ms.
- `step_profiles`: `python -m harness.kernels.profile` over graphed steps (its JSON per point),
  summarised as `python -m harness.kernels.compare_profiles` prints them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.kernels.compare_profiles import kernel_differences, summary
from harness.report.markup import Table, to_markdown

WS_PROBE = "results/device-logs/ws-bounds-20261130-7de8e11.jsonl"
PROFILES_B1 = "results/device-logs/profile-{}-llama3.1-8b-b1-s1024-h200-20261130-05ac13b.json"


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _table(header: Sequence[str], rows: list[list[str]], align: str) -> str:
    return to_markdown(Table("doc", "", list(header), rows, align=align)).rstrip()


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _ms(value: float) -> str:
    return f"{value:.3f}"


PROBE_POINTS = {("gate", 256), ("gate", 1024), ("gate", 4096), ("gate", 16384), ("q", 1024), ("q", 16384)}


def kernel_probe(root: Path) -> str:
    """The warp-specialized kernel's halves alone and together, and what operand reads cost."""
    records = [r for r in _read_jsonl(root / WS_PROBE) if (r["shape_name"], r["T"]) in PROBE_POINTS]
    halves, reads = [], []
    for r in records:
        point = f"{r['shape_name']} {r['N']}x{r['K']}, T = {r['T']}"
        larger = max(r["mma_only_ms"], r["epilogue_only_ms"])
        halves.append(
            [
                point,
                _ms(r["full_ms"]),
                _ms(r["mma_only_ms"]),
                _ms(r["epilogue_only_ms"]),
                _ms(r["cublas_gemm_ms"]),
                _x(r["full_ms"] / larger),
                _x(r["mma_math_ms"] / r["mma_only_ms"]),
                f"{r['update_bytes'] / r['epilogue_only_ms'] / 1e9:.1f}",
            ]
        )
        reads.append(
            [
                point,
                _x(r["full_half_dy_ms"] / r["full_ms"]),
                _x(r["full_first_lap_ms"] / r["full_ms"]),
                _x(r["mma_first_lap_ms"] / r["mma_only_ms"]),
                _x(r["full_first_lap_ms"] / max(r["mma_first_lap_ms"], r["epilogue_only_ms"])),
            ]
        )
    env = records[0]["env"]
    first = _table(
        ["point", "full ms", "MMA half ms", "epilogue half ms", "cuBLAS dW ms", "full / larger half"]
        + ["epilogue's instructions / MMA half", "epilogue TB/s"],
        halves,
        "l" + "r" * 7,
    )
    second = _table(
        ["point", "half the dy reads / full", "no operand reads / full", "MMA half without reads / with"]
        + ["no reads / its larger half"],
        reads,
        "l" + "r" * 4,
    )
    return "\n\n".join(
        [
            first,
            'The same run, the loaders reading fewer operands ("no operand reads": nothing after the first'
            " lap over T, the MMAs on stale tiles):",
            second,
            f"Data: `{WS_PROBE}` ({env['gpu_name']}, torch {env['torch']}, triton {env['triton']}, commit"
            f" {env['git_commit'][:7]}, {records[0]['time'][:10]}); the probe is `scripts/probe_ws_bounds.py`"
            " at that commit (git history). \"Epilogue's instructions\": the update's instructions on every"
            ' staged tile with every load and store predicated off; "epilogue TB/s": the update\'s bytes'
            " over the epilogue half's time.",
        ]
    )


def _profile_rows(paths: Sequence[tuple[str, Path]]) -> list[list[str]]:
    rows = []
    for label, path in paths:
        profile = json.loads(path.read_text())
        s = summary(profile)
        fused = profile.get("fused_busy_ms")
        rows.append(
            [
                label,
                f"{statistics.median(profile['step_ms']):.1f}",
                f"{s['gpu_busy_ms']:.1f}",
                f"{100 * s['idle_frac']:.1f}%",
                "—" if not fused else f"{fused:.1f}",
                f"{s['sm_clock_mhz']:.0f}",
                f"{s['power_w']:.0f}",
            ]
        )
    return rows


def step_profiles(pattern: str, methods: Sequence[str], title: str) -> Callable[[Path], str]:
    """A block builder: the graphed-step profiles of `methods` (files `pattern` with the method),
    and the kernels whose time differs most between the floor's step and FORGE bf16's."""

    def build(root: Path) -> str:
        paths = [(m, root / pattern.format(m)) for m in methods]
        header = ["graphed step", "median step ms", "GPU busy ms", "GPU idle", "fused kernels ms"]
        header += ["SM MHz (median)", "W (median)"]
        table = _table(header, _profile_rows(paths), "l" + "r" * 6)
        floor = json.loads((root / pattern.format("no_optimizer_graph")).read_text())
        forge = json.loads((root / pattern.format("forge_bf16_graph")).read_text())
        diffs = kernel_differences(floor, forge)[:4]
        parts = [
            f"`{d['name'][:48]}` {d['difference_ms']:+.1f} ms"
            for d in diffs
            if abs(d["difference_ms"]) >= 0.5
        ]
        files = pattern.format("{" + ",".join(methods) + "}")
        return "\n\n".join(
            [
                table,
                f"{title} The kernels whose time a step differs most, FORGE bf16 against no optimizer: "
                + "; ".join(parts)
                + f". Data: `{files}`; from `python -m harness.kernels.profile method=<method>"
                " model=llama3.1-8b"
                " batch_size=<b>`, compared with `python -m harness.kernels.compare_profiles`.",
            ]
        )

    return build


BLOCKS: dict[str, Callable[[Path], str]] = {
    "kernel-probe": kernel_probe,
    "profiles-b1": step_profiles(
        PROFILES_B1,
        ("fused_adamw_graph", "forge_bf16_graph", "no_optimizer_graph"),
        "Batch 1, seq 1024 (1,024 tokens), 5 replays each.",
    ),
}
