"""Diagnose the fp32 AdamW step on the GPU against torch.optim.AdamW: per step, per tensor."""

import torch
from torch import nn

import forge

torch.manual_seed(0)
T, N, K = 512, 768, 1000
x, dy = torch.randn(T, K, device="cuda"), torch.randn(T, N, device="cuda")
print("tf32 matmul allowed:", torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
for bias in (False, True):
    layer = nn.Linear(K, N, device="cuda", bias=bias)
    ref = nn.Linear(K, N, device="cuda", bias=bias)
    ref.load_state_dict(layer.state_dict())
    opt_f = forge.attach(layer, "adamw", state_dtype="fp32", lr=1e-3, weight_decay=0.1)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    for step in range(3):
        w_before = layer.weight.detach().clone()
        layer(x).backward(dy)
        opt.zero_grad()
        ref(x).backward(dy)
        g_ref = ref.weight.grad.clone()
        opt.step()
        d = (layer.weight - ref.weight).abs()
        m_err = (opt_f.state[layer.weight]["exp_avg"] - opt.state[ref.weight]["exp_avg"]).norm() / opt.state[
            ref.weight
        ]["exp_avg"].norm()
        print(
            f"bias={bias} step {step + 1}: weight rel {float(d.norm() / ref.weight.norm()):.3g}, "
            f"max abs {float(d.max()):.3g} at {tuple(int(i) for i in divmod(int(d.argmax()), K))}, "
            f"elements > 1e-6: {int((d > 1e-6).sum())}, exp_avg rel {float(m_err):.3g}, "
            f"|g_ref| there {float(g_ref.flatten()[d.argmax()]):.4g}"
        )
