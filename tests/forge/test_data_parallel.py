"""FORGE under data parallelism on CPU: 2 and 4 gloo processes, a tiny Llama under DDP and FSDP2.

One spawn per world size runs every check (the Triton interpreter is slow, so each training run is
done once); the parent compares. What is checked:
* every rule, fp32 weights and states: FORGE under DDP and under FSDP2 against the same wrapper
  with torch.optim, on the same per-rank batches;
* the mean gradient FORGE's reducer applies is DDP's own, bit for bit (2 ranks: a sum of two terms
  has one order);
* bf16 and int8 states: sharding changes nothing (FSDP2 == DDP, bit for bit, 2 ranks), and they
  track fp32 states as on one process;
* the gradients a DDP-wrapped FORGE model holds at once stay within the reducer's bound, a
  bucket's concatenated copy included, counted by weak references to every gradient autograd
  produced and every copy torch.cat made for an all-reduce;
* a taken-over DDP wrapper broadcasts rank 0's buffers before every forward as DDP does (BatchNorm's
  running statistics equal on every rank, and equal to plain DDP's), or not at all with
  broadcast_buffers=False;
* checkpoints: saved and resumed on the same ranks, the run continues bit for bit (2 ranks: DDP and
  FSDP2, fp32 and bf16 weights with stochastic rounding; 4 ranks: DDP, whose gradients' sums depend
  on the bucket order, and FSDP2); a 4-rank FSDP2 checkpoint loads on 2 ranks, an FSDP2 checkpoint
  of 2 ranks on 1 process and a 1-process one on 2 ranks, every tensor whole and equal; a damaged
  shard, or a read that fails on one rank, is refused on every rank with nothing changed;
* FSDP2 over one dimension of a 2 x 2 mesh and the TP plan over the other: FORGE equals torch AdamW;
* what FORGE refuses under data parallelism (DDP's static_graph among it, the wrapper left working),
  and its messages.
"""

from __future__ import annotations

import copy
import re
import shutil
import weakref

import pytest
import torch

from tests.forge.exactness import TRANSFORMER_FP32, assert_close_to_update, near_zero
from tests.forge.ranks import full, full_states, run_on_ranks
from tests.helpers import RULE_CASES, damage_checkpoint, tiny_llama, without_checksums

STEPS = 2  # a first step, and one that reads the states it wrote
RESUME_STEPS, SAVED_AT = 10, 5  # saved at step 5 of 10
# 4 ranks: saved once the reducer has learned its bucket order (after the first backward), and
# resumed for a step, which buckets in the saved order
FOUR_RANK_RESUME_STEPS, FOUR_RANK_SAVED_AT = 3, 2
BUFFER_STEPS = 3
ADAMW = dict(lr=1e-2, weight_decay=0.1)
FOUR_RANK_CASES = ("adamw", "lion")  # with the rest, every rule runs on 2 ranks


