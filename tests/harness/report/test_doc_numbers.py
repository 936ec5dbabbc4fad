"""Every measurement-looking figure of README.md and docs/ is generated, registered or pinned, and a
figure typed over in the prose fails naming the figure and its line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.report import doc_figures, doc_numbers
from harness.report.doc_numbers import check, figures

REPO = Path(__file__).resolve().parents[3]


def test_every_figure_of_the_docs_is_accounted_for():
    assert check(REPO) == []


def _clone(tmp_path: Path) -> Path:
    """README.md and docs/ copied, results/ linked: a tree to plant errors in."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "results").symlink_to(REPO / "results")
    return tmp_path


@pytest.mark.parametrize(
    "doc, right, wrong, figure",
    [
        ("docs/training-recipes.md", "against torch's 47.3,", "against torch's 47.8,", "47.8"),  # registered
        (
            "docs/performance.md",
            "W, m and v (12 bytes a weight)",
            "W, m and v (14 bytes a weight)",
            "14 bytes",
        ),  # pinned
    ],
)
def test_a_figure_typed_over_in_the_prose_is_named_with_its_line(tmp_path, doc, right, wrong, figure):
    root = _clone(tmp_path)
    lines = (root / doc).read_text().splitlines(keepends=True)
    line = next(i for i, row in enumerate(lines, start=1) if right in row)
    lines[line - 1] = lines[line - 1].replace(right, wrong, 1)
    (root / doc).write_text("".join(lines))
    problems = check(root)
    assert any(p.startswith(f"{doc}:{line}: {figure}: a figure that is not generated") for p in problems), (
        problems
    )


@pytest.mark.parametrize("planted", ["3 times faster", "12,000 tokens/s", "42 milliseconds"])
def test_a_planted_figure_in_words_is_caught(tmp_path, planted):
    """A figure whose unit is a word (times, tokens/s, milliseconds) is a figure like 42 ms: planted
    in a sentence, it is named with its line as one nobody accounted for."""
    (tmp_path / "README.md").write_text(f"FORGE trains.\nWith it a step is {planted} than before.\n")
    figure = " ".join(planted.split()[:2]) if planted.endswith("faster") else planted
    assert check(tmp_path, {}) == [
        f"README.md:2: {figure}: a figure that is not generated, registered in"
        " harness/report/doc_figures.py or pinned in harness/report/doc_numbers.json"
    ]


def test_code_links_dates_versions_and_model_names_are_not_figures():
    text = (
        "Llama-3.1-8B on torch 2.11.0, 2026-12-04, `python x.py --lr 0.5`, [a](b/0.25.md), Qwen3-14B\n"
        "took 121.5 ms, 38.1 GiB, 0.88x and 46%, then 0.186.\n"
    )
    assert figures(text) == [(2, "121.5 ms"), (2, "38.1 GiB"), (2, "0.88x"), (2, "46%"), (2, "0.186")]


def test_a_pin_whose_figure_left_its_document_is_named(tmp_path):
    (tmp_path / "README.md").write_text("It took 1.5 ms.\n")
    pinned = {"README.md": doc_numbers.Counter({"1.5 ms": 1, "2.5 ms": 1})}
    assert check(tmp_path, pinned) == [
        "README.md: 2.5 ms is pinned (1 more) but not in the text: edited by hand?"
    ]


def test_a_quoted_figure_whose_results_file_left_the_tree_fails(tmp_path):
    """The compiled torchao FP8 figures of docs/training-recipes.md come from an archived run: with
    that file gone from results/, their sentence cannot be computed (named with the file) and its
    figures are unaccounted for (tests/test_repository.py names the citation too)."""
    gone = "results/archive/fp8_h200-masked-20261202-31a33a4.jsonl"
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copytree(REPO / "results", tmp_path / "results")
    assert check(tmp_path) == [] and doc_figures.check(tmp_path) == []
    (tmp_path / gone).unlink()
    assert any(
        p.startswith(f"docs/training-recipes.md: cannot compute from {gone}")
        for p in doc_figures.check(tmp_path)
    )
    problems = check(tmp_path)
    assert any(
        p.startswith("docs/training-recipes.md:") and ": 144.5 ms: a figure that is not" in p
        for p in problems
    )
