"""The report's plots: PNG files drawn with matplotlib's Agg backend (no display needed).

Each function draws one figure from plain records and writes it with `save`, which fixes
everything that would make two renderings of the same data differ: the default style (a user's
matplotlibrc is ignored), a fixed size and dpi, and no PNG metadata (matplotlib otherwise stamps
its version as 'Software'). The same records and the same matplotlib give the same bytes.

Points that did not run are drawn as a text label (OOM, error, ...) where their bar or marker
would be, never as a zero-height bar.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.points import display_name  # noqa: E402
from harness.records import (  # noqa: E402
    HELDOUT_FIELDS,
    Record,
    activations_gib,
)
from harness.report.convergence_table import curve, reference_of  # noqa: E402
from harness.stats import step_stats  # noqa: E402

STYLE = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}
POOLS = (  # the modelled split of records without forward_end_alloc_gib
    ("weights_gib", "weights"),
    ("grads_gib", "gradients (modelled)"),
    ("optimizer_state_gib", "optimizer states"),
    ("activations_gib", "activations (the remainder)"),
)
STATUS_TEXT = {"oom": "OOM", "error": "error", "diverged": "diverged", "unavailable": "unavailable"}
# Usable memory per GPU in GiB, for the capacity line when a record does not carry it.
KNOWN_CAPACITY_GIB = {"H200": 139.8, "H100": 79.2, "A100-SXM4-80GB": 79.2, "A100-SXM4-40GB": 39.4}


def save(fig: Any, path: Path) -> Path:
    """Write `fig` as a PNG with no metadata, and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def styled(draw: Callable[..., Path]) -> Callable[..., Path]:
    """Run a drawing function under the default style plus STYLE, whatever the user's rc says."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Path:
        with plt.style.context("default"), plt.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper


def _figure(width: float = 7.0, height: float = 4.0, nrows: int = 1, ncols: int = 1):
    return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)


def _label(record: Record) -> str:
    return display_name(record)


def _bar_labels(records: Sequence[Record]) -> list[str]:
    """One x label per bar; a method measured in several sweeps gets its sweep's name too."""
    names = [_label(r) for r in records]
    return [f"{n}\n({r.get('sweep')})" if names.count(n) > 1 else n for n, r in zip(names, records)]


def _ok(record: Record) -> bool:
    return record.get("status") == "ok"


def _status(record: Record) -> str:
    return STATUS_TEXT.get(str(record.get("status")), str(record.get("status")))


def capacity_gib(record: Record) -> float | None:
    """The memory the point could use: its cap, the GPU's size if recorded, or a known size."""
    if record.get("memory_cap_gib") is not None:
        return float(record["memory_cap_gib"])
    env = record.get("env") or {}
    for name in ("gpu_memory_gib", "gpu_total_memory_gib"):
        if isinstance(env, dict) and env.get(name):
            return float(env[name])
    gpu = str(record.get("gpu_name") or "")
    matches = [size for key, size in KNOWN_CAPACITY_GIB.items() if key in gpu]
    return matches[0] if matches else None


def _mark_failures(ax: Any, records: Sequence[Record], y: float) -> None:
    for i, record in enumerate(records):
        if not _ok(record):
            ax.text(i, y, _status(record), ha="center", va="bottom", rotation=90, color="crimson")


@styled
def memory_breakdown(records: Sequence[Record], title: str, path: Path) -> Path:
    """Stacked bars of the peak per method, with the GPU capacity line.

    Where the records carry `forward_end_alloc_gib` (measured when the forward returns), the bar
    is measured throughout: weights, optimizer states, what else is live at the end of the forward
    pass (the saved activations), and what backward and the update add on top to reach the peak
    (gradients and transients). Older records get the modelled split (`harness.run.measure.breakdown`:
    every gradient assumed alive at the peak, activations as the remainder), labelled as such."""
    fig, axes = _figure(max(6.0, 0.9 * len(records) + 2), 4.5)
    ax = axes[0][0]
    bottoms = [0.0] * len(records)
    measured = all(r.get("forward_end_alloc_gib") is not None for r in records if _ok(r))
    for name, height in _pools(measured):
        heights = [height(r) if _ok(r) else 0.0 for r in records]
        ax.bar(range(len(records)), heights, bottom=bottoms, label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    cap = next((capacity_gib(r) for r in records if capacity_gib(r)), None)
    if cap:
        ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"GPU capacity {cap:.1f} GiB")
    _mark_failures(ax, records, 0.02 * (cap or max(bottoms + [1.0])))
    ax.set_xticks(range(len(records)), _bar_labels(records), rotation=30, ha="right")
    ax.set_ylabel("peak allocated, GiB")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return save(fig, path)