def _batches(rank: int, n: int = STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    return [torch.randint(0, 96, (2, 8), generator=g) for _ in range(n)]


def _base(init: int = 0, **config) -> torch.nn.Module:
    torch.manual_seed(init)
    return tiny_llama(**config)


def _wrap(kind: str, model: torch.nn.Module) -> torch.nn.Module:
    """DDP, or FSDP2 as torchtitan applies it (each decoder layer, then the root)."""
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _train(model, batches, opt=None, on_step=None) -> list[float]:
    losses = []
    for i, ids in enumerate(batches):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if on_step is not None:
            on_step(i)
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


# ---------------------------------------------------------------------------------- the rank's work


def _forge_vs_torch(kind: str, base, case: str, batches) -> dict:
    """FORGE and torch.optim under the same wrapper, and where torch's mean gradient was within
    rounding of zero at some step (`tests.forge.exactness.near_zero`: left out of the comparison)."""
    import forge

    rule, hparams = case.split("-")[0], RULE_CASES[case]
    ours, ref = _wrap(kind, copy.deepcopy(base)), _wrap(kind, copy.deepcopy(base))
    forge.attach(ours, rule, state_dtype="fp32", **hparams)
    torch_opt = forge.torch_optimizer(rule, ref.parameters(), **hparams)
    ambiguous: dict[str, torch.Tensor] = {}

    def mark(_):
        for name, p in _inner(ref).named_parameters():
            zero = near_zero(_whole(p.grad))
            ambiguous[name] = ambiguous[name] | zero if name in ambiguous else zero

    return {
        "losses": _train(ours, batches),
        "torch_losses": _train(ref, batches, torch_opt, mark),
        "forge": full(ours),
        "torch": full(ref),
        "ambiguous": ambiguous,
    }


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _reduced_gradients(base, batches) -> dict:
    """The mean gradients FORGE's reducer applied, and DDP's own .grad from the same weights, step
    by step (DDP's model is given FORGE's weights before each of its steps)."""
    import forge

    ours, ref = _wrap("ddp", copy.deepcopy(base)), _wrap("ddp", copy.deepcopy(base))
    opt = forge.attach(ours, "adamw", state_dtype="fp32", **ADAMW)
    names = {p: n for n, p in _inner(ours).named_parameters()}
    applied: list[dict] = [{} for _ in batches]
    step = [0]
    reducer_apply = opt.updates.reducer.apply

    def recording(p, grad):
        applied[step[0]][names[p]] = grad.clone()
        reducer_apply(p, grad)

    opt.updates.reducer.apply = recording
    ddp_grads: list[dict] = []
    for i, ids in enumerate(batches):
        step[0] = i
        ref.module.load_state_dict(ours.module.state_dict())
        ref(input_ids=ids, labels=ids).loss.backward()
        ddp_grads.append({n: p.grad.clone() for n, p in ref.module.named_parameters()})
        ref.zero_grad(set_to_none=True)
        ours(input_ids=ids, labels=ids).loss.backward()
    return {"forge": applied, "ddp": ddp_grads}


def _clipped(base, batches) -> dict:
    """DDP + FORGE with max_grad_norm against DDP + torch AdamW after clip_grad_norm_."""
    import forge

    ours, ref = _wrap("ddp", copy.deepcopy(base)), _wrap("ddp", copy.deepcopy(base))
    opt = forge.attach(ours, "adamw", state_dtype="fp32", max_grad_norm=0.5, **ADAMW)
    torch_opt = torch.optim.AdamW(ref.parameters(), **ADAMW)
    norms = []
    _train(
        ref,
        batches,
        torch_opt,
        lambda i: norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5))),
    )
    forge_norms = []
    _train(ours, batches, on_step=lambda i: forge_norms.append(float(opt.last_grad_norm)))
    return {"norms": norms, "forge_norms": forge_norms, "forge": full(ours), "torch": full(ref)}


def _low_precision(kind: str, base, state_dtype: str, batches) -> dict:
    import forge

    model = _wrap(kind, copy.deepcopy(base))
    opt = forge.attach(model, "adamw", state_dtype=state_dtype, **ADAMW)
    losses = _train(model, batches)
    return {"losses": losses, "weights": full(model), "states": full_states(opt)}


class _GradientBytes:
    """The gradient bytes alive at once during a backward, counted from outside the reducer: every
    gradient autograd produced, from its post-accumulate-grad hook (registered before FORGE's) until
    it is freed, and every tensor torch.cat made that was then all-reduced (a bucket's concatenated
    copy), from its creation until it is freed; on a clock that ticks at every such event."""

    def __init__(self, params):
        import torch.distributed as dist

        self.clock, self.lives = 0, []  # [birth, death, bytes, counted]
        for p in params:
            p.register_post_accumulate_grad_hook(self._gradient)
        self._cat, self._all_reduce = torch.cat, dist.all_reduce

        def cat(*args, **kwargs):
            out = self._cat(*args, **kwargs)
            out._life = self._track(out, counted=False)  # counted once it is all-reduced
            return out

        def all_reduce(tensor, *args, **kwargs):
            if hasattr(tensor, "_life"):
                tensor._life[3] = True
            return self._all_reduce(tensor, *args, **kwargs)

        torch.cat, dist.all_reduce = cat, all_reduce

    def _gradient(self, p) -> None:
        self._track(p.grad, counted=True)

    def _track(self, t, counted: bool) -> list:
        self.clock += 1
        life = [self.clock, None, t.numel() * t.element_size(), counted]
        self.lives.append(life)
        weakref.finalize(t, self._free, life)
        return life

    def _free(self, life) -> None:
        self.clock += 1
        life[1] = self.clock

    def peak(self) -> int:
        """The most bytes alive at once since the last call (then forgotten)."""
        events = sorted(
            [(b, n) for b, d, n, counted in self.lives if counted]
            + [(d, -n) for b, d, n, counted in self.lives if counted and d is not None]
        )
        self.lives = [life for life in self.lives if life[1] is None]
        live = peak = 0
        for _, n in events:
            live += n
            peak = max(peak, live)
        return peak

    def close(self) -> None:
        import torch.distributed as dist

        torch.cat, dist.all_reduce = self._cat, self._all_reduce


