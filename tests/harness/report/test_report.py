"""`python -m harness report` on small fixture results (tests/harness/fixtures/, see make_fixtures.py).

Every table and plot renders from the fixtures, failed points show their status (never zero),
a second run rewrites the same bytes, and sections without data are skipped cleanly.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from harness.points import config_key
from harness.records import load_records, split_kinds
from harness.report import expectations, plots, preambles, report
from harness.report.markup import Table, to_latex, to_markdown
from harness.report.names import display_name
from harness.report.tables import (
    t1_llama,
    t2_scaling,
    t3_capacity,
    t5_checkpointing,
    t6_capacity,
    t6_tensor_parallel,
)
from tests.harness import FIXTURES

TABLES = (
    "t1_llama8b",
    "t2_qwen3_scaling",
    "t3_capacity",
    "t4_kernels",
    "t4_kernels_summary",
    "t4_kernels_per_step",
    "t5_activation_checkpointing",
    "t6_tensor_parallel",
    "t6_capacity",
    "convergence",
    "convergence_seeds",
    "fidelity_cpu",
    "losses_cpu",
    "bytes_per_param_cpu",
    "step_times_cpu",
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    assert report.main([str(FIXTURES), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def records() -> list[dict]:
    steps, _kernels = split_kinds(load_records([FIXTURES]))
    return steps


def _rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]


def test_every_table_renders_as_markdown_and_latex(rendered):
    for name in TABLES:
        md = (rendered / "tables" / f"{name}.md").read_text()
        tex = (rendered / "tables" / f"{name}.tex").read_text()
        assert "| ---" in md or "|---" in md or ":---" in md, name
        assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex, name


def test_every_plot_is_a_png_without_software_metadata(rendered):
    plots = sorted((rendered / "plots").glob("*.png"))
    kinds = {"memory", "step_time", "memory_vs_size", "largest_batch", "kernel_speed", "convergence"}
    assert {k for k in kinds if any(k in p.name for p in plots)} == kinds
    for plot in plots:
        data = plot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"matplotlib" not in data and b"Software" not in data


def test_rerun_is_byte_identical(rendered, tmp_path):
    again = tmp_path / "again"
    assert report.main([str(FIXTURES), "--out", str(again)]) == 0
    for path in sorted(rendered.rglob("*")):
        if path.is_file():
            assert (again / path.relative_to(rendered)).read_bytes() == path.read_bytes(), path.name


def test_failed_points_show_their_status_never_zero(rendered):
    rows = _rows((rendered / "tables" / "t1_llama8b.md").read_text())
    by_method = {(r[0], r[1], r[2]): r[3:9] + r[10:12] for r in rows}  # measured cells (9: the sweep)
    assert all(c.startswith("unavailable [") for c in by_method[("1", "1024", "flashoptim")])
    assert all(c.startswith("error [") for c in by_method[("1", "1024", "adamw8bit_bnb")])
    assert all(c.startswith("diverged [") for c in by_method[("1", "1024", "lomo")])
    assert by_method[("2", "2048", "adamw_in_backward")] == ["OOM"] * 8
    # The reference itself OOM'd: ratios say so rather than vanish.
    assert by_method[("4", "2048", "forge_int8")][-2:] == ["ref OOM", "ref OOM"]
    md = (rendered / "tables" / "t1_llama8b.md").read_text()
    assert "illegal memory access" in md and "flashoptim is not installed" in md


def test_t1_takes_the_latest_sweep_and_quotes_the_paper(records):
    sel = t1_llama(records)
    rows = {(r[0], r[1], r[2]): r for r in sel.table.rows}
    fused = rows[("1", "1024", "fused_adamw")]
    assert fused[6] == "156.7"  # the newer of the two sweeps (the older ran 8% slower)
    assert fused[-1] == "~75 GiB, 150.9 ms"
    assert rows[("1", "1024", "forge_bf16")][-1] == "35.4 GiB, 99.1 ms"
    assert rows[("1", "1024", "forge_bf16")][-3].startswith("-")  # less memory than fused AdamW


def test_t2_marks_oom_and_sorts_by_size(records):
    sel = t2_scaling(records)
    models = [row[0] for row in sel.table.rows]
    assert models == sorted(models, key=lambda m: float(m.split("-")[1].rstrip("b")))
    oom = [row for row in sel.table.rows if row[0] == "qwen3-14b" and row[4] == "fused_adamw"][0]
    assert oom[5:10] == ["OOM"] * 5


def test_t3_largest_batch_per_method(records):
    rows = {row[3]: row for row in t3_capacity(records).table.rows}
    assert rows["fused_adamw"][4] == "1" and rows["fused_adamw"][9] == "OOM at 2"
    assert rows["forge_bf16"][4] == "4" and rows["forge_bf16"][9] == "OOM at 8"
    assert rows["forge_int8"][4] == "6" and rows["forge_int8"][9] == "OOM at 7"
    assert rows["adamw_in_backward"][4] == "none fits"


def test_t3_gets_a_checkpointing_column_when_a_search_used_it(records):
    assert "Act. ckpt" not in t3_capacity(records).table.header
    capped = [r for r in records if r.get("memory_cap_gib") is not None and r.get("gpu_count") == 1]
    checkpointed = [dict(r, activation_checkpointing=True) for r in capped if display_name(r) == "forge_bf16"]
    assert checkpointed
    table = t3_capacity(records + checkpointed).table
    ckpt = table.header.index("Act. ckpt")
    assert {row[ckpt] for row in table.rows if row[ckpt + 1] == "forge_bf16"} == {"on", "off"}


def test_tensor_parallel_points_have_their_own_tables(records):
    # the fixture's TP=2 fused AdamW shares T1's b1/s1024 configuration but not its GPU count
    assert t1_llama(records).table.rows == t1_llama([r for r in records if r["gpu_count"] == 1]).table.rows
    assert all(row[3] != "forge_int8" or row[4] == "6" for row in t3_capacity(records).table.rows)
    grid = {row[4]: row for row in t6_tensor_parallel(records).table.rows}
    assert set(grid) == {"fused_adamw", "forge_bf16"} and grid["fused_adamw"][1] == "2"
    assert grid["fused_adamw"][-1] == "1.00x"  # its reference is the TP=2 fused AdamW, not T1's
    capacity = {row[4]: row for row in t6_capacity(records).table.rows}
    assert capacity["forge_int8"][1] == "2" and capacity["forge_int8"][5] == "2"
    assert capacity["forge_int8"][10] == "OOM at 3" and capacity["fused_adamw"][5] == "1"


def test_readme_links_tables_names_sources_and_opens_with_expectation(rendered):
    text = (rendered / "README.md").read_text()
    for name in TABLES:
        assert f"(tables/{name}.md)" in text and f"(tables/{name}.tex)" in text
    assert "NVIDIA H200" in text and "570.86.15" in text and "0123456789ab" in text
    t1 = text.split('<a id="t1"></a>')[1].split('<a id="t2"></a>')[0]
    assert t1.index("**Expectation.**") < t1.index("**T1:")
    assert "Gradient B/param" in t1 and "Matrix floor ms" in t1
    assert "Config shared by every point" in t1
    assert "(plots/t1_llama3.1-8b_b1_s1024_memory.png)" in t1


def test_default_input_skips_scratch_runs_and_prunes_stale_files(tmp_path, monkeypatch):
    # A checkout whose results/ holds only a scratch run (the harness marks it with a .gitignore).
    scratch = tmp_path / "results" / "smoke"
    scratch.mkdir(parents=True)
    (scratch / ".gitignore").write_text("*\n")
    shutil.copy(FIXTURES / "smoke.jsonl", scratch / "smoke.jsonl")
    stale = tmp_path / "reports" / "tables" / "old_table.md"
    stale.parent.mkdir(parents=True)
    stale.write_text("stale")
    monkeypatch.chdir(tmp_path)
    assert report.main([]) == 0
    text = (tmp_path / "reports" / "README.md").read_text()
    assert text.count("No results yet.") == 8  # the paper's claims, T1-T6 and convergence
    assert not stale.exists()


def test_a_scratch_run_renders_into_its_own_folder(tmp_path, monkeypatch):
    """What the smoke sweep's summary tells its user to run: the scratch folder named as input,
    the report written inside it (scratch too), reports/ untouched."""
    scratch = tmp_path / "results" / "smoke"
    scratch.mkdir(parents=True)
    (scratch / ".gitignore").write_text("*\n")
    shutil.copy(FIXTURES / "smoke.jsonl", scratch / "smoke.jsonl")
    monkeypatch.chdir(tmp_path)
    assert report.main(["results/smoke"]) == 0  # no --out: beside the scratch results
    text = (scratch / "report" / "README.md").read_text()
    assert "## Training on a CPU" in text and "tiny-llama" in text
    assert not (tmp_path / "reports").exists()


def test_other_named_results_need_an_out_folder_and_leave_reports_alone(tmp_path, monkeypatch, capsys):
    """Named results outside a scratch folder would render over the committed reports/ (and remove
    every table they do not hold): refused before anything is written, saying to name --out.
    results/ named as such is the default, the committed report."""
    committed = tmp_path / "results"
    committed.mkdir()
    shutil.copy(FIXTURES / "smoke.jsonl", committed / "one.jsonl")
    kept = tmp_path / "reports" / "tables" / "t1.md"
    kept.parent.mkdir(parents=True)
    kept.write_text("the committed table")
    monkeypatch.chdir(tmp_path)
    assert report.main(["results/one.jsonl"]) == 2
    assert "--out DIR" in capsys.readouterr().err
    assert kept.read_text() == "the committed table" and not (tmp_path / "reports" / "README.md").exists()
    assert report.main(["results/one.jsonl", "--out", "elsewhere"]) == 0
    assert (tmp_path / "elsewhere" / "README.md").exists() and kept.exists()
    assert report.main(["results/"]) == 0  # the default: the committed report, planned
    assert "No results yet." in (tmp_path / "reports" / "README.md").read_text()


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_a_smoke_report_is_shaped_by_what_ran(tmp_path, monkeypatch, capsys):
    """`python -m harness report results/smoke` after `sweep +exp=smoke`: what a CPU shows, in
    order (fidelity and losses, memory a parameter, then step times under a heading that says they
    say nothing about a GPU); plots of what the points measured; a title that names the run; no GPU
    section, ceiling, planned point, empty expectation or internal wording."""
    scratch = tmp_path / "results" / "smoke"
    scratch.mkdir(parents=True)
    (scratch / ".gitignore").write_text("*\n")
    shutil.copy(FIXTURES / "smoke.jsonl", scratch / "smoke.jsonl")
    monkeypatch.chdir(tmp_path)
    assert report.main(["results/smoke"]) == 0
    assert capsys.readouterr().out.startswith("report: 4 records -> 4 tables, 2 plots")
    out = scratch / "report"
    text = (out / "README.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith(("# ", "## "))]
    assert headings == [
        "# The smoke sweep on a CPU",
        "## Hardware and software",
        "## Training on a CPU: fidelity to torch.optim, and losses",
        "## Memory a parameter",
        "## Step times on a CPU: they say nothing about a GPU's speed",
    ]
    order = [text.index(f"**{title}**") for title in (
        "Fidelity: each method's distance from its torch.optim reference after the run",
        "Training loss at each step (nats; the loss before that step's update)",
        "Bytes a parameter each method holds and moves",
        "Step times on a CPU (nothing about a GPU's)",
    )]  # fmt: skip
    assert order == sorted(order)
    assert "Regenerate with `python -m harness report results/smoke`" in text
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert plots == ["cpu_tiny-llama_b1_s32_loss.png", "cpu_tiny-llama_b1_s32_step_time.png"]
    assert all(f"(plots/{name})" in text for name in plots)
    assert "Held: weights + gradient + states" in text and "Update traffic: the bytes" in text
    assert "| Static MiB, tiny-llama |" in text
    for absent in (
        "No results yet", "| not measured |", "800 TFLOP/s", "Matrix floor", "H200", "Peak alloc",
        "No static GiB", "FORGE benchmark reports", "vs fused AdamW",
    ):  # fmt: skip
        assert absent not in text, absent
    assert "**Expectation.** \n" not in text and "**Expectation.** Each point that stands for" in text
    assert text.count("**Behind this table.**") == 1


def test_the_committed_report_still_plans_every_section(records, tmp_path):
    """With every section planned (the committed report), a section without data says how to make
    it and the data-parallel table lists the points still to measure, with its expectation."""
    out = tmp_path / "planned"
    gpu = [r for r in records if r.get("sweep") == "llama8b_h200"]
    report.write_report(gpu, out, ["results/"], planned=True)
    text = (out / "README.md").read_text()
    assert "No results yet. Produce them with `python -m harness sweep +exp=qwen3_scaling_h200`" in text
    dp = text.split('<a id="dp"></a>')[1].split("<a id=")[0]
    assert "**Expectation.** Per GPU, in bytes a parameter" in dp and "| not measured |" in dp
    assert "Regenerate with `python -m harness report` (reads `results/`)" in text


def test_gpu_ceilings_are_drawn_for_gpu_points_only(records):
    gpu = [r for r in records if r.get("sweep") == "llama8b_h200"]
    cpu = [r for r in records if r.get("sweep") == "smoke"]
    assert "800 TFLOP/s" in preambles.step_preamble(gpu) and "Matrix floor" in preambles.step_preamble(gpu)
    mixed = preambles.step_preamble(gpu + cpu)
    assert "Matrix floor" in mixed and "| tiny-llama |" not in mixed.split("Matrix floor")[1]
    alone = preambles.step_preamble(cpu)
    assert "800 TFLOP/s" not in alone and "Matrix floor" not in alone and preambles.CPU_TEXT in alone


def test_every_plot_fits_a_laptop_screen(rendered):
    """Every PNG the report draws, from the fixtures and committed under reports/plots (rendered
    by `python -m harness report`), is at most MAX_WIDTH_PX wide and as many high."""
    committed = sorted((Path(__file__).parents[3] / "reports" / "plots").glob("*.png"))
    assert committed
    for path in [*sorted((rendered / "plots").glob("*.png")), *committed]:
        width, height = _png_size(path)
        assert width <= plots.MAX_WIDTH_PX, f"{path.name} is {width} px wide"
        assert height <= plots.MAX_WIDTH_PX, f"{path.name} is {height} px high"


def test_convergence_table_is_skipped_without_curves(records, tmp_path):
    only_steps = tmp_path / "llama.jsonl"
    shutil.copy(FIXTURES / "llama8b_h200.jsonl", only_steps)
    out = tmp_path / "reports"
    assert report.main([str(only_steps), "--out", str(out)]) == 0
    assert not (out / "tables" / "convergence.md").exists()
    assert (out / "tables" / "t1_llama8b.md").exists()


def test_convergence_distances(rendered):
    rows = {(row[2], row[3]): row for row in _rows((rendered / "tables" / "convergence.md").read_text())}
    # Columns: sweep, model, seed, method, master weights, phase, steps, first, last, |d| all,
    # |d| last 10%, signed d last 10%, held-out |d|, steps within 1e-4.
    assert rows[("0", "fused_adamw (ref)")][9] == "ref" and rows[("0", "fused_adamw (ref)")][13] == "ref"
    assert float(rows[("0", "forge_bf16")][9]) < 1e-4  # fp32 twin: noise only
    assert float(rows[("0", "forge_int8")][9]) < 1e-3  # the paper's bound
    nosr = rows[("0", "forge_bf16_nosr")]
    assert float(nosr[10]) > float(nosr[9])  # drifts away
    assert nosr[11].startswith("+") and float(nosr[11]) == pytest.approx(float(nosr[10]))  # above, always
    assert int(nosr[13]) < int(nosr[6])  # parts from the reference
    assert rows[("1", "fused_adamw (ref)")][9] == "ref"  # each seed against its own reference


def test_convergence_over_seeds(rendered):
    rows = {row[2]: row for row in _rows((rendered / "tables" / "convergence_seeds.md").read_text())}
    # Columns: sweep, model, method, phase, seeds, mean |d|, signed mean, signed range, above, within.
    assert set(rows) == {"forge_bf16", "forge_bf16_nosr"}  # int8 ran under one seed only
    assert rows["forge_bf16_nosr"][4] == "2" and rows["forge_bf16_nosr"][8] == "2 of 2"
    assert float(rows["forge_bf16"][5]) < 1e-4


def test_the_measured_memory_split_adds_up_to_the_peak():
    from harness.report.plots import _pools

    record = dict(weights_gib=15.0, optimizer_state_gib=30.0, forward_end_alloc_gib=52.6, peak_alloc_gib=59.9)
    heights = [height(record) for _, height in _pools(measured=True)]
    assert heights == pytest.approx([15.0, 30.0, 7.6, 7.3])
    # the peak set at the end of forward: nothing added on top
    record.update(peak_alloc_gib=52.6)
    assert [height(record) for _, height in _pools(measured=True)][-1] == 0.0
    # older records: the modelled split, whose pools also add up to the peak
    old = dict(weights_gib=15.0, grads_gib=15.0, optimizer_state_gib=30.0, activations_gib=0.4)
    old["peak_alloc_gib"] = 60.4
    assert sum(height(old) for _, height in _pools(measured=False)) == pytest.approx(60.4)


def test_activations_are_measured_at_the_end_of_forward_where_recorded():
    from harness.records import activations_gib

    # fused AdamW whose peak came before any gradient existed: the modelled remainder is ~0
    fused = dict(weights_gib=15.0, grads_gib=15.0, optimizer_state_gib=30.0, activations_gib=0.4)
    assert activations_gib(fused) == 0.4
    fused["forward_end_alloc_gib"] = 58.7
    assert activations_gib(fused) == pytest.approx(13.7)
    assert activations_gib(dict(weights_gib=15.0)) is None


def test_expected_bytes_list_a_method_once_and_size_models_whose_points_all_failed():
    from harness.report.preambles import bytes_table

    ok = dict(method="fused_adamw", method_options={}, master_weights="bf16", model="a", n_params=1e9)
    failed = dict(method="fused_adamw", method_options={}, model="b", status="oom")  # no size, no weights
    table = bytes_table([ok, failed], cap_gib=40.0, known={"b": 2e9})
    assert len(table.rows) == 1
    assert [h.split(" (")[0] for h in table.header[-2:]] == ["Static GiB, a", "Static GiB, b"]


def test_steps_within_finds_where_two_curves_part():
    from harness.report.convergence_table import steps_within

    reference = [5.0, 4.0, 3.0, 2.5, 2.0]
    assert steps_within(reference, reference) == 5
    assert steps_within([5.0, 4.00005, 3.001, 2.5, 2.0], reference) == 2
    assert steps_within([], reference) is None


def test_markup_escapes_latex_and_pipes():
    table = Table("x", "50% of a_b", ["A|B", "C"], [["1 & 2", "—"]], notes=["[1] note #1"])
    tex = to_latex(table)
    assert "50\\% of a\\_b" in tex and "1 \\& 2 & ---" in tex and "note \\#1" in tex
    assert "A\\|B" in to_markdown(table)


@pytest.mark.parametrize(
    ("method", "options", "total"),
    [
        ("fused_adamw", {}, 8.0),
        ("forge", {"state_dtype": "bf16"}, 6.0),
        ("forge", {"state_dtype": "int8"}, 4.0625),  # 2 x (1 + 2/64): bf16 scale per 64
        ("forge", {"state_dtype": "fp32"}, 10.0),
        ("forge", {"rule": "sgd", "state_dtype": "bf16", "hparams": {"momentum": 0.9}}, 4.0),
        ("forge", {"rule": "sgd", "state_dtype": "bf16"}, 2.0),
        ("no_optimizer", {}, 2.0),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_bytes_per_parameter(method, options, total):
    assert expectations.footprint(method, options, "bf16").total == pytest.approx(total)


def test_forge_saves_the_gradient_bytes():
    fused = expectations.footprint("fused_adamw", {}, "bf16")
    forge = expectations.footprint("forge", {"state_dtype": "bf16"}, "bf16+sr")
    assert fused.total - forge.total == 2.0
    assert fused.update_traffic - forge.update_traffic == 4.0  # gradient written and read back


def test_kernel_times_sum_over_one_step_only_when_every_shape_is_measured():
    """The per-step table: each block shape times the model's layers plus lm_head, per variant."""
    from harness.report.kernel_table import SHAPE_ORDER, t4_kernels

    def record(shape, variant, ms, **extra):
        return {"model": "llama3.1-8b", "shape_name": shape, "T": 1024, "N": 8, "K": 8, "status": "ok",
                "variant": variant, "time_ms": ms, "time": "t", **extra}  # fmt: skip

    full = [record(s, "cublas_gemm", 1.0) for s in SHAPE_ORDER]
    full += [record(s, "forge", 2.0, rule="adamw", state_dtype="bf16") for s in SHAPE_ORDER]
    table = t4_kernels(full)[2].table
    (row,) = table.rows
    assert row[:5] == ["llama3.1-8b", "1024", "32", "225.0", "—"]  # 7 shapes x 32 layers + lm_head
    assert row[6] == "450.0" and row[-1] == "225.0"
    partial = [r for r in full if r["shape_name"] != "lm_head" or r["variant"] != "forge"]
    (row,) = t4_kernels(partial)[2].table.rows
    assert row[6] == "—"  # no sum without every shape
    # `kernels --tune`'s reference GEMM names a shape and no model: left out
    tuner = dict(record("k", "cublas_gemm", 9.0), model=None, shape_name="small_k")
    assert t4_kernels(full + [tuner])[0].table.rows == t4_kernels(full)[0].table.rows


