"""reports/README.md: the report a reader opens, written from the built sections.

For each section, in this order: the expectation (what the numbers should be, before them), the
measured table inline with links to its Markdown and LaTeX files, the plots, and what produced
the numbers: every (sweep, GPU, driver, CUDA, torch, triton, transformers, commit) behind the
table with its point count, and the resolved config those points share (keys that differ from
point to point are named). A section without data says which command produces it.
A report longer than INLINE_LINES (the committed one) becomes an index a reader scans: per
section, the question its tables answer and links to them and its plots; each section in full is
a page of its own under sections/ (`render_pages`).

The text depends only on the records and the input paths, never on the clock, so re-running the
report on the same results rewrites the same bytes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.records import Record, on_cpu
from harness.report.markup import GENERATED, NONE, Table, to_markdown
from harness.report.tables import Selection

ENV_COLUMNS = (
    ("Driver", ("driver", "driver_version", "nvidia_driver")),
    ("CUDA", ("cuda", "cuda_version")),
    ("torch", ("torch", "torch_version")),
    ("triton", ("triton", "triton_version")),
    ("transformers", ("transformers", "transformers_version")),
    ("Commit", ("commit", "git_commit")),
)
PER_POINT_KEYS = {"method", "method_options", "batch_size", "seq_len", "point", "memory_cap_gib"}


@dataclass
class Section:
    """One heading of reports/README.md: expectation, tables, plots, and what produced them."""

    anchor: str
    heading: str
    hint: str  # the command that produces this section's data
    preamble: str = ""
    selections: list[Selection] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    provenance: bool = True  # False: a later section names the sources and config of this one's too

    @property
    def records(self) -> list[Record]:
        return [r for s in self.selections for r in s.records]


def _env(record: Record) -> Mapping[str, Any]:
    env = record.get("env")
    return env if isinstance(env, Mapping) else {}


def _first(env: Mapping[str, Any], names: Sequence[str]) -> str:
    """The first of `names` that `env` has; a commit shortened, and marked when the tree was dirty."""
    for name in names:
        if env.get(name) not in (None, ""):
            value = str(env[name])
            if name not in ("commit", "git_commit"):
                return value
            return value[:12] + (" (dirty)" if env.get("git_dirty") else "")
    return NONE


def commit_of(record: Record) -> str:
    """A record's git commit as the reports show it."""
    return _first(_env(record), ("commit", "git_commit"))


def _gpu(record: Record) -> str:
    env = _env(record)
    name = record.get("gpu_name") or env.get("gpu_name") or env.get("gpu") or NONE
    count = record.get("gpu_count") or env.get("gpu_count")
    return f"{count} x {name}" if count and int(count) > 1 else str(name)


