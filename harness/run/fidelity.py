"""How far a point trained from the torch.optim rule it stands for: its reference, trained beside it.

With `measure.fidelity` on (the smoke sweep), a point whose method names a torch reference
(`Method.torch_reference`: FORGE's AdamW names torch.optim.AdamW, FORGE Muon names torch.optim.Muon
with its AdamW) trains that reference in the same process after its own steps: torch.optim's rule on
fp32 weights and fp32 states, from the point's own initial weights (upcast), on the same batch, for
the same steps. The point's record gets `fidelity`:

    reference            the reference method and its options (conf/method names)
    reference_losses     its training loss at every step
    weight_distance      ||W - W_ref|| / ||W_ref - W_0||: how far apart the two end, over how far the
                         reference moved (0: the same weights; 1: as far apart as training moved them)
    loss_gap             L(W) - L(W_ref), both through the fp32 model, so that only the weights differ
                         (not the forward's arithmetic); `loss` and `reference_loss` are the two
    rounding_walk        sqrt(steps x sum_i ulp(w_i)^2 / 4) / ||W_ref - W_0||: what rounding the
                         weights to their dtype every step can move them by. Each step's rounding of
                         a weight is an error of variance at most ulp^2 / 4 (stochastic rounding:
                         p (1 - p) ulp^2 with p <= 1; to nearest: at most (ulp / 2)^2), independent
                         from step to step, so after n steps the expected squared distance is at most
                         n sum_i ulp(w_i)^2 / 4 (ulp: the weight dtype's unit in the last place at the
                         initial w_i)
    state_error          ||u(q(s)) - u(s)|| / ||u(s)||: the update's relative error when the
                         reference's last optimizer states s are stored in the point's state dtype
                         (q: `forge.states.stored`, fp32 as is, bf16 rounded to nearest, int8
                         through the kernels' codes, as the kernels round them); u = m / (sqrt(v) +
                         eps) for AdamW, the momentum for Muon (the Newton-Schulz input)
    gradient_error       ||g - g_fp32|| / ||g_fp32|| at the initial weights: the gradient's relative
                         error from the point's weight dtype in the forward and backward (the
                         model's own autograd in that dtype against the fp32 model's)
    path                 sum_t ||W_ref,t+1 - W_ref,t|| / ||W_ref - W_0||: the reference's path over its
                         displacement (1 for a straight line); an update off by state_error a step
                         moves the weights by at most state_error x path, relative
    loss_rounding_walk   sqrt(steps x sum_i (g_i ulp(w_i))^2 / 4), g = grad L(W_ref): to first order,
                         the standard deviation of the loss change the rounding walk makes (its
                         errors independent, so their effects add in squares)
    loss_per_distance    ||grad L(W_ref)|| x ||W_ref - W_0||: to first order, the most the loss moves
                         for a relative weight distance of 1 in the gradient's direction

`harness.report.cpu_tables` holds each FORGE point to rounding_walk + e x path, and its loss gap to
3 loss_rounding_walk + e x path x loss_per_distance, with e = state_error + gradient_error (each
update's relative error). It copies the initial weights (fp32, on the host): meant for the small
models a CPU trains.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from forge.states import stored
from harness.run import config as config_mod
from harness.run import methods, models

MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}  # stored bits after the point
ADAM_EPS = 1e-8  # the eps of the update direction compared (torch's default)
POSITIVE = "exp_avg_sq"  # the one positive slot compared (int8 stores it in its own codes)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `model` as an fp32 copy on the host, by name."""
    return {name: p.detach().float().cpu().clone() for name, p in model.named_parameters()}