def test_the_kernel_summary_sets_forge_beside_the_graphed_baseline_where_a_run_timed_it():
    """T4 summary: FORGE against "GEMM + fused AdamW" as launched (host included) and as replayed
    from a CUDA graph; runs that did not time the graphed baseline show a dash there."""
    from harness.report.kernel_table import t4_kernels

    def record(shape, variant, ms, **extra):
        return {"model": "llama3.1-8b", "shape_name": shape, "T": 1024, "N": 8, "K": 8, "status": "ok",
                "variant": variant, "time_ms": ms, "time": "t", **extra}  # fmt: skip

    records = [
        record("q", "gemm_plus_fused_adamw", 2.0),
        record("q", "forge", 1.5, rule="adamw", state_dtype="bf16"),
    ]
    records += [
        record("k", "gemm_plus_fused_adamw", 2.0),
        record("k", "forge", 1.5, rule="adamw", state_dtype="bf16"),
    ]
    summary = t4_kernels(records)[1].table
    graphed = summary.header.index("Geomean vs graphed")
    (row,) = summary.rows
    assert row[summary.header.index("Geomean vs GEMM+AdamW")] == "0.75x" and row[graphed] == "—"
    records += [
        record("q", "gemm_plus_fused_adamw_graph", 1.2),
        record("k", "gemm_plus_fused_adamw_graph", 1.875),
    ]
    (row,) = t4_kernels(records)[1].table.rows
    assert row[graphed] == "1.00x"  # geometric mean of 1.25 and 0.8
    assert row[summary.header.index("Worst vs graphed")] == "1.25x"


