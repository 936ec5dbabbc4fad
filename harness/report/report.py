"""`python -m harness report [RESULTS...]`: render results into reports/ (tables, plots, README).

The procedure:
1. read every results file under RESULTS (default: the committed results under results/: not
   results/baselines/, which holds the regression baseline, nor the scratch folders the harness
   marks as uncommitted, such as results/smoke/);
2. build the sections (`readme.Section`): their tables (`paper_table`, `tables`, `kernel_table`,
   `convergence_table`, `token_tables`), each a `Selection` of a table and the records behind it,
   and plots of what was measured (memory, step time, and on a CPU the loss at each step);
3. write each table as Markdown and LaTeX (booktabs) under reports/tables/, the plots as PNG
   under reports/plots/, and reports/README.md (`readme`), which opens every table with its
   expectation (`preambles`), links the files, and names the hardware, versions, commit and
   config behind it; a report longer than a page a reader scans (the committed one) is an index
   instead, what each section answers with links to its tables and plots, and each section in
   full on its own page under reports/sections/;
4. remove files in reports/tables/, reports/plots/ and reports/sections/ that this run did not
   write (so a table whose data went away does not linger).

`--out` picks another folder. Without it, results that all lie in scratch folders (`python -m
harness report results/smoke`) are rendered beside them, into results/smoke/report/, never over
the committed reports/; other results named without `--out` are refused, before anything is
written, since their report would replace the committed one (step 4 removes what it did not write).

A report is shaped by what ran. The committed report (no RESULTS given) is the map of every
experiment: a section without data says which sweep produces it, and the data-parallel table lists
the points still to measure. A report of the results you name (`python -m harness report
results/smoke`) has the sections of what they hold and nothing else. Either way GPU ceilings are
drawn only for GPU points, and wherever Triton's CPU interpreter ran a method's kernels the table,
its expectation and its step-time plot say that those times mean nothing for speed.

Re-running on the same results gives byte-identical tables and README: rows are sorted, numbers
use fixed formats, nothing reads a clock.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.points import seed_of
from harness.records import Record, is_convergence, load_records, on_cpu, split_kinds
from harness.report import cpu_tables, plots, preambles, token_tables
from harness.report.branch_fidelity_table import branch_fidelity, branch_fidelity_by_start
from harness.report.convergence_table import convergence, convergence_seeds
from harness.report.dp_table import dp_table
from harness.report.fidelity_table import fidelity
from harness.report.kernel_table import SHAPE_ORDER, t4_fp8, t4_kernels
from harness.report.markup import GENERATED, Table, to_latex, to_markdown
from harness.report.muon_table import EXPERIMENT as MUON
from harness.report.muon_table import muon_table
from harness.report.names import display_name
from harness.report.paper_table import paper_comparison
from harness.report.readme import SECTIONS, TITLE, Section, render_pages, report_title
from harness.report.reference_table import preamble as reference_preamble
from harness.report.reference_table import reference_tables
from harness.report.tables import (
    Selection,
    largest_batches,
    other_points,
    t1_llama,
    t2_scaling,
    t3_capacity,
    t5_checkpointing,
    t6_capacity,
    t6_tensor_parallel,
)
from harness.results import in_scratch

SCALING, PEAK = token_tables.SCALING_SWEEP, token_tables.PEAK_SWEEP
DEFAULT_RESULTS = "results"
DEFAULT_OUT = "reports"


# ---------------------------------------------------------------------------------------------
# Building


def build_sections(
    steps: Sequence[Record], kernels: Sequence[Record], out: Path, planned: bool = True
) -> list[Section]:
    """The sections of the report, with tables built and plots drawn into out/plots. `planned`:
    every section, those without data saying how to make it, and the data-parallel points not yet
    measured (the committed report); else only the sections the records fill."""
    sections = [
        _paper_section(paper_comparison(steps)),
        *_reference_section(steps),
        _step_section("t1", "T1: Llama-3.1-8B, memory and step time", "llama8b_h200", t1_llama(steps), out),
        _step_section("t2", "T2: scaling over Qwen3 sizes", "qwen3_scaling_h200", t2_scaling(steps), out),
        _capacity_section(t3_capacity(steps), preambles.model_sizes(steps), out),
        _kernel_section([*t4_kernels(kernels), *filter(None, [t4_fp8(kernels)])], out),
        _step_section(
            "t5", "T5: activation checkpointing", "activation_checkpointing", t5_checkpointing(steps), out
        ),
        *_token_sections(steps, out),
        *_muon_section(steps, planned),
        _tensor_parallel_section(t6_tensor_parallel(steps), t6_capacity(steps), out),
        _data_parallel_section(dp_table(steps), planned),
        _convergence_section(
            convergence(steps),
            [
                convergence_seeds(steps),
                fidelity(steps),
                branch_fidelity(steps),
                branch_fidelity_by_start(steps),
            ],
            out,
        ),
    ]
    used = [r for s in sections for r in s.records]
    heading = "Other measured points" if used else "Measured points"
    rest = other_points([r for r in steps if not on_cpu(r)], used, heading)
    if rest is not None:
        sections.append(_step_section("points", heading, "smoke", rest, out))
    taken = {id(r) for r in used}
    sections += _cpu_sections(
        [r for r in steps if on_cpu(r) and id(r) not in taken and not is_convergence(r)], out
    )
    return sections if planned else [s for s in sections if s.selections]


def _cpu_sections(records: Sequence[Record], out: Path) -> list[Section]:
    """What a CPU run shows (`cpu_tables`), in this order: fidelity and losses, memory a parameter,
    step times; none without CPU points."""
    if not records:
        return []
    hint = _hint("smoke")
    training = Section("training", "Training on a CPU: fidelity to torch.optim, and losses", hint)
    training.selections = [
        s for s in (cpu_tables.fidelity_table(records), cpu_tables.loss_table(records)) if s
    ]
    training.preamble = cpu_tables.FIDELITY_TEXT
    training.provenance = False
    memory = Section("memory", "Memory a parameter", hint, preamble=cpu_tables.MEMORY_TEXT, provenance=False)
    table = preambles.bytes_table(records, name=cpu_tables.cpu_name)
    if table is not None:
        title = "Bytes a parameter each method holds and moves"
        memory.selections = [
            Selection(replace(table, name="bytes_per_param_cpu", title=title), list(records))
        ]
    steps = Section("cpu-steps", "Step times on a CPU: they say nothing about a GPU's speed", hint)
    steps.preamble = cpu_tables.STEP_TEXT
    found = cpu_tables.step_table(records)
    steps.selections = [found] if found else []
    for (model, batch, seq), members in _group(
        records, lambda r: (str(r.get("model")), r.get("batch_size"), r.get("seq_len"))
    ).items():
        stem = f"cpu_{slug(model)}_b{int(batch or 0)}_s{int(seq or 0)}"
        where = f"{model}, batch {int(batch or 0)}, seq {int(seq or 0)}"
        folder = out / "plots"
        if any(r.get("losses") for r in members):
            loss_png = folder / f"{stem}_loss.png"
            title = f"Training loss on a CPU: {where}"
            training.plots.append(plots.loss_per_step(members, title, loss_png, cpu_tables.cpu_name))
        if any(r.get("step_time_ms_median") is not None for r in members):
            title = f"Step time on this CPU (nothing about a GPU's): {where}"
            step_png = folder / f"{stem}_step_time.png"
            steps.plots.append(plots.step_time(members, title, step_png, cpu_tables.cpu_name))
    return [training, memory, steps]


def _step_section(anchor: str, heading: str, exp: str, sel: Selection | None, out: Path) -> Section:
    section = Section(anchor, heading, _hint(exp))
    if sel is None:
        return section
    section.selections = [sel]
    section.preamble = preambles.step_preamble(sel.records)
    if anchor in ("t1", "points"):
        section.plots = _per_point_plots(anchor, sel.records, out)
    elif anchor == "t2":
        section.plots = _scaling_plots(sel.records, out)
    return section


def _paper_section(sel: Selection | None) -> Section:
    """The paper's claims beside ours; without results/paper_h200.jsonl, the line saying how to make it."""
    section = Section("paper", "The paper's claims in its own setting", _hint("paper_h200"))
    if sel is not None:
        section.selections = [sel]
        section.preamble = preambles.step_preamble(sel.records)
    return section


