"""What a CPU run shows, as its report leads with it: fidelity and losses, memory a parameter, and
step times that say nothing about a GPU.

A CPU (`python -m harness sweep +exp=smoke`) cannot measure what FORGE is for on a GPU, its step
time and its peak. It shows what FORGE promises besides: that each method trains like the
torch.optim rule it stands for, and what it holds a parameter. Its points get, in this order:

- `fidelity_table`: each point's distance from its torch reference, trained beside it in fp32
  (`harness.run.fidelity`), a FORGE point held to the distance its arithmetic explains:

      weight bound  rounding_walk + e x path
      loss bound    3 x loss_rounding_walk + e x path x loss_per_distance

  (the rounding walk's expected distance, its loss effect to three standard deviations, and an
  update off by e every step, at worst along the gradient; e: the states' error plus the gradient's
  own from the bf16 forward and backward); a point with FP8 GEMMs
  also gets the distance torchao's FP8 GEMMs put between torch's AdamW and the same reference
  (the sweep's fused_adamw_fp8 point), a rounding this does not derive. torch.optim's own bf16
  points are shown beside them, not held: they round to nearest, so an update under half a unit in
  the last place is lost every step and their errors are not independent;
- `loss_table`: every point's training loss at each step;
- `bytes_table` (`harness.report.preambles`) under its heading, its columns explained (`MEMORY_TEXT`);
- `step_table`: step times, each ratio against the method's own baseline (`harness.points.
  baseline_of`, named as what ran: `harness.report.names.ran_as`), and only where the two points'
  step times do not overlap (`beats_spread`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import forge
from harness.points import baseline_index, baseline_of, config_key, options_dict
from harness.records import Record, on_cpu
from harness.report.markup import NONE, Table, fmt_ms, fmt_ratio
from harness.report.names import display_name, ran_as
from harness.report.tables import Selection, dedupe_sorted, ok
from harness.run import methods
from harness.run.methods import interpreted
from harness.stats import step_stats

LOSS_SIGMAS = 3  # the loss gap is held to this many standard deviations of the rounding walk's effect

FIDELITY_TEXT = (
    "Each point that stands for a torch.optim rule also trained that rule in fp32 (weights, states "
    "and forward) from the point's own initial weights, on the same batch, for the same steps "
    "(`measure.fidelity`). FORGE should land where the arithmetic it keeps in lower precision "
    "takes it, and no further. Weight distance: ||W - W_ref|| over how far the reference moved "
    "the weights, ||W_ref - W_0|| (0: the same weights; 1: as far apart as training moved them). "
    "Loss gap: the fp32 model's loss at the point's final weights less at the reference's, so that "
    "only the weights differ. A FORGE row's bounds come from each point's own weights and "
    "gradient: (1) the rounding walk: every step rounds each bf16 weight stochastically, an error "
    "of variance at most ulp^2 / 4, independent from step to step, so the distance it makes is at "
    "most sqrt(steps x sum ulp(w)^2 / 4), and its effect on the loss has a standard deviation of "
    "sqrt(steps x sum (g ulp(w))^2 / 4), g the reference's final gradient (held to 3 of them); "
    "(2) each update's relative error e: the states' (||update from the reference's last states "
    "stored in the point's state dtype - exact update|| / ||exact update||: 0 in fp32, the rounding "
    "to nearest in bf16, forge's codes in int8) plus the gradient's (the bf16 forward and backward "
    "against the fp32 one, at the initial weights), at most e x the reference's path length in "
    "distance, and e x path x ||g|| x ||W_ref - W_0|| in loss. Weight bound: (1) + (2); loss bound: "
    "3 x (1) + (2), each cell with its terms. An FP8 row adds the distance and loss gap of "
    "torchao's FP8 row (fused_adamw_fp8): the FP8 GEMMs' rounding is not derived here. torch.optim's "
    "own rows on bf16 weights are the yardstick of bf16 training, not held: they round to nearest, "
    "which loses every update under half a unit in the last place, so their rounding is no random "
    "walk."
)

MEMORY_TEXT = (
    "What each method holds and moves a parameter, from its declared model "
    "(`harness.run.methods.footprint`): the same on a CPU as on a GPU, though a CPU measures no peak "
    "(the CUDA allocator's). Weights: the trained weights' bytes (bf16: 2). Gradient: the weight "
    "gradient's bytes alive at once at the step's peak (0 where each is consumed as it is made: "
    "FORGE inside the weight-gradient GEMM, the in-backward methods from hooks, the floor by "
    "dropping it). States: the optimizer's states (AdamW's two moments; int8: codes and a bf16 scale "
    "a group of 64; Muon's momentum). Held: weights + gradient + states, what the method keeps in "
    "memory beside the activations. Update traffic: the bytes the update reads and writes each step "
    "(the gradient written and read back, weights and states read and written), which sets the "
    "update's time on a GPU, where it is bound by memory bandwidth. Static: held bytes x "
    "parameters."
)

STEP_TEXT = (
    "A CPU runs the native methods' steps on its cores and FORGE's kernels in Triton's interpreter "
    "(Python over NumPy, hundreds of times slower than compiled code): neither says how a GPU times "
    "them. A ratio divides the method's median step by its baseline's (the torch method it replaces, "
    "as it ran here) and is given only where the points ran long enough to beat their own spread: "
    "where their step times do not overlap (the slower point's fastest timed step is slower than the "
    "faster point's p90). Otherwise the cell says so. An interpreted point gets no ratio."
)


# ---------------------------------------------------------------------------------------------
# Names


def cpu_name(record: Record) -> str:
    """The method's conf label, and what ran where the CPU made it other than its title:
    'fused_adamw: AdamW (foreach; no CUDA)'."""
    label, ran = display_name(record), ran_as(record)
    return label if ran == label else f"{label}: {ran}"


def reference_name(record: Record) -> str:
    """The torch reference a point's fidelity was measured against, in words."""
    reference = (record.get("fidelity") or {}).get("reference") or {}
    name, options = reference.get("method"), reference.get("options") or {}
    if name == "muon":
        return "torch Muon + AdamW, fp32"
    if name == "torch_rule":
        rule = forge.RULES.get(str(options.get("rule") or "adamw"))
        return f"torch {rule.torch_class().__name__ if rule else options.get('rule')}, fp32"
    return f"{name}, fp32"


