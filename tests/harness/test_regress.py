"""`python -m harness regress BASELINE CURRENT --noise REPEAT` on measured runs.

The runs come from `RUNS`, the one place that names them: the committed H200 baselines of both
suites and their repeat runs where they exist (results/baselines/), else stand-ins built from
committed measurements: for the sweep, three runs of identical code from the archive (graphed
Llama-3.1-8B steps, 15 per point); for the kernels, the committed kernel table's medians of the
suite's points with 15 per-repeat samples around each. Each test derives a CURRENT run from the
baseline: one FORGE point slower, every point slower, a point gone, noisier, bigger.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import regress
from harness.kernels import regress_suite
from harness.records import load_records
from harness.regress import Thresholds, compare
from harness.stats import relative_change
from tests.harness import HERE

REPO = HERE.parents[1]
BASELINES = REPO / "results" / "baselines"
ARCHIVED_SWEEP = REPO / "results" / "archive" / "llama8b_graphs_h200-20261129-d519482-{}.jsonl"
KERNEL_TABLE = REPO / "results" / "kernels" / "kernels-llama3.1-8b.jsonl"


@dataclass(frozen=True)
class Suite:
    """A suite's committed baseline and repeat run, and the FORGE point the tests slow down."""

    baseline: Path
    repeat: Path
    slowed: str  # the slowed point's name as the report's summary gives it
    is_slowed: object  # record -> bool


RUNS = {
    "sweep": Suite(
        BASELINES / "regress_h200.jsonl",
        BASELINES / "regress_h200-repeat.jsonl",
        "forge_bf16_graph on llama3.1-8b",
        lambda r: r.get("method_label") == "forge_bf16_graph",
    ),
    "kernels": Suite(
        BASELINES / "kernels_h200.jsonl",
        BASELINES / "kernels_h200-repeat.jsonl",
        "forge [adamw, bf16] on llama3.1-8b gate (T 4096)",
        lambda r: (
            (r.get("variant"), r.get("state_dtype"), r.get("shape_name"), r.get("T"))
            == ("forge", "bf16", "gate", 4096)
        ),
    ),
}


def _graphed(path: Path) -> list[dict]:
    return [r for r in load_records([path]) if (r.get("method_options") or {}).get("cuda_graph")]


def _kernel_run(seed: int) -> list[dict]:
    """The suite's 32 kernel records from the committed table's medians, 15 samples each (0.5%)."""
    rng = random.Random(seed)
    table = {
        (r["shape_name"], r["T"], r["variant"], r["state_dtype"]): r["time_ms"]
        for r in load_records([KERNEL_TABLE])
    }
    meta = dict(gpu_name="NVIDIA H200", time="2026-12-01T00:00:00")
    out = []
    for point in regress_suite.points():
        gemm = table[(point.shape_name, point.T, "cublas_gemm", None)]
        for v in regress_suite.VARIANTS:
            median = table[(point.shape_name, point.T, v.variant, v.state_dtype)]
            times = [round(median * (1 + rng.gauss(0, 0.005)), 6) for _ in range(15)]
            out.append(regress_suite.make_record(meta, point, v, times, gemm))
    return out


def runs(suite: str) -> tuple[list[dict], list[dict], list[dict] | None]:
    """(baseline, repeat, a third run of the same code or None) of a suite: fresh copies."""
    return copy.deepcopy(_runs(suite))


@functools.cache
def _runs(suite: str) -> tuple[list[dict], list[dict], list[dict] | None]:
    s = RUNS[suite]
    if s.baseline.exists() and s.repeat.exists():
        return load_records([s.baseline]), load_records([s.repeat]), None
    if suite == "sweep":
        return tuple(_graphed(Path(str(ARCHIVED_SWEEP).format(t))) for t in ("2327", "2330", "2336"))
    return _kernel_run(1), _kernel_run(2), _kernel_run(3)


def times_of(record: dict) -> str:
    return "step_times_ms" if record.get("step_times_ms") else "repeat_times_ms"


def scaled(record: dict, factor: float) -> dict:
    field = times_of(record)
    return dict(record, **{field: [round(t * factor, 6) for t in record[field]]})