def _reference_section(steps: Sequence[Record]) -> list[Section]:
    """The paper's code beside ours (`reference_table`): only once a `reference_*` sweep has records."""
    selections = reference_tables(steps)
    if not selections:
        return []
    section = Section("reference", "The paper's code and ours", _hint("reference_h200"))
    section.selections = selections
    records = selections[0].records
    section.preamble = "\n\n".join([reference_preamble(records), preambles.step_preamble(records)])
    return [section]


def _hint(exp: str) -> str:
    return f"python -m harness sweep +exp={exp}"


def _group(records: Sequence[Record], key: Callable[[Record], Any]) -> dict[Any, list[Record]]:
    groups: dict[Any, list[Record]] = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    return groups


def _per_point_plots(anchor: str, records: Sequence[Record], out: Path) -> list[Path]:
    """For each (model, GPU, batch, seq) of the table, what its points measured: the memory
    breakdown (on a GPU), the step time, and on a CPU the loss at each step, which is what a CPU
    run shows (every method trains; the interpreter's times say nothing about speed)."""
    paths = []
    groups = _group(
        records,
        lambda r: (str(r.get("model")), _device_name(r), r.get("batch_size"), r.get("seq_len")),
    )
    several_gpus = len({k[1] for k in groups}) > 1
    for (model, gpu, batch, seq), members in groups.items():
        stem = f"{anchor}_{slug(model)}_b{int(batch or 0)}_s{int(seq or 0)}" + (
            f"_{slug(gpu)}" if several_gpus else ""
        )
        gpus = int(members[0].get("gpu_count") or 1)
        where = f"{model}, batch {int(batch or 0)}, seq {int(seq or 0)}"
        where += f"\n{gpu} x {gpus}, tensor parallel (memory per GPU)" if gpus > 1 else f", {gpu}"
        folder = out / "plots"
        if any(r.get("peak_alloc_gib") is not None for r in members):
            paths.append(
                plots.memory_breakdown(members, f"Memory by pool: {where}", folder / f"{stem}_memory.png")
            )
        if any(r.get("step_time_ms_median") is not None for r in members):
            paths.append(plots.step_time(members, f"Step time: {where}", folder / f"{stem}_step_time.png"))
        if any(on_cpu(r) and r.get("losses") for r in members):
            paths.append(plots.loss_per_step(members, f"Training loss: {where}", folder / f"{stem}_loss.png"))
    return paths