# ---------------------------------------------------------------------------------------------
# Fidelity


def held(record: Record) -> bool:
    """Whether a point is held to the bounds: FORGE's kernels, its bf16 weights rounded stochastically
    (a random walk; `stochastic_rounding` is on unless the options turn it off)."""
    known = methods.registry().get(str(record.get("method")))
    rounds = options_dict(record.get("method_options")).get("stochastic_rounding", True)
    return bool(known is not None and known.triton_kernels and rounds is not False)


def _fp8_yardstick(record: Record, records: Sequence[Record]) -> dict[str, Any] | None:
    """The fidelity of the torch FP8 point (fused_adamw with the same `fp8` recipe) of the same
    sweep and configuration, for an FP8 FORGE point; None for another point or where none ran."""
    recipe = options_dict(record.get("method_options")).get("fp8")
    if not recipe or record.get("method") == "fused_adamw":
        return None
    for other in records:
        if (
            other.get("method") == "fused_adamw"
            and options_dict(other.get("method_options")).get("fp8") == recipe
            and config_key(other)[2:] == config_key(record)[2:]
            and other.get("sweep") == record.get("sweep")
            and ok(other)
            and other.get("fidelity")
        ):
            return other["fidelity"]
    return None


def bounds(record: Record, records: Sequence[Record]) -> tuple[str, str, bool] | None:
    """(loss bound cell, weight bound cell, within both) of a held point, each cell the bound and
    its terms; None where the record lacks a term (or its FP8 point's distance)."""
    f = record.get("fidelity") or {}
    names = (
        "rounding_walk",
        "state_error",
        "gradient_error",
        "path",
        "loss_rounding_walk",
        "loss_per_distance",
    )
    terms = [f.get(k) for k in names]
    if any(t is None for t in terms) or f.get("weight_distance") is None:
        return None
    walk, state, gradient, path, loss_walk, slope = (float(t) for t in terms)
    state += gradient  # the update's relative error a step: its states', and its gradient's
    weight_parts = [walk, state * path]
    loss_parts = [LOSS_SIGMAS * loss_walk, state * path * slope]
    if options_dict(record.get("method_options")).get("fp8"):
        fp8 = _fp8_yardstick(record, records)
        if fp8 is None or fp8.get("weight_distance") is None:
            return None
        weight_parts.append(float(fp8["weight_distance"]))
        loss_parts.append(abs(float(fp8["loss_gap"])))
    weight, loss = sum(weight_parts), sum(loss_parts)
    within = float(f["weight_distance"]) <= weight and abs(float(f["loss_gap"])) <= loss
    loss_cell = f"{loss:.5f} = {LOSS_SIGMAS} x {loss_walk:.5f} + " + " + ".join(
        f"{p:.5f}" for p in loss_parts[1:]
    )
    weight_cell = f"{weight:.4f} = " + " + ".join(f"{p:.4f}" for p in weight_parts)
    return loss_cell, weight_cell, within


