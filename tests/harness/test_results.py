"""harness.results: atomic appends, truncated-line tolerance, one-call loading."""

import json
import re
from pathlib import Path

import pytest

import harness.results as results

REPO = Path(__file__).resolve().parents[2]


def _record(point: str, **kw) -> dict:
    r = results.empty_record()
    r.update(sweep="t", point=point, status="ok", method="fused_adamw", **kw)
    return r


def test_append_and_load_roundtrip(tmp_path):
    path = tmp_path / "s.jsonl"
    results.append(path, _record("a", step_times_ms=[1.0, 2.0]))
    results.append(path, _record("b", loss_last=float("nan")))
    df = results.load(path)
    assert list(df.point) == ["a", "b"]
    assert list(df.columns[: len(results.FIELDS)]) == list(results.FIELDS)
    assert df.step_times_ms[0] == [1.0, 2.0]
    assert df.loss_last.isna()[1]  # NaN is written as null, not as invalid JSON


def test_truncated_last_line_is_tolerated_and_repaired(tmp_path):
    path = tmp_path / "s.jsonl"
    results.append(path, _record("a"))
    with open(path, "a") as f:
        f.write(json.dumps(_record("b"))[:40])  # a killed writer
    assert list(results.load(path).point) == ["a"]
    results.append(path, _record("c"))  # starts on a fresh line
    assert list(results.load(path).point) == ["a", "c"]
    assert set(results.recorded_points(path)) == {"a", "c"}


def test_load_directory_recurses_and_keeps_all_columns(tmp_path):
    results.append(tmp_path / "x.jsonl", _record("a", extra_field=1))
    results.append(tmp_path / "sub" / "y.jsonl", _record("b"))
    df = results.load(tmp_path)
    assert sorted(df.point) == ["a", "b"]
    assert "extra_field" in df.columns and "peak_nvml_gib" in df.columns


def test_the_device_stamp_names_the_commit_when_set(tmp_path, monkeypatch):
    """On the GPU machine the copy may hold a stale .git: the stamp of stamp_commit.sh wins."""
    from harness.run import env

    stamp = tmp_path / ".device-commit"
    stamp.write_text("0123abcd clean\n")
    monkeypatch.setenv(env.STAMP_VARIABLE, str(stamp))
    expected = {"git_commit": "0123abcd", "git_dirty": False, "git_commit_source": ".device-commit"}
    assert env.git_info() == expected
    monkeypatch.delenv(env.STAMP_VARIABLE)
    assert env.git_info().get("git_commit_source") is None  # here: this checkout's own git


def test_merge_brings_back_only_missing_records(tmp_path):
    kept, tree = tmp_path / "kept", tmp_path / "results"
    for name in ("s.jsonl", "sub/t.jsonl"):  # the earlier call wrote a, b (and c, in a new file)
        results.append(kept / name, _record("a"))
        results.append(kept / name, _record("b", time="2026-11-29T17:00:00"))
    results.append(tree / "s.jsonl", _record("a"))  # the sender's tree has a only
    assert results.merge_missing_records(kept, tree) == {"s.jsonl": 1, "sub/t.jsonl": 2}
    assert [r["point"] for r in results.read(tree / "s.jsonl")] == ["a", "b"]
    assert [r["point"] for r in results.read(tree / "sub" / "t.jsonl")] == ["a", "b"]
    assert results.merge_missing_records(kept, tree) == {}  # a second merge adds nothing


def _field_table(text: str) -> list[str]:
    """The names in the first column of the `| field | meaning |` table of a Markdown page."""
    rows = []
    for line in text[text.index("| field | meaning |") :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row)]


def test_the_guide_lists_every_record_field_once():
    """docs/harness.md's field table names exactly `FIELDS`: a field added, renamed or dropped in
    `Record` is a row of the table to write."""
    names = _field_table((REPO / "docs" / "harness.md").read_text())
    assert sorted(names) == sorted(results.FIELDS)
    assert len(names) == len(set(names))


def test_a_kernel_record_refuses_an_undeclared_field():
    record = results.kernel_record(
        {"gpu_name": "H200"}, shape_name="q", T=8, shipped_ms=0.1, split_u8_differs=False
    )
    assert record["T"] == 8 and record["shipped_ms"] == 0.1
    with pytest.raises(KeyError, match="KERNEL_FIELDS"):
        results.kernel_record({"gpu_name": "H200"}, shipped_time=0.1)


def test_every_committed_kernel_record_declares_its_fields():
    """The kernel lab's records under results/ (its probes' under device-logs/overlap-*) carry only
    declared names: a field a writer adds is declared in harness.results first."""
    files = [
        *results.expand([REPO / "results"]),
        *sorted((REPO / "results" / "device-logs").glob("overlap-*.jsonl")),
    ]
    kernel = [
        r
        for f in files
        for r in results.iter_records(f)
        if "variant" in r or r.get("sweep") == "kernel_overlap"
    ]
    assert kernel
    undeclared = {name for r in kernel for name in r if not results.is_declared(name)}
    assert not undeclared


def test_the_worst_status_of_ranks():
    assert results.worst_status(["ok", "oom", "error"]) == "oom"
    assert results.worst_status(["ok", "unavailable"]) == "unavailable"
    assert results.worst_status(["ok", None]) == "error"


def test_one_record_file_round_trips(tmp_path):
    path = tmp_path / "record.json"
    results.write_one(path, _record("a", loss_last=float("nan"), notes=[tmp_path]))
    back = results.read_one(path)
    assert back["point"] == "a" and back["loss_last"] is None and back["notes"] == [str(tmp_path)]
    assert not path.with_suffix(".tmp").exists()