def test_the_kernel_summary_names_the_runs_its_records_come_from():
    """Each point takes its latest record; the summary says which runs (start time, commit, how
    many FORGE records) that leaves per model, so a table mixing runs says so."""
    from harness.report.kernel_table import t4_kernels

    def record(shape, time, commit):
        return {"model": "llama3.1-8b", "shape_name": shape, "T": 1024, "N": 8, "K": 8, "status": "ok",
                "variant": "forge", "rule": "adamw", "state_dtype": "bf16", "time_ms": 1.0, "time": time,
                "env": {"git_commit": commit * 40}}  # fmt: skip

    records = [record("q", "2026-01-01T00:00:00", "a"), record("k", "2026-01-01T00:00:00", "a")]
    records.append(record("q", "2026-01-02T00:00:00", "b"))  # a later run that timed q only
    notes = " ".join(t4_kernels(records)[1].table.notes)
    assert "llama3.1-8b: 2026-01-01T00:00:00 (aaaaaaa, 1), 2026-01-02T00:00:00 (bbbbbbb, 1)" in notes


def test_checkpointed_capacity_search_gets_its_own_plot(records, tmp_path):
    capped = [r for r in records if r.get("memory_cap_gib") is not None and r.get("gpu_count") == 1]
    checkpointed = [dict(r, activation_checkpointing=True) for r in capped]
    paths = report._largest_batch_plots("t3", capped + checkpointed, tmp_path)
    assert len(paths) == len(set(paths)) == 2 * len(report._largest_batch_plots("t3", capped, tmp_path))
    assert any("_ac_" in p.name for p in paths) and any("_ac_" not in p.name for p in paths)


