"""`ForgeOptimizer(capturable=True)`: the step's scalars from device memory, so a CUDA graph can
replay FORGE's step.

A CPU has no CUDA graphs; here the kernels run in Triton's interpreter reading their step rows
(the same kernels a graph replays), and a capture is faked to check the host's part of a replay.
The replay itself is checked on the GPU (tests/forge/test_gpu.py).
"""

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import forge
import forge.kernels
from forge import functional
from forge import steps as forge_steps
from forge.kernels import STEP_ROW
from forge.param_table import ParamTable
from forge.rules import NUM_COEFFICIENTS


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(30, 24), nn.Linear(24, 40), nn.LayerNorm(40), nn.Linear(40, 30))


def _batches(n):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 30, (4, 6), generator=gen) for _ in range(n)]


def _step(model, ids):
    logits = model(ids)
    nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten()).backward()


@pytest.mark.parametrize(
    "rule, options",
    [("adamw", dict(state_dtype="bf16")), ("nadam", dict(state_dtype="int8")), ("sgd", dict(momentum=0.9))],
)
def test_capturable_steps_equal_ordinary_ones(rule, options):
    """Scalars read from the step rows are the launch arguments' fp32 values, bit for bit
    (NAdam: per-parameter host state; SGD: a first step unlike the rest; int8 and bf16 states)."""
    base = _model().to(torch.bfloat16)
    plain, graphable = copy.deepcopy(base), copy.deepcopy(base)
    forge.attach(plain, rule, lr=1e-2, **options)
    opt = forge.attach(graphable, rule, lr=1e-2, capturable=True, **options)
    for ids in _batches(2):  # the first step and one after it
        _step(plain, ids)
        _step(graphable, ids)
    for (name, a), b in zip(plain.named_parameters(), graphable.parameters()):
        assert torch.equal(a, b), name
    assert opt.steps.rows.shape == (len(list(base.parameters())), STEP_ROW)


def _fake_capture(monkeypatch, opt, model, ids):
    """A backward as under torch.cuda.graph: `_capturing` true, the launches recorded, not run."""
    launches = []
    monkeypatch.setattr(forge_steps, "_capturing", lambda p: True)
    monkeypatch.setattr(functional, "fused_wgrad_update", lambda *a, **k: launches.append((a[4:6], k)))
    monkeypatch.setattr(functional, "elementwise_update", lambda *a, **k: launches.append((a[3:5], k)))
    _step(model, ids)
    monkeypatch.undo()
    return launches


def test_a_capture_records_the_parameters_and_a_replay_advances_them(monkeypatch):
    model = _model().to(torch.bfloat16)
    opt = forge.attach(model, "adamw", lr=1e-2, weight_decay=0.1, capturable=True)
    batches = _batches(2)
    _step(model, batches[0])  # the eager warm-up step
    launches = _fake_capture(monkeypatch, opt, model, batches[1])

    params = list(model.parameters())
    assert len(launches) == len(params)
    for (
        coefficients,
        seed,
    ), kwargs in launches:  # every launch reads its row, none carries this step's values
        assert kwargs["step_row"] is not None
        assert (coefficients, seed) == ((0.0,) * NUM_COEFFICIENTS, 0)
    assert all(opt.state[p]["step"] == 1 for p in params), "a capture must not count a step"
    assert set(opt.steps.captured) == set(params)

    for step, lr in ((2, 1e-2), (3, 5e-3)):  # a scheduler's new lr reaches the next replay
        opt.param_groups[0]["lr"] = lr
        opt.prepare_replay()
        rows = opt.steps.rows
        for p in params:
            group, state = opt.param_groups[0], opt.state[p]
            assert state["step"] == step
            row = rows[opt.index_of(p)]
            expected = torch.tensor(opt.rule.coefficients(group, step, {}), dtype=torch.float32)
            assert torch.equal(row[:NUM_COEFFICIENTS].view(torch.float32), expected)
            assert int(row[NUM_COEFFICIENTS]) == opt.steps.seed_for(p, step)


@pytest.mark.parametrize("rule", ["adamw", "nadam"])
def test_a_replay_writes_the_rows_an_eager_step_would(monkeypatch, rule):
    """`prepare_replay`'s bulk path (coefficients shared within a group and step, seeds in numpy)
    writes each captured parameter's row exactly as `begin` would before its eager launch: two
    groups at different learning rates, a seed above 32 bits, an FSDP2-like salt, and NAdam's
    per-parameter host state."""
    model = _model().to(torch.bfloat16)
    params = list(model.parameters())
    groups = [{"params": params[:3], "lr": 1e-2}, {"params": params[3:], "lr": 3e-3}]
    opt = forge.attach(model, rule, groups, capturable=True, seed=2**40 + 12345)
    opt.steps._salt = lambda p: 7 + opt.index_of(p)
    batches = _batches(2)
    _step(model, batches[0])
    _fake_capture(monkeypatch, opt, model, batches[1])
    twin = copy.copy(opt.steps)  # the same counts and host state, advanced one parameter at a time
    twin.version = dict(opt.steps.version)
    states = {p: {k: v for k, v in opt.state[p].items() if not isinstance(v, torch.Tensor)} for p in params}
    twin.table = ParamTable(SimpleNamespace(state=states, param_groups=opt.param_groups), opt.rule)
    twin.table.groups = opt.steps.table.groups  # the same groups and rules, the twin's own host states
    twin.table.rules = opt.steps.table.rules
    twin.capturable = False  # its eager step: counted, no row
    for _ in range(3):
        opt.prepare_replay()
        rows = opt.steps.rows
        for p in params:
            coefficients, seed, _ = twin.begin(p)
            expected = torch.tensor(coefficients, dtype=torch.float32).view(torch.int32)
            assert torch.equal(rows[opt.index_of(p)][:NUM_COEFFICIENTS], expected)
            assert int(rows[opt.index_of(p)][NUM_COEFFICIENTS]) == seed


def test_replay_helpers_refuse_misuse_with_what_to_do(monkeypatch):
    model = _model().to(torch.bfloat16)
    opt = forge.attach(model, "adamw", lr=1e-2)
    with pytest.raises(RuntimeError, match="capturable=True"):
        opt.prepare_replay()
    forge.detach(model)

    opt = forge.attach(model, "adamw", lr=1e-2, capturable=True)
    with pytest.raises(RuntimeError, match="no FORGE update has been captured"):
        opt.prepare_replay()
    monkeypatch.setattr(forge_steps, "_capturing", lambda p: True)
    with pytest.raises(RuntimeError, match="eager step"):
        _step(model, _batches(1)[0])  # the first update inside a capture: no step rows yet


def test_update_stream_is_a_no_op_off_cuda():
    """`update_stream=True` moves fused updates to a second CUDA stream; on a CPU there is none
    and the steps are the ordinary ones (the GPU test checks the streams)."""
    base = _model().to(torch.bfloat16)
    plain, streamed = copy.deepcopy(base), copy.deepcopy(base)
    forge.attach(plain, "adamw", lr=1e-2)
    forge.attach(streamed, "adamw", lr=1e-2, update_stream=True)
    for ids in _batches(2):
        _step(plain, ids)
        _step(streamed, ids)
    for a, b in zip(plain.parameters(), streamed.parameters()):
        assert torch.equal(a, b)
