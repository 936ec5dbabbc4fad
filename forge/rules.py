"""The update rules: hyperparameters, per-step coefficients, PyTorch references.

FORGE can fuse any optimizer whose update of one weight element depends only on that element's
gradient, weight and states: AdamW, NAdam, RAdam, Lion, RMSprop, Adagrad, SGD. Each rule here is
split into two halves:

* a host half (`Rule.coefficients`, here) that turns the param group's hyperparameters and the
  step count into a handful of floats (bias corrections, NAdam's momentum schedule, RAdam's
  rectification, SGD's first-step buffer): everything that is the same for every element. These
  are passed to the kernels as ordinary scalar arguments each step, so a learning-rate scheduler or
  a new step never recompiles anything, and no `libdevice` power function is needed on the GPU.
* a device half, a `@triton.jit` function on fp32 tiles (`forge.kernels.rules`: `adamw`, `nadam`,
  ...), dispatched at compile time by `apply_rule` on the constexpr rule name. The fused
  weight-gradient kernels and the element-wise kernel all call `apply_rule`, so the paths cannot
  drift apart.

`reference_update` is the device half's arithmetic in PyTorch, element for element, used to check
the kernels and to document what they compute. The independent oracle is `torch.optim` itself (see
`forge.baseline`). Hyperparameter names and defaults follow `torch.optim`; Lion follows its paper
(Chen et al. 2023: lr=1e-4, betas=(0.9, 0.99), decoupled weight decay).

Muon is fused in part (`whole_matrix`): its momentum is element-wise and linear in the gradient,
so its device half folds each gradient tile into the momentum and writes what Newton-Schulz
orthogonalizes to a scratch; the orthogonalization needs the whole matrix and runs after the
layer's kernel (`forge.muon`), which then updates the weight.

State slots: every rule has up to three state tensors, in fixed slots `s1, s2, s3`, named as
torch.optim names them (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, ...). A slot is either signed
(a moment that can be negative) or positive (a running sum of squares); with int8 storage the two
kinds are quantized differently (see `forge.kernels.quant`).

This module imports no Triton: the registry, validation and references load without the kernels.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# ----------------------------------------------------------------------------------------------
# Host half: hyperparameters -> per-step coefficients, in the order the device half of each rule
# (`forge.kernels.rules`) takes them after its tiles.
# ----------------------------------------------------------------------------------------------

NUM_COEFFICIENTS = 9


def _coefficients_adamw(h: dict, step: int, st: dict) -> tuple[float, ...]:
    beta1, beta2 = h["betas"]
    bias1, bias2 = 1 - beta1**step, 1 - beta2**step
    return (1 - h["lr"] * h["weight_decay"], 1 - beta1, beta2, 1 - beta2, 1 / math.sqrt(bias2), h["eps"], h["lr"] / bias1)


def _split_weight_decay(h: dict) -> tuple[float, float]:
    """(multiplier on w, coefficient added to g) for rules with a `decoupled_weight_decay` switch."""
    if h.get("decoupled_weight_decay", False):
        return 1 - h["lr"] * h["weight_decay"], 0.0
    return 1.0, h["weight_decay"]


def _coefficients_nadam(h: dict, step: int, st: dict) -> tuple[float, ...]:
    beta1, beta2 = h["betas"]
    decay, coupled = _split_weight_decay(h)
    mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * h["momentum_decay"]))
    mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * h["momentum_decay"]))
    st["mu_product"] = mu_product = st["mu_product"] * mu
    grad_step = h["lr"] * (1.0 - mu) / (1.0 - mu_product)
    moment_step = h["lr"] * mu_next / (1.0 - mu_product * mu_next)
    return (decay, coupled, 1 - beta1, beta2, 1 - beta2, 1 / (1 - beta2**step), h["eps"], grad_step, moment_step)


def _coefficients_radam(h: dict, step: int, st: dict) -> tuple[float, ...]:
    beta1, beta2 = h["betas"]
    decay, coupled = _split_weight_decay(h)
    bias1, bias2 = 1 - beta1**step, 1 - beta2**step
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2**step) / bias2
    if rho_t > 5.0:
        rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
        adaptive, plain = h["lr"] * rect * math.sqrt(bias2) / bias1, 0.0
    else:
        adaptive, plain = 0.0, h["lr"] / bias1
    return (decay, coupled, 1 - beta1, beta2, 1 - beta2, h["eps"], adaptive, plain)


def _coefficients_lion(h: dict, step: int, st: dict) -> tuple[float, ...]:
    beta1, beta2 = h["betas"]
    return (1 - h["lr"] * h["weight_decay"], beta1, beta2, 1 - beta1, 1 - beta2, h["lr"])


def _coefficients_rmsprop(h: dict, step: int, st: dict) -> tuple[float, ...]:
    return (h["weight_decay"], h["alpha"], 1 - h["alpha"], h["eps"], h["momentum"], h["lr"])


def _coefficients_adagrad(h: dict, step: int, st: dict) -> tuple[float, ...]:
    return (h["weight_decay"], h["eps"], h["lr"] / (1 + (step - 1) * h["lr_decay"]))


def _coefficients_sgd(h: dict, step: int, st: dict) -> tuple[float, ...]:
    momentum = h["momentum"]
    first = step == 1
    buf_decay, grad_scale = (0.0, 1.0) if first else (momentum, 1 - h["dampening"])
    grad_keep, buf_mix = (1.0, momentum) if h["nesterov"] else (0.0, 1.0)
    return (h["weight_decay"], buf_decay, grad_scale, grad_keep, buf_mix, h["lr"])


def _coefficients_muon(h: dict, step: int, st: dict) -> tuple[float, ...]:
    """Muon's tile half takes the momentum's lerp weights and whether it is Nesterov's (h0-h2); its
    whole-matrix half (`forge.muon`) the weight's decay and the step of the orthogonalized update,
    the learning rate adjusted to the weight's shape (h3-h4)."""
    from forge.muon import adjusted_lr

    momentum = h["momentum"]
    step_size = adjusted_lr(h["lr"], h["adjust_lr_fn"], (st["rows"], st["cols"]))
    return (1 - momentum, momentum, float(bool(h["nesterov"])), 1 - h["lr"] * h["weight_decay"], step_size)


