"""The generated tables of README.md and docs/: each equals what its results file gives now, an
edit by hand inside a block is caught, and a table is never spliced from two runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import results
from harness.report import doc_blocks
from harness.report.doc_blocks import BEGIN, END, BlockError, block_names, render, stale_blocks, write_blocks
from harness.report.runs import Where, needs, one_run

REPO = Path(__file__).resolve().parents[3]


def _block(name: str, body: str) -> str:
    return f"{BEGIN.format(name=name)}\n{body}\n{END.format(name=name)}"


def test_every_generated_block_of_the_readme_and_docs_equals_its_records():
    """Regenerated in memory from results/, every block reads as committed: a figure typed over, or
    results that moved without `python -m harness report`, fail here, named by file and block."""
    assert stale_blocks(REPO) == []
    names = {name for path in doc_blocks.doc_files(REPO) for name in block_names(path.read_text())}
    assert {"llama8b-headline", "paper-setting", "paper-claims", "tokens-detail", "kernel-overlap"} <= names
    assert names <= set(doc_blocks.BLOCKS), "a block without a builder"


def test_a_figure_edited_by_hand_inside_a_block_is_stale_and_rewritten(tmp_path):
    builders = {"ratio": lambda root: "| FORGE int8 | 1.01x |"}
    text = f"# Doc\n\nBefore.\n\n{_block('ratio', '| FORGE int8 | 1.02x |')}\n\nAfter.\n"
    (tmp_path / "README.md").write_text(text)
    assert stale_blocks(tmp_path, builders) == [
        "README.md: ratio: line 6: 1.02x where the records give 1.01x ('| FORGE int8 | 1.01x |')"
    ]
    assert write_blocks(tmp_path, builders) == [tmp_path / "README.md"]
    fixed = (tmp_path / "README.md").read_text()
    assert (
        "1.01x" in fixed
        and "1.02x" not in fixed
        and fixed.startswith("# Doc\n\nBefore.")
        and fixed.endswith("After.\n")
    )
    assert stale_blocks(tmp_path, builders) == [] and write_blocks(tmp_path, builders) == []


def test_a_figure_planted_in_the_readmes_headline_is_named_with_its_line(tmp_path):
    """The README's headline block with one figure typed over: the failure names the figure, what
    the records give, and the line, not just the block."""
    text = (REPO / "README.md").read_text()
    block = _block_text(text, "llama8b-headline")
    row = next(line for line in block.splitlines() if line.startswith("| FORGE, bf16 states |"))
    right = row.split(" | ")[1]
    planted = text.replace(row, row.replace(f"| {right} |", "| 123.1 |", 1))
    (tmp_path / "README.md").write_text(planted)
    (tmp_path / "results").symlink_to(REPO / "results")
    line = planted[: planted.index(row.replace(f"| {right} |", "| 123.1 |", 1))].count("\n") + 1
    builders = {"llama8b-headline": doc_blocks.BLOCKS["llama8b-headline"]}
    assert stale_blocks(tmp_path, builders) == [
        f"README.md: llama8b-headline: line {line}: 123.1 where the records give {right} ({row!r})"
    ]


def _block_text(text: str, name: str) -> str:
    return text.split(BEGIN.format(name=name), 1)[1].split(END.format(name=name), 1)[0]


def test_an_unknown_block_or_a_marker_without_its_pair_is_refused_with_its_line():
    builders = {"known": lambda root: "x"}
    with pytest.raises(BlockError, match=r"doc.md:3: no builder for block 'other'"):
        render(f"a\n\n{_block('other', '')}\n", Path("."), builders, where="doc.md")
    with pytest.raises(BlockError, match="has no `<!-- end generated: known -->`"):
        render(f"{BEGIN.format(name='known')}\nx\n", Path("."), builders, where="doc.md")
    with pytest.raises(BlockError, match="without its start"):
        render(f"{_block('known', 'x')}\n{END.format(name='known')}\n", Path("."), builders)


def _point(label: str, commit: str, time: str, ms: float, dirty: bool = False) -> dict:
    record = results.empty_record()
    record.update(
        sweep="s",
        point=f"{label}/llama3.1-8b/b1/s1024/h200",
        time=time,
        status="ok",
        method=label.removesuffix("_graph"),
        method_label=label,
        model="llama3.1-8b",
        batch_size=1,
        seq_len=1024,
        step_time_ms_median=ms,
        peak_alloc_gib=10.0,
        env={"git_commit": commit * 40, "git_dirty": dirty},
    )
    return record


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_table_takes_the_latest_clean_run_that_measured_all_its_points(tmp_path):
    older = [
        _point("fused_adamw", "a", "2026-01-01T00:00:00", 100.0),
        _point("forge_bf16", "a", "2026-01-01T00:01:00", 90.0),
    ]
    # a later run re-measured one point only: a table needing both stays with the older run, whole
    partial = [_point("forge_bf16", "b", "2026-01-02T00:00:00", 80.0)]
    _write(tmp_path / "results" / "x.jsonl", older + partial)
    run = one_run(tmp_path, "results/x.jsonl", needs(["fused_adamw", "forge_bf16"]))
    assert run.short == "aaaaaaa" and run.step("forge_bf16") / run.step("fused_adamw") == 0.9
    assert one_run(tmp_path, "results/x.jsonl", needs(["forge_bf16"])).short == "bbbbbbb"


def test_a_run_from_a_dirty_tree_or_missing_a_point_is_refused_saying_what_it_lacks(tmp_path):
    dirty = [_point("fused_adamw", "c", "2026-01-01T00:00:00", 100.0, dirty=True)]
    dirty.append(_point("forge_bf16", "c", "2026-01-01T00:01:00", 90.0, dirty=True))
    _write(
        tmp_path / "results" / "x.jsonl", dirty + [_point("fused_adamw", "d", "2026-01-02T00:00:00", 99.0)]
    )
    with pytest.raises(LookupError) as err:
        one_run(tmp_path, "results/x.jsonl", needs(["fused_adamw", "forge_bf16"], Where()))
    assert "s at ddddddd: forge_bf16" in str(err.value) and "s at ccccccc: dirty" in str(err.value)
    assert "Measure them in one sweep" in str(err.value)


def _overlap_record(time: str, **timings) -> dict:
    """One point of `python -m harness.kernels.overlap` as it writes it (the fields the blocks read)."""
    env = dict(gpu_name="NVIDIA H200", torch="2.11.0", triton="3.6.0", git_commit="abcdef0123")
    point = dict(shape_name="gate", N=14336, K=4096, T=1024, roofline_ms=0.176, ws_epilogue_only_ms=0.21)
    return dict(env=env, time=time, **point, **timings)


def test_the_pingpong_kernels_block_reads_the_newest_run_that_timed_it(tmp_path):
    """`kernel-pingpong`: what to run while no overlap run timed the ping-pong kernel; then, from the
    newest run that did, its faster ring depth per point against cuBLAS, the shipped kernel and the
    roofline, the shipped kernel's halves from the same run, and how many elements differed."""
    from harness.report.doc_probes import kernel_pingpong

    logs = tmp_path / "results" / "device-logs"
    logs.mkdir(parents=True)
    same = {"w": 0, "states": [0, 0]}
    prefetching = dict(shipped_ms=0.3, prefetch_u2_r16_s4_ms=0.27, prefetch_u2_r16_s4_differs=same)
    record = _overlap_record("2026-12-05", **prefetching)
    (logs / "overlap-20261205-841c142.jsonl").write_text(json.dumps(record))
    assert kernel_pingpong(tmp_path).startswith("Not measured yet. `python -m harness.kernels.overlap")
    timings = dict(
        cublas_gemm_ms=0.176,
        shipped_ms=0.300,
        ws_mma_only_ms=0.180,
        pingpong_s6_ms=0.264,
        pingpong_s6_differs=same,
        pingpong_s4_ms=0.270,
        pingpong_s4_differs=same,
    )
    (logs / "overlap-20270105-1234567.jsonl").write_text(json.dumps(_overlap_record("2027-01-05", **timings)))
    block = kernel_pingpong(tmp_path)
    row = (
        "| gate 14336x4096, T = 1024 | 0.176 | 0.176 | 0.300 | 0.264 (s6) | 0.88x | 1.50x"
        " | 1.02x | 1.19x | 6.6 / 12.8 / 7.7 | 0 |"
    )
    assert row in block, block
    assert "`results/device-logs/overlap-20270105-1234567.jsonl` (NVIDIA H200, torch 2.11.0" in block


