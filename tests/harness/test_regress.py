"""`python -m harness regress BASELINE CURRENT` on fixture results.

The baseline is tests/harness/fixtures/regress/baseline.jsonl (the regress_h200 sweep: five methods on
Llama-3.1-8B, 30 per-step samples each, 0.4% spread). Each test derives a CURRENT run from it:
one method slower, every point slower, noisier samples, more memory, a point gone or OOM.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness import regress
from harness.regress import Thresholds, compare
from tests.harness import HERE

BASELINE = HERE / "fixtures" / "regress" / "baseline.jsonl"


def baseline() -> list[dict]:
    return [json.loads(line) for line in BASELINE.read_text().splitlines()]


def _resample(record: dict, times: list[float]) -> dict:
    ordered = sorted(times)
    record.update(
        step_times_ms=times, step_time_ms_median=ordered[len(ordered) // 2], step_time_ms_min=ordered[0]
    )
    record.update(step_time_ms_p90=ordered[int(0.9 * (len(ordered) - 1))])
    return record


def slower(record: dict, factor: float) -> dict:
    return _resample(record, [round(t * factor, 3) for t in record["step_times_ms"]])


def run(tmp_path: Path, current: list[dict], *flags: str) -> tuple[int, str]:
    path = tmp_path / "current.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in current))
    out = tmp_path / "report.md"
    code = regress.main([str(BASELINE), str(path), "--output", str(out), *flags])
    return code, out.read_text()


def test_identical_runs_raise_no_alert(tmp_path):
    code, text = run(tmp_path, baseline())
    assert code == 0
    assert "No regression in 5 matched points" in text


def test_one_method_ten_percent_slower_is_caught_and_named(tmp_path):
    current = [slower(r, 1.10) if r["method_label"] == "forge_bf16" else r for r in baseline()]
    code, text = run(tmp_path, current)
    assert code == 1
    assert "1 regression(s) in 5 matched points: forge_bf16 on llama3.1-8b (batch 1, seq 1024)" in text
    first_row = text.split("## Matched points")[1].splitlines()[4]
    assert first_row.startswith("| REGRESSION (time) | forge_bf16 |")
    assert "+10.0%" in first_row


def test_uniformly_slower_machine_raises_no_alert_in_relative_mode(tmp_path):
    current = [slower(r, 1.10) for r in baseline()]
    code, text = run(tmp_path, current)
    assert code == 0, text
    assert "| reference | fused_adamw |" in text
    # The same runs compared in raw milliseconds: every method but the yardstick is slower.
    code, text = run(tmp_path, current, "--absolute")
    assert code == 1
    assert text.count("REGRESSION (time)") >= 4


def test_noise_within_the_measured_spread_raises_no_alert(tmp_path):
    # A shared GPU: every point's steps scatter by 6% (IQR about 8%) and the median lands 5.5% up.
    rng = random.Random(7)
    current = []
    for r in baseline():
        median = r["step_time_ms_median"] * (1.055 if r["method_label"] == "forge_int8" else 1.0)
        current.append(_resample(r, [round(median * (1 + rng.gauss(0, 0.06)), 3) for _ in range(30)]))
    code, text = run(tmp_path, current)
    assert code == 0, text
    assert "| within noise | forge_int8 |" in text  # +5.5% is past the threshold, not past the noise


def test_slower_median_with_unchanged_minimum_is_noise(tmp_path):
    def tail_heavy(r: dict) -> dict:
        times = sorted(r["step_times_ms"])
        return _resample(r, times[:3] + [round(t * 1.12, 3) for t in times[3:]])

    current = [tail_heavy(r) if r["method_label"] == "forge_bf16" else r for r in baseline()]
    code, text = run(tmp_path, current)
    assert code == 0, text


def test_memory_growth_past_threshold_is_caught(tmp_path):
    current = baseline()
    for r in current:
        if r["method_label"] == "forge_int8":
            r["peak_alloc_gib"] = round(r["peak_alloc_gib"] * 1.03, 3)
    code, text = run(tmp_path, current)
    assert code == 1
    assert "REGRESSION (memory)" in text and "+3.0%" in text
    # ... and within a looser threshold it passes.
    code, _ = run(tmp_path, current, "--max-memory-growth", "5%")
    assert code == 0


def test_missing_and_oom_points_are_reported(tmp_path):
    current = [r for r in baseline() if r["method_label"] != "adamw_in_backward"]
    for r in current:
        if r["method_label"] == "forge_int8":
            r.update(status="oom", error="CUDA out of memory", step_times_ms=None, peak_alloc_gib=None)
    extra = dict(current[0], batch_size=2, point="fused_adamw/llama3.1-8b/b2/s1024")
    code, text = run(tmp_path, current + [extra])
    assert code == 1  # forge_int8 ran in the baseline and OOMs now
    assert "REGRESSION (now oom)" in text
    assert "| OOM |" in text
    missing = text.split("## Missing points")[1]
    assert "adamw_in_backward" in missing and "missing in current" in missing
    assert "new (no baseline)" in missing


def test_oom_on_both_sides_is_listed_not_failed(tmp_path):
    base = baseline()
    base[3].update(status="oom", error="CUDA out of memory")
    comparisons = compare(base, [dict(r) for r in base], Thresholds())
    both = [c for c in comparisons if c.verdict == "oom -> oom"]
    assert len(both) == 1 and not both[0].regression


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("5", 0.05), ("0.05", 0.05), ("2.5%", 0.025)])
def test_threshold_parsing(text, value):
    assert regress.fraction(text) == pytest.approx(value)


def test_unusable_input_exits_2(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert regress.main([str(BASELINE), str(empty)]) == 2
    assert regress.main([str(BASELINE), str(tmp_path / "nope.jsonl")]) == 2
