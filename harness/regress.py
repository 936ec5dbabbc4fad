"""`python -m harness regress BASELINE CURRENT`: did this commit make a point slower or bigger?

Points of the two runs are matched by configuration (`harness.points.config_key`: method and its
options, model, batch, seq, GPU, activation checkpointing, memory cap). For each matched pair:

Step time. Each record keeps every timed step (`step_times_ms`). We compare medians, and call a
slowdown a regression only when all three hold:
1. the median grew by more than `--max-slowdown` (default 5%);
2. the growth is larger than the noise band: the baseline's upper half-spread plus the current
   run's lower half-spread, ((p75 - p50) of the baseline + (p50 - p25) of the current) / baseline
   median. When it holds, the middle halves of the two sample sets no longer overlap;
3. the minimum grew by more than the threshold too: a slower kernel moves the best step, while a
   noisy neighbour on a shared GPU mostly moves the others.
Relative mode (the default where a sweep has one): every time of a run is first divided by the
median of fused AdamW measured in the same sweep at the same configuration (its minimum by that
point's minimum). A machine that is uniformly 10% slower then changes nothing, while a method
that got slower than its neighbours still shows. The ratio carries the reference's noise too, so
there the noise band is the sum of the point's band and fused AdamW's. Fused AdamW itself is the
yardstick: its own change is shown, never judged. `--absolute` compares raw milliseconds.

Memory. Peak allocated GiB is deterministic enough to need no noise band: growth beyond
`--max-memory-growth` (default 2%) is a regression.

Status. A point that ran in the baseline and now fails (OOM, error, diverged, unavailable) is a
regression. Points on one side only, and points that did not run on either side, are listed,
never dropped silently.

Exit status: 1 when there is a regression, 0 when there is none, 2 when the inputs are unusable
(no file, no record in CURRENT). The Markdown report goes to stdout and, with `--output`, a file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.points import (
    REFERENCE_METHOD,
    describe,
    display_name,
    latest_by_key,
    reference_index,
    reference_key,
    sort_key,
)
from harness.records import Record, load_records, split_kinds
from harness.report.markup import NONE, Table, fmt_gib, fmt_int, fmt_ms, fmt_pct, to_markdown
from harness.report.readme import commit_of
from harness.stats import StepStats, step_stats


@dataclass(frozen=True)
class Thresholds:
    """Relative growth allowed before a change counts (0.05 is 5%)."""

    max_slowdown: float = 0.05
    max_memory_growth: float = 0.02
    relative: bool = True


@dataclass
class Comparison:
    """One matched configuration: both records, the measured changes and the verdict."""

    key: tuple
    baseline: Record | None
    current: Record | None
    verdict: str = ""
    regression: bool = False
    mode: str = "absolute"
    time_change: float | None = None
    min_change: float | None = None
    noise: float | None = None
    memory_change: float | None = None


# ---------------------------------------------------------------------------------------------
# Statistics


def normalized(stats: StepStats, ref: StepStats) -> StepStats:
    """A point's times in units of its reference: quartiles by the median, min by the min."""
    base = stats.scaled(ref.median)
    minimum = None if stats.minimum is None or not ref.minimum else stats.minimum / ref.minimum
    return StepStats(base.median, minimum, base.p25, base.p75, base.p90, stats.n)


def noise_band(base: StepStats, cur: StepStats) -> float | None:
    """Relative growth of the median that the two runs' spreads can explain."""
    if None in (base.p75, cur.p25):
        return None
    return ((base.p75 - base.median) + (cur.median - cur.p25)) / base.median


