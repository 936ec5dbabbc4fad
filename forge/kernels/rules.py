"""The update rules on the device: one `@triton.jit` function per rule, on fp32 tiles.

FORGE fuses any optimizer whose update of one weight element depends only on that element's
gradient, weight and states. Such a rule splits in two. Its host half (`forge.rules`: `Rule`,
`Rule.coefficients`) turns a param group's hyperparameters and the step count into at most nine
fp32 scalars, h0..h8 (bias corrections, NAdam's momentum schedule, RAdam's rectification, SGD's
first-step buffer): everything that is the same for every element. Its device half, here, is the
arithmetic on one tile: `adamw(w, g, m, v, <its coefficients>)` returns the new weight and states.
The scalars reach the kernels as ordinary arguments each step, so a learning-rate scheduler or a
new step recompiles nothing, and no power function (`libdevice`) is needed on the GPU.

`apply_rule` picks the rule at compile time from its constexpr name. Every kernel that updates a
parameter ends in `forge.kernels.update_tile`, which calls it: the fused weight-gradient kernels
(Triton and Gluon) and the element-wise kernel apply the same code, so they cannot drift apart.
`forge.rules.reference_update` is the same arithmetic in PyTorch, element for element, and
torch.optim is the independent oracle.

Exactness. With fp32 weights and states the update equals torch.optim's, because:
- every sum with a product is an explicit fma in the form torch.optim's CUDA ops take (below), so
  no compiler decides which products fuse;
- square roots and divisions are IEEE-rounded (`_sqrt`, `_div`), as torch computes them. With
  FAST (the warp-specialized kernel's `KernelConfig.fast_epilogue`, for bf16 and int8 states) they
  are the hardware's approximations instead: a few fp32 ulps, far below a bf16 state's rounding.

Cost: a handful of fp32 operations per element; what bounds an update is its memory traffic
(weights and states read and written once), not this arithmetic.

Arguments: tiles `w, g` and the rule's states (named as torch.optim names them: `m`, `v` for
exp_avg and exp_avg_sq, `buf` for momentum_buffer, ...), then the coefficients in the order the
rule's `forge.rules._coefficients_<rule>` returns them, then constexpr flags.
"""

import triton
import triton.language as tl


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
def _lerp(start, end, weight, one_minus_weight):
    """torch's lerp as its CUDA kernel takes it: fma(weight, end - start, start) below one half,
    fma(start - end, 1 - weight, end) from one half on (both forms are exact at their own end)."""
    return tl.where(weight < 0.5, tl.fma(end - start, weight, start), tl.fma(start - end, one_minus_weight, end))


@triton.jit
def muon(g, buf, one_minus_momentum, momentum, nesterov):
    """Muon's element-wise half: the momentum, buf.lerp_(g, 1 - momentum), and what Newton-Schulz
    orthogonalizes, g.lerp(buf, momentum) with Nesterov (nesterov == 1), else buf. The caller
    stores the latter where the weight would go (a scratch: `forge.muon` finishes the step)."""
    buf = _lerp(buf, g, one_minus_momentum, momentum)
    u = tl.where(nesterov != 0.0, _lerp(g, buf, momentum, one_minus_momentum), buf)
    return u, buf


@triton.jit
def apply_rule(
    w, g, s1, s2, s3,  # fp32 tiles of one shape: weight, gradient, state slots (unused slots: any)
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 scalars from `forge.rules.Rule.coefficients`, padded with zeros
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
    elif RULE == "muon":  # w: what the whole-matrix half takes (`forge.muon`), not the new weight
        w, s1 = muon(g, s1, h0, h1, h2)
    else:
        tl.static_assert(RULE == "sgd", "unknown FORGE rule")
        w, s1 = sgd(w, g, s1, h0, h1, h2, h3, h4, h5, HAS_MOMENTUM)
    return w, s1, s2, s3
