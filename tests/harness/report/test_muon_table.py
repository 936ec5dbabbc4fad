"""harness.report.muon_table: FORGE Muon against torch Muon, every point of +exp=muon_h200.

Without records the committed report lists exactly the experiment's points, `not measured`; a
record fills its cells, a failed one shows its status, a point outside the plan adds its row, and
the predicted saving is token_model's difference of the two predicted peaks. The records here are
made up (shaped like a sweep's); no GPU figure is claimed from them.
"""

from __future__ import annotations

import json

import pytest
import yaml

from harness.report import muon_table, preambles, report
from harness.report import token_model as tm
from harness.report.markup import to_markdown
from harness.run.config import CONF_DIR

GIB = 2**30
MUON_OPTIONS = {"lr": 0.02, "momentum": 0.95, "fallback_options": {"lr": 3e-4}}


def _numbers(model: str) -> dict:
    return yaml.safe_load((CONF_DIR / "model" / f"{model}.yaml").read_text())


def _record(label: str, method: str, batch: int, graphed: bool, peak: float, step: float, **extra) -> dict:
    options = {"lr": 0.0} if method == "no_optimizer" else dict(MUON_OPTIONS)
    if method == "forge_muon":
        options["state_dtype"] = "bf16"
    if graphed:
        options["cuda_graph"] = True
    record = {
        "sweep": "muon_h200",
        "point": f"{label}/llama3.1-8b/b{batch}/s1024",
        "time": "2026-12-05T00:00:00Z",
        "status": "ok",
        "error": None,
        "method": method,
        "method_label": label,
        "method_options": options,
        "master_weights": "bf16",
        "model": "llama3.1-8b",
        "n_params": 8_030_261_248,
        "batch_size": batch,
        "seq_len": 1024,
        "activation_checkpointing": False,
        "gpu": "h200",
        "gpu_name": "NVIDIA H200",
        "gpu_count": 1,
        "step_time_ms_median": step,
        "peak_alloc_gib": peak,
        "config": {"seed": 0, "model": _numbers("llama3.1-8b")},
    }
    record.update(extra)
    return record


def _cells(selection) -> dict[tuple, list[str]]:
    return {(row[0], int(row[1]), row[3]): row for row in selection.table.rows}


def test_without_records_the_committed_report_lists_exactly_the_experiments_points():
    sweep = yaml.safe_load((CONF_DIR / "exp" / "muon_h200.yaml").read_text())["sweep"]
    selection = muon_table.muon_table([])
    rows = _cells(selection)
    expected = {
        (model, batch * seq, mode)
        for model in sweep["models"]
        for batch in sweep["batch_sizes"]
        for seq in sweep["seq_lens"]
        for mode in ("graphed", "eager")
    }
    assert set(rows) == expected and len(selection.table.rows) == len(expected) == 48
    assert all(cell == "not measured" for row in rows.values() for cell in row[4:11])
    assert selection.records == []
    assert muon_table.muon_table([], planned=False) is None  # a named report: only what ran


def test_records_fill_their_row_and_a_failed_point_shows_its_status():
    records = [
        _record("no_optimizer_graph", "no_optimizer", 1, True, 20.0, 100.0),
        _record("muon_graph", "muon", 1, True, 55.0, 950.0),
        _record("forge_muon_graph", "forge_muon", 1, True, 47.0, 930.0),
        _record("muon", "muon", 8, False, None, None, status="oom", error="CUDA out of memory"),
        _record("forge_muon", "forge_muon", 8, False, 120.0, 1100.0),
        _record("muon_graph", "muon", 16, True, 100.0, 1500.0),  # a point the plan lacks: its row
    ]
    selection = muon_table.muon_table(records)
    rows = _cells(selection)
    graphed = rows[("llama3.1-8b", 1024, "graphed")]
    assert graphed[4:11] == ["100.0", "950.0", "930.0", "0.98x", "55.0", "47.0", "8.0"]
    eager = rows[("llama3.1-8b", 8192, "eager")]
    assert eager[4:11] == ["not measured", "OOM", "1100.0", "—", "OOM", "120.0", "—"]
    extra = rows[("llama3.1-8b", 16384, "graphed")]
    assert extra[5] == "1500.0" and extra[6] == "not measured" and extra[7] == "not measured"
    assert len(selection.table.rows) == 49 and len(selection.records) == len(records)
    # the saving predicted at the row is token_model's difference of the two predicted peaks
    arch = tm.Architecture.from_config(_numbers("llama3.1-8b"))
    n, bf16 = arch.params(), {**MUON_OPTIONS, "state_dtype": "bf16"}
    torch_ = tm.peak_gib("muon", MUON_OPTIONS, arch, n, 1024, False, "bf16")
    forge_ = tm.peak_gib("forge_muon", bf16, arch, n, 1024, False, "bf16")
    assert graphed[11] == f"{torch_ - forge_:.1f}" != "—"


