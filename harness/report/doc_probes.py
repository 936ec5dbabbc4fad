"""The tables of docs/performance.md that come from the kernel lab's probes and step profiles.

These records are no sweep points: they sit under results/device-logs/ (which the report does not
read as records), one file per probe run, named `<what>-<date>-<commit>`. Each function here takes
the repository root and returns the Markdown of one generated block (`doc_blocks`).

- `kernel_overlap`: `python -m harness.kernels.overlap` timed the shipped warp-specialized kernel
  against its roofline, beside the same kernel with one half removed (only the MMA warps' work,
  only the update's), with loaders that read fewer operands (dy on every other fill; nothing after
  the first lap over T), and the multiprocessor-specialized kernel at several splits. bf16 states,
  AdamW, median ms; the same under Triton 3.9 for gate.
- `kernel_pingpong`: the same probe's timings of the ping-pong kernel
  (`forge.kernels.wgrad_update_pingpong`) beside cuBLAS and the shipped kernel, from the newest
  overlap run that timed it, or what to run where none has, with its times a tile
  (`pingpong_tile_times`: one consumer's update solved from them, the formula beside the table).
- `kernel_fed`: the same probe's timings of the ping-pong kernel fed by bulk copies
  (`forge.kernels.wgrad_update_pingpong_fed`), with its halves apart, from the newest overlap run
  that timed it, or what to run where none has.
- `newton_schulz`: `python -m harness.kernels.newton_schulz`'s newest run: each Newton-Schulz
  variant's time and distances per hidden matrix shape, and the pick `forge.newton_schulz.AUTO`
  holds (docs/training-recipes.md).
- `kernel_counters`: Nsight Compute's counters of the shipped and the split kernel (gate, T = 1024).
- `step_profiles`: `python -m harness.kernels.profile` over graphed steps (its JSON per point),
  summarised as `python -m harness.kernels.compare_profiles` prints them.
- `host_launches`: `python -m harness.kernels.launch_breakdown`'s newest GPU run: a ForgeLinear's
  host time against nn.Linear's, alone and inside a stack, on either autograd thread, and a step's
  norm weights one launch each against one launch of the vector kernel, or what to run where none
  has.

A table cites its records' GPU, versions, commit and date (`_source`): records that do not say what
measured them are refused, and a run on a tree with uncommitted changes is cited as such.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import results
from harness.kernels.compare_profiles import kernel_differences, summary
from harness.report.markup import Table, to_markdown
from harness.sources import (
    DEVICE_LOGS,
    LAUNCH_BREAKDOWNS,
    NCU,
    OVERLAP,
    OVERLAP_RUNS,
    OVERLAP_T39,
    PROFILES_B1,
)


def _table(header: Sequence[str], rows: list[list[str]], align: str) -> str:
    return to_markdown(Table("doc", "", list(header), rows, align=align)).rstrip()


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _best_split(r: dict) -> tuple[int, float]:
    """(update programs, ms) of the fastest multiprocessor split the run timed at a point."""
    splits = [
        (int(k[len("split_u") : -len("_ms")]), v)
        for k, v in r.items()
        if k.startswith("split_u") and k.endswith("_ms")
    ]
    return min(splits, key=lambda s: s[1])


ENV_NAMES = ("gpu_name", "torch", "triton", "git_commit")  # what a table says of the run behind it


def _source(path: str, records: list[dict]) -> str:
    """`path` and what measured it, as a table's data line: its GPU, versions, commit and date. A
    table cites only records that say what measured them, all of one commit: a record without its
    `env` is refused, and records measured on a tree with uncommitted changes are cited as such
    ("uncommitted changes on 522087f"), never as the commit they started from."""
    lacking = [r for r in records if not all((r.get("env") or {}).get(name) for name in ENV_NAMES)]
    if lacking or not records:
        raise ValueError(
            f"{path}: {len(lacking)} of {len(records)} records do not say what measured them (their env: "
            f"{', '.join(ENV_NAMES)}); a table cannot cite them. Give them the env of their run where "
            "another record of it holds one, or measure again"
        )
    commits = sorted({r["env"]["git_commit"][:7] for r in records})
    if len(commits) > 1:
        raise ValueError(f"{path}: records of {len(commits)} commits ({', '.join(commits)}): cite one run")
    env = records[0]["env"]
    dirty = any(r["env"].get("git_dirty") for r in records)
    at = f"uncommitted changes on {commits[0]}" if dirty else f"commit {commits[0]}"
    versions = f"torch {env['torch']}, triton {env['triton']}"
    return f"`{path}` ({env['gpu_name']}, {versions}, {at}, {records[0]['time'][:10]})"


def kernel_overlap(root: Path) -> str:
    """The shipped kernel against its roofline, its halves apart, what operand reads cost, and the
    multiprocessor-specialized kernel at its best split (`python -m harness.kernels.overlap`)."""
    records = results.read(root / OVERLAP)
    rows = []
    for r in records:
        roof = r["roofline_ms"]
        larger = max(r["ws_mma_only_ms"], r["ws_epilogue_only_ms"])
        programs, split_ms = _best_split(r)
        rows.append(
            [
                f"{r['shape_name']} {r['N']}x{r['K']}, T = {r['T']}",
                _ms(roof),
                _x(r["shipped_ms"] / roof),
                _x(r["ws_mma_only_ms"] / roof),
                _x(r["ws_epilogue_only_ms"] / roof),
                _x(r["ws_ms"] / larger),
                _x(r["ws_half_dy_ms"] / r["ws_ms"]),
                _x(r["ws_first_lap_ms"] / r["ws_ms"]),
                f"{_x(split_ms / r['shipped_ms'])} ({programs})",
            ]
        )
    header = ["point", "roofline ms", "shipped / roofline", "MMA half / roofline", "update half / roofline"]
    header += ["together / larger half", "half the dy reads", "no operand reads", "split kernel, best (U)"]
    table = _table(header, rows, "l" + "r" * 8)
    t39 = {(r["shape_name"], r["T"]): r for r in results.read(root / OVERLAP_T39)}
    t36 = {(r["shape_name"], r["T"]): r for r in records}
    versions = "; ".join(
        f"{shape} T = {t}: {_ms(t36[(shape, t)]['shipped_ms'])} ms under triton 3.6,"
        f" {_ms(r['shipped_ms'])} under 3.9"
        for (shape, t), r in sorted(t39.items(), key=lambda item: item[0][1])
    )
    return "\n\n".join(
        [
            table,
            "Roofline: the larger of cuBLAS's dW GEMM and the update's bytes (W, m, v read and written) at"
            " the run's copy rate. MMA half: the loader and MMA warps with the update warps handing each"
            " tile back unread; update half: the update warps on a synthetic gradient, no operand reads."
            " Half the dy reads and no operand reads: the shipped kernel with its loader refilling dy on"
            " every other fill (the traffic a 2-CTA cluster multicasting dy would leave) or nothing after"
            " the first lap, over the shipped kernel's time. Split kernel: `forge.kernels.wgrad_update_split`"
            " with U of the 132 programs updating and the rest running the GEMM, at the U that was fastest"
            " of 8, 16, 32 and 66, over the shipped time; every split equal to the warp-specialized kernel's"
            f" step to the bit. Data: {_source(OVERLAP, records)}, from `python -m harness.kernels.overlap`;"
            f" the same kernels under Triton 3.9 in {_source(OVERLAP_T39, list(t39.values()))}: {versions}.",
        ]
    )


def newest_run(root: Path, prefix: str, without: str = "") -> tuple[str, list[dict]] | None:
    """(path, records) of the newest overlap run (by its records' time) that timed the candidates
    whose probe names start with `prefix` (and none starting with `without`, if given), or None."""
    runs = []
    for path in sorted(root.glob(OVERLAP_RUNS)):
        records = results.read(path)
        keys = records[0] if records else {}
        excluded = bool(without) and any(k.startswith(without) for k in keys)
        if any(k.startswith(prefix) for k in keys) and not excluded:
            runs.append((records[0]["time"], path.relative_to(root).as_posix(), records))
    return max(runs)[1:] if runs else None


PINGPONG = "pingpong_"
FED = "fed_"
FED_PARTS = ("_mma_only", "_update_only")


def kernel_pingpong(root: Path) -> str:
    """The ping-pong kernel (`forge.kernels.wgrad_update_pingpong`) at its faster ring depth per
    point, against cuBLAS's GEMM, the shipped kernel and the roofline, beside the shipped kernel's
    halves timed in the same run, and whether its step equals the shipped kernel's to the bit."""
    found = newest_run(root, PINGPONG, without=FED)  # the fed kernel's runs time it beside that one
    if found is None:
        return (
            "Not measured yet. `python -m harness.kernels.overlap --designs pingpong --update-programs"
            " --probe-modes ws_mma_only ws_epilogue_only` on an H100 or H200 times it beside the shipped"
            " kernel and cuBLAS's GEMM and checks its step against the shipped kernel's to the bit;"
            " `python -m harness report` then writes its records here."
        )
    path, records = found
    source = _source(path, records)  # first: records that do not say what measured them are refused
    tiles = {(t["shape_name"], t["T"]): t for t in pingpong_tile_times(records)}
    rows = []
    for r in records:
        names = _pingpong_names(r)
        timed = [(r[f"{n}_ms"], n) for n in names if r.get(f"{n}_ms")]
        differing = sum(d["w"] + sum(d["states"]) for d in (r[f"{n}_differs"] for n in names))
        point = f"{r['shape_name']} {r['N']}x{r['K']}, T = {r['T']}"
        roof = r["roofline_ms"]
        halves = [
            _x(r[f"{half}_ms"] / roof) if r.get(f"{half}_ms") else "-"
            for half in ("ws_mma_only", "ws_epilogue_only")
        ]
        # the warp-specialized kernel: timed as such once the shipped launch took the ping-pong one
        ws_ms = r.get("warp_specialized_ms") or r["shipped_ms"]
        head = [point, _ms(roof), _ms(r["cublas_gemm_ms"]), _ms(ws_ms)]
        if not timed:
            rows.append([*head, "failed", "-", "-", *halves, "-", str(differing)])
            continue
        ms, best = min(timed)
        rows.append(
            [
                *head,
                f"{_ms(ms)} ({best[len(PINGPONG) :]})",
                _x(ms / ws_ms),
                _x(ms / roof),
                *halves,
                _tile_cell(tiles[(r["shape_name"], r["T"])]),
                str(differing),
            ]
        )
    header = [
        "point",
        "roofline ms",
        "cuBLAS GEMM ms",
        "warp-specialized ms",
        "ping-pong, best ms (candidate)",
    ]
    header += [
        "over warp-specialized",
        "over roofline",
        "its MMA half / roofline",
        "its update half / roofline",
    ]
    header += ["us a tile: main loop / one consumer's update / 8 update warps", "elements that differ"]
    return "\n\n".join(
        [
            _table(header, rows, "l" + "r" * 10),
            "Ping-pong: two MMA warpgroups taking turns at the tensor cores, each updating its tile from"
            " its own registers; candidates s<S>[_c64]: S stages of dy and x, pieces of 32 (64) columns"
            " (`harness.kernels.overlap.pingpong_configs`); AdamW with bf16 states, median ms. The"
            " warp-specialized kernel (`WARP_SPECIALIZED_DEFAULTS`; the shipped launch where the run"
            " timed no other) and its halves as in the table above, from the same run; elements that"
            " differ: W and both states after one step of every candidate against the warp-specialized"
            " kernel's (0: equal to the bit). Times a tile: each of the card's"
            f" {'/'.join(str(n) for n in sorted({MULTIPROCESSORS[r['env']['gpu_name']] for r in records}))}"
            " multiprocessors runs N K / (128 x 128) / multiprocessors tiles; main loop and 8 update warps:"
            " the warp-specialized kernel's MMA and update halves over them; two consumers take turns, so a"
            " ping-pong tile costs max(main loop, (main loop + update) / 2), and where it outlasts the main"
            f" loop by more than {MAIN_LOOP_PACE:g}x one consumer's update is 2 x (ping-pong time a tile) -"
            " main loop (else hidden: the kernel runs at its main loop's pace)."
            f" Data: {source}, from `python -m harness.kernels.overlap`.",
        ]
    )


def _x_span(values: list[float]) -> str:
    """'a-bx' (or 'ax' where all round alike) over every value given."""
    low, high = _x(min(values)), _x(max(values))
    return low if low == high else f"{low[:-1]}-{high}"


def kernel_fed(root: Path) -> str:
    """The ping-pong kernel with its update fed by bulk copies (`forge.kernels.wgrad_update_pingpong_fed`)
    from the newest overlap run that timed it, by token count: over every shape the run timed at that
    T, the range of its fastest candidate's time over the warp-specialized kernel, the ping-pong
    kernel and the roofline, of its halves' and the warp-specialized kernel's halves' over the
    roofline, and the elements of every candidate's step that differ from the warp-specialized
    kernel's; or what to run where no run has."""
    found = newest_run(root, FED)
    if found is None:
        return (
            "Not measured yet. `python -m harness.kernels.overlap --build-first --designs pingpong fed"
            " --probe-modes ws_mma_only ws_epilogue_only` on an H100 or H200 times it beside the"
            " warp-specialized and ping-pong kernels and cuBLAS's GEMM, with its halves apart, and checks"
            " its step against the warp-specialized kernel's to the bit; `python -m harness report` then"
            " writes its records here."
        )
    path, records = found
    by_t: dict[int, list[dict]] = {}
    for r in records:
        names = [k[: -len("_differs")] for k in r if k.startswith(FED) and k.endswith("_differs")]
        timed = [(r[f"{n}_ms"], n) for n in names if r.get(f"{n}_ms")]
        if not timed:
            continue
        ms, best = min(timed)
        roof = r["roofline_ms"]
        pingpong = min(r[k] for k in r if k.startswith(PINGPONG) and k.endswith("_ms") and r[k])
        by_t.setdefault(r["T"], []).append(
            dict(
                ws=ms / (r.get("warp_specialized_ms") or r["shipped_ms"]),
                pingpong=ms / pingpong,
                roof=ms / roof,
                mma=r[f"{best}_mma_only_ms"] / roof,
                update=r[f"{best}_update_only_ms"] / roof,
                ws_mma=r["ws_mma_only_ms"] / roof,
                ws_update=r["ws_epilogue_only_ms"] / roof,
                differ=sum(r[f"{n}_differs"]["w"] + sum(r[f"{n}_differs"]["states"]) for n in names),
                best=best[len(FED) :],
            )
        )
    columns = ("ws", "pingpong", "roof", "mma", "update", "ws_mma", "ws_update")
    rows = [
        [f"{T:,}", ", ".join(sorted({p["best"] for p in points}))]
        + [_x_span([p[c] for p in points]) for c in columns]
        + [str(sum(p["differ"] for p in points))]
        for T, points in sorted(by_t.items())
    ]
    header = [
        "T",
        "fastest candidate",
        "over warp-specialized",
        "over ping-pong",
        "over roofline",
        "its MMA half / roofline",
        "its update half / roofline",
        "warp-specialized MMA half / roofline",
        "warp-specialized update half / roofline",
        "elements that differ",
    ]
    return "\n\n".join(
        [
            _table(header, rows, "rl" + "r" * 8),
            "Fed: candidates s<S>_u<U>_c<C>: S stages of dy and x, U slots a consumer's piece ring, pieces of"
            " C columns (`harness.kernels.overlap.fed_configs`); AdamW with bf16 states, median ms; each"
            " cell the range over gate, q and down. Its halves, of the fastest candidate: its consumers'"
            " main loops in turn with no update, and their update of a synthetic gradient from the piece"
            " rings with no operand reads; the warp-specialized kernel (`WARP_SPECIALIZED_DEFAULTS`), its"
            " halves and the ping-pong kernel's faster candidate from the same run; elements that differ:"
            " W and both states after one step of every candidate against the warp-specialized kernel's"
            " (0: equal to the bit). Data:"
            f" {_source(path, records)}, from `python -m harness.kernels.overlap`.",
        ]
    )

def _tile_cell(t: dict) -> str:
    update = "hidden" if t["update_us"] is None else f"{t['update_us']:.1f}"
    return f"{t['main_us']:.1f} / {update} / {t['warps_us']:.1f}"


def _pingpong_names(record: dict) -> list[str]:
    """The ping-pong candidates a record of the overlap probe timed (`pingpong_s6`, ...)."""
    return sorted(
        {k[: -len("_differs")] for k in record if k.startswith(PINGPONG) and k.endswith("_differs")}
    )


# What turns the kernel's times into times a tile: its tiles and the multiprocessors that share them
PINGPONG_TILE = (128, 128)  # the ping-pong kernel's tile (`harness.kernels.overlap.pingpong_configs`)
MULTIPROCESSORS = {"NVIDIA H100 80GB HBM3": 132, "NVIDIA H200": 132}  # the cards' specifications
# A ping-pong tile within this factor of the main loop's runs at the main loop's pace: the update is
# hidden there and the formula solves for nothing (the measured points at T = 16384 lie within 3%)
MAIN_LOOP_PACE = 1.05


def pingpong_tile_times(records: Sequence[dict]) -> list[dict]:
    """Per point of an overlap run that timed the ping-pong kernel, its times a tile, in us: each
    multiprocessor's program runs `tiles` = N K / (128 x 128) / multiprocessors tiles; the main loop
    a tile is the MMA half's time over them, the 8 update warps' update a tile the update half's; the
    ping-pong kernel (its fastest candidate) takes max(main loop, (main loop + update) / 2) a tile
    (two consumers in turn), so where its tile outlasts the main loop (by more than `MAIN_LOOP_PACE`)
    one consumer's update of a tile is 2 x its time a tile - the main loop's (else None: hidden)."""
    found = []
    for r in records:
        timed = [r[f"{n}_ms"] for n in _pingpong_names(r) if r.get(f"{n}_ms")]
        if not timed:
            continue
        sms = MULTIPROCESSORS[r["env"]["gpu_name"]]
        tiles = r["N"] * r["K"] / (PINGPONG_TILE[0] * PINGPONG_TILE[1]) / sms
        main, tile = 1e3 * r["ws_mma_only_ms"] / tiles, 1e3 * min(timed) / tiles
        update = 2 * tile - main if tile > MAIN_LOOP_PACE * main else None
        found.append(
            {
                "shape_name": r["shape_name"], "N": r["N"], "K": r["K"], "T": r["T"], "tiles": tiles,
                "main_us": main, "pingpong_us": tile, "update_us": update,
                "warps_us": 1e3 * r["ws_epilogue_only_ms"] / tiles,
            }
        )  # fmt: skip
    return found


def newest_newton_schulz_run(root: Path) -> tuple[str, list[dict]] | None:
    """(path, records) of the newest `python -m harness.kernels.newton_schulz` run under
    results/device-logs/ (by its records' time), or None."""
    from harness.kernels.newton_schulz import FILE_PREFIX

    runs = []
    for path in sorted(root.glob(f"{DEVICE_LOGS}{FILE_PREFIX}*.jsonl")):
        records = results.read(path)
        if records and records[0].get("gpu_count"):  # not a --tiny dry run on the CPU
            runs.append((records[0]["time"], path.relative_to(root).as_posix(), records))
    return max(runs)[1:] if runs else None


def newton_schulz(root: Path) -> str:
    """Per hidden matrix shape: each variant's median ms and its distance from the fp64 polar factor
    (torch's beside it), the fastest safe variant and its time over torch's."""
    from forge.newton_schulz import VARIANTS
    from harness.kernels.newton_schulz import picks

    found = newest_newton_schulz_run(root)
    if found is None:
        return (
            "Not measured yet. `python -m harness.kernels.newton_schulz` on an H100 or H200 times each"
            " variant on every hidden matrix shape of Llama-3.1-8B and Qwen3-14B; with its records under"
            " results/device-logs/, `python -m harness.kernels.newton_schulz --auto FILE` fills"
            " `forge.newton_schulz.AUTO` and `python -m harness report` writes them here."
        )
    path, records = found
    chosen = picks(records)
    by_shape: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if r.get("status") == "ok":
            by_shape.setdefault((r["model"], r["shape_name"], r["N"], r["K"]), {})[r["variant"]] = r
    rows = []
    for (model, name, n, k), variants in by_shape.items():
        pick = chosen.get((min(n, k), max(n, k)), "torch")
        cells = [
            f"{_ms(variants[v]['time_ms'])} ({variants[v]['polar_relative_error']:.3f})"
            if v in variants
            else "-"
            for v in VARIANTS
        ]
        base = variants.get("torch", {}).get("time_ms")
        ratio = _x(variants[pick]["time_ms"] / base) if base and pick in variants else "-"
        rows.append([f"{model} {name} {n}x{k}", *cells, pick, ratio])
    header = ["matrix", *(f"{v} ms (polar)" for v in VARIANTS), "auto picks", "over torch"]
    return "\n\n".join(
        [
            _table(header, rows, "l" + "r" * len(VARIANTS) + "lr"),
            "Median ms of one orthogonalization (5 iterations, bf16 update, `triton.testing.do_bench`),"
            " in brackets the output's distance from the fp64 polar factor U V^T (|O - U V^T|_F / |U V^T|_F)."
            " Auto picks the fastest variant that computes torch's polynomial within twice torch's own"
            " rounding of it (Polar Express computes another one and is never picked)."
            f" Data: {_source(path, records)}, from `python -m harness.kernels.newton_schulz`.",
        ]
    )


def _ncu(root: Path) -> dict[tuple[str, str], dict[str, str]]:
    """{(kernel launch id, kernel name): {metric: value}} of an `ncu --csv --page details` file."""
    import csv

    lines = (root / NCU).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    found: dict[tuple[str, str], dict[str, str]] = {}
    for row in csv.DictReader(lines[start:]):
        found.setdefault((row["ID"], row["Kernel Name"]), {})[row["Metric Name"]] = row["Metric Value"]
    return found


def kernel_counters(root: Path) -> str:
    """Nsight Compute's counters of the shipped kernel and the split kernel, gate at T = 1024."""
    metrics = [
        ("Duration", "duration us", lambda v: f"{float(v.replace(',', '')) / 1000:.0f}"),
        ("SM Frequency", "SM MHz", lambda v: f"{float(v.replace(',', '')) / 1e6:.0f}"),
        ("Issue Slots Busy", "issue slots busy", lambda v: f"{float(v):.0f}%"),
        ("Eligible Warps Per Scheduler", "eligible warps a scheduler", lambda v: v),
        ("Active Warps Per Scheduler", "active warps a scheduler", lambda v: v),
        ("DRAM Throughput", "DRAM throughput", lambda v: f"{float(v):.0f}%"),
        ("L2 Cache Throughput", "L2 throughput", lambda v: f"{float(v):.0f}%"),
        ("dram__bytes_read.sum", "DRAM read MB", lambda v: f"{int(v.replace(',', '')) / 1e6:.0f}"),
        ("dram__bytes_write.sum", "DRAM written MB", lambda v: f"{int(v.replace(',', '')) / 1e6:.0f}"),
    ]
    kernels = _ncu(root)
    chosen = {}
    for (_, name), values in kernels.items():  # the last launch of each kernel (after a warm-up one)
        chosen[name] = values
    names = {
        "wgrad_update_ws_kernel": "warp-specialized (shipped)",
        "wgrad_update_split_kernel": "split, U = 48",
    }
    rows = [
        [label] + [fmt(chosen[name][metric]) for metric, _, fmt in metrics] for name, label in names.items()
    ]
    table = _table(["gate, T = 1024"] + [title for _, title, _ in metrics], rows, "l" + "r" * len(metrics))
    return "\n\n".join(
        [
            table,
            f"Data: `{NCU}`, from `ncu --clock-control none --section SpeedOfLight --section"
            " ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section"
            " WarpStateStats --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --page details"
            " python -m harness.kernels.overlap --launch-once --shapes gate --tokens 1024"
            " --update-programs 48`"
            " (one H200, triton 3.6).",
        ]
    )


def _profile_rows(paths: Sequence[tuple[str, Path]]) -> list[list[str]]:
    rows = []
    for label, path in paths:
        profile = json.loads(path.read_text())
        s = summary(profile)
        fused = profile.get("fused_busy_ms")
        rows.append(
            [
                label,
                f"{statistics.median(profile['step_ms']):.1f}",
                f"{s['gpu_busy_ms']:.1f}",
                f"{100 * s['idle_frac']:.1f}%",
                "—" if not fused else f"{fused:.1f}",
                f"{s['sm_clock_mhz']:.0f}",
                f"{s['power_w']:.0f}",
            ]
        )
    return rows


def step_profiles(pattern: str, methods: Sequence[str], title: str) -> Callable[[Path], str]:
    """A block builder: the graphed-step profiles of `methods` (files `pattern` with the method),
    and the kernels whose time differs most between the floor's step and FORGE bf16's."""

    def build(root: Path) -> str:
        paths = [(m, root / pattern.format(m)) for m in methods]
        header = ["graphed step", "median step ms", "GPU busy ms", "GPU idle", "fused kernels ms"]
        header += ["SM MHz (median)", "W (median)"]
        table = _table(header, _profile_rows(paths), "l" + "r" * 6)
        floor = json.loads((root / pattern.format("no_optimizer_graph")).read_text())
        forge = json.loads((root / pattern.format("forge_bf16_graph")).read_text())
        diffs = kernel_differences(floor, forge)[:4]
        parts = [
            f"`{d['name'][:48]}` {d['difference_ms']:+.1f} ms"
            for d in diffs
            if abs(d["difference_ms"]) >= 0.5
        ]
        files = pattern.format("{" + ",".join(methods) + "}")
        return "\n\n".join(
            [
                table,
                f"{title} The kernels whose time a step differs most, FORGE bf16 against no optimizer: "
                + "; ".join(parts)
                + f". Data: `{files}`; from `python -m harness.kernels.profile method=<method>"
                " model=llama3.1-8b"
                " batch_size=<b>`, compared with `python -m harness.kernels.compare_profiles`.",
            ]
        )

    return build


def _newest_breakdown(root: Path) -> tuple[str, dict] | None:
    """(path, record) of the newest GPU run of `launch_breakdown` (by its time) that times the host
    paths side by side (its record has `host_pairs`), or None."""
    found = []
    for path in sorted(root.glob(LAUNCH_BREAKDOWNS)):
        record = json.loads(path.read_text())
        if "host_pairs" in record and not record.get("host_only"):
            found.append((record["time"], path.relative_to(root).as_posix(), record))
    return max(found)[1:] if found else None


def host_launches(root: Path) -> str:
    """One ForgeLinear's forward and backward against nn.Linear's in host time, alone and inside a
    stack, on the autograd engine's device thread and on the calling one, and a step's norm weights
    one launch each against one launch of the vector kernel (`python -m harness.kernels.launch_breakdown`)."""
    found = _newest_breakdown(root)
    if found is None:
        return (
            "Not measured yet. `python -m harness.kernels.launch_breakdown --shape 1024 2048 1024` on the GPU"
            " machine writes its record (`launch-breakdown-<shape>-<date>-<commit>.json`); kept under"
            " results/device-logs/, `python -m harness report` writes it here. On any machine,"
            " `--host-only` times the host's Python alone, the kernels' launches taken out."
        )
    path, record = found
    rows_of, norms = record["rows"], record["norms"]
    rows = []
    for what, (forge_us, plain_us) in record["host_pairs"].items():  # one layer and a layer of the stack
        thread = "this thread" if what.endswith("this thread") else "the device thread"
        label = what.removesuffix(", this thread") + f", backward on {thread}"
        rows.append([label, f"{forge_us:.1f}", f"{plain_us:.1f}", _x(forge_us / plain_us)])
    each = rows_of[f"elementwise_update, {norms} norms"]["host_us"]
    once = rows_of[f"vector_update, {norms} norms"]["host_us"]
    rows.append(
        [
            f"{norms} norm weights: one launch ({norms} launches)",
            f"{once:.1f}",
            f"{each:.1f}",
            _x(once / each),
        ]
    )
    env, shape = record["env"], record["shape"]
    header = ["host time of", "FORGE us", "torch / one each us", "ratio"]
    return "\n\n".join(
        [
            _table(header, rows, "lrrr"),
            f"T = {shape['T']}, N = {shape['N']}, K = {shape['K']}, bf16, the least of {record['repeats']}"
            f" loops of {record['calls']} calls. Data: `{path}` ({record['device']}; host CPU"
            f" {env.get('cpu_model')}, {env.get('cpu_count')} cores; torch {env['torch']}, commit"
            f" {str(env.get('git_commit'))[:7]}, {record['time'][:10]}), from `python -m"
            f" harness.kernels.launch_breakdown --shape {shape['T']} {shape['N']} {shape['K']}`.",
        ]
    )


BLOCKS: dict[str, Callable[[Path], str]] = {
    "host-launches": host_launches,
    "kernel-overlap": kernel_overlap,
    "kernel-pingpong": kernel_pingpong,
    "kernel-fed": kernel_fed,
    "kernel-counters": kernel_counters,
    "newton-schulz": newton_schulz,
    "profiles-b1": step_profiles(
        PROFILES_B1,
        ("fused_adamw_graph", "forge_bf16_graph", "no_optimizer_graph"),
        "Batch 1, seq 1024 (1,024 tokens), 5 replays each.",
    ),
}