def _missing(record: Record, records: Sequence[Record]) -> str:
    """Why a held point's bounds could not be drawn."""
    if options_dict(record.get("method_options")).get("fp8") and _fp8_yardstick(record, records) is None:
        return "no fused_adamw_fp8 point with a fidelity measurement beside it"
    return "its record lacks a term of the bounds (measured by an older harness)"


def fidelity_table(records: Sequence[Record]) -> Selection | None:
    """Per model, every point with a fidelity measurement: its loss and weight distance from its
    torch reference, and for a FORGE point the bounds it is held to."""
    chosen = [r for r in dedupe_sorted(records) if ok(r) and r.get("fidelity")]
    if not chosen:
        return None
    rows = []
    for record in chosen:
        f = record["fidelity"]
        row = [str(record.get("model")), cpu_name(record), reference_name(record), str(f.get("state_dtype"))]
        row += [
            f"{float(f['loss']):.4f}",
            f"{float(f['reference_loss']):.4f}",
            f"{float(f['loss_gap']):+.5f}",
        ]
        distance = f.get("weight_distance")
        found = bounds(record, records) if held(record) else None
        if held(record) and found is not None:
            loss_bound, weight_bound, within = found
            verdict = "yes" if within else "**no**"
        elif held(record):
            loss_bound, weight_bound, verdict = NONE, NONE, f"not judged: {_missing(record, records)}"
        else:
            loss_bound, weight_bound, verdict = NONE, NONE, "not held: rounds to nearest"
        row += [loss_bound, NONE if distance is None else f"{float(distance):.4f}", weight_bound, verdict]
        rows.append(row)
    steps = sorted({int(r.get("steps") or len(r.get("losses") or [])) for r in chosen})
    header = ["Model", "Method", "Reference", "States", f"Loss after {'/'.join(map(str, steps))} updates"]
    header += [
        "Reference's loss",
        "Loss gap",
        "Loss bound",
        "Weight distance",
        "Weight bound",
        "Within bounds",
    ]
    title = "Fidelity: each method's distance from its torch.optim reference after the run"
    table = Table("fidelity_cpu", title, header, rows, align="llll" + "r" * 6 + "l")
    return Selection(table, chosen)


# ---------------------------------------------------------------------------------------------
# Losses