def test_the_predicted_saving_before_activations_is_the_gradient_less_the_workspaces():
    """At no tokens: torch keeps every gradient (2 B a parameter) and its workspace; FORGE the larger
    of its workspace and the embedding's gradient it forms at the backward's end. In bf16 both hold
    the same states (Muon's momentum 2, AdamW's 2 x 2), and the same workspace, 6 N K + 4 K^2 of the
    MLP's 14336 x 4096."""
    arch = tm.Architecture.from_config(_numbers("llama3.1-8b"))
    n = arch.params()
    workspace = 6 * 14336 * 4096 + 4 * 4096**2
    torch_ = tm.peak_gib("muon", MUON_OPTIONS, arch, n, 0, False, "bf16") * GIB
    forge_ = tm.peak_gib("forge_muon", {"state_dtype": "bf16"}, arch, n, 0, False, "bf16") * GIB
    embedding_gradient = 2 * arch.vocab * arch.hidden
    assert torch_ - forge_ == pytest.approx(2 * n + workspace - max(workspace, embedding_gradient))
    text = preambles.muon_preamble([])
    llama = next(line for line in text.splitlines() if line.startswith("| llama3.1-8b "))
    cells = [cell.strip() for cell in llama.strip("|").split("|")]
    assert cells[3:8] == ["15.0", "14336 x 4096", "400", "400", f"{(torch_ - forge_) / GIB:.1f}"]
    assert cells[8:] == [
        f"{tm.newton_schulz_flops(arch, 5) / 1e12:.1f}",
        f"{tm.newton_schulz_flops(arch, 5) / 800e9:.1f}",
    ]


def test_the_section_is_in_the_committed_report_and_only_there_without_records(tmp_path):
    planned = tmp_path / "planned"
    report.write_report([], planned, ["results/"], planned=True)
    text = (planned / "README.md").read_text()
    section = text.split('<a id="muon"></a>')[1].split("<a id=")[0]
    assert "**Expectation.** FORGE Muon never stores the gradient" in section
    assert "| not measured |" in section and "python -m harness sweep +exp=muon_h200" in section
    assert (planned / "tables" / "muon.md").exists() and (planned / "tables" / "muon.tex").exists()
    named = tmp_path / "named"
    report.write_report([], named, ["results/smoke"], planned=False)
    assert 'id="muon"' not in (named / "README.md").read_text()