def _device_name(record: Record) -> str:
    """The GPU a point ran on, or "CPU"."""
    return "CPU" if on_cpu(record) else str(record.get("gpu_name"))


def _scaling_plots(records: Sequence[Record], out: Path) -> list[Path]:
    paths = []
    for (batch, seq), members in _group(records, lambda r: (r.get("batch_size"), r.get("seq_len"))).items():
        if len({r.get("model") for r in members}) < 2:
            continue  # one size is no curve over sizes
        name = f"t2_memory_vs_size_b{int(batch or 0)}_s{int(seq or 0)}.png"
        title = f"Peak memory vs model size (batch {int(batch or 0)}, seq {int(seq or 0)})"
        paths.append(plots.memory_vs_size(members, title, out / "plots" / name))
    return paths


def _token_sections(steps: Sequence[Record], out: Path) -> list[Section]:
    """The tokens-per-step sections (`token_tables`), each only where its sweep has records: the
    report of results without them is the same as before they existed."""
    sections = []
    overhead = token_tables.overhead_vs_tokens(steps)
    if overhead is not None:
        section = Section("tokens", "FORGE against the floor as tokens per step grow", _hint(SCALING))
        section.selections = [overhead]
        section.preamble = preambles.token_overhead_preamble(overhead.records)
        series, times = token_tables.overhead_series(steps), token_tables.analytic_times(steps)
        section.plots = [plots.overhead_vs_tokens(series, times, out / "plots" / "overhead_vs_tokens.png")]
        by_size = token_tables.overhead_by_size(steps)
        if by_size:
            section.plots.append(plots.overhead_vs_size(by_size, out / "plots" / "overhead_vs_size.png"))
        sections.append(section)
    peak = token_tables.peak_vs_tokens(steps)
    if peak is not None:
        section = Section("peak-tokens", "Peak memory against tokens per step", _hint(PEAK))
        section.selections = [s for s in (peak, token_tables.largest_fit(steps)) if s is not None]
        section.preamble = preambles.token_peak_preamble(peak.records)
        series = token_tables.peak_series(steps)
        capacity = {token_tables.group_of(r): plots.capacity_gib(r) for r in peak.records}
        section.plots = [plots.peak_vs_tokens(series, capacity, out / "plots" / "peak_vs_tokens.png")]
        sections.append(section)
    return sections


