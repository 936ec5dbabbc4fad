"""Branched fidelity runs (`harness.run.branches`): each method started from the fp32 reference's
state, its held-out loss k steps on against the reference's.

The smoke sweep (`+exp=convergence_branched_smoke`, a one-layer Llama on real text, FORGE's
kernels in the Triton interpreter) is the runner end to end: FORGE fp32 loaded with torch AdamW's
weights and moments must end each branch where the reference does, within 1e-4 nats (measured:
at most 2.4e-7). A branch that left the moments behind would not (the test fails so): fresh moments
move the weights by a full lr in the first step.
"""

import json

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


def test_the_methods_points_share_one_reference_trajectory(smoke_records, reference_cache):
    """Two points ran at once: one trained the reference, the other waited and read it."""
    (folder,) = [p for p in reference_cache.iterdir() if p.is_dir()]
    assert sorted(p.name for p in folder.glob("*.pt")) == ["cpt-0.pt", "pretrain-0.pt", "pretrain-12.pt"]
    first, second = smoke_records["forge_fp32_exact"], smoke_records["forge_bf16_kahan"]
    assert first["reference"] == second["reference"] == folder.name
    assert first["reference_losses"] == second["reference_losses"]
    assert [b["reference_heldout"] for b in first["branches"]] == [
        b["reference_heldout"] for b in second["branches"]
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
