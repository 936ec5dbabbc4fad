"""Figures the README and docs/ quote in prose, each recomputed from the results file it names.

The tables of the README and docs are generated blocks (`doc_blocks`). A figure in a sentence
cannot be, so each one is registered here: the document, the sentence as written with `{}` where
each figure stands, the results file the figures come from, and how to compute them from that
file, formatted as the sentence prints them. `check` reports every sentence that is not in its
document exactly as the records give it (line breaks and indentation count as one space): a
figure edited by hand, a sentence reworded without its entry, or records that moved.

    >>> check(Path("."))          # [] when every registered sentence holds
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import results
from harness.records import load_records
from harness.report.doc_tables import BASE, headline_run, tokens_run
from harness.report.markup import fmt_ratio
from harness.report.runs import Where, needs, one_run
from harness.report.tables import step_median
from harness.run.methods.muon import ForgeMuon, TorchMuon
from harness.run.methods.no_optimizer import NoOptimizer
from harness.sources import (
    ARCHIVE,
    CLIP,
    COMPILE,
    COPY_ENGINE,
    FP8,
    FP8_COMPILED,
    GPU_TESTS,
    GRAPH_PEAK,
    HEADLINE,
    INT8_GROUPS,
    KAHAN,
    LAUNCHES,
    LLAMA8B_GRAPHED_H100,
    MASKED,
    MUON,
    MUTATION,
    OVERLAP,
    OVERLAP_RUNS,
    REFERENCE,
    REFERENCE_EXACTNESS,
    RESULTS,
    STREAM,
    TOKENS,
)


@dataclass(frozen=True)
class Figure:
    """One sentence of a document with the figures in it, and where they come from."""

    doc: str  # relative to the repository root
    text: str  # the sentence as the document writes it, `{}` for each figure
    source: str  # the results file (or files) the figures are computed from
    compute: Callable[[Path], Sequence[str]]  # the figures, formatted, from the files under the root

    def expected(self, root: Path) -> str:
        return self.text.format(*self.compute(root))


def _flat(text: str) -> str:
    """Runs of whitespace (line breaks, indentation) as one space."""
    return re.sub(r"\s+", " ", text)


def check(root: Path, figures: Sequence[Figure] | None = None) -> list[str]:
    """One line per registered sentence that its document does not hold as the records give it."""
    problems = []
    for figure in FIGURES if figures is None else figures:
        path = root / figure.doc
        try:
            expected = figure.expected(root)
        except (OSError, LookupError, ValueError) as err:
            problems.append(f"{figure.doc}: cannot compute from {figure.source}: {err}")
            continue
        if _flat(expected) not in _flat(path.read_text()):
            problems.append(f"{figure.doc}: expected, from {figure.source}: {expected!r}")
    return problems


# ---------------------------------------------------------------------------------------------
# The figures


def _headline_steps(root: Path) -> list[str]:
    record = headline_run(root).point(BASE)
    return [str(record["steps"]), str(record["warmup_steps"])]


def _eager_base_spread(root: Path) -> list[str]:
    """Fused AdamW's eager Llama-3.1-8B step at batch 1, seq 1024 over every run in results/."""
    records = load_records([root / RESULTS], exclude_dirs=("baselines",))
    where = Where()
    steps = [
        step_median(r)
        for r in records
        if r.get("method_label") == BASE and r.get("status") == "ok" and where.matches(r)
    ]
    return [f"{min(steps):.1f}", f"{max(steps):.1f}"]


def _operand_reads(root: Path) -> list[str]:
    """What operand reads cost the kernel at T >= 1024: 1 - (no operand reads) / full."""
    costs = [1 - r["ws_first_lap_ms"] / r["ws_ms"] for r in results.read(root / OVERLAP) if r["T"] >= 1024]
    return [f"{100 * min(costs):.0f}", f"{100 * max(costs):.0f}"]