def reference_of(cfg: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """(method name, options) of the point's torch reference, or None where its method names none."""
    options = methods.make_options(cfg.method.name, config_mod.to_dict(cfg.method.options))
    return methods.get(cfg.method.name).torch_reference(options)


def state_dtype_of(cfg: DictConfig) -> str:
    """The dtype the point keeps its optimizer states in: its `state_dtype` option, else its weights'
    (torch.optim keeps states in the parameter's dtype)."""
    given = config_mod.to_dict(cfg.method.options).get("state_dtype")
    return str(given) if given else config_mod.weight_dtype(cfg)


def measure(
    cfg: DictConfig,
    model: torch.nn.Module,
    initial: Mapping[str, torch.Tensor],
    batch: torch.Tensor,
    device: str,
) -> dict[str, Any] | None:
    """Train the point's reference from `initial` and compare it with `model` (the point's, after its
    steps): the record's `fidelity`, or None where the method names no reference."""
    found = reference_of(cfg)
    if found is None:
        return None
    name, options = found
    ref_model = _model_in(cfg, "fp32", initial, device)
    ref = methods.get(name)(ref_model, cfg.method.lr, methods.make_options(name, options), device)
    ref.setup()
    _, exact = _loss_and_gradient(ref_model, batch)  # at the initial weights, in fp32
    _, rounded = _loss_and_gradient(_model_in(cfg, config_mod.weight_dtype(cfg), initial, device), batch)
    losses, path = [], 0.0
    previous = snapshot(ref_model)
    for _ in range(cfg.steps):
        losses.append(float(ref.step(batch)))
        now = snapshot(ref_model)
        path += _distance(now, previous)
        previous = now
    final, mine = previous, snapshot(model)
    moved = _distance(final, initial)
    loss_ref, grads = _loss_and_gradient(ref_model, batch)
    loss_mine = _loss_at(ref_model, mine, batch)
    dtype = models.TORCH_DTYPES[config_mod.weight_dtype(cfg)]
    ulps = {name: _ulp(w, dtype) for name, w in initial.items()}
    walk = math.sqrt(cfg.steps * sum(float(u.pow(2).sum()) for u in ulps.values()) / 4)
    loss_walk = math.sqrt(cfg.steps * sum(float((grads[n] * ulps[n]).pow(2).sum()) for n in grads) / 4)
    grad = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    return {
        "reference": {"method": name, "options": options},
        "reference_losses": losses,
        "state_dtype": state_dtype_of(cfg),
        "loss": loss_mine,
        "reference_loss": loss_ref,
        "loss_gap": loss_mine - loss_ref,
        "weight_distance": _distance(mine, final) / moved if moved else None,
        "rounding_walk": walk / moved if moved else None,
        "state_error": state_error(ref, state_dtype_of(cfg), _int8_group(cfg)),
        "gradient_error": _distance(rounded, exact)
        / math.sqrt(sum(float(g.pow(2).sum()) for g in exact.values())),
        "path": path / moved if moved else None,
        "loss_rounding_walk": loss_walk,
        "loss_per_distance": grad * moved,
    }


def _model_in(
    cfg: DictConfig, dtype: str, weights: Mapping[str, torch.Tensor], device: str
) -> torch.nn.Module:
    """The point's model in `dtype` with `weights`."""
    model = models.build(cfg.model, dtype, device, cfg.activation_checkpointing, cfg.seed)
    _load(model, weights)
    return model


def _load(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name].to(p.device, p.dtype))


def _distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[n] - b[n]).double().pow(2).sum()) for n in a))


def _ulp(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The unit in the last place of each w_i in `dtype`, fp64 (a zero at the smallest normal's)."""
    bits = MANTISSA_BITS.get(dtype, 23)
    exponent = torch.floor(torch.log2(w.double().abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.exp2(exponent - bits)


def _loss_and_gradient(model: torch.nn.Module, batch: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss at the model's weights and its gradient there, fp64 on the host (then dropped)."""
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grads = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _loss_at(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], batch: torch.Tensor) -> float:
    """The fp32 model's loss at `weights` (its own weights put back afterwards)."""
    own = snapshot(model)
    _load(model, weights)
    with torch.no_grad():
        loss = float(model(input_ids=batch, labels=batch).loss)
    _load(model, own)
    return loss


def _int8_group(cfg: DictConfig) -> int:
    return int(config_mod.to_dict(cfg.method.options).get("int8_group") or 64)


def state_error(method: Any, state_dtype: str, group: int = 64) -> float | None:
    """The relative error of the update direction (`_direction`) from `method`'s optimizer states
    stored in `state_dtype` (`forge.states.stored`); None where its states hold no direction this
    knows."""
    exact, kept = [], []
    for opt in method.optimizers():
        for state in opt.state.values():
            slots = dict(_slots(state))
            held = {k: stored(v, state_dtype, k != POSITIVE, group) for k, v in slots.items()}
            direction = _direction(slots)
            if direction is not None:
                exact.append(direction)
                kept.append(_direction(held))
    if not exact:
        return None
    norm = math.sqrt(sum(float(u.double().pow(2).sum()) for u in exact))
    error = math.sqrt(sum(float((q - u).double().pow(2).sum()) for u, q in zip(exact, kept)))
    return error / norm if norm else None


def _slots(state: Mapping[str, Any]) -> Iterable[tuple[str, torch.Tensor]]:
    return ((k, v.float()) for k, v in state.items() if k in ("exp_avg", "exp_avg_sq", "momentum_buffer"))


def _direction(slots: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    if "exp_avg" in slots and "exp_avg_sq" in slots:
        return slots["exp_avg"] / (slots["exp_avg_sq"].sqrt() + ADAM_EPS)
    return slots.get("momentum_buffer")
