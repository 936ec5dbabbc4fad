"""The eight element-wise update rules, written once for Triton and once in plain PyTorch.

FORGE can fuse any optimizer whose update of one weight element depends only on that element's
gradient, weight and states. Each rule here is split into two halves:

* a host half (`Rule.coefficients`) that turns the param group's hyperparameters and the step
  count into a handful of floats (bias corrections, NAdam's momentum schedule, RAdam's
  rectification, SGD's first-step buffer): everything that is the same for every element. These
  are passed to the kernels as ordinary scalar arguments each step, so a learning-rate scheduler or
  a new step never recompiles anything, and no `libdevice` power function is needed on the GPU.
* a device half, a `@triton.jit` function on fp32 tiles (`adamw`, `nadam`, ...), dispatched at
  compile time by `apply_rule` on the constexpr rule name. The fused weight-gradient kernel and the
  element-wise kernel both call `apply_rule`, so the two paths cannot drift apart.

`reference_update` is the same arithmetic in PyTorch, element for element, used to check the
kernels and to document what they compute. The independent oracle is `torch.optim` itself (see
`forge.baseline`). Hyperparameter names and defaults follow `torch.optim`; Lion follows its paper
(Chen et al. 2023: lr=1e-4, betas=(0.9, 0.99), decoupled weight decay).

State slots: every rule has up to three state tensors, in fixed slots `s1, s2, s3`, named as
torch.optim names them (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, ...). A slot is either signed
(a moment that can be negative) or positive (a running sum of squares); with int8 storage the two
kinds are quantized differently (see `forge.kernels.quant`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.backend import prepare

prepare()  # compiled kernels or Triton's interpreter, decided before Triton is first imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Device half: one @triton.jit function per rule, on fp32 tiles. Arguments after the tensors are
# the host-computed coefficients, in the order the matching `_coefficients_*` function returns.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _sqrt(x, FAST: tl.constexpr):
    """IEEE-rounded square root, as torch.optim computes it; FAST: the hardware approximation (a few
    fp32 ulps, far below a bf16 state's rounding; `KernelConfig.fast_epilogue`)."""
    if FAST:
        return tl.sqrt(x)
    return tl.sqrt_rn(x)


@triton.jit
def _div(a, b, FAST: tl.constexpr):
    """IEEE-rounded a / b; FAST: the hardware approximation (as `_sqrt`): `div.approx.ftz`, a
    reciprocal and a product (2 ulps for |b| in [2^-126, 2^126], where every denominator of these
    rules lies when eps > 0), where `tl.fdiv`'s `div.full` adds range checks and scalings: 7 SASS
    instructions per element more (the warp-specialized kernel's fast build, 3184 -> 2744)."""
    if FAST:
        return tl.extra.cuda.libdevice.fast_dividef(a, b)
    return tl.div_rn(a, b)


# Every sum with a product is an explicit fma, in the form torch.optim's CUDA ops take under nvcc's
# default contraction (read from their source, not from their SASS): `x.add_(y, alpha=a)` as
# fma(a, y, x); `x.addcmul_(y, z, value=a)` fma(a * y, z, x); `x.addcdiv_(y, z, value=a)`
# fma(a, y / z, x); `x.lerp_(y, a)` with a < 0.5 fma(a, y - x, x); a product feeding an fma's
# addend is rounded on its own. Left to the compiler, which products fuse differed between two
# builds of one kernel (SGD momentum; AdamW's fp32 states between the Triton and warp-specialized
# kernels, 22% of the elements one ulp apart).


@triton.jit
def adamw(w, g, m, v, decay, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bias2, eps, step_size, FAST: tl.constexpr):
    w = w * decay
    m = tl.fma(g - m, one_minus_beta1, m)
    v = tl.fma(one_minus_beta2 * g, g, v * beta2)
    denom = tl.fma(_sqrt(v, FAST), inv_sqrt_bias2, eps)
    w = tl.fma(-step_size, _div(m, denom, FAST), w)
    return w, m, v


@triton.jit
def nadam(w, g, m, v, decay, coupled_wd, one_minus_beta1, beta2, one_minus_beta2, inv_bias2, eps, grad_step, moment_step, FAST: tl.constexpr):
    g = tl.fma(w, coupled_wd, g)
    w = w * decay
    m = tl.fma(g - m, one_minus_beta1, m)
    v = tl.fma(one_minus_beta2 * g, g, v * beta2)
    denom = _sqrt(v * inv_bias2, FAST) + eps
    w = tl.fma(-grad_step, _div(g, denom, FAST), w)
    w = tl.fma(-moment_step, _div(m, denom, FAST), w)
    return w, m, v


@triton.jit
def radam(w, g, m, v, decay, coupled_wd, one_minus_beta1, beta2, one_minus_beta2, eps, adaptive_step, plain_step, FAST: tl.constexpr):
    g = tl.fma(w, coupled_wd, g)
    w = w * decay
    m = tl.fma(g - m, one_minus_beta1, m)
    v = tl.fma(one_minus_beta2 * g, g, v * beta2)
    # Rectified steps use m / (sqrt(v) + eps); before the variance is tractable RAdam falls back to
    # plain momentum SGD. The host zeroes one of the two step sizes.
    w = tl.fma(-m, _div(adaptive_step, _sqrt(v, FAST) + eps, FAST) + plain_step, w)
    return w, m, v


@triton.jit
def lion(w, g, m, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, lr):
    c = tl.fma(g, one_minus_beta1, beta1 * m)
    update = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, 0.0))
    w = tl.fma(update, -lr, w * decay)
    m = tl.fma(g, one_minus_beta2, beta2 * m)
    return w, m


