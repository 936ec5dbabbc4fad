"""`python -m harness regress BASELINE CURRENT [--noise REPEAT ...]`: did a commit make a point slower?

Two kinds of records are read, each file holding either or both:
- training steps of a sweep (`+exp=regress_h200`), each with its timed steps (`step_times_ms`),
  matched by configuration (`harness.points.config_key`: method and options, model, batch, seq,
  GPU...; a `debug_*` method option aside, so a deliberately slowed run meets its twin);
- kernel timings (`python -m harness kernels --regress`), each with its per-repeat medians
  (`repeat_times_ms`), matched by variant, rule, state dtype, shape, T and GPU.

Effect. Every point is timed against a reference of the same run: the fused AdamW whose step ran
the same way (graphed with graphed) for a sweep point, the cuBLAS GEMM of the same shape for a
kernel. The effect is the change of the point's median over its reference's median,

    effect = (median(cur) / median(cur_ref)) / (median(base) / median(base_ref)) - 1,

with a 95% bootstrap interval over all four sample sets (`harness.stats.relative_change`: fixed
seed, the same files always give the same verdict). A kernel and its GEMM take turns within each
repeat, so there the samples are paired: the effect is the change of the median per-repeat ratio,
median(cur_i / cur_ref_i) / median(base_i / base_ref_i) - 1, bootstrapped over those ratios, and
a drift of the clock during a run (which moves both halves of a pair) cancels as well. A machine
uniformly 10% slower changes no effect. The references are shown, never judged. `--absolute`
compares raw medians instead.

Noise band. Identical code measured twice never lands on the same ratio: memory placement, clocks
and the host move it a little each run, beyond what one run's samples show. Each `--noise` file is
a repeat run of the baseline's code; a point's band is the largest |effect| between the baseline
and the repeats (for a point no repeat holds, the largest of any point), and never under
`--noise-floor` (default 1%: three runs of identical code on one H200 moved the graphed step
ratios by up to 1.0% from one another, results/archive/llama8b_graphs_h200-20261129-d519482-*.jsonl).

Verdict on time: a point regressed when both hold:
1. effect >= `--max-slowdown` (5%; less 1e-4, as stored times are rounded): as slow as we care
   about, so a copy with every time x1.05 fails;
2. the interval's lower bound > the band: not an accident of this run's samples, and more than
   identical code drifts.
Why not one rule: the estimate alone would flag a noisy run whose median landed high by chance;
the lower bound against the threshold would pass a real 5% slowdown (its interval straddles 5%).
At the threshold with the lower bound inside the band: "within noise"; as much faster and clear
of the band: "faster". The repeat run always passes against its baseline: its |effect| is its
own band, and the lower bound never exceeds the effect.

Memory: peak allocated GiB growing by more than `--max-memory-growth` (2%) is a regression.
Status: a point that ran in the baseline and fails now (OOM, error...), or is missing from the
current run, is a regression; so a comparison that matches fewer points than the baseline holds
fails and names them. Points new in the current run are listed.

Exit status: 1 when there is a regression, 0 when there is none, 2 when the inputs are unusable
(no file, no record). The Markdown report goes to stdout and, with `--output`, a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.kernels import regress_suite as kernel_suite
from harness.points import (
    REFERENCE_METHOD,
    config_key,
    describe,
    missing,
    options_dict,
    reference_index,
    reference_key,
)
from harness.records import Record, load_records, split_kinds
from harness.report.markup import NONE, Table, fmt_gib, fmt_int, fmt_ms, fmt_pct, to_markdown
from harness.report.names import display_name, sort_key
from harness.report.readme import commit_of
from harness.stats import Effect, relative_change

TOLERANCE = 1e-4  # of the effect: stored times are rounded, so a x1.05 copy lands a hair off 5%
NOISE_FLOOR = 0.01


@dataclass(frozen=True)
class Thresholds:
    """Relative growth allowed before a change counts (0.05 is 5%), and the least noise band."""

    max_slowdown: float = 0.05
    max_memory_growth: float = 0.02
    relative: bool = True
    noise_floor: float = NOISE_FLOOR


# ---------------------------------------------------------------------------------------------
# The two kinds of points


def _debug_options(record: Record) -> dict:
    """The deliberate slowdowns a step record ran with (`debug_*` options that are on)."""
    options = options_dict(record.get("method_options"))
    return {k: v for k, v in options.items() if k.startswith("debug_") and v}


def step_key(record: Record) -> tuple:
    """`config_key` without `debug_*` options: a deliberately slowed point is its twin's point."""
    key = list(config_key(record))
    options = {k: v for k, v in options_dict(key[1]).items() if not k.startswith("debug_")}
    key[1] = json.dumps(options, sort_keys=True, separators=(",", ":"), default=str) if options else ""
    return tuple(key)


