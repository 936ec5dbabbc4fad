"""The sweep engine on CPU: failures become records, the sweep goes on, and resumes.

The subprocess tests run real workers (`python -m harness.run.worker`) with the tiny Llama and the
misbehaving methods of tests/harness/fakes.py, found through an extra Hydra search path
(tests/harness/conf). The capacity search and resume bookkeeping are also tested in-process, with
`run_isolated` replaced, so they cost no subprocess.
"""

import re

import pytest

from harness import results
from harness.run import grid, launch, local, sweep
from harness.run import record as point_record
from harness.run.config import compose_config, group_choices
from tests.harness import CONF

TINY = ["+exp=smoke", f"hydra.searchpath=[file://{CONF}]", "sweep.models=[tiny-llama]", "seq_len=16"]


def _overrides(tmp_path, methods, *extra):
    return [*TINY, f"results_dir={tmp_path}", "sweep.name=t", f"sweep.methods=[{','.join(methods)}]", *extra]


def _by_label(path):
    return {r["method_label"]: r for r in results.read(path)}


@pytest.fixture(scope="module")
def failure_sweep(tmp_path_factory):
    """One real sweep whose points succeed, OOM, crash, train nothing, diverge or cannot run."""
    tmp = tmp_path_factory.mktemp("sweep")
    methods = ["fused_adamw", "fake_oom", "fake_crash", "fake_still", "fake_nan", "adamw8bit_torchao"]
    path = sweep.run_sweep(_overrides(tmp, methods))
    return tmp, methods, path


def test_each_failure_is_recorded_and_the_sweep_goes_on(failure_sweep):
    _, methods, path = failure_sweep
    rows = _by_label(path)
    assert sorted(rows) == sorted(methods)
    assert rows["fused_adamw"]["status"] == "ok"
    assert rows["fake_oom"]["status"] == "oom" and "simulated" in rows["fake_oom"]["error"]
    assert rows["fake_crash"]["status"] == "error" and "exited with code 3" in rows["fake_crash"]["error"]
    assert rows["fake_still"]["status"] == "error" and "did not train" in rows["fake_still"]["error"]
    assert rows["fake_nan"]["status"] == "diverged"
    assert rows["adamw8bit_torchao"]["status"] == "unavailable" and rows["adamw8bit_torchao"]["error"]


def test_an_ok_record_carries_measurements_and_metadata(failure_sweep):
    _, _, path = failure_sweep
    ok = _by_label(path)["fused_adamw"]
    assert set(results.FIELDS) <= set(ok)
    assert ok["step_time_ms_median"] > 0 and len(ok["step_times_ms"]) == ok["steps"] - ok["warmup_steps"]
    assert ok["loss_last"] < ok["loss_first"] and ok["weights_gib"] > 0 and ok["optimizer_state_gib"] > 0
    assert ok["peak_alloc_gib"] is None and ok["activations_gib"] is None  # CPU: not measurable, not zero
    assert ok["env"]["torch"] and "git_commit" in ok["env"] and ok["config"]["model"]["name"] == "tiny-llama"
    assert ok["master_weights"] == "bf16" and ok["emulated"] is False


def test_interrupted_sweep_resumes_without_repeating(failure_sweep):
    tmp, methods, path = failure_sweep
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])  # killed while writing the last
    sweep.run_sweep(_overrides(tmp, methods))
    records = results.read(path)
    assert len(records) == len(methods)  # only the lost point ran again
    assert sorted(r["method_label"] for r in records) == sorted(methods)


def test_timeout_kills_the_point(tmp_path):
    path = sweep.run_sweep(_overrides(tmp_path, ["fake_hang"], "timeout_s=8"))
    (record,) = results.read(path)
    assert record["status"] == "error" and record["error"].startswith("timeout")


def _fake_isolated(oom_above):
    """A stand-in for run_isolated: ok up to a batch size, OOM above, no subprocess."""
    calls = []

    def run(point, git):
        calls.append(point.cfg.batch_size)
        record = point_record.for_point(point.cfg, point.id, "cpu").to_json()
        record["status"] = "oom" if point.cfg.batch_size > oom_above else "ok"
        return record

    return run, calls


def test_capacity_search_bisects_to_the_largest_batch(tmp_path, monkeypatch):
    run, calls = _fake_isolated(oom_above=5)
    monkeypatch.setattr(local, "run_isolated", run)
    overrides = _overrides(tmp_path, ["fused_adamw"], "sweep.mode=capacity", "sweep.max_batch_size=64")
    path = sweep.run_sweep(overrides)
    assert calls == [1, 2, 4, 8, 6, 5]
    sweep.run_sweep(overrides)  # resuming re-runs nothing
    assert len(calls) == 6 and len(results.read(path)) == 6