def _breakdown_record(time: str, **fields) -> dict:
    """`python -m harness.kernels.launch_breakdown`'s record, the fields the host block reads."""
    env = dict(
        torch="2.11.0", git_commit="abcdef0123", cpu_model="Intel(R) Xeon(R) Platinum 8480+", cpu_count=224
    )
    rows = {"elementwise_update, 65 norms": {"host_us": 1300.0}, "vector_update, 65 norms": {"host_us": 90.0}}
    pairs = {
        "one layer": [180.0, 160.0],
        "one layer, this thread": [110.0, 100.0],
        "a layer of 28": [125.0, 115.0],
        "a layer of 28, this thread": [121.0, 117.0],
    }
    record = dict(env=env, time=time, device="NVIDIA H100 80GB HBM3", shape=dict(T=1024, N=2048, K=1024))
    return {**record, "rows": rows, "host_pairs": pairs, "norms": 65, "repeats": 3, "calls": 2000, **fields}


def test_the_host_block_reads_the_newest_gpu_run_of_the_launch_probe(tmp_path):
    """`host-launches`: what to run while no launch-breakdown record has its host pairs (the older
    format, a `--host-only` run on a CPU); then the newest GPU run's layer rows, ForgeLinear against
    nn.Linear, and the norms' one launch against one launch each, naming the GPU and the host CPU."""
    from harness.report.doc_probes import host_launches

    logs = tmp_path / "results" / "device-logs"
    logs.mkdir(parents=True)
    (logs / "launch-breakdown-1024x2048x1024-20261204-9616b23.json").write_text(json.dumps({"rows": {}}))
    host_only = _breakdown_record("2027-01-06T10:00:00", host_only=True)
    (logs / "launch-breakdown-16x16x16-host-only-20270106-1234567.json").write_text(json.dumps(host_only))
    assert host_launches(tmp_path).startswith("Not measured yet. `python -m harness.kernels.launch_breakdown")
    name = "launch-breakdown-1024x2048x1024-20270105-1234567.json"
    (logs / name).write_text(json.dumps(_breakdown_record("2027-01-05T10:00:00", host_only=False)))
    block = host_launches(tmp_path)
    assert "| one layer, backward on the device thread | 180.0 | 160.0 | 1.12x |" in block, block
    assert "| a layer of 28, backward on this thread | 121.0 | 117.0 | 1.03x |" in block
    assert "| 65 norm weights: one launch (65 launches) | 90.0 | 1300.0 | 0.07x |" in block
    assert f"`results/device-logs/{name}` (NVIDIA H100 80GB HBM3; host CPU Intel(R) Xeon(R)" in block


