"""The expectation that opens each table: what the numbers should be before we look at them.

A reader checks a measurement against a model of it. For every step table we print, from the
records' own parameter counts and the methods present (`harness.report.expectations` has the model):

- bytes per parameter each method holds (weights, gradient, optimizer states) and moves in its
  update, with the static GiB this means for each model: FORGE's column shows the gradient's
  2 B/param gone;
- the floors of the step: the matrix work (6 FLOPs per parameter per token, 8 with activation
  checkpointing) at the H200's measured bf16 matmul rate, and the update's traffic at its copy
  bandwidth.

The tokens-per-step sections open with `harness.report.token_model`'s predictions instead: each
update's traffic against the step's dW GEMMs, and the bytes a token adds to the peak.

Measured peaks sit above the static figure by the activations and the allocator's slack; measured
step times sit above the matrix floor by attention, element-wise work and launch gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.points import graphed, options_dict, options_key
from harness.records import Record, on_cpu
from harness.report import expectations as ex
from harness.report.markup import NONE, Table, fmt_float, fmt_gib, fmt_ms, to_markdown
from harness.report.names import display_name, method_rank
from harness.run.methods import interpreted
from harness.run.methods.footprint import AFTER_BACKWARD

STEP_TEXT = (
    "FORGE never writes the weight gradient to memory: it saves the gradient's 2 B/param (bf16) "
    "outright, and its state dtype decides the rest (AdamW: 4 B/param in bf16 states, 2.0625 B/param "
    "in int8 with one bf16 scale per 64). Expect FORGE's peak to sit about P x 2 B below fused "
    "AdamW's with the same states where fused AdamW peaks at the end of backward (its gradients all "
    "alive); where the activations are larger than the gradient, both peak at the end of the forward "
    "pass, before any gradient exists, and alike (activation checkpointing moves the peak back). "
    "Expect FORGE's step time near 'no optimizer' (the update hidden under the dW GEMM), and fused "
    "AdamW's near 'no optimizer' plus its update floor."
)


def _variants(records: Sequence[Record]) -> list[Record]:
    """One record per (method, options, master weights), in method order, a graphed step counted
    as its eager twin (the same bytes per parameter) and named by it where both ran. A failed
    point may not say its master weights: it stands for its method only where no point of it does."""
    found: dict[tuple[str, str, str], Record] = {}
    for r in sorted(records, key=lambda r: (r.get("master_weights") is None, graphed(r))):  # stable
        method = (str(r.get("method")), _bytes_options(r))
        if r.get("master_weights") is None and any(key[:2] == method for key in found):
            continue
        found.setdefault((*method, str(r.get("master_weights"))), r)
    return [found[k] for k in sorted(found, key=lambda k: (method_rank(k[0]), k))]


def _bytes_options(record: Record) -> str:
    """The record's options that set its bytes per parameter: all but `cuda_graph`."""
    options = options_dict(record.get("method_options"))
    options.pop("cuda_graph", None)
    return options_key(options)


def model_sizes(records: Sequence[Record]) -> dict[str, float]:
    """Parameters per model, from any record that counted them (failed points may not have)."""
    sizes: dict[str, float] = {}
    for record in records:
        if record.get("n_params") is not None:
            sizes.setdefault(str(record.get("model")), float(record["n_params"]))
    return sizes


def _models(records: Sequence[Record], known: dict[str, float] | None = None) -> list[tuple[str, float]]:
    sizes = {**(known or {}), **model_sizes(records)}
    present = {str(r.get("model")) for r in records}
    return sorted(((m, n) for m, n in sizes.items() if m in present), key=lambda item: (item[1], item[0]))