def _muon_shape(p: torch.Tensor) -> dict[str, int]:
    """What Muon's host half needs of a parameter besides its group: its shape (the adjusted lr)."""
    return {"rows": int(p.shape[0]), "cols": int(p.shape[1])}


# ----------------------------------------------------------------------------------------------
# PyTorch half: the arithmetic of `forge.kernels.rules`, element for element, for checking the
# kernels and as documentation.
# ----------------------------------------------------------------------------------------------


def _ref_adamw(w, g, s, c, flags):
    decay, omb1, b2, omb2, inv_sqrt_bias2, eps, step_size, *_ = c  # the rest is padding
    w = w * decay
    s[0] = s[0] + (g - s[0]) * omb1
    s[1] = s[1] * b2 + omb2 * g * g
    return w - step_size * s[0] / (s[1].sqrt() * inv_sqrt_bias2 + eps)


def _ref_nadam(w, g, s, c, flags):
    decay, coupled, omb1, b2, omb2, inv_bias2, eps, grad_step, moment_step, *_ = c  # the rest is padding
    g = g + coupled * w
    w = w * decay
    s[0] = s[0] + (g - s[0]) * omb1
    s[1] = s[1] * b2 + omb2 * g * g
    denom = (s[1] * inv_bias2).sqrt() + eps
    return w - grad_step * g / denom - moment_step * s[0] / denom


def _ref_radam(w, g, s, c, flags):
    decay, coupled, omb1, b2, omb2, eps, adaptive, plain, *_ = c  # the rest is padding
    g = g + coupled * w
    w = w * decay
    s[0] = s[0] + (g - s[0]) * omb1
    s[1] = s[1] * b2 + omb2 * g * g
    return w - s[0] * (adaptive / (s[1].sqrt() + eps) + plain)


def _ref_lion(w, g, s, c, flags):
    decay, b1, b2, omb1, omb2, lr, *_ = c  # the rest is padding
    update = torch.sign(b1 * s[0] + omb1 * g)
    s[0] = b2 * s[0] + omb2 * g
    return w * decay - lr * update