def _change(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else new / old - 1


# ---------------------------------------------------------------------------------------------
# Comparing


def _ok(record: Record | None) -> bool:
    return record is not None and record.get("status") == "ok"


def _times(
    record: Record, refs: Mapping[tuple, Record], relative: bool
) -> tuple[StepStats | None, StepStats | None]:
    """(the point's step statistics, its reference's), normalized where relative mode applies."""
    stats = step_stats(record)
    ref = refs.get(reference_key(record))
    if stats is None or not relative or not _ok(ref) or record.get("method") == REFERENCE_METHOD:
        return stats, None
    ref_stats = step_stats(ref)
    return (normalized(stats, ref_stats), ref_stats) if ref_stats else (stats, None)


def compare_pair(c: Comparison, refs: tuple[Mapping, Mapping], limits: Thresholds) -> Comparison:
    """Fill in the changes and the verdict of a pair present on both sides."""
    base, cur = c.baseline, c.current
    if not _ok(base) or not _ok(cur):
        return _status_verdict(c)
    (sb, ref_b), (sc, ref_c) = _times(base, refs[0], limits.relative), _times(cur, refs[1], limits.relative)
    if (ref_b is None) != (ref_c is None):  # a reference on one side only: raw times on both
        (sb, ref_b), (sc, ref_c) = (step_stats(base), None), (step_stats(cur), None)
    c.mode = "relative" if ref_b is not None else "absolute"
    c.memory_change = _change(cur.get("peak_alloc_gib"), base.get("peak_alloc_gib"))
    slow = False
    if sb is not None and sc is not None:
        c.time_change = _change(sc.median, sb.median)
        c.min_change = _change(sc.minimum, sb.minimum)
        c.noise = _add(noise_band(sb, sc), noise_band(ref_b, ref_c) if ref_b is not None else 0.0)
        slow = _slower(c, limits)
    bigger = c.memory_change is not None and c.memory_change > limits.max_memory_growth
    return _verdict(c, slow, bigger, limits)


def _add(a: float | None, b: float | None) -> float | None:
    """Sum of two noise bands; unknown if either is."""
    return None if a is None or b is None else a + b


def _slower(c: Comparison, limits: Thresholds) -> bool:
    beyond_noise = c.noise is None or c.time_change > c.noise
    best_moved = c.min_change is None or c.min_change > limits.max_slowdown
    return c.time_change > limits.max_slowdown and beyond_noise and best_moved


def _verdict(c: Comparison, slow: bool, bigger: bool, limits: Thresholds) -> Comparison:
    is_reference = limits.relative and c.key[0] == REFERENCE_METHOD
    if is_reference:
        slow = False
    what = [name for name, hit in (("time", slow), ("memory", bigger)) if hit]
    if what:
        c.verdict, c.regression = f"REGRESSION ({', '.join(what)})", True
    elif is_reference:
        c.verdict = "reference"
    elif c.time_change is not None and c.time_change > limits.max_slowdown:
        c.verdict = "within noise"
    elif (
        c.time_change is not None and c.time_change < -limits.max_slowdown and -c.time_change > (c.noise or 0)
    ):
        c.verdict = "faster"
    else:
        c.verdict = "ok"
    return c


def _status_verdict(c: Comparison) -> Comparison:
    before, after = c.baseline.get("status"), c.current.get("status")
    if before == "ok":
        c.verdict, c.regression = f"REGRESSION (now {after})", True
    elif after == "ok":
        c.verdict = f"fixed (was {before})"
    else:
        c.verdict = f"{before} -> {after}"
    return c


def compare(baseline: Sequence[Record], current: Sequence[Record], limits: Thresholds) -> list[Comparison]:
    """Every configuration on either side, compared; regressions first, then by configuration."""
    old, new = latest_by_key(baseline), latest_by_key(current)
    refs = (reference_index(baseline), reference_index(current))
    out = []
    for key in sorted(set(old) | set(new), key=sort_key):
        c = Comparison(key, old.get(key), new.get(key))
        if c.baseline is None:
            c.verdict = "new (no baseline)"
        elif c.current is None:
            c.verdict = "missing in current"
        else:
            compare_pair(c, refs, limits)
        out.append(c)
    return sorted(out, key=lambda c: not c.regression)


# ---------------------------------------------------------------------------------------------
# Reporting


def _where(c: Comparison) -> list[str]:
    d = describe(c.key)
    record = c.current or c.baseline or {}
    ckpt = "on" if d["activation_checkpointing"] else "off"
    cap = NONE if d["memory_cap_gib"] is None else fmt_gib(float(d["memory_cap_gib"]))
    return [display_name(record), str(d["model"]), fmt_int(d["batch_size"]), fmt_int(d["seq_len"])] + [
        str(d["gpu_name"] or NONE),
        ckpt,
        cap,
    ]


WHERE = ["Method", "Model", "Batch", "Seq", "GPU", "Ckpt", "Cap GiB"]


STATUS_LABELS = {"oom": "OOM", "error": "error", "diverged": "diverged", "unavailable": "unavailable"}


def _status_word(record: Record) -> str:
    status = str(record.get("status"))
    return STATUS_LABELS.get(status, status)


def _ms(record: Record) -> str:
    if not _ok(record):
        return _status_word(record)
    stats = step_stats(record)
    return NONE if stats is None else fmt_ms(stats.median)


def _gib(record: Record) -> str:
    return fmt_gib(record.get("peak_alloc_gib")) if _ok(record) else _status_word(record)


def matched_table(rows: Sequence[Comparison]) -> Table:
    """Every point present on both sides: times, changes, noise band, memory, verdict."""
    header = ["Verdict"] + WHERE + ["Baseline ms", "Current ms", "Time change", "Noise band", "Min change"]
    header += ["Mode", "Baseline GiB", "Current GiB", "Memory change"]
    body = []
    for c in rows:
        body.append(
            [c.verdict]
            + _where(c)
            + [_ms(c.baseline), _ms(c.current), fmt_pct(c.time_change), _band(c.noise), fmt_pct(c.min_change)]
            + [c.mode if c.time_change is not None else NONE, _gib(c.baseline), _gib(c.current)]
            + [fmt_pct(c.memory_change)]
        )
    return Table("regress", "Matched points", header, body, align="l" + "llrrllr" + "rrrrrlrrr")


def _band(noise: float | None) -> str:
    return NONE if noise is None else f"{100 * noise:.1f}%"


def missing_table(rows: Sequence[Comparison]) -> Table:
    """Points measured on one side only, with the status they had there."""
    header = WHERE + ["Baseline", "Current", "Verdict"]
    body = [_where(c) + [_status(c.baseline), _status(c.current), c.verdict] for c in rows]
    return Table("regress_missing", "Points on one side only", header, body, align="llrrllr" + "lll")


def _status(record: Record | None) -> str:
    if record is None:
        return "missing"
    reason = record.get("error")
    word = _status_word(record) if not _ok(record) else "ok"
    return f"{word}: {str(reason).splitlines()[0][:80]}" if reason and not _ok(record) else word


def _source(label: str, path: str, records: Sequence[Record]) -> str:
    sweeps = sorted({str(r.get("sweep")) for r in records})
    commits = sorted({commit_of(r) for r in records})
    gpus = sorted({str(r.get("gpu_name") or NONE) for r in records})
    return (
        f"- {label}: `{path}`: {len(records)} records; sweep {', '.join(sweeps)}; "
        f"commit {', '.join(commits)}; GPU {', '.join(gpus)}"
    )


def _name(c: Comparison) -> str:
    method, model, batch, seq = _where(c)[:4]
    return f"{method} on {model} (batch {batch}, seq {seq})"


def render(comparisons: Sequence[Comparison], limits: Thresholds, sources: Sequence[str] = ()) -> str:
    """The Markdown report: summary line, matched points (regressions first), the rest."""
    matched = [c for c in comparisons if c.baseline is not None and c.current is not None]
    one_side = [c for c in comparisons if c.baseline is None or c.current is None]
    failed = [c for c in comparisons if c.regression]
    mode = "relative to fused AdamW in the same sweep, where present" if limits.relative else "absolute"
    lines = ["# Step-time and memory regression check", "", *sources, ""]
    lines.append(
        f"Thresholds: step time {fmt_pct(limits.max_slowdown)} beyond the noise band (and in the "
        f"minimum); peak allocated memory {fmt_pct(limits.max_memory_growth)}. Step-time mode: {mode}."
    )
    lines.append("")
    if failed:
        names = "; ".join(f"{_name(c)}: {c.verdict}" for c in failed)
        lines.append(f"**{len(failed)} regression(s) in {len(matched)} matched points: {names}.**")
    else:
        lines.append(f"**No regression in {len(matched)} matched points.**")
    if matched:
        lines += ["", "## Matched points", "", to_markdown(matched_table(matched)).rstrip()]
    if one_side:
        lines += ["", "## Missing points", "", to_markdown(missing_table(one_side)).rstrip()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line


def fraction(text: str) -> float:
    """'5%', '5' or '0.05' -> 0.05."""
    value = float(text.strip().rstrip("%"))
    return value / 100 if text.strip().endswith("%") or value >= 1 else value


REGRESS_EXAMPLES = """\
examples:
  python -m harness sweep +exp=regress_h200
  python -m harness regress results/baselines/h200.jsonl results/regress_h200.jsonl
  python -m harness regress BASE.jsonl CURRENT.jsonl --max-slowdown 3% --output regress.md
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness regress",
        description="Compare step time and peak memory of CURRENT results against BASELINE. "
        "Exit status 1 when a point regressed, 0 when none did, 2 when the inputs are unusable.",
        epilog=REGRESS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("baseline", help="baseline results file or directory (JSONL)")
    parser.add_argument("current", help="current results file or directory (JSONL)")
    parser.add_argument("--max-slowdown", type=fraction, default=0.05, help="e.g. 5%% (default)")
    parser.add_argument("--max-memory-growth", type=fraction, default=0.02, help="e.g. 2%% (default)")
    parser.add_argument(
        "--absolute", action="store_true", help="compare raw times, not ratios to fused AdamW"
    )
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    return parser.parse_args(list(argv))


def _load(path: str) -> list[Record]:
    steps, _kernels = split_kinds(load_records([path]))
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m harness regress`; returns the exit status (see the docstring)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        baseline, current = _load(args.baseline), _load(args.current)
    except (FileNotFoundError, ValueError) as err:
        print(f"regress: {err}", file=sys.stderr)
        return 2
    if not current:
        print(f"regress: no step records in {args.current}", file=sys.stderr)
        return 2
    limits = Thresholds(args.max_slowdown, args.max_memory_growth, relative=not args.absolute)
    comparisons = compare(baseline, current, limits)
    sources = [_source("Baseline", args.baseline, baseline), _source("Current", args.current, current)]
    report = render(comparisons, limits, sources)
    print(report, end="")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
    return 1 if any(c.regression for c in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
