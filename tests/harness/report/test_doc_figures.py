"""Figures quoted in the prose of README.md and docs/: each registered sentence holds as its results
file gives it, and a deliberately wrong figure fails the check."""

from __future__ import annotations

from pathlib import Path

from harness.report.doc_figures import FIGURES, Figure, check

REPO = Path(__file__).resolve().parents[3]


def test_every_registered_figure_is_in_its_document_as_its_records_give_it():
    assert check(REPO) == []
    assert {f.doc for f in FIGURES} >= {"README.md", "docs/performance.md"}


def test_every_registered_source_file_exists():
    for figure in FIGURES:
        for source in figure.source.split(", "):
            if "*" not in source:
                assert (REPO / source).exists(), f"{figure.doc} cites {source}, which is not in the tree"


def _mirror(tmp_path: Path, doc: str, text: str) -> Path:
    """A root holding one edited document and the repository's results."""
    (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / doc).write_text(text)
    (tmp_path / "results").symlink_to(REPO / "results")
    return tmp_path


def test_a_figure_edited_by_hand_in_the_prose_fails_naming_what_the_records_give(tmp_path):
    doc = "docs/performance.md"
    text = (REPO / doc).read_text()
    figure = next(f for f in FIGURES if f.doc == doc and "Operand reads" in f.text)
    right = figure.expected(REPO)
    wrong = right.replace("cost ", "cost 1", 1)  # 11-19% becomes 111-19%
    root = _mirror(tmp_path, doc, text.replace(right, wrong))
    assert check(root, [figure]) == [f"{doc}: expected, from {figure.source}: {right!r}"]


def test_the_check_reads_across_line_breaks_and_fails_on_a_wrong_ratio(tmp_path):
    figure = Figure(
        "README.md", "FORGE int8 is {} the\nbaseline's graphed step", "synthetic", lambda root: ["1.01x"]
    )
    (tmp_path / "README.md").write_text("FORGE int8 is 1.01x the baseline's\n  graphed step.\n")
    assert check(tmp_path, [figure]) == []
    (tmp_path / "README.md").write_text("FORGE int8 is 1.02x the baseline's graphed step.\n")
    assert check(tmp_path, [figure]) == [
        'README.md: expected, from synthetic: "FORGE int8 is 1.01x the\\nbaseline\'s graphed step"'
    ]


def test_a_figure_whose_records_are_gone_is_reported_not_skipped(tmp_path):
    def gone(root: Path) -> list[str]:
        raise FileNotFoundError("results/none.jsonl")

    (tmp_path / "README.md").write_text("x\n")
    assert check(tmp_path, [Figure("README.md", "{}", "results/none.jsonl", gone)]) == [
        "README.md: cannot compute from results/none.jsonl: results/none.jsonl"
    ]