def _linear_stack() -> torch.nn.Module:
    """Eight equal bias-free layers: with a bucket of two weights, every bucket is concatenated."""
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(16, 16, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _gradient_window(rank: int) -> dict:
    """DDP + FORGE: the gradient bytes alive at once, by the reducer's count and by `_GradientBytes`,
    step by step, with the reducer's bound. A two-layer Llama in 4 KiB buckets (every weight its own,
    the norms' vectors a few to a bucket), and `_linear_stack` in buckets of two weights."""
    import forge
    from forge.data_parallel import MAX_IN_FLIGHT

    inputs = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(rank))
    cases = {
        "llama": (
            _base(num_hidden_layers=2),
            4096,
            _batches(rank),
            lambda m, ids: m(input_ids=ids, labels=ids),
        ),
        "stack": (_linear_stack(), 2 * 16 * 16 * 4, list(inputs), lambda m, x: m(x).pow(2).mean()),
    }
    out = {}
    for name, (base, cap, batches, loss_of) in cases.items():
        model = _wrap("ddp", base)
        names = {p: n for n, p in model.module.named_parameters()}
        counter = _GradientBytes(names)
        opt = forge.attach(model, "adamw", state_dtype="fp32", bucket_cap_mb=cap / 2**20, **ADAMW)
        counted, reducer = [], []
        try:
            for batch in batches:
                opt.updates.reducer.peak_bytes = 0
                loss = loss_of(model, batch)
                (loss if torch.is_tensor(loss) else loss.loss).backward()
                counted.append(counter.peak())
                reducer.append(opt.updates.reducer.peak_bytes)
        finally:
            counter.close()
        out[name] = {
            "counted": counted,
            "reducer": reducer,
            "cap": cap,
            "largest": max(p.numel() * p.element_size() for p in names),
            "bound": getattr(opt.updates.reducer, "bound_bytes", None),
            "in_flight": MAX_IN_FLIGHT,
            "layer": sum(p.numel() * p.element_size() for p, n in names.items() if ".layers.0." in n),
            "total": sum(p.numel() * p.element_size() for p in names),
            "buckets": [len(b) for b in opt.updates.reducer.buckets],
        }
    return out


def _resume(
    kind: str, weights: torch.dtype, options: dict, rank: int, tmp, steps: int = RESUME_STEPS,
    saved_at: int = SAVED_AT,
) -> dict:  # fmt: skip
    """A straight run of `steps` saved at `saved_at`, and a run resumed from that checkpoint in a
    model built from other weights (everything must come from the checkpoint). Also every tensor
    whole as it was saved, for a load on another number of ranks."""
    import forge
    import forge.checkpoint as ckpt

    batches = _batches(rank, steps)
    directory = tmp / f"resume-{kind}-{str(weights)[6:]}"
    model = _wrap(kind, _base(0).to(weights))
    opt = forge.attach(model, "adamw", **options, **ADAMW)
    saved = {}

    def save(i):
        if i + 1 == saved_at:
            ckpt.save(directory, model, opt, step=saved_at)
            saved.update(weights=full(model), states=full_states(opt), steps=_steps(opt))

    straight = _train(model, batches, on_step=save)
    resumed = _wrap(kind, _base(1).to(weights))
    opt2 = forge.attach(resumed, "adamw", **{**options, "seed": 7}, **ADAMW)
    start = ckpt.load(directory, resumed, opt2).step
    orders = [opt.state_dict().get("bucket_order"), opt2.state_dict().get("bucket_order")]
    if kind == "ddp":  # the reducer's learned order: ForgeOptimizer's state dict carries it too
        fresh = forge.attach(_wrap(kind, _base(2).to(weights)), "adamw", **options, **ADAMW)
        fresh.load_state_dict(opt.state_dict())
        orders.append(fresh.state_dict().get("bucket_order"))
    return {
        "orders": orders,
        "straight": straight[start:],
        "resumed": _train(resumed, batches[start:]),
        "resumed_steps": steps - saved_at,
        "same_weights": _equal(full(model), full(resumed)),
        "same_states": _equal(full_states(opt), full_states(opt2)),
        "same_steps": _steps(opt) == _steps(opt2),
        "differ": sorted(k for k, v in full(model).items() if not torch.equal(v, full(resumed)[k])),
        "saved": saved,
        "seed": opt.seed,
    }


def _steps(opt) -> dict[str, int]:
    return {opt.param_names[p]: int(state["step"]) for p, state in opt.state.items()}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _save_sharded_for_one_process(tmp, rank: int) -> dict:
    """An FSDP2 run of 2 ranks saved at step 2, and its whole tensors, for the parent to load."""
    import forge
    import forge.checkpoint as ckpt

    model = _wrap("fsdp2", _base(0))
    opt = forge.attach(model, "adamw", state_dtype="int8", **ADAMW)
    _train(model, _batches(rank, 2))
    ckpt.save(tmp / "sharded", model, opt, step=2)
    return {"weights": full(model), "states": full_states(opt)}


