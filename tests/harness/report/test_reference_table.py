"""The report's section "The paper's code and ours" (harness.report.reference_table).

Made from the records of a `reference_*` sweep only: the README's figures quoted beside what was
measured at its point, every point's step and peak with ours over the paper's, failed points
showing their status, and no section (nor a placeholder) without records.
"""

from __future__ import annotations

import json

import yaml

from harness.report import paper, reference_table, report
from harness.run.config import CONF_DIR


def _options(label: str) -> dict:
    """The options its conf/method file sets (what tells the paper's two bf16 paths apart)."""
    return yaml.safe_load((CONF_DIR / "method" / f"{label}.yaml").read_text()).get("options") or {}


def _record(label: str, seq: int, step: float | None, peak: float | None, status="ok", **extra) -> dict:
    graphed = label.endswith("_graph")
    record = {
        "sweep": "reference_h200",
        "point": f"{label}/llama3.1-8b/b1/s{seq}/h200",
        "time": "2026-12-06T00:00:00Z",
        "status": status,
        "error": None if status == "ok" else "fused_grad_optimizer (the paper's FORGE) is not installed",
        "method": {"fused": "fused_adamw"}.get(label.split("_")[0], label.split("_")[0]),
        "method_label": label,
        "method_options": {"lr": 1e-4, **_options(label), **({"cuda_graph": True} if graphed else {})},
        "master_weights": "bf16",
        "model": "llama3.1-8b",
        "n_params": 8_030_261_248,
        "batch_size": 1,
        "seq_len": seq,
        "steps": 20,
        "warmup_steps": 5,
        "activation_checkpointing": False,
        "gpu": "h200",
        "gpu_name": "NVIDIA H200",
        "gpu_count": 1,
        "step_time_ms_median": step,
        "peak_alloc_gib": peak,
        "config": {"seed": 0, "model": yaml.safe_load((CONF_DIR / "model" / "llama3.1-8b.yaml").read_text())},
    }
    record.update(extra)
    return record


RECORDS = [
    _record("fused_adamw", 512, 140.0, 56.0),
    _record("forge_reference_bf16", 512, 120.0, 45.0, method="forge_reference"),
    _record("forge_reference_bf16_tma", 512, 115.0, 46.0, method="forge_reference"),
    _record("forge_bf16", 512, 110.0, 44.0, method="forge"),
    _record("forge_reference_int8", 512, None, None, status="unavailable", method="forge_reference"),
    _record("forge_bf16_graph", 512, 100.0, 44.5, method="forge"),
    _record("forge_reference_bf16_graph", 512, 105.0, 45.5, method="forge_reference"),
    _record("fused_adamw_graph", 512, 120.0, 56.1),
    _record("forge_bf16", 4096, 300.0, 60.0, method="forge"),
]


def test_the_readme_table_quotes_the_published_figures_beside_the_measured_ones():
    table = reference_table.readme_table(RECORDS)
    rows = {row[1]: row for row in table.rows}
    name, peak, step, spread = paper.REFERENCE_README["forge_reference_bf16"]
    paper_row = rows["forge_reference_bf16"]
    assert paper_row[2:5] == [name, f"{peak:.2f}", f"{step:.1f} ± {spread:.1f}"]
    assert paper_row[5] == f"{step / paper.REFERENCE_README['fused_adamw'][2]:.2f}x"
    assert paper_row[7:10] == ["45.0", "120.0", "0.86x"]  # measured, and over the measured fused AdamW
    assert rows["forge_bf16"][2] == "—" and rows["forge_bf16"][8] == "110.0"
    assert rows["forge_reference_bf16_tma"][2:5] == paper_row[2:5]  # the README's row beside both paths
    assert rows["forge_reference_int8"][7].startswith("unavailable [1]")
    assert "not installed" in table.notes[-1] and "20 steps (5 warm-up)" in table.notes[0]
    assert rows["torch_adamw"][7:] == ["—"] * 4  # not measured in this run: no figure made up
    assert list(rows)[:5] == list(paper.REFERENCE_README)  # the README's rows first, in its order


def test_the_columns_and_pairs_come_from_the_experiment_and_its_method_files():
    assert set(reference_table.columns()) >= set(paper.REFERENCE_README) | {"forge_bf16", "forge_int8"}
    assert reference_table.pairs() == (
        ("forge_reference_bf16", "forge_bf16"),
        ("forge_reference_int8", "forge_int8"),
        ("forge_reference_bf16_tma", "forge_bf16"),
    )


def test_every_point_sets_ours_against_the_papers_within_its_step_mode():
    steps = {(row[2], row[3]): row for row in reference_table._points_table(RECORDS, "step").rows}
    peaks = {(row[2], row[3]): row for row in reference_table._points_table(RECORDS, "peak").rows}
    # the comparison columns: ours against the paper's default bf16 path, its int8, its bf16 TMA path
    assert steps[("512", "eager")][-3:] == [f"{110 / 120:.2f}x", "—", f"{110 / 115:.2f}x"]
    assert steps[("512", "graphed")][-3] == "0.95x"
    assert peaks[("512", "eager")][-3:] == ["-1.00", "—", "-2.00"]
    assert peaks[("512", "graphed")][-3] == "-1.00"
    assert steps[("4096", "eager")][-3] == "—"  # the paper's FORGE has no record there
    assert list(steps) == [("512", "eager"), ("512", "graphed"), ("4096", "eager")]


def test_no_section_without_records_and_one_with_them(tmp_path):
    planned = tmp_path / "planned"
    report.write_report([], planned, ["results/"], planned=True)
    assert 'id="reference"' not in (planned / "README.md").read_text()
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "reference_h200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert report.main([str(folder), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    assert text.count('<a id="reference"></a>') == 1 and "The paper's code and ours" in text
    readme = (tmp_path / "out" / "tables" / "reference_readme.md").read_text()
    quoted = "| FORGE | 48.36 | 110.2 ± 8.7 | 0.82x | 0.80x |"  # both of its bf16 paths measured apart
    assert f"| forge_reference_bf16 {quoted} 45.0 | 120.0 |" in readme
    assert f"| forge_reference_bf16_tma {quoted} 46.0 | 115.0 |" in readme
    assert "llama3.1-8b's embedding: 0.98 GiB in bf16" in text
    for name in ("reference_readme", "reference_steps", "reference_peaks"):
        assert (tmp_path / "out" / "tables" / f"{name}.md").exists()