def bytes_table(
    records: Sequence[Record],
    cap_gib: float | None = None,
    known: dict[str, float] | None = None,
    name: Callable[[Record], str] = display_name,
) -> Table | None:
    """Bytes per parameter per method (each row named by `name`), and the static GiB at each
    model's size (`known`: sizes counted elsewhere, for models whose every record here failed
    before counting)."""
    from harness.report import token_model as tm

    models = _models(records, known)
    archs = {str(r.get("model")): tm.architecture(r) for r in records if tm.architecture(r) is not None}
    prints = [
        ex.footprint(r.get("method"), r.get("method_options"), r.get("master_weights")) for r in records
    ]
    most = max((fp.total for fp in prints if fp is not None), default=0.0)
    tiny = {m for m, n in models if ex.static_gib_of(most, n) < TINY_GIB}  # in MiB: GiB would read 0.000
    rows, split = [], False
    for record in _variants(records):
        fp = ex.footprint(record.get("method"), record.get("method_options"), record.get("master_weights"))
        if fp is None:
            continue
        cells = [name(record)]
        figures = lambda f: (f.weights, f.grads, f.states, f.total, f.update_traffic)  # noqa: E731
        if fp.rest is None:
            cells += [fmt_float(v, 3) for v in figures(fp)]
        else:  # the hidden matrices' bytes / the other parameters'
            split = True
            cells += [f"{fmt_float(a, 3)} / {fmt_float(b, 3)}" for a, b in zip(figures(fp), figures(fp.rest))]
        for model, n in models:
            arch = archs.get(model)
            if fp.rest is not None and arch is None:
                cells.append(NONE)  # the split of a model whose architecture no record gives
                continue
            static = ex.static_gib(fp.mixed(arch.hidden_params() / n) if arch else fp, n)
            if model in tiny:
                cells.append(fmt_float(static * 1024, 2))
                continue
            cells.append(
                fmt_gib(static) if cap_gib is None else f"{fmt_gib(static)} ({fmt_gib(cap_gib - static)})"
            )
        rows.append(cells)
    if not rows:
        return None
    suffix = " (headroom under the cap)" if cap_gib is not None else ""
    header = ["Method", "Weights B/param", "Gradient B/param", "States B/param", "Held B/param"]
    header += ["Update traffic B/param"]
    header += [f"Static MiB, {m}" if m in tiny else f"Static GiB, {m}{suffix}" for m, _ in models]
    notes = [SPLIT_NOTE] if split else []
    return Table("expected_bytes", "Expected bytes per parameter", header, rows, notes=notes)


TINY_GIB = 0.01  # a model whose static bytes stay under this with every method gets them in MiB

SPLIT_NOTE = (
    "a / b: the hidden matrices' bytes a parameter / the other parameters' (embeddings, lm_head, norms), "
    "which the method trains by another rule (Muon's recipe: AdamW); its static figure is over the model's "
    "split. Newton-Schulz's workspace, one layer's at a time, is not counted here."
)


def floors_table(records: Sequence[Record], ceilings: ex.Ceilings) -> Table | None:
    """Per (model, batch, seq, checkpointing): matrix floor and update floors of the step."""
    points = set()
    for r in records:
        if r.get("n_params") is not None and r.get("batch_size") is not None and r.get("seq_len") is not None:
            points.add(
                (
                    float(r["n_params"]),
                    str(r.get("model")),
                    int(r["batch_size"]),
                    int(r["seq_len"]),
                    bool(r.get("activation_checkpointing")),
                )
            )
    rows = []
    fused, forge = ex.footprint("fused_adamw"), ex.footprint("forge")
    for n, model, batch, seq, ckpt in sorted(points):
        tokens = batch * seq
        rows.append(
            [model, fmt_float(n / 1e9, 2), str(batch), str(seq), "on" if ckpt else "off", str(tokens)]
            + [fmt_ms(ex.compute_floor_ms(n, tokens, ceilings, ckpt))]
            + [fmt_ms(ex.update_floor_ms(fused, n, ceilings)), fmt_ms(ex.update_floor_ms(forge, n, ceilings))]
            + [fmt_gib(2.0 * n / ex.GIB)]
        )
    if not rows:
        return None
    header = ["Model", "Params (B)", "Batch", "Seq", "Act. ckpt", "Tokens", "Matrix floor ms"]
    header += ["fused AdamW update floor ms", "FORGE update floor ms", "Gradient GiB (FORGE saves)"]
    return Table("expected_floors", "Step floors", header, rows, align="lrrrlrrrrr")


CPU_TEXT = (
    "Points measured on the CPU show that each method trains: its loss falls and its weights move "
    "(the no-optimizer floor's loss stays where it starts). Each method holds the bytes per parameter "
    "below on a CPU as on a GPU, but no peak is measured (the CUDA allocator's; none on a CPU), and no "
    "floor is drawn: the floors are a GPU's."
)
INTERPRETER_TEXT = (
    "Triton's CPU interpreter (TRITON_INTERPRET=1) ran the kernels of the methods marked in the "
    "table: their step times, and their ratios to fused AdamW, say nothing about speed (the "
    "interpreter runs each kernel as Python over NumPy), only that they train. Measure speed and "
    "memory on a GPU."
)