def _ref_rmsprop(w, g, s, c, flags):
    coupled, alpha, oma, eps, momentum, lr, *_ = c  # the rest is padding
    g = g + coupled * w
    s[0] = s[0] * alpha + oma * g * g
    if flags["centered"]:
        s[2] = s[2] + (g - s[2]) * oma
        avg = (s[0] - s[2] * s[2]).sqrt() + eps
    else:
        avg = s[0].sqrt() + eps
    if flags["momentum"]:
        s[1] = s[1] * momentum + g / avg
        return w - lr * s[1]
    return w - lr * g / avg


def _ref_adagrad(w, g, s, c, flags):
    coupled, eps, clr, *_ = c  # the rest is padding
    g = g + coupled * w
    s[0] = s[0] + g * g
    return w - clr * g / (s[0].sqrt() + eps)


def _lerp(start, end, weight: float):
    """torch's lerp: start + weight (end - start) below one half, end - (end - start)(1 - weight) above."""
    return start + weight * (end - start) if weight < 0.5 else end - (end - start) * (1 - weight)


def _ref_muon(w, g, s, c, flags):
    one_minus_momentum, momentum, nesterov, *_ = c  # the rest is the whole-matrix half's
    s[0] = _lerp(s[0], g, one_minus_momentum)
    return _lerp(g, s[0], momentum) if nesterov else s[0].clone()  # what Newton-Schulz orthogonalizes


def _ref_sgd(w, g, s, c, flags):
    coupled, buf_decay, grad_scale, grad_keep, buf_mix, lr, *_ = c  # the rest is padding
    g = g + coupled * w
    if flags["momentum"]:
        s[0] = s[0] * buf_decay + grad_scale * g
        g = g * grad_keep + s[0] * buf_mix
    return w - lr * g


# ----------------------------------------------------------------------------------------------
# The registry.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateSlot:
    """One optimizer-state tensor: its torch.optim name and whether it can be negative."""

    name: str
    signed: bool


@dataclass(frozen=True)
class Rule:
    """An element-wise update rule: every fact about it that the library and the harness use.

    `name` (what `forge.attach` takes), `title` (what tables show), `defaults` (torch.optim's
    hyperparameters and defaults), `slots` (its state tensors for given hyperparameters),
    `torch_class` (where the torch.optim optimizer it must match lives, "module:Class"), the host
    half `coefficients_fn` and the PyTorch reference `reference_fn`. `device_half`: the name of
    the device half in `forge.kernels.rules` when it is another rule's (a rule that differs
    only in its host half); None: the rule's own name. `host_state_of`, `whole_matrix` and
    `check`: below."""

    name: str
    title: str
    defaults: dict[str, Any]
    slots: Callable[[dict], tuple[StateSlot | None, StateSlot | None, StateSlot | None]]
    coefficients_fn: Callable[[dict, int, dict], tuple[float, ...]]
    reference_fn: Callable
    torch_path: str
    host_state: dict[str, float] = field(default_factory=dict)  # scalar per-param state, e.g. NAdam's mu_product
    device_half: str | None = None
    # Per-parameter host values taken from the parameter itself when it is added (Muon: its shape).
    host_state_of: Callable[[torch.Tensor], dict] | None = None
    # The rule finishes on the whole matrix (Muon's Newton-Schulz, `forge.muon`): its tile half
    # writes what the whole-matrix half takes to a scratch, not the weight; 2-D weights only.
    whole_matrix: bool = False
    # The rule's own checks of its hyperparameters, with torch.optim's messages, beyond those every
    # rule shares by a hyperparameter's name (`check_hparams`); None: the shared ones only.
    check: Callable[[dict], None] | None = None

    @property
    def device_name(self) -> str:
        """The name `forge.kernels.rules.apply_rule` dispatches on (its constexpr RULE)."""
        return self.device_half or self.name

    def initial_host_state(self, p: torch.Tensor) -> dict:
        """p's host values at its first step: the rule's own and those it takes from p."""
        return {**self.host_state, **(self.host_state_of(p) if self.host_state_of else {})}

    @functools.cached_property  # asked at every update (`forge.steps`): a fact of the rule, kept
    def per_parameter(self) -> bool:
        """Whether two parameters of one group can have different coefficients at one step."""
        return bool(self.host_state) or self.host_state_of is not None

    def torch_class(self) -> type:
        """The torch.optim class this rule is exact against (Lion, which torch lacks: `forge.baseline.Lion`)."""
        import importlib

        module, name = self.torch_path.split(":")
        found = getattr(importlib.import_module(module), name, None)
        if found is None:
            raise RuntimeError(f"{self.title}'s reference, {module}.{name}, is not in torch {torch.__version__}")
        return found

    def state_count(self, hparams: dict | None = None) -> int:
        """How many full-size state tensors a parameter keeps under `hparams` (torch.optim's defaults
        for what is left out): what a memory model counts."""
        return sum(slot is not None for slot in self.slots({**self.defaults, **(hparams or {})}))

    def coefficients(self, hparams: dict, step: int, host_state: dict) -> tuple[float, ...]:
        """The kernel's scalar arguments for step `step`, padded to NUM_COEFFICIENTS. Call it once
        per step: it advances the rule's host state (NAdam's running `mu_product`)."""
        c = tuple(float(x) for x in self.coefficients_fn(hparams, step, host_state))
        return c + (0.0,) * (NUM_COEFFICIENTS - len(c))

    def flags(self, hparams: dict) -> dict[str, bool]:
        return {"momentum": hparams.get("momentum", 0) != 0, "centered": bool(hparams.get("centered", False))}


