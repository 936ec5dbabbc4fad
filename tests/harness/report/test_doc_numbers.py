"""Every measurement-looking figure of README.md and docs/ is generated, registered or pinned, and a
figure typed over in the prose fails naming the figure and its line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.report import doc_numbers
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
    "doc, right, wrong",
    [
        ("docs/training-recipes.md", "against torch's 47.3,", "against torch's 47.8,"),  # registered
        ("docs/performance.md", "took 0.186-0.191", "took 0.168-0.191"),  # pinned
    ],
)
def test_a_figure_typed_over_in_the_prose_is_named_with_its_line(tmp_path, doc, right, wrong):
    root = _clone(tmp_path)
    text = (root / doc).read_text()
    flat = " ".join(text.split())
    assert right in flat, right
    # the planted sentence may wrap: replace the figure where the words around it stand
    old, new = (
        right.split()[-1 if right.endswith(",") else 1],
        wrong.split()[-1 if wrong.endswith(",") else 1],
    )
    line = next(i for i, row in enumerate(text.splitlines(), start=1) if old in row)
    lines = text.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    (root / doc).write_text("".join(lines))
    problems = check(root)
    figure = new.strip(",").split("-")[0]
    assert any(p.startswith(f"{doc}:{line}: {figure}: a figure that is not generated") for p in problems), (
        problems
    )


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