def step_samples(record: Record) -> list[float] | None:
    values = record.get("step_times_ms")
    if not missing(values) and values is not None and len(values) > 0:
        return [float(v) for v in values]
    median = record.get("step_time_ms_median")
    return None if missing(median) else [float(median)]


def _step_where(key: tuple, record: Record) -> list[str]:
    d = describe(key)
    cap = NONE if d["memory_cap_gib"] is None else fmt_gib(float(d["memory_cap_gib"]))
    debug = ", ".join(f"{k}={v}" for k, v in sorted(_debug_options(record).items()))
    name = display_name(record) + (f" [{debug}]" if debug else "")
    return [name, str(d["model"]), fmt_int(d["batch_size"]), fmt_int(d["seq_len"])] + [
        str(d["gpu_name"] or NONE),
        "on" if d["activation_checkpointing"] else "off",
        cap,
    ]


def _step_name(where: list[str]) -> str:
    return f"{where[0]} on {where[1]} (batch {where[2]}, seq {where[3]})"


def _kernel_where(key: tuple, record: Record) -> list[str]:
    d = dict(zip(kernel_suite.KEY_FIELDS, key))
    label = kernel_suite.Variant(d["variant"], d["rule"], d["state_dtype"]).label
    slowdown = record.get("debug_slowdown")
    label += f" [debug_slowdown={_pct1(slowdown)}]" if not missing(slowdown) and slowdown else ""
    return [label, str(d["model"]), str(d["shape_name"]), fmt_int(d["T"]), str(d["gpu_name"] or NONE)]


def _kernel_name(where: list[str]) -> str:
    return f"{where[0]} on {where[1]} {where[2]} (T {where[3]})"


def _step_references(records: Sequence[Record]) -> Callable[[Record], Record | None]:
    index = reference_index(records)
    return lambda record: index.get(reference_key(record))


def _kernel_references(records: Sequence[Record]) -> Callable[[Record], Record | None]:
    index = {kernel_suite.reference_key(r): r for r in records if kernel_suite.is_reference(r)}
    return lambda record: index.get(kernel_suite.reference_key(record))


@dataclass(frozen=True, eq=False)
class Kind:
    """How the check matches, references, samples and names one kind of record."""

    title: str
    reference_name: str
    key: Callable[[Record], tuple]
    is_reference: Callable[[Record], bool]
    references: Callable[[Sequence[Record]], Callable[[Record], Record | None]]
    samples: Callable[[Record], list[float] | None]
    where_header: list[str]
    where: Callable[[tuple, Record], list[str]]
    name: Callable[[list[str]], str]
    order: Callable[[tuple], tuple]
    memory: bool  # whether its records carry a peak memory to check
    fmt_ms: Callable[[float | None], str]
    paired: bool = False  # sample i of a point and of its reference were timed back to back


