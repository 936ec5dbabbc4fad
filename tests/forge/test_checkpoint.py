"""`forge.checkpoint` on one process: a resumed run continues bit for bit; every checkpoint that does
not fit, or is damaged, is refused before anything changes, and a read that fails half-way (or is
interrupted) changes nothing either; a save killed half-way leaves the previous one loadable.
(Two and four ranks, DDP and FSDP2, resharding between rank counts, a damaged shard on one rank:
tests/forge/test_data_parallel.py.)"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import forge
import forge.checkpoint as ckpt
from tests.helpers import damage_checkpoint, tiny_llama, without_checksums

STEPS, SAVED_AT = 10, 5  # saved at step 5 of 10, resumed from there
HPARAMS = dict(lr=1e-2, weight_decay=0.1)


def _batches(n: int = STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 96, (2, 8), generator=g) for _ in range(n)]


def _build(init: int, weights=torch.float32, rule="adamw", **options):
    torch.manual_seed(init)
    model = tiny_llama(**options.pop("config", {})).to(weights)
    opt = forge.attach(model, rule, **{**HPARAMS, **options})
    return model, opt


def _step(model, ids) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss.detach())


def _everything(model, opt) -> dict[str, torch.Tensor]:
    """Copies of every weight and every optimizer tensor, by name."""
    out = {f"model.{n}": p.detach().clone() for n, p in model.named_parameters()}
    for p, state in opt.state.items():
        for key, value in state.items():
            out[f"{opt.param_names[p]}.{key}"] = value.clone() if torch.is_tensor(value) else value
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        same = torch.equal(a[name], b[name]) if torch.is_tensor(a[name]) else a[name] == b[name]
        assert same, name


@pytest.mark.parametrize(
    "weights, options",
    [
        (torch.float32, dict(state_dtype="fp32")),
        (torch.bfloat16, dict(state_dtype="bf16", stochastic_rounding=True)),
        (torch.bfloat16, dict(state_dtype="int8", master_weights="bf16+kahan")),
    ],
    ids=["fp32", "bf16-sr", "int8-kahan"],
)
def test_a_resumed_run_continues_bit_for_bit(tmp_path, weights, options):
    batches = _batches()
    model, opt = _build(0, weights, **options)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    straight = []
    for i, ids in enumerate(batches):
        straight.append(_step(model, ids))
        opt.step()  # harmless under FORGE; the scheduler expects it before its own step
        sched.step()
        if i + 1 == SAVED_AT:
            path = ckpt.save(tmp_path, model, opt, step=i + 1, extra={"scheduler": sched.state_dict()})
    # another initialization, another seed: everything must come from the checkpoint
    resumed, opt2 = _build(1, weights, **{**options, "seed": 99})
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    loaded = ckpt.load(tmp_path, resumed, opt2)
    sched2.load_state_dict(loaded.extra["scheduler"])
    assert loaded.path == path and loaded.step == SAVED_AT and opt2.seed == opt.seed
    losses = []
    for ids in batches[loaded.step :]:
        losses.append(_step(resumed, ids))
        opt2.step()
        sched2.step()
    assert losses == straight[SAVED_AT:]
    _assert_same(_everything(resumed, opt2), _everything(model, opt))


def test_the_newest_complete_checkpoint_is_loaded_and_keep_prunes(tmp_path):
    model, opt = _build(0)
    for step, ids in enumerate(_batches(4), start=1):
        _step(model, ids)
        ckpt.save(tmp_path, model, opt, step=step, keep=2)
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    other, opt2 = _build(1)
    assert ckpt.load(tmp_path, other, opt2).step == 4
    assert ckpt.load(tmp_path / "step-00000003", other, opt2).step == 3  # a checkpoint by its path


def _batch_norm_model(init: int):
    """Linear layers around a BatchNorm: running statistics (buffers) beside the weights."""
    torch.manual_seed(init)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    opt = forge.attach(model, "adamw", state_dtype="bf16", seed=init, **HPARAMS)
    for _ in range(2):
        model(torch.randn(6, 8)).pow(2).mean().backward()
    return model, opt


def _held(model, opt) -> dict:
    """Copies of everything a load may change: weights, buffers, states, steps, groups, seed, RNG."""
    return {
        **_everything(model, opt),
        **{f"buffer.{n}": b.clone() for n, b in model.named_buffers()},
        "groups": copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]),
        "seed": opt.seed,
        "rng": torch.get_rng_state(),
    }


@pytest.mark.parametrize("file", ["data", "metadata"])
def test_bytes_flipped_inside_a_file_are_refused_before_anything_changes(tmp_path, file):
    model, opt = _batch_norm_model(0)
    path = ckpt.save(tmp_path, model, opt, step=2)
    if file == "data":  # the middle of the largest tensor: without checksums it would load as it is
        damage_checkpoint(path, "largest", "middle")
        damaged = next(path.glob("*.distcp"))
    else:
        damaged = path / ".metadata"
        raw = bytearray(damaged.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        damaged.write_bytes(bytes(raw))
    other, opt2 = _batch_norm_model(1)
    before = _held(other, opt2)
    message = rf"{damaged.name} has its saved size but not its saved CRC-32.*earlier checkpoint"
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load(path, other, opt2)
    _assert_same(_held(other, opt2), before)


def test_a_read_that_fails_half_way_changes_nothing(tmp_path):
    """A checkpoint without checksums whose last record is damaged: DCP has read the others when it
    fails, with a CheckpointException (a BaseException); what it read never reaches the model."""
    model, opt = _batch_norm_model(0)
    path = ckpt.save(tmp_path, model, opt, step=2)
    without_checksums(path)
    damage_checkpoint(path, "last", "header")
    other, opt2 = _batch_norm_model(1)
    before = _held(other, opt2)
    with pytest.raises(ckpt.CheckpointError, match=r"could not be read \(\w+ on rank 0;.*Nothing was loaded"):
        ckpt.load(path, other, opt2)
    _assert_same(_held(other, opt2), before)


def test_an_interrupt_during_the_read_is_raised_as_itself_and_changes_nothing(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import FileSystemReader

    model, opt = _batch_norm_model(0)
    path = ckpt.save(tmp_path, model, opt, step=2)
    read = FileSystemReader.read_data

    def interrupted(self, plan, planner):  # the whole plan read into place, then Ctrl-C
        read(self, plan, planner).wait()
        raise KeyboardInterrupt

    monkeypatch.setattr(FileSystemReader, "read_data", interrupted)
    other, opt2 = _batch_norm_model(1)
    before = _held(other, opt2)
    with pytest.raises(KeyboardInterrupt):
        ckpt.load(path, other, opt2)
    _assert_same(_held(other, opt2), before)


@pytest.mark.parametrize(
    "free_gib, plain_gib, sharded_gib, expected",
    [
        (10, 4, 0, "device"),
        (10, 10.5, 0, "host"),
        (10, 6, 3, "device"),
        (10, 8, 2.5, "host"),
        (10, 0, 10.5, "refused"),
    ],
    ids=["fits", "plain-to-host", "both-fit", "plain-to-host-shards-fit", "shards-do-not-fit"],
)
def test_the_staging_copy_goes_where_it_fits(
    tmp_path, monkeypatch, free_gib, plain_gib, sharded_gib, expected
):
    """On a GPU the staging copy stays on the device where it fits beside what the device holds;
    plain tensors (one GPU, DDP) otherwise stage in host memory; sharded DTensors stage on their
    device only, and a load whose shards do not fit is refused before anything changes."""
    gib = 2**30
    monkeypatch.setattr(ckpt, "_device_bytes", lambda state: (int(plain_gib * gib), int(sharded_gib * gib)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(free_gib * gib) + ckpt.STAGING_MARGIN, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    if expected == "refused":
        with pytest.raises(
            ckpt.CheckpointError, match=r"shards need 10\.5 GiB of cuda:0.*Nothing was loaded"
        ):
            ckpt._stage_on_host(tmp_path, {})
    else:
        assert ckpt._stage_on_host(tmp_path, {}) == (expected == "host")


def test_a_load_staged_in_host_memory_equals_one_staged_beside_the_model(tmp_path, monkeypatch):
    """What a host-staged load leaves equals what a load staged beside the model leaves."""
    model, opt = _batch_norm_model(0)
    path = ckpt.save(tmp_path, model, opt, step=2)
    loaded = []
    for host in (False, True):
        monkeypatch.setattr(ckpt, "_stage_on_host", lambda checkpoint, state, host=host: host)
        other, opt2 = _batch_norm_model(1)
        ckpt.load(path, other, opt2)
        loaded.append(_held(other, opt2))
    _assert_same(loaded[1], loaded[0])


def _saved(tmp_path, **options):
    model, opt = _build(0, **options)
    _step(model, _batches(1)[0])
    return ckpt.save(tmp_path, model, opt, step=1)


@pytest.mark.parametrize(
    "saved_with, loaded_with, message",
    [
        (dict(), dict(rule="lion", lr=1e-4), r"rule='adamw' \(this optimizer: 'lion'\)"),
        (
            dict(state_dtype="bf16"),
            dict(state_dtype="int8"),
            r"state_dtype='bf16' \(this optimizer: 'int8'\)",
        ),
        (dict(state_dtype="int8"), dict(state_dtype="int8", int8_group=128), "int8_group=64"),
        (
            dict(),
            dict(config=dict(intermediate_size=128)),
            r"mlp.down_proj.weight was saved as float32 \(64, 96\), this run holds float32 \(64, 128\)",
        ),
        (dict(), dict(config=dict(num_hidden_layers=2)), "lacks .* tensor"),
    ],
    ids=["rule", "state-dtype", "int8-group", "shape", "layers"],
)
def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_changes(
    tmp_path, saved_with, loaded_with, message
):
    path = _saved(tmp_path, **saved_with)
    model, opt = _build(1, **loaded_with)
    before = _everything(model, opt)
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load(path, model, opt)
    _assert_same(_everything(model, opt), before)


def test_a_truncated_file_is_refused_before_anything_changes(tmp_path):
    path = _saved(tmp_path)
    data = next(path.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    model, opt = _build(1)
    before = _everything(model, opt)
    with pytest.raises(ckpt.CheckpointError, match=r"bytes of the \d+ its metadata records.*earlier"):
        ckpt.load(path, model, opt)
    _assert_same(_everything(model, opt), before)


def test_a_damaged_manifest_and_a_missing_checkpoint_are_refused(tmp_path):
    path = _saved(tmp_path / "a")
    (path / ckpt.MANIFEST).write_text("{not json")
    model, opt = _build(1)
    with pytest.raises(ckpt.CheckpointError, match="forge.json cannot be read"):
        ckpt.load(path, model, opt)
    with pytest.raises(ckpt.CheckpointError, match="forge.json cannot be read"):
        ckpt.load(tmp_path / "a", model, opt)  # the newest is damaged: refused, not skipped silently
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no complete FORGE checkpoint"):
        ckpt.load(tmp_path / "empty", model, opt)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ckpt.load(tmp_path / "nowhere", model, opt)


def test_bad_arguments_are_refused(tmp_path):
    model, opt = _build(0)
    with pytest.raises(ValueError, match="non-negative int"):
        ckpt.save(tmp_path, model, opt, step=-1)
    with pytest.raises(ValueError, match="keep=0"):
        ckpt.save(tmp_path, model, opt, step=1, keep=0)
    assert not list(tmp_path.iterdir())


def test_a_write_that_fails_is_a_checkpoint_error_and_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """A full disk half-way through DCP's write (raised inside DCP, which gathers it into its
    CheckpointException, a BaseException that `except Exception` would not catch) comes out of
    `save` as CheckpointError naming the failure, and step 1 stays the newest complete checkpoint."""
    from torch.distributed.checkpoint import FileSystemWriter

    model, opt = _build(0)
    _step(model, _batches(1)[0])
    ckpt.save(tmp_path, model, opt, step=1)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FileSystemWriter, "finish", full)
    with pytest.raises(
        ckpt.CheckpointError, match=r"step-00000002\.partial could not be written \(OSError.*No space"
    ):
        ckpt.save(tmp_path, model, opt, step=2)
    assert ckpt.latest(tmp_path) == tmp_path / "step-00000001"
    monkeypatch.undo()
    assert ckpt.save(tmp_path, model, opt, step=2) == tmp_path / "step-00000002"  # the next save clears it
    assert not (tmp_path / "step-00000002.partial").exists()


def _save_then_kill(directory: str, where: str) -> None:
    """In a child process: save step 1, then die by SIGKILL in the middle of saving step 2, `where`
    says: while DCP writes (its data on disk, its metadata not yet) or once DCP is done but before
    the checkpoint is renamed into place."""
    from torch.distributed.checkpoint import FileSystemWriter

    model, opt = _build(0)
    batches = _batches(2)
    _step(model, batches[0])
    ckpt.save(directory, model, opt, step=1)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, f"{directory}/w1.pt")
    _step(model, batches[1])

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "while-writing":
        FileSystemWriter.finish = killed
    else:
        ckpt._publish = killed
    ckpt.save(directory, model, opt, step=2)


@pytest.mark.parametrize("where", ["while-writing", "before-the-rename"])
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, where):
    code = f"from tests.forge.test_checkpoint import _save_then_kill as f; f({str(tmp_path)!r}, {where!r})"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=Path(__file__).parents[2])
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()[-2000:]
    assert (tmp_path / "step-00000002.partial").is_dir()  # it died half-way through step 2
    assert ckpt.latest(tmp_path) == tmp_path / "step-00000001"
    model, opt = _build(1)
    assert ckpt.load(tmp_path, model, opt).step == 1
    saved = torch.load(tmp_path / "w1.pt")
    for n, p in model.named_parameters():
        assert torch.equal(p, saved[n]), n
    _step(model, _batches(2)[1])  # the run goes on; the next save of step 2 clears the partial one
    assert ckpt.save(tmp_path, model, opt, step=2) == tmp_path / "step-00000002"
    assert not (tmp_path / "step-00000002.partial").exists()