def test_a_resumed_sweep_says_what_it_skipped_and_how_to_run_it_again(tmp_path, monkeypatch, capsys):
    from harness.__main__ import main

    run, calls = _fake_isolated(oom_above=64)
    monkeypatch.setattr(local, "run_isolated", run)
    overrides = _overrides(tmp_path, ["fused_adamw", "no_optimizer"])
    assert main(["sweep", *overrides]) == 0
    assert len(calls) == 2 and "recorded earlier" not in capsys.readouterr().out
    assert main(["sweep", *overrides]) == 0  # everything recorded: nothing runs
    out = capsys.readouterr().out
    assert len(calls) == 2
    assert f"2 of 2 points were recorded earlier in {tmp_path / 't.jsonl'}: skipped" in " ".join(out.split())
    command = out.rstrip().splitlines()[-1].strip()
    assert command == sweep.rerun_command(overrides) and command.endswith(" sweep.rerun=true")
    assert "'sweep.methods=[fused_adamw,no_optimizer]'" in command  # quoted for the shell
    assert main(["sweep", *overrides, "sweep.rerun=true"]) == 0  # the command it gave, as the CLI gets it
    assert len(calls) == 4 and "recorded earlier" not in capsys.readouterr().out
    assert len(results.read(tmp_path / "t.jsonl")) == 4  # the new records beside the old
    assert "2 of 2 points were recorded earlier" in sweep.plan(overrides)  # --dry-run says it too


@pytest.mark.parametrize(
    "oom_above, expected", [(0, None), (1, 1), (5, 5), (64, 64), (100, 64)], ids=lambda v: f"{v}"
)
def test_largest_fitting(oom_above, expected):
    assert sweep.largest_fitting(lambda b: "oom" if b > oom_above else "ok", 64) == expected


def test_largest_fitting_stops_at_an_error():
    assert sweep.largest_fitting(lambda b: "ok" if b < 4 else "error", 64) == 2


def _memory_model(static_gib, per_sample_gib, cap_gib):
    """try_batch and guess for a step whose reserved peak is static + per_sample x batch."""
    calls, tried = [], {}

    def try_batch(b):
        calls.append(b)
        peak = static_gib + per_sample_gib * b
        tried[b] = {"batch_size": b, "peak_reserved_gib": peak if peak <= cap_gib else None}
        return "ok" if peak <= cap_gib else "oom"

    def guess():
        return sweep.predict_largest(tried[1], tried[2], cap_gib)

    return try_batch, guess, calls


@pytest.mark.parametrize(
    "static, per_sample, expected, most_calls",
    [(20, 2.5, 8, 4), (30, 0.3, 33, 4), (39, 0.4, 2, 3), (10, 0.2, 64, 3), (38.5, 1.0, 1, 2)],
    ids=["fits-8", "fits-33", "fits-2", "fits-max", "fits-1"],
)
def test_a_predicted_capacity_search_needs_few_tries(static, per_sample, expected, most_calls):
    try_batch, guess, calls = _memory_model(static, per_sample, cap_gib=40)
    assert sweep.largest_fitting(try_batch, 64, guess) == expected
    assert len(calls) <= most_calls, calls
    assert sweep.largest_fitting(_memory_model(static, per_sample, 40)[0], 64) == expected  # no guess


@pytest.mark.parametrize("off_by", [-3, -1, 1, 4])
def test_a_wrong_prediction_still_finds_the_largest_batch(off_by):
    try_batch, guess, calls = _memory_model(20, 2.5, cap_gib=40)  # 8 fits, 9 does not
    assert sweep.largest_fitting(try_batch, 64, lambda: guess() + off_by) == 8
    assert 8 in calls and 9 in calls  # the answer is always proven by its neighbour


def test_predict_largest_needs_a_cap_and_growing_peaks():
    small, large = {"batch_size": 1, "peak_reserved_gib": 22.5}, {"batch_size": 2, "peak_reserved_gib": 25.0}
    assert sweep.predict_largest(small, large, 40.0) == 8
    assert sweep.predict_largest(small, large, None) is None
    assert sweep.predict_largest(small, dict(large, peak_reserved_gib=22.5), 40.0) is None
    assert sweep.predict_largest(small, dict(large, peak_reserved_gib=None), 40.0) is None


def test_results_never_record_nan(failure_sweep):
    _, _, path = failure_sweep
    assert _by_label(path)["fake_nan"]["loss_first"] is None  # NaN is written as null
    assert "NaN" not in path.read_text()


