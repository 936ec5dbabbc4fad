"""The report's plots: PNG files drawn with matplotlib's Agg backend (no display needed).

Each function draws one figure from plain records and writes it with `save`, which fixes
everything that would make two renderings of the same data differ: the default style (a user's
matplotlibrc is ignored), a fixed size and dpi, and no PNG metadata (matplotlib otherwise stamps
its version as 'Software'). The same records and the same matplotlib give the same bytes.

Every plot reads at 100% on a laptop screen: at most `MAX_WIDTH_PX` wide and high (a test holds
every committed PNG to it), every series of a plot its own colour and marker (`series_styles`),
labels whole (`save` crops to what is drawn, nothing cut off), and a legend
for every kind of line and marker drawn. Bars per method run horizontally, one row per method, so
the names read straight and forty methods make a taller plot, not a wider one.

Points that did not run are drawn as a text label (OOM, error, ...) where their bar would be, or
as a marker named in the legend, never as a zero-height bar. A step time measured in Triton's CPU
interpreter is drawn hatched, and the legend says that it says nothing about speed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from harness.records import (  # noqa: E402
    HELDOUT_FIELDS,
    Record,
    activations_gib,
)
from harness.report.convergence_table import curve, reference_of  # noqa: E402
from harness.report.names import display_name  # noqa: E402
from harness.run import gpus  # noqa: E402
from harness.run.methods import interpreted  # noqa: E402
from harness.stats import step_stats  # noqa: E402

STYLE = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}
MAX_WIDTH_PX = 2000  # the widest (and tallest) plot a laptop shows at 100%
MAX_HEIGHT_IN = 18.0  # the tallest figure drawn, in inches: under MAX_WIDTH_PX with its legend below
PALETTE = (  # tab10, then tab20's lighter shades: twenty colours told apart
    "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
    "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
    "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
MARKERS = "osD^v<>ph"  # nine: coprime with the twenty colours
LONG_LABEL = 45  # characters: a legend of longer labels takes one column
LINESTYLES = ("-", "--", "-.", ":")  # a line plot's series take these in turn beside colour and marker
BAR_ROW_IN = 0.24  # the height of one method's bar, in inches (24 px at 100 dpi: a line of 9 pt text)
BARS_WIDTH_IN = 5.5  # the width of a bar plot's axes (and title), in inches
LABEL_CHAR_IN = 0.07  # the width of a character of a 9 pt label, in inches
INTERPRETER_LABEL = "Triton's CPU interpreter: says nothing about speed"
FAILURE_MARKERS = {"OOM": "x"}  # a failed point on a line plot, by its status label; others: "^"
POOLS = (  # the modelled split of records without forward_end_alloc_gib
    ("weights_gib", "weights"),
    ("grads_gib", "gradients (modelled)"),
    ("optimizer_state_gib", "optimizer states"),
    ("activations_gib", "activations (the remainder)"),
)
STATUS_TEXT = {"oom": "OOM", "error": "error", "diverged": "diverged", "unavailable": "unavailable"}


def save(fig: Any, path: Path) -> Path:
    """Write `fig` as a PNG with no metadata, cropped to what is drawn (no label cut off, however
    long), and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight", pad_inches=0.1)
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
    """A figure of panels, never taller than MAX_HEIGHT_IN (panels share what there is)."""
    return plt.subplots(nrows, ncols, figsize=(width, min(height, MAX_HEIGHT_IN)), squeeze=False)


def _label(record: Record) -> str:
    return display_name(record)


def _bar_labels(records: Sequence[Record], name: Callable[[Record], str] = _label) -> list[str]:
    """One label per bar; a method measured in several sweeps gets its sweep's name too."""
    names = [name(r) for r in records]
    return [f"{n} ({r.get('sweep')})" if names.count(n) > 1 else n for n, r in zip(names, records)]