def write(tmp_path: Path, name: str, records: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def check(tmp_path: Path, suite: str, current: list[dict], *flags: str) -> tuple[int, str]:
    """Exit status and report of CURRENT against the suite's baseline, its repeat as noise."""
    baseline, repeat, _ = runs(suite)
    base, rep = write(tmp_path, "base.jsonl", baseline), write(tmp_path, "repeat.jsonl", repeat)
    cur, out = write(tmp_path, "current.jsonl", current), tmp_path / "report.md"
    code = regress.main([str(base), str(cur), "--noise", str(rep), "--output", str(out), *flags])
    return code, out.read_text()


SUITES = pytest.mark.parametrize("suite", list(RUNS))


@SUITES
def test_an_identical_copy_passes(tmp_path, suite):
    baseline = runs(suite)[0]
    code, text = check(tmp_path, suite, baseline)
    assert code == 0, text
    assert f"No regression in {len(baseline)} matched points" in text


@SUITES
def test_one_forge_point_five_percent_slower_fails_and_is_named(tmp_path, suite):
    slowed = RUNS[suite].is_slowed
    current = [scaled(r, 1.05) if slowed(r) else r for r in runs(suite)[0]]
    code, text = check(tmp_path, suite, current)
    assert code == 1, text
    summary = next(line for line in text.splitlines() if line.startswith("**"))
    assert summary.startswith("**1 regression(s)") and RUNS[suite].slowed in summary
    row = next(line for line in text.splitlines() if line.startswith("| REGRESSION (time)"))
    assert "| +5.0% |" in row  # the effect, with its interval beside it


@SUITES
def test_four_percent_slower_is_under_the_threshold(tmp_path, suite):
    slowed = RUNS[suite].is_slowed
    code, text = check(tmp_path, suite, [scaled(r, 1.04) if slowed(r) else r for r in runs(suite)[0]])
    assert code == 0, text


@SUITES
def test_the_repeat_run_passes_and_so_does_a_third_run_of_the_same_code(tmp_path, suite):
    _, repeat, third = runs(suite)
    code, text = check(tmp_path, suite, repeat)
    assert code == 0, text
    if third is not None:
        code, text = check(tmp_path, suite, third)
        assert code == 0, text


@SUITES
def test_a_uniformly_slower_machine_passes(tmp_path, suite):
    current = [scaled(r, 1.10) for r in runs(suite)[0]]  # the references too
    code, text = check(tmp_path, suite, current)
    assert code == 0, text
    assert "| reference |" in text
    code, text = check(tmp_path, suite, current, "--absolute")  # raw times: everything is slower
    assert code == 1 and text.count("REGRESSION (time)") >= 3


@SUITES
def test_a_comparison_that_matches_no_point_fails_and_names_them(tmp_path, suite):
    baseline = runs(suite)[0]
    elsewhere = [dict(r, gpu_name="NVIDIA H100 80GB HBM3") for r in baseline]
    code, text = check(tmp_path, suite, elsewhere)
    assert code == 1
    summary = next(line for line in text.splitlines() if line.startswith("**"))
    assert summary.startswith(f"**No point of the baseline was matched: {len(baseline)} regression(s)")
    assert RUNS[suite].slowed in summary and "missing in current" in summary
    assert text.count("new (no baseline)") == len(baseline)


@SUITES
def test_a_missing_point_fails_and_is_named(tmp_path, suite):
    baseline = runs(suite)[0]
    code, text = check(tmp_path, suite, [r for r in baseline if not RUNS[suite].is_slowed(r)])
    assert code == 1
    summary = next(line for line in text.splitlines() if line.startswith("**"))
    assert f"1 regression(s) in {len(baseline) - 1} matched points" in summary
    assert RUNS[suite].slowed in summary and summary.endswith("REGRESSION (missing in current).**")


def test_a_deliberately_slowed_point_meets_its_twin_and_says_so(tmp_path):
    def delayed(r: dict) -> dict:
        return dict(scaled(r, 1.06), method_options={**r["method_options"], "debug_delay_us": 60})

    def off(r: dict) -> dict:  # what a record of today's FORGE says when the switch is off
        return dict(r, method_options={**r["method_options"], "debug_delay_us": 0.0})

    current = [delayed(r) if RUNS["sweep"].is_slowed(r) else off(r) for r in runs("sweep")[0]]
    code, text = check(tmp_path, "sweep", current)
    assert code == 1, text
    assert "| REGRESSION (time) | forge_bf16_graph [debug_delay_us=60] |" in text
    assert "| ok | forge_int8_graph |" in text


def test_a_slowdown_inside_the_spread_of_noisy_samples_is_within_noise(tmp_path):
    # A shared GPU: the point's steps scatter over +-10% around a median 6% up (their deviations
    # from the median stretched until the median one is 10% of it).
    current = []
    for r in runs("sweep")[0]:
        if RUNS["sweep"].is_slowed(r):
            median = statistics.median(r["step_times_ms"])
            spread = statistics.median(abs(t / median - 1) for t in r["step_times_ms"])
            stretch = 0.10 / spread
            wide = [1.06 * median * (1 + stretch * (t / median - 1)) for t in r["step_times_ms"]]
            r = dict(r, step_times_ms=wide)
        current.append(r)
    code, text = check(tmp_path, "sweep", current)
    assert code == 0, text
    assert "| within noise | forge_bf16_graph |" in text


def test_memory_growth_past_threshold_is_caught(tmp_path):
    current = [dict(r) for r in runs("sweep")[0]]
    for r in current:
        if r["method_label"] == "forge_int8_graph":
            r["peak_alloc_gib"] = round(r["peak_alloc_gib"] * 1.03, 3)
    code, text = check(tmp_path, "sweep", current)
    assert code == 1
    assert "REGRESSION (memory)" in text and "+3.0%" in text
    code, _ = check(tmp_path, "sweep", current, "--max-memory-growth", "5%")
    assert code == 0


def test_a_point_that_ran_and_now_fails_is_a_regression(tmp_path):
    current = [dict(r) for r in runs("sweep")[0]]
    for r in current:
        if r["method_label"] == "forge_int8_graph":
            r.update(status="oom", error="CUDA out of memory", step_times_ms=None, peak_alloc_gib=None)
    code, text = check(tmp_path, "sweep", current)
    assert code == 1
    assert "REGRESSION (now oom)" in text and "| OOM |" in text


def test_oom_on_both_sides_is_listed_not_failed():
    base = [dict(r) for r in runs("sweep")[0]]
    base[-1].update(status="oom", error="CUDA out of memory")
    both = [c for c in compare(base, [dict(r) for r in base], Thresholds()) if c.verdict == "oom -> oom"]
    assert len(both) == 1 and not both[0].regression


def test_the_report_is_the_same_every_time(tmp_path):
    current = [scaled(r, 1.02) for r in runs("kernels")[0]]
    assert check(tmp_path, "kernels", current) == check(tmp_path, "kernels", current)


def test_the_effect_is_the_change_of_the_ratio_of_medians():
    effect = relative_change([10, 11, 12], [22, 24, 26], [5, 5, 5], [10, 10, 10])
    assert effect.estimate == pytest.approx(0.0909, abs=1e-4)  # (24/10) / (11/5) - 1
    assert effect.low <= effect.estimate <= effect.high
    assert relative_change([1.0, 1.0], [1.05, 1.05]).estimate == pytest.approx(0.05)


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("5", 0.05), ("0.05", 0.05), ("2.5%", 0.025)])
def test_threshold_parsing(text, value):
    assert regress.fraction(text) == pytest.approx(value)


