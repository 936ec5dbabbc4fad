"""`forge.checkpoint` on one process: a resumed run continues bit for bit; every checkpoint that does
not fit is refused before anything changes; a save killed half-way leaves the previous one loadable.
(Two ranks, DDP and FSDP2, and resharding between rank counts: tests/forge/test_data_parallel.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import forge
import forge.checkpoint as ckpt
from tests.helpers import tiny_llama

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
