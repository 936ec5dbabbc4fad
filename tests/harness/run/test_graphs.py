"""`method.cuda_graph` on CPU: what is refused before any work, what becomes an `unavailable`
record, how a graphed point is recorded, and which fused AdamW its ratios compare with.
(The captured step itself runs on the GPU: tests/test_gpu_graphs.py.)"""

from __future__ import annotations

import pytest

from harness.points import reference_index, reference_key
from harness.records import load_records, split_kinds
from harness.report.tables import _reference_capacity, t1_llama
from harness.run import grid, methods, record, runner, sweep
from harness.run.config import ConfigError, compose_config
from tests.harness import FIXTURES

TINY = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=3", "warmup_steps=1"]


def test_cuda_graph_with_tensor_parallel_is_refused():
    with pytest.raises(ConfigError, match="single-GPU here") as e:
        compose_config([*TINY, "method=fused_adamw_graph", "gpus=2"])
    assert "gpus=1 or method.cuda_graph=false" in str(e.value)


def test_cuda_graph_in_a_convergence_run_is_refused():
    with pytest.raises(ConfigError, match="would freeze"):
        compose_config(["+exp=convergence_smoke", "method=fused_adamw_graph"])


@pytest.mark.parametrize("method", ["adamw_in_backward", "lomo", "adamw8bit_torchao"])
def test_a_method_that_cannot_capture_its_step_is_unavailable_not_a_crash(method):
    record = runner.run_point(compose_config([*TINY, f"method={method}", "method.cuda_graph=true"]))
    assert record["status"] == "unavailable"
    if "not installed" in record["error"]:  # its package is missing here: that reason comes first
        return
    assert "cannot capture its step in a CUDA graph" in record["error"]
    assert "set method.cuda_graph=false" in record["error"]
    assert "fused_adamw, fused_adamw_fp32grad, no_optimizer, forge" in record["error"]  # those that can


@pytest.mark.parametrize("method", ["fused_adamw_graph", "forge_bf16_graph", "no_optimizer_graph"])
def test_a_graphed_point_on_a_cpu_is_unavailable(method):
    record = runner.run_point(compose_config([*TINY, f"method={method}"]))
    assert record["status"] == "unavailable"
    assert "needs CUDA" in record["error"] and "method.cuda_graph=false" in record["error"]


def test_the_sweep_records_an_unavailable_graphed_point_without_a_worker(tmp_path):
    overrides = [*TINY, "method=adamw_in_backward", "method.cuda_graph=true"]
    record, ran = sweep.run_or_skip(grid.make_point(overrides), {}, tmp_path / "r.jsonl", {})
    assert ran and record["status"] == "unavailable" and "CUDA graph" in record["error"]


def test_only_capturable_methods_say_so():
    capturable = {name for name, cls in methods.registry().items() if cls.graph_capturable}
    assert capturable == {
        "fused_adamw",
        "fused_adamw_fp32grad",
        "no_optimizer",
        "forge",
        "muon",
        "forge_muon",
        "forge_reference",
    }


def test_method_options_record_cuda_graph_only_when_on():
    """Old records have no `cuda_graph` key: an eager point must keep matching them."""
    eager = record.for_point(compose_config([*TINY, "method=fused_adamw"]), "p", "cpu").to_json()
    graphed = record.for_point(compose_config([*TINY, "method=fused_adamw_graph"]), "p", "cpu").to_json()
    assert "cuda_graph" not in eager["method_options"]
    assert graphed["method_options"] == {**eager["method_options"], "cuda_graph": True}


@pytest.fixture(scope="module")
def graphs_sweep() -> list[dict]:
    """The fixture's llama8b_h200 points at batch 1, seq 1024, re-run as a graphs sweep: each
    method eager and graphed, the graphed steps faster than the eager ones."""
    steps, _kernels = split_kinds(load_records([FIXTURES]))
    at_b1 = [r for r in steps if r.get("sweep") == "llama8b_h200" and r["batch_size"] == 1]
    at_b1 = [r for r in at_b1 if r["seq_len"] == 1024 and r["status"] == "ok"]
    eager = {r["method_label"]: r for r in at_b1 if r["method"] in ("fused_adamw", "forge")}
    out = []
    for label, ms in (("fused_adamw", 160.0), ("forge_bf16", 140.0)):
        out.append(dict(eager[label], sweep="graphs", step_time_ms_median=ms))
        options = {**eager[label]["method_options"], "cuda_graph": True}
        out.append(
            dict(
                eager[label],
                sweep="graphs",
                method_label=f"{label}_graph",
                method_options=options,
                step_time_ms_median=ms / 2 if label == "fused_adamw" else ms / 4,
                attention_mask="is_causal",  # a current record: no masked-attention footnote
            )
        )
    return out


def test_a_graphed_row_compares_with_the_graphed_fused_adamw(graphs_sweep):
    refs = reference_index(graphs_sweep)
    by_label = {r["method_label"]: r for r in graphs_sweep}
    assert refs[reference_key(by_label["forge_bf16_graph"])] is by_label["fused_adamw_graph"]
    assert refs[reference_key(by_label["forge_bf16"])] is by_label["fused_adamw"]
    table = t1_llama(graphs_sweep).table
    method, ratio = table.header.index("Method"), table.header.index("Step time vs fused AdamW")
    paper = table.header.index("Paper")
    rows = {row[method]: row for row in table.rows}
    assert list(rows) == ["fused_adamw", "fused_adamw_graph", "forge_bf16", "forge_bf16_graph"]
    # its own reference, not the eager one: the footnote says so, as on every row compared with it
    assert rows["fused_adamw_graph"][ratio] == "1.00x [1]"
    assert rows["forge_bf16"][ratio] == "0.88x"  # 140 / 160
    # 35 / 80, against the graphed fused AdamW, which the footnote names (the header names the eager)
    assert rows["forge_bf16_graph"][ratio] == "0.44x [1]"
    against = "Against fused_adamw_graph, the fused AdamW whose step ran the same way."
    assert any(against in note for note in table.notes)
    assert rows["fused_adamw"][paper] != "—" and rows["fused_adamw_graph"][paper] == "—"  # paper: eager


def test_a_graphed_capacity_search_compares_with_the_graphed_fused_adamw():
    group = ("llama3.1-8b", "H200", 1024, 40.0, False, None)
    eager, graphed = '{"lr":0.0001}', '{"cuda_graph":true,"lr":0.0001}'
    best = {
        group + ("fused_adamw", graphed): ("fused graphed", None),
        group + ("fused_adamw", eager): ("fused eager", None),
        group + ("forge", graphed): ("forge graphed", None),
        group + ("forge", eager): ("forge eager", None),
    }
    assert _reference_capacity(group + ("forge", graphed), best) == "fused graphed"
    assert _reference_capacity(group + ("forge", eager), best) == "fused eager"