STEPS = Kind(
    title="Training steps",
    reference_name="fused AdamW of the same configuration and step mode",
    key=step_key,
    is_reference=lambda r: r.get("method") == REFERENCE_METHOD,
    references=_step_references,
    samples=step_samples,
    where_header=["Method", "Model", "Batch", "Seq", "GPU", "Ckpt", "Cap GiB"],
    where=_step_where,
    name=_step_name,
    order=sort_key,
    memory=True,
    fmt_ms=fmt_ms,
)
KERNELS = Kind(
    title="Kernels",
    reference_name="the cuBLAS GEMM of the same shape",
    key=kernel_suite.key,
    is_reference=kernel_suite.is_reference,
    references=_kernel_references,
    samples=kernel_suite.samples,
    where_header=["Variant", "Model", "Shape", "T", "GPU"],
    where=_kernel_where,
    name=_kernel_name,
    order=kernel_suite.order,
    memory=False,
    fmt_ms=lambda v: NONE if v is None else f"{v:.4f}",
    paired=True,
)


# ---------------------------------------------------------------------------------------------
# Comparing


@dataclass
class Comparison:
    """One configuration: both records, the measured changes and the verdict."""

    kind: Kind
    key: tuple
    baseline: Record | None
    current: Record | None
    verdict: str = ""
    regression: bool = False
    mode: str = "absolute"
    effect: Effect | None = None
    band: float | None = None
    raw_change: float | None = None
    memory_change: float | None = None


def _ok(record: Record | None) -> bool:
    return record is not None and record.get("status") == "ok"