def _load_one_process_checkpoint(rank: int, world: int, tmp, checkpoint) -> dict:
    """A one-process checkpoint, loaded into FSDP2 on 2 ranks."""
    import forge
    import forge.checkpoint as ckpt

    model = _wrap("fsdp2", _base(3))
    opt = forge.attach(model, "adamw", state_dtype="int8", **ADAMW)
    ckpt.load(checkpoint, model, opt)
    return {"weights": full(model), "states": full_states(opt)}


def _buffers(rank: int) -> dict:
    """A Linear + BatchNorm model under DDP, each rank its own data, trained BUFFER_STEPS steps by
    FORGE (SGD, lr=0: the weights stay put) and by plain DDP with torch's SGD: the buffers each
    forward starts from (after DDP's broadcast, if any), and where each run ends, with
    broadcast_buffers on and off."""
    import forge

    g = torch.Generator().manual_seed(2000 + rank)
    batches = [torch.randn(6, 4, generator=g) * (1 + rank) for _ in range(BUFFER_STEPS)]
    out = {}
    for broadcast in (True, False):
        for who in ("forge", "ddp"):
            torch.manual_seed(0)
            base = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.BatchNorm1d(8))
            model = torch.nn.parallel.DistributedDataParallel(base, broadcast_buffers=broadcast)
            if who == "forge":
                forge.attach(model, "sgd", lr=0.0)
            else:
                opt = torch.optim.SGD(model.parameters(), lr=0.0)
            starts: list[dict] = []
            base[1].register_forward_pre_hook(
                lambda m, args, starts=starts: starts.append({n: b.clone() for n, b in m.named_buffers()})
            )
            for x in batches:
                model(x).pow(2).mean().backward()
                if who == "ddp":
                    opt.step()
                    opt.zero_grad()
            out[broadcast, who] = {"starts": starts, "end": {n: b.clone() for n, b in base.named_buffers()}}
    return out


def _damaged(rank: int, tmp, checkpoint) -> dict:
    """The 2-rank FSDP2 checkpoint `checkpoint`, copied and damaged in rank 1's shard without a change
    of size, loaded into another FSDP2 run on every rank: "inside", bytes flipped in a tensor's data
    (the manifest's checksums catch it before DCP reads); "read", a record's header damaged in a copy
    whose manifest keeps no checksums (as written before checksums were kept), so DCP's read fails on
    rank 1 after the other tensors are read. Per case: the error each rank raised, and whether every
    tensor, step, param group, seed and RNG state it holds is as it was."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException

    import forge
    import forge.checkpoint as ckpt

    out = {}
    for case in ("inside", "read"):
        copy_of = tmp / f"damaged-{case}"
        if rank == 0:
            shutil.copytree(checkpoint, copy_of)
            # "inside": the middle of rank 1's largest tensor; "read": the header of its last record
            where = ("largest", "middle") if case == "inside" else ("last", "header")
            damage_checkpoint(copy_of, *where, files="__1_")
            if case == "read":
                without_checksums(copy_of)
        dist.barrier()
        model = _wrap("fsdp2", _base(4))
        opt = forge.attach(model, "adamw", state_dtype="int8", seed=11, **ADAMW)
        _train(model, _batches(rank, 1))
        before = _held(model, opt)
        try:
            ckpt.load(copy_of, model, opt)
            error = None
        except (Exception, CheckpointException) as e:
            error = (type(e).__name__, str(e))
        out[case] = {"error": error, "unchanged": _same_held(before, _held(model, opt))}
    return out


def _held(model, opt) -> dict:
    """Everything a load may change, as copies: weights, buffers, states, steps, groups, seeds, RNG."""
    return {
        "weights": full(model),
        "buffers": {n: b.clone() for n, b in _inner(model).named_buffers()},
        "states": full_states(opt),
        "steps": _steps(opt),
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "seed": opt.seed,
        "rng": torch.get_rng_state(),
    }


def _same_held(a: dict, b: dict) -> bool:
    tensors = ("weights", "buffers", "states")
    return (
        all(_equal(a[k], b[k]) for k in tensors)
        and torch.equal(a["rng"], b["rng"])
        and all(a[k] == b[k] for k in ("steps", "groups", "seed"))
    )


def _load_resharded(rank: int, checkpoints) -> dict:
    """The 4-rank FSDP2 run's checkpoint, loaded on these 2 ranks into a model of other weights."""
    import forge
    import forge.checkpoint as ckpt

    model = _wrap("fsdp2", _base(6))
    opt = forge.attach(model, "adamw", state_dtype="fp32", seed=3, **ADAMW)
    step = ckpt.load(checkpoints, model, opt).step
    return {"step": step, "weights": full(model), "states": full_states(opt), "steps": _steps(opt),
            "seed": opt.seed}  # fmt: skip