def step_preamble(records: Sequence[Record]) -> str:
    """Expectation text and tables for a step table (T1, T2, T5, other points). The step floors
    (matrix work and update traffic at the measured rates of the card the points ran on,
    `ex.ceilings`) are drawn for GPU points only; CPU points get what a CPU run shows instead, and
    where Triton's interpreter ran their kernels, the warning that their times mean nothing for speed."""
    gpu = [r for r in records if not on_cpu(r)]
    ceilings = ex.ceilings(gpu)
    parts = [STEP_TEXT] if gpu else []
    if len(gpu) < len(records):
        parts.append(CPU_TEXT)
        if any(interpreted(r) for r in records if r.get("status") == "ok"):
            parts.append(INTERPRETER_TEXT)
    floors = floors_table(gpu, ceilings) if ceilings is not None else None
    for table in (bytes_table(records), floors):
        if table is not None:
            parts.append(to_markdown(table).rstrip())
    if ceilings is not None:
        parts.append(_ceilings_line(ceilings))
    return "\n\n".join(parts)


def data_parallel_preamble() -> str:
    """Expectation for the data-parallel table: bytes per parameter per GPU under each wrapper."""
    return (
        "Per GPU, in bytes a parameter before activations (bf16 weights, P ranks): fused AdamW under "
        "DDP holds weights 2, gradients 2 and states 4 (8); FORGE bf16 under DDP 2 + 4 and a bounded "
        "window of gradients (its reducer's buckets in flight). Under FSDP2 everything is divided by "
        "P: fused AdamW (2 + 2 + 4) / P, FORGE bf16 (2 + 4) / P, FORGE int8 (2 + ~2.06) / P, plus one "
        "block's unsharded weights and gradients. Under data parallelism FORGE reduces the gradient and "
        "updates from the mean, not inside the dW GEMM: what it keeps of its saving is the gradient's "
        "lifetime (`docs/distributed.md` says why)."
    )


def tensor_parallel_preamble(records: Sequence[Record]) -> str:
    """Expectation for T6: the one-GPU bytes per parameter, divided over the ranks."""
    worlds = sorted({int(r.get("gpu_count") or 1) for r in records})
    return (
        f"Tensor parallelism over {' or '.join(map(str, worlds))} GPUs (the Megatron layout of "
        "`harness.run.tensor_parallel`: attention and MLP projections, embedding and LM head sharded; "
        "norms replicated) gives each GPU 1/G of the weights, gradients and states, so the static "
        "bytes per GPU are about T1's divided by G, and FORGE's saving per GPU is the gradient's "
        "2 B/param / G. Where the peak is set at the end of the forward pass (activations held, no "
        "gradient allocated yet), the two methods peak alike. Step time adds two all-reduces per "
        "block in each direction and DTensor's dispatch on the host; at small batches the host "
        "sets the pace."
    )


def capacity_preamble(records: Sequence[Record], known: dict[str, float] | None = None) -> str:
    """Expectation for T3: what is left for activations under the cap."""
    caps = sorted({float(r["memory_cap_gib"]) for r in records if r.get("memory_cap_gib") is not None})
    text = (
        "Under a memory cap, a method fits a micro-batch when its static bytes (weights, gradient, "
        "states) plus that batch's activations fit. FORGE hands the gradient's 2 B/param to the "
        "activations, so its largest micro-batch should grow by about P x 2 B over the activation "
        "bytes of one sequence; throughput grows with the batch until the GPU is saturated."
    )
    parts = [text]
    for cap in caps:
        table = bytes_table([r for r in records if r.get("memory_cap_gib") == cap], cap_gib=cap, known=known)
        if table is not None:
            parts.append(f"Cap {fmt_gib(cap)} GiB:\n\n" + to_markdown(table).rstrip())
    return "\n\n".join(parts)


