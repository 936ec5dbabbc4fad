"""The table a sweep ends with: one row per point, footnoted failures, the interpreter's note."""

from __future__ import annotations

from harness.run.summary import summary_table


def _record(label, method, status="ok", device="cpu", ms=12.5, error=None):
    return {
        "point": f"{label}/tiny-llama/b1/s32/cpu",
        "method": method,
        "method_label": label,
        "status": status,
        "device": device,
        "step_time_ms_median": ms if status == "ok" else None,
        "peak_alloc_gib": None,
        "tokens_per_s": 32e3 / ms if status == "ok" else None,
        "error": error,
    }


RECORDS = [
    _record("fused_adamw", "fused_adamw"),
    _record("forge_bf16", "forge", ms=2204.7),
    _record(
        "adalomo", "lomo", "unavailable", error="AdaLomo allocates its states with .cuda(): it needs CUDA"
    ),
    _record("flashoptim", "flashoptim", "unavailable", error="FlashOptim needs CUDA"),
]


def test_one_row_per_point_with_status_time_and_throughput(tmp_path):
    lines = summary_table(RECORDS, tmp_path / "smoke.jsonl").splitlines()
    assert lines[0].split() == ["status", "point", "step", "ms", "peak", "GiB", "tokens/s"]
    fused = next(line for line in lines if "fused_adamw/" in line)
    assert fused.split() == ["ok", "fused_adamw/tiny-llama/b1/s32/cpu", "12.5", "—", "2560"]


def test_a_failed_point_has_its_reason_as_a_footnote(tmp_path):
    text = summary_table(RECORDS, tmp_path / "smoke.jsonl")
    assert "unavailable [1]  adalomo/" in text and "unavailable [2]  flashoptim/" in text
    assert "[1] adalomo: AdaLomo allocates its states with .cuda(): it needs CUDA" in text


def test_interpreted_times_are_starred_and_explained(tmp_path):
    text = summary_table(RECORDS, tmp_path / "smoke.jsonl")
    assert "*2204.7" in text and "*12.5" not in text
    words = " ".join(text.split())
    assert "Triton's CPU interpreter" in words and "say nothing about speed" in words
    gpu = [_record("forge_bf16", "forge", device="cuda")]
    assert "interpreter" not in summary_table(gpu, tmp_path / "x.jsonl")


def test_it_names_the_results_and_how_to_render_them(tmp_path):
    text = summary_table(RECORDS, tmp_path / "smoke.jsonl")
    assert f"results: {tmp_path / 'smoke.jsonl'} (4 points: 2 ok, 2 unavailable)" in text
    assert "python -m harness report\n" in text + "\n"
    (tmp_path / ".gitignore").write_text("*\n")  # a scratch folder, as the smoke sweep makes
    text = summary_table(RECORDS, tmp_path / "smoke.jsonl")
    assert "leaves it out" in text and f"python -m harness report {tmp_path}" in text