def _betas_below_one(h: dict) -> None:
    """The Adam family divides by 1 - beta ** step (RAdam by 1 - beta2): both betas in [0, 1)."""
    for i, beta in enumerate(h["betas"]):
        _nonnegative(beta, f"beta parameter at index {i}", 1.0)


def _check_sgd(h: dict) -> None:
    if h["nesterov"] and (h["momentum"] <= 0 or h["dampening"] != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


def _check_muon(h: dict) -> None:
    """torch.optim.Muon's checks (some of which it makes only at its first step), before anything runs."""
    from forge.muon import ADJUST_LR_FNS
    from forge.newton_schulz import NS_COEFFICIENTS, check_variant

    if h["adjust_lr_fn"] not in ADJUST_LR_FNS:
        raise ValueError(f"Adjust learning rate function {h['adjust_lr_fn']} is not supported")
    if len(tuple(h["ns_coefficients"])) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    if not 0 < int(h["ns_steps"]) < 100 or int(h["ns_steps"]) != h["ns_steps"]:
        raise ValueError(f"ns_steps must be a whole number from 1 to 99, got {h['ns_steps']!r}")
    check_variant(h["newton_schulz"])
    if h["newton_schulz"] == "polar_express" and tuple(h["ns_coefficients"]) != NS_COEFFICIENTS:
        raise ValueError(
            f"ns_coefficients={tuple(h['ns_coefficients'])} would be ignored: newton_schulz='polar_express' "
            "brings its own coefficients for each iteration; leave ns_coefficients at its default"
        )


_SIGNED = {n: StateSlot(n, True) for n in ("exp_avg", "momentum_buffer", "grad_avg")}
_POSITIVE = {n: StateSlot(n, False) for n in ("exp_avg_sq", "square_avg", "sum")}
_ADAM_SLOTS = (_SIGNED["exp_avg"], _POSITIVE["exp_avg_sq"], None)


def _rmsprop_slots(h: dict):
    return (
        _POSITIVE["square_avg"],
        _SIGNED["momentum_buffer"] if h["momentum"] != 0 else None,
        _SIGNED["grad_avg"] if h["centered"] else None,
    )


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("adamw", "AdamW", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
             lambda h: _ADAM_SLOTS, _coefficients_adamw, _ref_adamw, "torch.optim:AdamW", check=_betas_below_one),
        Rule("nadam", "NAdam", dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                                    decoupled_weight_decay=False),
             lambda h: _ADAM_SLOTS, _coefficients_nadam, _ref_nadam, "torch.optim:NAdam",
             host_state={"mu_product": 1.0}, check=_betas_below_one),
        Rule("radam", "RAdam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                    decoupled_weight_decay=False),
             lambda h: _ADAM_SLOTS, _coefficients_radam, _ref_radam, "torch.optim:RAdam", check=_betas_below_one),
        Rule("lion", "Lion", dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0),
             lambda h: (_SIGNED["exp_avg"], None, None), _coefficients_lion, _ref_lion, "forge.baseline:Lion"),
        Rule("rmsprop", "RMSprop", dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False),
             _rmsprop_slots, _coefficients_rmsprop, _ref_rmsprop, "torch.optim:RMSprop"),
        Rule("adagrad", "Adagrad", dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                                        eps=1e-10),
             lambda h: (_POSITIVE["sum"], None, None), _coefficients_adagrad, _ref_adagrad, "torch.optim:Adagrad"),
        Rule("sgd", "SGD", dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
             lambda h: (_SIGNED["momentum_buffer"] if h["momentum"] != 0 else None, None, None),
             _coefficients_sgd, _ref_sgd, "torch.optim:SGD", check=_check_sgd),
        Rule("muon", "Muon", dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                                  ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None,
                                  newton_schulz="torch"),
             lambda h: (_SIGNED["momentum_buffer"], None, None), _coefficients_muon, _ref_muon, "torch.optim:Muon",
             host_state_of=_muon_shape, whole_matrix=True, check=_check_muon),
    )
}  # fmt: skip