def kernel_preamble(records: Sequence[Record]) -> str:
    """Expectation for T4, with one worked example at the ceilings of the card the records ran on."""
    c = ex.ceilings(records)
    if c is None:
        return KERNEL_TEXT
    t, n, k = 16384, 4096, 4096
    flops_ms = 2 * t * n * k / c.matmul_flops * 1e3
    gemm_bytes = 2 * t * (n + k) + 2 * n * k
    update_bytes = n * k * (2 + 2 + 2 * 4)
    copy = c.copy_bytes_per_s
    return (
        f"{KERNEL_TEXT} Example, T={t}, N=K={n}: {flops_ms:.3f} ms of matrix work "
        f"at {c.matmul_tflops:g} TFLOP/s against {(gemm_bytes + update_bytes) / copy * 1e3:.3f} ms "
        f"of traffic at {c.copy_tbps:g} TB/s: compute-bound, so a FORGE kernel that hides its update "
        "costs what the GEMM costs, and beats GEMM + fused AdamW by the whole optimizer pass "
        f"({(update_bytes + 4 * n * k) / copy * 1e3:.3f} ms of traffic at that shape)."
    )


KERNEL_TEXT = (
    "The dW GEMM does 2 x T x N x K FLOPs; FORGE adds the update, which reads and writes the weight "
    "(2 + 2 B in bf16) and the states (2 x 4 B for AdamW in bf16), and never writes dW. The floor "
    "of a point is the larger of its FLOP time at the measured matmul rate and its minimum bytes "
    "at the measured copy bandwidth."
)


def _ceilings_line(c: ex.Ceilings) -> str:
    return (
        f"Floors use the {c.gpu} ceilings measured in this workplace: {c.matmul_tflops:g} TFLOP/s bf16 "
        f"matmul, {c.copy_tbps:g} TB/s device copy; the matrix floor counts 6 FLOPs per parameter per "
        "token (8 with activation checkpointing) and leaves out attention."
    )


def convergence_preamble() -> str:
    """Expectation for the convergence table."""
    return (
        "Every method trains from the same seed on the same data order, so loss curves compare step by "
        "step. With fp32 weights and states FORGE equals torch.optim up to the GEMM's summation order "
        "(mean |d| near 1e-4 nats or below) for as long as training does not amplify rounding: past the "
        "warm-up, at peak learning rate, a 1-ulp difference can grow into a visible one, and the distance "
        "between two torch AdamW implementations in fp32 (torch_adamw_fp32, when run) is that floor. "
        "The paper puts bf16 with stochastic rounding and int8 states "
        "within 0.001 nats; plain bf16 write-back without stochastic rounding stalls, so its distance "
        "grows over the run (the last 10% tells more than the mean)."
    )


TOKENS_TEXT = (
    "A step's dW GEMMs grow with its tokens (2 T FLOPs a weight); an update's traffic does not (its "
    "bytes a parameter, once a step). Fused AdamW updates after the backward, where nothing hides it: "
    "its milliseconds over the floor should stay flat as tokens grow, and its ratio fall toward 1. "
    "FORGE's update rides in the dW GEMM: once the GEMM takes longer than the update's traffic, the "
    "update can hide entirely, and FORGE's step should approach the no-optimizer floor; a kernel that "
    "hides part of it sits between the two predictions (hidden as far as it fits, and not hidden). "
    "Clipped FORGE adds the gradient norms' matrix work, which grows with the tokens."
)


def _token_models(records: Sequence[Record]) -> list[tuple[str, Record, float]]:
    """(model, a record of it with its architecture, parameters) for each model, smallest first."""
    from harness.report import token_model as tm

    sizes = model_sizes(records)
    found: dict[str, Record] = {}
    for record in records:
        if tm.architecture(record) is not None:
            found.setdefault(str(record.get("model")), record)
    return sorted(((m, r, sizes[m]) for m, r in found.items() if m in sizes), key=lambda item: item[2])


