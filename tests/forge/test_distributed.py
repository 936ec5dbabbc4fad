"""`forge.distributed`: tensor-parallel FORGE on CPU, 2 gloo processes, a tiny Llama sharded by
PyTorch's TP plans (through the harness's plan, `harness.run.tensor_parallel`).

One spawn runs every check (the Triton interpreter is slow, so each training run is done once):
rank 0 and rank 1 train the sharded model with FORGE and with torch.optim under the same plan;
rank 0 also trains the unsharded model with FORGE. The parent compares the gathered weights:
TP FORGE == single-process FORGE == TP torch.optim, to fp32 tolerance (fp32 weights and states;
only the order of the sums inside the GEMMs and the all-reduces differs). The same spawn saves
the sharded optimizer states with torch.distributed.checkpoint and loads them into a fresh
optimizer, and checks the clear errors for what FORGE refuses under TP.
"""

from __future__ import annotations

import copy
import os
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.forge.exactness import TRANSFORMER_FP32, assert_close_to_update, update_error

WORLD = 2
STEPS = 3
HPARAMS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _tiny_llama():
    from tests.helpers import tiny_llama

    torch.manual_seed(0)
    return tiny_llama(tie=False)


def _batches():
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, 96, (2, 8), generator=g) for _ in range(STEPS)]
    return [{"input_ids": i, "labels": i} for i in ids]


def _full(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }


def _train(model, batches, opt=None):
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def _sharded(base, mesh, sequence_parallel=False):
    from harness.run.tensor_parallel import parallelize

    return parallelize(copy.deepcopy(base), mesh, sequence_parallel)


def _check_checkpoint(base, mesh, opt, ckpt: str) -> dict:
    """Save the sharded states with DCP, load them into a fresh optimizer: same local states."""
    import forge
    from forge.distributed import load_optimizer, local, save_optimizer

    save_optimizer(opt, ckpt)
    fresh = _sharded(base, mesh)
    opt2 = forge.attach(fresh, "adamw", state_dtype="fp32", **HPARAMS)
    load_optimizer(opt2, ckpt)
    out = {}
    for p, q in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"]):
        name = opt.param_names[p]
        for key, value in opt.state[p].items():
            other = opt2.state[q][key]
            same = torch.equal(local(value), local(other)) if torch.is_tensor(value) else value == other
            out[f"{name}.{key}"] = bool(same)
    return out


class _Block(torch.nn.Module):
    """x + down(gelu(up(norm(x)))): the shape of a transformer MLP block, for sequence parallelism."""

    def __init__(self, dim: int = 16, hidden: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _sequence_parallel(mesh, rank: int) -> dict:
    """A norm under SequenceParallel (its weight and bias get Partial gradients, which FORGE's hook
    all-reduces) between colwise and rowwise linears: TP+SP FORGE vs one-process torch.optim."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    import forge

    torch.manual_seed(2)
    base = _Block()
    xs = [torch.randn(2, 8, 16) for _ in range(STEPS)]  # (batch, sequence, features)
    plan = {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    }
    sp = parallelize_module(copy.deepcopy(base), mesh, plan)
    forge.attach(sp, "adamw", state_dtype="fp32", **HPARAMS)
    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), **HPARAMS)
    for x in xs:
        (sp(x.chunk(WORLD, dim=1)[rank]) ** 2).sum().backward()  # this rank's half of the sequence
        opt.zero_grad()
        (ref(x) ** 2).sum().backward()
        opt.step()
    return {"sp": _full(sp), "ref": _full(ref), "initial": _full(base)}


def _errors(mesh) -> dict[str, str]:
    """What FORGE refuses under TP, and the message it gives."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    import forge

    out = {}
    mesh2 = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "tp"))
    layer = nn.Sequential(nn.Linear(8, 8))
    layer[0].weight = nn.Parameter(
        distribute_tensor(layer[0].weight.detach(), mesh2, [Replicate(), Replicate()])
    )
    try:
        forge.attach(layer, "adamw")
    except NotImplementedError as e:
        out["2d_mesh"] = str(e)
    return out