def _static_graph(rank: int) -> dict:
    """forge.attach on DDP(static_graph=True): its message, and the wrapper left as DDP built it
    (still reducing gradients itself: equal on every rank after a backward of each rank's data)."""
    import forge
    from forge.data_parallel import _NoReducer
    from forge.wiring import ATTACHED

    model = torch.nn.parallel.DistributedDataParallel(_base(), static_graph=True)
    try:
        forge.attach(model, "adamw")
    except RuntimeError as e:
        ids = _batches(rank, 1)[0]
        model(input_ids=ids, labels=ids).loss.backward()
        return {
            "message": str(e),
            "untouched": model.require_backward_grad_sync
            and not isinstance(model.reducer, _NoReducer)
            and getattr(model.module, ATTACHED, None) is None,
            "grads": {n: p.grad.clone() for n, p in model.module.named_parameters()},
        }
    return {"message": None}


def _refusals() -> dict[str, str]:
    import forge

    out = {}
    for name, kind, options in (
        ("capturable", "ddp", dict(capturable=True)),
        ("update_stream", "fsdp2", dict(update_stream=True)),
        ("clip_fsdp2", "fsdp2", dict(max_grad_norm=1.0)),
        ("fp8", "ddp", dict(fp8="tensorwise")),
    ):
        try:
            forge.attach(_wrap(kind, _base()), "adamw", **options)
        except (ValueError, NotImplementedError, RuntimeError) as e:
            out[name] = str(e)
    model = _wrap("ddp", _base())
    opt = forge.attach(model, "adamw")
    try:
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    except RuntimeError as e:
        out["add_param_group"] = str(e)
    return out


MUON = dict(lr=0.02, momentum=0.95, weight_decay=0.1)
MUON_FALLBACK = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)


def _muon_under_ddp(rank: int) -> dict:
    """FORGE Muon (hidden matrices) with AdamW (the rest) under DDP against torch.optim.Muon and
    AdamW under DDP on the same split and batches, two steps (`tests/forge/test_muon.py` says why
    two); and FSDP2's sharded weights, which Muon cannot orthogonalize on one rank, refused."""
    import forge

    base = _base()
    ours, ref = _wrap("ddp", copy.deepcopy(base)), _wrap("ddp", copy.deepcopy(base))
    forge.attach(ours, "muon", state_dtype="fp32", fallback="adamw", fallback_options=MUON_FALLBACK, **MUON)
    hidden, rest = forge.muon.hidden_matrices(_inner(ref))
    muon, adamw = torch.optim.Muon(hidden, **MUON), torch.optim.AdamW(rest, **MUON_FALLBACK)
    batches = _batches(rank, 2)
    for ids in batches:
        ref(input_ids=ids, labels=ids).loss.backward()
        for opt in (muon, adamw):
            opt.step()
            opt.zero_grad(set_to_none=True)
    _train(ours, batches)
    sharded = _wrap("fsdp2", _base())
    try:
        forge.attach(sharded, "muon", fallback="adamw")
        refusal = None
    except ValueError as e:
        refusal = str(e)
    return {"forge": full(ours), "torch": full(ref), "fsdp2_refusal": refusal}


def _two_ranks(rank: int, world: int, tmp, four_rank_checkpoints) -> dict:
    import forge
    from forge.data_parallel import SHARDS

    base, batches = _base(), _batches(rank)
    out: dict = {"initial": full(base)}
    probe = _wrap("fsdp2", copy.deepcopy(base))
    out["fsdp2_kind"] = forge.attach(probe, "sgd", lr=0.1).data_parallel.kind == SHARDS
    out["exact"] = {
        (kind, case): _forge_vs_torch(kind, base, case, batches)
        for kind in ("ddp", "fsdp2")
        for case in RULE_CASES
    }
    out["gradients"] = _reduced_gradients(base, batches)
    out["low_precision"] = {
        (kind, dtype): _low_precision(kind, base, dtype, _batches(rank, 6))
        for kind in ("ddp", "fsdp2")
        for dtype in ("fp32", "bf16", "int8")
    }
    out["clipped"] = _clipped(base, batches)
    out["window"] = _gradient_window(rank)
    out["buffers"] = _buffers(rank)
    out["resume"] = {
        (kind, name): _resume(kind, weights, options, rank, tmp)
        for kind in ("ddp", "fsdp2")
        for name, weights, options in (
            ("fp32", torch.float32, dict(state_dtype="fp32")),
            ("bf16-sr", torch.bfloat16, dict(state_dtype="bf16", stochastic_rounding=True)),
        )
    }
    out["sharded"] = _save_sharded_for_one_process(tmp, rank)
    out["damaged"] = _damaged(rank, tmp, tmp / "sharded" / "step-00000002")
    out["resharded"] = _load_resharded(rank, four_rank_checkpoints)
    out["refusals"] = _refusals()
    out["static_graph"] = _static_graph(rank)
    out["muon"] = _muon_under_ddp(rank)
    return out