def _muon_section(steps: Sequence[Record], planned: bool) -> list[Section]:
    """FORGE Muon against torch Muon (`muon_table`): every point of +exp=muon_h200, `not measured`
    until it runs, in the committed report (`planned`); elsewhere only where the sweep has records."""
    sel = muon_table(steps, planned)
    if sel is None:
        return []
    section = Section("muon", "Muon without a gradient: FORGE Muon against torch Muon", _hint(MUON))
    section.selections = [sel]
    section.preamble = preambles.muon_preamble(steps, planned)
    return [section]


def _capacity_section(sel: Selection | None, sizes: dict[str, float], out: Path) -> Section:
    section = Section("t3", "T3: capacity under a 40 GiB cap", _hint("capacity_a100_40gb"))
    if sel is None:
        return section
    section.selections = [sel]
    section.preamble = preambles.capacity_preamble(sel.records, sizes)
    section.plots = _largest_batch_plots("t3", sel.records, out)
    return section


def _largest_batch_plots(anchor: str, records: Sequence[Record], out: Path) -> list[Path]:
    paths = []
    for (model, gpu, seq, cap, ckpt, allocator), entries in largest_batches(records).items():
        # one plot per search: with and without checkpointing, under each allocator setting
        ac = "_ac" if ckpt else ""
        alloc = f"_{slug(allocator)}" if allocator else ""
        name = f"{anchor}_largest_batch_{slug(str(model))}_s{seq}{ac}{alloc}_cap{slug(f'{cap:g}')}.png"
        title = f"Largest micro-batch under {cap:g} GiB: {model}, seq {seq}"
        title += "\nwith activation checkpointing" if ckpt else ""
        title += f"\nallocator {allocator}" if allocator else ""
        if anchor != "t3":
            title += f"\n{gpu}, each GPU capped"
        paths.append(plots.largest_batch(entries, title, out / "plots" / name))
    return paths


def _tensor_parallel_section(grid: Selection | None, capacity: Selection | None, out: Path) -> Section:
    section = Section("t6", "T6: tensor parallelism over two GPUs", _hint("tp2_h200"))
    section.selections = [sel for sel in (grid, capacity) if sel is not None]
    if grid is not None:
        section.preamble = preambles.tensor_parallel_preamble(grid.records)
        section.plots = _per_point_plots("t6", grid.records, out)
    if capacity is not None:
        section.plots += _largest_batch_plots("t6", capacity.records, out)
    return section


def _data_parallel_section(sel: Selection, planned: bool) -> Section:
    """Every planned data-parallel point, `not measured` until a machine with several GPUs runs it;
    outside the committed report (`planned`), only where some of them were measured."""
    section = Section("dp", "Data parallelism: DDP and FSDP2 over two GPUs", _hint("dp_h200"))
    if planned or sel.records:
        section.selections = [sel]
        section.preamble = preambles.data_parallel_preamble()
    return section


def _kernel_section(sels: list[Selection], out: Path) -> Section:
    section = Section("t4", "T4: the fused kernel against cuBLAS", "python -m harness kernels")
    if not sels:
        return section
    section.selections = sels
    section.preamble = preambles.kernel_preamble([r for s in sels for r in s.records])
    for model, series in kernel_series(sels[0].records).items():
        name = f"t4_kernel_speed_{slug(model)}.png"
        section.plots.append(
            plots.kernel_speed(series, f"Kernel time relative to cuBLAS: {model}", out / "plots" / name)
        )
    return section


