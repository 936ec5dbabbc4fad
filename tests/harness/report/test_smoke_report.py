"""The report of a smoke run (`python -m harness report results/smoke`), as a newcomer reads it:
every ratio divides by the baseline its column or footnote names, no internal name in an anchor or
file name, every series of a plot its own colour and marker, the hardware table once, no column of
zeros, and a config that lists what the run changed, not every default."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from harness.report import plots, report
from harness.report.readme import default_config
from harness.run.config import compose_config, to_dict
from tests.harness import FIXTURES

LABELS = ["adamw_in_backward", "lomo", "muon", "forge_int8", "forge_fp32", "forge_muon", "sgd", "lion"]


def _smoke_records() -> list[dict]:
    """The fixture's smoke run, widened to what `+exp=smoke` records now: more methods than a
    colour cycle has colours, each with its own losses, and FP8 points compared among themselves."""
    config = to_dict(compose_config(["+exp=smoke"]))  # as the sweep resolves it
    records = [json.loads(line) for line in (FIXTURES / "smoke.jsonl").read_text().splitlines()]
    for r in records:
        r["config"] = dict(copy.deepcopy(config), method={"name": r["method"], "label": r["method_label"]})
    fused = next(r for r in records if r["method_label"] == "fused_adamw")
    for i, label in enumerate(LABELS + [f"variant_{k}" for k in range(6)]):
        r = copy.deepcopy(fused)
        r.update(method=label, method_label=label, point=f"{label}/tiny-llama/b1/s32")
        r.update(step_time_ms_median=6.0 + i)
        r["losses"] = [5.52, 5.3 - 0.01 * i, 5.1 - 0.01 * i]
        records.append(r)
    for label, method, ms in (("fused_adamw_fp8", "fused_adamw", 8.0), ("forge_fp8", "forge", 12.0)):
        r = copy.deepcopy(fused)
        r.update(
            method=method, method_label=label, point=f"{label}/tiny-llama/b1/s32", step_time_ms_median=ms
        )
        r["method_options"] = dict(r["method_options"], fp8="tensorwise")
        r["losses"] = [5.52, 5.2, 5.0 + ms / 100]
        records.append(r)
    return records


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, dict[str, list[tuple[str, str]]]]:
    """The rendered smoke report, and the (colour, marker) of every labelled line of each plot."""
    root = tmp_path_factory.mktemp("clone")
    scratch = root / "results" / "smoke"
    scratch.mkdir(parents=True)
    (scratch / ".gitignore").write_text("*\n")
    (scratch / "smoke.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _smoke_records()))
    styles: dict[str, list[tuple[str, str]]] = {}
    save = plots.save

    def spy(fig, path):
        lines = [line for ax in fig.axes for line in ax.get_lines() if not line.get_label().startswith("_")]
        styles[path.name] = [(str(line.get_color()), str(line.get_marker())) for line in lines]
        return save(fig, path)

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(plots, "save", spy)
        assert report.main(["results/smoke"]) == 0
    return scratch / "report", styles


def _tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of a text, as rows of cells (the header first, the rule dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not re.match(r"^\|[:\-| ]+\|$", line):
                current.append([c.strip() for c in line.strip("|").split(" | ")])
        elif current:
            tables.append(current)
            current = []
    return tables


def test_every_ratio_divides_by_the_baseline_its_column_or_footnote_names(smoke):
    out, _ = smoke
    text = (out / "tables" / "points.md").read_text()
    header, *rows = _tables(text)[0]
    col, step = header.index("Step time vs fused AdamW"), header.index("Step ms (median)")
    method = header.index("Method")
    steps = {(r[0], r[method].split(" [")[0]): float(r[step]) for r in rows if r[step][0].isdigit()}
    notes = dict(re.findall(r"^\[(\d+)\] Against (\S+),", text, re.M))
    checked = 0
    for r in rows:
        found = re.match(r"^([\d.]+)x(?: \[(\d+)\])?", r[col])
        if not found:
            continue
        baseline = notes.get(found.group(2) or "", "fused_adamw")
        expected = steps[(r[0], r[method].split(" [")[0])] / steps[(r[0], baseline)]
        assert float(found.group(1)) == pytest.approx(expected, rel=0.02), (r, baseline)  # cells rounded
        checked += 1
    assert checked >= 15 and "fused_adamw_fp8" in notes.values()


def test_no_internal_name_in_an_anchor_or_file_name(smoke):
    out, _ = smoke
    text = (out / "README.md").read_text()
    names = re.findall(r'<a id="([^"]+)"', text) + [p.name for p in out.rglob("*") if p.is_file()]
    assert names and not [n for n in names if "other" in n], names


def test_every_series_of_a_plot_has_its_own_colour_and_marker(smoke):
    _, styles = smoke
    loss = [name for name in styles if name.endswith("_loss.png")]
    assert loss and len(styles[loss[0]]) > 10  # more series than one colour cycle
    for name, drawn in styles.items():
        assert len(set(drawn)) == len(drawn), f"{name}: two series share a colour and marker"


def test_the_hardware_table_appears_once_and_no_column_is_all_zeros(smoke):
    out, _ = smoke
    text = (out / "README.md").read_text()
    assert text.count("| Sweep | GPU |") == 1
    for table in _tables(text):
        header, *rows = table
        for i, name in enumerate(header):
            cells = [r[i] for r in rows if i < len(r)]
            numbers = [float(c) for c in cells if re.fullmatch(r"-?\d+(\.\d+)?", c)]
            assert not (rows and len(numbers) == len(cells) and all(abs(v) < 0.005 for v in numbers)), (
                f"column {name!r} is all zeros"
            )


def test_the_config_lists_what_the_run_changed_not_every_default(smoke):
    out, _ = smoke
    config = (out / "README.md").read_text().split("<summary>Config</summary>", 1)[1].split("</details>")[0]
    shared = dict(re.findall(r"^- `([^`]+)`: `(.*)`$", config, re.M))
    assert shared and "convergence.enabled" not in shared
    defaults = default_config()
    assert [k for k, v in shared.items() if defaults.get(k) == v] == []
    assert len(config.splitlines()) < 30