def _worker(rank: int, tmp: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
    import forge

    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
        base, batches = _tiny_llama(), _batches()
        out: dict = {"initial": _full(base)}

        tp_forge = _sharded(base, mesh)
        opt = forge.attach(tp_forge, "adamw", state_dtype="fp32", **HPARAMS)
        out["fused"] = sorted(
            opt.param_names[p] for p in opt.param_groups[0]["params"] if _is_fused(tp_forge, p)
        )
        out["tp_forge_losses"] = _train(tp_forge, batches)
        out["tp_forge"] = _full(tp_forge)
        out["checkpoint"] = _check_checkpoint(base, mesh, opt, f"{tmp}/dcp")

        from harness.run.tensor_parallel import layout_groups

        tp_torch = _sharded(base, mesh)
        out["tp_torch_losses"] = _train(
            tp_torch,
            batches,
            # for-each, as on a GPU: one multi-tensor kernel per group refuses mixed layouts
            torch.optim.AdamW(layout_groups(tp_torch.parameters()), foreach=True, **HPARAMS),
        )
        out["tp_torch"] = _full(tp_torch)
        out["errors"] = _errors(mesh)
        out["sequence_parallel"] = _sequence_parallel(mesh, rank)

        if rank == 0:
            single = copy.deepcopy(base)
            forge.attach(single, "adamw", state_dtype="fp32", **HPARAMS)
            out["single_losses"] = _train(single, batches)
            out["single"] = _full(single)
            single_torch = copy.deepcopy(base)
            out["single_torch_losses"] = _train(
                single_torch, batches, torch.optim.AdamW(single_torch.parameters(), **HPARAMS)
            )
            out["single_torch"] = _full(single_torch)
        torch.save(out, f"{tmp}/rank{rank}.pt")
    except BaseException:
        Path(f"{tmp}/rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def _is_fused(model, p) -> bool:
    from forge.nn import ForgeLinear

    return any(type(m) is ForgeLinear and m.weight is p for m in model.modules())


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    try:
        mp.spawn(_worker, args=(str(tmp),), nprocs=WORLD, join=True)
    except Exception as e:
        errors = "\n".join(p.read_text() for p in sorted(tmp.glob("*.err")))
        raise AssertionError(f"a TP worker failed:\n{errors or e}") from None
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_every_planned_linear_is_fused(tp_run):
    fused = tp_run[0]["fused"]
    # 7 projections of the one layer + lm_head; embeddings and norms go through the hook.
    assert len(fused) == 8 and "lm_head.weight" in fused, fused


def test_tp_forge_equals_torch_optim_under_the_same_plan(tp_run):
    ours, ref, initial = tp_run[0]["tp_forge"], tp_run[0]["tp_torch"], tp_run[0]["initial"]
    assert ours.keys() == ref.keys()
    for name in ours:
        # Same plan, same collectives: only the order of the sums inside the dW GEMM differs.
        assert_close_to_update(ours[name], ref[name], initial[name], TRANSFORMER_FP32, name)
    assert tp_run[0]["tp_forge_losses"] == pytest.approx(tp_run[0]["tp_torch_losses"], rel=1e-6)


def test_tp_forge_equals_single_process_forge(tp_run):
    ours, ref, initial = tp_run[0]["tp_forge"], tp_run[0]["single"], tp_run[0]["initial"]
    torch_tp, torch_single = tp_run[0]["tp_torch"], tp_run[0]["single_torch"]
    for name in ours:
        # TP changes the order of the sums in dx (an all-reduce of two halves), and AdamW divides
        # by the gradient's own magnitude, so a weight whose gradient nearly cancels moves by up to
        # ~2e-5 (relative) between TP and one process, for torch.optim exactly as for FORGE.
        allowed = max(TRANSFORMER_FP32, 2 * update_error(torch_tp[name], torch_single[name], initial[name]))
        assert_close_to_update(ours[name], ref[name], initial[name], allowed, name)
    assert tp_run[0]["tp_forge_losses"] == pytest.approx(tp_run[0]["single_losses"], rel=1e-5)
    assert ours["lm_head.weight"].ne(initial["lm_head.weight"]).any()  # it trained


def test_ranks_agree(tp_run):
    for name, value in tp_run[0]["tp_forge"].items():
        assert torch.equal(value, tp_run[1]["tp_forge"][name]), name


def test_sharded_states_round_trip_through_dcp(tp_run):
    for rank in tp_run:
        assert rank["checkpoint"] and all(rank["checkpoint"].values()), rank["checkpoint"]


def test_sequence_parallel_norm_gradients_are_reduced(tp_run):
    sp = tp_run[0]["sequence_parallel"]
    for name in sp["ref"]:
        assert_close_to_update(sp["sp"][name], sp["ref"][name], sp["initial"][name], TRANSFORMER_FP32, name)


def test_a_two_dimensional_mesh_is_refused_naming_the_parameter(tp_run):
    message = tp_run[0]["errors"]["2d_mesh"]
    assert "0.weight" in message and "2-D device mesh" in message