# torch.optim arguments FORGE accepts but that change nothing here, and ones it cannot honour.
IGNORED_OPTIONS = frozenset({"foreach", "fused", "capturable"})
UNSUPPORTED_OPTIONS = {
    "amsgrad": "AMSGrad keeps a running max that FORGE does not implement; use adamw without it",
    "maximize": "maximize is not implemented; negate your loss instead",
    "differentiable": "the update runs inside backward through raw pointers, so autograd records no graph "
    "through the step; use torch.optim for differentiable optimization",
}


def get_rule(name: str) -> Rule:
    """The rule called `name`, or a ValueError that lists the valid names."""
    try:
        return RULES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown FORGE rule {name!r}; choose one of: {', '.join(RULES)}") from None


def resolve_hparams(rule: Rule, hparams: dict) -> dict:
    """Fill torch.optim's defaults and reject options the rule does not have, with what to do."""
    for key, why in UNSUPPORTED_OPTIONS.items():
        if hparams.get(key):
            raise ValueError(f"{rule.name}: {key}=True is not supported by FORGE ({why})")
    unknown = set(hparams) - set(rule.defaults) - IGNORED_OPTIONS - set(UNSUPPORTED_OPTIONS)
    if unknown:
        raise TypeError(
            f"{rule.name} got unexpected hyperparameter(s) {sorted(unknown)}; "
            f"valid ones: {', '.join(rule.defaults)}"
        )
    out = dict(rule.defaults)
    out.update({k: v for k, v in hparams.items() if k in rule.defaults})
    out["lr"] = float(out["lr"])
    for key in ("betas", "ns_coefficients"):
        if key in out:
            out[key] = tuple(float(b) for b in out[key])
    check_hparams(rule.name, out)
    return out


def check_group(rule: Rule, defaults: dict, group: dict) -> None:
    """Refuse a param group's options before the group is added (a refused group changes nothing),
    checked with the optimizer's `defaults` filled in, as torch.optim fills them."""
    defaults = {k: v for k, v in defaults.items() if k in rule.defaults}
    resolve_hparams(rule, {**defaults, **{k: v for k, v in group.items() if k not in ("params", "rule")}})


def rule_of_group(group: dict, default: Rule) -> Rule:
    """The rule a param group trains with: its own "rule" (a group of another rule, e.g. Muon's
    fallback), else the optimizer's."""
    return get_rule(group["rule"]) if "rule" in group else default


def checked_group(rule: Rule, default: Rule, defaults: dict, group: dict) -> dict:
    """`group` checked before it is added (`check_group`); a group of another rule than the
    optimizer's gets that rule's own defaults first, so that torch.optim fills in only the keys
    the other rule lacks (`settle_group` drops them again)."""
    own = defaults if rule is default else resolve_hparams(rule, {})
    check_group(rule, own, group)
    return group if rule is default else {**own, **group}


def settle_group(group: dict, rule: Rule, defaults: dict) -> dict:
    """An added param group, as its rule reads it: the optimizer's defaults that torch.optim filled
    in and the rule lacks dropped, its own hyperparameters resolved (in place; returns the group)."""
    if "rule" in group:  # a group of another rule than the optimizer's
        for key in set(defaults) - set(rule.defaults):
            group.pop(key, None)
    group.update(resolve_hparams(rule, {k: group[k] for k in rule.defaults}))
    return group