def _change(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else new / old - 1


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def latest(records: Sequence[Record], key: Callable[[Record], tuple]) -> dict[tuple, Record]:
    """One record per key: the latest by `time`, ties going to the later in the input."""
    chosen: dict[tuple, tuple[str, int, Record]] = {}
    for index, record in enumerate(records):
        stamp = "" if missing(record.get("time")) else str(record.get("time"))
        k = key(record)
        if k not in chosen or (stamp, index) >= chosen[k][:2]:
            chosen[k] = (stamp, index, record)
    return {k: v[2] for k, v in chosen.items()}


def measure_effect(c: Comparison, refs: tuple[Callable, Callable], limits: Thresholds) -> Effect | None:
    """The point's effect (module docstring), relative where both runs hold its reference."""
    kind, base, cur = c.kind, c.baseline, c.current
    sb, sc = kind.samples(base), kind.samples(cur)
    if not sb or not sc:
        return None
    c.raw_change = _change(_median(sc), _median(sb))
    ref_b, ref_c = refs[0](base), refs[1](cur)
    if limits.relative and not kind.is_reference(base) and _ok(ref_b) and _ok(ref_c):
        rb, rc = kind.samples(ref_b), kind.samples(ref_c)
        if rb and rc:
            c.mode = "relative"
            if kind.paired and len(sb) == len(rb) and len(sc) == len(rc):
                return relative_change(_ratios(sb, rb), _ratios(sc, rc))
            return relative_change(sb, sc, rb, rc)
    c.mode = "absolute"
    return relative_change(sb, sc)


def _ratios(times: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per-sample ratios of a point to its reference, where sample i of both was timed back to back."""
    return [t / r for t, r in zip(times, reference)]


def compare_pair(c: Comparison, refs: tuple[Callable, Callable], limits: Thresholds) -> Comparison:
    """Fill in the changes and the verdict of a pair present on both sides."""
    if not _ok(c.baseline) or not _ok(c.current):
        return _status_verdict(c)
    c.effect = measure_effect(c, refs, limits)
    if c.kind.memory:
        c.memory_change = _change(c.current.get("peak_alloc_gib"), c.baseline.get("peak_alloc_gib"))
    return _verdict(c, limits)


def _verdict(c: Comparison, limits: Thresholds) -> Comparison:
    reference = limits.relative and c.kind.is_reference(c.baseline)
    e, band = c.effect, c.band if c.band is not None else limits.noise_floor
    slow_enough = e is not None and e.estimate >= limits.max_slowdown - TOLERANCE
    slow = slow_enough and e.low > band and not reference
    bigger = c.memory_change is not None and c.memory_change > limits.max_memory_growth
    what = [name for name, hit in (("time", slow), ("memory", bigger)) if hit]
    if what:
        c.verdict, c.regression = f"REGRESSION ({', '.join(what)})", True
    elif reference:
        c.verdict = "reference"
    elif slow_enough:
        c.verdict = "within noise"
    elif e is not None and e.estimate <= -limits.max_slowdown and e.high < -band:
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


def _pairs(kind: Kind, baseline: Sequence[Record], current: Sequence[Record]) -> list[Comparison]:
    old, new = latest(baseline, kind.key), latest(current, kind.key)
    keys = sorted(set(old) | set(new), key=kind.order)
    return [Comparison(kind, k, old.get(k), new.get(k)) for k in keys]


def noise_bands(
    kind: Kind, baseline: Sequence[Record], repeats: Sequence[Sequence[Record]], limits: Thresholds
) -> dict[tuple, float]:
    """Per point, the largest |effect| between the baseline and a repeat run of its code."""
    bands: dict[tuple, float] = {}
    for repeat in repeats:
        refs = (kind.references(baseline), kind.references(repeat))
        for c in _pairs(kind, baseline, repeat):
            if _ok(c.baseline) and _ok(c.current) and (e := measure_effect(c, refs, limits)) is not None:
                bands[c.key] = max(bands.get(c.key, 0.0), abs(e.estimate))
    return bands


def _band(key: tuple, bands: Mapping[tuple, float], limits: Thresholds) -> float:
    widest = max(bands.values(), default=0.0)
    return max(limits.noise_floor, bands.get(key, widest))


def compare(
    baseline: Sequence[Record],
    current: Sequence[Record],
    limits: Thresholds,
    repeats: Sequence[Sequence[Record]] = (),
) -> list[Comparison]:
    """Every point on either side, compared; regressions first, then by kind and configuration."""
    out = []
    for kind, (base, cur, reps) in _by_kind(baseline, current, repeats).items():
        refs = (kind.references(base), kind.references(cur))
        bands = noise_bands(kind, base, reps, limits)
        for c in _pairs(kind, base, cur):
            c.band = _band(c.key, bands, limits)
            if c.baseline is None:
                c.verdict = "new (no baseline)"
            elif c.current is None:
                c.verdict, c.regression = "REGRESSION (missing in current)", True
            else:
                compare_pair(c, refs, limits)
            out.append(c)
    return sorted(out, key=lambda c: not c.regression)


def _by_kind(baseline, current, repeats) -> dict[Kind, tuple[list, list, list]]:
    split = [split_kinds(records) for records in (baseline, current, *repeats)]
    by_kind = {}
    for index, kind in enumerate((STEPS, KERNELS)):
        base, cur = split[0][index], split[1][index]
        if base or cur:
            by_kind[kind] = (base, cur, [s[index] for s in split[2:]])
    return by_kind


# ---------------------------------------------------------------------------------------------
# Reporting

STATUS_LABELS = {"oom": "OOM", "error": "error", "diverged": "diverged", "unavailable": "unavailable"}


def _status_word(record: Record) -> str:
    status = str(record.get("status"))
    return STATUS_LABELS.get(status, status)


def _record(c: Comparison) -> Record:
    return c.current or c.baseline or {}


def _ms(c: Comparison, record: Record | None) -> str:
    if not _ok(record):
        return _status_word(record) if record else "missing"
    return c.kind.fmt_ms(_median(c.kind.samples(record)))


def _gib(record: Record | None) -> str:
    if not _ok(record):
        return _status_word(record) if record else "missing"
    return fmt_gib(record.get("peak_alloc_gib"))


def _interval(e: Effect | None) -> str:
    return NONE if e is None else f"{fmt_pct(e.low)} to {fmt_pct(e.high)}"


def _samples(c: Comparison) -> str:
    counts = [len(c.kind.samples(r) or []) if _ok(r) else 0 for r in (c.baseline, c.current)]
    return f"{counts[0]} / {counts[1]}"


def matched_table(kind: Kind, rows: Sequence[Comparison]) -> Table:
    """Every point present on both sides: medians, effect and interval, band, memory, verdict."""
    header = ["Verdict", *kind.where_header, "Baseline ms", "Current ms", "Effect", "95% interval"]
    header += ["Noise band", "Raw change", "Samples", "Mode"]
    if kind.memory:
        header += ["Baseline GiB", "Current GiB", "Memory change"]
    body = []
    for c in rows:
        e = c.effect
        row = [c.verdict, *kind.where(c.key, _record(c)), _ms(c, c.baseline), _ms(c, c.current)]
        row += [fmt_pct(e.estimate if e else None), _interval(e), _pct1(c.band), fmt_pct(c.raw_change)]
        row += [_samples(c), c.mode if e is not None else NONE]
        if kind.memory:
            row += [_gib(c.baseline), _gib(c.current), fmt_pct(c.memory_change)]
        body.append(row)
    n_where = len(kind.where_header)
    align = "l" + "l" * n_where + "rrrrrrrl" + ("rrr" if kind.memory else "")
    return Table(f"regress_{kind.title.lower().replace(' ', '_')}", kind.title, header, body, align=align)


def _pct1(value: float | None) -> str:
    return NONE if value is None else f"{100 * value:.1f}%"


def one_side_table(kind: Kind, rows: Sequence[Comparison]) -> Table:
    """Points measured on one side only, with the status they had there."""
    header = [*kind.where_header, "Baseline", "Current", "Verdict"]
    body = [
        [*kind.where(c.key, _record(c)), _status(c.baseline), _status(c.current), c.verdict] for c in rows
    ]
    return Table("regress_one_side", "Points on one side only", header, body, align="l" * len(header))


def _status(record: Record | None) -> str:
    if record is None:
        return "missing"
    if _ok(record):
        return "ok"
    reason = record.get("error")
    word = _status_word(record)
    return f"{word}: {str(reason).splitlines()[0][:80]}" if reason else word


def _source(label: str, path: str, records: Sequence[Record]) -> str:
    sweeps = sorted({str(r.get("sweep")) for r in records})
    commits = sorted({commit_of(r) for r in records})
    gpus = sorted({str(r.get("gpu_name") or NONE) for r in records})
    return (
        f"- {label}: `{path}`: {len(records)} records; sweep {', '.join(sweeps)}; "
        f"commit {', '.join(commits)}; GPU {', '.join(gpus)}"
    )


def _summary(comparisons: Sequence[Comparison]) -> str:
    matched = [c for c in comparisons if c.baseline is not None and c.current is not None]
    failed = [c for c in comparisons if c.regression]
    if not failed:
        return f"**No regression in {len(matched)} matched points.**"
    names = "; ".join(f"{c.kind.name(c.kind.where(c.key, _record(c)))}: {c.verdict}" for c in failed)
    head = f"**{len(failed)} regression(s) in {len(matched)} matched points"
    if not matched:
        head = f"**No point of the baseline was matched: {len(failed)} regression(s)"
    return f"{head}: {names}.**"


def render(
    comparisons: Sequence[Comparison], limits: Thresholds, sources: Sequence[str] = (), repeats: int = 0
) -> str:
    """The Markdown report: summary, then per kind the matched points (regressions first) and the
    points on one side only."""
    lines = ["# Regression check: step and kernel times, peak memory", "", *sources, ""]
    mode = "as a ratio to a reference of the same run" if limits.relative else "absolute"
    noise = (
        f"the largest |effect| between the baseline and {repeats} repeat run(s) of its code, at least "
        f"{_pct1(limits.noise_floor)}"
        if repeats
        else f"no repeat run given (`--noise`): the floor alone, {_pct1(limits.noise_floor)}"
    )
    lines.append(
        f"A point regressed when its effect (the change of its median, {mode}) is at least "
        f"{_pct1(limits.max_slowdown)} and its 95% interval lies above the noise band ({noise}); "
        f"or its peak allocated memory grew by more than {_pct1(limits.max_memory_growth)}; or it "
        "ran in the baseline and fails or is missing now."
    )
    lines += ["", _summary(comparisons)]
    for kind in (STEPS, KERNELS):
        rows = [c for c in comparisons if c.kind is kind]
        matched = [c for c in rows if c.baseline is not None and c.current is not None]
        one_side = [c for c in rows if c.baseline is None or c.current is None]
        if not rows:
            continue
        lines += ["", f"## {kind.title}", "", f"Reference: {kind.reference_name}."]
        if matched:
            lines += ["", to_markdown(matched_table(kind, matched)).rstrip()]
        if one_side:
            lines += [
                "",
                "Points on one side only:",
                "",
                to_markdown(one_side_table(kind, one_side)).rstrip(),
            ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line


def fraction(text: str) -> float:
    """'5%', '5' or '0.05' -> 0.05."""
    value = float(text.strip().rstrip("%"))
    return value / 100 if text.strip().endswith("%") or value >= 1 else value


REGRESS_EXAMPLES = """\
examples:
  python -m harness regress results/baselines/regress_h200.jsonl ci-results/regress_h200.jsonl \\
      --noise results/baselines/regress_h200-repeat.jsonl
  python -m harness regress results/baselines/kernels_h200.jsonl ci-results/kernels_h200.jsonl \\
      --noise results/baselines/kernels_h200-repeat.jsonl --output kernels-report.md
  python -m harness regress BASE.jsonl CURRENT.jsonl --max-slowdown 3% --absolute
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness regress",
        description="Compare step or kernel times and peak memory of CURRENT results against "
        "BASELINE. Exit status 1 when a point regressed, 0 when none did, 2 when the inputs are "
        "unusable.",
        epilog=REGRESS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("baseline", help="baseline results file or directory (JSONL)")
    parser.add_argument("current", help="current results file or directory (JSONL)")
    parser.add_argument(
        "--noise",
        action="append",
        default=[],
        metavar="REPEAT",
        help="a repeat run of the baseline's code (repeatable): sets the noise band",
    )
    parser.add_argument("--max-slowdown", type=fraction, default=0.05, help="e.g. 5%% (default)")
    parser.add_argument("--max-memory-growth", type=fraction, default=0.02, help="e.g. 2%% (default)")
    parser.add_argument(
        "--noise-floor", type=fraction, default=NOISE_FLOOR, help="the least noise band, 1%% (default)"
    )
    parser.add_argument(
        "--absolute", action="store_true", help="compare raw times, not ratios to a reference"
    )
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    return parser.parse_args(list(argv))


def _load(path: str) -> list[Record]:
    steps, kernels = split_kinds(load_records([path]))
    return steps + kernels


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m harness regress`; returns the exit status (see the docstring)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        baseline, current = _load(args.baseline), _load(args.current)
        repeats = [_load(path) for path in args.noise]
    except (FileNotFoundError, ValueError) as err:
        print(f"regress: {err}", file=sys.stderr)
        return 2
    for label, path, records in (("baseline", args.baseline, baseline), ("current", args.current, current)):
        if not records:
            print(f"regress: no step or kernel records in the {label}, {path}", file=sys.stderr)
            return 2
    limits = Thresholds(args.max_slowdown, args.max_memory_growth, not args.absolute, args.noise_floor)
    comparisons = compare(baseline, current, limits, repeats)
    sources = [_source("Baseline", args.baseline, baseline), _source("Current", args.current, current)]
    sources += [_source("Repeat of the baseline", p, r) for p, r in zip(args.noise, repeats)]
    report = render(comparisons, limits, sources, len(repeats))
    print(report, end="")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
    return 1 if any(c.regression for c in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
