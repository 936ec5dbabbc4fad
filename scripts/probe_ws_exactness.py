"""Where the warp-specialized kernel's step departs from the Triton kernel's, and why.

For one layer (N x K = 4096 x 2048, fresh random operands, states drawn > 0), each case runs the
fused update several ways on the same inputs and compares every output tensor (weight, states):
the warp-specialized kernel twice with the same arguments (is it deterministic?), with the step's
coefficients passed as arguments and read from device memory (a CUDA graph's launch), with the
exact and the fast epilogue, and the Triton kernel both ways. For each pair: how many elements
differ, the largest difference in units of the element's own bf16 or fp32 rounding step, and how
the differing elements' magnitudes compare with the tensor's (a difference that only shows where
a state cancels to near zero comes from the gradient's summation order, not from the update).

    python scripts/probe_ws_exactness.py          # on a Hopper GPU; JSON lines to $OUT or results/out
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import forge  # noqa: E402
from forge.kernels.update_tile import STEP_ROW  # noqa: E402
from forge.kernels.wgrad_update import _HOPPER_WS_DEFAULTS, _pick_config, wgrad_update  # noqa: E402

CASES = [  # (rule, hyperparameters, state dtype, T)
    ("sgd", dict(lr=1e-2, momentum=0.9, nesterov=True), "fp32", 1024),
    ("sgd", dict(lr=1e-2, momentum=0.9, nesterov=True), "fp32", 4096),
    ("adamw", dict(lr=1e-3, weight_decay=0.01), "fp32", 1024),
    ("adamw", dict(lr=1e-3, weight_decay=0.01), "bf16", 4096),
    ("nadam", dict(lr=1e-3), "bf16", 1024),
    ("nadam", dict(lr=1e-3), "bf16", 4096),
]
N, K = 4096, 2048


def compare(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Differing elements, the worst in units of the rounding step at the larger of the two values,
    and the median magnitude of the differing elements against the tensor's."""
    differ = got != want
    out = dict(fraction=float(differ.float().mean()))
    if differ.any():
        g, w = got[differ].float(), want[differ].float()
        eps = torch.finfo(got.dtype).eps
        steps = (g - w).abs() / (
            eps * torch.maximum(g.abs(), w.abs()).clamp_min(torch.finfo(torch.float32).tiny)
        )
        out.update(
            worst_steps=float(steps.max()),
            max_abs=float((g - w).abs().max()),
            differing_median_magnitude=float(w.abs().median()),
            tensor_median_magnitude=float(want.float().abs().median()),
            tiles=int(
                torch.unique((differ.nonzero()[:, 0] // 128) * 1000 + differ.nonzero()[:, 1] // 128).numel()
            ),
        )
    return out


def run_case(rule: str, hp: dict, state_dtype: str, T: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = (torch.randn(T, N, device="cuda", generator=g) / math.sqrt(T)).bfloat16()
    layer = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    opt = forge.attach(layer, rule, state_dtype=state_dtype, **hp)
    w0, group = layer.weight.detach().clone(), opt.param_groups[0]
    states0, scales, signed = opt._slot_tensors(layer.weight, group)
    for s in states0:
        if s is not None:
            s.copy_(torch.rand(s.shape, device="cuda", generator=g) * 1e-3)
    states0 = tuple(None if s is None else s.clone() for s in states0)
    coefficients = opt.rule.coefficients(group, 5, dict(opt.state[layer.weight]))
    row = torch.zeros(STEP_ROW, dtype=torch.int32, device="cuda")
    row[:9] = torch.tensor(coefficients, dtype=torch.float32, device="cuda").view(torch.int32)
    row[9] = 99

    def step(config, in_memory=False):
        w = w0.clone()
        states = tuple(None if s is None else s.clone() for s in states0)
        wgrad_update(
            w,
            states,
            scales,
            signed,
            dy,
            x,
            coefficients,
            99,
            config=config,
            step_values=row if in_memory else None,
            **opt._kernel_options(group),
        )
        torch.cuda.synchronize()
        return [w, *(s for s in states if s is not None)]

    ws = _HOPPER_WS_DEFAULTS["fp32"]  # the exact epilogue (fp32 states' default)
    triton_config = _pick_config(T, N, K, state_dtype, on_interpreter=False)
    runs = {
        "ws": step(ws),
        "ws_again": step(ws),
        "ws_memory": step(ws, in_memory=True),
        "ws_memory_again": step(ws, in_memory=True),
        "triton": step(triton_config),
        "triton_again": step(triton_config),
        "triton_memory": step(triton_config, in_memory=True),
    }
    if state_dtype == "bf16":
        runs["ws_fast"] = step(_HOPPER_WS_DEFAULTS["bf16"])
    pairs = [
        ("ws", "ws_again"),
        ("ws_memory", "ws_memory_again"),
        ("ws", "ws_memory"),
        ("triton", "triton_again"),
        ("triton", "triton_memory"),
        ("ws", "triton"),
        ("ws_memory", "triton_memory"),
    ]
    if "ws_fast" in runs:
        pairs.append(("ws_fast", "triton"))
    names = ["weight", "state1", "state2", "state3"]
    records = []
    for a, b in pairs:
        for i, (got, want) in enumerate(zip(runs[a], runs[b])):
            rec = dict(
                rule=rule,
                state_dtype=state_dtype,
                T=T,
                pair=f"{a} vs {b}",
                tensor=names[i],
                **compare(got, want),
            )
            records.append(rec)
            print(json.dumps(rec), flush=True)
    return records


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("probe_ws_exactness needs a Hopper GPU (the warp-specialized kernel is sm_90's)")
        return 2
    out = Path(os.environ.get("OUT", "results/out"))
    out.mkdir(parents=True, exist_ok=True)
    records = [r for case in CASES for r in run_case(*case)]
    with open(out / "ws_exactness.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