def test_a_search_under_another_allocator_setting_gets_its_own_rows_and_plot(records, tmp_path):
    capped = [r for r in records if r.get("memory_cap_gib") is not None and r.get("gpu_count") == 1]
    assert "Allocator" not in t3_capacity(capped).table.header
    setting = "expandable_segments:True"  # as the sweep records it: another point id, another search
    expandable = [dict(r, cuda_alloc_conf=setting, point=f"{r['point']}/alloc={setting}") for r in capped]
    table = t3_capacity(capped + expandable).table
    column = table.header.index("Allocator")
    assert {row[column] for row in table.rows} == {"default", "expandable_segments:True"}
    assert len(table.rows) == 2 * len(t3_capacity(capped).table.rows)
    paths = report._largest_batch_plots("t3", capped + expandable, tmp_path)
    assert len(set(paths)) == 2 * len(report._largest_batch_plots("t3", capped, tmp_path))
    assert any("expandable" in p.name for p in paths)


def test_rows_from_several_sweeps_name_their_sweep(records):
    # the fixture's T1 holds llama8b_h200 and activation_checkpointing points
    table = t1_llama(records).table
    sweep = table.header.index("Sweep")
    assert table.header[sweep + 1] == "Memory vs fused AdamW"
    assert {row[sweep] for row in table.rows} == {"llama8b_h200", "activation_checkpointing"}
    one = [r for r in records if r.get("sweep") == "llama8b_h200"]
    assert "Sweep" not in t1_llama(one).table.header


