"""The report of a smoke run (`python -m harness report results/smoke`), as a newcomer reads it:
what a CPU shows first (fidelity, losses, memory a parameter), then step times that name each
baseline as it ran, every ratio against the method's own baseline and only beyond the points'
spread; no internal name in an anchor or file name, every series of a plot its own colour and
marker, the hardware table once, no column of zeros, a config that lists what the run changed, and
a clear answer for results that are not there."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from harness.report import cpu_tables, plots, report
from harness.report.readme import default_config
from harness.report.tables import other_points
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
        r.update(step_time_ms_median=6.0 + i, step_times_ms=[(6.0 + i) * f for f in (0.99, 1.0, 1.0, 1.01)])
        r["losses"] = [5.52, 5.3 - 0.01 * i, 5.1 - 0.01 * i]
        records.append(r)
    for label, method, ms in (("fused_adamw_fp8", "fused_adamw", 8.0), ("forge_fp8", "forge", 12.0)):
        r = copy.deepcopy(fused)
        r.update(
            method=method, method_label=label, point=f"{label}/tiny-llama/b1/s32", step_time_ms_median=ms
        )
        r["method_options"] = dict(r["method_options"], fp8="tensorwise")
        r["step_times_ms"] = [ms * f for f in (0.99, 1.0, 1.0, 1.01)]
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


def test_every_ratio_divides_by_the_baseline_its_row_names(smoke):
    """The step-time table names each row's baseline as it ran (on a CPU fused_adamw runs the
    for-each AdamW, never 'fused AdamW'), FP8 against FP8, and each ratio divides by that row."""
    out, _ = smoke
    text = (out / "tables" / "step_times_cpu.md").read_text()
    header, *rows = _tables(text)[0]
    method, step = header.index("Method"), header.index("Step ms (median)")
    base, ratio = header.index("Baseline"), header.index("Step time vs baseline")
    steps = {(r[0], r[method]): float(r[step]) for r in rows if r[step][0].isdigit()}
    checked = 0
    for r in rows:
        found = re.match(r"^([\d.]+)x$", r[ratio])
        if not found:
            assert r[ratio] in ("baseline", "within spread", "no ratio: interpreted", "—"), r
            continue
        expected = steps[(r[0], r[method])] / steps[(r[0], r[base])]
        assert float(found.group(1)) == pytest.approx(expected, rel=0.02), r  # cells rounded
        checked += 1
    assert checked >= 5
    baselines = {r[method].split(":")[0]: r[base] for r in rows}
    assert baselines["lomo"] == "fused_adamw: AdamW (foreach; no CUDA)"
    assert baselines["forge_fp8"].startswith("fused_adamw_fp8: AdamW (foreach; no CUDA) over torchao")
    assert baselines["fused_adamw"] == "itself"
    report_text = (out / "README.md").read_text()
    assert "vs fused AdamW" not in report_text and "Against fused_adamw" not in report_text


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


def _point(method: str, label: str, ms: float, **extra) -> dict:
    """A measured point of the smoke sweep's tiny Llama: `ms` a step, four steps within 1% of it."""
    record = {
        "schema": 1, "sweep": "smoke", "time": "2026-12-07T10:00:00+00:00", "status": "ok",
        "method": method, "method_label": label, "method_options": {}, "model": "tiny-llama",
        "batch_size": 1, "seq_len": 32, "gpu_name": None, "gpu": "cpu", "device": "cpu",
        "step_times_ms": [ms * f for f in (0.99, 1.0, 1.0, 1.01)], "step_time_ms_median": ms,
        "losses": [5.5, 5.3, 5.1],
    }  # fmt: skip
    record.update(extra)
    return record


def _rows_by_method(table) -> dict[str, dict[str, str]]:
    return {row[1].split(":")[0]: dict(zip(table.header, row)) for row in table.rows}


def test_forge_muon_is_compared_with_torch_muon_not_adamw():
    """FORGE Muon replaces torch Muon: its baseline, on a CPU (named as it ran there) and in a GPU
    table (a ratio of torch Muon's step, its footnote naming it)."""
    cpu = [_point("fused_adamw", "fused_adamw", 5.0), _point("muon", "muon", 9.0)]
    cpu.append(_point("forge_muon", "forge_muon", 900.0))
    rows = _rows_by_method(cpu_tables.step_table(cpu).table)
    assert rows["forge_muon"]["Baseline"] == "muon: torch Muon + AdamW (foreach; no CUDA)"
    assert rows["forge_muon"]["Step time vs baseline"] == "no ratio: interpreted"
    assert rows["muon"]["Baseline"] == "fused_adamw: AdamW (foreach; no CUDA)"
    gpu = [dict(r, gpu="h100", device="cuda", gpu_name="NVIDIA H100") for r in cpu[:2]]
    gpu.append(dict(cpu[2], gpu="h100", device="cuda", gpu_name="NVIDIA H100", step_time_ms_median=7.2))
    gpu[2]["step_times_ms"] = [7.2] * 4
    table = other_points(gpu, []).table
    ratio = next(
        row[table.header.index("Step time vs fused AdamW")] for row in table.rows if "forge_muon" in row
    )
    value, mark = re.match(r"^([\d.]+)x (\[\d\])$", ratio).groups()
    assert float(value) == pytest.approx(7.2 / 9.0, abs=0.005)
    assert f"{mark} Against muon, the torch method it replaces." in table.notes