def _pools(measured: bool) -> list[tuple[str, Callable[[Record], float]]]:
    """(legend label, GiB of the pool in a record) from the bottom of the bar up."""
    field = lambda name: lambda r: float(r.get(name) or 0.0)
    static = lambda r: field("weights_gib")(r) + field("optimizer_state_gib")(r)
    if measured:
        forward_end = lambda r: activations_gib(r) or 0.0
        peak = lambda r: max(0.0, field("peak_alloc_gib")(r) - static(r) - forward_end(r))
        return [
            ("weights", field("weights_gib")),
            ("optimizer states", field("optimizer_state_gib")),
            ("live at the end of forward (activations)", forward_end),
            ("added in backward and update (gradients)", peak),
        ]
    modelled = [(name, field(f)) for f, name in POOLS]
    rest = lambda r: max(0.0, field("peak_alloc_gib")(r) - sum(height(r) for _, height in modelled))
    return modelled + [("rest", rest)]


@styled
def step_time(records: Sequence[Record], title: str, path: Path) -> Path:
    """Median step time per method with a min-p90 whisker."""
    fig, axes = _figure(max(6.0, 0.9 * len(records) + 2), 4.0)
    ax = axes[0][0]
    for i, record in enumerate(records):
        stats = step_stats(record) if _ok(record) else None
        if stats is None:
            continue
        low = stats.median - (stats.minimum if stats.minimum is not None else stats.median)
        high = (stats.p90 if stats.p90 is not None else stats.median) - stats.median
        ax.bar(i, stats.median, color="tab:blue")
        ax.errorbar(i, stats.median, yerr=[[low], [high]], color="black", capsize=3)
    _mark_failures(ax, records, 0.0)
    ax.set_xticks(range(len(records)), _bar_labels(records), rotation=30, ha="right")
    ax.set_ylabel("step time, ms (median; whisker min to p90)")
    ax.set_title(title)
    fig.tight_layout()
    return save(fig, path)


@styled
def memory_vs_size(records: Sequence[Record], title: str, path: Path) -> Path:
    """Peak allocated memory against parameter count, one line per method; OOM as an x."""
    fig, axes = _figure(6.5, 4.0)
    ax = axes[0][0]
    lines: dict[str, list[Record]] = {}
    for record in records:
        lines.setdefault(_label(record), []).append(record)
    top = max([float(r.get("peak_alloc_gib") or 0) for r in records] + [1.0])
    for label, members in lines.items():
        members = sorted(members, key=lambda r: float(r.get("n_params") or 0))
        ok = [r for r in members if _ok(r) and r.get("n_params")]
        ax.plot(
            [r["n_params"] / 1e9 for r in ok],
            [r.get("peak_alloc_gib") or 0 for r in ok],
            marker="o",
            label=label,
        )
        failed = [r for r in members if not _ok(r) and r.get("n_params")]
        if failed:
            ax.scatter(
                [r["n_params"] / 1e9 for r in failed], [top * 1.05] * len(failed), marker="x", color="crimson"
            )
            for r in failed:
                ax.annotate(_status(r), (r["n_params"] / 1e9, top * 1.05), fontsize=7, color="crimson")
    ax.set_xlabel("parameters, billions")
    ax.set_ylabel("peak allocated, GiB")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)


@styled
def largest_batch(entries: Sequence[tuple[str, int | None]], title: str, path: Path) -> Path:
    """Bars of the largest micro-batch per method; 'none fits' as text."""
    fig, axes = _figure(max(5.0, 0.9 * len(entries) + 2), 3.8)
    ax = axes[0][0]
    for i, (_label_text, batch) in enumerate(entries):
        if batch:
            ax.bar(i, batch, color="tab:green")
            ax.text(i, batch, str(batch), ha="center", va="bottom")
        else:
            ax.text(i, 0.05, "none fits", ha="center", va="bottom", rotation=90, color="crimson")
    ax.set_xticks(range(len(entries)), [e[0] for e in entries], rotation=30, ha="right")
    ax.yaxis.get_major_locator().set_params(integer=True)  # batch sizes are whole numbers
    ax.set_ylabel("largest micro-batch that fits")
    ax.set_title(title, fontsize=9, wrap=True)
    fig.tight_layout()
    return save(fig, path)


