"""What a sweep prints when it ends: a table of its points, and where to read them next.

    status       point                               step ms  peak GiB  tokens/s
    ok           fused_adamw/tiny-llama/b1/s32/cpu      11.9         —      2689
    ok           forge_bf16/tiny-llama/b1/s32/cpu   *2204.7         —        15
    unavailable  adalomo/tiny-llama/b1/s32/cpu             —         —         —  [1]

One row per point of the sweep, in the order they finished (points recorded by an earlier run of
the same sweep included): its status, the median step time (warm-up dropped), the CUDA
allocator's peak (none on a CPU) and tokens per second. A failed point's error, or why it could
not run, is a numbered footnote. A star marks step times of Triton kernels that ran in Triton's
CPU interpreter: they say nothing about speed, only that the method trains (loss fell, weights
moved). The last lines name the results file and the command that renders it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.results import is_scratch
from harness.run.methods import interpreted

NONE = "—"
INTERPRETED = "*"
HEADER = ("status", "point", "step ms", "peak GiB", "tokens/s")
WIDTH = 100  # the notes under the table wrap here


def _number(value: Any, digits: int) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def _row(record: dict[str, Any], footnotes: list[str]) -> list[str]:
    status = str(record.get("status"))
    if record.get("error"):
        text = f"{record.get('method_label') or record.get('method')}: {str(record['error']).splitlines()[0]}"
        if text not in footnotes:
            footnotes.append(text[:200])
        status += f" [{footnotes.index(text[:200]) + 1}]"
    step = _number(record.get("step_time_ms_median"), 1)
    if step != NONE and interpreted(record):
        step = INTERPRETED + step
    tokens = _number(record.get("tokens_per_s"), 0)
    return [status, str(record.get("point")), step, _number(record.get("peak_alloc_gib"), 2), tokens]


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = []
    for row in rows:
        left = [f"{row[i]:<{widths[i]}}" for i in (0, 1)]  # words left, numbers right
        right = [f"{row[i]:>{widths[i]}}" for i in range(2, len(HEADER))]
        lines.append("  ".join(left + right).rstrip())
    return lines


def _counts(records: Sequence[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record.get("status"))] = counts.get(str(record.get("status")), 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def _report_hint(path: Path) -> str:
    if not is_scratch(path.parent):
        return "Render every committed result into reports/ with: python -m harness report"
    folder = relative(path.parent)
    why = f"{folder}/ is scratch (not committed), so `python -m harness report` leaves it out."
    return f"{why}\nRender these points into {folder}/report/ with: python -m harness report {folder}"


def relative(path: Path) -> str:
    """`path` relative to the working directory where it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def summary_table(records: Sequence[dict[str, Any]], path: Path) -> str:
    """The table a sweep ends with: one row per record, footnotes, the results file, what next."""
    footnotes: list[str] = []
    rows = [list(HEADER)] + [_row(r, footnotes) for r in records]
    lines = _table(rows)
    lines += [f"[{i}] {text}" for i, text in enumerate(footnotes, start=1)]
    if any(interpreted(r) and r.get("step_time_ms_median") is not None for r in records):
        lines += textwrap.wrap(
            f"{INTERPRETED} Triton's CPU interpreter ran these points' kernels (TRITON_INTERPRET=1): "
            "their step times say nothing about speed, only that the method trains (the loss fell, "
            "the weights moved). Measure speed and memory on a GPU.",
            width=WIDTH,
        )
    if records and all(r.get("peak_alloc_gib") is None for r in records):
        lines.append("peak GiB is the CUDA allocator's peak: none on a CPU.")
    points = f"{len(records)} point" + ("" if len(records) == 1 else "s")
    lines.append(f"results: {relative(path)} ({points}: {_counts(records)})")
    lines.append(_report_hint(path))
    return "\n".join(lines)
