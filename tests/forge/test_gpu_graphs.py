"""GPU-only checks of `method.cuda_graph` (skipped without CUDA): a step captured once and replayed
trains exactly as the same method's eager steps do, through the harness.

Run on the device, in one process (its image has no pytest-xdist):
`pytest -o addopts="" tests/forge/test_gpu_graphs.py -q`.

A tiny transformers Llama, built as `harness.run.models` builds every model (bf16, on the GPU), trained
by the harness's methods with the graph on and off from the same seed and batches. The first
graphed step runs `graphs.WARMUP_STEPS` eager steps on its first batch, then the capture, then one
replay, so N graphed steps are `WARMUP_STEPS + N` optimizer steps: the eager run takes the first
batch that many extra times and is compared after the same number of updates. Equality is to the
bit: the replayed kernels are the eager ones with the same values (torch's fused AdamW reads its
step count from the device either way; FORGE's replays read the fp32 coefficients `prepare_replay`
computed on the host exactly as an eager step computes them).
"""

from __future__ import annotations

import pytest
import torch

from harness.run import graphs, models, runner
from harness.run.config import compose_config

pytestmark = pytest.mark.gpu

TINY = ["model=tiny-llama", "gpu=h200", "device=cuda", "batch_size=2", "seq_len=64", "seed=3"]
GRAPHED_STEPS = 4


def _method(label: str, *overrides: str):
    cfg = compose_config([*TINY, f"method={label}", "method.lr=1e-3", *overrides])
    _model, method = runner.build_method(cfg, "cuda")
    return method


def _batches(n: int) -> list[torch.Tensor]:
    vocab = compose_config(TINY).model.vocab_size
    return [models.random_batch(vocab, 2, 64, "cuda", seed=100 + i) for i in range(n)]


def _train(method, batches: list[torch.Tensor]) -> list[float]:
    losses = [float(method.step(ids)) for ids in batches]  # float(): before the next replay overwrites it
    torch.cuda.synchronize()
    return losses


@pytest.mark.parametrize(
    "eager_label",
    [
        "fused_adamw",
        "forge_bf16",
        "forge_int8",
        "forge_bf16_stream",
        "no_optimizer",
        "fused_adamw_clip",
        "forge_bf16_clip",
        "forge_int8_clip",
        "fused_adamw_fp8",
        "forge_fp8",
        "forge_fp8_int8",
    ],
    ids=lambda s: s,
)
def test_graphed_steps_equal_eager_steps_to_the_bit(eager_label):
    batches = _batches(GRAPHED_STEPS)
    graphed = _method(f"{eager_label}_graph")
    assert graphed.cuda_graph
    initial = [p.detach().clone() for p in graphed.params()]
    graphed_losses = _train(graphed, batches)

    eager = _method(eager_label)
    assert not eager.cuda_graph
    warmed = [batches[0]] * graphs.WARMUP_STEPS + batches  # the same updates, in the same order
    eager_losses = _train(eager, warmed)

    assert graphed_losses == eager_losses[graphs.WARMUP_STEPS :]
    for (name, a), b in zip(eager.model.named_parameters(), graphed.model.parameters()):
        assert torch.equal(a, b), f"{eager_label}: {name} differs after {len(warmed)} steps"
    moved = sum(not torch.equal(a, b) for a, b in zip(initial, graphed.params()))
    # equal, and not because nothing moved (bf16 norm weights of 1.0 may not move without rounding)
    assert moved > len(initial) // 2 if eager.trains else moved == 0


def test_before_replay_runs_before_every_replay_and_never_before_an_eager_step():
    method = _method("fused_adamw_graph")
    events: list[str] = []
    eager_step = method.eager_step
    method.eager_step = lambda ids: events.append("eager") or eager_step(ids)
    method.before_replay = lambda: events.append("before_replay")
    _train(method, _batches(3))
    warm_up_and_capture = ["eager"] * (graphs.WARMUP_STEPS + 1)
    assert events == warm_up_and_capture + ["before_replay"] * 3
    assert method.notes == [
        f"cuda_graph: the first step ran {graphs.WARMUP_STEPS} eager warm-up steps and the capture "
        "before its replay"
    ]


def test_a_replayed_batch_of_another_shape_is_refused():
    method = _method("no_optimizer_graph")
    method.step(_batches(1)[0])
    with pytest.raises(ValueError, match="fixed shapes"):
        method.step(torch.zeros(1, 64, dtype=torch.long, device="cuda"))


@pytest.mark.parametrize(
    "overrides",
    [["method=fused_adamw_graph"], ["method=forge_int8_graph"], ["method=no_optimizer_graph"]]
    + [[f"method={m}", "method.cuda_graph=true"] for m in ("fused_adamw_amp", "forge_amp")],
    ids=lambda o: "-".join(v.split("=")[1] for v in o),
)
def test_a_graphed_point_runs_through_the_runner(overrides):
    """End to end: timed steps, memory peaks and the forward hook around a captured step (under
    autocast too, whose weight cache is off while capturing), recorded with its note."""
    cfg = compose_config([*TINY, "steps=6", "warmup_steps=2", "method.lr=1e-3", *overrides])
    record = runner.run_point(cfg)
    assert record["status"] == "ok", record["error"]
    assert record["method_options"]["cuda_graph"] is True
    assert any(note.startswith("cuda_graph: the first step ran") for note in record["notes"])
    assert record["peak_alloc_gib"] > 0 and record["peak_reserved_gib"] >= record["peak_alloc_gib"]