def _bars_figure(labels: Sequence[str], extra_height: float = 1.4):
    """A figure for one horizontal bar per label, one row each, the first at the top, wide enough
    for the longest label beside axes of `BARS_WIDTH_IN`."""
    n = len(labels)
    width = BARS_WIDTH_IN + LABEL_CHAR_IN * max(map(len, labels), default=0)
    fig, axes = _figure(width, max(2.4, BAR_ROW_IN * n + extra_height))
    ax = axes[0][0]
    ax.set_ylim(n - 0.5, -0.5)  # the first record on top, as in the tables
    ax.grid(axis="y", visible=False)
    return fig, ax


def _method_axis(ax: Any, records: Sequence[Record], name: Callable[[Record], str] = _label) -> None:
    ax.set_yticks(range(len(records)), _bar_labels(records, name))


def _ok(record: Record) -> bool:
    return record.get("status") == "ok"


def _status(record: Record) -> str:
    return STATUS_TEXT.get(str(record.get("status")), str(record.get("status")))


def capacity_gib(record: Record) -> float | None:
    """The memory the point could use: its cap, the GPU's size if recorded, or the memory of the
    card it ran on as its conf/gpu kind states it (`gpus.ran_on`)."""
    if record.get("memory_cap_gib") is not None:
        return float(record["memory_cap_gib"])
    env = record.get("env") or {}
    for name in ("gpu_memory_gib", "gpu_total_memory_gib"):
        if isinstance(env, dict) and env.get(name):
            return float(env[name])
    card = gpus.ran_on(record)
    return None if card is None or card.memory_gib is None else float(card.memory_gib)


def _mark_failures(ax: Any, records: Sequence[Record]) -> None:
    """The status of each point that did not run, at the start of its bar's row."""
    for i, record in enumerate(records):
        if not _ok(record):
            ax.text(0.005, i, _status(record), transform=ax.get_yaxis_transform(), ha="left", va="center",
                    color="crimson")  # fmt: skip


