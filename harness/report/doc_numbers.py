"""Every figure that looks like a measurement in README.md and docs/*.md is accounted for.

A figure in the docs is one of three things:

- generated: inside a generated block (`doc_blocks`), rewritten from its records by `python -m
  harness report` and held to them by `report --check`;
- registered: in a sentence of `doc_figures.FIGURES`, which recomputes it from its results file;
- pinned: listed, per document, in `doc_numbers.json`: quoted by hand from the results file or
  command its sentence names, and held to its text, so that an edit by hand shows up as a figure
  nobody accounted for. A pin does not recompute anything: the figures worth keeping true as the
  results move become registered or generated.

`check` names every figure that is none of these (with its line), and every pin whose figure is
gone from its document, so that a figure typed over (47.3 GiB -> 47.8 GiB) fails twice: the new
figure unaccounted for, the old one missing. Code (fenced or inline), links, dates and versions
are not figures. It also names every results file the prose cites (`results/...`, in backticks,
`{a,b}` for several) that is not in the tree: a figure whose records left the tree is a figure
nobody can check (restore the file from git history, or measure again).

    python -m harness.report.doc_numbers           # the check: what is unaccounted for
    python -m harness.report.doc_numbers --pin     # pin every figure the docs hold now (review the diff)
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from harness.report import doc_blocks, doc_figures

PINS = Path(__file__).with_name("doc_numbers.json")
_NUMBER = r"(?<![\w.,/])(?<![A-Za-z]-)[-+]?\d+(?:,\d{3})*(?:\.\d+)?"
_UNITS = (
    "ms|us|µs|ns|s|milliseconds|microseconds|nanoseconds|seconds|min|minutes|hours"  # time
    "|GiB|MiB|KiB|GB|MB|bytes|TB/s|GB/s|TFLOP/s|TFLOPS"  # memory, bandwidth, rate
    "|tokens/s|tok/s|samples/s|nats|times"  # throughput, loss, "3 times faster"
)
_WORD_UNIT = rf"\s?(?:{_UNITS})(?![\w/])"
FIGURE = re.compile(
    rf"{_NUMBER}(?:[x%](?![\w])|{_WORD_UNIT})"  # 1.01x, 46%, 121.5 ms, 38.1 GiB
    rf"|(?<![\w.,/])(?<![A-Za-z]-)[-+]?\d+\.\d+(?![\d.]*\d)(?![\w])"  # 0.186; not a version, 2.11.0
)
_HIDDEN = (
    re.compile(r"<!-- generated: ([a-z0-9-]+) .*?<!-- end generated: \1 -->", re.S),
    re.compile(r"```.*?```", re.S),
    re.compile(r"`[^`\n]*`"),
    re.compile(r"\]\([^)]*\)"),
    re.compile(r"<!--.*?-->", re.S),
)


def prose(text: str) -> str:
    """`text` with what holds no hand-written figure blanked (blocks, code, links, comments), its
    lines where they were."""
    for pattern in _HIDDEN:
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return text


def figures(text: str) -> list[tuple[int, str]]:
    """(line, figure) for every measurement-looking figure of a document's prose."""
    found = []
    for number, line in enumerate(prose(text).splitlines(), start=1):
        found += [(number, " ".join(m.group(0).split())) for m in FIGURE.finditer(line)]
    return found


def registered(root: Path, doc: str) -> Counter[str]:
    """The figures of `doc`'s registered sentences, as their records give them."""
    counts: Counter[str] = Counter()
    for figure in doc_figures.FIGURES:
        if figure.doc == doc:
            try:
                counts.update(f for _, f in figures(figure.expected(root)))
            except (OSError, LookupError, ValueError):
                continue  # doc_figures.check reports it
    return counts


def pins(path: Path = PINS) -> dict[str, Counter[str]]:
    data = json.loads(path.read_text()) if path.exists() else {}
    return {doc: Counter(counts) for doc, counts in data.items()}


def docs(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in doc_blocks.doc_files(root)]


def check(root: Path, pinned: dict[str, Counter[str]] | None = None) -> list[str]:
    """One line per figure no block, registered sentence or pin accounts for, and per pin whose
    figure has left its document."""
    pinned = pins() if pinned is None else pinned
    problems = []
    for doc in docs(root):
        found = figures((root / doc).read_text())
        free = Counter(f for _, f in found) - registered(root, doc)
        extra = free - pinned.get(doc, Counter())
        for line, figure in found:
            if extra[figure] > 0:
                extra[figure] -= 1
                problems.append(
                    f"{doc}:{line}: {figure}: a figure that is not generated, registered in"
                    " harness/report/doc_figures.py or pinned in harness/report/doc_numbers.json"
                )
        for figure, count in sorted((pinned.get(doc, Counter()) - free).items()):
            problems.append(f"{doc}: {figure} is pinned ({count} more) but not in the text: edited by hand?")
    return problems


def pin(root: Path, path: Path = PINS) -> None:
    """Pin every figure the docs' prose holds now that no registered sentence accounts for."""
    data = {}
    for doc in docs(root):
        free = Counter(f for _, f in figures((root / doc).read_text())) - registered(root, doc)
        if free:
            data[doc] = dict(sorted(free.items()))
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--pin"]:
        pin(Path("."))
        print(f"doc_numbers: pinned the docs' figures in {PINS}; review the diff before committing it")
        return 0
    problems = check(Path("."))
    print("\n".join(problems) or "doc_numbers: every figure of the docs is generated, registered or pinned")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
