"""Pick FORGE's int8 optimizer-state representation by measurement (CPU, plain PyTorch).

Runs AdamW for a few hundred steps on a synthetic weight whose gradient scales vary over five orders
of magnitude across rows and columns (as real LLM gradients do), once with fp32 states and once per
candidate 8-bit representation (one absmax scale per 64 contiguous elements), re-quantizing the
states after every step as the fused kernel does. Prints the relative error of the update and of
the final weights against fp32 states, and how many second-moment entries collapse to zero (a zero
second moment turns the update into m / eps: the failure mode a representation must avoid).

    python scripts/measure_int8_states.py            # the representations, groups of 64
    python scripts/measure_int8_states.py --groups   # the chosen one, groups of 64, 128 and 256

Scales cost 2 bytes (bf16) per group per state, so the group size trades memory for error:
on Llama-3.1-8B's two AdamW states, 0.47 GiB at 64, 0.23 at 128, 0.12 at 256.
"""

import sys

import torch

GROUP = 64


def _groups(x):
    return x.reshape(-1, GROUP)


def signed_linear(x):
    g = _groups(x)
    a = g.abs().amax(1, keepdim=True).clamp_min(1e-30)
    return (torch.round(g / a * 127) / 127 * a).reshape(x.shape)


def signed_companded(x):
    g = _groups(x)
    a = g.abs().amax(1, keepdim=True).clamp_min(1e-30)
    n = g / a
    y = torch.round(127 * 2 * n / (1 + n.abs())) / 127
    return (y / (2 - y.abs()) * a).reshape(x.shape)


def positive_linear(v):
    g = _groups(v)
    a = g.amax(1, keepdim=True).clamp_min(1e-30)
    return (torch.round(g / a * 255) / 255 * a).reshape(v.shape)


def positive_sqrt(v):
    r = _groups(v).sqrt()
    a = r.amax(1, keepdim=True).clamp_min(1e-30)
    return ((torch.round(r / a * 255) / 255 * a) ** 2).reshape(v.shape)


def positive_sqrt_floor1(v):
    """sqrt(v) in 0..255 with every non-zero entry kept at >= 1 level (never collapses to zero)."""
    r = _groups(v).sqrt()
    a = r.amax(1, keepdim=True).clamp_min(1e-30)
    q = torch.round(r / a * 255)
    q = torch.where(r > 0, q.clamp_min(1), q)
    return ((q / 255 * a) ** 2).reshape(v.shape)


def positive_fourth_root(v):
    r = _groups(v).sqrt().sqrt()
    a = r.amax(1, keepdim=True).clamp_min(1e-30)
    return ((torch.round(r / a * 255) / 255 * a) ** 4).reshape(v.shape)


def run(signed, positive, spread, steps=300, n=256, k=1024, seed=0):
    gen = torch.Generator().manual_seed(seed)
    row = torch.exp(torch.randn(n, 1, generator=gen) * spread)
    col = torch.exp(torch.randn(1, k, generator=gen) * spread)
    w0 = torch.randn(n, k, generator=gen) * 0.02
    w_ref, w_q = w0.clone(), w0.clone()
    m_ref = torch.zeros_like(w0)
    v_ref = torch.zeros_like(w0)
    m_q, v_q = m_ref.clone(), v_ref.clone()
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    upd_err = []
    zero_v = 0
    for t in range(1, steps + 1):
        g = row * col * 1e-4 * (torch.randn(n, k, generator=gen) + 0.3)
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        m_ref.lerp_(g, 1 - b1)
        v_ref.mul_(b2).addcmul_(g, g, value=1 - b2)
        u_ref = lr / bc1 * m_ref / (v_ref.sqrt() / bc2**0.5 + eps)
        w_ref -= u_ref
        m_q.lerp_(g, 1 - b1)
        v_q.mul_(b2).addcmul_(g, g, value=1 - b2)
        u_q = lr / bc1 * m_q / (v_q.sqrt() / bc2**0.5 + eps)
        w_q -= u_q
        m_q, v_q = signed(m_q), positive(v_q)
        zero_v += int((v_q == 0).sum())
        upd_err.append(float((u_q - u_ref).norm() / u_ref.norm()))
    w_err = float((w_q - w_ref).norm() / (w_ref - w0).norm())
    return sum(upd_err) / len(upd_err), max(upd_err), w_err, zero_v


def positive_fourth_root_floor1(v):
    """v^(1/4) in 0..255, every non-zero entry kept at >= 1 level."""
    r = _groups(v).sqrt().sqrt()
    a = r.amax(1, keepdim=True).clamp_min(1e-30)
    q = torch.round(r / a * 255)
    q = torch.where(r > 0, q.clamp_min(1), q)
    return ((q / 255 * a) ** 4).reshape(v.shape)


def main():
    for spread in (0.5, 1.5):
        print(f"\ngradient scale spread: log-normal sigma {spread} over rows and over columns")
        group_table(spread) if "--groups" in sys.argv else table(spread)


def group_table(spread):
    """The chosen representation (companded m, sqrt(v) with the >= 1 floor) per group size."""
    global GROUP
    print(
        "| group | scale bytes / elem / state | mean update rel err | max update rel err "
        "| weight-delta rel err | v entries at 0 |"
    )
    print("|---|---|---|---|---|---|")
    for GROUP in (64, 128, 256):
        mean, worst, werr, zeros = run(signed_companded, positive_sqrt_floor1, spread)
        print(f"| {GROUP} | {2 / GROUP:.4f} | {mean:.4f} | {worst:.4f} | {werr:.4f} | {zeros} |")
    GROUP = 64


def table(spread):
    print(
        "| first moment | second moment | mean update rel err | max update rel err "
        "| weight-delta rel err | v entries at 0 |"
    )
    print("|---|---|---|---|---|---|")
    for sname, s in [("linear", signed_linear), ("companded", signed_companded)]:
        for pname, p in [
            ("linear v", positive_linear),
            ("sqrt(v)", positive_sqrt),
            ("sqrt(v), >=1 level", positive_sqrt_floor1),
            ("v^(1/4)", positive_fourth_root),
            ("v^(1/4), >=1 level", positive_fourth_root_floor1),
        ]:
            mean, worst, werr, zeros = run(s, p, spread)
            print(f"| {sname} | {pname} | {mean:.4f} | {worst:.4f} | {werr:.4f} | {zeros} |")


if __name__ == "__main__":
    main()
