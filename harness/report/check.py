"""`python -m harness report --check`: are reports/ and the docs' generated blocks what results/ gives?

Everything under reports/ is written by `python -m harness report` from the committed results, and
so is every generated block of README.md and docs/*.md (`doc_blocks`). A table edited by hand, or
results that moved without a new report, leave the committed text other than what the records give.
This check renders the report again into a scratch folder, compares it with reports/ file by file,
the text byte for byte, and rebuilds the docs' blocks in memory; each difference is named by its
file and its first moved figure (`doc_blocks.first_difference`):

    reports/tables/muon.md: line 9: 47.8 where the records give 47.3 ('| llama3.1-8b | ...')
    reports/plots/overhead_vs_tokens.png: 1093 x 2185 px where its rendering is 1093 x 1885
    reports/tables/old.md: not written by the report (remove it, or restore its records)

A plot is held to its size, not its bytes: another matplotlib draws the same data in other bytes,
and every figure a plot shows is in a table beside it, held byte for byte.

CI runs it after the tests (.ci/run); it reads no clock and writes nothing outside a temporary folder.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness.report import doc_blocks

TEXT = (".md", ".tex")


PARTS = ("README.md", "tables/", "plots/", "sections/")  # what the report writes (regress/ is regress's)


def _files(folder: Path) -> set[str]:
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    return {n for n in names if n.startswith(PARTS)}


def compare(committed: Path, fresh: Path, label: str = "reports") -> list[str]:
    """One line per file that differs between two report folders, naming the first moved figure."""
    problems = []
    ours, theirs = _files(committed), _files(fresh)
    for name in sorted(ours | theirs):
        where = f"{label}/{name}"
        if name not in theirs:
            problems.append(f"{where}: not written by the report (remove it, or restore its records)")
        elif name not in ours:
            problems.append(
                f"{where}: written by the report but not committed (run `python -m harness report`)"
            )
        elif (committed / name).read_bytes() != (fresh / name).read_bytes():
            if name.endswith(TEXT):
                old, new = (committed / name).read_text(), (fresh / name).read_text()
                problems.append(f"{where}: {doc_blocks.first_difference(old, new)}")
            elif png_size(committed / name) != png_size(fresh / name):
                (w0, h0), (w1, h1) = png_size(committed / name), png_size(fresh / name)
                problems.append(f"{where}: {w0} x {h0} px where its rendering is {w1} x {h1}")
    return problems


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its header; (0, 0) for another file."""
    data = path.read_bytes()[:24]
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return (0, 0)
    return struct.unpack(">II", data[16:24])


def check(root: Path = Path("."), reports: str = "reports", results: str = "results") -> list[str]:
    """Every difference between the committed report and docs' blocks and what results/ gives now."""
    from harness.report import report

    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / "reports"
        records = report.read_records([str(root / results) + "/"], default=True)
        report.write_report(records, fresh, [f"{results}/"], planned=True)
        problems = compare(root / reports, fresh, reports)
    return problems + doc_blocks.stale_blocks(root)


def main(argv: Sequence[str] = ()) -> int:
    """Print every difference; 1 if there is any, else 0."""
    problems = check()
    for line in problems:
        print(f"report --check: {line}")
    if problems:
        print("report --check: regenerate with `python -m harness report` and commit what it writes")
        return 1
    print("report --check: reports/ and the docs' generated blocks are what results/ gives")
    return 0
