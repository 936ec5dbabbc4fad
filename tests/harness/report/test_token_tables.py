"""The tokens-per-step tables and plots from small synthetic results of +exp=scaling_tokens_h200 and
+exp=peak_vs_tokens_h200: measured beside predicted, a missing point `not measured`, a failed one
its status, the largest step that fits from the records alone, and no section without records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness import results
from harness.records import load_records, split_kinds
from harness.report import report, token_tables
from harness.report.token_tables import largest_fit, largest_ok, overhead_vs_tokens, peak_vs_tokens
from harness.run.config import CONF_DIR
from tests.harness import FIXTURES

LLAMA = yaml.safe_load((CONF_DIR / "model" / "llama3.1-8b.yaml").read_text())
QWEN_SMALL = yaml.safe_load((CONF_DIR / "model" / "qwen3-0.6b.yaml").read_text())
N = 8_030_261_248


def _record(sweep, label, batch, ms=None, peak=None, status="ok", ac=False, **extra) -> dict:
    method = label.removesuffix("_graph").removesuffix("_clip")
    method = {"forge_bf16": "forge", "forge_int8": "forge"}.get(method, method)
    options = {"lr": 1e-4, "state_dtype": label.split("_")[1]} if method == "forge" else {"lr": 1e-4}
    options.update({"max_grad_norm": 1.0} if "_clip" in label else {})
    options.update({"cuda_graph": True} if label.endswith("_graph") else {})
    record = results.empty_record()
    record.update(
        sweep=sweep,
        point=f"{label}/llama3.1-8b/b{batch}/s1024{'/ac' if ac else ''}/h200",
        time="2027-01-01T00:00:00+00:00",
        status=status,
        error="CUDA out of memory" if status == "oom" else None,
        method=method,
        method_label=label,
        method_options=options,
        master_weights="bf16",
        model="llama3.1-8b",
        n_params=N,
        batch_size=batch,
        seq_len=1024,
        activation_checkpointing=ac,
        gpu_name="NVIDIA H200",
        gpu_count=1,
        step_time_ms_median=ms,
        peak_alloc_gib=peak,
        config={"model": LLAMA, "batch_size": batch, "seq_len": 1024},
        attention_mask="is_causal",  # a current record (an older graphed one carries a footnote)
    )
    record.update(extra)
    return record


SCALING = [
    ("no_optimizer_graph", 1, 100.0),
    ("fused_adamw_graph", 1, 140.0),
    ("forge_bf16_graph", 1, 120.0),
    ("forge_int8_graph", 1, 140.0),
    ("forge_bf16_clip_graph", 1, 135.0),
    ("no_optimizer_graph", 2, 200.0),
    ("fused_adamw_graph", 2, 240.0),
    ("forge_bf16_graph", 2, 210.0),
    ("forge_bf16", 1, 150.0),
    ("no_optimizer", 1, 110.0),
]


def _scaling_records() -> list[dict]:
    out = [_record("scaling_tokens_h200", label, batch, ms, 50.0) for label, batch, ms in SCALING]
    out.append(_record("scaling_tokens_h200", "fused_adamw_fp32grad_graph", 2, status="oom"))
    return out  # forge_int8_graph at batch 2 and the eager points at batch 2: no record


def _pools(weights, states, grads, acts, other=0.5):
    return {"weights": weights, "states": states, "gradients": grads, "activations": acts, "other": other}


def _peak_records() -> list[dict]:
    sweep = "peak_vs_tokens_h200"
    out = [
        _record(sweep, "fused_adamw", 1, 150.0, 59.9, peak_pools_gib=_pools(15.0, 29.9, 15.0, 0.3)),
        _record(sweep, "forge_bf16", 1, 160.0, 52.6, peak_pools_gib=_pools(15.0, 29.9, 0.0, 7.7)),
        _record(sweep, "fused_adamw", 4, 480.0, 83.0),  # no pools measured: cells say so
        _record(sweep, "forge_bf16", 4, 490.0, 83.0),
        _record(sweep, "fused_adamw", 16, status="oom"),
        _record(sweep, "forge_bf16", 16, status="oom"),
        _record(sweep, "fused_adamw", 1, 180.0, 59.9, ac=True),
        _record(sweep, "forge_bf16", 1, 190.0, 46.7, ac=True),
        _record(sweep, "fused_adamw", 16, 2900.0, 74.0, ac=True),
    ]
    return out  # forge_bf16 at batch 16 with checkpointing: no record


def _rows(table) -> dict[tuple, list[str]]:
    return {(row[1], row[3], row[4]): row for row in table.rows}


def test_the_step_over_the_floor_measured_beside_predicted():
    sel = overhead_vs_tokens(_scaling_records())
    header, rows = sel.table.header, _rows(sel.table)
    col = {name: header.index(name) for name in header}
    fused = rows[("1024", "fused_adamw_graph", "graphed")]
    assert fused[col["vs floor"]] == "1.40x" and fused[col["Over floor ms"]] == "+40.0"
    assert fused[col["Predicted over floor ms"]] == "26.3"  # 14 B a parameter at 4.27 TB/s
    forge = rows[("1024", "forge_bf16_graph", "graphed")]
    assert forge[col["Predicted over floor ms"]] == "3.4-22.6"  # hidden as far as it fits - not hidden
    assert rows[("1024", "forge_bf16", "eager")][col["vs floor"]] == "1.36x"  # the eager floor's 110 ms
    assert rows[("2048", "no_optimizer_graph", "graphed")][col["vs floor"]] == "1.00x"
    clipped = rows[("1024", "forge_bf16_clip_graph", "graphed")]  # the plain floor, its norms predicted
    assert clipped[col["vs floor"]] == "1.35x" and clipped[col["Predicted over floor ms"]] == "10.6-29.8"


def test_a_missing_point_is_not_measured_and_a_failed_one_shows_its_status():
    sel = overhead_vs_tokens(_scaling_records())
    rows, col = _rows(sel.table), sel.table.header.index("Step ms (median)")
    missing = rows[("2048", "forge_int8_graph", "graphed")]
    assert missing[col] == "not measured" and missing[col + 1] == "not measured"
    assert missing[sel.table.header.index("Predicted over floor ms")] != "—"  # the model still speaks
    assert rows[("2048", "fused_adamw_fp32grad_graph", "graphed")][col] == "OOM"
    assert rows[("2048", "forge_bf16", "eager")][col] == "not measured"


def test_without_its_floor_a_row_says_so_in_a_footnote():
    records = [r for r in _scaling_records() if r["method_label"] != "no_optimizer"]
    sel = overhead_vs_tokens(records)
    row = _rows(sel.table)[("1024", "forge_bf16", "eager")]
    assert row[sel.table.header.index("vs floor")] == "— [1]"
    assert any(token_tables.FLOOR_MISSING in note for note in sel.table.notes)


def test_the_peak_with_its_pools_prediction_and_forges_saving():
    sel = peak_vs_tokens(_peak_records())
    header = sel.table.header
    rows = {(r[1], r[2], r[4]): r for r in sel.table.rows}
    forge = rows[("off", "1024", "forge_bf16")]
    assert forge[header.index("Peak alloc GiB")] == "52.6"
    assert forge[header.index("Predicted GiB")] == "52.6"  # 6 B/param + 1,024 tokens' activations
    assert forge[header.index("Gradients")] == "0.000" and forge[header.index("Activations")] == "7.7"
    assert forge[header.index("Saving vs fused AdamW GiB")] == "7.3"
    assert forge[header.index("Predicted saving GiB")] == "7.2"
    assert rows[("off", "4096", "forge_bf16")][header.index("Weights")] == "—"  # no pools recorded
    assert rows[("off", "4096", "forge_bf16")][header.index("Predicted saving GiB")] == "0.000"
    assert rows[("off", "16384", "forge_bf16")][header.index("Peak alloc GiB")] == "OOM"
    assert rows[("on", "16384", "forge_bf16")][header.index("Peak alloc GiB")] == "not measured"


def test_the_largest_step_that_fits_comes_from_the_records():
    table = largest_fit(_peak_records()).table
    rows = {(r[1], r[2]): r for r in table.rows}
    assert rows[("off", "fused_adamw")][3:5] == ["4096 (4 x 1024)", "16384 (16 x 1024)"]
    assert rows[("off", "fused_adamw")][5] == "12556"  # predicted, at 139.8 GiB
    unbounded = rows[("on", "fused_adamw")][3]
    assert unbounded.startswith("16384 (16 x 1024) [") and "lower bound" in table.notes[-1]
    assert rows[("on", "forge_bf16")][3].startswith("1024 (1 x 1024)")


def _smaller_model(record: dict, ms_scale: float) -> dict:
    """`record` as if measured on Qwen3-0.6B, its step `ms_scale` times as long."""
    small = dict(
        record, model="qwen3-0.6b", n_params=596_049_920, point=record["point"].replace("llama3.1-8b", "q")
    )
    small["config"] = dict(record["config"], model=QWEN_SMALL)
    if small.get("step_time_ms_median") is not None:
        small["step_time_ms_median"] = record["step_time_ms_median"] * ms_scale
    return small


def test_the_model_size_axis_draws_each_token_count_two_models_share():
    llama = _scaling_records()
    small = [_smaller_model(r, 0.1) for r in llama if r["batch_size"] == 1]  # batch 1 only
    by_size = token_tables.overhead_by_size(llama + small)
    assert list(by_size) == [(1024, "NVIDIA H200")]  # 2,048 tokens: one model, no curve
    forge = {s.label: s for s in by_size[(1024, "NVIDIA H200")]}["forge_bf16_graph"]
    assert [n for n, _, _ in forge.points] == [596_049_920, N]  # smallest first
    assert [round(v, 6) for _, v, _ in forge.points] == [1.2, 1.2]
    assert len(forge.predicted) == 2 and all(1 <= low <= high for _, low, high in forge.predicted)
    assert token_tables.overhead_by_size(llama) == {}


def test_the_plot_draws_eager_steps_over_the_eager_floor_without_a_prediction():
    by_model = token_tables.overhead_series(_scaling_records())
    lines = {s.label: s for s in by_model[("llama3.1-8b", "NVIDIA H200")]}
    eager = lines["forge_bf16"]
    assert not eager.graphed and eager.linestyle == "-." and eager.predicted == []
    assert [(t, round(v, 6)) for t, v, _ in eager.points if v is not None] == [(1024, round(150 / 110, 6))]
    assert "no_optimizer" not in lines  # the eager floor is the line at 1.00x
    assert lines["forge_bf16_graph"].linestyle == "-" and lines["forge_bf16_graph"].predicted
    small = [_smaller_model(r, 0.1) for r in _scaling_records()]
    by_size = token_tables.overhead_by_size(_scaling_records() + small)
    assert all(s.graphed for lines in by_size.values() for s in lines)
    panels = list(token_tables.overhead_series(_scaling_records() + small))  # the plot's rows, in order
    assert [model for model, _ in panels] == ["qwen3-0.6b", "llama3.1-8b"]  # by size, not by name


def test_the_largest_fit_is_below_the_smallest_oom():
    points = [
        _record("s", "forge_bf16", b, 1.0, 1.0, status=s) for b, s in [(1, "ok"), (4, "oom"), (8, "ok")]
    ]
    fits, oom = largest_ok(points)
    assert fits["batch_size"] == 1 and oom["batch_size"] == 4
    fits, oom = largest_ok([_record("s", "forge_bf16", 2, status="oom")])
    assert fits is None and oom["batch_size"] == 2


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("results")
    for name, records in (
        ("scaling_tokens_h200", _scaling_records()),
        ("peak_vs_tokens_h200", _peak_records()),
    ):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.fixture(scope="module")
def rendered(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    assert report.main([str(folder), "--out", str(out)]) == 0
    return out


def test_the_report_renders_the_tables_and_plots(rendered):
    for name in ("overhead_vs_tokens", "peak_vs_tokens", "largest_fit"):
        assert (rendered / "tables" / f"{name}.md").exists() and (
            rendered / "tables" / f"{name}.tex"
        ).exists()
    for name in ("overhead_vs_tokens", "peak_vs_tokens"):
        assert (rendered / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    readme = (rendered / "README.md").read_text()
    assert '<a id="tokens"></a>' in readme and '<a id="peak-tokens"></a>' in readme
    assert "Hides under the dW GEMM from tokens" in readme and "FORGE's saving ends at tokens" in readme


def test_the_report_rerenders_the_same_bytes(folder, rendered, tmp_path):
    assert report.main([str(folder), "--out", str(tmp_path)]) == 0
    for path in sorted(rendered.rglob("*")):
        if path.is_file():
            assert (tmp_path / path.relative_to(rendered)).read_bytes() == path.read_bytes(), path


def test_without_their_sweeps_there_are_no_such_sections():
    steps, _ = split_kinds(load_records([FIXTURES]))
    assert overhead_vs_tokens(steps) is None and peak_vs_tokens(steps) is None and largest_fit(steps) is None
    assert report._token_sections(steps, Path("unused")) == []


def test_chunked_loss_rows_compare_with_the_chunked_fused_adamw_and_its_own_prediction():
    """A point with `model.chunked_loss` is a row of its own, "(chunked loss)": its saving is over
    fused AdamW with the same loss, and its prediction counts the loss in chunks (4 V + 4 bytes a
    token where the whole loss keeps 12 V)."""
    sweep = "peak_vs_tokens_h200"

    def chunked(record):
        record["method_options"] = {**record["method_options"], "chunked_loss": True}
        record["point"] += "/chunked"
        return record

    records = [
        _record(sweep, "fused_adamw", 4, 480.0, 60.0, ac=True),
        _record(sweep, "forge_bf16", 4, 490.0, 51.9, ac=True),
        chunked(_record(sweep, "fused_adamw", 4, 470.0, 59.9, ac=True)),
        chunked(_record(sweep, "forge_bf16", 4, 480.0, 48.0, ac=True)),
    ]
    sel = peak_vs_tokens(records)
    header = sel.table.header
    rows = {(r[1], r[2], r[4]): r for r in sel.table.rows}
    plain, chunk = rows[("on", "4096", "forge_bf16")], rows[("on", "4096", "forge_bf16 (chunked loss)")]
    saving, predicted = header.index("Saving vs fused AdamW GiB"), header.index("Predicted saving GiB")
    assert (plain[saving], plain[predicted]) == ("8.1", "8.0")  # 60.0 - 51.9; 2 P - 4096 (a + l)
    assert (chunk[saving], chunk[predicted]) == ("11.9", "11.9")  # 59.9 - 48.0; the loss in chunks


def test_a_method_measured_with_checkpointing_alone_adds_no_rows_without_it():
    """A label gets "not measured" rows only on the checkpointing side it ran on: the loss in
    chunks, run with checkpointing alone, leaves the rows without checkpointing as they were."""
    sweep = "peak_vs_tokens_h200"
    records = [
        _record(sweep, "fused_adamw", 1, 150.0, 59.9),
        _record(sweep, "fused_adamw", 1, 180.0, 59.9, ac=True),
        _record(sweep, "fused_adamw", 4, 480.0, 60.0, ac=True),
    ]
    chunked = _record(sweep, "fused_adamw", 1, 170.0, 59.9, ac=True)
    chunked["method_options"] = {**chunked["method_options"], "chunked_loss": True}
    records.append(chunked)
    rows = [(r[1], r[2], r[4], r[5]) for r in peak_vs_tokens(records).table.rows]
    assert [r for r in rows if r[0] == "off"] == [("off", "1024", "fused_adamw", "59.9")]
    assert ("on", "4096", "fused_adamw (chunked loss)", "not measured") in rows