def sources_table(records: Sequence[Record]) -> Table | None:
    """Who measured what: one row per (sweep, GPU, versions, commit) with its point count."""
    counts: dict[tuple[str, ...], int] = {}
    for record in records:
        env = _env(record)
        row = (str(record.get("sweep") or NONE), _gpu(record)) + tuple(
            _first(env, names) for _, names in ENV_COLUMNS
        )
        counts[row] = counts.get(row, 0) + 1
    if not counts:
        return None
    rows = [list(row) + [str(n)] for row, n in sorted(counts.items())]
    header = ["Sweep", "GPU"] + [name for name, _ in ENV_COLUMNS] + ["Points"]
    return Table("sources", "Sources", header, rows, align="ll" + "l" * len(ENV_COLUMNS) + "r")


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as {'a.b': 'json value'}."""
    if isinstance(config, Mapping):
        out: dict[str, str] = {}
        for key in sorted(config, key=str):
            out.update(flatten(config[key], f"{prefix}{key}."))
        return out
    return {prefix[:-1]: json.dumps(config, sort_keys=True, default=str)} if prefix else {}


@functools.cache
def default_config() -> dict[str, str]:
    """conf/config.yaml with no overrides, flattened: what a run gets unless told otherwise."""
    from harness.run.config import compose_config, to_dict

    return flatten(to_dict(compose_config([])))


def config_summary(records: Sequence[Record], defaults: Mapping[str, str] | None = None) -> str:
    """The config keys every record shares where they differ from the defaults (`default_config`:
    a setting nobody changed says nothing about the run), and the names of those that vary."""
    configs = [flatten(r["config"]) for r in records if isinstance(r.get("config"), Mapping)]
    if not configs:
        return "No resolved config recorded."
    defaults = default_config() if defaults is None else defaults
    keys = sorted(set().union(*configs))
    shared = {k: configs[0].get(k) for k in keys if all(c.get(k) == configs[0].get(k) for c in configs)}
    varying = list(dict.fromkeys(".".join(k.split(".")[:2]) for k in keys if k not in shared))
    lines = [
        f"- `{k}`: `{v}`"
        for k, v in shared.items()
        if v not in (None, "null") and k.split(".")[-1] not in PER_POINT_KEYS and defaults.get(k) != v
    ]
    text = "Config shared by every point, where it differs from conf/config.yaml's defaults:\n\n"
    text += "\n".join(lines) if lines else "- (none)"
    if varying:
        text += "\n\nVaries between points: " + ", ".join(f"`{k}`" for k in varying)
    return text


def _provenance(records: Sequence[Record], shown: Table | None = None) -> str:
    """What produced a section: its sources (unless they are `shown` already, the report's own
    table) and config."""
    parts = ["**Behind this table.**"]
    table = sources_table(records)
    if table is not None and (shown is None or table.rows != shown.rows):
        parts.append(to_markdown(table).rstrip())
    parts.append(f"<details><summary>Config</summary>\n\n{config_summary(records)}\n\n</details>")
    return "\n\n".join(parts)


def _links(name: str, up: str = "") -> str:
    return f"[Markdown]({up}tables/{name}.md) · [LaTeX]({up}tables/{name}.tex)"


# What each section's tables answer, by anchor: the line the index gives each section.
QUESTIONS = {
    "paper": "Do the paper's memory and step-time claims hold in its own setting (fp32 gradients)?",
    "reference": "Is this repository's FORGE as fast, as small and as exact as the paper's own code?",
    "t1": "What does each method cost on Llama-3.1-8B, in peak memory and step time, against fused AdamW?",
    "t2": "How do memory and step time move with the model's size, Qwen3 0.6B to 14B?",
    "t3": "Under a 40 GiB cap, how large a micro-batch does each method fit, and at what throughput?",
    "t4": "How fast is the fused dW-GEMM + update kernel against cuBLAS's GEMM, alone and with AdamW?",
    "t5": "Does FORGE compose with activation checkpointing, and what does it save there?",
    "tokens": "How far is each method's step above the no-optimizer floor as the tokens per step grow?",
    "peak-tokens": "How does the peak grow with the tokens per step, and what is the largest step that fits?",
    "muon": "What does FORGE's Muon save against torch's Muon, and at what step time?",
    "t6": "Does FORGE keep its saving under tensor parallelism over two GPUs?",
    "dp": "Under DDP and FSDP2, what does FORGE hold per GPU against fused AdamW?",
    "convergence": "Do FORGE's losses follow the reference's, over seeds and branches?",
    "points": "What did the points no table above holds measure?",
    "training": "On a CPU, does each method train like its torch.optim reference, within its bounds?",
    "memory": "What does each method hold and move, in bytes a parameter?",
    "cpu-steps": "How long did each step take on this CPU (which says nothing about a GPU)?",
}


def section_markdown(section: Section, out: Path, shown: Table | None = None, up: str = "") -> str:
    """One section in full (`shown`: the sources table the report opens with; `up`: the path from
    the page it is written on to the report's folder)."""
    parts = [f'<a id="{section.anchor}"></a>\n## {section.heading}']
    if not section.selections:
        parts.append(
            f"No results yet. Produce them with `{section.hint}` on the GPU, then re-run the report."
        )
        return "\n\n".join(parts)
    if section.preamble:
        parts.append(f"**Expectation.** {section.preamble}")
    for selection in section.selections:
        table = selection.table
        parts.append(f"**{table.title}** ({_links(table.name, up)})\n\n{to_markdown(table).rstrip()}")
    for plot in section.plots:
        rel = plot.relative_to(out).as_posix()
        parts.append(f"![{plot.stem}]({up}{rel})")
    if section.provenance:
        parts.append(_provenance(section.records, shown))
    return "\n\n".join(parts)


def section_entry(section: Section, out: Path) -> str:
    """One section as the index lists it: what it answers, its tables and plots as links, and the
    page that holds it in full."""
    parts = [f'<a id="{section.anchor}"></a>\n## {section.heading}']
    if not section.selections:
        parts.append(
            f"No results yet. Produce them with `{section.hint}` on the GPU, then re-run the report."
        )
        return "\n\n".join(parts)
    lines = [
        f"- [{s.table.title}](tables/{s.table.name}.md) ([LaTeX](tables/{s.table.name}.tex))"
        for s in section.selections
    ]
    if section.plots:
        plots = ", ".join(f"[{p.stem}]({p.relative_to(out).as_posix()})" for p in section.plots)
        lines.append(f"- Plots: {plots}")
    lines.append(
        f"- The expectation, the tables, the plots and what produced them: [{SECTIONS}/{section.anchor}.md]"
        f"({SECTIONS}/{section.anchor}.md)"
    )
    question = QUESTIONS.get(section.anchor)
    return "\n\n".join(parts + ([question] if question else []) + ["\n".join(lines)])


SECTIONS = "sections"  # the folder of the section pages, where the report is too long for one page
INLINE_LINES = 600  # the longest report written as one page


TITLE = "FORGE benchmark reports"  # the committed report's: every experiment's section
CPU_INTRO = (
    "On a CPU a run shows whether each method trains like the torch.optim rule it stands for, and "
    "what it holds a parameter; its step times say nothing about a GPU's. Ratios compare a method "
    "with the torch method it replaces, measured in the same sweep at the same configuration and "
    "named as it ran."
)
GPU_INTRO = "Ratios compare with fused AdamW measured in the same sweep at the same configuration."


def report_title(records: Sequence[Record]) -> str:
    """The title of a report of the results a user named: their sweeps, and where they ran."""
    sweeps = sorted({str(r.get("sweep")) for r in records if r.get("sweep")}) or ["unnamed"]
    where = " on a CPU" if records and all(on_cpu(r) for r in records) else ""
    plural = "sweeps" if len(sweeps) > 1 else "sweep"
    return f"The {', '.join(sweeps)} {plural}{where}"


def _head(sections: Sequence[Section], inputs: Sequence[str], command: str, title: str = TITLE) -> list[str]:
    records = [r for s in sections for r in s.records]
    intro = CPU_INTRO if records and all(on_cpu(r) for r in records) else GPU_INTRO
    head = [
        GENERATED,
        f"# {title}",
        (
            f"Regenerate with `{command}` (reads "
            + ", ".join(f"`{p}`" for p in inputs)
            + "). Tables are in `tables/` as Markdown and LaTeX (booktabs), plots in `plots/` as PNG. "
            "A point that did not run shows its status (OOM, error, unavailable, diverged) in every "
            "measured cell, never a zero; '—' means not measured on that device or not applicable. " + intro
        ),
    ]
    if len(sections) > 1:
        head.append("Contents: " + " · ".join(f"[{s.heading}](#{s.anchor})" for s in sections))
    return head


def _sources(sections: Sequence[Section]) -> Table | None:
    return sources_table(list({id(r): r for s in sections for r in s.records}.values()))


def render(
    sections: Sequence[Section],
    inputs: Sequence[str],
    out: Path,
    command: str = "python -m harness report",
    title: str = TITLE,
) -> str:
    """The whole report on one page; `command` is the one that regenerates it."""
    head, table = _head(sections, inputs, command, title), _sources(sections)
    if table is not None:
        head.append("## Hardware and software\n\n" + to_markdown(table).rstrip())
    return "\n\n".join(head + [section_markdown(s, out, table) for s in sections]) + "\n"


def render_pages(
    sections: Sequence[Section],
    inputs: Sequence[str],
    out: Path,
    command: str = "python -m harness report",
    title: str = TITLE,
) -> dict[str, str]:
    """{path under `out`: text}: README.md alone where the report fits INLINE_LINES; else README.md
    as an index (what each section answers, links to its tables and plots) and one page a section
    under sections/."""
    whole = render(sections, inputs, out, command, title)
    if len(whole.splitlines()) <= INLINE_LINES:
        return {"README.md": whole}
    head, table = _head(sections, inputs, command, title), _sources(sections)
    if table is not None:
        head.append("## Hardware and software\n\n" + to_markdown(table).rstrip())
    pages = {"README.md": "\n\n".join(head + [section_entry(s, out) for s in sections]) + "\n"}
    for s in sections:
        if s.selections:
            back = f"[All reports](../README.md) · regenerate with `{command}`"
            body = section_markdown(s, out, None, up="../")
            pages[f"{SECTIONS}/{s.anchor}.md"] = f"{GENERATED}\n\n{back}\n\n{body}\n"
    return pages
