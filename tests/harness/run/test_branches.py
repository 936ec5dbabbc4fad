"""Branched fidelity runs (`harness.run.branches`): each method started from the fp32 reference's
state, its held-out loss k steps on against the reference's.

The smoke sweep (`+exp=convergence_branched_smoke`, a one-layer Llama on real text, FORGE's
kernels in the Triton interpreter) is the runner end to end: FORGE fp32 loaded with torch AdamW's
weights and moments must end each branch where the reference does, within 1e-4 nats (measured:
at most 2.4e-7). A branch that left the moments behind would not (the test fails so): fresh moments
move the weights by a full lr in the first step.
"""

import json
from types import SimpleNamespace

import pytest
import torch

from harness import results
from harness.run import branch_reference, branches, convergence, sweep
from harness.run.config import ConfigError, compose_config

TOLERANCE_NATS = 1e-4


@pytest.fixture(scope="module")
def reference_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("reference_cache")


@pytest.fixture(scope="module")
def smoke_records(tmp_path_factory, reference_cache):
    out = tmp_path_factory.mktemp("branches")
    path = sweep.run_sweep(
        [
            "+exp=convergence_branched_smoke",
            f"results_dir={out}",
            "sweep.concurrent_points=2",
            f"convergence.reference_cache={reference_cache}",
        ]
    )
    return {r["method_label"]: r for r in results.read(path)}


def test_fp32_branches_end_where_the_reference_does(smoke_records):
    record = smoke_records["forge_fp32_exact"]
    assert record["status"] == "ok", record["error"]
    starts = [(b["phase"], b["step"]) for b in record["branches"]]
    assert starts == [("pretrain", 0), ("pretrain", 12), ("cpt", 0)]
    for branch in record["branches"]:
        assert abs(branch["deviation"]) < TOLERANCE_NATS, branch
        assert branch["deviation"] == branch["heldout"] - branch["reference_heldout"]
        assert len(branch["losses"]) == record["branch_steps"] == 6
    assert len(record["reference_losses"]) == 36


def test_compensated_bf16_branches_run_and_deviate_by_bf16s_rounding(smoke_records):
    """bf16 weights and arithmetic: further from the reference than fp32, but far within a nat."""
    record = smoke_records["forge_bf16_kahan"]
    assert record["status"] == "ok", record["error"]
    deviations = [abs(b["deviation"]) for b in record["branches"]]
    assert len(deviations) == 3 and max(deviations) < 0.05
    assert max(deviations) > max(abs(b["deviation"]) for b in smoke_records["forge_fp32_exact"]["branches"])


def test_fp32_masters_under_bf16_autocast_branch_from_the_reference(smoke_records):
    """The bf16-arithmetic control: the reference's fp32 weights and moments, loaded by torch's own
    loader, and a bf16 forward; it ends each branch off the reference by bf16 arithmetic alone."""
    record = smoke_records["fused_adamw_amp"]
    assert record["status"] == "ok", record["error"]
    assert record["master_weights"] == "fp32" and record["method_options"]["autocast"] == "bf16"
    deviations = [abs(b["deviation"]) for b in record["branches"]]
    assert len(deviations) == 3 and max(deviations) < 0.05
    assert max(deviations) > max(abs(b["deviation"]) for b in smoke_records["forge_fp32_exact"]["branches"])


def test_the_methods_points_share_one_reference_trajectory(smoke_records, reference_cache):
    """Two points ran at once: one trained the reference, the others waited and read it."""
    (folder,) = [p for p in reference_cache.iterdir() if p.is_dir()]
    assert sorted(p.name for p in folder.glob("*.pt")) == ["cpt-0.pt", "pretrain-0.pt", "pretrain-12.pt"]
    first, *others = (smoke_records[m] for m in ("forge_fp32_exact", "forge_bf16_kahan", "fused_adamw_amp"))
    for other in others:
        assert first["reference"] == other["reference"] == folder.name
        assert first["reference_losses"] == other["reference_losses"]
        assert [b["reference_heldout"] for b in first["branches"]] == [
            b["reference_heldout"] for b in other["branches"]
        ]


def test_a_cached_trajectory_is_read_and_a_cut_off_one_trained_again(monkeypatch, tmp_path):
    cfg = compose_config(["+exp=convergence_branched_smoke", f"convergence.reference_cache={tmp_path}"])
    corpora = convergence.load_corpora(cfg)
    trained = []

    def train(cfg, corpora, device, folder):
        trained.append(folder)
        (folder / "trajectory.json").write_text(
            json.dumps({"losses": [1.0], "heldout": [["pretrain", 0, 2.0]]})
        )

    monkeypatch.setattr(branch_reference, "_train", train)
    folder = tmp_path / branch_reference.key(cfg, corpora, "cpu")
    folder.mkdir()
    (folder / "pretrain-0.pt").write_bytes(b"")  # a run cut off: no trajectory.json
    trajectory = branch_reference.trajectory(cfg, corpora, "cpu")
    assert trained == [folder] and trajectory.heldout("pretrain", 0) == 2.0
    branch_reference.trajectory(cfg, corpora, "cpu")
    assert trained == [folder]  # read, not trained again
    other = compose_config(
        ["+exp=convergence_branched_smoke", "seed=1", f"convergence.reference_cache={tmp_path}"]
    )
    assert branch_reference.key(other, corpora, "cpu") != folder.name