def _fsdp2_with_tensor_parallelism(base) -> dict:
    """A 2 x 2 mesh: the TP plan over one dimension, fully_shard over the other (FSDP2 + TP), FORGE
    against torch AdamW on the same layout and batches (one batch per data-parallel rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import forge
    from harness.run.tensor_parallel import parallelize

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    def build():
        model = parallelize(copy.deepcopy(base), mesh["tp"])
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        return fully_shard(model, mesh=mesh["dp"])

    ours, ref = build(), build()
    forge.attach(ours, "adamw", state_dtype="fp32", **ADAMW)
    batches = _batches(mesh.get_coordinate()[0])
    return {
        "losses": _train(ours, batches),
        "torch_losses": _train(ref, batches, torch.optim.AdamW(ref.parameters(), foreach=False, **ADAMW)),
        "forge": full(ours),
        "torch": full(ref),
    }


def _four_ranks(rank: int, world: int, tmp) -> dict:
    base, batches = _base(), _batches(rank)
    fp32 = dict(state_dtype="fp32")
    return {
        "initial": full(base),
        "exact": {
            (kind, case): _forge_vs_torch(kind, base, case, batches)
            for kind in ("ddp", "fsdp2")
            for case in FOUR_RANK_CASES
        },
        "fsdp2_tp": _fsdp2_with_tensor_parallelism(base),
        "resume": {
            kind: _resume(kind, torch.float32, fp32, rank, tmp, FOUR_RANK_RESUME_STEPS, FOUR_RANK_SAVED_AT)
            for kind in ("ddp", "fsdp2")
        },
    }


# ---------------------------------------------------------------------------------- the checks


@pytest.fixture(scope="module")
def four_and_tmp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp4")
    return run_on_ranks(_four_ranks, 4, tmp), tmp


@pytest.fixture(scope="module")
def four(four_and_tmp):
    return four_and_tmp[0]


@pytest.fixture(scope="module")
def two(tmp_path_factory, four_and_tmp):
    """The 2-rank spawn; it also loads the 4-rank FSDP2 run's checkpoint (resharded 4 -> 2)."""
    tmp = tmp_path_factory.mktemp("dp2")
    return run_on_ranks(_two_ranks, 2, tmp, four_and_tmp[1] / "resume-fsdp2-float32"), tmp


def _assert_forge_matches_torch(runs: list[dict], cases) -> None:
    initial = runs[0]["initial"]
    for (kind, case), run in runs[0]["exact"].items():
        assert case in cases
        for name, w in run["forge"].items():
            # The first step's mean gradient is the same on both sides; the update's own arithmetic
            # (the element-wise kernel's order of the rule's terms against torch.optim's) moves the
            # weights by an ulp, and the later gradients by as much as one process's tests allow.
            assert_close_to_update(
                w,
                run["torch"][name],
                initial[name],
                TRANSFORMER_FP32,
                f"{kind} {case} {name}",
                near_zero_grad=run["ambiguous"][name],
            )
        assert run["losses"] == pytest.approx(run["torch_losses"], rel=1e-6), (kind, case)
        assert run["forge"]["lm_head.weight"].ne(initial["lm_head.weight"]).any(), (kind, case)
    for other in runs[1:]:  # every rank holds the same model
        for key, run in other["exact"].items():
            assert _equal(run["forge"], runs[0]["exact"][key]["forge"]), key


def test_every_rule_under_ddp_and_fsdp2_equals_torch_optim_two_ranks(two):
    runs, _ = two
    assert runs[0]["fsdp2_kind"]
    _assert_forge_matches_torch(runs, RULE_CASES)


def test_every_checked_rule_equals_torch_optim_four_ranks(four):
    _assert_forge_matches_torch(four, FOUR_RANK_CASES)


def test_fsdp2_composes_with_tensor_parallelism(four):
    run, initial = four[0]["fsdp2_tp"], four[0]["initial"]
    for name, w in run["forge"].items():
        # the same layout and collectives on both sides: the update's own arithmetic differs
        assert_close_to_update(w, run["torch"][name], initial[name], TRANSFORMER_FP32, name)
    assert run["losses"] == pytest.approx(run["torch_losses"], rel=1e-6)