@triton.jit
def rmsprop(w, g, sq, buf, gavg, coupled_wd, alpha, one_minus_alpha, eps, momentum, lr, HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr, FAST: tl.constexpr):
    g = tl.fma(w, coupled_wd, g)
    sq = tl.fma(one_minus_alpha * g, g, sq * alpha)
    if CENTERED:
        gavg = tl.fma(g - gavg, one_minus_alpha, gavg)
        avg = _sqrt(tl.fma(-gavg, gavg, sq), FAST) + eps
    else:
        avg = _sqrt(sq, FAST) + eps
    if HAS_MOMENTUM:
        buf = tl.fma(_div(g, avg, FAST), 1.0, buf * momentum)  # a sum: the product rounded first
        w = tl.fma(buf, -lr, w)
    else:
        w = tl.fma(-lr, _div(g, avg, FAST), w)
    return w, sq, buf, gavg


@triton.jit
def adagrad(w, g, ssum, coupled_wd, eps, clr, FAST: tl.constexpr):
    g = tl.fma(w, coupled_wd, g)
    ssum = tl.fma(g, g, ssum)
    w = tl.fma(-clr, _div(g, _sqrt(ssum, FAST) + eps, FAST), w)
    return w, ssum


@triton.jit
def sgd(w, g, buf, coupled_wd, buf_decay, grad_scale, grad_keep, buf_mix, lr, HAS_MOMENTUM: tl.constexpr):
    g = tl.fma(w, coupled_wd, g)
    if HAS_MOMENTUM:
        # First step: buf = g (buf_decay=0, grad_scale=1); then buf = momentum*buf + (1-dampening)*g.
        buf = tl.fma(g, grad_scale, buf * buf_decay)
        # Nesterov: g + momentum*buf (grad_keep=1, buf_mix=momentum); plain: buf (0, 1).
        g = tl.fma(buf, buf_mix, g * grad_keep)
    w = tl.fma(g, -lr, w)
    return w, buf


@triton.jit
def apply_rule(
    w, g, s1, s2, s3,  # fp32 tiles of one shape: weight, gradient, state slots (unused slots: any)
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 scalars from Rule.coefficients, padded with zeros
    RULE: tl.constexpr,  # rule name
    HAS_MOMENTUM: tl.constexpr,  # sgd / rmsprop with momentum != 0
    CENTERED: tl.constexpr,  # rmsprop centered
    FAST: tl.constexpr = False,  # approximate sqrt and division (`_sqrt`); else IEEE-rounded, as torch.optim
):
    """One update on fp32 tiles; returns the new (w, s1, s2, s3). Chosen at compile time."""
    if RULE == "adamw":
        w, s1, s2 = adamw(w, g, s1, s2, h0, h1, h2, h3, h4, h5, h6, FAST)
    elif RULE == "nadam":
        w, s1, s2 = nadam(w, g, s1, s2, h0, h1, h2, h3, h4, h5, h6, h7, h8, FAST)
    elif RULE == "radam":
        w, s1, s2 = radam(w, g, s1, s2, h0, h1, h2, h3, h4, h5, h6, h7, FAST)
    elif RULE == "lion":
        w, s1 = lion(w, g, s1, h0, h1, h2, h3, h4, h5)
    elif RULE == "rmsprop":
        w, s1, s2, s3 = rmsprop(w, g, s1, s2, s3, h0, h1, h2, h3, h4, h5, HAS_MOMENTUM, CENTERED, FAST)
    elif RULE == "adagrad":
        w, s1 = adagrad(w, g, s1, h0, h1, h2, FAST)
    else:
        tl.static_assert(RULE == "sgd", "unknown FORGE rule")
        w, s1 = sgd(w, g, s1, h0, h1, h2, h3, h4, h5, HAS_MOMENTUM)
    return w, s1, s2, s3


# ----------------------------------------------------------------------------------------------
# Host half: hyperparameters -> per-step coefficients.
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


