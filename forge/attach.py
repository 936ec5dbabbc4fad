"""forge.attach / forge.detach: put FORGE on an existing model, and take it off again.

`attach(model, rule, params=None, **hparams)` builds a `ForgeOptimizer` over `params` (by default
every trainable parameter, one group) with the model's wiring (`forge.wiring`): every plain
nn.Linear whose weight it trains becomes a `ForgeLinear`, updated inside the fused dW kernel, and
every other trained parameter is updated from a post-accumulate-grad hook. Parameters left out of
`params` are not touched: they keep ordinary gradients for another optimizer. Parameters added later
with `optimizer.add_param_group` are fused or hooked the same way. `detach(model)` restores plain
nn.Linear classes and removes the hooks; the weights stay as trained.

Tensor parallelism (DTensor weights from `parallelize_module`'s colwise and rowwise plans, sequence
parallel included) keeps the fused kernel: see `forge.distributed` for why it is exact. Data
parallelism, a DDP-wrapped model (or a plain one with `process_group=`) or one sharded by FSDP2's
`fully_shard`, trains with every gradient reduced over the ranks before its update, from the hooks,
and fuses nothing (`forge.data_parallel` says how, and what it costs).

Refused, with what to do instead: nn.DataParallel and FSDP1; tensor-parallel DTensors on meshes of
more than one dimension outside FSDP2; FP8 under data parallelism; attaching twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from forge import data_parallel as dp
from forge.optim import ForgeOptimizer
from forge.wiring import ATTACHED, ModelWiring


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
    rank first, as DDP does. Other keyword arguments are the rule's hyperparameters, as torch.optim
    names them (lr, betas, eps, weight_decay, momentum...), and ForgeOptimizer's options
    (capturable, update_stream)."""
    _check_fp8_options(fp8, max_grad_norm)
    target = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if getattr(target, ATTACHED, None) is not None:
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
    optimizer = ForgeOptimizer(
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
        wiring=ModelWiring(model, names, fp8, fp8_skip),
        param_names=names,
        **hparams,
    )
    setattr(model, ATTACHED, optimizer)
    return optimizer


def detach(model: nn.Module) -> None:
    """Take FORGE off `model`: plain nn.Linear modules again, hooks removed, weights kept. (A DDP
    wrapper FORGE took over keeps its gradient synchronization off: wrap the model again to train
    it with another optimizer.)"""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    optimizer = getattr(model, ATTACHED, None)
    if optimizer is None:
        raise RuntimeError("FORGE is not attached to this model")
    optimizer.wiring.unwire(optimizer)
    model.__dict__.pop(ATTACHED, None)  # already gone where the model is itself a fused nn.Linear


def _check_fp8_options(fp8: str | None, max_grad_norm: float | None) -> None:
    from forge.fp8 import check_recipe

    check_recipe(fp8)
    if fp8 is not None and max_grad_norm is not None:
        raise ValueError(
            "fp8 with max_grad_norm is not supported: FORGE's clipping takes each layer's norm from bf16 "
            "operands. Clip with bf16 GEMMs (leave fp8=None), or train FP8 without max_grad_norm."
        )