def test_a_report_of_the_sweeps_records_has_the_section(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    records = [
        _record("muon", "muon", 1, False, 55.0, 950.0),
        _record("forge_muon", "forge_muon", 1, False, 47.0, 930.0),
    ]
    (folder / "muon_h200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert report.main([str(folder), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    assert text.count('<a id="muon"></a>') == 1 and "## Other measured points" not in text
    table = (tmp_path / "out" / "tables" / "muon.md").read_text()
    assert "| llama3.1-8b | 1024 | 1 x 1024 | eager | not measured | 950.0 | 930.0 | 0.98x |" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 1  # a report of named results: the rows its records fill, no planned ones
    assert "| qwen3-14b |" not in text  # nor their models' expectation


def test_a_split_method_shows_both_halves_of_its_bytes():
    """The bytes of the hidden matrices and of the rest; the static GiB over the model's split, in MiB
    for a model so small that GiB would read 0.000."""
    arch = tm.Architecture.from_config(_numbers("llama3.1-8b"))
    gpu = {
        "sweep": "muon",
        "method": "muon",
        "method_label": "muon",
        "method_options": MUON_OPTIONS,
        "master_weights": "bf16",
        "model": "llama3.1-8b",
        "n_params": arch.params(),
        "config": {"model": _numbers("llama3.1-8b")},
    }
    row = preambles.bytes_table([gpu]).rows[0]
    n, hidden = arch.params(), arch.hidden_params()
    static = (2 + 2) * n + 2 * hidden + 4 * (n - hidden)
    assert row[-1] == f"{static / GIB:.1f}"
    cpu = {
        "sweep": "smoke",
        "method": "muon",
        "method_label": "muon",
        "method_options": MUON_OPTIONS,
        "master_weights": "bf16",
        "model": "tiny-llama",
        "n_params": 106_816,
        "config": {"model": _numbers("tiny-llama")},
    }
    table = preambles.bytes_table([cpu])
    row = table.rows[0]
    assert row[1:4] == ["2.000 / 2.000", "2.000 / 2.000", "2.000 / 4.000"]
    hidden = tm.Architecture.from_config(_numbers("tiny-llama")).hidden_params()
    static = (2 + 2) * 106_816 + 2 * hidden + 4 * (106_816 - hidden)
    assert table.header[-1] == "Static MiB, tiny-llama" and row[-1] == f"{static / 2**20:.2f}"
    assert table.notes == [preambles.SPLIT_NOTE] and "a / b" in to_markdown(table)


def test_the_fast_newton_schulz_has_its_own_columns_beside_the_default():
    """forge_muon with newton_schulz other than torch's is its own role: the default's cells keep
    forge_muon's record, the fast cells take the fast one's, each against torch's step and peak."""
    fast = _record("forge_muon_fast_graph", "forge_muon", 1, True, 48.0, 600.0)
    fast["method_options"] = {**fast["method_options"], "newton_schulz": "gram_symmetric"}
    records = [
        _record("muon_graph", "muon", 1, True, 55.0, 950.0),
        _record("forge_muon_graph", "forge_muon", 1, True, 47.0, 930.0),
        fast,
    ]
    selection = muon_table.muon_table(records)
    col = {name: i for i, name in enumerate(selection.table.header)}
    row = _cells(selection)[("llama3.1-8b", 1024, "graphed")]
    assert row[col["Step ms, FORGE Muon"]] == "930.0"
    fast_name = "FORGE Muon, fast Newton-Schulz"
    assert row[col[f"Step ms, {fast_name}"]] == "600.0"
    assert row[col[f"{fast_name} / torch Muon step"]] == "0.63x"
    assert row[col[f"Saving GiB, {fast_name}"]] == "7.0"
    assert row[col[f"Predicted saving GiB, {fast_name}"]] != "—"
    assert muon_table.role_of("forge_muon", {"newton_schulz": "torch"}) == "forge_muon"


def test_the_convergence_tables_take_the_muon_run_against_torchs_fp32_muon():
    """+exp=convergence_muon's records (made up here): torch Muon on fp32 weights is each seed's
    reference (the run marks it), FORGE's fp32 Muon the control that sets the band, the bf16 runs
    are judged; no table needs to know the sweep."""
    import random

    from harness.report.convergence_table import convergence
    from harness.report.fidelity_table import fidelity
    from tests.helpers import convergence_record

    steps, rng, records = list(range(0, 651, 50)), random.Random(0), []
    phases = [dict(name="pretrain", first_step=0, steps=500), dict(name="cpt", first_step=500, steps=150)]
    runs = [("muon_fp32", "muon", "fp32", 0.0), ("forge_muon_fp32", "forge_muon", "fp32", 0.0)]
    runs += [("muon", "muon", "bf16", 0.01), ("forge_muon", "forge_muon", "bf16", 0.01)]
    runs += [("forge_muon_fast", "forge_muon", "bf16", 0.01)]  # +exp=convergence_muon's fast variant
    for seed in range(3):
        for label, method, master, offset in runs:
            shift = 0.0 if label == "muon_fp32" else offset + rng.gauss(0, 0.001)
            heldout = [3.0 + 6.0 / (1 + s / 100) + (shift if s else 0.0) for s in steps]
            record = convergence_record(
                "convergence_muon", label, method, master, seed, "2026-12-05",
                losses=[4.0 + shift] * 650, heldout_losses=heldout, heldout_steps=steps, phases=phases,
            )  # fmt: skip
            records.append({**record, "convergence_reference": label == "muon_fp32"})
    table = fidelity(records).table
    col = {name: i for i, name in enumerate(table.header)}
    verdicts = {(row[col["Method"]], row[col["Phase"]]): row[col["Verdict"]] for row in table.rows}
    assert verdicts[("forge_muon_fp32", "pretrain")] == "fp32 control (sets the band)"
    assert verdicts[("forge_muon", "pretrain")].startswith("biased by +0.0")
    assert verdicts[("forge_muon_fast", "pretrain")].startswith("biased by +0.0")
    assert not any(method == "muon_fp32" for method, _ in verdicts)  # the reference has no row
    rows = convergence(records).table.rows
    assert {row[0] for row in rows} == {"convergence_muon"}
    assert any("forge_muon_fp32" in " ".join(row) for row in rows)