def token_overhead_preamble(records: Sequence[Record]) -> str:
    """Expectation for the step over the floor against tokens: each update's traffic, the dW GEMMs
    a step at each token count measured, and from how many tokens each update can hide."""
    from harness.report import token_model as tm

    c = ex.ceilings(records)
    if c is None:  # no card with measured ceilings: nothing to predict at
        return TOKENS_TEXT
    rows, lines = [], []
    for model, like, n in _token_models(records):
        arch = tm.architecture(like)
        counts = sorted(
            {int(r["batch_size"]) * int(r["seq_len"]) for r in records if r.get("model") == model}
        )
        gemm = ", ".join(f"{fmt_ms(tm.gemm_ms(arch, t, c))} ms at {t}" for t in counts)
        lines.append(f"dW GEMMs a step, {model}: {gemm} tokens.")
        for record in _variants([r for r in records if r.get("model") == model]):
            fp = ex.footprint(
                record.get("method"), record.get("method_options"), record.get("master_weights")
            )
            if fp is None or record.get("method") == "no_optimizer":
                continue
            separate = fp.update == AFTER_BACKWARD
            hides = (
                "never (after the backward)" if separate else f"{tm.hiding_tokens(fp.update_traffic, c):.0f}"
            )
            over = tm.overhead(str(record.get("method")), record.get("method_options"), arch, n, counts[0], c)
            rows.append(
                [model, display_name(record), fmt_float(fp.update_traffic, 3)]
                + [
                    fmt_ms(tm.update_ms(fp.update_traffic, n, c)),
                    fmt_ms(over.exposed_ms if over else None),
                    hides,
                ]
            )
    parts = [TOKENS_TEXT]
    if rows:
        header = ["Model", "Method", "Update traffic B/param", "Update ms (copy rate)"]
        header += ["Over floor ms, nothing hidden (fewest tokens)", "Hides under the dW GEMM from tokens"]
        parts.append(to_markdown(Table("expected_tokens", "Expected", header, rows, align="llrrrr")).rstrip())
    parts += lines
    parts.append(
        f"At the {c.gpu} ceilings measured in this workplace: {c.matmul_tflops:g} TFLOP/s bf16 matmul "
        f"for the dW GEMMs (2 T FLOPs a weight of every linear layer and lm_head), {c.copy_tbps:g} TB/s "
        "device copy for the updates; the model is harness.report.token_model."
    )
    return "\n\n".join(parts)


MUON_TEXT = (
    "FORGE Muon never stores the gradient. torch Muon keeps every gradient until its step and then "
    "orthogonalizes each hidden matrix beside all of them; FORGE folds each dW tile into Muon's momentum "
    "inside the fused kernel and runs Newton-Schulz per layer in the backward, holding one layer's "
    "workspace at a time (its bf16 scratch, Newton-Schulz's iterates and Gram matrices: 6 N K + 4 "
    "min(N, K)^2 bytes) beside the activations still alive. So at few tokens FORGE's peak should sit the "
    "gradient's bytes below torch's, less the workspace FORGE adds to the backward and plus the one torch "
    "adds to its step, and the saving shrinks as the activations overtake the gradient. Both run the same "
    "Newton-Schulz on every hidden matrix every step, matrix work that does not shrink with the tokens: "
    "expect both steps above the floor by at least its time below, and FORGE's near torch's, without the "
    "gradient's write and read and the optimizer's separate pass."
)


def muon_preamble(records: Sequence[Record], planned: bool = True) -> str:
    """Expectation for the Muon table, per model it has rows for (`planned`: as `muon_table.muon_table`):
    the gradient FORGE does not store, each method's Newton-Schulz workspace at the largest hidden
    layer, the saving before any activation, and Newton-Schulz's matrix work a step at the card's
    matmul rate."""
    from harness.report import muon_table
    from harness.report import token_model as tm
    from harness.run.methods.muon import ForgeMuon, TorchMuon

    c = muon_table.card(records)
    torch_, forge_ = muon_table.planned_method(TorchMuon.name), muon_table.planned_method(ForgeMuon.name)
    rows = []
    either = torch_ or forge_
    steps = int(either.options.get("ns_steps", 5)) if either is not None else 5
    for model, arch, n in muon_table.table_models(records, planned):
        fps = [
            None if p is None else tm.footprint_at(p.method, p.options, arch, n, muon_table.weights_of(p))
            for p in (torch_, forge_)
        ]
        shaped = next((fp for fp in fps if fp is not None), None)
        largest = max(
            arch.block_shapes(), key=lambda s: shaped.workspace_bytes([s]) if shaped else s[0] * s[1]
        )
        peaks = [
            None
            if p is None
            else tm.peak_gib(p.method, p.options, arch, n, 0, False, muon_table.weights_of(p))
            for p in (torch_, forge_)
        ]
        flops = tm.newton_schulz_flops(arch, steps)
        row = [model, fmt_float(n / 1e9, 2), fmt_float(arch.hidden_params() / 1e9, 2)]
        row.append(fmt_gib(fps[0].grads * n / ex.GIB) if fps[0] is not None else NONE)
        row.append(f"{largest[0]} x {largest[1]}")
        row += [NONE if fp is None else fmt_float(tm.workspace_bytes(fp, arch) / 2**20, 0) for fp in fps]
        row.append(NONE if None in peaks else fmt_gib(peaks[0] - peaks[1]))
        row.append(fmt_float(flops / 1e12, 1))
        row.append(fmt_ms(tm.newton_schulz_ms(arch, steps, c)) if c is not None else NONE)
        rows.append(row)
    torch_name, forge_name = TorchMuon.display_title(), ForgeMuon.display_title()
    header = ["Model", "Params (B)", "Hidden matrices (B)", f"Gradient GiB ({forge_name} stores none)"]
    header += ["Largest hidden layer (N x K)", f"Workspace MiB, {torch_name}", f"Workspace MiB, {forge_name}"]
    header += ["Saving before activations GiB", "Newton-Schulz TFLOP a step"]
    header += [f"Newton-Schulz ms at {c.matmul_tflops:g} TFLOP/s" if c is not None else "Newton-Schulz ms"]
    table = Table("expected_muon", "Expected", header, rows, align="lrrrlrrrrr")
    parts = [MUON_TEXT, to_markdown(table).rstrip()]
    where = f"the {c.gpu}'s measured bf16 matmul rate" if c is not None else "no card's rate (none known)"
    weights = muon_table.weights_of(torch_) if torch_ is not None else NONE
    parts.append(
        f"The experiment's methods as their conf/method files set them ({weights} weights, {steps} "
        "Newton-Schulz iterations); workspace of the largest hidden layer; saving before activations: "
        f"the predicted peaks at no tokens (harness.report.token_model); Newton-Schulz at {where}, "
        f"{steps} (4 m^2 n + 2 m^3) FLOPs an (m, n) hidden matrix, m <= n, every one every step."
    )
    return "\n\n".join(parts)