def test_an_older_sweep_keeps_its_fused_adamw_row_when_its_points_show(records):
    # an older sweep whose FORGE point is still the latest, but whose fused AdamW has been re-run
    at_b1 = lambda r: r["method"] == "fused_adamw" and r["batch_size"] == 1 and r["seq_len"] == 1024
    fused = next(r for r in records if r.get("sweep") == "llama8b_h200" and at_b1(r))
    old_fused = dict(fused, sweep="older", time="2000-01-01T00:00:00", step_time_ms_median=999.0)
    old_forge = dict(fused, sweep="older", time="2100-01-01T00:00:00", method="forge")
    old_forge["method_label"] = "forge_int8"
    table = t1_llama(records + [old_fused, old_forge]).table
    sweep = table.header.index("Sweep")
    fused_rows = [row for row in table.rows if row[2] == "fused_adamw" and row[:2] == ["1", "1024"]]
    assert {row[sweep] for row in fused_rows} == {"llama8b_h200", "older"}
    assert [row[6] for row in fused_rows if row[sweep] == "older"] == ["999.0"]


def test_a_later_run_without_its_fused_adamw_does_not_displace_a_side_by_side_ratio(records):
    at_b1 = lambda r: r["batch_size"] == 1 and r["seq_len"] == 1024 and r.get("sweep") == "llama8b_h200"
    forges = [r for r in records if at_b1(r) and r.get("method_label") == "forge_bf16"]
    forge = max(forges, key=lambda r: r["time"])
    alone = dict(forge, sweep="alone", time="2100-01-01T00:00:00")
    alone.pop("step_times_ms", None)
    alone["step_time_ms_median"] = 999.0

    def forge_rows(records):
        return [row for row in t1_llama(records).table.rows if row[:3] == ["1", "1024", "forge_bf16"]]

    assert forge_rows(records + [alone]) == forge_rows(records)
    # with no fused AdamW at that configuration at all, the latest shows (its ratio cells say so)
    unreferenced = [r for r in records if not (at_b1(r) and r["method"] == "fused_adamw")]
    rows = forge_rows(unreferenced + [alone])
    assert len(rows) == 1 and rows[0][6] == "999.0"