@pytest.mark.parametrize("exp", group_choices("exp"))
def test_every_experiment_runs_in_tiny_mode(exp, tmp_path, monkeypatch):
    """Each experiment's sweep logic end to end on the tiny model, workers replaced (no subprocess),
    on a machine that has every experiment's hardware (faked: eight H200s). A capacity search stops
    at batch 2: it tries 1 and 2, and asks for a prediction from their peaks (the bisection after
    an OOM is test_capacity_search_bisects_to_the_largest_batch's)."""
    from harness.run import env

    run, _ = _fake_isolated(oom_above=2)
    monkeypatch.setattr(local, "run_isolated", run)
    machine = {"gpu_name": "NVIDIA H200", "gpu_count": 8, "gpu_memory_gib": 139.8, "host_memory_gib": 2000.0}
    monkeypatch.setattr(env, "machine", lambda: machine)
    overrides = [f"+exp={exp}", "sweep.models=[tiny-llama]", f"results_dir={tmp_path}"]
    overrides += ["sweep.max_batch_size=2"]
    records = results.read(sweep.run_sweep(overrides))
    assert records and all(r["status"] in results.STATUSES for r in records)
    name = compose_config([f"+exp={exp}"]).sweep.name  # the exp's, or the sweep it adds methods to
    assert all(r["model"] == "tiny-llama" and r["sweep"] == name for r in records)


def test_cli_run_one_point(tmp_path, capsys):
    from harness.__main__ import main

    args = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=2", "warmup_steps=0"]
    assert main(["run", *args, "method=no_optimizer", f"results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ok +no_optimizer/tiny-llama/b1/s16/cpu ", out, re.M)  # the summary table's row
    assert f"results: {tmp_path / 'adhoc.jsonl'} (1 point: 1 ok)" in out
    (record,) = results.read(tmp_path / "adhoc.jsonl")
    assert record["status"] == "ok" and (tmp_path / ".gitignore").exists()


def test_an_allocator_setting_reaches_the_worker_and_is_recorded(tmp_path):
    setting = "expandable_segments:True"
    assert local._child_env("cuda", setting)["PYTORCH_CUDA_ALLOC_CONF"] == setting
    path = sweep.run_sweep(_overrides(tmp_path, ["no_optimizer"], f"gpu.allocator={setting}", "steps=2"))
    (record,) = results.read(path)
    assert record["status"] == "ok" and record["cuda_alloc_conf"] == setting
    assert record["point"].endswith(f"/alloc={setting}")  # a search of its own, never a resume of another


def test_another_seed_is_another_point():
    # seed 0 keeps the ids of results written before seeds were part of them
    assert "/seed" not in grid.make_point([*TINY, "method=no_optimizer"]).id
    again = grid.make_point([*TINY, "method=no_optimizer", "model=tiny-llama", "seed=2"])
    assert again.id == "no_optimizer/tiny-llama/b1/s16/seed2/cpu"


def test_concurrent_points_are_refused_outside_convergence():
    from harness.run.config import ConfigError, compose_config

    with pytest.raises(ConfigError, match="only with convergence.enabled=true"):
        compose_config(["+exp=smoke", "sweep.concurrent_points=2"])


def test_convergence_points_run_concurrently_and_each_is_recorded(tmp_path, monkeypatch):
    """Workers replaced by a stand-in that waits until two run at once: the sweep must start the
    second before the first returns, and record both, each saying it shared the GPU."""
    import threading

    both_running = threading.Barrier(2, timeout=30)

    def run(point, git):
        both_running.wait()  # a serial sweep would block here and time out
        record = point_record.for_point(point.cfg, point.id, "cpu").to_json()
        record["status"] = "ok"
        return record

    monkeypatch.setattr(local, "run_isolated", run)
    overrides = ["+exp=convergence_smoke", f"results_dir={tmp_path}", "sweep.concurrent_points=2"]
    overrides.append("sweep.methods=[fused_adamw_fp32,forge_fp32_exact]")
    records = results.read(sweep.run_sweep(overrides))
    assert sorted(r["method_label"] for r in records) == ["forge_fp32_exact", "fused_adamw_fp32"]
    assert all(r["status"] == "ok" and r["concurrent_points"] == 2 for r in records)


def test_a_stopped_concurrent_sweep_records_nothing_for_its_killed_points(tmp_path, monkeypatch):
    """Ctrl-C while two convergence points run: both workers are killed, and neither becomes an
    `error` record (that would make the resumed sweep skip them). The Ctrl-C is the
    KeyboardInterrupt that Python raises in the main thread, where the sweep waits for its points:
    raised there once both workers are running, rather than sent as a signal after a guessed delay."""
    import sys
    import time

    monkeypatch.setattr(
        launch, "command", lambda gpus, args: [sys.executable, "-c", "import time; time.sleep(120)"]
    )

    def ctrl_c_once_both_run(futures):
        deadline = time.monotonic() + 60
        while len(local._live_workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(local._live_workers) == 2, "the two workers did not start"
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "as_completed", ctrl_c_once_both_run)
    overrides = ["+exp=convergence_smoke", f"results_dir={tmp_path}", "sweep.concurrent_points=2"]
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(overrides)
    assert results.recorded_points(tmp_path / "convergence_smoke.jsonl") == {}
    assert not local._live_workers  # every worker was reaped
    monkeypatch.undo()  # real workers again
    sweep.run_sweep([*TINY, f"results_dir={tmp_path}", "sweep.name=after", "sweep.methods=[no_optimizer]"])
    assert results.read(tmp_path / "after.jsonl")[0]["status"] == "ok"  # the next sweep is not stopped
