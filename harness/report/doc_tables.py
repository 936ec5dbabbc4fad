"""The measured tables of README.md and docs/, built from one run each (`runs`).

Each function takes the repository root and returns the Markdown of one generated block
(`doc_blocks` writes it between the block's markers): its table, and the line that names the run
behind it (file, sweep, commit, date, hardware) and the command that measures it again. Nothing
here is typed in by hand but the paper's own figures (`harness.report.paper`) and the words.

Ratios are computed from the records' full-precision values, then rounded, so a table never
disagrees with reports/ by a rounding step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from harness.records import Record
from harness.report import paper
from harness.report.markup import Table, fmt_gib, fmt_ms, fmt_ratio, to_markdown
from harness.report.names import config_title
from harness.report.runs import LLAMA, Run, Where, needs, one_run
from harness.sources import (
    CHECKPOINTING,
    CLIP,
    EAGER_HOST,
    HEADLINE,
    INT8_GROUPS,
    KERNEL_TABLES,
    KERNELS_LLAMA,
    OVERLAP,
    PAPER,
    PEAKS,
    QWEN_SCALING,
    TOKENS,
    TP2_CAPACITY,
)

QWEN14B = "qwen3-14b"
BATCHES = (1, 2, 4, 8)  # x 1,024 tokens: the token sweep's steps
BASE, FP32GRAD, FLOOR = "fused_adamw", "fused_adamw_fp32grad", "no_optimizer"


def _table(header: Sequence[str], rows: list[list[str]], align: str = "") -> str:
    return to_markdown(Table("doc", "", list(header), rows, align=align)).rstrip()


def _tokens(batch: int, seq: int = 1024) -> str:
    return f"{batch * seq:,}"


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _span(low: float, high: float) -> str:
    """'24-36%' for fractions 0.24 and 0.36."""
    return f"{100 * low:.0f}-{100 * high:.0f}%"


def _range(values: dict) -> tuple[float, float]:
    return min(values.values()), max(values.values())


def gradient_gib(record: Record, bytes_per_parameter: int = 2) -> float:
    """The weight gradient of the record's model in GiB (bf16: 2 bytes a parameter)."""
    return float(record["n_params"]) * bytes_per_parameter / 2**30


def _verdict(met: bool) -> str:
    return "reproduced" if met else "not reproduced"


def _reproduces(met: bool) -> str:
    return "reproduces" if met else "does not reproduce"


# ---------------------------------------------------------------------------------------------
# README: what it gives you


HEADLINE_ROWS = (BASE, "forge_bf16", "forge_int8", FLOOR)  # each titled by its conf/method file


def headline_run(root: Path) -> Run:
    """The latest run of `+exp=llama8b_graphs_h200` with every row of the headline, eager and graphed."""
    labels = [label + suffix for label in HEADLINE_ROWS for suffix in ("", "_graph")]
    return one_run(root, HEADLINE, needs(labels))


def _paper_figure(label: str) -> str:
    (base_ms, forge_ms), (base_gib, forge_gib) = paper.LLAMA_STEP_MS, paper.LLAMA_PEAK_GIB
    if label == BASE:
        return f"{base_ms:.1f} ms, ~{base_gib:.0f} GiB"
    if label.startswith("forge"):
        return f"{forge_ms:.1f} ms ({forge_ms / base_ms:.2f}x), {forge_gib:.1f} GiB (a)"
    return ""


def llama8b_headline(root: Path) -> str:
    """Step and peak of fused AdamW, FORGE and the floor on Llama-3.1-8B at batch 1, one run."""
    run = headline_run(root)
    graphed, eager = run.step(BASE + "_graph"), run.step(BASE)
    rows = []
    for label in HEADLINE_ROWS:
        g, e = run.step(label + "_graph"), run.step(label)
        peaks = f"{fmt_gib(run.peak(label + '_graph'))} / {fmt_gib(run.peak(label))}"
        rows.append(
            [config_title(label), fmt_ms(g), fmt_ratio(g / graphed), fmt_ms(e), fmt_ratio(e / eager), peaks]
        )
        rows[-1].append(_paper_figure(label))
    header = ["Method", "graphed ms", "vs fused AdamW", "eager ms", "vs fused AdamW"]
    header += ["peak GiB graphed / eager", "the paper's figure"]
    base = run.point(BASE)
    return "\n\n".join(
        [
            _table(header, rows, "lrrrrrl"),
            f"Data: {run.source()}; {run.hardware()}; from `python -m harness sweep +exp=llama8b_graphs_h200"
            " 'sweep.batch_sizes=[1]'`. Eager batch-1 steps are set by the host and vary between runs:"
            " compare graphed ratios.",
            "(a) The paper's figures, not measured (it names no state dtype for"
            " FORGE); its baseline keeps fp32 weight gradients (10 B a parameter), this table's bf16 (8):"
            f" FORGE removes {gradient_gib(base):.1f} GiB here, {gradient_gib(base, 4):.1f} there.",
        ]
    )


