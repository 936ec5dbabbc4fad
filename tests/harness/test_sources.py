"""harness.sources: the one list of the results files the report and the docs read."""

import re
from pathlib import Path

import pytest

from harness import sources

REPO = Path(__file__).resolve().parents[2]


def _named() -> dict[str, str]:
    """Every path the manifest names: its constants and the members of its tuples."""
    named = {}
    for name, value in vars(sources).items():
        if name.isupper() and isinstance(value, str):
            named[name] = value
        elif name.isupper() and isinstance(value, tuple):
            named.update({f"{name}[{i}]": v for i, v in enumerate(value)})
    return named


@pytest.mark.parametrize("name", sorted(_named()))
def test_every_named_source_is_in_the_tree(name):
    path = _named()[name]
    if name == "OUT" or path in sources.NOT_MEASURED_YET:  # a probe's scratch output; a run to come
        return
    matches = list(REPO.glob(path.replace("{}", "*"))) if "{}" in path or "*" in path else [REPO / path]
    assert matches and all(m.exists() for m in matches), f"{name} = {path!r}: nothing there"


def test_no_module_but_the_manifest_spells_a_results_path():
    """A results file the harness reads or writes by default is named in harness.sources alone."""
    spelled = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "harness").rglob("*.py"))
        if path.name != "sources.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"[\"']results/", line)
    ]
    assert not spelled, f"name these in harness.sources: {spelled}"
