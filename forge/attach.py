"""forge.attach / forge.detach: put FORGE on an existing model, and take it off again.

`attach(model, rule, params=None, **hparams)` builds a `ForgeOptimizer` over `params` (by default
every trainable parameter, one group), then:

* turns every plain `nn.Linear` whose weight it trains into a `ForgeLinear` (the same module
  object, its class swapped), so that weight is updated inside the fused dW kernel;
* hooks every other trained parameter (biases, embeddings, norms, and any weight shared between
  modules, such as tied input and output embeddings, whose gradient has two producers) with a
  post-accumulate-grad hook that updates it with the element-wise kernel and frees its gradient.

Parameters left out of `params` are not touched: they keep ordinary gradients for another optimizer.
Parameters added later with `optimizer.add_param_group` are fused or hooked the same way (`wire`).
`detach(model)` restores plain `nn.Linear` classes and removes the hooks; the weights stay as trained.

Tensor parallelism (DTensor weights from `parallelize_module`'s colwise and rowwise plans, sequence
parallel included) is supported: see `forge.distributed` for what runs on each rank and why it is exact.

Data parallelism: a DDP-wrapped model (or a plain one with `process_group=`) and a model sharded by
FSDP2's `fully_shard` train with every gradient reduced over the ranks before its update, from
post-accumulate-grad hooks; no nn.Linear is fused then, since the mean gradient is not a rank's own
(`forge.data_parallel` says how and what it costs).

Refused, with what to do instead: nn.DataParallel and FSDP1; tensor-parallel DTensors on meshes of
more than one dimension outside FSDP2; attaching twice.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable

import torch
from torch import nn

from forge import data_parallel as dp
from forge.distributed import linear_layout
from forge.nn import ForgeLinear
from forge.optim import ForgeOptimizer

_ATTR = "_forge_optimizer"


def attach(
    model: nn.Module,
    rule: str = "adamw",
    params: Iterable | None = None,
    *,
    state_dtype: str = "bf16",
    stochastic_rounding: bool = True,
    seed: int = 0,
    int8_group: int = 64,
    max_grad_norm: float | None = None,
    norm_type: float = 2.0,
    master_weights: str | None = None,
    fp8: str | None = None,
    fp8_skip: Iterable[str] = ("lm_head",),
    process_group=None,
    bucket_cap_mb: float = dp.DEFAULT_BUCKET_CAP_MB,
    **hparams,
) -> ForgeOptimizer:
    """Train `model` with FORGE: every backward updates its parameters in place. Returns the optimizer.
    `max_grad_norm`: clip the global gradient norm (of `norm_type`) as clip_grad_norm_ would, exactly
    (`forge.clip`); None: no clipping. `master_weights`: "bf16+sr" (stochastic rounding), "bf16"
    (round to nearest) or "bf16+kahan" (a bf16 residual per weight, 2 bytes a parameter: the
    update keeps about 16 significant bits); None: as `stochastic_rounding` says. `fp8`: "tensorwise"
    runs the forward, dX and fused dW GEMMs of every fused linear layer in FP8 (`forge.fp8`), but
    for layers whose dimensions are not multiples of 16 and those whose module name ends with a
    name in `fp8_skip` (by default the output projection, kept in bf16 as FP8 recipes do); None:
    bf16 (or the weights' dtype) GEMMs. `process_group`: train data-parallel replicas over it, every
    gradient all-reduced in buckets of `bucket_cap_mb` MiB before its update (a DDP-wrapped model
    gives its own group; FSDP2 needs none); parameters and buffers are broadcast from its first
    rank first, as DDP does."""
    _check_fp8_options(fp8, max_grad_norm)
    target = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if getattr(target, _ATTR, None) is not None:
        raise RuntimeError(
            "FORGE is already attached to this model; call forge.detach(model) before attaching again"
        )
    model, parallel = dp.resolve(model, process_group, bucket_cap_mb)  # a DDP wrapper: taken over here
    if parallel is not None and fp8 is not None:
        raise ValueError(
            "fp8 under data parallelism: FP8 runs FORGE's fused GEMMs, and data-parallel training reduces "
            "each gradient instead of fusing it. Leave fp8=None, or train FP8 on one GPU or under tensor "
            "parallelism."
        )
    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    names = {p: n for n, p in model.named_parameters(remove_duplicate=False)}
    optimizer = ForgeOptimizer.__new__(ForgeOptimizer)
    optimizer.param_names = names
    optimizer._owner = weakref.ref(model)  # for add_param_group after attach (`wire`)
    optimizer.fp8, optimizer.fp8_skip = fp8, tuple(fp8_skip)  # read by `_fuse_linears`, also in `wire`
    ForgeOptimizer.__init__(
        optimizer,
        params,
        rule,
        state_dtype=state_dtype,
        stochastic_rounding=stochastic_rounding,
        seed=seed,
        int8_group=int8_group,
        max_grad_norm=max_grad_norm,
        norm_type=norm_type,
        master_weights=master_weights,
        data_parallel=parallel,
        **hparams,
    )
    trained = {p for g in optimizer.param_groups for p in g["params"]}
    fused = _fuse_linears(model, optimizer, trained, names) if parallel is None else set()
    optimizer._hooks = [p.register_post_accumulate_grad_hook(_make_hook(optimizer)) for p in trained - fused]
    setattr(model, _ATTR, optimizer)
    return optimizer


def detach(model: nn.Module) -> None:
    """Take FORGE off `model`: plain nn.Linear modules again, hooks removed, weights kept. (A DDP
    wrapper FORGE took over keeps its gradient synchronization off: wrap the model again to train
    it with another optimizer.)"""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    optimizer = getattr(model, _ATTR, None)
    if optimizer is None:
        raise RuntimeError("FORGE is not attached to this model")
    for module in model.modules():
        if type(module) is ForgeLinear:
            module.__class__ = nn.Linear
            for attr in (
                "_forge_optimizer",
                "_forge_name",
                "_forge_handle",
                "_forge_index",
                "_forge_states",
                "_forge_marker",
                "_forge_fp8",
            ):
                module.__dict__.pop(attr, None)
    for handle in optimizer._hooks:
        handle.remove()
    optimizer._hooks = []
    model.__dict__.pop(_ATTR, None)  # already gone where the model is itself a fused nn.Linear


def attached_model(optimizer: ForgeOptimizer) -> nn.Module:
    """The model `optimizer` was attached to, or a RuntimeError saying why there is none now."""
    model = optimizer._owner()
    if model is None or getattr(model, _ATTR, None) is not optimizer:
        raise RuntimeError(
            "this FORGE optimizer is no longer attached to its model (forge.detach, or the model is "
            "gone), so parameters added to it would never be updated. Call forge.attach(model, rule, "
            "params=[...]) with every group instead."
        )
    return model


def wire(optimizer: ForgeOptimizer, params: list) -> None:
    """Make `params`, new in `optimizer`, train in every backward from now on. Attached to a model:
    the weights of its plain nn.Linear modules are fused (their class swapped, as attach does), the
    rest hooked. Built directly (`ForgeOptimizer(model.parameters(), ...)`): no module is known, so
    every parameter, nn.Linear weights included, is hooked and updated by the element-wise kernel
    from its materialized gradient, the same step without the fused kernel's memory saving (use
    forge.attach(model, ...) for that)."""
    fused = set()
    if optimizer._owner is not None and optimizer.data_parallel is None:
        model = attached_model(optimizer)
        fused = _fuse_linears(model, optimizer, set(params), optimizer.param_names)
    hook = _make_hook(optimizer)
    optimizer._hooks += [p.register_post_accumulate_grad_hook(hook) for p in params if p not in fused]


def _fuse_linears(model: nn.Module, optimizer: ForgeOptimizer, trained: set, names: dict) -> set:
    """Swap eligible nn.Linear modules to ForgeLinear; return the weights now fused."""
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    fused = set()
    for module_name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if type(module) is not nn.Linear or w is None or w not in trained or uses[id(w)] != 1:
            continue
        if linear_layout(names.get(w, "weight"), w) == "hook":
            continue  # a replicated DTensor weight: its gradient may need a reduction, the hook does it
        module._forge_fp8 = _runs_in_fp8(optimizer, module_name, w)
        module.__class__ = ForgeLinear
        module._forge_optimizer = optimizer
        module._forge_name = names.get(w, "weight")
        # what torch.compile's ops take in place of the optimizer (`forge.ops`): plain attributes of
        # the module, which Dynamo reads as constants and graph inputs
        module._forge_handle, module._forge_index = optimizer.handle, optimizer._index[w]
        module._forge_states = optimizer.op_tensors(w)
        module._forge_marker = torch.empty(0, device=w.device)  # torch 2.11's op (`forge.ops`) mutates it
        fused.add(w)
    return fused


def _check_fp8_options(fp8: str | None, max_grad_norm: float | None) -> None:
    from forge.fp8 import check_recipe

    check_recipe(fp8)
    if fp8 is not None and max_grad_norm is not None:
        raise ValueError(
            "fp8 with max_grad_norm is not supported: FORGE's clipping takes each layer's norm from bf16 "
            "operands. Clip with bf16 GEMMs (leave fp8=None), or train FP8 without max_grad_norm."
        )


def _runs_in_fp8(optimizer: ForgeOptimizer, module_name: str, weight: torch.Tensor) -> bool:
    """Whether a fused linear layer's GEMMs run in FP8 (`attach`'s fp8 and fp8_skip)."""
    from forge.distributed import is_dtensor
    from forge.fp8 import eligible

    if getattr(optimizer, "fp8", None) is None:
        return False
    if is_dtensor(weight):
        raise ValueError(
            f"fp8 is not supported with tensor-parallel weights ({module_name}): leave fp8=None, or train "
            "FP8 on one GPU"
        )
    skipped = any(module_name == s or module_name.endswith("." + s) for s in optimizer.fp8_skip)
    return not skipped and eligible(weight)


def _make_hook(optimizer: ForgeOptimizer):
    def hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            optimizer.update_elementwise(p, p.grad)
            p.grad = None

    return hook