def test_the_reduced_gradient_is_ddps_bit_for_bit(two):
    grads = two[0][0]["gradients"]
    assert len(grads["forge"]) == STEPS
    for step, (ours, theirs) in enumerate(zip(grads["forge"], grads["ddp"])):
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), (step, name)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_sharding_changes_nothing_and_low_precision_states_track_fp32(two, state_dtype):
    runs = two[0][0]["low_precision"]
    ddp, fsdp2 = runs["ddp", state_dtype], runs["fsdp2", state_dtype]
    # The same mean gradients (a sum of two terms), the same update on each row: FSDP2's shards
    # hold whole rows of every weight, so even int8 scale groups are the same.
    assert ddp["losses"] == fsdp2["losses"]
    assert _equal(ddp["weights"], fsdp2["weights"]) and _equal(ddp["states"], fsdp2["states"])
    fp32 = runs["ddp", "fp32"]["losses"]
    assert ddp["losses"][-1] < ddp["losses"][0]
    # as on one process (tests/forge/test_low_precision.py): within 5% of fp32 states' loss
    assert max(abs(a - b) / a for a, b in zip(fp32, ddp["losses"])) < 0.05


def test_ddp_clips_the_global_norm_of_the_mean_gradient(two):
    runs, _ = two
    clipped, initial = runs[0]["clipped"], runs[0]["initial"]
    assert min(clipped["norms"]) > 0.5  # every step clipped
    assert clipped["forge_norms"] == pytest.approx(clipped["norms"], rel=1e-6)
    for name, w in clipped["forge"].items():
        assert_close_to_update(w, clipped["torch"][name], initial[name], TRANSFORMER_FP32, name)


def _stated_bound(window: dict) -> int:
    """docs/distributed.md's bound: (MAX_IN_FLIGHT + 1) buckets, and a bucket's copy besides."""
    return (window["in_flight"] + 1) * max(window["cap"], window["largest"]) + window["cap"]


def test_ddp_holds_a_bounded_window_of_gradients(two):
    window = two[0][0]["window"]["llama"]
    assert len(window["buckets"]) > 10  # 4 KiB buckets: every weight its own
    assert window["bound"] == _stated_bound(window)
    counted, reducer = window["counted"], window["reducer"]
    # The first backward launches buckets in the parameters' reverse order, where a norm weight comes
    # before the projections of its layer that arrive first: up to a layer's gradients wait for it.
    assert counted[0] <= window["bound"] + window["layer"], window
    for step in range(1, len(counted)):  # then in the order they arrive: within the bound
        assert counted[step] <= window["bound"] and reducer[step] <= window["bound"], (step, window)
        assert counted[step] < 0.3 * window["total"], (step, window)


def test_the_window_counts_each_buckets_concatenated_copy(two):
    """Buckets of two equal weights: when the third bucket is concatenated, two buckets are in
    flight and the third's gradients and their copy are alive, (MAX_IN_FLIGHT + 2) buckets: the
    stated bound exactly, one bucket above (MAX_IN_FLIGHT + 1) buckets."""
    window = two[0][0]["window"]["stack"]
    assert set(window["buckets"]) == {2} and window["cap"] >= window["largest"]
    assert window["bound"] == _stated_bound(window)
    without_copy = (window["in_flight"] + 1) * window["cap"]
    for step, (counted, reducer) in enumerate(zip(window["counted"], window["reducer"])):
        assert reducer == counted, (step, window)  # the reducer's own count agrees, copies included
        assert without_copy < counted <= window["bound"], (step, window)


def test_ddp_broadcasts_buffers_before_every_forward_as_ddp_does(two):
    runs = [rank["buffers"] for rank in two[0]]
    for broadcast in (True, False):
        for rank in runs:  # FORGE's wrapper keeps the buffers exactly as plain DDP's
            forge, ddp = rank[broadcast, "forge"], rank[broadcast, "ddp"]
            assert len(forge["starts"]) == BUFFER_STEPS
            for a, b in zip(forge["starts"] + [forge["end"]], ddp["starts"] + [ddp["end"]]):
                assert _equal(a, b), broadcast
    for step in range(BUFFER_STEPS):  # every forward starts from rank 0's running statistics...
        assert _equal(runs[0][True, "forge"]["starts"][step], runs[1][True, "forge"]["starts"][step]), step
    # ...and without the broadcast each rank keeps its own, updated from its own data
    assert not _equal(runs[0][False, "forge"]["end"], runs[1][False, "forge"]["end"])


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
@pytest.mark.parametrize("weights", ["fp32", "bf16-sr"])
def test_a_resumed_two_rank_run_continues_bit_for_bit(two, kind, weights):
    for rank in two[0]:
        run = rank["resume"][kind, weights]
        assert len(run["resumed"]) == run["resumed_steps"] == RESUME_STEPS - SAVED_AT
        assert run["resumed"] == run["straight"]
        assert run["same_weights"] and run["same_states"] and run["same_steps"], run["differ"]


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_a_resumed_four_rank_run_continues_bit_for_bit(four, kind):
    """With 4 ranks the all-reduce's sums depend on where a gradient sits in its bucket: the resumed
    reducer must bucket its first backward in the order the saved run had learned."""
    for rank in four:
        run = rank["resume"][kind]
        assert len(run["resumed"]) == run["resumed_steps"] == FOUR_RANK_RESUME_STEPS - FOUR_RANK_SAVED_AT
        assert run["resumed"] == run["straight"], kind
        assert run["same_weights"] and run["same_states"] and run["same_steps"], (kind, run["differ"])
        # the learned order, restored by forge.checkpoint and by load_state_dict alike
        order, *restored = run["orders"]
        assert (order is not None) == (kind == "ddp") and restored == [order] * len(restored)