PEAK_TOKENS_TEXT = (
    "At the peak every method holds its weights and states; fused AdamW also holds, at the end of the "
    "backward, every gradient (2 B/param), FORGE none. The activations a token leaves for the backward "
    "(a), plus the loss's backward (l), set the other candidate for the peak, at the start of the "
    "backward. So FORGE's saving over fused AdamW is the whole gradient while T (a + l) is small, "
    "shrinks by a + l a token, and is zero once T (a + l) passes the gradient's 2 B/param, where the "
    "activations set both peaks. Activation checkpointing keeps only each layer's input (a shrinks about "
    "7x on Llama-3.1-8B), which pushes that point out and the largest step that fits up."
)


def token_peak_preamble(records: Sequence[Record]) -> str:
    """Expectation for the peak against tokens: bytes a token, where FORGE's saving ends, and the
    largest step each method should fit."""
    from harness.report import token_model as tm
    from harness.report.plots import capacity_gib

    rows = []
    labels = [
        r for r in _variants(records) if ex.footprint(r.get("method"), r.get("method_options")) is not None
    ]
    for model, like, n in _token_models(records):
        arch, cap = tm.architecture(like), capacity_gib(like)
        for ac in sorted(
            {bool(r.get("activation_checkpointing")) for r in records if r.get("model") == model}
        ):
            row = [model, "on" if ac else "off"]
            row += [
                fmt_float(tm.activation_bytes(arch, ac) / 2**20, 3),
                fmt_float(tm.loss_backward_bytes(arch) / 2**20, 3),
            ]
            row.append(f"{tm.saving_ends_tokens(arch, n, ac):.0f}")
            for record in labels:
                largest = None
                if cap is not None:
                    largest = tm.largest_tokens(
                        str(record.get("method")),
                        record.get("method_options"),
                        arch,
                        n,
                        ac,
                        cap,
                        record.get("master_weights"),
                    )
                row.append(NONE if largest is None else str(largest))
            rows.append(row)
    parts = [PEAK_TOKENS_TEXT]
    if rows:
        header = ["Model", "Act. ckpt", "a MiB/token", "l MiB/token", "FORGE's saving ends at tokens"]
        header += [f"Largest tokens, {display_name(r)}" for r in labels]
        table = Table("expected_peak_tokens", "Expected", header, rows, align="ll" + "r" * (len(header) - 2))
        parts.append(to_markdown(table).rstrip())
    parts.append(
        "a and l are counted from what transformers' decoder layers keep (harness.report.token_model); the "
        "largest step is where the predicted peak meets the card's memory, its CUDA context and the "
        "allocator's slack not counted."
    )
    return "\n\n".join(parts)