def test_a_ratio_is_given_only_beyond_both_points_spread():
    """Two native points whose timed steps overlap get 'within spread', never an 'x faster' ratio;
    disjoint ones get the ratio of their medians."""
    base = _point("fused_adamw", "fused_adamw", 10.0, step_times_ms=[9.0, 10.0, 10.0, 12.0])
    close = _point("lomo", "lomo", 11.0, step_times_ms=[11.0, 11.0, 11.5, 12.5])
    far = _point("no_optimizer", "no_optimizer", 4.0, step_times_ms=[3.9, 4.0, 4.0, 4.1])
    assert cpu_tables.beats_spread(far, base) and not cpu_tables.beats_spread(close, base)
    rows = _rows_by_method(cpu_tables.step_table([base, close, far]).table)
    assert rows["lomo"]["Step time vs baseline"] == "within spread"
    assert rows["no_optimizer"]["Step time vs baseline"] == "0.40x"
    assert rows["fused_adamw"]["Baseline"] == "itself"


FIDELITY = {
    "reference": {"method": "torch_rule", "options": {"rule": "adamw", "hparams": {}}},
    "reference_losses": [5.5, 5.3, 5.1], "state_dtype": "bf16", "loss": 5.1003, "reference_loss": 5.1,
    "loss_gap": 0.0003, "weight_distance": 0.07, "rounding_walk": 0.13, "state_error": 0.002,
    "gradient_error": 0.006, "path": 1.1, "loss_rounding_walk": 0.001, "loss_per_distance": 2.5,
}  # fmt: skip


def test_fidelity_holds_forge_to_the_bounds_its_arithmetic_gives():
    """A FORGE row's bounds are the rounding walk plus the update's error along the path (the loss:
    three of the walk's standard deviations plus that error along the gradient), each cell with its
    terms; a row beyond either bound says so; torch's own bf16 rows are shown, not held."""
    forge = _point("forge", "forge_bf16", 900.0, fidelity=FIDELITY, method_options={"state_dtype": "bf16"})
    drifted = _point("forge", "forge_int8", 900.0, method_options={"state_dtype": "int8"})
    drifted["fidelity"] = dict(FIDELITY, loss_gap=0.05)
    torch_bf16 = _point("fused_adamw", "fused_adamw", 5.0, fidelity=dict(FIDELITY, loss_gap=0.009))
    rows = _rows_by_method(cpu_tables.fidelity_table([torch_bf16, forge, drifted]).table)
    e = 0.002 + 0.006
    assert rows["forge_bf16"]["Weight bound"] == f"{0.13 + e * 1.1:.4f} = 0.1300 + {e * 1.1:.4f}"
    assert rows["forge_bf16"]["Loss bound"].startswith(f"{3 * 0.001 + e * 1.1 * 2.5:.5f} = 3 x 0.00100 + ")
    assert rows["forge_bf16"]["Within bounds"] == "yes" and rows["forge_int8"]["Within bounds"] == "**no**"
    assert rows["fused_adamw"]["Within bounds"] == "not held: rounds to nearest"
    assert rows["forge_bf16"]["Reference"] == "torch AdamW, fp32"


def test_a_missing_results_folder_says_so_first(tmp_path, monkeypatch, capsys):
    """`report` on a folder that is not there says 'no results at PATH' (with the nearest name for a
    typo), not that it would replace reports/; `--check` is in the usage line."""
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert report.main(["/tmp/does-not-exist-anywhere"]) == 2
    assert capsys.readouterr().err.startswith("report: no results at /tmp/does-not-exist-anywhere")
    assert report.main(["results/smok"]) == 2
    assert capsys.readouterr().err == "report: no results at results/smok; did you mean results/smoke?\n"
    assert not (tmp_path / "reports").exists()
    with pytest.raises(SystemExit):
        report.parse_args(["--help"])
    assert "[--check]" in capsys.readouterr().out.splitlines()[0]
