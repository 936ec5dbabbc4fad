"""The docs' tables of the kernel lab's probes (`harness.report.doc_probes`) say what measured them:
records without their env are refused, records measured on a tree with uncommitted changes are
cited as such, never as the commit they started from, and one table never mixes two commits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import results
from harness.report import doc_probes
from harness.sources import DEVICE_LOGS

REPO = Path(__file__).resolve().parents[3]
PINGPONG_RUN = "overlap-pingpong-20261206-522087f.jsonl"  # measured with uncommitted changes


def _probe_root(tmp_path: Path, edit=None) -> Path:
    """A checkout holding the ping-pong overlap run alone, each record passed through `edit`."""
    folder = tmp_path / DEVICE_LOGS
    folder.mkdir(parents=True)
    records = results.read(REPO / DEVICE_LOGS / PINGPONG_RUN)
    if edit is not None:
        records = [edit(dict(r)) for r in records]
    (folder / PINGPONG_RUN).write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_a_run_on_uncommitted_changes_is_cited_as_such(tmp_path):
    text = doc_probes.kernel_pingpong(_probe_root(tmp_path))
    assert "uncommitted changes on 522087f" in text and "commit 522087f" not in text


def test_a_clean_run_is_cited_by_its_commit(tmp_path):
    def clean(r):
        return {**r, "env": {**r["env"], "git_dirty": False}}

    text = doc_probes.kernel_pingpong(_probe_root(tmp_path, clean))
    assert "commit 522087f" in text and "uncommitted" not in text


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda r: {k: v for k, v in r.items() if k != "env"},
            "9 of 9 records do not say what measured them",
        ),
        (lambda r: {**r, "env": {**r["env"], "git_commit": None}}, "do not say what measured them"),
        (lambda r: {**r, "env": {**r["env"], "git_commit": f"{r['T']:07d}"}}, "records of 3 commits"),
    ],
    ids=["no-env", "no-commit", "two-commits"],
)
def test_a_table_refuses_records_that_do_not_say_what_measured_them(tmp_path, edit, message):
    with pytest.raises(ValueError, match=message):
        doc_probes.kernel_pingpong(_probe_root(tmp_path, edit))


def test_every_committed_device_log_says_what_measured_it():
    """Every JSONL probe record under results/device-logs/ carries its env (a probe that wrote none
    was given its run's, from a record of the same GPU call and checkout, named in `env_from`)."""
    for path in sorted((REPO / DEVICE_LOGS).glob("*.jsonl")):
        records = results.read(path)
        lacking = [r for r in records if not all((r.get("env") or {}).get(n) for n in doc_probes.ENV_NAMES)]
        assert not lacking, f"{path.name}: {len(lacking)} records without their env"
        assert path.stem.rsplit("-", 1)[1] == records[0]["env"]["git_commit"][:7], path.name


def test_the_ping_pong_times_a_tile_follow_their_formula():
    """Tiles a multiprocessor are N K / (128 x 128) / 132; one consumer's update is twice the
    kernel's time a tile less the main loop's, only where the kernel is slower than its main loop's
    pace; the tile is the ping-pong kernel's own."""
    from harness.kernels.overlap import pingpong_configs

    config = next(iter(pingpong_configs().values()))
    assert (config.block_n, config.block_k) == doc_probes.PINGPONG_TILE
    times = doc_probes.pingpong_tile_times(results.read(REPO / DEVICE_LOGS / PINGPONG_RUN))
    gate = next(t for t in times if t["shape_name"] == "gate" and t["T"] == 1024)
    assert gate["tiles"] == pytest.approx(14336 * 4096 / 128**2 / 132)
    assert gate["update_us"] == pytest.approx(2 * gate["pingpong_us"] - gate["main_us"])
    assert all(t["update_us"] is None for t in times if t["T"] == 16384)
    assert all(t["update_us"] > t["warps_us"] for t in times if t["T"] < 16384)