def group_rules(groups: list[dict], default: Rule) -> dict:
    """{"group_rules": the rule of each group} where a group trains with another rule than the
    optimizer's, else {}: what a saved state only makes sense under beside the rule."""
    rules = [rule_of_group(group, default).name for group in groups]
    return {"group_rules": rules} if any(name != default.name for name in rules) else {}


def check_whole_matrix(rule: Rule, params, name_of: Callable, state_dtype: str, kahan: bool) -> None:
    """Refuse what a whole-matrix rule (Muon) cannot train, before its group is added: a parameter
    that is not one 2-D matrix on this rank, states it does not keep, compensated weights."""
    from forge.distributed import is_dtensor

    fallback = (
        f'Train the others with another rule: forge.attach(model, "{rule.name}", ..., fallback="adamw", '
        "fallback_options=dict(lr=...)) gives every parameter but the hidden matrices to AdamW"
    )
    flat = [p for p in params]
    bad = [name_of(p) for p in flat if p.dim() != 2]
    if bad:
        raise ValueError(
            f"{rule.title} updates 2-D weights only, and was given {len(bad)} other parameter(s): "
            f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}. {fallback}."
        )
    sharded = [name_of(p) for p in flat if is_dtensor(p)]
    if sharded:
        raise ValueError(
            f"{rule.title} orthogonalizes each weight whole, and {sharded[0]} is sharded across ranks (a "
            "DTensor: FSDP2 or tensor parallelism). Keep Muon's weights whole on every rank (DDP), or "
            "train the sharded ones with an element-wise rule."
        )
    if state_dtype == "int8":
        raise ValueError(f"{rule.title} keeps its momentum in fp32 or bf16: pass state_dtype='fp32' or 'bf16'")
    if kahan:
        raise ValueError(
            f"{rule.title} updates the weight after its Newton-Schulz step, outside the kernels that keep a "
            "compensated weight's residual: use master_weights=None (bf16 weights rounded to nearest, as "
            "torch.optim.Muon rounds them) or fp32 weights"
        )


def _nonnegative(value, what: str, upper: float = math.inf, upper_open: bool = True) -> None:
    """torch.optim's `if not 0.0 <= value` check and message; NaN (which every such comparison
    refuses) and infinity refused too, and `upper` where the rule divides by (upper - value)."""
    v = float(value)
    if not (0.0 <= v < upper if upper_open else 0.0 <= v <= upper) or math.isinf(v):
        raise ValueError(f"Invalid {what}: {value}")


def check_hparams(rule: str, h: dict) -> None:
    """Refuse, with torch.optim's messages, every hyperparameter torch.optim refuses, before anything
    is updated: a value accepted here never fails or turns the weights to NaN mid-backward because
    of its own range. Called for the defaults and for every param group. The checks every rule
    shares by a hyperparameter's name are here; a rule's own are its `Rule.check`."""
    _nonnegative(h["lr"], "learning rate")
    if "eps" in h:
        _nonnegative(h["eps"], "epsilon value")
    if "betas" in h:
        betas = h["betas"]
        if len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas} (a pair (beta1, beta2))")
        for i, beta in enumerate(betas):  # 1 is meaningful where nothing divides by 1 - beta (Lion)
            _nonnegative(beta, f"beta parameter at index {i}", 1.0, upper_open=False)
    _nonnegative(h["weight_decay"], "weight_decay value")
    for key in ("momentum", "lr_decay", "initial_accumulator_value", "momentum_decay"):
        if key in h:
            _nonnegative(h[key], f"{key} value")
    if "alpha" in h:
        _nonnegative(h["alpha"], "alpha value", 1.0, upper_open=False)  # > 1: a negative square_avg
    if "dampening" in h and not math.isfinite(float(h["dampening"])):
        raise ValueError(f"Invalid dampening value: {h['dampening']}")
    found = get_rule(rule)
    if found.check is not None:
        found.check(h)


def reference_update(
    rule: Rule, hparams: dict, w: torch.Tensor, g: torch.Tensor, states: list, coefficients: tuple
) -> torch.Tensor:
    """The kernels' arithmetic in fp32 PyTorch: returns the new weight, updates `states` in place."""
    fn = rule.reference_fn
    return fn(w.float(), g.float(), states, coefficients, rule.flags(hparams))
