"""Branched fidelity runs (`harness.run.branches`): each method started from the fp32 reference's
state, its held-out loss k steps on against the reference's.

The smoke sweep (`+exp=convergence_branched_smoke`, a one-layer Llama on real text, FORGE's
kernels in the Triton interpreter) is the runner end to end: FORGE fp32 loaded with torch AdamW's
weights and moments must end each branch where the reference does, within 1e-4 nats (measured:
at most 2.4e-7). A branch that left the moments behind would not (the test fails so): fresh moments
move the weights by a full lr in the first step.
"""

import pytest
import torch

from harness import results
from harness.run import branches, sweep
from harness.run.config import ConfigError, compose_config

TOLERANCE_NATS = 1e-4


@pytest.fixture(scope="module")
def smoke_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("branches")
    path = sweep.run_sweep(
        ["+exp=convergence_branched_smoke", f"results_dir={out}", "sweep.concurrent_points=2"]
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


def test_branches_start_every_n_steps_while_k_remain():
    assert branches.branch_starts(24, 12, 6) == [0, 12]
    assert branches.branch_starts(150, 50, 50) == [0, 50, 100]
    assert branches.branch_starts(5, 50, 5) == [0]


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
