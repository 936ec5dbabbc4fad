"""Generated blocks of README.md and docs/*.md: the measured tables there are written from results/.

A figure typed into prose drifts from the records it came from. So the tables of the README and
the docs are blocks between two marker comments, which `python -m harness report` rewrites from the
results files each time it renders reports/:

    <!-- generated: llama8b-headline (python -m harness report writes this block from results/) -->
    | Method | graphed ms | ...
    <!-- end generated: llama8b-headline -->

The name picks the builder in `BLOCKS` (`doc_tables`: tables of one run each; `doc_probes`: the
kernel lab's probe records); everything between the markers is the builder's output, so an edit by
hand there does not survive the next report, and `stale_blocks` (what the tests run) names every
block whose text differs from what the records give now. Prose outside the blocks that quotes a
figure is held to its records by `doc_figures`.

`python -m harness report` with no arguments (the committed results into reports/) rewrites the
blocks after the report; with arguments (a scratch run, another output folder) it leaves the docs
alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from harness.report import doc_probes, doc_tables

DOCS = ("README.md", "docs/*.md")  # the files whose blocks are generated, relative to the root
BEGIN = "<!-- generated: {name} (python -m harness report writes this block from results/) -->"
END = "<!-- end generated: {name} -->"
_BEGIN = re.compile(
    r"<!-- generated: ([a-z0-9-]+) \(python -m harness report writes this block from results/\) -->"
)
_END = re.compile(r"<!-- end generated: ([a-z0-9-]+) -->")

BLOCKS: dict[str, Callable[[Path], str]] = {
    "llama8b-headline": doc_tables.llama8b_headline,
    "paper-setting": doc_tables.paper_setting,
    "paper-claims": doc_tables.paper_claims,
    "tokens-llama": doc_tables.tokens_llama,
    "tokens-peaks": doc_tables.tokens_peaks,
    **doc_tables.PERFORMANCE_BLOCKS,
    "eager-host": doc_tables.eager_host,
    **doc_probes.BLOCKS,
}


class BlockError(ValueError):
    """A marker without its pair, or a block name no builder has."""


def doc_files(root: Path) -> list[Path]:
    """README.md and every docs/*.md under `root`, sorted."""
    return sorted(p for pattern in DOCS for p in root.glob(pattern) if p.is_file())


def block_names(text: str) -> list[str]:
    """The names of the generated blocks of a text, in order."""
    return _BEGIN.findall(text)


def render(
    text: str, root: Path, builders: dict[str, Callable[[Path], str]] = BLOCKS, where: str = ""
) -> str:
    """`text` with every generated block rebuilt from the results under `root`; a BlockError
    (naming the file and line) for an unknown name or a marker without its pair."""
    out, pos, cache, ends = [], 0, {}, set()
    for match in _BEGIN.finditer(text):
        name, line = match.group(1), text.count("\n", 0, match.start()) + 1
        if match.start() < pos:
            raise BlockError(f"{where}:{line}: block {name!r} starts inside the block before it")
        end = _END.search(text, match.end())
        if end is None or end.group(1) != name:
            raise BlockError(f"{where}:{line}: block {name!r} has no `{END.format(name=name)}` after it")
        if name not in builders:
            raise BlockError(
                f"{where}:{line}: no builder for block {name!r}; known: {', '.join(sorted(builders))}"
            )
        if name not in cache:
            cache[name] = builders[name](root).strip()
        out += [text[pos : match.end()], "\n", cache[name], "\n"]
        pos = end.start()
        ends.add(end.start())
    stray = [m for m in _END.finditer(text) if m.start() not in ends]
    if stray:
        line = text.count("\n", 0, stray[0].start()) + 1
        raise BlockError(f"{where}:{line}: `end generated: {stray[0].group(1)}` without its start")
    return "".join(out) + text[pos:]


def stale_blocks(root: Path, builders: dict[str, Callable[[Path], str]] = BLOCKS) -> list[str]:
    """'README.md: llama8b-headline: line 5: 123.1 where the records give 121.5 (...)' for every
    block whose committed text differs from its rebuild: the block, and the first figure that moved."""
    stale = []
    for path in doc_files(root):
        text = path.read_text()
        fresh = render(text, root, builders, where=str(path.relative_to(root)))
        if fresh != text:
            for name in block_names(text):
                old, new = _block(text, name), _block(fresh, name)
                if old != new:
                    line = text.count("\n", 0, text.index(BEGIN.format(name=name))) + 1
                    stale.append(f"{path.relative_to(root)}: {name}: {first_difference(old, new, line)}")
    return stale


_FIGURE = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?[a-zA-Z%]*")


def first_difference(committed: str, fresh: str, first_line: int = 1) -> str:
    """Where two renderings of one text part, as a reader would look for it: 'line N: 123.1 where
    the records give 121.5 (the line as the records give it)', or the line alone where no figure
    differs (a word, a row more or less)."""
    old, new = committed.splitlines(), fresh.splitlines()
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else ""
        b = new[i] if i < len(new) else ""
        if a == b:
            continue
        moved = [(x, y) for x, y in zip(_FIGURE.findall(a), _FIGURE.findall(b)) if x != y]
        where = f"line {first_line + i}"
        if moved:
            return f"{where}: {moved[0][0]} where the records give {moved[0][1]} ({b.strip()[:160]!r})"
        at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        start = max(0, at - 40)
        return f"{where} reads {a[start : at + 60]!r}; the records give {b[start : at + 60]!r}"
    return "the same lines, other line endings"


def _block(text: str, name: str) -> str:
    start = text.index(BEGIN.format(name=name))
    return text[start : text.index(END.format(name=name), start)]


def write_blocks(root: Path, builders: dict[str, Callable[[Path], str]] = BLOCKS) -> list[Path]:
    """Rewrite the generated blocks of README.md and docs/*.md; the files that changed."""
    changed = []
    for path in doc_files(root):
        text = path.read_text()
        fresh = render(text, root, builders, where=str(path.relative_to(root)))
        if fresh != text:
            path.write_text(fresh)
            changed.append(path)
    return changed