def kernel_series(records: Sequence[Record]) -> dict[str, dict[str, dict[str, list[tuple[int, float]]]]]:
    """model -> shape -> variant label -> [(T, time / cuBLAS GEMM time)], sorted by T."""
    gemm = {
        (r.get("model"), r.get("shape_name"), r.get("T")): float(r["time_ms"])
        for r in records
        if r.get("variant") == "cublas_gemm" and r.get("time_ms") and r.get("model")  # not the tuner's
    }
    series: dict[str, dict[str, dict[str, list[tuple[int, float]]]]] = {}
    for r in sorted(records, key=_kernel_order):
        base = gemm.get((r.get("model"), r.get("shape_name"), r.get("T")))
        if r.get("variant") == "cublas_gemm" or not base or not r.get("time_ms"):
            continue
        label = str(r.get("variant"))
        if label == "forge":
            label = f"forge {r.get('rule')} {r.get('state_dtype')}"
        shapes = series.setdefault(str(r.get("model")), {})
        shapes.setdefault(str(r.get("shape_name")), {}).setdefault(label, []).append(
            (int(r["T"]), float(r["time_ms"]) / base)
        )
    return series


def _kernel_order(record: Record) -> tuple:
    shape = record.get("shape_name")
    rank = SHAPE_ORDER.index(shape) if shape in SHAPE_ORDER else len(SHAPE_ORDER)
    return (str(record.get("model")), rank, str(shape), int(record.get("T") or 0))


def _convergence_section(sel: Selection | None, more: list[Selection | None], out: Path) -> Section:
    """The convergence table, then those over seeds (`more`: the seeds' spread, the fidelity verdicts)."""
    section = Section("convergence", "Convergence", _hint("convergence"))
    section.selections = [s for s in (sel, *more) if s is not None]
    if not section.selections:
        return section
    section.preamble = preambles.convergence_preamble()
    for (sweep, model, seed), members in _group(
        sel.records if sel is not None else [],
        lambda r: (str(r.get("sweep")), str(r.get("model")), seed_of(r)),
    ).items():
        members = sorted(members, key=display_name)
        tag = f"_seed{seed}" if seed else ""
        name = f"convergence_{slug(sweep)}_{slug(model)}{tag}.png"
        title = f"Loss curves: {model} ({sweep}{f', seed {seed}' if seed else ''})"
        section.plots.append(plots.convergence_curves(members, title, out / "plots" / name))
    return section


def slug(text: str) -> str:
    """A file-name-safe form of `text`: lower case, runs of other characters as '-'."""
    out, dash = [], False
    for ch in text.lower():
        if ch.isalnum() or ch == ".":
            out.append(ch)
            dash = False
        elif not dash:
            out.append("-")
            dash = True
    return "".join(out).strip("-") or "x"


# ---------------------------------------------------------------------------------------------
# Writing


def write_table(table: Table, out: Path) -> list[Path]:
    """tables/NAME.md and tables/NAME.tex."""
    folder = out / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    md, tex = folder / f"{table.name}.md", folder / f"{table.name}.tex"
    md.write_text(f"{GENERATED}\n\n**{table.title}**\n\n{to_markdown(table)}")
    tex.write_text(to_latex(table))
    return [md, tex]


def prune(out: Path, keep: Sequence[Path]) -> list[Path]:
    """Delete generated files in tables/ and plots/ that this run did not write."""
    kept = {p.resolve() for p in keep}
    removed = []
    for folder, patterns in (("tables", ("*.md", "*.tex")), ("plots", ("*.png",)), (SECTIONS, ("*.md",))):
        for pattern in patterns:
            for path in sorted((out / folder).glob(pattern)):
                if path.resolve() not in kept:
                    path.unlink()
                    removed.append(path)
    return removed