@styled
def kernel_speed(series: dict[str, dict[str, list[tuple[int, float]]]], title: str, path: Path) -> Path:
    """Per shape, each variant's time relative to the cuBLAS GEMM against T."""
    shapes = list(series)
    cols = min(4, len(shapes))
    rows = (len(shapes) + cols - 1) // cols
    fig, axes = _figure(3.2 * cols, 2.6 * rows + 0.6, rows, cols)
    for index, shape in enumerate(shapes):
        ax = axes[index // cols][index % cols]
        for variant, points in series[shape].items():
            ax.plot([t for t, _ in points], [v for _, v in points], marker="o", markersize=3, label=variant)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(shape, fontsize=9)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("time / cuBLAS GEMM")
    for index in range(len(shapes), rows * cols):
        axes[index // cols][index % cols].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return save(fig, path)


@styled
def convergence_curves(group: Sequence[Record], title: str, path: Path) -> Path:
    """Training loss per step for every method, its difference to the reference (a 50-step moving
    mean, so that drift shows through the noise), and the held-out loss; a dotted line marks where
    a new phase (continued pretraining) starts."""
    fig, axes = _figure(7.0, 8.5, 3, 1)
    top, middle, bottom = axes[0][0], axes[1][0], axes[2][0]
    reference = reference_of(group)
    ref_curve = curve(reference) if reference else None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, record in enumerate(group):
        color = colors[index % len(colors)]  # one color per method in all three panels
        losses = curve(record) or []
        top.plot(range(len(losses)), losses, linewidth=0.8, label=_label(record), color=color)
        if ref_curve and record is not reference:
            n = min(len(losses), len(ref_curve))
            deltas = [losses[i] - ref_curve[i] for i in range(n)]
            middle.plot(range(n), _moving_mean(deltas, 50), linewidth=0.8, color=color)
        heldout, steps = curve(record, HELDOUT_FIELDS), record.get("heldout_steps")
        if heldout:
            bottom.plot(
                steps if steps and len(steps) == len(heldout) else range(len(heldout)),
                heldout,
                linewidth=0.8,
                marker=".",
                markersize=2,
                color=color,
            )
    for phase in (reference or (group[0] if group else {})).get("phases") or []:
        if int(phase.get("first_step", 0)) > 0:
            for ax in (top, middle, bottom):
                ax.axvline(int(phase["first_step"]), color="gray", linestyle=":", linewidth=0.8)
    top.set_ylabel("training loss, nats")
    top.set_title(title)
    top.legend(fontsize=7)
    middle.axhline(0.0, color="black", linewidth=0.8)
    middle.set_ylabel("loss - reference, nats\n(50-step mean)")
    bottom.set_xlabel("step")
    bottom.set_ylabel("held-out loss, nats")
    fig.tight_layout()
    return save(fig, path)


def _moving_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the (window - 1) before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _colors(labels: Sequence[str]) -> dict[str, str]:
    """One color per label, the same in every panel of a figure."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(dict.fromkeys(labels))}


def _legend(ax: Any) -> None:
    """A legend where something is labelled (a sweep of failed points draws no line)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _tokens_axis(ax: Any, ticks: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(sorted(set(ticks)), [str(t) for t in sorted(set(ticks))])
    ax.set_xlabel("tokens per step")


def _draw_series(ax: Any, series: Sequence[Any], colors: dict[str, str], top: float) -> None:
    """Measured points joined by a line, the prediction as a dashed line (with a dotted lower
    bound and a band between where the two differ), and the points without a figure as a
    labelled x at `top`, one line of text per point."""
    failed: dict[int, list[tuple[str, str]]] = {}
    for s in series:
        color = colors[s.label]
        ok = [(t, v) for t, v, _ in s.points if v is not None]
        if ok:
            solid = s.linestyle == "-"
            marker, fill = ("o", "full") if solid else ("s", "none")
            xs, ys = [t for t, _ in ok], [v for _, v in ok]
            ax.plot(xs, ys, linestyle=s.linestyle, marker=marker, fillstyle=fill, color=color, label=s.label)
        for t, v, status in s.points:
            if v is None:
                failed.setdefault(t, []).append((f"{s.label}: {status}", color))
        if s.predicted:
            xs, lows, highs = zip(*s.predicted)
            ax.plot(xs, highs, linestyle="--", linewidth=0.9, color=color)
            if any(abs(h - lo) > 1e-9 for lo, h in zip(lows, highs)):
                ax.plot(xs, lows, linestyle=":", linewidth=0.9, color=color)
                ax.fill_between(xs, lows, highs, color=color, alpha=0.08)
    for t, lines in failed.items():
        for k, (text, color) in enumerate(lines):
            ax.scatter([t], [top], marker="x", color=color)
            ax.annotate(
                text,
                (t, top),
                xytext=(0, -9 * (k + 1)),
                textcoords="offset points",
                fontsize=6,
                color=color,
                ha="center",
                va="top",
            )


def _draw_over_floor(ax: Any, lines: Sequence[Any], colors: dict[str, str]) -> None:
    """One panel of steps over the floor: the series, room above the highest measured or predicted
    ratio for the failures' labels, and the floor as a line at 1."""
    measured = [v for s in lines for _, v, _ in s.points if v is not None]
    predicted = [h for s in lines for _, _, h in s.predicted]
    top = max(measured + predicted + [1.0]) * 1.05
    _draw_series(ax, lines, colors, top)
    ax.set_ylim(top=top * 1.02)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("step time / no-optimizer step of the same mode")


@styled
def overhead_vs_tokens(
    series: dict[tuple, list[Any]],
    times: dict[tuple, tuple[list[tuple[int, float]], dict[str, float]]],
    path: Path,
) -> Path:
    """Per (model, GPU): each graphed method's step over the graphed floor against tokens per step
    (measured: solid; predicted: dashed where none of the update hides, dotted where all that fits
    under the dW GEMM does), each eager one's over the eager floor (dash-dot, hollow squares), and
    beside it the prediction's parts: the step's dW GEMMs against each update's traffic, which can
    hide where it lies below the GEMM line. Panels in the series' order (model size)."""
    groups = list(series)
    fig, axes = _figure(11.0, 4.2 * len(groups), len(groups), 2)
    colors = _colors([s.label for key in groups for s in series[key]])
    for row, key in enumerate(groups):
        left, right = axes[row][0], axes[row][1]
        _draw_over_floor(left, series[key], colors)
        _tokens_axis(left, [t for s in series[key] for t, _, _ in s.points])
        left.set_title(
            f"{key[0]}, {key[1]}: graphed (solid), eager (dash-dot), predicted (dashed, dotted)", fontsize=9
        )
        _legend(left)
        gemm, updates = times.get(key, ([], {}))
        if gemm:
            right.plot(
                [t for t, _ in gemm], [ms for _, ms in gemm], color="black", marker=".", label="dW GEMMs"
            )
        for label, ms in updates.items():
            color = colors.get(label.split(" ")[0], "gray")
            right.axhline(ms, color=color, linestyle="--", linewidth=0.9, label=label)
        _tokens_axis(right, [t for t, _ in gemm])
        right.set_ylim(bottom=0)
        right.set_ylabel("ms a step (800 TFLOP/s, 4.27 TB/s)")
        right.set_title("Predicted parts: FORGE's update can hide where it lies below the GEMMs", fontsize=9)
        _legend(right)
    fig.tight_layout()
    return save(fig, path)


@styled
def overhead_vs_size(series: dict[tuple, list[Any]], path: Path) -> Path:
    """Per (tokens per step, GPU): each graphed method's step over the graphed floor against the
    model's parameters, measured (solid) and predicted (dashed where none of the update hides,
    dotted where all that fits under the dW GEMM does)."""
    groups = list(series)
    fig, axes = _figure(5.5 * len(groups), 4.2, 1, len(groups))
    colors = _colors([s.label for key in groups for s in series[key]])
    for col, key in enumerate(groups):
        ax = axes[0][col]
        _draw_over_floor(ax, series[key], colors)
        ax.set_xscale("log")
        sizes = sorted({n for s in series[key] for n, _, _ in s.points})
        ax.set_xticks(sizes, [f"{n / 1e9:.1f}" for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("parameters, billions")
        ax.set_title(f"{key[0]:,} tokens a step, {key[1]}", fontsize=9)
        _legend(ax)
    fig.tight_layout()
    return save(fig, path)


@styled
def peak_vs_tokens(
    series: dict[tuple, dict[bool, list[Any]]], capacity: dict[tuple, float | None], path: Path
) -> Path:
    """Per (model, GPU), without and with activation checkpointing: each method's peak against
    tokens per step, measured (solid, a failure as a labelled x at the card's memory) and predicted
    (dashed), with the card's memory as a line. Panels in the series' order (model size)."""
    groups = list(series)
    fig, axes = _figure(11.0, 4.2 * len(groups), len(groups), 2)
    colors = _colors([s.label for key in groups for ac in (False, True) for s in series[key].get(ac, [])])
    for row, key in enumerate(groups):
        cap = capacity.get(key)
        for col, ac in enumerate((False, True)):
            ax = axes[row][col]
            lines = series[key].get(ac, [])
            values = [v for s in lines for _, v, _ in s.points if v is not None]
            _draw_series(ax, lines, colors, cap or max(values + [1.0]) * 1.05)
            if cap:
                ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"GPU memory {cap:.1f} GiB")
            _tokens_axis(ax, [t for s in lines for t, _, _ in s.points])
            ax.set_ylabel("peak allocated, GiB")
            state = "with" if ac else "without"
            ax.set_title(f"{key[0]}, {key[1]}: {state} activation checkpointing", fontsize=9)
            _legend(ax)
    fig.tight_layout()
    return save(fig, path)