@styled
def memory_breakdown(records: Sequence[Record], title: str, path: Path) -> Path:
    """Stacked bars of the peak per method, one row each, with the GPU capacity line.

    Where the records carry `forward_end_alloc_gib` (measured when the forward returns), the bar
    is measured throughout: weights, optimizer states, what else is live at the end of the forward
    pass (the saved activations), and what backward and the update add on top to reach the peak
    (gradients and transients). Older records get the modelled split (`harness.run.measure.breakdown`:
    every gradient assumed alive at the peak, activations as the remainder), labelled as such."""
    fig, ax = _bars_figure(_bar_labels(records))
    lefts = [0.0] * len(records)
    measured = all(r.get("forward_end_alloc_gib") is not None for r in records if _ok(r))
    for name, width in _pools(measured):
        widths = [width(r) if _ok(r) else 0.0 for r in records]
        ax.barh(range(len(records)), widths, left=lefts, height=0.7, label=name)
        lefts = [left + w for left, w in zip(lefts, widths)]
    cap = next((capacity_gib(r) for r in records if capacity_gib(r)), None)
    if cap:
        ax.axvline(cap, color="black", linestyle="--", linewidth=1, label=f"GPU capacity {cap:.1f} GiB")
    _mark_failures(ax, records)
    _method_axis(ax, records)
    ax.set_xlabel("peak allocated, GiB")
    ax.set_title(title)
    fig.tight_layout()
    _figure_legend(fig, [ax])
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
def step_time(
    records: Sequence[Record], title: str, path: Path, name: Callable[[Record], str] = _label
) -> Path:
    """Median step time per method, one row each, with a min-p90 whisker and the median written
    beside it; hatched where Triton's CPU interpreter ran the method's kernels. Where the times
    span more than 30x (interpreted kernels beside compiled ones), the axis is logarithmic."""
    fig, ax = _bars_figure(_bar_labels(records, name))
    medians = []
    for i, record in enumerate(records):
        stats = step_stats(record) if _ok(record) else None
        if stats is None:
            continue
        low = stats.minimum if stats.minimum is not None else stats.median
        high = stats.p90 if stats.p90 is not None else stats.median
        slow = interpreted(record)
        ax.barh(
            i,
            stats.median,
            height=0.7,
            color="tab:orange" if slow else "tab:blue",
            hatch="//" if slow else None,
        )
        ax.errorbar(
            stats.median, i, xerr=[[stats.median - low], [high - stats.median]], color="black", capsize=2
        )
        ax.annotate(
            f"{stats.median:.1f}",
            (high, i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
        medians.append(stats.median)
    if medians and max(medians) > 30 * min(medians):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    if medians:
        ax.set_xlim(right=max(ax.get_xlim()[1], max(medians) * 1.15))  # room for the last label
    _mark_failures(ax, records)
    _method_axis(ax, records, name)
    ax.set_xlabel("step time, ms (median; whisker: min to p90)")
    ax.set_title(title)
    fig.tight_layout()
    if any(interpreted(r) for r in records if _ok(r)):
        handles = [Patch(facecolor="tab:blue", label="run natively")]
        handles.append(Patch(facecolor="tab:orange", hatch="//", label=INTERPRETER_LABEL))
        _figure_legend(fig, [], handles)
    return save(fig, path)


@styled
def loss_per_step(
    records: Sequence[Record], title: str, path: Path, name: Callable[[Record], str] = _label
) -> Path:
    """The training loss at each step, one line per method, each its own colour, marker and line
    style; methods whose losses are the same at every step share one line and one legend entry (the
    floor's stays flat: nothing trained). Where points carry a fidelity measurement
    (`harness.run.fidelity`), a second panel draws each one's loss less its fp32 torch reference's at
    the same step: curves that lie on one another above come apart there."""
    curves: dict[tuple[float, ...], list[Record]] = {}
    for record in records:
        losses = record.get("losses") if _ok(record) else None
        if losses:
            curves.setdefault(tuple(round(float(v), 4) for v in losses), []).append(record)
    gaps = any((r.get("fidelity") or {}).get("reference_losses") for group in curves.values() for r in group)
    fig, axes = _figure(7.0, 7.0 if gaps else 3.8, nrows=2 if gaps else 1)
    ax = axes[0][0]
    for i, ((losses, group), (color, marker)) in enumerate(zip(curves.items(), series_styles(len(curves)))):
        style = dict(color=color, marker=marker, linestyle=LINESTYLES[i % len(LINESTYLES)])
        ax.plot(range(1, len(losses) + 1), losses, label=" = ".join(map(name, group)), **style)
        reference = (group[0].get("fidelity") or {}).get("reference_losses")
        if gaps and reference:
            gap = [float(a) - float(b) for a, b in zip(group[0]["losses"], reference)]
            axes[1][0].plot(range(1, len(gap) + 1), gap, **style)
    ax.set_ylabel("training loss, nats")
    ax.set_title(title)
    if gaps:
        below = axes[1][0]
        below.axhline(0.0, color="black", linewidth=0.8)
        below.set_ylabel("loss less its fp32 torch\nreference's at that step, nats")
        below.set_title("Against the reference (points with a fidelity measurement)")
    for row in axes:
        row[0].xaxis.get_major_locator().set_params(integer=True)
        row[0].set_xlabel("step (warm-up included)")
    fig.tight_layout()
    if curves:
        longest = max(len(text) for text in ax.get_legend_handles_labels()[1])
        _figure_legend(fig, [ax], columns=1 if longest > LONG_LABEL else 2)
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
    """Bars of the largest micro-batch per method, one row each; 'none fits' as text."""
    fig, ax = _bars_figure([e[0] for e in entries], extra_height=1.6)
    for i, (_label_text, batch) in enumerate(entries):
        if batch:
            ax.barh(i, batch, height=0.7, color="tab:green")
            ax.annotate(str(batch), (batch, i), xytext=(4, 0), textcoords="offset points", va="center")
        else:
            ax.text(0.005, i, "none fits", transform=ax.get_yaxis_transform(), va="center", color="crimson")
    ax.set_yticks(range(len(entries)), [e[0] for e in entries])
    ax.xaxis.get_major_locator().set_params(integer=True)  # batch sizes are whole numbers
    ax.set_xlim(right=max([b or 0 for _, b in entries] + [1]) * 1.12)
    ax.set_xlabel("largest micro-batch that fits")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save(fig, path)


@styled
def kernel_speed(series: dict[str, dict[str, list[tuple[int, float]]]], title: str, path: Path) -> Path:
    """Per shape, each variant's time relative to the cuBLAS GEMM against T; one colour and line
    style per variant in every panel (past the colour cycle's ten, dashed), one legend under them."""
    shapes = list(series)
    cols = min(4, len(shapes))
    rows = (len(shapes) + cols - 1) // cols
    fig, axes = _figure(3.2 * cols, 2.6 * rows + 0.6, rows, cols)
    colors = _colors([variant for shape in shapes for variant in series[shape]])
    styles = {variant: "-" if i < 10 else "--" for i, variant in enumerate(colors)}
    for index, shape in enumerate(shapes):
        ax = axes[index // cols][index % cols]
        for variant, points in series[shape].items():
            xs, ys = [t for t, _ in points], [v for _, v in points]
            ax.plot(
                xs,
                ys,
                marker="o",
                markersize=3,
                color=colors[variant],
                linestyle=styles[variant],
                label=variant,
            )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(shape, fontsize=9)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("time / cuBLAS GEMM")
    for index in range(len(shapes), rows * cols):
        axes[index // cols][index % cols].set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    _figure_legend(fig, [axes[i // cols][i % cols] for i in range(len(shapes))])
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
    colors = _colors([_label(r) for r in group])
    for record in group:
        color = colors[_label(record)]  # one color per method in all three panels
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


def series_styles(count: int) -> list[tuple[str, str]]:
    """(colour, marker) for `count` series, no two alike: twenty colours and nine markers, both in
    turn, so that no pair repeats before 180 series and no marker repeats among any ten."""
    return [(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]) for i in range(count)]


def _colors(labels: Sequence[str]) -> dict[str, str]:
    """One color per label, the same in every panel of a figure."""
    unique = list(dict.fromkeys(labels))
    return {label: color for label, (color, _) in zip(unique, series_styles(len(unique)))}


def _legend(ax: Any) -> None:
    """A legend where something is labelled (a sweep of failed points draws no line)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _figure_legend(fig: Any, axes: Sequence[Any], extra: Sequence[Any] = (), columns: int = 3) -> None:
    """One legend under the panels for every method the `axes` draw (one colour per method in all
    panels), then `extra`: what each line style and marker means."""
    found: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    handles = [*found.values(), *extra]
    if handles:
        fig.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(columns, len(handles)),
            fontsize=8,
        )


def _style_entries(series: Sequence[Any]) -> list[Any]:
    """Legend entries, in gray, for the line styles and markers `_draw_series` draws for `series`:
    only those present."""
    gray = dict(color="dimgray")
    entries = []
    if any(s.linestyle != "-" and any(v is not None for _, v, _ in s.points) for s in series):
        entries.append(
            Line2D([], [], linestyle="-.", marker="s", fillstyle="none", label="eager, measured", **gray)
        )
    if any(s.predicted for s in series):
        entries.append(Line2D([], [], linestyle="--", linewidth=0.9, label="predicted", **gray))
    if any(abs(h - lo) > 1e-9 for s in series for _, lo, h in s.predicted):
        entries.append(
            Line2D(
                [],
                [],
                linestyle=":",
                linewidth=0.9,
                label="predicted, the update hidden where it fits",
                **gray,
            )
        )
    statuses = sorted({str(status) for s in series for _, v, status in s.points if v is None})
    for status in statuses:
        marker = FAILURE_MARKERS.get(status, "^")
        text = f"{status} (at the top, in its method's colour)"
        entries.append(Line2D([], [], linestyle="none", marker=marker, label=text, **gray))
    return entries


def _tokens_axis(ax: Any, ticks: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(sorted(set(ticks)), [str(t) for t in sorted(set(ticks))])
    ax.set_xlabel("tokens per step")


def _draw_series(ax: Any, series: Sequence[Any], colors: dict[str, str], top: float) -> None:
    """Measured points joined by a line, the prediction as a dashed line (with a dotted lower
    bound and a band between where the two differ), and the points without a figure as a marker
    at `top` in their method's colour, its shape the status's (`_style_entries` names them); several
    at one token count are stacked downwards, one marker each."""
    failed: dict[int, int] = {}  # token count -> markers drawn there
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
                below = offset_copy(ax.transData, fig=ax.figure, y=-7 * failed.get(t, 0), units="points")
                failed[t] = failed.get(t, 0) + 1
                marker = FAILURE_MARKERS.get(str(status), "^")
                ax.scatter([t], [top], marker=marker, color=color, zorder=3, clip_on=False, transform=below)
        if s.predicted:
            xs, lows, highs = zip(*s.predicted)
            ax.plot(xs, highs, linestyle="--", linewidth=0.9, color=color)
            if any(abs(h - lo) > 1e-9 for lo, h in zip(lows, highs)):
                ax.plot(xs, lows, linestyle=":", linewidth=0.9, color=color)
                ax.fill_between(xs, lows, highs, color=color, alpha=0.08)


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

        parts = times.get(key)
        gemm, updates = (parts.gemm, parts.updates) if parts is not None else ([], {})
        if gemm:
            right.plot(
                [t for t, _ in gemm], [ms for _, ms in gemm], color="black", marker=".", label="dW GEMMs"
            )
        for label, ms in updates.items():
            color = colors.get(label.split(" ")[0], "gray")
            right.axhline(ms, color=color, linestyle="--", linewidth=0.9, label=label)
        _tokens_axis(right, [t for t, _ in gemm])
        right.set_ylim(bottom=0)
        right.set_ylabel(f"ms a step ({parts.rates})" if parts is not None else "ms a step")
        right.set_title("Predicted parts: FORGE's update can hide where it lies below the GEMMs", fontsize=9)
        _legend(right)
    fig.tight_layout()
    lines = [s for key in groups for s in series[key]]
    _figure_legend(fig, [axes[row][0] for row in range(len(groups))], _style_entries(lines))
    return save(fig, path)


@styled
def overhead_vs_size(series: dict[tuple, list[Any]], path: Path) -> Path:
    """Per (tokens per step, GPU): each graphed method's step over the graphed floor against the
    model's parameters, measured (solid) and predicted (dashed where none of the update hides,
    dotted where all that fits under the dW GEMM does)."""
    groups = list(series)
    cols = min(2, len(groups))
    rows = (len(groups) + cols - 1) // cols
    fig, axes = _figure(7.5 * cols, 4.2 * rows, rows, cols)
    colors = _colors([s.label for key in groups for s in series[key]])
    for index in range(len(groups), rows * cols):
        axes[index // cols][index % cols].set_visible(False)
    for index, key in enumerate(groups):
        ax = axes[index // cols][index % cols]
        _draw_over_floor(ax, series[key], colors)
        ax.set_xscale("log")
        sizes = sorted({n for s in series[key] for n, _, _ in s.points})
        ax.set_xticks(sizes, [f"{n / 1e9:.1f}" for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("parameters, billions")
        ax.set_title(f"{key[0]:,} tokens a step, {key[1]}", fontsize=9)
    fig.tight_layout()
    lines = [s for key in groups for s in series[key]]
    _figure_legend(fig, [axes[i // cols][i % cols] for i in range(len(groups))], _style_entries(lines))
    return save(fig, path)


@styled
def peak_vs_tokens(
    series: dict[tuple, dict[bool, list[Any]]], capacity: dict[tuple, float | None], path: Path
) -> Path:
    """Per (model, GPU), without and with activation checkpointing: each method's peak against
    tokens per step, measured (solid; a failure as a marker at the card's memory, named in the
    legend) and predicted (dashed), with the card's memory as a line. Panels in the series' order
    (model size); one legend under them all."""
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
    fig.tight_layout()
    lines = [s for key in groups for ac in (False, True) for s in series[key].get(ac, [])]
    _figure_legend(fig, [ax for row in axes for ax in row], _style_entries(lines))
    return save(fig, path)