def test_the_eager_host_block_waits_for_a_whole_run(tmp_path):
    """`eager-host` says what to run while results/eager_host.jsonl lacks a clean run of its 24 points."""
    from harness.report.doc_tables import eager_host

    assert eager_host(tmp_path).startswith("Not measured yet. `python -m harness sweep +exp=eager_host`")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "eager_host.jsonl").write_text("")
    assert eager_host(tmp_path).startswith("Not measured yet.")


def test_the_eager_host_block_gives_the_host_time_beyond_the_floor(tmp_path):
    """From one clean run: each model's eager steps, FORGE's against fused AdamW's, the graphed
    steps, and FORGE's host time beyond the floor's, (eager - graphed) FORGE less the floor's; the
    line names the run, the GPU and the host CPU."""
    from harness.report.doc_tables import EAGER_MODELS, eager_host

    env = dict(git_commit="abcdef0123", git_dirty=False, driver="580", cuda="13.0", torch="2.11.0")
    env.update(triton="3.6.0", transformers="5.17.0", cpu_model="AMD EPYC 9654", cpu_count=192)
    steps = {"no_optimizer": 125.0, "fused_adamw": 130.0, "forge_bf16": 127.0}
    records = []
    for model in EAGER_MODELS:
        for label, eager in steps.items():
            for suffix, ms in (("", eager), ("_graph", eager / 4 + (3.0 if label == "forge_bf16" else 0.0))):
                point = dict(
                    model=model, batch_size=1, seq_len=1024, method_label=label + suffix, status="ok"
                )
                point.update(sweep="eager_host", env=env, gpu_name="NVIDIA H100 80GB HBM3", time="2027-01-05")
                records.append({**point, "step_time_ms_median": ms})
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "eager_host.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    block = eager_host(tmp_path)
    # FORGE: 127 - 34.75 = 92.25; the floor: 125 - 31.25 = 93.75; beyond it: -1.5
    assert "| qwen3-0.6b | 125.0 | 130.0 | 127.0 | 0.98x | 31.2 | 32.5 | 34.8 | -1.5 |" in block, block
    assert "host CPU AMD EPYC 9654 (192 cores)" in block and "NVIDIA H100 80GB HBM3" in block