# ---------------------------------------------------------------------------------------------
# README: the paper's setting and its claims


PAPER_ROWS = (FP32GRAD, "forge_bf16", "forge_int8")
QWEN = Where(model=QWEN14B)


def paper_run(root: Path) -> Run:
    """The latest run of `+exp=paper_h200` with the Llama rows (eager and graphed) and Qwen3-14B's."""
    labels = [label + suffix for label in PAPER_ROWS for suffix in ("", "_graph")]
    return one_run(root, PAPER, needs(labels) + needs([FP32GRAD, "forge_bf16", "forge_int8"], QWEN))


def paper_setting(root: Path) -> str:
    """FORGE against the paper's fp32-gradient baseline on Llama-3.1-8B, and Qwen3-14B, one run."""
    run, floor_run = paper_run(root), headline_run(root)
    (base_ms, forge_ms), (base_gib, forge_gib) = paper.LLAMA_STEP_MS, paper.LLAMA_PEAK_GIB
    step, peak = run.step(FP32GRAD + "_graph"), run.peak(FP32GRAD)
    figures = {
        FP32GRAD: f"{base_ms:.1f} ms, ~{base_gib:.0f} GiB",
        "forge_int8": f"{forge_ms:.1f} ms ({forge_ms / base_ms:.2f}x),"
        f" {forge_gib:.1f} GiB ({forge_gib / base_gib:.2f}x)",
    }
    rows = []
    for label in PAPER_ROWS:
        g, p = run.step(label + "_graph"), run.peak(label)
        rows.append(
            [
                config_title(label),
                fmt_ms(g),
                fmt_ratio(g / step),
                fmt_gib(p),
                fmt_ratio(p / peak),
                figures.get(label, ""),
            ]
        )
    header = ["Llama-3.1-8B, batch 1, seq 1024", "graphed ms", "vs baseline", "peak GiB (eager)"]
    header += ["vs baseline", "the paper"]
    qwen_base = run.point(FP32GRAD, QWEN)
    int8_peak, int8_step = run.peak("forge_int8") / peak, run.step("forge_int8_graph") / step
    floor = floor_run.step(FLOOR + "_graph")
    gap = forge_ms - floor
    return "\n\n".join(
        [
            _table(header, rows, "lrrrrl"),
            f"Qwen3-14B in the same run: the fp32-gradient baseline is `{qwen_base.get('status')}`"
            f"{', as in the paper' if qwen_base.get('status') == 'oom' else ''}; FORGE int8 fits at"
            f" {fmt_gib(run.peak('forge_int8', QWEN))} GiB (the paper: {paper.QWEN14B_FORGE_GIB:.1f}),"
            f" FORGE bf16 at {fmt_gib(run.peak('forge_bf16', QWEN))}. Data: {run.source()}, from `python -m"
            " harness sweep +exp=paper_h200`; each claim's verdict and why a figure misses:"
            " [reports/tables/paper_comparison.md](../reports/tables/paper_comparison.md)."
            f" The memory cut {_reproduces(int8_peak <= paper.TARGET_PEAK_RATIO)}"
            f" ({fmt_ratio(int8_peak)} against the paper's {paper.TARGET_PEAK_RATIO:.2f}x); the step"
            f" {_reproduces(int8_step <= paper.TARGET_STEP_RATIO)} ({fmt_ratio(int8_step)} against"
            f" {paper.TARGET_STEP_RATIO:.2f}x): the graphed step with no optimizer at all takes"
            f" {fmt_ms(floor)}"
            f" ms in the run of the first table, {abs(gap):.1f} ms {'under' if gap > 0 else 'over'} the"
            " paper's FORGE step"
            + (" (an update that costs nothing would match it)." if gap > 0 else ": no update can reach it."),
        ]
    )