# ----------------------------------------------------------------------------------------------
# PyTorch half: the same element-wise arithmetic, for checking the kernels and as documentation.
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
    """An element-wise update rule: defaults, state slots, host coefficients, PyTorch reference."""

    name: str
    defaults: dict[str, Any]
    slots: Callable[[dict], tuple[StateSlot | None, StateSlot | None, StateSlot | None]]
    coefficients_fn: Callable[[dict, int, dict], tuple[float, ...]]
    reference_fn: Callable
    host_state: dict[str, float] = field(default_factory=dict)  # scalar per-param state, e.g. NAdam's mu_product

    def coefficients(self, hparams: dict, step: int, host_state: dict) -> tuple[float, ...]:
        """The kernel's scalar arguments for step `step`, padded to NUM_COEFFICIENTS. Call it once
        per step: it advances the rule's host state (NAdam's running `mu_product`)."""
        c = tuple(float(x) for x in self.coefficients_fn(hparams, step, host_state))
        return c + (0.0,) * (NUM_COEFFICIENTS - len(c))

    def flags(self, hparams: dict) -> dict[str, bool]:
        return {"momentum": hparams.get("momentum", 0) != 0, "centered": bool(hparams.get("centered", False))}


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
        Rule("adamw", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
             lambda h: _ADAM_SLOTS, _coefficients_adamw, _ref_adamw),
        Rule("nadam", dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                           decoupled_weight_decay=False),
             lambda h: _ADAM_SLOTS, _coefficients_nadam, _ref_nadam, host_state={"mu_product": 1.0}),
        Rule("radam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False),
             lambda h: _ADAM_SLOTS, _coefficients_radam, _ref_radam),
        Rule("lion", dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0),
             lambda h: (_SIGNED["exp_avg"], None, None), _coefficients_lion, _ref_lion),
        Rule("rmsprop", dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False),
             _rmsprop_slots, _coefficients_rmsprop, _ref_rmsprop),
        Rule("adagrad", dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10),
             lambda h: (_POSITIVE["sum"], None, None), _coefficients_adagrad, _ref_adagrad),
        Rule("sgd", dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
             lambda h: (_SIGNED["momentum_buffer"] if h["momentum"] != 0 else None, None, None),
             _coefficients_sgd, _ref_sgd),
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
    if "betas" in out:
        out["betas"] = tuple(float(b) for b in out["betas"])
    check_hparams(rule.name, out)
    return out


def _nonnegative(value, what: str, upper: float = math.inf, upper_open: bool = True) -> None:
    """torch.optim's `if not 0.0 <= value` check and message; NaN (which every such comparison
    refuses) and infinity refused too, and `upper` where the rule divides by (upper - value)."""
    v = float(value)
    if not (0.0 <= v < upper if upper_open else 0.0 <= v <= upper) or math.isinf(v):
        raise ValueError(f"Invalid {what}: {value}")


def check_hparams(rule: str, h: dict) -> None:
    """Refuse, with torch.optim's messages, every hyperparameter torch.optim refuses, before anything
    is updated: a value accepted here never fails or turns the weights to NaN mid-backward because
    of its own range. Called for the defaults and for every param group."""
    _nonnegative(h["lr"], "learning rate")
    if "eps" in h:
        _nonnegative(h["eps"], "epsilon value")
    if "betas" in h:
        betas = h["betas"]
        if len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas} (a pair (beta1, beta2))")
        for i, beta in enumerate(betas):
            # 1 - beta**step divides (the Adam family) and 2 / (1 - beta2) (RAdam): [0, 1) as torch.optim;
            # Lion divides by nothing, and beta = 1 is meaningful there (a frozen or sign-only moment).
            _nonnegative(beta, f"beta parameter at index {i}", 1.0, upper_open=rule != "lion")
    _nonnegative(h["weight_decay"], "weight_decay value")
    for key in ("momentum", "lr_decay", "initial_accumulator_value", "momentum_decay"):
        if key in h:
            _nonnegative(h[key], f"{key} value")
    if "alpha" in h:
        _nonnegative(h["alpha"], "alpha value", 1.0, upper_open=False)  # > 1: a negative square_avg
    if "dampening" in h and not math.isfinite(float(h["dampening"])):
        raise ValueError(f"Invalid dampening value: {h['dampening']}")
    if rule == "sgd" and h["nesterov"] and (h["momentum"] <= 0 or h["dampening"] != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


def reference_update(
    rule: Rule, hparams: dict, w: torch.Tensor, g: torch.Tensor, states: list, coefficients: tuple
) -> torch.Tensor:
    """The kernels' arithmetic in fp32 PyTorch: returns the new weight, updates `states` in place."""
    fn = rule.reference_fn
    return fn(w.float(), g.float(), states, coefficients, rule.flags(hparams))