def _span(values: Sequence[float], digits: int = 2) -> list[str]:
    """The least and the largest of `values`, formatted: a range that covers every row it names."""
    return [f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"]


def _update_rate(root: Path) -> list[str]:
    """The update warps' rate at T = 1024: the update's bytes over the update half's time, TB/s."""
    rates = [
        r["update_bytes"] / r["ws_epilogue_only_ms"] / 1e9
        for r in results.read(root / OVERLAP)
        if r["T"] == 1024
    ]
    return _span(rates)


def _copy_engine(root: Path) -> dict[str, list[float]]:
    """The update fed by bulk copies (`prefetch_*` candidates), per quantity and row set: its update
    half in ms and over the shipped kernel's update half, and its kernel over the shipped kernel,
    with 3 operand stages (`_s3`) and 4 (`_s4`), on gate and down (`gd`) and on q."""
    found: dict[str, list[float]] = {}
    for r in results.read(root / COPY_ENGINE):
        rows = "q" if r["shape_name"] == "q" else "gd"
        for stages in ("s3", "s4"):
            for name in (k[: -len("_update_only_ms")] for k in r if k.endswith(f"_{stages}_update_only_ms")):
                update = r[f"{name}_update_only_ms"]
                found.setdefault(f"update_ms_{stages}_{rows}", []).append(update)
                found.setdefault(f"update_{stages}_{rows}", []).append(update / r["ws_epilogue_only_ms"])
                found.setdefault(f"kernel_{stages}_{rows}", []).append(r[f"{name}_ms"] / r["shipped_ms"])
    return found


def _copy_engine_tried(root: Path) -> list[str]:
    c = _copy_engine(root)
    return [
        *_span(c["update_s3_gd"]), *_span(c["update_s3_q"]), *_span(c["kernel_s3_gd"]),
        *_span(c["kernel_s3_q"]), *_span(c["update_s4_gd"]), *_span(c["update_s4_q"]),
    ]  # fmt: skip


def _pingpong_tiles(root: Path) -> list[str]:
    """One consumer's update a tile at 1,024 and 4,096 tokens, its least ratio to the 8 update
    warps', theirs, and the main loop a tile at 16,384 (`doc_probes.pingpong_tile_times`)."""
    from harness.report.doc_probes import FED, PINGPONG, newest_run, pingpong_tile_times

    found = newest_run(root, PINGPONG, without=FED)
    if found is None:
        raise LookupError(f"no overlap run under {OVERLAP_RUNS} timed the ping-pong kernel")
    tiles = pingpong_tile_times(found[1])
    at = lambda T, key: [t[key] for t in tiles if t["T"] == T and t[key] is not None]  # noqa: E731
    ratios = [t["update_us"] / t["warps_us"] for t in tiles if t["update_us"] is not None]
    return [
        *_span(at(1024, "update_us"), 0), *_span(at(4096, "update_us"), 0), f"{min(ratios):.1f}",
        *_span([t["warps_us"] for t in tiles], 1), *_span(at(16384, "main_us"), 0),
    ]  # fmt: skip


def _point(root: Path, path: str, label: str, batch: int = 1, seq: int = 1024) -> dict:
    """The one ok record of `label` at (batch, seq) in a results file; a clear error for none or several."""
    found = [
        r
        for r in load_records([root / path])
        if r.get("status") == "ok"
        and r.get("method_label") == label
        and (int(r["batch_size"]), int(r["seq_len"])) == (batch, seq)
    ]
    if len(found) != 1:
        raise LookupError(
            f"{len(found)} ok records of {label} at batch {batch}, seq {seq} in {path}: cite one"
        )
    return found[0]


def _fp8_compiled(root: Path) -> list[str]:
    """torchao's FP8 compiled (the archived run, with the full attention mask) at batch 1, seq 1024,
    and FORGE FP8 graphed (bf16 and int8 states, the current run) over its median step and peak."""
    compiled = _point(root, FP8_COMPILED, "fused_adamw_fp8_compile")
    figures = [compiled["time"][:10], f"{step_median(compiled):.1f}"]
    figures += [f"{compiled['step_time_ms_min']:.1f}", f"{compiled['step_time_ms_p90']:.1f}"]
    figures.append(f"{compiled['peak_alloc_gib']:.2f}")
    for label in ("forge_fp8_graph", "forge_fp8_int8_graph"):
        point = _point(root, FP8, label)
        figures.append(fmt_ratio(step_median(point) / step_median(compiled)))
        figures.append(fmt_ratio(point["peak_alloc_gib"] / compiled["peak_alloc_gib"]))
    return figures


def _host_per_layer(root: Path) -> list[str]:
    data = json.loads((root / LAUNCHES).read_text())
    layers = data["layers"]
    forge = data["rows"][f"ForgeLinear stack of {layers}, per layer"]["host_us"]
    plain = data["rows"][f"nn.Linear stack of {layers}, per layer"]["host_us"]
    return [f"{forge:.1f}", f"{plain:.1f}", str(layers)]


def _second_stream(root: Path) -> list[str]:
    at = [Where(batch_size=b) for b in (1, 2)]
    run = one_run(root, STREAM, needs(["forge_bf16_stream_graph", "forge_bf16_graph"], *at))
    return [fmt_ratio(run.step("forge_bf16_stream_graph", w) / run.step("forge_bf16_graph", w)) for w in at]


def _no_saving_from(root: Path) -> list[str]:
    """The fewest tokens at which FORGE bf16's graphed peak is fused AdamW's, without checkpointing."""
    run = tokens_run(root)
    for batch in (1, 2, 4, 8):
        at = Where(batch_size=batch)
        if round(run.peak("forge_bf16_graph", at), 1) >= round(run.peak(BASE + "_graph", at), 1):
            return [f"{batch * 1024:,}"]
    raise ValueError(f"{TOKENS}: FORGE bf16's peak stays under fused AdamW's at every token count")


def _capture_pays(root: Path) -> list[str]:
    """FORGE bf16 eager and graphed at 1,024 tokens: Qwen3-0.6B and Llama-3.1-8B in the token sweep,
    and Llama-3.1-8B in the headline run."""
    small, llama = Where(model="qwen3-0.6b"), Where()
    q, t, h = tokens_run(root, "qwen3-0.6b"), tokens_run(root), headline_run(root)
    steps = [q.step("forge_bf16", small), q.step("forge_bf16_graph", small), t.step("forge_bf16", llama)]
    steps += [t.step("forge_bf16_graph", llama), h.step("forge_bf16"), h.step("forge_bf16_graph")]
    return [f"{ms:.1f}" for ms in steps]


def _eager_small_model(root: Path) -> list[str]:
    """FORGE bf16 on Qwen3-0.6B at 1,024 tokens, eager and graphed, in the token sweep."""
    small, run = Where(model="qwen3-0.6b"), tokens_run(root, "qwen3-0.6b")
    return [f"{run.step(label, small):.1f}" for label in ("forge_bf16", "forge_bf16_graph")]


def _compiled(root: Path) -> list[str]:
    """Llama-3.1-8B at batch 1: FORGE bf16 and fused AdamW compiled, then both eager, in one run."""
    labels = ["forge_bf16_compile", BASE + "_compile", "forge_bf16", BASE]
    run = one_run(root, COMPILE, needs(labels))
    return [f"{run.step(label):.1f}" for label in labels]


def _graphed_headline(root: Path) -> list[str]:
    run = headline_run(root)
    return [f"{run.step(label):.1f}" for label in ("forge_bf16_graph", BASE + "_graph")]


def _kahan(root: Path) -> list[str]:
    labels = ["forge_bf16_graph", "forge_bf16_kahan_graph", "forge_int8_graph", "forge_int8_kahan_graph"]
    run = one_run(root, KAHAN, needs(labels))
    bf16, bf16_k, int8, int8_k = (run.peak(label) for label in labels)
    params = float(run.point("forge_bf16_graph")["n_params"])
    steps = [run.step(label) for label in labels]
    return [
        f"{bf16_k:.2f}",
        f"{bf16:.2f}",
        f"{int8_k:.2f}",
        f"{int8:.2f}",
        f"{bf16_k - bf16:.2f}",
        f"{params / 1e9:.2f}",
        f"{steps[1] / steps[0]:.3f}x",
        f"{steps[1]:.1f}",
        f"{steps[0]:.1f}",
        f"{steps[3]:.1f}",
        f"{steps[2]:.1f}",
        f"{steps[3] / steps[2]:.3f}x",
    ]


def _int8_groups(root: Path) -> list[str]:
    run = one_run(root, INT8_GROUPS, needs(["forge_int8", "forge_int8_g128"]))
    return [f"{run.peak('forge_int8_g128'):.2f}", f"{run.peak('forge_int8'):.2f}"]


def _clipped_peaks(root: Path) -> list[str]:
    labels = ["forge_bf16_clip_graph", "forge_bf16_graph", "forge_int8_clip_graph", "forge_int8_graph"]
    run = one_run(root, CLIP, needs(labels))
    bf16, bf16_plain, int8, int8_plain = (run.peak(label) for label in labels)
    if (f"{bf16:.2f}", f"{int8:.2f}") != (f"{bf16_plain:.2f}", f"{int8_plain:.2f}"):
        raise ValueError(f"{CLIP}: the clipped peaks differ from the unclipped ones")
    return [f"{bf16:.2f}", f"{int8:.2f}"]


def _masked_attention(root: Path) -> list[str]:
    """What the masked attention cost a graphed 8,192-token step: before (b75d62b) over after (debfb64)."""
    before, after = (
        {r["method_label"]: r for r in results.read(root / MASKED.format(c))} for c in ("b75d62b", "debfb64")
    )
    cost = [
        before[m]["step_time_ms_median"] / after[m]["step_time_ms_median"] - 1
        for m in ("no_optimizer_graph", "forge_bf16_graph")
    ]
    return [f"{100 * c:.1f}" for c in cost]


def _repeated_kv(root: Path) -> list[str]:
    sites = json.loads((root / GRAPH_PEAK).read_text())["difference_by_site"]
    return [f"{sum(s['difference_gib'] for s in sites if 'repeat_kv' in s['site']):.1f}"]


def _gpu_tests_passed(root: Path) -> list[str]:
    found = re.search(r"(\d+) passed", (root / GPU_TESTS).read_text())
    if found is None:
        raise ValueError(f"{GPU_TESTS}: no pytest summary")
    return [found.group(1)]


def _mutation_score(root: Path) -> list[str]:
    """The mutation record's mutants run, killed and share killed, then each file's share of its own."""
    record = json.loads((root / MUTATION).read_text())
    total = record["total"]
    shares = [f"{path} {f['score']:.1%} of {f['mutants']}" for path, f in record["files"].items()]
    return [str(total["mutants"]), str(total["killed"]), f"{total['score']:.1%}", ", ".join(shares)]


def _muon(root: Path) -> list[str]:
    """FORGE's Muon against torch's on Llama-3.1-8B at 1,024 tokens: the graphed peaks and what FORGE
    saves, its step over torch's (eager and graphed), and its graphed step against the graphed floor."""
    ours, theirs, floor = ForgeMuon.name, TorchMuon.name, f"{NoOptimizer.name}_graph"
    labels = [f"{method}{mode}" for method in (ours, theirs) for mode in ("_graph", "")] + [floor]
    run = one_run(root, MUON, needs(labels, Where()))
    forge, torch = run.peak(f"{ours}_graph"), run.peak(f"{theirs}_graph")
    ratios = sorted(run.step(f"{ours}{mode}") / run.step(f"{theirs}{mode}") for mode in ("", "_graph"))
    return [
        f"{forge:.1f}",
        f"{torch:.1f}",
        f"{torch - forge:.1f}",
        f"{ratios[0]:.2f}-{ratios[1]:.2f}x",
        f"{run.step(f'{ours}_graph') / 1000:.2f}",
        f"{run.step(floor) / 1000:.2f}",
    ]


def _by_label(root: Path, path: str) -> dict[tuple[str, int], dict]:
    """The ok records of one results file by (method label, batch size): one run, one GPU."""
    records = [r for r in load_records([root / path]) if r.get("status") == "ok"]
    return {(r["method_label"], int(r["batch_size"])): r for r in records}


def _distance(x: float) -> str:
    """A distance as the docs print it: three significant figures, 5.45e-5 rather than 5.45e-05."""
    if x >= 1e-3:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _reference_steps(root: Path) -> list[str]:
    """Our FORGE bf16's step over the paper's code's, eager and graphed, at 512 tokens."""
    got = _by_label(root, REFERENCE)
    ratio = [step_median(got[(f"forge_bf16{m}", 1)]) / step_median(got[(f"forge_reference_bf16{m}", 1)])
             for m in ("", "_graph")]  # fmt: skip
    return [fmt_ratio(r) for r in ratio]


def _reference_exactness(root: Path) -> list[str]:
    cases = json.loads((root / REFERENCE_EXACTNESS).read_text())["cases"]
    fp32, ops, bf16 = cases["fp32"], cases["bf16_operands"], cases["bf16"]
    values = [
        fp32["ours"],
        fp32["torch"],
        fp32["paper"],
        ops["ours"],
        ops["paper"],
        ops["torch_tensor_cores"],
    ]
    values += [ops["torch_cuda_cores"], bf16["paper_to_ours_nearest"], bf16["ours_nearest"], bf16["paper"]]
    return [_distance(v) for v in values + [bf16["torch"]]]


def _graphed_check(root: Path) -> list[str]:
    """Graphed FORGE bf16 against the graphed floor at batch 1 and 4 (1,024 and 4,096 tokens)."""
    got = _by_label(root, LLAMA8B_GRAPHED_H100)
    figures = []
    for batch in (1, 4):
        forge, floor = (
            step_median(got[("forge_bf16_graph", batch)]),
            step_median(got[("no_optimizer_graph", batch)]),
        )
        figures += [f"{forge:.1f}", f"{floor:.1f}", f"{forge / floor:.3f}x"]
    return figures


def _muon_fast(root: Path) -> list[str]:
    """torch's Muon, FORGE's with the Gram iteration's symmetric products, FORGE's with torch's
    iteration: graphed steps and peaks on Llama-3.1-8B at 1,024 tokens, one run."""
    got = _by_label(root, LLAMA8B_GRAPHED_H100)
    torch_ = got[(f"{TorchMuon.name}_graph", 1)]
    plain = got[(f"{ForgeMuon.name}_graph", 1)]
    fast = got[(f"{ForgeMuon.name}_fast_graph", 1)]  # forge_muon with a faster newton_schulz=
    return [
        f"{step_median(torch_):,.1f}",
        f"{torch_['peak_alloc_gib']:.2f}",
        f"{step_median(fast):,.1f}",
        fmt_ratio(step_median(fast) / step_median(torch_)),
        f"{fast['peak_alloc_gib']:.2f}",
        f"{step_median(plain):,.1f}",
        f"{plain['peak_alloc_gib']:.2f}",
    ]


PERF, README, DESIGN = "docs/performance.md", "README.md", "docs/how-forge-works.md"
RECIPES = "docs/training-recipes.md"
PAPER_DOC = "docs/paper.md"
TESTING = "docs/testing.md"

FIGURES: tuple[Figure, ...] = (
    Figure(
        RECIPES,
        "FORGE's Muon peaked at {} GiB against torch's {}, {} GiB saved where 7.6 were predicted, at {}"
        " torch's step (Newton-Schulz takes most of it: {} s a graphed step against the graphed"
        " no-optimizer floor's {})",
        MUON,
        _muon,
    ),
    Figure(README, "batch 1, seq 1024, {} steps of which {} are warm-up", HEADLINE, _headline_steps),
    Figure(
        README,
        "Qwen3-0.6B at 1,024 tokens took {} ms a step eager and {} graphed",
        TOKENS,
        _eager_small_model,
    ),
    Figure(
        README,
        "compiled FORGE bf16 took {} ms against compiled fused AdamW's {}, where eager they took {} and {}",
        COMPILE,
        _compiled,
    ),
    Figure(README, "{} against {} ms in the table below", HEADLINE, _graphed_headline),
    Figure(
        RECIPES,
        "one run on {}, with the full attention mask, `"
        + FP8_COMPILED
        + "`): {} ms ({}-{}), peak {} GiB. FORGE FP8 graphed is {} its median at {} its peak; with int8"
        " states {}, at {}.",
        f"{FP8_COMPILED}, {FP8}",
        _fp8_compiled,
    ),
    Figure(
        PERF,
        "eager Llama-3.1-8B step at batch 1 took {} to {} ms over the runs of it in results/",
        f"{RESULTS}*.jsonl, {ARCHIVE}",
        _eager_base_spread,
    ),
    Figure(PERF, "none without checkpointing from {} tokens on", TOKENS, _no_saving_from),
    Figure(PERF, "Operand reads through L2 cost {}-{}% of the kernel at T >= 1024", OVERLAP, _operand_reads),
    Figure(
        PERF,
        "the update warps move them at {}-{} TB/s (bytes over the update half's time, T = 1024 rows)",
        OVERLAP,
        _update_rate,
    ),
    Figure(
        PERF,
        "on gate and down the update half {}-{}x the shipped one's with 3 operand stages (q {}-{}x), but the"
        " kernel {}-{}x (q {}-{}x); with 4 stages the ring is too shallow to gain (the update half {}-{}x on"
        " gate and down, q {}-{}x)",
        COPY_ENGINE,
        _copy_engine_tried,
    ),
    Figure(
        PERF,
        "One consumer updates a tile in {}-{} us at T = 1024 and {}-{} us at 4096, {}x and more the 8 update"
        " warps' {}-{} us; only at 16384 does a main loop ({}-{} us a tile) outlast it",
        OVERLAP_RUNS,
        _pingpong_tiles,
    ),
    Figure(
        PERF,
        "A ForgeLinear's forward and backward cost the host {} us a layer where nn.Linear's cost {}, in a"
        " stack of {} Qwen3-0.6B q_proj layers",
        LAUNCHES,
        _host_per_layer,
    ),
    Figure(PERF, "graphed, {} and {} one stream's step at batch 1 and 2", STREAM, _second_stream),
    Figure(
        DESIGN,
        "Qwen3-0.6B steps in {} ms eager and {} graphed. Llama-3.1-8B at batch 1 is at the edge: {} eager"
        " against {} graphed in one run, {} against {} in another where the host fell behind",
        f"{TOKENS}, {HEADLINE}",
        _capture_pays,
    ),
    Figure(
        DESIGN,
        "({} against {} GiB with bf16 states, {} against {} with int8: +{} GiB for {} billion parameters),"
        " and {} FORGE bf16's step ({} against {} ms; int8 states {} against {}, {})",
        KAHAN,
        _kahan,
    ),
    Figure(DESIGN, "groups of 128 peak at {} against {} GiB", INT8_GROUPS, _int8_groups),
    Figure(
        DESIGN,
        "the clipped peaks equal the unclipped ones ({} GiB bf16, {} int8, graphed",
        CLIP,
        _clipped_peaks,
    ),
    Figure(
        DESIGN,
        "that cost the graphed floor {}% of its step and FORGE bf16 {}%",
        MASKED.format("*"),
        _masked_attention,
    ),
    Figure(DESIGN, "a capture at batch 4 held {} GiB of repeated keys and values", GRAPH_PEAK, _repeated_kv),
    Figure(TESTING, "Of the {} mutants run, the tests killed {}, {}: {}.", MUTATION, _mutation_score),
    Figure(
        DESIGN,
        "A run of the GPU suite on an H200 passed its {} tests",
        GPU_TESTS,
        _gpu_tests_passed,
    ),
    Figure(
        PAPER_DOC,
        "With bf16 states this repository's FORGE took {} the paper's code's step eager and {} graphed",
        REFERENCE,
        _reference_steps,
    ),
    Figure(
        PAPER_DOC,
        "in fp32, this repository's FORGE {} against torch.optim's {}, the paper's {} (its fp32 GEMM runs"
        " in tf32); with bf16 operands and fp32 weights and states, ours {}, the paper's {}, torch's {}"
        " (tensor cores) and {} (CUDA cores); in bf16 rounded to nearest, the two FORGEs land {} apart,"
        " ours {} and the paper's {} from the fp64 weights (torch's bf16 AdamW: {})",
        REFERENCE_EXACTNESS,
        _reference_exactness,
    ),
    Figure(
        PERF,
        "{} ms against the floor's {} at 1,024 tokens ({}, the warp-specialized kernel as before), {}"
        " against {} at 4,096 ({}, the ping-pong kernel on the bf16 layers)",
        LLAMA8B_GRAPHED_H100,
        _graphed_check,
    ),
    Figure(
        RECIPES,
        "torch's Muon took {} ms a step and peaked at {} GiB; FORGE's Muon with"
        " `newton_schulz=\"gram_symmetric\"` (`forge_muon_fast`) {} ms ({} torch's) at {} GiB; FORGE's"
        " Muon with torch's iteration {} ms at {} GiB",
        LLAMA8B_GRAPHED_H100,
        _muon_fast,
    ),
)