def test_branches_start_every_n_steps_while_k_remain():
    assert branch_reference.branch_starts(24, 12, 6) == [0, 12]
    assert branch_reference.branch_starts(150, 50, 50) == [0, 50, 100]
    assert branch_reference.branch_starts(5, 50, 5) == [0]
    assert branch_reference.branch_starts(500, 50, 50, first=100) == list(range(100, 451, 50))


def test_a_phase_branches_from_its_branch_from_step_and_the_reference_key_knows_it():
    """`branch_from` moves a phase's first branch (here past pretraining's warm-up): the starts the
    runner and the reference both follow, and another reference key."""
    later = "convergence.phases.0.branch_from=12"
    cfg = compose_config(["+exp=convergence_branched_smoke", "convergence.branch_every=6", later])
    corpora = convergence.load_corpora(cfg)
    starts = {p.name: p.starts for p in branch_reference.phases(cfg, corpora, "cpu")}
    assert starts == {"pretrain": [12, 18], "cpt": [0, 6]}
    base = compose_config(["+exp=convergence_branched_smoke", "convergence.branch_every=6"])
    assert branch_reference.key(cfg, corpora, "cpu") != branch_reference.key(base, corpora, "cpu")
    after = compose_config(["+exp=convergence_branched_after_warmup"])
    assert [p.branch_from for p in after.convergence.phases] == [100, 0]
    assert after.sweep.name == "convergence_branched_after_warmup"


def test_a_branch_from_that_leaves_a_phase_no_branch_is_refused_at_composition():
    with pytest.raises(ConfigError, match=r"phases\[1\].branch_from=7 leaves phase 'cpt' no branch"):
        compose_config(["+exp=convergence_branched_smoke", "convergence.phases.1.branch_from=7"])


def test_a_branch_longer_than_a_phase_is_refused_at_composition():
    with pytest.raises(ConfigError, match="branch_steps=30 is longer than phase"):
        compose_config(["+exp=convergence_branched_smoke", "convergence.branch_steps=30"])


def test_an_optimizer_without_a_loader_is_unloadable():
    """A method whose optimizer keeps another format (here SGD) cannot start from AdamW's state."""

    class Method:
        name = "sgd"

        def __init__(self):
            self.model = torch.nn.Linear(4, 4)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    class Reference:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(model.parameters())

    with pytest.raises(branches.Unloadable, match="has no loader from torch AdamW's"):
        branches.load_from_reference(Method(), Reference())


def test_parameters_are_matched_by_name_whatever_the_order():
    """The target optimizer's groups hold the parameters in another order: each gets the state of
    the reference's parameter of its name."""

    class Reference:
        model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
        opt = torch.optim.AdamW(model.parameters())

    Reference.model(torch.randn(4, 3)).sum().backward()
    Reference.opt.step()
    target = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    params = list(target.parameters())[::-1]
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}])
    opt.load_state_dict(branches.state_for(opt, target, Reference()))
    for (name, p), ref in zip(target.named_parameters(), Reference.model.parameters()):
        assert torch.equal(opt.state[p]["exp_avg"], Reference.opt.state[ref]["exp_avg"]), name


def test_a_branch_takes_the_references_hyperparameters_but_keeps_its_own_implementation():
    class Reference:
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.9), weight_decay=0.2, foreach=False)

    target = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(target.parameters(), lr=0.5, foreach=True)
    (group,) = branches.state_for(opt, target, Reference())["param_groups"]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (0.1, (0.8, 0.9), 0.2)
    assert group["foreach"] is True


# FlashOptim's FlashAdamW (an optional baseline). Its formats, int8 moments with an fp16 scale per
# 32 and bf16 weights with error-correction bits, run only in its CUDA kernels; quantize=False,
# master_weight_bits=None, fused=False is eager torch arithmetic on fp32 states, which runs anywhere.
FLASHOPTIM_ABSENT = "FlashOptim is an optional baseline (pip install -e .[baselines])"
GROUP = 32  # the elements that share one of FlashOptim's fp16 scales