def test_bars_of_one_method_from_two_sweeps_name_the_sweep():
    from harness.report.plots import _bar_labels

    records = [
        dict(method="fused_adamw", method_label="fused_adamw", sweep="a"),
        dict(method="fused_adamw", method_label="fused_adamw", sweep="b"),
        dict(method="no_optimizer", method_label="no_optimizer", sweep="a"),
    ]
    assert _bar_labels(records) == ["fused_adamw (a)", "fused_adamw (b)", "no_optimizer"]


def test_t5_rows_from_two_sweeps_name_their_sweep_and_keep_its_fused_adamw(records):
    checkpointing = [r for r in records if r.get("sweep") == "activation_checkpointing"]
    assert "Sweep" not in t5_checkpointing(checkpointing).table.header
    later = "2100-01-01T00:00:00"
    rerun = [dict(r, sweep="rerun", time=later) for r in checkpointing if r["method"] == "forge"]
    rerun += [dict(r, sweep="rerun") for r in checkpointing if r["method"] == "fused_adamw"]
    table = t5_checkpointing(checkpointing + rerun).table
    sweep, method = table.header.index("Sweep"), table.header.index("Method")
    fused = [row[sweep] for row in table.rows if row[method] == "fused_adamw"]
    assert sorted(set(fused)) == ["activation_checkpointing", "rerun"]  # each sweep's own reference


