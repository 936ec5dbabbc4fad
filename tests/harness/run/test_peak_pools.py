"""harness.run.peak_pools on synthetic allocator snapshots (the dicts torch.cuda.memory._snapshot()
returns), and its step recording on a CPU with a recorder that stands in for the allocator's."""

import pytest
import torch

from harness.run import peak_pools, runner
from harness.run.config import ConfigError, compose_config
from harness.run.peak_pools import BACKWARD_END, FORWARD_END, Identities

W, S, BATCH, A1, A2, G, T, U = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x5000, 0x7000


def _alloc(addr, size):
    return {"action": "alloc", "addr": addr, "size": size, "stream": 0}


def _free(addr, size):
    return [
        {"action": "free_requested", "addr": addr, "size": size, "stream": 0},
        {"action": "free_completed", "addr": addr, "size": size, "stream": 0},
    ]


def _mark():
    return {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}


def _segment(*blocks):
    """One segment holding `blocks` [(address, requested size)], all allocated."""
    return {
        "device": 0,
        "address": blocks[0][0],
        "blocks": [
            {"address": a, "size": n + 512, "requested_size": n, "state": "active_allocated"}
            for a, n in blocks
        ],
    }


def _snapshot(trace, alive=((W, 100), (S, 200), (BATCH, 4))):
    return {"segments": [_segment(*alive)], "device_traces": [trace]}


IDS = Identities(weights=[(W, 100)], states=[(S + 64, 136)], gradients=[(G, 100)])


def _fused_adamw_step():
    """A step whose peak is in backward, with one gradient alive: forward keeps A1 and A2, the
    backward allocates the gradient G, frees A2 and reuses its address for a transient T, the
    update allocates U; zero_grad frees G."""
    trace = [_alloc(A1, 50), _alloc(A2, 30), _mark(), _alloc(G, 100), *_free(A2, 30), _alloc(T, 10)]
    trace += [*_free(T, 10), *_free(A1, 50), _mark(), _alloc(U, 5), *_free(U, 5), *_free(G, 100), _mark()]
    return trace


def test_the_pools_at_a_peak_in_backward():
    pools = peak_pools.split_at_peak(_snapshot(_fused_adamw_step()), IDS, [FORWARD_END, BACKWARD_END])
    assert pools.bytes == {"weights": 100, "states": 200, "gradients": 100, "activations": 80, "other": 4}
    assert pools.total == sum(pools.bytes.values()) == 484
    assert pools.phase == "backward"


def test_a_block_at_a_gradients_address_before_the_gradient_is_an_activation():
    """The forward's activation at the address the gradient takes later is alive at the peak,
    the gradient is not: the peak holds activations, and no gradient."""
    trace = [_alloc(G, 500), _mark(), *_free(G, 500), _alloc(G, 100), _mark(), *_free(G, 100)]
    pools = peak_pools.split_at_peak(_snapshot(trace), IDS, [FORWARD_END, BACKWARD_END])
    assert pools.bytes["activations"] == 500 and pools.bytes["gradients"] == 0
    assert pools.phase == "forward"


def test_blocks_alive_before_the_history_come_from_the_snapshot_and_from_frees():
    """A block freed in the step that the history never saw allocated was alive at its start."""
    trace = [*_free(A1, 70), _alloc(A2, 20), _mark(), _mark(), *_free(A2, 20)]
    found = peak_pools.blocks(trace, [_segment((W, 100))])
    assert sorted((b.addr, b.size, b.born) for b in found) == [(W, 100, -1), (A1, 70, -1), (A2, 20, 2)]
    index, total = peak_pools.find_peak(found, len(trace))
    assert (index, total) == (-1, 170)  # before the step: freeing 70 and taking 20 never got back up
    pools = peak_pools.split_at_peak(_snapshot(trace, [(W, 100)]), IDS, [FORWARD_END, BACKWARD_END])
    assert pools.phase == "before the step" and pools.bytes["other"] == 70


def test_allocations_after_the_backward_are_other_and_the_phase_says_so():
    trace = [_alloc(A1, 10), _mark(), *_free(A1, 10), _mark(), _alloc(U, 500), *_free(U, 500)]
    pools = peak_pools.split_at_peak(_snapshot(trace), IDS, [FORWARD_END, BACKWARD_END])
    assert pools.bytes["other"] == 504 and pools.phase == "after backward"


def test_without_the_backward_mark_every_allocation_of_the_step_is_an_activation():
    trace = [_alloc(A1, 10), _mark(), _alloc(G, 100)]
    pools = peak_pools.split_at_peak(_snapshot(trace), IDS, [FORWARD_END])
    assert pools.bytes["gradients"] == 0 and pools.bytes["activations"] == 110
    assert pools.phase == "backward or after"


def test_marks_are_the_snapshot_entries_in_order():
    trace = [_alloc(A1, 1), _mark(), _alloc(A2, 1), _mark(), _mark()]
    assert peak_pools.mark_indices(trace, [FORWARD_END, BACKWARD_END]) == {FORWARD_END: 1, BACKWARD_END: 3}


class _Recorder:
    """Stands in for the allocator's history on a CPU: counts the marks, keeps which parameters
    had a gradient at each, returns an empty snapshot."""

    def __init__(self, method):
        self.method, self.started, self.grads_at_marks = method, 0, []

    def start(self):
        self.started += 1

    def mark(self):
        self.grads_at_marks.append(sum(p.grad is not None for p in self.method.params()))

    def stop(self):
        return {"segments": [], "device_traces": [[]]}


TINY = ["model=tiny-llama", "gpu=cpu", "device=cpu", "seq_len=16", "steps=2", "warmup_steps=0"]


@pytest.mark.parametrize("label, gradients_kept", [("fused_adamw", True), ("no_optimizer", False)])
def test_a_recorded_step_marks_the_forward_and_the_backward_and_takes_the_gradients_between(
    label, gradients_kept
):
    cfg = compose_config([*TINY, f"method={label}"])
    model, method = runner.build_method(cfg, "cpu")
    batch = torch.randint(0, cfg.model.vocab_size, (1, cfg.seq_len))
    recorder = _Recorder(method)
    recording = peak_pools.record_step(method, model, lambda: method.step(batch), recorder)
    n = len(method.params())
    assert recorder.started == 1 and recording.marks == [FORWARD_END, BACKWARD_END]
    assert recorder.grads_at_marks == [0, n if gradients_kept else 0]
    assert len(recording.identities.gradients) == (n if gradients_kept else 0)
    assert len(recording.identities.weights) == n
    assert bool(recording.identities.states) == gradients_kept  # fused AdamW's moments, after its step
    assert not model._forward_hooks  # the recording leaves nothing behind


def test_on_a_cpu_the_pools_are_null_with_a_note():
    record = runner.run_point(compose_config([*TINY, "method=fused_adamw", "measure.peak_pools=true"]))
    assert record["status"] == "ok", record["error"]
    assert record["peak_pools_gib"] is None and record["peak_pools_alloc_gib"] is None
    assert any("peak_pools: not measured" in n for n in record["notes"])
    assert record["config"]["measure"] == {"peak_pools": True, "fidelity": False}


@pytest.mark.parametrize(
    "overrides, must_mention",
    [
        (["method=fused_adamw_graph"], "cuda_graph"),
        (["+exp=convergence_smoke"], "convergence"),
    ],
)
def test_the_peak_pools_are_refused_where_they_cannot_be_read(overrides, must_mention):
    with pytest.raises(ConfigError, match="measure.peak_pools") as e:
        compose_config([*overrides, "measure.peak_pools=true"])
    assert must_mention in str(e.value)