def _two_layers(device: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """96 + 3 full groups of 32 and a partial one (the last bias's 8)."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))
    return model.to(device, dtype)


def _stepped_reference(device: str, steps: int = 3) -> SimpleNamespace:
    """The fp32 reference as `branches.Reference` keeps it (fused on CUDA), a few steps on."""
    model = _two_layers(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1, fused=device == "cuda"
    )
    inputs = torch.randn(16, 32, device=device)
    for _ in range(steps):
        model(inputs).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return SimpleNamespace(model=model, opt=opt)


def _one_gradient(target: torch.nn.Module, reference: SimpleNamespace) -> None:
    """The reference's gradient on a new batch, in the target's dtype, given to both."""
    reference.model(torch.randn(16, 32, device=next(target.parameters()).device)).square().mean().backward()
    for p, ref in zip(target.parameters(), reference.model.parameters()):
        p.grad = ref.grad.to(p.dtype)
        ref.grad = p.grad.float()


def _hyperparameters(opt: torch.optim.Optimizer) -> dict:
    return {k: opt.param_groups[0][k] for k in branches.HYPERPARAMETERS}


@pytest.mark.parametrize("steps", [0, 3], ids=["before-its-first-step", "three-steps-on"])
def test_flash_adamw_takes_the_references_state_and_steps_as_torch_adamw(steps):
    """FlashAdamW's CPU path takes the reference's weights, moments, step count (as its own int64)
    and hyperparameters, so its next step is torch AdamW's to fp32 rounding; before the reference's
    first step, fresh moments. A step count off by one would show: it moves the update by 3% or more."""
    flashoptim = pytest.importorskip("flashoptim", reason=FLASHOPTIM_ABSENT)
    reference = _stepped_reference("cpu", steps)
    model = _two_layers("cpu")
    opt = flashoptim.FlashAdamW(
        model.parameters(), lr=1e-3, quantize=False, master_weight_bits=None, fused=False
    )
    branches.load_from_reference(SimpleNamespace(name="flashoptim", model=model, opt=opt), reference)
    assert _hyperparameters(opt) == _hyperparameters(reference.opt)
    for (name, p), ref in zip(model.named_parameters(), reference.model.parameters()):
        state, ref_state = opt.state[p], reference.opt.state[ref]
        assert torch.equal(p, ref), name
        assert state["step"].dtype == torch.int64 and int(state["step"]) == steps, name
        for key in ("exp_avg", "exp_avg_sq"):
            expected = ref_state[key] if steps else torch.zeros_like(ref)
            assert torch.equal(state[key].materialize(), expected), (name, key)
    _one_gradient(model, reference)
    opt.step()
    reference.opt.step()
    for (name, p), ref in zip(model.named_parameters(), reference.model.parameters()):
        torch.testing.assert_close(p, ref, rtol=2**-21, atol=1e-2 * 2**-20, msg=name)


def _groups(t: torch.Tensor) -> torch.Tensor:
    """t flattened into rows of GROUP, the last padded with zeros (which raise no absmax)."""
    flat = t.detach().float().flatten()
    return torch.nn.functional.pad(flat, (0, -flat.numel() % GROUP)).view(-1, GROUP)


def _ungroup(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return rows.flatten()[: like.numel()].view_as(like)


def _half_bf16_ulp(b: torch.Tensor) -> torch.Tensor:
    """Half the spacing of bf16 numbers above |b| (2^(e-8) for 2^e <= |b|; zero and subnormals
    take the smallest normal's): the unit FlashOptim's error-correction bits count 127ths of."""
    exponent = torch.where(b == 0, -126, torch.frexp(b.float()).exponent - 1).clamp(min=-126)
    return torch.ldexp(torch.ones_like(b, dtype=torch.float32), exponent - 8)


def _master_bound(b: torch.Tensor) -> torch.Tensor:
    """How far bf16 b plus int8 error bits may decode from the fp32 master b rounds: the bits
    round the remainder (within half an ulp) to 127ths of half an ulp, so within 1/254 of it, about
    2^-16 of |b|; fp32's own rounding of the decoded sum adds at most 2^-15 of that unit."""
    return _half_bf16_ulp(b) * (1 / 254 + 2**-14)


def _momentum_bound(m: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """How far FlashOptim's int8 momentum may dequantize from m: x = m / absmax goes through
    softsign y = 2x / (1 + |x|), rounded to 127ths (within 1/254), back through the inverse's slope
    2 / (2 - |y|)^2 (at most 2), times the group's fp16 scale; plus the scale's rounding, times |x|."""
    rows = _groups(m)
    absmax = rows.abs().amax(1, keepdim=True)
    scale = scales.float()[:, None]
    x = rows / absmax.clamp(min=1e-12)
    y = 2 * x / (1 + x.abs())
    slope = 2 / (2 - (y.abs() + 1 / 254).clamp(max=1)) ** 2
    return _ungroup(slope / 254 * scale + x.abs() * (scale - absmax).abs() + scale * 2**-20, m)


def _variance_bound(v: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """How far FlashOptim's uint8 variance may dequantize from v: r = sqrt(v) in 255ths of the
    group's absmax, rounded (within 1/510), times the fp16 scale, plus the scale's rounding; then
    squared, so off by at most dr (2 r + dr)."""
    r = _groups(v).sqrt()
    absmax = r.amax(1, keepdim=True)
    scale = scales.float()[:, None]
    dr = scale / 510 + r / absmax.clamp(min=1e-12) * (scale - absmax).abs() + scale * 2**-20
    return _ungroup(dr * (2 * r + dr), v)


def _adam_update_spread(m, v, dm, dv, step, betas, eps) -> torch.Tensor:
    """How far AdamW's update direction m^ / (sqrt(v^) + eps) may move when its moments are off by
    up to dm and dv (the largest change over the four corners: it is monotonic in each)."""
    bc1, bc2 = 1 - betas[0] ** step, 1 - betas[1] ** step
    update = lambda m_, v_: (m_ / bc1) / ((v_.clamp(min=0) / bc2).sqrt() + eps)
    exact = update(m, v)
    corners = [update(m + a * dm, v + b * dv) for a in (-1, 1) for b in (-1, 1)]
    return torch.stack([(c - exact).abs() for c in corners]).amax(0)


@pytest.mark.gpu
def test_flash_adamw_loads_into_its_formats_within_their_precision():
    """FlashAdamW with its defaults (int8 moments, 24-bit master weights, fused kernels) loaded from
    the reference: bf16 weights rounded to nearest and error bits that decode within 2^-16 of the
    fp32 master, moments quantized with fresh scales within their int8 rounding, the step count;
    and its next step deviates from torch AdamW's by no more than those errors carry into it."""
    flashoptim = pytest.importorskip("flashoptim", reason=FLASHOPTIM_ABSENT)
    reference = _stepped_reference("cuda")
    model = _two_layers("cuda", torch.bfloat16)
    opt = flashoptim.FlashAdamW(model.parameters(), lr=1e-3)
    branches.load_from_reference(SimpleNamespace(name="flashoptim", model=model, opt=opt), reference)
    assert _hyperparameters(opt) == _hyperparameters(reference.opt)
    lr, betas, eps, weight_decay = _hyperparameters(opt).values()
    before = {}  # each parameter's loaded errors, and the reference's weight before the step
    for (name, p), ref in zip(model.named_parameters(), reference.model.parameters()):
        state, ref_state = opt.state[p], reference.opt.state[ref]
        assert state["step"].dtype == torch.int64 and int(state["step"]) == 3, name
        assert torch.equal(p, ref.bfloat16()), name
        master = flashoptim.reconstruct_fp32_param(p, state["error_bits"])
        assert ((master - ref).abs() <= _master_bound(p)).all(), name
        m, v = state["exp_avg"], state["exp_avg_sq"]
        assert torch.equal(m.scales, _groups(ref_state["exp_avg"]).abs().amax(1).half()), name
        fresh_v_scales = _groups(ref_state["exp_avg_sq"]).sqrt().amax(1).half()
        torch.testing.assert_close(v.scales, fresh_v_scales, rtol=2**-10, atol=0, msg=name)
        dm = (m.materialize() - ref_state["exp_avg"]).abs()
        dv = (v.materialize() - ref_state["exp_avg_sq"]).abs()
        assert (dm <= _momentum_bound(ref_state["exp_avg"], m.scales)).all(), name
        assert (dv <= _variance_bound(ref_state["exp_avg_sq"], v.scales)).all(), name
        before[name] = (master - ref).abs(), dm, dv, ref.detach().clone()
    _one_gradient(model, reference)
    opt.step()
    reference.opt.step()
    for (name, p), ref in zip(model.named_parameters(), reference.model.parameters()):
        dw, dm, dv, ref_before = before[name]
        ref_state = reference.opt.state[ref]
        spread = _adam_update_spread(
            ref_state["exp_avg"], ref_state["exp_avg_sq"], betas[0] * dm, betas[1] * dv, 4, betas, eps
        )
        arithmetic = 2**-16 * (ref - ref_before).abs() + lr * 2**-20  # two fp32 orders of the same update
        bound = dw * (1 - lr * weight_decay) + lr * spread + _master_bound(p) + arithmetic
        master = flashoptim.reconstruct_fp32_param(p, opt.state[p]["error_bits"])
        deviation = (master - ref).abs()
        assert (deviation <= bound).all(), (name, (deviation / bound).max())
        ref_update = ref - ref_before * (1 - lr * weight_decay)
        assert deviation.norm() < 0.02 * ref_update.norm(), name  # and far inside it: 0.1-0.6% measured
