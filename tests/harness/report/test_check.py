"""`python -m harness report --check`: the committed reports/ and the docs' generated blocks are what
results/ gives, and a figure edited by hand in a committed table fails naming its file and figure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.report import check

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """The report as `python -m harness report` renders it from the committed results."""
    from harness.report import report

    out = tmp_path_factory.mktemp("fresh") / "reports"
    records = report.read_records([str(REPO / "results") + "/"], default=True)
    report.write_report(records, out, ["results/"], planned=True)
    return out


def test_the_committed_report_is_what_the_results_give(fresh):
    assert check.compare(REPO / "reports", fresh) == [], "run `python -m harness report` and commit it"


@pytest.mark.parametrize(
    "name, right, wrong",
    [("tables/paper_comparison.md", "(0.46x)", "(0.44x)"), ("tables/muon.md", "| 47.3 |", "| 47.8 |")],
)
def test_a_figure_edited_in_a_committed_table_is_named(fresh, tmp_path, name, right, wrong):
    committed = tmp_path / "reports"
    shutil.copytree(fresh, committed)
    text = (committed / name).read_text()
    assert right in text
    (committed / name).write_text(text.replace(right, wrong, 1))
    (problem,) = check.compare(committed, fresh)
    figure = lambda s: s.strip("()| ")  # noqa: E731
    assert problem.startswith(f"reports/{name}: line ")
    assert f": {figure(wrong)} where the records give {figure(right)} (" in problem


def test_a_file_the_report_does_not_write_and_a_plot_of_another_size_are_named(fresh, tmp_path):
    committed = tmp_path / "reports"
    shutil.copytree(fresh, committed)
    (committed / "tables" / "gone.md").write_text("| x |\n")
    plot = committed / "plots" / "overhead_vs_tokens.png"
    data = bytearray(plot.read_bytes())
    width, height = check.png_size(plot)
    data[20:24] = (2185).to_bytes(4, "big")  # the plot as tall as it was before its height was capped
    plot.write_bytes(bytes(data))
    assert check.compare(committed, fresh) == [
        f"reports/plots/overhead_vs_tokens.png: {width} x 2185 px where its rendering is {width} x {height}",
        "reports/tables/gone.md: not written by the report (remove it, or restore its records)",
    ]
