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
from forge.rules import get_rule, resolve_hparams
from forge.weights import weight_format
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
    fallback: str | None = None,
    fallback_options: dict | None = None,
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
    (capturable, update_stream).

    A rule that trains only 2-D matrices (Muon) takes `fallback`, the rule for the rest, and
    `fallback_options`, that rule's hyperparameters: the model's hidden matrices (the weights of its
    nn.Linear layers but the output head: `forge.muon.hidden_matrices`) train with `rule`, every other
    parameter (embeddings, the head, norms, biases) with `fallback`, in a second param group. Without
    it such a rule refuses any parameter that is not a 2-D matrix."""
    _check_fp8_options(fp8, max_grad_norm)
    target = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if getattr(target, ATTACHED, None) is not None:
        raise RuntimeError(
            "FORGE is already attached to this model; call forge.detach(model) before attaching again"
        )
    names = {p: n for n, p in target.named_parameters(remove_duplicate=False)}
    found = get_rule(rule)  # its hyperparameters first, as torch.optim checks them before the parameters
    resolve_hparams(found, {k: v for k, v in hparams.items() if k in found.defaults})
    params = _groups(target, rule, params, fallback, fallback_options)
    kahan = weight_format(master_weights, stochastic_rounding).kahan
    _check_matrices(rule, params, names, state_dtype, kahan)  # before DDP is taken over
    model, parallel = dp.resolve(model, process_group, bucket_cap_mb)  # a DDP wrapper: taken over here
    if parallel is not None and fp8 is not None:
        raise ValueError(
            "fp8 under data parallelism: FP8 runs FORGE's fused GEMMs, and data-parallel training reduces "
            "each gradient instead of fusing it. Leave fp8=None, or train FP8 on one GPU or under tensor "
            "parallelism."
        )
    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
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


def _groups(model: nn.Module, rule: str, params, fallback: str | None, fallback_options: dict | None):
    """`params` as given, or with `fallback`: the model's hidden matrices in one group and the rest
    in a group of the fallback rule (see `attach`)."""
    from forge.muon import hidden_matrices

    if fallback is None:
        if fallback_options:
            raise ValueError(
                "fallback_options= are the fallback rule's hyperparameters: name the rule, fallback="
            )
        return None if params is None else list(params)  # an iterator is read here, once
    main, other = get_rule(rule), get_rule(fallback)
    if not main.whole_matrix:
        raise ValueError(
            f"fallback= names the rule for the parameters a matrix rule (muon) leaves out; {main.name} "
            "trains every parameter itself: drop fallback="
        )
    if other.whole_matrix:
        raise ValueError(f"fallback={fallback!r} trains only matrices too: name an element-wise rule (adamw)")
    if params is not None:
        raise ValueError(
            "fallback= splits the model's own parameters: with params= give the groups yourself, each "
            'with its "rule" (e.g. [{"params": hidden}, {"params": rest, "rule": "adamw", "lr": 3e-4}])'
        )
    hidden, rest = hidden_matrices(model)
    if not hidden:
        raise ValueError(f"{main.title}: the model has no trainable hidden matrix (an nn.Linear weight)")
    groups = [{"params": hidden}]
    if rest:
        groups.append({**(fallback_options or {}), "params": rest, "rule": other.name})
    return groups


def _check_matrices(rule: str, params, names: dict, state_dtype: str, kahan: bool) -> None:
    """A matrix rule's refusals (`forge.rules.check_whole_matrix`) for the parameters it would train,
    made before attach changes anything (the optimizer makes them again)."""
    from forge.rules import check_whole_matrix

    found = get_rule(rule)
    if not found.whole_matrix:
        return
    if params is None:
        mine = list(names)
    else:
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        mine = [p for g in groups if g.get("rule", rule) == rule for p in g["params"]]
    trained = [p for p in mine if p.requires_grad]
    name_of = lambda p: names.get(p, f"parameter of shape {tuple(p.shape)}")  # noqa: E731
    check_whole_matrix(found, trained, name_of, state_dtype, kahan)


def _check_fp8_options(fp8: str | None, max_grad_norm: float | None) -> None:
    from forge.fp8 import check_recipe

    check_recipe(fp8)
    if fp8 is not None and max_grad_norm is not None:
        raise ValueError(
            "fp8 with max_grad_norm is not supported: FORGE's clipping takes each layer's norm from bf16 "
            "operands. Clip with bf16 GEMMs (leave fp8=None), or train FP8 without max_grad_norm."
        )