def test_an_option_added_later_keys_old_records_at_the_value_they_ran_at():
    """FORGE records written before `int8_group` existed ran with groups of 64: they are the same
    configuration as new records that say so (one row, the latest), not as ones with 128."""
    options = {"lr": 1e-4, "state_dtype": "int8"}
    old = {"method": "forge", "method_options": options, "model": "m"}
    new = {"method": "forge", "method_options": {**options, "int8_group": 64}, "model": "m"}
    g128 = {"method": "forge", "method_options": {**options, "int8_group": 128}, "model": "m"}
    assert config_key(old) == config_key(new) != config_key(g128)
    other = {"method": "fused_adamw", "method_options": {"lr": 1e-4}, "model": "m"}
    assert "int8_group" not in config_key(other)[1]


def test_the_fp8_kernel_table_and_the_labs_other_records_stay_out_of_the_step_tables():
    """`python -m harness kernels --fp8` records (the committed H200 run) become T4 FP8, ordered by T
    and shape, with the fused kernel's ratio to the FP8 GEMM; like `--clip-norms` records they are
    kernel records, never a row of the step tables."""
    from harness.report.kernel_table import t4_fp8

    path = Path(__file__).parents[3] / "results" / "kernels" / "fp8-kernels-20261201-7e7e438.jsonl"
    records = load_records([str(path)])
    steps, kernels = split_kinds(records + [dict(records[0], sweep="clip_norms")])
    assert steps == [] and len(kernels) == len(records) + 1
    table = t4_fp8(kernels).table
    col = {name: i for i, name in enumerate(table.header)}
    assert len(table.rows) == 16 and table.rows[0][col["T"]] == "1024"
    gate = next(r for r in table.rows if r[col["Shape"]] == "llama3.1-8b/gate" and r[col["T"]] == "4096")
    assert gate[col["FORGE FP8 ms"]] == "0.748" and gate[col["vs FP8 GEMM"]] == "1.94x"


def test_the_committed_report_is_an_index_a_reader_scans():
    """reports/README.md, as `python -m harness report` writes it: at most INLINE_LINES lines, each
    section's question and links, every link landing on a file of the report; each section in full
    on its page under reports/sections/, whose links land too."""
    from harness.report.readme import INLINE_LINES, QUESTIONS

    root = Path(__file__).parents[3] / "reports"
    index = (root / "README.md").read_text()
    assert len(index.splitlines()) <= INLINE_LINES
    anchors = re.findall(r'<a id="([^"]+)"></a>', index)
    assert set(anchors) <= set(QUESTIONS), "a section without the question its tables answer"
    pages = [root / "README.md", *sorted((root / "sections").glob("*.md"))]
    assert len(pages) > 1
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.relative_to(root)} links {target}, not there"