def _largest_ok(run: Run, label: str, where: Callable[[int], Where], batches: Sequence[int]) -> int | None:
    """The largest batch of `batches` at which `label` ran (None if it never did)."""
    fits = [b for b in batches if (r := run.find(label, where(b))) is not None and r.get("status") == "ok"]
    return max(fits, default=None)


def _cuts(run: Run, base: str, forge: str, models: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """Per model FORGE's peak cut against `base` (1 - forge / base), and the models where one failed."""
    cuts, failed = {}, []
    for model in models:
        b, f = run.find(base, Where(model=model)), run.find(forge, Where(model=model))
        if b is not None and f is not None and b.get("status") == f.get("status") == "ok":
            cuts[model] = 1 - float(f["peak_alloc_gib"]) / float(b["peak_alloc_gib"])
        else:
            failed.append(model)
    return cuts, failed


def _size(model: str) -> str:
    return model.removeprefix("qwen3-").upper()


def _qwen_claim(root: Path) -> str:
    models = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", QWEN14B)
    labels = [FP32GRAD, "forge_int8", "forge_bf16"]
    run = one_run(root, QWEN_SCALING, [p for m in models for p in needs(labels, Where(model=m))])
    low = paper.QWEN_PEAK_CUT[0]
    int8, failed = _cuts(run, FP32GRAD, "forge_int8", models)
    bf16, _ = _cuts(run, FP32GRAD, "forge_bf16", models)
    short = [_size(m) for m, cut in int8.items() if cut < low]
    verdict = f"not reproduced at {', '.join(short)}" if short else "reproduced"
    each = ", ".join(f"{_pct(cut)} at {_size(m)}" for m, cut in int8.items())
    oom = "".join(
        f", baseline `{run.point(FP32GRAD, Where(model=m)).get('status')}` at {_size(m)}" for m in failed
    )
    bf16_span = _span(*_range(bf16))
    return f"FORGE int8 against the fp32-gradient baseline: {each}{oom} ({verdict}); bf16 {bf16_span}; T2"


def _capacity_claim(root: Path) -> str:
    at = lambda b: Where(batch_size=b, seq_len=2048)  # noqa: E731
    run = one_run(root, TP2_CAPACITY, needs([BASE, "forge_int8"], at(1), at(2)))
    batches = sorted({int(r["batch_size"]) for r in run.records})
    forge, base = _largest_ok(run, "forge_int8", at, batches), _largest_ok(run, BASE, at, batches)
    cap = run.point(BASE, at(1)).get("memory_cap_gib")
    where = f"TP=2 under {float(cap):.0f} GiB a GPU, seq 2048"
    return f"{where}: FORGE int8 fits micro-batch {forge}, fused AdamW {base}; T3, T6"


def _checkpointing_claim(root: Path) -> str:
    at = Where(seq_len=2048, checkpointing=True)
    run = one_run(root, CHECKPOINTING, needs([BASE, "forge_bf16"], at))
    forge, base = fmt_gib(run.peak("forge_bf16", at)), fmt_gib(run.peak(BASE, at))
    return f"FORGE bf16 {forge} vs fused AdamW {base} GiB at seq 2048, batch 1; T5"


def paper_claims(root: Path) -> str:
    """Each of the paper's claims, the experiment that measures it, and what it measured."""
    run = paper_run(root)
    (base_ms, forge_ms), (base_gib, forge_gib) = paper.LLAMA_STEP_MS, paper.LLAMA_PEAK_GIB
    peak = run.peak("forge_int8") / run.peak(FP32GRAD)
    step = run.step("forge_int8_graph") / run.step(FP32GRAD + "_graph")
    qwen_forge = run.peak("forge_int8", QWEN)
    rows = [
        [
            f"Llama-3.1-8B: ~{base_gib:.0f} -> {forge_gib:.1f} GiB, {base_ms:.1f} -> {forge_ms:.1f} ms",
            "`+exp=paper_h200`, `+exp=llama8b_graphs_h200`",
            f"FORGE int8 {fmt_ratio(peak)} the fp32-gradient baseline's peak"
            f" ({_verdict(peak <= paper.TARGET_PEAK_RATIO)}), {fmt_ratio(step)} its graphed step"
            f" ({_verdict(step <= paper.TARGET_STEP_RATIO)}); the tables above",
        ],
        [
            f"Qwen3-14B fits ({paper.QWEN14B_FORGE_GIB:.1f} GiB), fused AdamW OOM",
            "`+exp=paper_h200`",
            f"fp32-gradient baseline `{run.point(FP32GRAD, QWEN).get('status')}`; FORGE int8"
            f" {fmt_gib(qwen_forge)} GiB ({_verdict(qwen_forge <= paper.TARGET_QWEN14B_GIB)}); fused AdamW on"
            f" bf16 gradients fits at {fmt_gib(run.peak(BASE, QWEN))}",
        ],
        [
            f"{_span(*paper.QWEN_PEAK_CUT)} peak cut over Qwen3-0.6B to 14B",
            "`+exp=qwen3_scaling_h200`",
            _qwen_claim(root),
        ],
        [
            "4 x A100-40GB: micro-batch 4 vs 1",
            "`+exp=capacity_a100_40gb`, `+exp=tp2_capacity_40gb`",
            _capacity_claim(root),
        ],
        [
            "composes with activation checkpointing",
            "`+exp=activation_checkpointing`",
            _checkpointing_claim(root),
        ],
        [
            "convergence within 0.001 nats",
            "`+exp=convergence` (and `_lion`, `_sgd`), `+exp=convergence_branched`,"
            " `+exp=convergence_branched_after_warmup`",
            "fp32 exact to summation order; bf16 and int8 states within the noise the runs resolve, which"
            " is wider than the paper's figure: [convergence.md](convergence.md#branched-fidelity)",
        ],
        [
            "exact under tensor and sequence parallelism",
            "`bash scripts/device_sweep.sh tp-exactness`",
            "PASS on two H200s: [tensor-parallel.md](tensor-parallel.md)",
        ],
    ]
    header = ["Paper (H200 unless noted)", "Command", "What this repository measured"]
    return _table(header, rows, "lll")


# ---------------------------------------------------------------------------------------------
# Tokens per step


TOKEN_METHODS = (BASE + "_graph", "forge_bf16_graph", "forge_int8_graph", "forge_bf16_clip_graph")


def tokens_run(root: Path, model: str = LLAMA) -> Run:
    """The latest run of `+exp=scaling_tokens_h200` with every method at 1,024-8,192 tokens on `model`."""
    labels = [*TOKEN_METHODS, FLOOR + "_graph", FLOOR, "forge_bf16"]
    batches = BATCHES if model == LLAMA else tuple(b for b in BATCHES if b <= 4)
    return one_run(root, TOKENS, needs(labels, *(Where(model=model, batch_size=b) for b in batches)))


def tokens_llama(root: Path) -> str:
    """Llama-3.1-8B's graphed step over the floor, and its peak, from 1,024 to 8,192 tokens: one run."""
    run = tokens_run(root)
    at = lambda b: Where(batch_size=b)  # noqa: E731
    rows = []
    for label in TOKEN_METHODS:
        over = [run.step(label, at(b)) / run.step(FLOOR + "_graph", at(b)) for b in BATCHES]
        rows.append([f"graphed step over the floor: {config_title(label)}", *map(fmt_ratio, over)])
    rows.append(
        ["FORGE bf16 against fused AdamW, graphed"]
        + [fmt_ratio(run.step("forge_bf16_graph", at(b)) / run.step(BASE + "_graph", at(b))) for b in BATCHES]
    )
    rows.append(
        ["eager FORGE bf16 over its graphed step"]
        + [fmt_ratio(run.step("forge_bf16", at(b)) / run.step("forge_bf16_graph", at(b))) for b in BATCHES]
    )
    peaks = [
        " / ".join(
            fmt_gib(run.peak(label, at(b)))
            for label in (BASE + "_graph", "forge_bf16_graph", "forge_int8_graph")
        )
        for b in BATCHES
    ]
    rows.append(["peak GiB: fused AdamW / FORGE bf16 / FORGE int8", *peaks])
    qwen = tokens_run(root, QWEN14B)
    q = lambda b: Where(model=QWEN14B, batch_size=b)  # noqa: E731
    base_fit = _largest_ok(qwen, BASE + "_graph", q, BATCHES)
    forge_fit = _largest_ok(qwen, "forge_bf16_graph", q, BATCHES)
    table = _table(["tokens per step", *map(_tokens, BATCHES)], rows, "l" + "r" * len(BATCHES))
    return "\n\n".join(
        [
            table,
            f"Data: {run.source()}, graphed, no checkpointing; {run.hardware()}; from `python -m harness"
            " sweep +exp=scaling_tokens_h200`. On Qwen3-14B, in"
            f" {'the same run' if qwen.commit == run.commit else qwen.source()},"
            f" FORGE bf16 fits {_tokens(forge_fit)} tokens a step and fused AdamW {_tokens(base_fit)}.",
        ]
    )


CHUNKED_HEAD_BATCHES = (1, 2, 4, 8, 16)
PEAK_METHODS = (BASE, "forge_bf16", "forge_int8")


def tokens_peaks(root: Path) -> str:
    """Peaks with checkpointing and lm_head in chunks of the vocabulary, 1,024 to 16,384 tokens: one run."""
    at = lambda b: Where(batch_size=b, checkpointing=True, loss="chunked_head")  # noqa: E731
    run = one_run(root, PEAKS, needs(PEAK_METHODS, *map(at, CHUNKED_HEAD_BATCHES)))
    gradient = gradient_gib(run.point(BASE, at(1)))
    peaks = [" / ".join(fmt_gib(run.peak(m, at(b))) for m in PEAK_METHODS) for b in CHUNKED_HEAD_BATCHES]
    saved = [
        _pct((run.peak(BASE, at(b)) - run.peak("forge_bf16", at(b))) / gradient) for b in CHUNKED_HEAD_BATCHES
    ]
    rows = [
        ["peak GiB: fused AdamW / FORGE bf16 / FORGE int8", *peaks],
        [f"FORGE bf16's saving, of the {gradient:.2f} GiB gradient", *saved],
    ]
    header = ["tokens per step, checkpointing, lm_head in chunks", *map(_tokens, CHUNKED_HEAD_BATCHES)]
    return "\n\n".join(
        [
            _table(header, rows, "l" + "r" * len(CHUNKED_HEAD_BATCHES)),
            f"Data: {run.source()}, eager, `model.chunked_head=true` and activation checkpointing for every"
            " method; from `python -m harness sweep +exp=peak_vs_tokens_h200 model.chunked_head=true"
            " 'sweep.activation_checkpointing=[true]' 'sweep.batch_sizes=[1,2,4,8,16]'`.",
        ]
    )


# ---------------------------------------------------------------------------------------------
# docs/performance.md: one table per question


def _over(run: Run, label: str, floor: str, where: Where) -> str:
    """'1.21x (+20.1)': a step over its floor in the same run, as a ratio and in ms."""
    step, base = run.step(label, where), run.step(floor, where)
    return f"{fmt_ratio(step / base)} ({step - base:+.1f})"


def tokens_detail(root: Path) -> str:
    """Llama-3.1-8B from 1,024 to 8,192 tokens: every method over the floor, graphed and eager."""
    run = tokens_run(root)
    methods = [*TOKEN_METHODS, FP32GRAD + "_graph"]
    rows = []
    for batch in BATCHES:
        at = Where(batch_size=batch)
        row = [_tokens(batch), fmt_ms(run.step(FLOOR + "_graph", at))]
        row += [_over(run, label, FLOOR + "_graph", at) for label in methods]
        row += [
            _over(run, "forge_bf16", FLOOR, at),
            fmt_ratio(run.step("forge_bf16", at) / run.step("forge_bf16_graph", at)),
        ]
        rows.append(row)
    header = ["tokens", "floor ms", *map(config_title, methods), "eager FORGE bf16 over eager floor"]
    header.append("eager FORGE bf16 / graphed")
    return "\n\n".join(
        [
            _table(header, rows, "r" * len(header)),
            "Graphed steps over the graphed floor, in brackets the ms over it; the last two columns eager."
            f" Data: {run.source()}; from `python -m harness sweep +exp=scaling_tokens_h200`; every point of"
            " the sweep,"
            " with the prediction of `harness.report.token_model`, is in"
            " [reports/tables/overhead_vs_tokens.md](../reports/tables/overhead_vs_tokens.md).",
        ]
    )


SIZES = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", LLAMA, QWEN14B)
SIZE_BATCHES = (1, 4, 8)


def model_size(root: Path) -> str:
    """FORGE bf16 against fused AdamW and over the floor, graphed, across model sizes."""
    rows, runs = [], []
    for model in SIZES:
        run = tokens_run(root, model)
        cells = [model]
        runs.append(f"{model} at {run.short}, {run.date}")
        for batch in SIZE_BATCHES:
            at = Where(model=model, batch_size=batch)
            forge, base = run.find("forge_bf16_graph", at), run.find(BASE + "_graph", at)
            if forge is None:
                cells.append("not measured")
            elif base is None or base.get("status") != "ok":
                cells.append(
                    f"fused AdamW {base.get('status') if base else 'not measured'};"
                    f" {_over(run, 'forge_bf16_graph', FLOOR + '_graph', at)}"
                )
            else:
                ratio = run.step("forge_bf16_graph", at) / run.step(BASE + "_graph", at)
                cells.append(f"{fmt_ratio(ratio)}; {_over(run, 'forge_bf16_graph', FLOOR + '_graph', at)}")
        rows.append(cells)
    header = ["model", *(f"{_tokens(b)} tokens" for b in SIZE_BATCHES)]
    return "\n\n".join(
        [
            _table(header, rows, "l" + "r" * len(SIZE_BATCHES)),
            "Each cell: graphed FORGE bf16 against graphed fused AdamW; then over the graphed floor, in"
            " brackets the ms over it; ratios are within a run, never across. Data: each model's points are"
            f" one run of `{TOKENS}` (the scaling_tokens_h200 sweep with `'sweep.models=[<model>]'`):"
            f" {'; '.join(runs)}.",
        ]
    )


CLIP_ROWS = (BASE + "_clip", "forge_bf16_clip", "forge_int8_clip")


def clipping(root: Path) -> str:
    """Llama-3.1-8B at batch 1 with global-norm clipping, one run, beside the same steps unclipped."""
    labels = [label + s for label in CLIP_ROWS for s in ("", "_graph")]
    labels += [BASE + "_graph", "forge_bf16_graph", "forge_int8_graph"]
    run = one_run(root, CLIP, needs(labels))
    graphed, eager = run.step(BASE + "_clip_graph"), run.step(BASE + "_clip")
    rows = []
    for label in CLIP_ROWS:
        g, e = run.step(label + "_graph"), run.step(label)
        plain = label.removesuffix("_clip") + "_graph"
        rows.append(
            [
                config_title(label),
                fmt_ms(g),
                fmt_ratio(g / graphed),
                fmt_ms(e),
                fmt_ratio(e / eager),
                fmt_gib(run.peak(label + "_graph")),
                f"{fmt_ms(run.step(plain))} (+{g - run.step(plain):.1f})",
            ]
        )
    header = ["method", "graphed ms", "vs fused AdamW + clip", "eager ms", "vs fused AdamW + clip"]
    header += ["peak GiB (graphed)", "unclipped graphed ms (clipping's cost)"]
    return "\n\n".join(
        [
            _table(header, rows, "lrrrrrr"),
            f"Data: {run.source()}, `max_grad_norm=1.0`; from `python -m harness sweep +exp=clip_h200`.",
        ]
    )


def kernel_summary(root: Path) -> str:
    """T4's summary: the fused kernel against cuBLAS's dW GEMM and fused AdamW, per rule and states."""
    from harness.records import load_records, split_kinds
    from harness.report.kernel_table import t4_kernels

    _, kernels = split_kinds(load_records([root / path for path in KERNEL_TABLES]))
    summary = next(s.table for s in t4_kernels(kernels) if s.table.name == "t4_kernels_summary")
    rows = [row for row in summary.rows if row[0] == "adamw"]
    return "\n\n".join(
        [
            _table(summary.header, rows, summary.alignment()),
            f"{summary.notes[0]} Data: {_kernel_runs(root)}, from `python -m harness kernels --rules adamw`;"
            " every point:"
            " [reports/tables/t4_kernels_summary.md](../reports/tables/t4_kernels_summary.md).",
        ]
    )


def _kernel_runs(root: Path) -> str:
    """'`results/kernels/kernels-llama3.1-8b.jsonl` (d6b0cab, 2026-11-30), ...': each kernel table's run."""
    from harness.report.runs import runs

    parts = []
    for path in KERNEL_TABLES:
        found = runs(root, path)
        commits = ", ".join(f"{run.short}, {run.date}" for run in found)
        parts.append(f"`{path}` ({commits})")
    return " and ".join(parts)


def _goal(name: str, measured: str, met: bool) -> list[str]:
    return [name, measured, "met" if met else "not met"]


def goals(root: Path) -> str:
    """The project's goals for FORGE, each beside what the current records measure."""
    head, tokens = headline_run(root), tokens_run(root)
    at = lambda b: Where(batch_size=b)  # noqa: E731
    over = lambda label, b: tokens.step(label, at(b)) / tokens.step(FLOOR + "_graph", at(b))  # noqa: E731
    end_to_end = head.step("forge_bf16_graph") / head.step(BASE + "_graph")
    groups = one_run(root, INT8_GROUPS, needs(["forge_int8", "forge_int8_g128"]))
    int8, g128 = groups.peak("forge_int8"), groups.peak("forge_int8_g128")
    large = (4, 8)
    eager = [tokens.step("forge_bf16", at(b)) / tokens.step("forge_bf16_graph", at(b)) for b in (2, 4, 8)]
    rows = [
        _goal("FORGE bf16 <= 0.80x fused AdamW, graphed, batch 1", fmt_ratio(end_to_end), end_to_end <= 0.80),
        [
            "int8 states' peak <= 38 GiB, batch 1 (eager)",
            f"{fmt_gib(int8)} GiB; {fmt_gib(g128)} with `int8_group=128`",
            "met" if int8 <= 38.0 else "met with `int8_group=128`" if g128 <= 38.0 else "not met",
        ],
    ]
    for label, bound in (
        ("forge_bf16_graph", 1.05),
        ("forge_int8_graph", 1.10),
        ("forge_bf16_clip_graph", 1.08),
    ):
        ratios = [over(label, b) for b in large]
        rows.append(
            _goal(
                f"{config_title(label)} <= {bound:.2f}x the floor, graphed, 4,096 and 8,192 tokens",
                ", ".join(map(fmt_ratio, ratios)),
                max(ratios) <= bound,
            )
        )
    rows.append(
        _goal(
            "eager FORGE bf16 within 3% of graphed, 2,048-8,192 tokens",
            ", ".join(map(fmt_ratio, eager)),
            max(abs(e - 1) for e in eager) <= 0.03,
        )
    )
    return "\n\n".join(
        [
            _table(["goal (Llama-3.1-8B)", "measured", "verdict"], rows, "lll"),
            f"Data: batch 1 from {head.source()}; the int8 groups from {groups.source()}; tokens per step"
            " from"
            f" {tokens.source()}. The kernel's goals are T4's (above).",
        ]
    )


UPDATE_BYTES = 12  # a weight's update with bf16 states: W, m and v read and written, 2 bytes each


def floor_estimate(root: Path) -> str:
    """Llama-3.1-8B's linears at T = 1024 if every fused kernel took only the larger of its halves:
    cuBLAS's dW GEMM, or the update's bytes at the epilogue's measured rate."""
    from harness import results
    from harness.kernels.layers import MODELS
    from harness.records import load_records, split_kinds
    from harness.report.kernel_table import SHAPE_ORDER, latest

    probe = next(r for r in results.read(root / OVERLAP) if (r["shape_name"], r["T"]) == ("gate", 1024))
    rate = probe["update_bytes"] / probe["ws_epilogue_only_ms"] / 1e9  # TB/s: bytes / ms / 1e9
    _, kernels = split_kinds(load_records([root / KERNELS_LLAMA]))
    at = {
        (r["shape_name"], r["variant"], r.get("state_dtype")): r
        for r in latest(kernels)
        if r.get("T") == 1024 and r.get("rule") in (None, "adamw")
    }
    layers = MODELS[LLAMA]["layers"]
    rows, sums = [], [0.0, 0.0, 0.0, 0.0]
    for shape in SHAPE_ORDER:
        gemm, forge = at[(shape, "cublas_gemm", None)], at[(shape, "forge", "bf16")]
        update = UPDATE_BYTES * forge["N"] * forge["K"] / rate / 1e9
        values = [
            float(gemm["time_ms"]),
            update,
            max(float(gemm["time_ms"]), update),
            float(forge["time_ms"]),
        ]
        count = 1 if shape == "lm_head" else layers
        sums = [total + count * value for total, value in zip(sums, values)]
        rows.append([f"{shape} {forge['N']}x{forge['K']}", *(f"{v:.3f}" for v in values)])
    rows.append([f"a step ({layers} layers and lm_head)", *(f"{v:.1f}" for v in sums)])
    head = headline_run(root)
    forge_step, base_step = head.step("forge_bf16_graph"), head.step(BASE + "_graph")
    floor_step = forge_step - (sums[3] - sums[2])
    header = [
        "layer (T = 1024)",
        "cuBLAS dW ms",
        f"update at {rate:.1f} TB/s ms",
        "larger ms",
        "FORGE bf16 ms",
    ]
    return "\n\n".join(
        [
            _table(header, rows, "lrrrr"),
            f"If each fused kernel took only the larger of its halves, Llama-3.1-8B's linears would take"
            f" {sums[2]:.1f} ms a step instead of {sums[3]:.1f}, and the graphed FORGE bf16 step of the first"
            f" table {fmt_ms(floor_step)} ms instead of {fmt_ms(forge_step)}:"
            f" {fmt_ratio(floor_step / base_step)} fused AdamW's. Data: the kernel table"
            f" `{KERNELS_LLAMA}` (AdamW, bf16 states),"
            f" the update half's rate from `{OVERLAP}` (gate, T = 1024), the steps from {head.source()}.",
        ]
    )


EAGER_MODELS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", LLAMA)
EAGER_METHODS = (FLOOR, BASE, "forge_bf16")


def eager_host(root: Path) -> str:
    """Where the host sets the pace: eager and graphed steps of the floor, fused AdamW and FORGE
    bf16 on four models at batch 1, seq 1024, in one run, and FORGE's host time beyond the floor's
    ((eager - graphed) FORGE less (eager - graphed) floor), or what to run where none has."""
    labels = [label + suffix for label in EAGER_METHODS for suffix in ("", "_graph")]
    try:
        run = one_run(root, EAGER_HOST, needs(labels, *(Where(model=m) for m in EAGER_MODELS)))
    except (LookupError, FileNotFoundError):  # no clean run of all 24 points, or no run at all
        return (
            "Not measured yet. `python -m harness sweep +exp=eager_host` on one H100 or H200 (with"
            " `gpu=h100_80gb` on an H100) steps the floor, fused AdamW and FORGE bf16 eager and graphed on"
            " these four models; `python -m harness report` then writes them here."
        )
    rows = []
    for model in EAGER_MODELS:
        at = Where(model=model)
        step = {label: run.step(label, at) for label in labels}
        host = (step["forge_bf16"] - step["forge_bf16_graph"]) - (step[FLOOR] - step[FLOOR + "_graph"])
        rows.append(
            [
                model,
                *(fmt_ms(step[label]) for label in EAGER_METHODS),
                fmt_ratio(step["forge_bf16"] / step[BASE]),
                *(fmt_ms(step[label + "_graph"]) for label in EAGER_METHODS),
                f"{host:.1f}",
            ]
        )
    header = ["model", "eager floor ms", "eager fused AdamW", "eager FORGE bf16", "vs fused AdamW"]
    header += [
        "graphed floor",
        "graphed fused AdamW",
        "graphed FORGE bf16",
        "FORGE's host ms beyond the floor's",
    ]
    cpu = f"{run.env('cpu_model')} ({run.env('cpu_count')} cores)"
    return "\n\n".join(
        [
            _table(header, rows, "l" + "r" * (len(header) - 1)),
            f"Batch 1, seq 1024, median ms. Data: {run.source()}; {run.hardware()}; host CPU {cpu}; from"
            " `python -m harness sweep +exp=eager_host`.",
        ]
    )


PERFORMANCE_BLOCKS: dict[str, Callable[[Path], str]] = {
    "floor-estimate": floor_estimate,
    "tokens-detail": tokens_detail,
    "model-size": model_size,
    "clipping": clipping,
    "kernel-summary": kernel_summary,
    "goals": goals,
}