def write_report(
    records: Sequence[Record], out: Path, inputs: Sequence[str], planned: bool = True
) -> list[Path]:
    """Build the sections from `records` (`planned`: every section, see `build_sections`) and write
    tables, plots and README under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    steps, kernels = split_kinds(records)
    sections = build_sections(steps, kernels, out, planned)
    written = [p for s in sections for p in s.plots]
    for section in sections:
        for selection in section.selections:
            written += write_table(selection.table, out)
    command = " ".join(["python -m harness report", *([] if planned else inputs)])
    title = TITLE if planned else report_title(records)
    pages = []
    for name, text in render_pages(sections, inputs, out, command, title).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
        pages.append(out / name)
    prune(out, written + pages)
    return written + pages


def read_records(inputs: Sequence[str], default: bool) -> list[Record]:
    """Records to report. The default input is the committed results: no baselines, no scratch."""
    if default:
        if not Path(inputs[0]).is_dir():
            return []
        return load_records(inputs, exclude_dirs=("baselines",), skip_scratch=True)
    return load_records(inputs)


REPORT_EXAMPLES = """\
examples:
  python -m harness report                           # results/ into reports/
  python -m harness report results/smoke             # a scratch sweep: into results/smoke/report/
  python -m harness report results/llama8b_h200.jsonl --out /tmp/t1
  python -m harness report --check                   # reports/ and the docs' blocks as results/ gives them?
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness report",
        description="Render results (JSONL) into reports/: tables (Markdown, LaTeX), plots (PNG), README.",
        epilog=REPORT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "results",
        nargs="*",
        help=f"results files or directories (default: {DEFAULT_RESULTS}/, less its baselines/ folder)",
    )
    parser.add_argument(
        "--out",
        help=f"output directory (default: {DEFAULT_OUT}/ for the committed results; for results that are all "
        "scratch, such as results/smoke/, a report/ folder inside the first of them; needed for others)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"write nothing: name every file of {DEFAULT_OUT}/ and every generated block of the docs that "
        f"differs from what {DEFAULT_RESULTS}/ gives (alone: no results, no --out)",
    )
    return parser.parse_args(list(argv))


def missing_inputs(inputs: Sequence[str]) -> str | None:
    """'no results at PATH' for the first input that does not exist (with the nearest name beside it,
    for a typo), or None."""
    for given in inputs:
        path = Path(given)
        if path.exists():
            continue
        folder = path.parent if path.parent.is_dir() else Path(".")
        near = difflib.get_close_matches(path.name, [p.name for p in folder.iterdir()], n=1)
        hint = f"; did you mean {folder / near[0]}?" if near else ""
        return f"no results at {given}{hint}"
    return None


def default_out(inputs: Sequence[str], default: bool) -> Path | None:
    """reports/ for the committed results; for scratch results, FOLDER/report/ beside them (scratch
    too), so that rendering a smoke run never replaces the committed report; None for other named
    results, whose report must be given a folder (`--out`)."""
    if default:
        return Path(DEFAULT_OUT)
    folders = [Path(p) if Path(p).is_dir() else Path(p).parent for p in inputs]
    if all(in_scratch(folder) for folder in folders):
        return folders[0] / "report"
    return None


def names_the_committed_results(inputs: Sequence[str]) -> bool:
    """Whether `inputs` is results/ itself (`python -m harness report results/`): the default."""
    return [Path(p).resolve() for p in inputs] == [Path(DEFAULT_RESULTS).resolve()]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m harness report`; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.check:  # `python -m harness report --check` alone goes to `check.main` (harness.report.command)
        print(
            "report: --check compares reports/ with results/ and takes no results or --out", file=sys.stderr
        )
        return 2
    missing = missing_inputs(args.results)
    if missing is not None:
        print(f"report: {missing}", file=sys.stderr)
        return 2
    inputs = args.results or [f"{DEFAULT_RESULTS}/"]
    default = not args.results or names_the_committed_results(args.results)
    out = Path(args.out) if args.out else default_out(inputs, default)
    if out is None:
        print(
            f"report: {DEFAULT_OUT}/ holds the report of all of {DEFAULT_RESULTS}/, and {' '.join(inputs)} "
            f"would replace it; name another folder for this one: --out DIR",
            file=sys.stderr,
        )
        return 2
    try:
        records = read_records(inputs, default)
    except (FileNotFoundError, ValueError) as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    written = write_report(records, out, inputs, planned=default)
    tables = sum(1 for p in written if p.suffix == ".md" and p.parent.name == "tables")
    plots_n = sum(1 for p in written if p.suffix == ".png")
    print(f"report: {len(records)} records -> {tables} tables, {plots_n} plots, {out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