def test_a_four_rank_fsdp2_checkpoint_loads_on_two_ranks(two, four):
    saved = four[0]["resume"]["fsdp2"]["saved"]
    for rank in two[0]:
        loaded = rank["resharded"]
        assert loaded["step"] == FOUR_RANK_SAVED_AT and loaded["seed"] == four[0]["resume"]["fsdp2"]["seed"]
        assert _equal(loaded["weights"], saved["weights"]) and _equal(loaded["states"], saved["states"])
        assert loaded["steps"] == saved["steps"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("inside", r"__1_\d+\.distcp has its saved size but not its saved CRC-32.*earlier checkpoint"),
        ("read", r"could not be read \(\w+ on rank 1;.*Nothing was loaded.*earlier one"),
    ],
    ids=["inside", "read"],
)
def test_a_damaged_shard_is_refused_on_every_rank_with_nothing_changed(two, case, message):
    for rank in two[0]:
        damaged = rank["damaged"][case]
        assert damaged["error"] is not None, f"{case}: the damaged checkpoint was loaded"
        kind, text = damaged["error"]
        assert kind == "CheckpointError", text[:2000]
        assert re.search(message, text, re.S), text
        assert damaged["unchanged"], case


def test_an_fsdp2_checkpoint_loads_on_one_process_and_back(two):
    import forge
    import forge.checkpoint as ckpt

    runs, tmp = two
    model = _base(5)
    opt = forge.attach(model, "adamw", state_dtype="int8", **ADAMW)
    assert ckpt.load(tmp / "sharded", model, opt).step == 2
    saved = runs[0]["sharded"]
    assert _equal(full(model), saved["weights"]) and _equal(full_states(opt), saved["states"])
    # and the other way: this one process's checkpoint onto 2 ranks of FSDP2
    checkpoint = ckpt.save(tmp / "one-process", model, opt, step=2)
    (tmp / "back").mkdir()
    back = run_on_ranks(_load_one_process_checkpoint, 2, tmp / "back", checkpoint)
    for rank in back:
        assert _equal(rank["weights"], saved["weights"]) and _equal(rank["states"], saved["states"])


def test_what_data_parallelism_refuses_says_what_to_do(two):
    messages = two[0][0]["refusals"]
    assert "capturable=True under data-parallel replicas" in messages["capturable"]
    assert "update_stream=True under FSDP2" in messages["update_stream"]
    assert "max_grad_norm under FSDP2" in messages["clip_fsdp2"] and "DDP" in messages["clip_fsdp2"]
    assert "fp8 under data parallelism" in messages["fp8"]
    assert "nothing was added" in messages["add_param_group"]


def test_ddp_static_graph_is_refused_and_the_wrapper_left_working(two):
    runs = [rank["static_graph"] for rank in two[0]]
    for run in runs:
        assert run["message"] is not None, "forge.attach took over DDP(static_graph=True)"
        assert "static_graph=True" in run["message"] and "DistributedDataParallel(model)" in run["message"]
        assert run["untouched"]
    assert _equal(runs[0]["grads"], runs[1]["grads"])  # DDP still reduced them itself


def test_muon_under_ddp_equals_torchs_and_fsdp2_is_refused(two):
    """Muon under DDP orthogonalizes each reduced gradient's update whole on every rank: as torch's
    Muon beside AdamW under DDP, and the same on both ranks; FSDP2's shards are refused, saying why."""
    runs = [rank["muon"] for rank in two[0]]
    for run in runs:
        for name, w in run["forge"].items():
            ref = run["torch"][name]
            assert float((w - ref).norm() / ref.norm()) <= 2e-3, name
        assert "sharded across ranks" in run["fsdp2_refusal"]
    assert _equal(runs[0]["forge"], runs[1]["forge"])