def loss_table(records: Sequence[Record]) -> Selection | None:
    """Every point's training loss at each step (the loss before that step's update), and how far it
    fell; a failed point shows its status."""
    chosen = [r for r in dedupe_sorted(records) if r.get("losses") or not ok(r)]
    if not chosen:
        return None
    steps = max(len(r.get("losses") or []) for r in chosen)
    rows = []
    for record in chosen:
        losses = [float(v) for v in record.get("losses") or []] if ok(record) else []
        cells = [f"{v:.4f}" for v in losses] + [NONE] * (steps - len(losses))
        if not ok(record):
            cells = [str(record.get("status"))] + [NONE] * (steps - 1)
        fell = f"{losses[0] - losses[-1]:.4f}" if len(losses) > 1 else NONE
        rows.append([str(record.get("model")), cpu_name(record)] + cells + [fell])
    header = ["Model", "Method"] + [f"Step {i + 1}" for i in range(steps)] + ["Fell by"]
    title = "Training loss at each step (nats; the loss before that step's update)"
    return Selection(Table("losses_cpu", title, header, rows, align="ll" + "r" * (steps + 1)), chosen)


# ---------------------------------------------------------------------------------------------
# Step times


def beats_spread(record: Record, baseline: Record) -> bool:
    """Whether two points' timed steps do not overlap: the slower's fastest step is slower than the
    faster's p90 (so the ratio of their medians is not within either's own spread)."""
    mine, base = step_stats(record), step_stats(baseline)
    if mine is None or base is None:
        return False
    low_mine, high_mine = mine.minimum or mine.median, mine.p90 or mine.median
    low_base, high_base = base.minimum or base.median, base.p90 or base.median
    return low_mine > high_base or low_base > high_mine


def _ratio_cell(record: Record, baseline: Record | None) -> str:
    if baseline is None:
        return NONE
    if baseline is record:
        return "baseline"
    if interpreted(record) or interpreted(baseline):
        return "no ratio: interpreted"
    if not ok(baseline):
        return f"baseline {baseline.get('status')}"
    if not beats_spread(record, baseline):
        return "within spread"
    return fmt_ratio(step_stats(record).median / step_stats(baseline).median)


def _spread(record: Record) -> str:
    stats = step_stats(record)
    if stats is None or stats.minimum is None or stats.p90 is None:
        return NONE
    return f"{stats.minimum:.1f}-{stats.p90:.1f}"


def step_table(records: Sequence[Record]) -> Selection | None:
    """Median step time and its spread per point, its baseline named as what ran, and the ratio to
    it where the two do not overlap (`beats_spread`)."""
    chosen = dedupe_sorted(records)
    if not chosen:
        return None
    index = baseline_index(records)
    rows = []
    for record in chosen:
        kernels = "Triton interpreter" if interpreted(record) else "native"
        if not ok(record):
            rows.append(
                [
                    str(record.get("model")),
                    cpu_name(record),
                    kernels,
                    str(record.get("status")),
                    NONE,
                    NONE,
                    NONE,
                ]
            )
            continue
        baseline = baseline_of(record, index)
        base_name = NONE if baseline is None else ("itself" if baseline is record else cpu_name(baseline))
        stats = step_stats(record)
        rows.append(
            [str(record.get("model")), cpu_name(record), kernels, fmt_ms(stats.median if stats else None)]
            + [_spread(record), base_name, _ratio_cell(record, baseline)]
        )
    header = ["Model", "Method", "Kernels", "Step ms (median)", "Step ms (min-p90)", "Baseline"]
    header += ["Step time vs baseline"]
    title = "Step times on a CPU (nothing about a GPU's)"
    return Selection(Table("step_times_cpu", title, header, rows, align="lll" + "rr" + "lr"), chosen)


def cpu_records(records: Sequence[Record]) -> list[Record]:
    """The step-time records measured on a CPU."""
    return [r for r in records if on_cpu(r)]