def test_unusable_input_exits_2(tmp_path):
    base = write(tmp_path, "base.jsonl", runs("sweep")[0])
    empty = write(tmp_path, "empty.jsonl", [])
    assert regress.main([str(base), str(empty)]) == 2
    assert regress.main([str(empty), str(base)]) == 2
    assert regress.main([str(base), str(tmp_path / "nope.jsonl")]) == 2


DEMOS = BASELINES / "demo"
# The committed GPU demonstrations: a real slowdown made on the H200 with a debug option, judged
# against the committed baseline. (file, suite, flagged at the default 5%)
DEMO_RUNS = {
    "sweep-delay60us": ("regress_h200-debug_delay_us60-20261201-fc319e1.jsonl", "sweep", False),  # +3.5-3.9%
    "sweep-delay80us": ("regress_h200-debug_delay_us80-20261201-890986c.jsonl", "sweep", True),  # +5.3-6.2%
    "kernels-slow6pct": ("kernels_h200-debug_slowdown6pct-20261201-fc319e1.jsonl", "kernels", True),
}


@pytest.mark.parametrize("demo", list(DEMO_RUNS))
def test_the_committed_gpu_demonstrations_are_judged_as_measured(tmp_path, demo):
    """Only the slowed FORGE points of a demonstration are flagged, and only where the slowdown
    reached the threshold; the unslowed points of the same run pass."""
    name, suite, flagged = DEMO_RUNS[demo]
    if not RUNS[suite].baseline.exists():
        pytest.fail(f"{RUNS[suite].baseline} is committed with the demonstration {name}")
    current = load_records([DEMOS / name])
    code, text = check(tmp_path, suite, current)
    assert code == (1 if flagged else 0), text
    verdicts = [line for line in text.splitlines() if line.startswith("| ") and "debug" in line]
    assert verdicts and all(line.startswith("| REGRESSION") == flagged for line in verdicts), text
    unslowed = [
        line
        for line in text.splitlines()
        if line.startswith("| ")
        and "debug" not in line
        and not line.startswith("| Verdict")
        and not line.startswith("|:")
    ]
    assert not any(line.startswith("| REGRESSION") for line in unslowed), text
